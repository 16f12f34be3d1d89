"""MegaMoE planning, CPU only: what the fused layer computes and in which order, and the model of its time.

Everything here runs on any machine, without a GPU or a kernel launch (the studies and figures import only this
module): the 84-configuration table (4 model shapes x 7 tokens per rank x 3 routing distributions), FLOP / byte
counts, tile configurations and the checks of a problem, the seeded routing generators, the routing layout
(counts, offsets, destination rows; torch ops on the CPU), the tile grid, the schedules (task lists the
persistent kernel walks), the Burst-Gap prediction of each schedule's kernel time (``CostModel``,
``predict_kernel_ns``) and ``repredict``, the current model applied to recorded rows. The GPU side (weights,
reference, buffers, launchers, the unfused baseline, check jobs) is ``xstage.moe``; the sweep is
``xstage.moe_sweep``; the kernels are ``xstage.kernels.moe``.

Registries (``xstage.registry``: the kernel path, the sweep, the CLI choices and the docs read these):
``SCHEDULE_REGISTRY``, ``DTYPE_REGISTRY``, ``ASSIGNMENT_REGISTRY``, ``ROUTING_REGISTRY``; ``SCHEDULES``,
``DTYPES_GPU``, ``ASSIGNMENTS``, ``ROUTINGS`` are their names in table order.

Legend: P = ranks, E = experts, El = E / P experts per rank, K = top-k, T = tokens per rank, Hd = hidden,
I = intermediate, R = rows a rank receives (sum over its experts of the (token, slot) items routed there),
BM = rows per row block, N1 = I / BN1 Linear-1 column blocks, N2 = Hd / BN2 Linear-2 column blocks, n = programs
of the persistent kernel (= SMs on a GPU).

The routing layout and task lists are computed on the host from every rank's routing (seeded here, so every
rank computes all of them; a serving system would all-gather the [P, E] counts first). They are built once per
routing, outside the timed region, for the fused layer and the unfused baseline alike.

Schedules (rows of int32 [kind, expert, row block, column block, pool block]; every Linear-2 task comes after
all Linear-1 tasks of its row block -- ``check_tasks`` -- so the persistent kernel cannot deadlock):
  expert_wave   as DeepGEMM's MegaMoE: experts in waves, a wave = the fewest consecutive experts (with rows)
                whose Linear-1 tiles reach 2 x n_sms; per wave all Linear-1 tiles, then all Linear-2 tiles.
                The remote stores come in dense bursts: whole rounds of n programs all in Linear-2 epilogues.
  interleaved   the same waves; Linear-2 tiles of wave w are spread evenly among the Linear-1 tiles of wave w+1
                (L1(0), L2(0) + L1(1), ..., L2(W-2) + L1(W-1), L2(W-1)): each round mixes compute-only tiles with
                storing tiles, so computation sits between bursts.
  lag           one stream of Linear-1 tiles (expert-major); the Linear-2 tiles of a row block follow once ``lag``
                further Linear-1 tiles have been listed after its last producer (lag = n_sms in version 1: one
                round, so a consumer rarely spins; LAG_VERSION / ``lag_of_rule``: version 2, the default, takes
                the smallest of 1, 1.5, 2 rounds that the compute-only walk finds as fast as the best).
  model_guided  the candidate (expert_wave, interleaved, lag = 0, n/2, n, 2n, 4n) with the best time predicted
                by the Burst-Gap model (below); its ``param`` names the choice.
Inside an expert every schedule lists its tiles in the grid's order (``TileGrid.swizzle``): row-block-major in
every record before round 4, since then in groups of TILE_SWIZZLE row blocks with the weight column blocks outer
(``swizzle=G`` in schedule_param); ``l2_traffic`` models what either order reads from DRAM.

Prediction of a schedule's kernel time (``predict_kernel_ns``), documented formula. Program i % n runs task i,
so the list falls into rounds k of n consecutive tasks (what the n programs work on at about the same time).
Tile compute times c1 = 2 BM Hd 2 BN1 / F and c2 = 2 BM I BN2 / F, F = the per-program GEMM rate (FLOP/ns),
calibrated so that the model's time of expert_wave without remote bytes equals the kernel measured with every
combine store sent to a local buffer (``compute_ms``; a given TFLOP/s when not measured). A Linear-2 task less
than a round behind its last producer (distance d < n positions) spins w = c1 (1 - d / n) (wait model
``positions``); wait model ``time`` (``wait_walk``) places every claim in time instead (a consumer spins until its
producers have ended: under dynamic claims short Linear-2 tiles bring a consumer's claim forward, session 8); which
one a CostModel uses: its ``wait``, else WAIT_DEFAULT of its assignment. Tasks are assigned
statically, task i to program i % n, so the compute part is the busiest program's:
    compute = max over programs p of sum over its tasks (c1 or c2, plus w)
(on 2 H200s the recorded schedules differed from Expert-Wave mostly through this term: a list whose Linear-1
and Linear-2 tiles alternate with a period that divides n gives some programs every expensive tile; the first
version of the model averaged each round over its programs and missed it, see notebook 03). Round k has b_k
Linear-2 tasks whose remote bytes are B_k = sum of (rows from other ranks) x BN2 x out bytes; a burst stalls only
its b_k issuers:
    compute_k = (a_k c1 + b_k c2 + sum of w) / m      (a_k Linear-1 tasks; m = n, or fewer in the last round)
    q = recover(q, compute_k)                                        (the stage drains while they compute)
    (T_k, q) = issue_time(B_k / b_k bytes per program, b_k programs, q)     (xstage.model, overhead_ns = 0)
    stall_k = b_k T_k / m
    predicted = compute + sum_k stall_k + drain_time(q after the last round)
(stall model ``issuers``, STALL_DEFAULT; stall model ``round``: stall_k = max(b_k T_k / m, (q + B_k - C) / D) and
the stage after it q + B_k - D stall_k, so the stage drains only in charged time; STALL_MODELS, record_stall)
i.e. compute time plus the Burst-Gap model's issue-and-stall time of each burst and the final drain. Expert-Wave
rounds are all Linear-2: every program issues at once, the burst exceeds the outstanding capacity and every
program stalls. Interleaved rounds mix: about half the programs issue half the bytes, the rest compute, and the
compute between bursts drains the stage.

Dtypes: ``bf16`` and ``fp8`` (e4m3 with 1x128 activation / 128x128 weight scales, output bf16) on GPUs;
``fp16`` and ``fp32`` under Triton's interpreter (its bf16 ``tl.dot`` is wrong and it has no fp8).
"""
from __future__ import annotations

import functools
import heapq
import itertools
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from . import env
from .kernels import moe as _device
from .model import BurstGapParams, StageParams, drain_time, issue_time, recover
from .registry import Choice, Registry, by_name

TOKENS_PER_RANK = (128, 256, 512, 1024, 2048, 4096, 8192)
ZIPF_EXPONENT = 1.0         # expert popularity p_e ~ 1 / rank_e^s (ranks in a seeded random order of experts)
HOT_FRACTION = 0.5          # "hot": this fraction of tokens routes one slot to the hot expert; no others do
LAG_CANDIDATES = (0.0, 0.5, 1.0, 2.0, 4.0)   # model_guided's lags, in units of n_sms Linear-1 tiles
WAVE_FILL = 2               # expert_wave: a wave's Linear-1 tiles reach WAVE_FILL x n_sms
# Layout constants of the kernel (defined once, in xstage.kernels.moe; re-exported for the host):
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


# ---------------------------------------------------------------------------------------------- tile config
@dataclass(frozen=True)
class TileConfig:
    """Tile shape and launch of the experts kernel (every schedule of a run shares it: same math per tile)."""

    block_m: int = 128
    block_n1: int = 128   # Linear-1 columns of I (gate and up each)
    block_n2: int = 128   # Linear-2 columns of Hd
    block_k: int = 64     # 128 with fp8 (the scale block)
    num_warps: int = 8
    num_stages: int = 3
    tma: bool = False     # the main loops load x, W1, W2 through TMA tensor descriptors (bf16; fp8 since round 8;
    #                       the default of both since tiles version 4)

    def validate(self, dtype: str | None = None) -> None:
        for name in ("block_m", "block_n1", "block_n2", "block_k"):
            v = getattr(self, name)
            if v < 16 or v > 256 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two in [16, 256], got {v}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be a power of two <= 16, got {self.num_warps}")
        if not 1 <= self.num_stages <= 6:
            raise ValueError(f"num_stages must be in [1, 6], got {self.num_stages}")
        if dtype == "fp8" and (self.block_n1, self.block_n2, self.block_k) != (FP8_BLOCK,) * 3:
            raise ValueError(f"fp8 needs block_n1 = block_n2 = block_k = {FP8_BLOCK} (the scale block), got "
                             f"{self.block_n1}, {self.block_n2}, {self.block_k}")


INTERPRETER_TILES = TileConfig(16, 32, 32, 32, 4, 1)


