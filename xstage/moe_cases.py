"""MegaMoE's configurations, CPU only: the dtypes (``DTYPE_REGISTRY``), the seeded routing distributions
(``ROUTING_REGISTRY``), the four model shapes and the 84-configuration table (``CASES``: 4 shapes x 7 tokens per
rank x 3 routings), and the FLOP / byte counts of a layer. The kernel's layout constants are defined once in
xstage.kernels.moe and named here for the host.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

import torch

from .kernels import moe as _device
from .registry import Choice, Registry, by_name

TOKENS_PER_RANK = (128, 256, 512, 1024, 2048, 4096, 8192)
ZIPF_EXPONENT = 1.0         # expert popularity p_e ~ 1 / rank_e^s (ranks in a seeded random order of experts)
HOT_FRACTION = 0.5          # "hot": this fraction of tokens routes one slot to the hot expert; no others do
# Layout constants of the kernel (defined once, in xstage.kernels.moe):
TASK_FIELDS = _device.TASK_FIELDS.value            # kind, expert, row block, column block, pool block
META_FIELDS = _device.META_FIELDS.value            # source rank, token, slot, router weight bits
FP8_BLOCK = _device.FP8_BLOCK.value                # scale block edge
STATUS_FIELDS = _device.STATUS_FIELDS.value        # a wait's record (xstage.kernels.sync.wait_flag)
KIND_L1, KIND_L2 = 0, 1
INT32_MAX = 2**31 - 1


# ------------------------------------------------------------------------------------------------- dtypes
@dataclass(frozen=True)
class MoEDtype:
    """What a dtype name means to the layer."""

    act: torch.dtype                 # activations and expert weights (the kernel's GEMM inputs)
    out: torch.dtype                 # combine buffer and layer output (and the tokens before an fp8 dispatch)
    gpu: bool                        # runs on GPUs; else under Triton's interpreter only
    rel_l2_floor: float | None       # check: allowed relative L2 error = 2 x PyTorch's own + this (None: fp8)
    unfused_rel_l2: float            # check: fused layer vs the unfused baseline


DTYPE_REGISTRY = Registry("dtype", (
    Choice("bf16", "bfloat16 (GPUs)", MoEDtype(torch.bfloat16, torch.bfloat16, True, 1e-3, 3e-2)),
    Choice("fp16", "float16 (Triton's interpreter)", MoEDtype(torch.float16, torch.float16, False, 1e-4, 1e-2)),
    Choice("fp32", "float32 (Triton's interpreter)", MoEDtype(torch.float32, torch.float32, False, 1e-6, 1e-4)),
    Choice("fp8", "e4m3 with 1x128 activation / 128x128 weight scales, bf16 output (GPUs)",
           MoEDtype(torch.float8_e4m3fn, torch.bfloat16, True, None, 0.1)),
))
DTYPES_GPU = tuple(n for n, c in DTYPE_REGISTRY.items() if c.impl.gpu)
DTYPES_INTERPRETER = tuple(n for n, c in DTYPE_REGISTRY.items() if not c.impl.gpu)
ACT_DTYPES = {n: c.impl.act for n, c in DTYPE_REGISTRY.items()}
OUT_DTYPES = {n: c.impl.out for n, c in DTYPE_REGISTRY.items()}
REL_L2_FLOOR = {n: c.impl.rel_l2_floor for n, c in DTYPE_REGISTRY.items() if c.impl.rel_l2_floor is not None}
UNFUSED_REL_L2 = {n: c.impl.unfused_rel_l2 for n, c in DTYPE_REGISTRY.items()}   # fused vs the unfused baseline


# ------------------------------------------------------------------------------------------------ routings
def _route_uniform(tokens: int, experts: int, topk: int, g: torch.Generator, shared: torch.Generator):
    return torch.rand(tokens, experts, generator=g).topk(topk, dim=1).indices


def _route_zipf(tokens: int, experts: int, topk: int, g: torch.Generator, shared: torch.Generator):
    order = torch.randperm(experts, generator=shared)                     # order[i] = the (i+1)-th most popular
    logp = torch.empty(experts)
    logp[order] = -ZIPF_EXPONENT * torch.log(torch.arange(1, experts + 1, dtype=torch.float32))
    gumbel = -torch.log(-torch.log(torch.rand(tokens, experts, generator=g).clamp_min(1e-20)))
    return (logp + gumbel).topk(topk, dim=1).indices


def _route_hot(tokens: int, experts: int, topk: int, g: torch.Generator, shared: torch.Generator):
    hot = int(torch.randint(experts, (1,), generator=shared))
    is_hot = torch.rand(tokens, generator=g) < HOT_FRACTION
    scores = torch.rand(tokens, experts, generator=g)
    scores[:, hot] = -1.0                                                 # nobody else picks the hot expert
    scores[is_hot, hot] = 2.0                                             # ... the hot tokens always do
    return scores.topk(topk, dim=1).indices


ROUTING_REGISTRY = Registry("routing", (
    Choice("uniform", "every expert alike", _route_uniform),
    Choice("zipf", "expert popularity 1 / rank^s over a seeded order of experts (K drawn without replacement)",
           _route_zipf),
    Choice("hot", "one seeded expert gets one slot of HOT_FRACTION of the tokens (and no other token)", _route_hot),
))
ROUTINGS = ROUTING_REGISTRY.names


# ------------------------------------------------------------------------------------------- shapes, cases
@dataclass(frozen=True)
class MoEShape:
    """One MoE layer's model shape."""

    name: str
    hidden: int          # Hd
    intermediate: int    # I (per expert)
    experts: int         # E
    topk: int            # K