# Tile versions (the tiles a recorded MegaMoE row ran with are in the row: block_m .. num_stages, schema megamoe
# v3; rows of older records read as TILES_V1, xstage.data.MEGAMOE_TILES_V1). v2 = the GEMM ladder's winners
# (data/h200x1/megamoe_gemm, study ladder): bf16 Linear-2 tiles BM x 256 with 4 stages (bn2_256_s4, 1.044 of
# torch._grouped_mm on its 4 configurations against 0.898), fp8 3 stages (s3, 0.946 of _scaled_grouped_mm
# against 0.685) with BM = 128 (2 stages, the ladder's bm128) where experts get >= FP8_BM128_ROWS rows on average
# (the one ladder configuration of that class, Mixtral T2048 with 1024 rows per expert: 468 TFLOP/s against s3's
# 405; the three with 24-192 rows per expert were faster with s3). v3 = v2 with bf16's main loops through TMA
# tensor descriptors (tma = True; round 6's study tiles6, data/h200x1/megamoe_round6_gemm: ours / grouped_mm
# >= 0.911 on all 56 configurations with >= 2048 rows in two runs, against the pointer loops' 0.844, bit-identical
# output); fp8 keeps the pointer loops (v2's fp8 tiles). Rows record tma (schema megamoe v4 / megamoe_gemm v3;
# older rows read tma = False, or for megamoe_gemm its tiles label: what they ran). v4 (session 11) = v3 with fp8's
# main loops through TMA and one pipeline stage more (BM 64: 4 stages, BM 128: 3; round 8's tma_s,
# xstage.moe_gemm.gemm8_variants): bit-identical to the pointer loops on all 84 configurations, 0.834x their time
# (study gemm8, data/h200x1/megamoe_round8_gemm: fp8 / torch._scaled_grouped_mm geomean 0.961 -> 1.153), each
# schedule's compute-only time / Expert-Wave's 0.988-0.990 (study controls8, data/h200x1/megamoe_round8_controls);
# bf16 as v3. v5 (session 14) = v4 with fp8's BM 128 from FP8_BM128_ROWS = 96 rows per expert on average (v2-v4:
# FP8_BM128_ROWS_V2 = 512): study gemm9 (data/h200x1/megamoe_round9_gemm) timed both row blocks on the 56
# configurations with >= 2048 rows, and BM 128 was faster from 96 rows (0.77-1.00x of BM 64's time), slower at 64
# and below (1.00-1.27x); the threshold was read off that run, so study gemm10 re-times both on all 84 (the 28 small
# configurations never seen). Every record says its version in its sidecar (params.tiles_version) and its tiles in
# every row.
# Version 6 (session 15): version 5 with one pipeline stage more for fp8 (BM 64: 5 stages, BM 128: 4), study gemm10's
# s_plus, faster in two runs (data/h200x1/megamoe_round10_gemm, megamoe_round11_gemm_repeat: 0.977 / 0.981 of
# version 5's time, geomean over the 84; faster in both runs on 68 of 84). bf16 unchanged.
TILES_VERSION = 6
TILES_VERSIONS = (1, 2, 3, 4, 5, 6)
FP8_BM128_ROWS = 96         # fp8 (tiles version >= 5): average rows per expert from which BM = 128 (else 64)
FP8_BM128_ROWS_V2 = 512     # the same in tiles versions 2-4
BF16_BM64_ROWS = 96         # bf16: average rows per expert below which BM = 64 (else 128)


def default_tiles(dtype: str, rows_per_expert: float | None = None, version: int = TILES_VERSION) -> TileConfig:
    """H200 (sm_90), 8 warps, tiles version ``version`` (default TILES_VERSION = 5). bf16: BN1 = 128, BN2 = 256,
    BK = 64, 4 stages, through the TMA main loops (tma = True; since version 3), BM = 64 when experts get few rows
    (< BF16_BM64_ROWS on average), else 128. fp8: BN1 = BN2 = BK = 128 (the scale block), through the TMA main
    loops (since version 4) with BM = 64 and 4 stages, or BM = 128 and 3 stages where experts get >=
    FP8_BM128_ROWS (96) rows on average. Version 4: version 5 with fp8's BM 128 from FP8_BM128_ROWS_V2 (512) rows.
    Version 3: bf16 as version 4, fp8 the pointer loops with BM 64 3 stages / BM
    128 2 stages (ptxas: 32 B spilled); version 2: version 3 with bf16's pointer loops. Version 1 (every record
    before schema megamoe v3): bf16 BN2 = 128 with 3 stages (same BM rule), fp8 BM = 64 with 2 stages always.
    Small tiles (pointer loops) under the interpreter."""
    if env.interpreted():
        return INTERPRETER_TILES
    rpe = rows_per_expert
    if dtype == "fp8":
        return gpu_tiles(dtype, fp8_block_m(rpe, version), version)
    return gpu_tiles(dtype, 64 if rpe is not None and rpe < BF16_BM64_ROWS else 128, version)


def fp8_block_m(rows_per_expert: float | None, version: int = TILES_VERSION) -> int:
    """fp8's row block in tiles version ``version`` where experts get ``rows_per_expert`` rows on average (None:
    unknown): 128 from FP8_BM128_ROWS (version >= 5) / FP8_BM128_ROWS_V2 (versions 2-4), else 64; version 1: 64."""
    if version not in TILES_VERSIONS:
        raise ValueError(f"tiles version must be one of {', '.join(map(str, TILES_VERSIONS))}, got {version}")
    rpe = rows_per_expert
    big = version != 1 and rpe is not None and rpe >= (FP8_BM128_ROWS if version >= 5 else FP8_BM128_ROWS_V2)
    return 128 if big else 64


def gpu_tiles(dtype: str, block_m: int, version: int = TILES_VERSION) -> TileConfig:
    """The H200 tiles of ``dtype`` with row blocks of ``block_m`` in tiles version ``version`` (1: what every
    MegaMoE record before schema megamoe v3 ran with; 2: the pointer loops of rounds 3-6; 3: version 2 with bf16's
    main loops through TMA (rounds 7-8); 4: version 3 with fp8's main loops through TMA and one pipeline stage
    more; 5: version 4's tiles, only default_tiles' fp8 row-block rule differs; 6, the current default: version 5
    with fp8's pipeline one stage deeper again)."""
    if version == 1:
        from .data import MEGAMOE_TILES_V1
        return TileConfig(block_m, *MEGAMOE_TILES_V1[dtype])
    if version not in TILES_VERSIONS:
        raise ValueError(f"tiles version must be one of {', '.join(map(str, TILES_VERSIONS))}, got {version}")
    if dtype == "fp8":
        stages = 2 if block_m == 128 else 3
        if version >= 4:                      # round 8's tma_s: the stage the pointer loops could not afford
            return TileConfig(block_m, 128, 128, 128, 8, stages + (2 if version >= 6 else 1), tma=True)
        return TileConfig(block_m, 128, 128, 128, 8, stages)
    return TileConfig(block_m, 128, 256, 64, 8, 4, tma=version >= 3)


def tiles_of_row(row) -> TileConfig:
    """The tiles a recorded MegaMoE row (schema megamoe v4 / megamoe_gemm v3, or an older one read through its
    migration: tma False) ran with."""
    return TileConfig(int(row.block_m), int(row.block_n1), int(row.block_n2), int(row.block_k), int(row.num_warps),
                      int(row.num_stages), bool(row.tma))


def default_dtype() -> str:
    return "fp16" if env.interpreted() else "bf16"


# ------------------------------------------------------------------------------------------------ validation
def validate_dtype(dtype: str) -> None:
    if dtype not in ACT_DTYPES:
        raise ValueError(f"dtype must be one of {tuple(ACT_DTYPES)}, got {dtype!r}")
    if env.interpreted():
        if dtype not in DTYPES_INTERPRETER:
            raise ValueError(f"dtype must be fp16 or fp32 under Triton's interpreter (its bf16 tl.dot is wrong and "
                             f"it has no fp8), got {dtype!r}")
    elif dtype not in DTYPES_GPU:
        raise ValueError(f"dtype must be bf16 or fp8 on GPUs, got {dtype!r}")


def validate_problem(hidden: int, inter: int, experts: int, topk: int, tokens: int, P: int,
                     tiles: TileConfig, dtype: str) -> None:
    """Raise ValueError before any launch when the layer cannot run: ranks, experts, tile alignment, dtype."""
    validate_dtype(dtype)
    tiles.validate(dtype)
    if P < 1:
        raise ValueError(f"ranks must be >= 1, got {P}")
    if experts < 1 or experts % P:
        raise ValueError(f"experts ({experts}) must be a positive multiple of the number of ranks ({P})")
    if not 1 <= topk <= experts:
        raise ValueError(f"topk must be in [1, experts = {experts}], got {topk}")
    if tokens < 1:
        raise ValueError(f"tokens per rank must be >= 1, got {tokens}")
    for what, n, b in (("hidden", hidden, tiles.block_k), ("hidden", hidden, tiles.block_n2),
                       ("intermediate", inter, tiles.block_n1), ("intermediate", inter, tiles.block_k)):
        if n < 1 or n % b:
            raise ValueError(f"{what} ({n}) is not tile-aligned: it must be a positive multiple of {b} "
                             f"(tiles {tiles})")
    if dtype == "fp8" and (hidden % FP8_BLOCK or inter % FP8_BLOCK):
        raise ValueError(f"fp8 needs hidden and intermediate to be multiples of {FP8_BLOCK}")
    if 2 * inter * hidden > INT32_MAX or tokens * topk * hidden > INT32_MAX:
        raise ValueError("one expert's weights or the combine buffer exceed int32 offsets")