SHAPES = (
    MoEShape("deepseek_v4_flash", 4096, 2048, 256, 6),
    MoEShape("deepseek_v4_pro", 7168, 3072, 384, 6),
    MoEShape("qwen3_235b", 4096, 1536, 128, 8),
    MoEShape("mixtral_8x7b", 4096, 14336, 8, 2),
)


@dataclass(frozen=True)
class MoECase:
    """One configuration: a shape, tokens per rank, a routing distribution and its seed."""

    shape: MoEShape
    tokens: int          # T per rank
    routing: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.shape.name}_T{self.tokens}_{self.routing}"

    def key(self, P: int, dtype: str) -> tuple:
        """The sweep's resume key (schema ``megamoe``)."""
        return (self.shape.name, self.tokens, self.routing, P, dtype)


# The 84 configurations, one table: seed = position in the table (stable: shapes, tokens, routings in order).
CASES = tuple(MoECase(s, t, r, seed=i) for i, (s, t, r) in
              enumerate(itertools.product(SHAPES, TOKENS_PER_RANK, ROUTINGS)))


def cases_by_name(names: Sequence[str]) -> list[MoECase]:
    """Cases of the table by name (``<shape>_T<tokens>_<routing>``); an unknown name is a ValueError."""
    return by_name(CASES, names, "case")


def as_case(c, seed: int = 0) -> MoECase:
    """An MoECase, or (hidden, intermediate, experts, topk, tokens, routing) -> an ad hoc case."""
    if isinstance(c, MoECase):
        return c
    hidden, inter, experts, topk, tokens, routing = c
    return MoECase(MoEShape(f"H{hidden}_I{inter}_E{experts}_K{topk}", hidden, inter, experts, topk), tokens,
                   routing, seed)


# --------------------------------------------------------------------------------------------------- counts
def gemm_flops(rows: int, hidden: int, inter: int) -> int:
    """GEMM FLOPs of the experts on ``rows`` routed rows: Linear-1 (gate and up) plus Linear-2."""
    return 2 * rows * hidden * 2 * inter + 2 * rows * inter * hidden


def remote_combine_bytes(remote_rows: int, hidden: int, out_bytes: int = 2) -> int:
    """Bytes a rank's Linear-2 epilogues store to other ranks: its received rows whose source is another rank."""
    return remote_rows * hidden * out_bytes


def dispatch_bytes(remote_items: int, hidden: int, act_bytes: int = 2, fp8: bool = False) -> int:
    """Bytes a rank's dispatch pushes to other ranks: rows (+ 1x128 fp32 scales with fp8) + 16 B of meta."""
    scales = hidden // FP8_BLOCK * 4 if fp8 else 0
    return remote_items * (hidden * act_bytes + scales + META_FIELDS * 4)