# ------------------------------------------------------------------------------------------------- routing
def route(tokens: int, experts: int, topk: int, routing: str, seed: int, rank: int
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded routing of rank ``rank``'s tokens (CPU generators: identical wherever it runs).

    Returns ids int64 [T, K] (distinct experts per token) and router weights float32 [T, K] (softmax of
    seeded logits over the K chosen). ``uniform``: every expert alike. ``zipf``: popularity 1 / rank^s,
    s = ZIPF_EXPONENT, over a seeded random order of experts (the same order on every rank), K drawn without
    replacement (Gumbel top-k). ``hot``: one seeded expert gets one slot of HOT_FRACTION of the tokens (and no
    other token); every other slot is uniform over the remaining experts."""
    pick = ROUTING_REGISTRY.check(routing).impl
    if not 1 <= topk <= experts or tokens < 1:
        raise ValueError(f"need 1 <= topk <= experts and tokens >= 1, got {topk}, {experts}, {tokens}")
    shared = torch.Generator().manual_seed(1_000_003 * seed + 17)        # the model's popularity: all ranks
    g = torch.Generator().manual_seed(1_000_003 * seed + 7_919 * (rank + 1))
    ids = pick(tokens, experts, topk, g, shared)
    wts = torch.softmax(torch.randn(tokens, topk, generator=g), dim=1)
    return ids, wts


def expert_counts(ids: torch.Tensor, experts: int) -> torch.Tensor:
    """[T, K] expert ids -> int64 [E] items per expert."""
    return torch.bincount(ids.flatten(), minlength=experts)


# ------------------------------------------------------------------------------------------------- layouts
@dataclass
class RankLayout:
    """Rank ``rank``'s routing layout: where its items go (send side) and what it receives (receive side)."""

    rank: int
    world_size: int
    experts: int
    counts: torch.Tensor           # int64 [P, E] items of source rank s routed to expert e (CPU)
    dest: torch.Tensor             # int32 [T*K, 2] this rank's items: (owner rank, row in the owner's buffer)
    expert_rows: tuple[int, ...]   # [El] rows received per local expert
    own_rows: tuple[int, ...]      # [El] of those, rows from this rank itself (local combine stores)
    own_start: tuple[int, ...]     # [El] where this rank's own rows start inside each expert's rows

    @property
    def experts_local(self) -> int:
        return self.experts // self.world_size

    @property
    def rows(self) -> int:
        return sum(self.expert_rows)

    @property
    def remote_rows(self) -> int:
        """Received rows whose source is another rank (their combine stores cross the link)."""
        return self.rows - sum(self.own_rows)

    @property
    def offsets(self) -> torch.Tensor:
        """int32 [El + 1] expert row offsets (CPU)."""
        return torch.tensor([0, *itertools.accumulate(self.expert_rows)], dtype=torch.int32)

    @property
    def remote_items(self) -> int:
        """This rank's items that go to another rank (dispatch bytes)."""
        return int((self.dest[:, 0] != self.rank).sum())


def build_layouts(ids: Sequence[torch.Tensor], experts: int) -> list[RankLayout]:
    """Every rank's layout from every rank's routing ids [T, K] (torch ops on the CPU).

    Owner d's receive buffer is expert-major (local expert le = e - d * El); within an expert, rows from source
    rank 0 first, then 1, ...; within a source, its items in (token, slot) order."""
    P = len(ids)
    if experts % P:
        raise ValueError(f"experts ({experts}) must be a positive multiple of the number of ranks ({P})")
    El = experts // P
    ids = [i.cpu().long() for i in ids]
    counts = torch.stack([expert_counts(i, experts) for i in ids])       # [P, E]
    total = counts.sum(0).view(P, El)                                     # [P owners, El]
    owner_offs = total.cumsum(1) - total                                  # [P, El] expert start in owner
    prior = counts.cumsum(0) - counts                                     # [P, E] rows from lower sources
    out = []
    for s in range(P):
        flat = ids[s].flatten()                                           # [T*K] items in (token, slot) order
        order = torch.argsort(flat, stable=True)
        start = counts[s].cumsum(0) - counts[s]                           # [E] first sorted position per expert
        pos = torch.empty_like(flat)
        pos[order] = torch.arange(flat.numel()) - start[flat[order]]      # rank of the item within its expert
        d, le = flat // El, flat % El
        row = owner_offs[d, le] + prior[s, flat] + pos
        dest = torch.stack([d, row], 1).to(torch.int32)
        mine = slice(s * El, (s + 1) * El)
        out.append(RankLayout(s, P, experts, counts, dest, tuple(total[s].tolist()), tuple(counts[s, mine].tolist()),
                              tuple(prior[s, mine].tolist())))
    return out


# --------------------------------------------------------------------------------------- tiles, schedules
@dataclass(frozen=True)
class TileGrid:
    """The tiles of one rank's experts: row blocks of BM rows per local expert, N1 / N2 column blocks, and their
    order inside an expert (``swizzle``, TILE_SWIZZLE)."""

    expert_rows: tuple[int, ...]
    block_m: int
    n1: int                        # Linear-1 column blocks (I / BN1)
    n2: int                        # Linear-2 column blocks (Hd / BN2)
    swizzle: int = 0               # 0: row-block-major; G >= 1: groups of G row blocks, column-major inside

    @classmethod
    def of(cls, layout: RankLayout, hidden: int, inter: int, tiles: TileConfig, swizzle: int = 0) -> "TileGrid":
        if swizzle < 0:
            raise ValueError(f"swizzle must be >= 0 row blocks (0: row-block-major), got {swizzle}")
        return cls(layout.expert_rows, tiles.block_m, inter // tiles.block_n1, hidden // tiles.block_n2, swizzle)

    @cached_property              # (the grid is frozen: computed once, read for every tile)
    def row_blocks(self) -> list[int]:
        return [-(-r // self.block_m) for r in self.expert_rows]

    @cached_property
    def pool_start(self) -> list[int]:
        rb = self.row_blocks
        return [0, *itertools.accumulate(rb)][:-1]

    @cached_property
    def n_pool(self) -> int:
        return sum(self.row_blocks)

    def tiles(self, kind: int, expert: int) -> list[tuple[int, int, int, int, int]]:
        """(kind, expert, row block, column block, pool block) of one expert: row-block-major (swizzle 0), or in
        groups of ``swizzle`` row blocks, column-block-major inside a group (the tiles that read the same weight
        column block follow each other)."""
        n = self.n1 if kind == KIND_L1 else self.n2
        p0, R, G = self.pool_start[expert], self.row_blocks[expert], self.swizzle
        if G <= 0:
            return [(kind, expert, rb, cb, p0 + rb) for rb in range(R) for cb in range(n)]
        return [(kind, expert, rb, cb, p0 + rb) for g0 in range(0, R, G) for cb in range(n)
                for rb in range(g0, min(R, g0 + G))]

    def all_tiles(self) -> np.ndarray:
        rows = [t for k in (KIND_L1, KIND_L2) for e in range(len(self.expert_rows)) for t in self.tiles(k, e)]
        return np.array(rows, dtype=np.int32).reshape(-1, TASK_FIELDS)

    def remote_rows_per_block(self, layout: RankLayout) -> np.ndarray:
        """[n_pool] rows of each row block whose source is another rank."""
        out = []
        for e, rows in enumerate(self.expert_rows):
            a, b = layout.own_start[e], layout.own_start[e] + layout.own_rows[e]   # own rows inside the expert
            for rb in range(self.row_blocks[e]):
                r0, r1 = rb * self.block_m, min((rb + 1) * self.block_m, rows)
                out.append((r1 - r0) - max(0, min(r1, b) - max(r0, a)))
        return np.array(out, dtype=np.int64)


def expert_waves(grid: TileGrid, n_sms: int) -> list[list[int]]:
    """Expert-Wave's waves: consecutive experts with rows, each wave the fewest whose Linear-1 tiles reach
    WAVE_FILL x n_sms (the last wave takes what is left)."""
    waves, cur, n = [], [], 0
    for e, rb in enumerate(grid.row_blocks):
        if rb == 0:
            continue
        cur.append(e)
        n += rb * grid.n1
        if n >= WAVE_FILL * n_sms:
            waves.append(cur)
            cur, n = [], 0
    if cur:
        waves.append(cur)
    return waves


def _tiles_of(grid: TileGrid, kind: int, experts: Sequence[int]) -> list[tuple]:
    """The ``kind`` (Linear-1 or Linear-2) tiles of ``experts``, expert by expert, row-block-major."""
    return [t for e in experts for t in grid.tiles(kind, e)]


def _spread(a: list, b: list) -> list:
    """Merge two lists, each keeping its order, with a's and b's items spread evenly over the result."""
    keyed = [((i + 0.5) / len(a), 0, t) for i, t in enumerate(a)] + [((j + 0.5) / len(b), 1, t)
                                                                     for j, t in enumerate(b)]
    return [t for _, _, t in sorted(keyed, key=lambda k: (k[0], k[1]))]


def schedule_expert_wave(grid: TileGrid, n_sms: int) -> list[tuple]:
    out = []
    for w in expert_waves(grid, n_sms):
        out += _tiles_of(grid, KIND_L1, w) + _tiles_of(grid, KIND_L2, w)
    return out


# Order versions of the schedules that mix Linear-1 and Linear-2 tiles (recorded in schedule_param: absent = 1).
# 1: one tile at a time (interleaved spreads single Linear-2 tiles among the next wave's Linear-1 tiles; lag lists
#    a row block's Linear-2 tiles as soon as it is ready). 2: in chunks of ``order_group`` row blocks, so that the
#    tiles running at the same time share operands as Expert-Wave's do (a chunk's Linear-2 tiles read the same
#    intermediate rows and the same weight columns; spread one by one, each concurrent Linear-2 tile streams its
#    own W2 columns from memory, as DeepGEMM's scheduler avoids by claiming Linear-2 tiles in pool-block order);
#    a chunk of one row block was version 1 there (no param: DeepSeek-V4-Pro fp8's lists in
#    data/h200x1/megamoe_round3/ ran version 1 and read so). 3 (ORDER_VERSION): version 2 with every chunk named
#    in schedule_param (``chunk=G`` / ``lag=L,group=G``, G >= 1): a chunk of one row block is a chunk, not
#    version 1. (lag's version-1 list releases each ready row block at once, which is group 1's list too.)
#    4 (ORDER_VERSION since session 16): version 3, and lag's releases never split a swizzle group of row blocks
#    (``align=1`` in lag's schedule_param; interleaved's lists are version 3's). Why (session 16, docs/lab-notebook.md
#    "lag's releases split experts"): with the swizzle an expert's row blocks become ready one Linear-1 tile apart,
#    and a release of G ready row blocks that ends between them puts the expert's second row block's Linear-2
#    tiles a release (G x N1 Linear-1 tiles) after its first's, so each W2 column block is read twice: on
#    DeepSeek-V4-Pro T2048 uniform bf16 (96 experts of 2 row blocks, 96 of 1; W2 44 MB an expert, the L2 50 MB)
#    the LRU model (``l2_traffic``) gives lag 1.097x Expert-Wave's DRAM bytes, measured 1.045-1.060x its
#    compute-only time in three runs; aligned, 1.00x.
ORDER_VERSION = 4
ORDER_VERSIONS = (1, 3, ORDER_VERSION)  # what build_schedule builds; version 2's lists are 1's or 3's (its param)
# Tile order inside an expert (every schedule; ``TileGrid.swizzle``, recorded as ``swizzle=G`` in schedule_param,
# absent = 0, row-block-major, what every record before round 4 ran): groups of TILE_SWIZZLE row blocks, column
# blocks outer, so the row blocks that read one weight column block run back to back (as a grouped GEMM
# rasterises for L2 reuse). Why (round 4, docs/lab-notebook.md, "MegaMoE on one GPU, round 4"): with row-block-major tiles a Linear-1 tile
# re-reads its weight column block one row block (N1 tiles, ~43 MB for DeepSeek-V4-Pro fp8) later, about the
# H200's 50 MB L2, and a mixing list puts Linear-2 tiles in between: an LRU model of the L2 over the list order
# gives Pro fp8's mixing lists 1.4-4x Expert-Wave's DRAM bytes, and their measured compute-only cost follows it.
TILE_SWIZZLE = 8


def order_group(grid: TileGrid, n_sms: int) -> int:
    """Row blocks per chunk (order version 2): about half the programs' worth of Linear-2 tiles
    (n_sms / (2 x N2)), at least one row block."""
    return max(1, int(round(n_sms / (2 * max(grid.n2, 1)))))


def _chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def schedule_interleaved(grid: TileGrid, n_sms: int, chunk: int | None = None) -> list[tuple]:
    """``chunk`` row blocks' worth of Linear-2 tiles (chunk x N2, in the grid's order) per chunk (None: order
    version 1, single tiles); the next wave's Linear-1 tiles cut into as many chunks, and the two chunk lists
    spread evenly (``_spread``)."""
    if chunk is not None and chunk < 1:
        raise ValueError(f"chunk must be >= 1 row block (None: order version 1), got {chunk}")
    waves = expert_waves(grid, n_sms)
    if not waves:
        return []
    out = _tiles_of(grid, KIND_L1, waves[0])
    for prev, w in zip(waves, waves[1:]):
        l2, l1 = _tiles_of(grid, KIND_L2, prev), _tiles_of(grid, KIND_L1, w)
        if chunk is None:
            out += _spread(l2, l1)
            continue
        c2 = _chunks(l2, chunk * grid.n2)
        k = min(len(c2), len(l1))
        c1 = [list(c) for c in np.array_split(np.arange(len(l1)), k)]
        c1 = [[l1[i] for i in c] for c in c1]
        out += [t for part in _spread(c2, c1) for t in part]
    return out + _tiles_of(grid, KIND_L2, waves[-1])


def schedule_lag(grid: TileGrid, lag: int, group: int | None = None, align: bool = False) -> list[tuple]:
    """One Linear-1 stream; a row block's Linear-2 tiles are listed once ``lag`` Linear-1 tiles follow its last
    producer, ``group`` ready row blocks at a time (None: version 1, each as soon as it is ready: group 1's
    list); the released tiles in the grid's order (row-block-major, or swizzled). ``align`` (order version 4):
    a release ends only where a swizzle group of row blocks ends (an expert's row blocks ``swizzle`` at a time;
    every row block its own unit when the grid is not swizzled), so the tiles that read one W2 column block are
    released together."""
    if group is not None and group < 1:
        raise ValueError(f"group must be >= 1 row block (None: order version 1), got {group}")
    experts = range(len(grid.expert_rows))
    l1 = _tiles_of(grid, KIND_L1, experts)
    last = {}                                                          # pool block -> position of its last L1
    for j, t in enumerate(l1):
        last[t[4]] = j
    l2 = sorted(_tiles_of(grid, KIND_L2, experts), key=lambda t: (last[t[4]], t[3]))
    pools = list(dict.fromkeys(t[4] for t in l2))                      # row blocks in readiness order
    by_pool: dict[int, list] = {}
    for t in l2:
        by_pool.setdefault(t[4], []).append(t)
    rank = {t: i for i, t in enumerate(_tiles_of(grid, KIND_L2, experts))}

    def release(ps: list) -> list:   # row-block-major; a swizzled grid: its own order (the weight column outer)
        ts = [t for p in ps for t in by_pool[p]]
        return sorted(ts, key=rank.__getitem__) if grid.swizzle else ts

    unit = {}                                                          # pool block -> its swizzle group
    if align and grid.swizzle:
        for e, (p0, R) in enumerate(zip(grid.pool_start, grid.row_blocks)):
            unit.update({p0 + rb: (e, rb // grid.swizzle) for rb in range(R)})

    def cut_at(k: int) -> int:      # the last unit boundary at or before k ready row blocks (align), else k
        if not unit:
            return k
        while done < k < len(pools) and unit[pools[k]] == unit[pools[k - 1]]:
            k -= 1
        return k

    out, ready, done = [], 0, 0
    for j, t in enumerate(l1):
        out.append(t)
        while ready < len(pools) and last[pools[ready]] + lag <= j:
            ready += 1
        cut = cut_at(ready)
        if cut - done >= (group or 1):
            out += release(pools[done:cut])
            done = cut
    out += release(pools[done:])
    return out


def parse_schedule_param(param: str) -> dict:
    """A recorded schedule_param -> {'choice': schedule name or None, 'lag': int or None, 'group': row blocks per
    chunk or None, 'order': 1, 3 or 4, 'swizzle': the grid's tile order, 0 where absent, 'align': lag's releases
    aligned to swizzle groups}: a param naming a chunk (``chunk=G`` / ``group=G``) is a chunked list of G row blocks
    (order version 2 wrote it for G > 1, version 3 for every G), none is order version 1; ``align=1`` (lag only) is
    order version 4 (an interleaved list of version 4 is version 3's list and param)."""
    out = {"choice": None, "lag": None, "group": None, "order": 1, "swizzle": 0, "align": False}
    for tok in [t for t in str(param).split(",") if t and t != "nan"]:
        k, _, v = tok.partition("=")
        if not _:
            out["choice"] = k
        elif k == "lag":
            out["lag"], out["choice"] = int(v), out["choice"] or "lag"
        elif k in ("chunk", "group"):
            out["group"], out["order"] = int(v), ORDER_VERSIONS[1]
            if out["group"] < 1:
                raise ValueError(f"schedule_param {param!r}: {k} must be >= 1 row block")
        elif k == "align":
            if v != "1":
                raise ValueError(f"schedule_param {param!r}: align must be 1 (absent: releases not aligned)")
            out["align"] = True
        elif k == "swizzle":
            out["swizzle"] = int(v)
            if out["swizzle"] < 1:
                raise ValueError(f"schedule_param {param!r}: swizzle must be >= 1 row block (absent: 0)")
        else:
            raise ValueError(f"schedule_param {param!r}: unknown field {k!r}")
    if out["align"]:
        if out["order"] != ORDER_VERSIONS[1] or out["lag"] is None:
            raise ValueError(f"schedule_param {param!r}: align=1 belongs to a chunked lag list (lag=L,group=G)")
        out["order"] = ORDER_VERSION
    return out


@dataclass
class TaskList:
    """A schedule: int32 [n_tasks, 5] rows the persistent kernel walks, plus its device copies and status."""

    schedule: str
    param: str
    tasks: np.ndarray
    grid: TileGrid
    checked: bool = False          # check_tasks passed (the builders check; launchers check the others)
    _dev: dict = field(default_factory=dict, repr=False)

    @property
    def n_tasks(self) -> int:
        return self.tasks.shape[0]

    def on(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(tasks int32 [n, 5], wait status int64 [n, 6] zeroed once) on ``device`` (cached). Every Linear-2
        wait rewrites its own status row, so the status needs no reset between launches."""
        device = torch.device(device)
        if device not in self._dev:
            self._dev[device] = (torch.from_numpy(np.ascontiguousarray(self.tasks)).to(device),
                                 torch.zeros(max(self.n_tasks, 1), STATUS_FIELDS, dtype=torch.int64, device=device))
        return self._dev[device]


def _task_keys(tasks: np.ndarray, want: np.ndarray) -> np.ndarray:
    """One int64 per task row (mixed radix over the columns, radices from ``want`` and ``tasks``): comparing
    sorted 1-D keys is much faster than ``np.unique(axis=0)`` on 10^4-10^5 rows."""
    both = np.concatenate([tasks, want]).astype(np.int64)
    if both.size and both.min() < 0:
        return np.full(len(tasks), -1, dtype=np.int64) - np.arange(len(tasks))   # never equal to a tile's key
    radix = both.max(axis=0) + 1 if both.size else np.ones(TASK_FIELDS, dtype=np.int64)
    key = np.zeros(len(tasks), dtype=np.int64)
    for j in range(TASK_FIELDS):
        key = key * radix[j] + tasks[:, j].astype(np.int64)
    return key


def check_tasks(tasks: np.ndarray, grid: TileGrid) -> None:
    """Every tile of the grid exactly once, and every Linear-2 task after all Linear-1 tasks of its row block
    (the property that keeps the persistent kernel deadlock-free). ValueError otherwise."""
    tasks = np.asarray(tasks, dtype=np.int32).reshape(-1, TASK_FIELDS)
    want = grid.all_tiles()
    if tasks.shape != want.shape or not np.array_equal(np.sort(_task_keys(tasks, want)), np.sort(_task_keys(want, want))) \
            or len(np.unique(_task_keys(tasks, want))) != len(tasks):
        raise ValueError(f"task list does not hold every tile exactly once ({len(tasks)} tasks, "
                         f"{len(want)} tiles)")
    if not len(tasks):
        return
    pos = np.arange(len(tasks))
    l1 = tasks[:, 0] == KIND_L1
    last_l1 = np.full(grid.n_pool, -1)
    np.maximum.at(last_l1, tasks[l1, 4], pos[l1])
    l2 = ~l1
    early = l2 & (pos <= last_l1[tasks[:, 4]])
    if early.any():
        i = int(np.argmax(early))
        raise ValueError(f"task {i} (Linear-2 of expert {tasks[i, 1]}, row block {tasks[i, 2]}) comes before its "
                         f"Linear-1 producer at task {last_l1[tasks[i, 4]]}: the persistent kernel could deadlock")


def _task_list(name: str, param: str, rows: list[tuple], grid: TileGrid) -> TaskList:
    if grid.swizzle:                                     # the tile order is part of what ran (absent: 0)
        param = ",".join(x for x in (param, f"swizzle={grid.swizzle}") if x)
    tasks = np.array(rows, dtype=np.int32).reshape(-1, TASK_FIELDS)
    check_tasks(tasks, grid)
    return TaskList(name, param, tasks, grid, checked=True)


@dataclass(frozen=True)
class CostModel:
    """What ``predict_kernel_ns`` needs: the Burst-Gap parameters, the GEMM rate, programs, output bytes, and how
    tasks go to programs (``ASSIGNMENTS``)."""

    prm: BurstGapParams | StageParams     # fluid parameters, or a link's stage model (xstage.model.load_params)
    flop_per_ns_per_program: float
    n_programs: int
    out_bytes: int = 2
    assignment: str = "static"
    wait: str | None = None               # WAIT_MODELS name; None: WAIT_DEFAULT[assignment]
    stall: str | None = None              # STALL_MODELS name; None: STALL_DEFAULT

    @classmethod
    def from_tflops(cls, prm: BurstGapParams, tflops: float, n_programs: int, out_bytes: int = 2) -> "CostModel":
        return cls(prm, tflops * 1e3 / n_programs, n_programs, out_bytes)


def _claim_order(work: np.ndarray, n: int) -> np.ndarray:
    """Dynamic assignment: task i goes to the program that becomes free first (list order, ties to the lowest
    program), as an atomic ticket hands them out. Returns each task's program."""
    free = [(0.0, p) for p in range(n)]
    heapq.heapify(free)
    prog = np.empty(len(work), dtype=np.int64)
    for i, w in enumerate(work.tolist()):
        t, p = heapq.heappop(free)
        prog[i] = p
        heapq.heappush(free, (t + w, p))
    return prog


def _static_order(work: np.ndarray, n: int) -> np.ndarray:
    """Static assignment: task i on program i % n (program p walks tasks p, p + n, ...)."""
    return np.arange(len(work)) % n


ASSIGNMENT_REGISTRY = Registry("assignment", (
    Choice("static", "task i on program i % n_programs", _static_order),
    Choice("dynamic", "programs claim the next task in list order (an atomic ticket)", _claim_order),
))
ASSIGNMENTS = ASSIGNMENT_REGISTRY.names


def wait_walk(tasks: np.ndarray, work: np.ndarray, n: int, assignment: str = "dynamic"
              ) -> tuple[np.ndarray, np.ndarray]:
    """The event walk of a task list in time (computed, not measured): task i goes to its program (``dynamic``:
    the program free first, in list order, ties to the lowest, as the kernel's atomic ticket; ``static``: program
    i % n) when that program is free; a Linear-1 tile then takes ``work[i]``; a Linear-2 tile spins until the last
    Linear-1 tile of its row block has ended, then takes ``work[i]``. Every producer precedes its consumers in the
    list (``check_tasks``), so one pass in list order places every claim. Returns (program of each task int64 [n_tasks],
    spin of each task float64 [n_tasks], 0 for Linear-1 tiles and for consumers whose producers had ended)."""
    tasks = np.asarray(tasks)
    dyn = ASSIGNMENT_REGISTRY.check(assignment).name == "dynamic"
    free = [(0.0, p) for p in range(n)]
    heapq.heapify(free)
    at = np.zeros(n)                             # static: each program's free time
    done: dict[int, float] = {}                  # pool block -> end of its latest Linear-1 tile so far
    prog = np.empty(len(tasks), dtype=np.int64)
    spin = np.zeros(len(tasks))
    for i, (kind, pool, w) in enumerate(zip(tasks[:, 0].tolist(), tasks[:, 4].tolist(), np.asarray(work).tolist())):
        if dyn:
            t, p = heapq.heappop(free)
        else:
            p = i % n
            t = float(at[p])
        if kind == KIND_L1:
            end = t + w
            done[pool] = max(done.get(pool, 0.0), end)
        else:
            s_ = max(0.0, done.get(pool, 0.0) - t)
            spin[i] = s_
            end = t + s_ + w
        prog[i] = p
        if dyn:
            heapq.heappush(free, (end, p))
        else:
            at[p] = end
    return prog, spin


def claim_walk(tasks: np.ndarray, t1: float, t2: float, n: int) -> tuple[float, float]:
    """An event model of the dynamic assignment (computed, not measured; ``wait_walk`` with every Linear-1 tile
    ``t1`` and every Linear-2 tile ``t2``): ``n`` programs claim the tasks of the list in order as each becomes
    free (the kernel's atomic ticket); a Linear-2 tile, claimed at t, spins until the last Linear-1 tile of its row
    block has ended. Returns (makespan, share of Linear-2 tiles that spun). Unlike the positional wait term, it
    places each claim in time, so short Linear-2 tiles between a producer and its consumer bring the consumer's
    claim forward (scripts/megamoe_wait_model.py); ``predict_kernel_ns`` uses it with wait model ``time``."""
    tasks = np.asarray(tasks).reshape(-1, TASK_FIELDS)
    is2 = tasks[:, 0] == KIND_L2
    work = np.where(is2, float(t2), float(t1))
    prog, spin = wait_walk(tasks, work, n, "dynamic")
    load = np.bincount(prog, weights=work + spin, minlength=n)
    return float(load.max()) if len(tasks) else 0.0, float((spin[is2] > 0).mean()) if is2.any() else 0.0


def _wait_positions(tasks: np.ndarray, c: np.ndarray, c1: float, n: int, assignment: str, n_pool: int):
    """Wait model ``positions``: a consumer d < n list positions behind its last producer spins c1 (1 - d / n)
    (a round of n positions lasting one Linear-1 tile); programs by ``assignment`` over work + spin."""
    is2 = tasks[:, 0] == KIND_L2
    pos = np.arange(len(tasks))
    last_l1 = np.full(max(n_pool, 1), -1)
    np.maximum.at(last_l1, tasks[~is2, 4], pos[~is2])
    spin = np.where(is2, c1 * np.clip(1.0 - (pos - last_l1[tasks[:, 4]]) / n, 0.0, 1.0), 0.0)
    return ASSIGNMENT_REGISTRY.check(assignment).impl(c + spin, n), spin


def _wait_time(tasks: np.ndarray, c: np.ndarray, c1: float, n: int, assignment: str, n_pool: int):
    """Wait model ``time``: the event walk (``wait_walk``): each consumer spins until its producers have ended
    in time, under the assignment's claims."""
    return wait_walk(tasks, c, n, assignment)


# How predict_kernel_ns counts a Linear-2 tile's spin on its row block's Linear-1 tiles. impl(tasks, compute per
# task, c1, n, assignment, n_pool) -> (program of each task, spin of each task).
WAIT_MODELS = Registry("wait model", (
    Choice("positions", "a consumer d < n list positions behind its producer spins c1 (1 - d / n)", _wait_positions),
    Choice("time", "the event walk: claims placed in time, a consumer spins until its producers end", _wait_time),
))
# The wait model a CostModel without one uses, per assignment. Dynamic: ``time`` since session 14 (before:
# ``positions``, which every earlier record predicted and chose with; a record's sidecar names its own as
# params.wait_default, :func:`record_wait`). Measured: the positional term prices a half-round lag (lag = 66 of 132
# programs) at 5 % of compute where the kernel pays 12 % (fp8 Qwen3 T8192 hot, controls8 twice: 1.126 / 1.122 of
# Expert-Wave, 17 % of its tasks waited; the event walk predicts 1.17), so model_guided chose it for the host link;
# under the walk it picks lag 132 (1.014). Session 8's lists6 measured the walk's choices on the 61 pairs they change
# (model_guided's compute-only worst 1.090 -> 1.047 bf16, fp8 1.042 -> 1.045; Mixtral T128 lost 4-10 % of a mixing
# gain neither model sees). On round 9's host sweep both models hold 75-87 % of the speedups within 10 %
# (moe_round6.host_rescore).
WAIT_DEFAULT = {"static": "positions", "dynamic": "time"}
WAIT_BEFORE_V14 = "positions"     # the wait model of every record whose sidecar names none


def record_wait(meta: dict) -> str:
    """The wait model a recorded MegaMoE sweep or study predicted and chose with: its sidecar's
    params.wait_default for its assignment, else (every record before session 14) ``positions``."""
    p = meta.get("params", {}) if meta else {}
    wd = p.get("wait_default")
    return WAIT_MODELS.check(wd[p.get("assignment", "static")] if wd else WAIT_BEFORE_V14).name


def wait_model_of(cost: "CostModel") -> str:
    """The wait model ``cost`` predicts with (its own, else WAIT_DEFAULT of its assignment)."""
    ASSIGNMENT_REGISTRY.check(cost.assignment)
    return WAIT_MODELS.check(cost.wait or WAIT_DEFAULT[cost.assignment]).name


def _stall_issuers(B: float, b: int, m: int, q: float, prm_k: BurstGapParams) -> tuple[float, float]:
    """Stall model ``issuers``: the b issuing programs issue and stall T (``issue_time``, the stage draining
    throughout T); the round is charged b T / m. Returns (stall charged, stage bytes after)."""
    T, q_end = issue_time(B / b, b, q, prm_k)
    return b * float(T) / m, float(q_end)


def _stall_round(B: float, b: int, m: int, q: float, prm_k: BurstGapParams) -> tuple[float, float]:
    """Stall model ``round``: as ``issuers``, but the stage drains only during time the kernel is charged: the
    round cannot end before the bytes that do not fit in the stage (q + B - C_b) have drained at D, so the charge
    is max(b T / m, (q + B - C_b) / D), and the stage after it q + B - D x charge, within [0, C_b]. Where every
    program of the round issues (b = m) the two models agree; in a mixed round ``issuers`` credits the link with
    the drain of the issuers' whole T while charging b T / m, and can predict a kernel faster than its bytes / D."""
    s_, _ = _stall_issuers(B, b, m, q, prm_k)
    C, D = prm_k.capacity_bytes, prm_k.drain_gbps
    s = max(s_, (q + B - C) / D)
    return s, float(min(max(q + B - D * s, 0.0), C))


@dataclass(frozen=True, kw_only=True)
class OwnSlotsStage(BurstGapParams):
    """The fluid parameters of a round (``capacity_kib`` = phi C(b), the whole stage) with the two parts stall model
    ``round_burst`` chooses between: ``shared_kib`` = phi C_0 (the stage's shared part) and ``own_kib`` = phi c_p
    (one program's own slots), both of the stage fit (``stall_stage``)."""

    shared_kib: float
    own_kib: float


def _stall_burst(B: float, b: int, m: int, q: float, prm_k: BurstGapParams) -> tuple[float, float]:
    """Stall model ``round_burst`` (a candidate, session 16 helper): ``round`` with the whole stage phi C(b) when a
    program's own slots hold two of its bursts (2 B / b <= phi c_p: the burst it issues while its previous one
    drains), else with the shared part phi C_0 only (``round_shared``). ``prm_k``: an :class:`OwnSlotsStage`."""
    if not isinstance(prm_k, OwnSlotsStage):
        raise ValueError("stall model 'round_burst' needs the stage's parts (an OwnSlotsStage from stall_stage of a "
                         "StageParams with base_capacity_kib > 0)")
    if not (b >= 1 and B > 0):
        raise ValueError(f"round_burst needs B > 0 bytes from b >= 1 issuers, got B={B}, b={b}")
    whole = 2.0 * B / b <= prm_k.own_kib * 1024.0
    return _stall_round(B, b, m, q, replace(prm_k, capacity_kib=prm_k.capacity_kib if whole else prm_k.shared_kib))


# How predict_kernel_ns charges a round's remote stores. impl(bytes B, issuers b, programs m, stage bytes q after
# the round's compute, the fluid parameters of b issuers) -> (stall charged to the round, stage bytes after).
STALL_MODELS = Registry("stall model", (
    Choice("issuers", "the issuers' stall T spread over the round (b T / m); the stage drains for all of T",
           _stall_issuers),
    Choice("round", "as issuers, but the round lasts until the bytes beyond the stage have drained: the stage "
                    "drains only in charged time", _stall_round),
    Choice("round_shared", "round, with only the stage's shared part phi C_0 for every round (a stage model's "
                           "base_capacity_kib; the programs' own slots not the combine's)", _stall_round),
    Choice("round_burst", "round with the whole stage phi C(b) where a program's own slots hold two of its bursts "
                          "(2 B / b <= phi c_p), else round_shared's phi C_0 (a candidate, session 16)", _stall_burst),
))
# Stall models that see only the shared part of a StageParams stage (phi C_0) instead of phi C(b).
STALL_SHARED = ("round_shared",)
# Stall models that choose per round between the two parts (stall_stage hands them an OwnSlotsStage).
STALL_BURST = ("round_burst",)


def stall_stage(prm: "BurstGapParams | StageParams", b: int, stall: str) -> BurstGapParams:
    """The fluid parameters a round of ``b`` issuing programs sees under stall model ``stall``: a stage model's
    ``fluid(b)`` (phi C(b)), or for STALL_SHARED its shared part phi C_0 (a stage without one is an error); fluid
    parameters as they are, without the harness's overhead. STALL_BURST: an :class:`OwnSlotsStage` (phi C(b) with
    phi C_0 and phi c_p beside it; fluid parameters, or a stage without a shared part, are an error)."""
    name = STALL_MODELS.check(stall).name
    if name in STALL_BURST:
        if not isinstance(prm, StageParams) or prm.base_capacity_kib <= 0:
            raise ValueError(f"stall model {stall!r} needs a stage model with a shared part (StageParams, "
                             "base_capacity_kib > 0)")
        f = prm.fluid(b)
        return OwnSlotsStage(issue_ns_per_kib=f.issue_ns_per_kib, drain_gbps=f.drain_gbps, capacity_kib=f.capacity_kib,
                             overhead_ns=0.0, shared_kib=prm.base_capacity_kib * prm.stalled_fraction,
                             own_kib=prm.capacity_per_program_kib * prm.stalled_fraction)
    if not isinstance(prm, StageParams):
        return replace(prm, overhead_ns=0.0)
    f = prm.fluid(b)
    if name in STALL_SHARED:
        if prm.base_capacity_kib <= 0:
            raise ValueError(f"stall model {stall!r} needs a stage with a shared part (base_capacity_kib > 0)")
        f = replace(f, capacity_kib=prm.base_capacity_kib * prm.stalled_fraction)
    return f
# The stall model a CostModel without one uses. ``issuers`` is the model of every record before session 15 (a
# record's sidecar names its own as params.stall_default, :func:`record_stall`). ``round`` (session 15, helper): on
# the host link it lifts the largest layers' mixed lists from below their bytes / D to that floor; ``round_shared``
# also gives the combine only the host stage's shared part phi C_0 (no constant chosen on a record: the host fit's
# C_0, phi, D), within 10 % on 494 of round 10's 504 speedups (before: 405) and 458 of round 9's (before: 401; its
# misses are fp8 BM-64 rows) (docs/lab-notebook.md, session 15, "Host-link MegaMoE model"); the sweep's and the
# studies' sidecars name it (params.stall_default, xstage.moe_sweep / xstage.moe_gemm). ``round_shared`` is the default. Held out: round 12's host sweep (data/h200x1/megamoe_round12_host,
# tiles version 6 and lag version 2, recorded after the model's form was committed, predicted with ``issuers``)
# rescored: within 10 % on 482 of 504 speedups (issuers 411, round 431), worst |error| 10-17 % (issuers 17-31 %).
STALL_DEFAULT = "round_shared"
STALL_BEFORE_V14 = "issuers"      # the stall model of every record whose sidecar names none


def record_stall(meta: dict) -> str:
    """The stall model a recorded MegaMoE sweep predicted and chose with: its sidecar's params.stall_default,
    else (every record before it was named) ``issuers``."""
    p = meta.get("params", {}) if meta else {}
    return STALL_MODELS.check(p.get("stall_default") or STALL_BEFORE_V14).name


def stall_model_of(cost: "CostModel") -> str:
    """The stall model ``cost`` predicts with (its own, else STALL_DEFAULT)."""
    return STALL_MODELS.check(cost.stall or STALL_DEFAULT).name


def predict_kernel_ns(tl_: TaskList, remote_rows_per_block: np.ndarray, cost: CostModel,
                      hidden: int, inter: int, tiles: TileConfig) -> dict:
    """The module docstring's formula: {'total_ns', 'compute_ns', 'wait_ns', 'stall_ns', 'drain_ns', 'rounds',
    'imbalance'}. Compute and waits are the busiest program's (``cost.assignment``: static round-robin, task i on
    program i % n, or dynamic, each task to the program free first; ``imbalance`` = its load / the mean load);
    stalls and the final drain come from the Burst-Gap stage, round by round."""
    waits = WAIT_MODELS.check(wait_model_of(cost)).impl
    stall_name = stall_model_of(cost)
    stalls = STALL_MODELS.check(stall_name).impl
    stage = isinstance(cost.prm, StageParams)   # the per-link stage model: C(P) of the round's issuers
    prm = cost.prm.fluid(cost.n_programs) if stage else replace(cost.prm, overhead_ns=0.0)  # overhead: the harness's
    n = max(1, cost.n_programs)
    F = cost.flop_per_ns_per_program
    c1 = 2.0 * tiles.block_m * hidden * 2 * tiles.block_n1 / F
    c2 = 2.0 * tiles.block_m * inter * tiles.block_n2 / F
    tasks = tl_.tasks
    is2 = tasks[:, 0] == KIND_L2
    # a consumer whose producers have not ended spins (the wait model: list positions, or the claims in time)
    prog, wait = waits(tasks, np.where(is2, c2, c1), c1, n, cost.assignment, tl_.grid.n_pool)
    work = np.where(is2, c2, c1) + wait
    remote = np.where(is2, remote_rows_per_block[tasks[:, 4]] * float(tiles.block_n2 * cost.out_bytes), 0.0)
    # Program p walks tasks p, p + n, ... (a static round-robin): the kernel lasts as long as its busiest program,
    # so a list whose expensive tiles land on the same programs is slower than its round averages say.
    load = np.bincount(prog, weights=work, minlength=n)
    busiest = int(np.argmax(load))
    compute = float(np.bincount(prog, weights=work - wait, minlength=n)[busiest])
    waited = float(np.bincount(prog, weights=wait, minlength=n)[busiest])
    imbalance = float(load.max() / load.mean()) if load.mean() > 0 else 1.0
    q = 0.0
    stall = 0.0
    n_rounds = -(-len(tasks) // n)
    for k in range(n_rounds):
        sl = slice(k * n, (k + 1) * n)
        m = len(work[sl])                                 # programs busy in this round (n but in the last)
        c_k = float(work[sl].sum()) / m
        b = int(is2[sl].sum())
        B = float(remote[sl].sum())
        q = float(recover(q, c_k, prm))                  # the stage drains during the round's compute
        if B > 0:
            prm_k = stall_stage(cost.prm, b, stall_name)  # the stage the b issuing programs see
            s_k, q = stalls(B, b, m, q, prm_k)           # issuers: b programs issue (and stall) T, the others
            stall += s_k                                  # compute; round: and the link drains in charged time
    drain = float(drain_time(q, prm))
    return dict(total_ns=compute + waited + stall + drain, compute_ns=compute, wait_ns=waited, stall_ns=stall,
                drain_ns=drain, rounds=n_rounds, imbalance=imbalance)


def calibrate_rate(tl_: TaskList, hidden: int, inter: int, tiles: TileConfig, n_programs: int,
                   compute_ms: float, assignment: str = "static", wait: str | None = None) -> float:
    """Per-program FLOP/ns such that the model's compute-only time of ``tl_`` equals ``compute_ms`` (the kernel
    measured with every combine store local, tasks assigned by ``assignment``; ``wait``: the wait model, None =
    WAIT_DEFAULT's). Every term of the compute-only time scales with 1 / rate, so one unit-rate walk suffices."""
    unit = CostModel(BurstGapParams.reference(), 1.0, n_programs, assignment=assignment, wait=wait)
    none = np.zeros(max(tl_.grid.n_pool, 1), dtype=np.int64)
    return predict_kernel_ns(tl_, none, unit, hidden, inter, tiles)["total_ns"] / (compute_ms * 1e6)


def _expert_wave(grid: TileGrid, n_sms: int, lag, model, group, order) -> TaskList:
    return _task_list("expert_wave", "", schedule_expert_wave(grid, n_sms), grid)


def _group(grid: TileGrid, n_sms: int, group: int | None, order: int) -> int | None:
    """Row blocks per chunk of order ``order`` (None: version 1, single tiles / each ready row block)."""
    if order not in ORDER_VERSIONS:
        raise ValueError(f"order must be one of {', '.join(map(str, ORDER_VERSIONS))}, got {order}")
    if order == 1:
        if group is not None:
            raise ValueError(f"order version 1 has no chunks (group must be None), got group={group}")
        return None
    g = order_group(grid, n_sms) if group is None else group
    if g < 1:
        raise ValueError(f"group must be >= 1 row block, got {g}")
    return g


def _interleaved(grid: TileGrid, n_sms: int, lag, model, group: int | None, order: int) -> TaskList:
    g = _group(grid, n_sms, group, order)
    return _task_list("interleaved", "" if g is None else f"chunk={g}", schedule_interleaved(grid, n_sms, g), grid)


# Lag versions: what schedule ``lag``'s lag is when none is given. Every list's schedule_param names the lag it
# used (``lag=N``), so a recorded row re-predicts the same under any version (schedule_of_param reads N); a sidecar
# names the version its defaults used as params.lag_version (:func:`record_lag_version`; absent: 1).
#  1 (every record before session 15's lags11): lag = n_sms, one round of Linear-1 tiles.
#  2 (LAG_VERSION since session 15, measured by study lags11, data/h200x1/megamoe_round11_lags: compute only,
#    dynamic, tiles version 5, lag / Expert-Wave geomean / worst bf16 0.990 / 1.0497, fp8 0.986 / 1.030, against
#    version 1's 0.993 / 1.0497 and 0.989 / 1.084 in the same run): the smallest of LAG_RULE_CANDIDATES x n_sms whose compute-only walk
#    (``lag_walk_time``) is within LAG_RULE_TOLERANCE of the least of them. Why (session 14, helper lag): on
#    Mixtral T512 hot fp8 (8 row blocks of 112 Linear-1 tiles, the swizzle ends both row blocks of an expert on
#    its last tile) lag n releases the third expert's Linear-2 tiles inside the last round of Linear-1 tiles, so
#    the fourth expert's 64 Linear-2 tiles run alone after the last producers end, half the programs idle: the
#    walk 1.091-1.095 of Expert-Wave, measured 1.076 (span) / 1.080 (median), 25 % of Linear-2 tiles waited (the
#    walk: 25 %); lag 2n holds both last experts to the end, as Expert-Wave's last wave (the walk: 1.000).
LAG_VERSION = 2
LAG_VERSIONS = (1, 2)
LAG_RULE_CANDIDATES = (1.0, 1.5, 2.0)    # version 2's lags, in units of n_sms Linear-1 tiles (up to 2n: lag
#                                         stays a mixing list; 3n-4n hold most Linear-2 tiles to the end)
LAG_RULE_TOLERANCE = 0.005                          # version 2: ties within 0.5 % of the least walk go to the smaller lag


def _check_lag_version(v: int) -> None:
    if v not in LAG_VERSIONS:
        raise ValueError(f"lag version must be one of {', '.join(map(str, LAG_VERSIONS))}, got {v}")


def lag_walk_time(grid: TileGrid, n_sms: int, lag: int, group: int | None, align: bool = False) -> float:
    """Compute-only makespan (units of one Linear-1 tile) of lag's list (order version 3 with ``group``, 4 with
    ``align`` too, None: version 1) under dynamic claims: ``claim_walk`` with every Linear-1 tile 1 and every
    Linear-2 tile c2 / c1 = N1 / (2 N2) (the FLOP ratio of predict_kernel_ns's c1, c2: 2 BM I BN2 / (2 BM Hd 2
    BN1)); no rate, no link."""
    tasks = np.array(schedule_lag(grid, lag, group, align), dtype=np.int64).reshape(-1, TASK_FIELDS)
    return 0.0 if not len(tasks) else claim_walk(tasks, 1.0, grid.n1 / (2.0 * max(grid.n2, 1)), n_sms)[0]


def lag_of_rule(grid: TileGrid, n_sms: int, group: int | None = None, version: int | None = None,
                align: bool = False) -> int:
    """Lag's lag under lag ``version`` (None: LAG_VERSION) for ``grid``, ``group`` row blocks per chunk (None:
    order version 1): version 1 n_sms; version 2 the smallest of LAG_RULE_CANDIDATES x n_sms whose
    :func:`lag_walk_time` is within LAG_RULE_TOLERANCE of the least (computed, from the grid alone)."""
    v = LAG_VERSION if version is None else version
    _check_lag_version(v)
    if v == 1 or not grid.n_pool:
        return n_sms
    lags = [int(round(f * n_sms)) for f in LAG_RULE_CANDIDATES]
    t = [lag_walk_time(grid, n_sms, L, group, align) for L in lags]
    best = min(t)
    return next(L for L, x in zip(lags, t) if x <= best * (1.0 + LAG_RULE_TOLERANCE))


def record_lag_version(meta: dict) -> int:
    """The lag version a recorded sweep or study's defaults used: its sidecar's params.lag_version, else 1
    (every record before it was named). Re-predictions never need it: each list's param names its lag."""
    v = int((meta or {}).get("params", {}).get("lag_version", 1))
    _check_lag_version(v)
    return v


def _lag(grid: TileGrid, n_sms: int, lag: int | None, model, group: int | None, order: int) -> TaskList:
    g = _group(grid, n_sms, group, order)
    align = order >= 4 and grid.swizzle > 0          # unswizzled: every row block its own unit, the same list
    if lag is None:
        lag = lag_of_rule(grid, n_sms, g, align=align)
    if lag < 0:
        raise ValueError(f"lag must be >= 0, got {lag}")
    param = f"lag={lag}" + ("" if g is None else f",group={g}") + (",align=1" if align else "")
    return _task_list("lag", param, schedule_lag(grid, lag, g, align), grid)


def _model_guided(grid: TileGrid, n_sms: int, lag, model: tuple | None, group: int | None, order: int) -> TaskList:
    if model is None:
        raise ValueError("model_guided needs model=(CostModel, remote rows per block, hidden, inter, tiles)")
    cands = [build_schedule("expert_wave", grid, n_sms),
             build_schedule("interleaved", grid, n_sms, group=group, order=order)]
    cands += [build_schedule("lag", grid, n_sms, lag=int(round(f * n_sms)), group=group, order=order)
              for f in LAG_CANDIDATES]
    cost, remote, hidden, inter, tiles = model
    pred = [predict_kernel_ns(c, remote, cost, hidden, inter, tiles)["total_ns"] for c in cands]
    best = cands[int(np.argmin(pred))]
    # the choice as a schedule_param: lag's own ("lag=N[,group=G]"), else the name (and its chunk)
    param = best.param if best.schedule == "lag" else ",".join(x for x in (best.schedule, best.param) if x)
    return TaskList("model_guided", param, best.tasks, grid, checked=True)      # (best.param names the swizzle)


# The schedules, in table order (the first is the baseline every speedup divides); the module docstring says
# what each does. impl(grid, n_sms, lag, model, group, order) -> TaskList.
SCHEDULE_REGISTRY = Registry("schedule", (
    Choice("expert_wave", "per wave of experts all Linear-1 tiles, then all Linear-2 tiles (DeepGEMM)", _expert_wave),
    Choice("interleaved", "Linear-2 tiles of wave w spread among the Linear-1 tiles of wave w+1", _interleaved),
    Choice("lag", "one Linear-1 stream; a row block's Linear-2 tiles follow lag tiles after its last producer", _lag),
    Choice("model_guided", "the candidate with the least time the Burst-Gap model predicts", _model_guided),
))
SCHEDULES = SCHEDULE_REGISTRY.names


def build_schedule(name: str, grid: TileGrid, n_sms: int, lag: int | None = None,
                   model: tuple | None = None, group: int | None = None, order: int | None = None) -> TaskList:
    """The task list of schedule ``name`` (SCHEDULE_REGISTRY) for one rank's tiles; checked by ``check_tasks``.

    ``lag`` (schedule ``lag``): Linear-1 tiles between a row block's last producer and its Linear-2 tiles
    (default ``lag_of_rule`` of LAG_VERSION: version 2's rule; version 1 n_sms). ``model`` (``model_guided``): (CostModel, remote rows per block [n_pool], hidden,
    intermediate, TileConfig); the candidate with the least predicted time wins. ``order`` (interleaved, lag and
    model_guided's candidates): the order version, None = ORDER_VERSION (chunks of ``group`` row blocks, None =
    ``order_group``; every chunk named in the param) or 1 (single tiles, ``group`` must be None)."""
    if n_sms < 1:
        raise ValueError(f"n_sms must be >= 1, got {n_sms}")
    return SCHEDULE_REGISTRY.check(name).impl(grid, n_sms, lag, model, group,
                                              ORDER_VERSION if order is None else order)


def schedule_of_param(schedule: str, param: str, grid: TileGrid, n_sms: int) -> TaskList:
    """The task list a recorded row ran (schedule and schedule_param; model_guided: its recorded choice), on
    ``grid`` with the row's tile order (``swizzle=G``; none: row-block-major). A param without a chunk is order
    version 1 (what every record before order version 2 ran, and version 2 where its
    chunk was one row block)."""
    p = parse_schedule_param(param)
    if schedule == "model_guided":
        ch = p["choice"]
        if ch not in ("expert_wave", "interleaved", "lag"):
            raise ValueError(f"model_guided's recorded choice {param!r} names no candidate")
        schedule = ch
    if p["swizzle"] != grid.swizzle:                     # the tile order the row ran (absent: row-block-major)
        grid = replace(grid, swizzle=p["swizzle"])
    return build_schedule(schedule, grid, n_sms, lag=p["lag"], group=p["group"], order=p["order"])


def routing_of(case: MoECase, P: int) -> tuple[list, list, list[RankLayout]]:
    """Every rank's (ids, weights) and layout for ``case`` on P ranks."""
    s = case.shape
    rw = [route(case.tokens, s.experts, s.topk, case.routing, case.seed, r) for r in range(P)]
    ids, wts = [a for a, _ in rw], [b for _, b in rw]
    return ids, wts, build_layouts(ids, s.experts)


L2_CACHE_BYTES = 50 * 2**20     # the H200's L2 (the model below; a model parameter, not measured here)


def l2_traffic(tl_: TaskList, hidden: int, inter: int, tiles: TileConfig, act_bytes: int,
               cache_bytes: float = L2_CACHE_BYTES) -> dict:
    """A model of the DRAM bytes a task list reads (computed, never measured): an LRU cache of ``cache_bytes``
    walked in list order (dynamic assignment starts tasks in list order), each task reading its operand blocks --
    Linear-1: the x row block (BM x Hd) and the W1 column block (Hd x 2 BN1), then writing the intermediate row
    block (BM x I, kept in the cache, not read); Linear-2: the intermediate row block and the W2 column block
    (I x BN2) -- in ``act_bytes`` per element (scales left out). A block not in the cache costs its bytes. It
    ignores that ~n_sms tiles run at once (tiles in flight share what it counts as misses), so it overstates
    misses whose reuse distance is under a round. Returns {'bytes': the modelled DRAM bytes, 'weights': of them
    W1 + W2, 'unique': every operand block read once}."""
    from collections import OrderedDict

    bm, bn1, bn2 = tiles.block_m, tiles.block_n1, tiles.block_n2
    size = {0: bm * hidden * act_bytes, 1: hidden * 2 * bn1 * act_bytes, 2: bm * inter * act_bytes,
            3: inter * bn2 * act_bytes}                    # x, W1, intermediate, W2 blocks
    lru: OrderedDict = OrderedDict()
    used = miss = wmiss = 0
    seen = set()

    def touch(key: tuple, read: bool = True) -> None:
        nonlocal used, miss, wmiss
        seen.add(key)
        if key in lru:
            lru.move_to_end(key)
            return
        if read:
            miss += size[key[0]]
            wmiss += size[key[0]] if key[0] in (1, 3) else 0
        lru[key] = None
        used += size[key[0]]
        while used > cache_bytes and lru:
            k, _ = lru.popitem(last=False)
            used -= size[k[0]]

    for kind, e, rb, cb, _ in tl_.tasks.tolist():
        if kind == KIND_L1:
            touch((0, e, rb))
            touch((1, e, cb))
            touch((2, e, rb), read=False)
        else:
            touch((2, e, rb))
            touch((3, e, cb))
    return dict(bytes=float(miss), weights=float(wmiss), unique=float(sum(size[k[0]] for k in seen)))


# --------------------------------------------------------------------------------- the model on recorded rows
@functools.lru_cache(maxsize=4096)
def _recorded_task_list(case: MoECase, P: int, r: int, tiles: TileConfig, n_sms: int, schedule: str,
                        param: str) -> tuple[TaskList, np.ndarray]:
    """Rank ``r``'s task list of a recorded row (:func:`schedule_of_param` on the seeded routing's grid) and its
    remote rows per block. Independent of the stage parameters, so memoised: every re-prediction of the same
    record (another parameter set, another wait model) reuses the lists the first one built and checked."""
    s = case.shape
    layouts = _layouts_of(case, P)
    grid = TileGrid.of(layouts[r], s.hidden, s.intermediate, tiles)
    return schedule_of_param(schedule, param, grid, n_sms), grid.remote_rows_per_block(layouts[r])


@functools.lru_cache(maxsize=256)
def _layouts_of(case: MoECase, P: int) -> tuple:
    return tuple(routing_of(case, P)[2])


def repredict(df: pd.DataFrame, prm: BurstGapParams, n_sms: int, assignment: str = "static",
              wait: str | None = None, stall: str | None = None, recorded: str | None = None,
              observed_rank: int | None = None) -> pd.DataFrame:
    """The current ``predict_kernel_ns`` applied to recorded MegaMoE rows (a model, computed, never measured):
    per configuration and dtype, every rank's task list is rebuilt from the seeded routing (model_guided: the
    recorded choice), the per-program GEMM rate calibrated on the recorded compute-only time, and the prediction
    taken as the maximum over ranks. ``assignment``: predict as if the kernel had assigned tasks so (``dynamic``
    on static records: what a dynamic run should show, with the static compute-only calibration); ``recorded``: the
    assignment the rows' compute-only time was measured under, which the rate is calibrated with (None: ``assignment``,
    as the sweep calibrates; until session 17 this was always static, which mis-calibrated dynamic records). Returns the
    rows' keys + schedule with ``model_ms`` and ``model_speedup`` (expert_wave / schedule) and ``imbalance``
    (busiest program / mean, max over ranks). ``wait``: the wait model (None: WAIT_DEFAULT of ``assignment``);
    ``stall``: the stall model (None: STALL_DEFAULT). ``observed_rank``: the rows are that rank's times alone (a
    one-GPU record: its ranks run one after another and only the observed rank is timed, sidecar
    ``params.observed_rank``): its compute-only time calibrates that rank's rate and the prediction is that rank's,
    not the maximum over ranks (until session 18 every rank was calibrated on the observed rank's time and the
    slowest taken, which on hot routing predicted another rank's kernel)."""
    cases = {(c.shape.name, c.tokens, c.routing): c for c in CASES}
    out = []
    keys = ["shape", "tokens", "routing", "P", "dtype"]
    for (name, tokens, routing, P, dtype), g in df.groupby(keys, sort=False):
        c = cases.get((name, tokens, routing))
        if c is None:
            raise ValueError(f"{name} T={tokens} {routing} is not one of the 84 configurations")
        s = c.shape
        rows = g.drop_duplicates("schedule").set_index("schedule")
        tiles = tiles_of_row(rows.iloc[0])     # the tiles the row ran with (old records: TILES_V1)
        out_bytes = OUT_DTYPES[dtype].itemsize
        pred: dict[str, list] = {}
        if observed_rank is not None and not 0 <= int(observed_rank) < int(P):
            raise ValueError(f"observed_rank {observed_rank} is not a rank of a {int(P)}-rank world")
        for r in (range(int(P)) if observed_rank is None else (int(observed_rank),)):
            ew, remote = _recorded_task_list(c, int(P), r, tiles, n_sms, "expert_wave",
                                             str(rows.schedule_param.get("expert_wave", "")))
            rate = calibrate_rate(ew, s.hidden, s.intermediate, tiles, n_sms, float(rows.compute_ms.iloc[0]),
                                  recorded or assignment, wait)
            cost = CostModel(prm, rate, n_sms, out_bytes, assignment, wait, stall)
            for sched, row in rows.iterrows():
                par = str(row.schedule_param)
                if sched == "model_guided":   # the recorded choice of this rank ("a|b": rank 0's, rank 1's)
                    ch = par.split("|")
                    par = ch[r] if len(ch) == int(P) else ch[0]
                try:
                    tl_ = ew if sched == "expert_wave" else _recorded_task_list(c, int(P), r, tiles, n_sms,
                                                                                sched, par)[0]
                except ValueError as e:
                    raise ValueError(f"{name} T={tokens} {routing} {dtype}: {e}") from e
                p = predict_kernel_ns(tl_, remote, cost, s.hidden, s.intermediate, tiles)
                pred.setdefault(sched, []).append((p["total_ns"] / 1e6, p["imbalance"]))
        base = max(t for t, _ in pred["expert_wave"]) if "expert_wave" in pred else float("nan")
        for sched, v in pred.items():
            ms = max(t for t, _ in v)
            out.append(dict(zip(keys, (name, tokens, routing, P, dtype)), schedule=sched, model_ms=ms,
                            model_speedup=base / ms, imbalance=max(i for _, i in v)))
    return pd.DataFrame(out)


# ------------------------------------------------------------------- a study's selection (notebook parameters)
BASELINE = "expert_wave"       # the schedule every kernel speedup divides


def _names(value, what: str, allowed: tuple[str, ...]) -> list[str]:
    """A non-empty list of distinct names, each in ``allowed``; ValueError naming the parameter otherwise."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ValueError(f"{what} must be a list of names, e.g. {list(allowed[:2])}, got {value!r}")
    bad = [v for v in value if v not in allowed]
    if bad:
        raise ValueError(f"{what}: unknown {', '.join(map(repr, bad))}; choose from {', '.join(allowed)}")
    if not value:
        raise ValueError(f"{what} must name at least one of {', '.join(allowed)}")
    if len(set(value)) != len(value):
        raise ValueError(f"{what} lists a name twice: {list(value)}")
    return list(value)


def selection(dtypes=None, schedules=None, shapes=None) -> dict[str, list[str]]:
    """Checked notebook parameters of the MegaMoE study (None = all): ``dtypes`` of xstage.moe_plan.DTYPES_GPU,
    ``schedules`` of xstage.moe_plan.SCHEDULES (compared with expert_wave, which is always added as the baseline;
    at least one other), ``shapes`` by name of xstage.moe_plan.SHAPES. Returns them as lists (table order)."""
    shape_names = tuple(s.name for s in SHAPES)
    sel = {"dtypes": _names(list(DTYPES_GPU) if dtypes is None else dtypes, "dtypes", DTYPES_GPU),
           "schedules": _names(list(SCHEDULES) if schedules is None else schedules, "schedules", SCHEDULES),
           "shapes": _names(list(shape_names) if shapes is None else shapes, "shapes", shape_names)}
    others = [s for s in SCHEDULES if s != BASELINE]
    if not set(sel["schedules"]) & set(others):
        raise ValueError(f"schedules must name at least one of {', '.join(others)} (compared with "
                         f"{BASELINE}), got {sel['schedules']}")
    sel["schedules"] = [s for s in SCHEDULES if s in sel["schedules"] or s == BASELINE]
    sel["dtypes"] = [d for d in DTYPES_GPU if d in sel["dtypes"]]
    sel["shapes"] = [s for s in shape_names if s in sel["shapes"]]
    return sel


def expected_configs(shapes=None) -> list[str]:
    """Names of the configurations a complete record holds per dtype: the 84 of xstage.moe_plan.CASES, or those of
    ``shapes`` (table order)."""
    shapes = selection(shapes=shapes)["shapes"]
    return [c.name for c in CASES if c.shape.name in shapes]
