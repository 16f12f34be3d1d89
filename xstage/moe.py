"""MegaMoE: fused Linear-1 -> SwiGLU -> Linear-2 -> remote-store combine, with the schedule as data.

Host side of ``xstage.kernels.moe``: the 84-configuration table (4 model shapes x 7 tokens per rank x 3 routing
distributions), seeded routing generators, the routing layout (counts, offsets, destination rows; torch ops),
FLOP / byte counts, the schedules (task lists the persistent kernel walks: ``expert_wave``, ``interleaved``,
``lag``, ``model_guided``) and the Burst-Gap prediction of each schedule's kernel time, a float32 torch reference,
validated launchers (dispatch push, the fused experts kernel, the end-of-phase epoch barrier, the whole layer),
the unfused GPU baseline, a correctness job and the resumable sweep (schema ``megamoe``).

Legend: P = ranks, E = experts, El = E / P experts per rank, K = top-k, T = tokens per rank, Hd = hidden,
I = intermediate, R = rows a rank receives (sum over its experts of the (token, slot) items routed there),
BM = rows per row block, N1 = I / BN1 Linear-1 column blocks, N2 = Hd / BN2 Linear-2 column blocks, n = programs
of the persistent kernel (= SMs on a GPU).

The layer on every rank r (``megamoe_layer``):
  1. dispatch: rank r pushes each (token, slot) item's row x[token] [Hd] (fp8 + 1x128 scales with FP8) and its
     meta (r, token, slot, router weight) into the receive buffer of the expert's owner, at the row the host
     layout assigned (owner's layout: expert-major; within an expert by source rank, then by (token, slot));
     then an epoch barrier (every rank's pushes are visible).
  2. experts: the persistent kernel walks the schedule's task list; Linear-2 epilogues store each output row
     into the combine buffer [K, T, Hd] of the row's source rank (peer pointer, or local); then an epoch barrier.
  3. top-k reduction: out[T, Hd] = sum over slots of the combine buffer (float32 sum, a torch op).
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
                further Linear-1 tiles have been listed after its last producer (lag = n_sms by default: one
                round, so a consumer rarely spins).
  model_guided  the candidate (expert_wave, interleaved, lag = 0, n/2, n, 2n, 4n) with the best time predicted
                by the Burst-Gap model (below); its ``param`` names the choice.

Prediction of a schedule's kernel time (``predict_kernel_ns``), documented formula. Program i % n runs task i,
so the list falls into rounds k of n consecutive tasks (what the n programs work on at about the same time).
Tile compute times c1 = 2 BM Hd 2 BN1 / F and c2 = 2 BM I BN2 / F, F = the per-program GEMM rate (FLOP/ns),
calibrated so that the model's time of expert_wave without remote bytes equals the kernel measured with every
combine store sent to a local buffer (``compute_ms``; a given TFLOP/s when not measured). A Linear-2 task less
than a round behind its last producer (distance d < n positions) spins w = c1 (1 - d / n). Tasks are assigned
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
i.e. compute time plus the Burst-Gap model's issue-and-stall time of each burst and the final drain. Expert-Wave
rounds are all Linear-2: every program issues at once, the burst exceeds the outstanding capacity and every
program stalls. Interleaved rounds mix: about half the programs issue half the bytes, the rest compute, and the
compute between bursts drains the stage.

Dtypes: ``bf16`` and ``fp8`` (e4m3 with 1x128 activation / 128x128 weight scales, output bf16) on GPUs;
``fp16`` and ``fp32`` under Triton's interpreter (its bf16 ``tl.dot`` is wrong and it has no fp8).
"""
from __future__ import annotations

import heapq
import itertools
import math
import sys
import time
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from . import data, env
from .kernels.moe import dispatch_push_kernel, megamoe_kernel
from .numeric import check_bit_identical, rel_l2
from .ranks import epoch_barrier
from .model import BurstGapParams, drain_time, issue_time, recover

SCHEDULES = ("expert_wave", "interleaved", "lag", "model_guided")
ROUTINGS = ("uniform", "zipf", "hot")
TOKENS_PER_RANK = (128, 256, 512, 1024, 2048, 4096, 8192)
DTYPES_GPU = ("bf16", "fp8")
DTYPES_INTERPRETER = ("fp16", "fp32")
ZIPF_EXPONENT = 1.0         # expert popularity p_e ~ 1 / rank_e^s (ranks in a seeded random order of experts)
HOT_FRACTION = 0.5          # "hot": this fraction of tokens routes one slot to the hot expert; no others do
LAG_CANDIDATES = (0.0, 0.5, 1.0, 2.0, 4.0)   # model_guided's lags, in units of n_sms Linear-1 tiles
WAVE_FILL = 2               # expert_wave: a wave's Linear-1 tiles reach WAVE_FILL x n_sms
ASSIGNMENTS = ("static", "dynamic")   # task -> program: i % n_programs, or claimed in list order (atomic ticket)
MAX_POLLS = 20_000_000      # bound on every wait (~seconds on a GPU): a peer still compiling must fit
CALLS_TARGET_MS = 2.0       # sweep: back-to-back calls per timed run so that a run lasts >= ~2 ms ...
CALLS_MAX = 16              # ... at most this many (CUDA events around one short call include its launch)
TASK_FIELDS = 5
META_FIELDS = 4
STATUS_FIELDS = 6
FP8_BLOCK = 128
FP8_MAX = 448.0
FP8_AMAX_FLOOR = 1e-4
KIND_L1, KIND_L2 = 0, 1
INT32_MAX = 2**31 - 1
ACT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
              "fp8": torch.float8_e4m3fn}
OUT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp8": torch.bfloat16}
REL_L2_FLOOR = {"fp32": 1e-6, "fp16": 1e-4, "bf16": 1e-3}
FP8_REL_L2 = 2e-2           # fp8: kernel vs the float32 emulation of the same quantisation
UNFUSED_REL_L2 = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 3e-2, "fp8": 0.1}   # fused vs the unfused baseline


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
    table = {c.name: c for c in CASES}
    bad = [n for n in names if n not in table]
    if bad:
        raise ValueError(f"unknown case(s) {bad}; e.g. {CASES[0].name}")
    return [table[n] for n in names]


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


def default_tiles(dtype: str, rows_per_expert: float | None = None) -> TileConfig:
    """H200 (sm_90), 8 warps, BN1 = BN2 = 128. bf16: BK = 64, 3 stages, BM = 64 when experts get few rows (< 96
    on average), else 128 (ptxas: 243 registers, 144 KiB shared memory, no spills). fp8: BK = 128 (the scale
    block), 2 stages, BM = 64 always (BM = 128 needs 255 registers and spills: the gate and up accumulators plus
    each K block's unscaled MMA results). Small tiles under the interpreter."""
    if env.interpreted():
        return INTERPRETER_TILES
    return gpu_tiles(dtype, 64 if dtype == "fp8" or (rows_per_expert is not None and rows_per_expert < 96) else 128)


def gpu_tiles(dtype: str, block_m: int) -> TileConfig:
    """The H200 tiles of ``dtype`` with row blocks of ``block_m`` (``default_tiles`` picks ``block_m``; a recorded
    row's ``block_m`` gives back the whole configuration it ran with)."""
    if dtype == "fp8":
        return TileConfig(block_m, 128, 128, 128, 8, 2)
    return TileConfig(block_m, 128, 128, 64, 8, 3)


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
    if routing not in ROUTINGS:
        raise ValueError(f"routing must be one of {ROUTINGS}, got {routing!r}")
    if not 1 <= topk <= experts or tokens < 1:
        raise ValueError(f"need 1 <= topk <= experts and tokens >= 1, got {topk}, {experts}, {tokens}")
    shared = torch.Generator().manual_seed(1_000_003 * seed + 17)        # the model's popularity: all ranks
    g = torch.Generator().manual_seed(1_000_003 * seed + 7_919 * (rank + 1))
    if routing == "uniform":
        ids = torch.rand(tokens, experts, generator=g).topk(topk, dim=1).indices
    elif routing == "zipf":
        order = torch.randperm(experts, generator=shared)                 # order[i] = the (i+1)-th most popular
        logp = torch.empty(experts)
        logp[order] = -ZIPF_EXPONENT * torch.log(torch.arange(1, experts + 1, dtype=torch.float32))
        gumbel = -torch.log(-torch.log(torch.rand(tokens, experts, generator=g).clamp_min(1e-20)))
        ids = (logp + gumbel).topk(topk, dim=1).indices
    else:
        hot = int(torch.randint(experts, (1,), generator=shared))
        is_hot = torch.rand(tokens, generator=g) < HOT_FRACTION
        scores = torch.rand(tokens, experts, generator=g)
        scores[:, hot] = -1.0                                             # nobody else picks the hot expert
        scores[is_hot, hot] = 2.0                                         # ... the hot tokens always do
        ids = scores.topk(topk, dim=1).indices
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
    """The tiles of one rank's experts: row blocks of BM rows per local expert, N1 / N2 column blocks."""

    expert_rows: tuple[int, ...]
    block_m: int
    n1: int                        # Linear-1 column blocks (I / BN1)
    n2: int                        # Linear-2 column blocks (Hd / BN2)

    @classmethod
    def of(cls, layout: RankLayout, hidden: int, inter: int, tiles: TileConfig) -> "TileGrid":
        return cls(layout.expert_rows, tiles.block_m, inter // tiles.block_n1, hidden // tiles.block_n2)

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
        """(kind, expert, row block, column block, pool block) of one expert, row-block-major."""
        n = self.n1 if kind == KIND_L1 else self.n2
        p0 = self.pool_start[expert]
        return [(kind, expert, rb, cb, p0 + rb) for rb in range(self.row_blocks[expert]) for cb in range(n)]

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


def _l(grid: TileGrid, kind: int, experts: Sequence[int]) -> list[tuple]:
    return [t for e in experts for t in grid.tiles(kind, e)]


def _spread(a: list, b: list) -> list:
    """Merge two lists, each keeping its order, with a's and b's items spread evenly over the result."""
    keyed = [((i + 0.5) / len(a), 0, t) for i, t in enumerate(a)] + [((j + 0.5) / len(b), 1, t)
                                                                     for j, t in enumerate(b)]
    return [t for _, _, t in sorted(keyed, key=lambda k: (k[0], k[1]))]


def schedule_expert_wave(grid: TileGrid, n_sms: int) -> list[tuple]:
    out = []
    for w in expert_waves(grid, n_sms):
        out += _l(grid, KIND_L1, w) + _l(grid, KIND_L2, w)
    return out


def schedule_interleaved(grid: TileGrid, n_sms: int) -> list[tuple]:
    waves = expert_waves(grid, n_sms)
    if not waves:
        return []
    out = _l(grid, KIND_L1, waves[0])
    for prev, w in zip(waves, waves[1:]):
        out += _spread(_l(grid, KIND_L2, prev), _l(grid, KIND_L1, w))
    return out + _l(grid, KIND_L2, waves[-1])


def schedule_lag(grid: TileGrid, lag: int) -> list[tuple]:
    experts = range(len(grid.expert_rows))
    l1 = _l(grid, KIND_L1, experts)
    last = {}                                                          # pool block -> position of its last L1
    for j, t in enumerate(l1):
        last[t[4]] = j
    l2 = sorted(_l(grid, KIND_L2, experts), key=lambda t: (last[t[4]], t[3]))
    out, qi = [], 0
    for j, t in enumerate(l1):
        out.append(t)
        while qi < len(l2) and last[l2[qi][4]] + lag <= j:
            out.append(l2[qi])
            qi += 1
    return out + l2[qi:]


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
    tasks = np.array(rows, dtype=np.int32).reshape(-1, TASK_FIELDS)
    check_tasks(tasks, grid)
    return TaskList(name, param, tasks, grid, checked=True)


@dataclass(frozen=True)
class CostModel:
    """What ``predict_kernel_ns`` needs: the Burst-Gap parameters, the GEMM rate, programs, output bytes, and how
    tasks go to programs (``ASSIGNMENTS``)."""

    prm: BurstGapParams
    flop_per_ns_per_program: float
    n_programs: int
    out_bytes: int = 2
    assignment: str = "static"

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


def predict_kernel_ns(tl_: TaskList, remote_rows_per_block: np.ndarray, cost: CostModel,
                      hidden: int, inter: int, tiles: TileConfig) -> dict:
    """The module docstring's formula: {'total_ns', 'compute_ns', 'wait_ns', 'stall_ns', 'drain_ns', 'rounds',
    'imbalance'}. Compute and waits are the busiest program's (``cost.assignment``: static round-robin, task i on
    program i % n, or dynamic, each task to the program free first; ``imbalance`` = its load / the mean load);
    stalls and the final drain come from the Burst-Gap stage, round by round."""
    if cost.assignment not in ASSIGNMENTS:
        raise ValueError(f"assignment must be one of {ASSIGNMENTS}, got {cost.assignment!r}")
    prm = replace(cost.prm, overhead_ns=0.0)   # overhead_ns is the microbenchmark harness's, not the kernel's
    n = max(1, cost.n_programs)
    F = cost.flop_per_ns_per_program
    c1 = 2.0 * tiles.block_m * hidden * 2 * tiles.block_n1 / F
    c2 = 2.0 * tiles.block_m * inter * tiles.block_n2 / F
    tasks = tl_.tasks
    is2 = tasks[:, 0] == KIND_L2
    pos = np.arange(len(tasks))
    last_l1 = np.full(max(tl_.grid.n_pool, 1), -1)
    np.maximum.at(last_l1, tasks[~is2, 4], pos[~is2])
    # a consumer less than a round behind its last producer spins for the rest of the producer's tile
    wait = np.where(is2, c1 * np.clip(1.0 - (pos - last_l1[tasks[:, 4]]) / n, 0.0, 1.0), 0.0)
    work = np.where(is2, c2, c1) + wait
    remote = np.where(is2, remote_rows_per_block[tasks[:, 4]] * float(tiles.block_n2 * cost.out_bytes), 0.0)
    # Program p walks tasks p, p + n, ... (a static round-robin): the kernel lasts as long as its busiest program,
    # so a list whose expensive tiles land on the same programs is slower than its round averages say.
    prog = pos % n if cost.assignment == "static" else _claim_order(work, n)
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
            T, q_end = issue_time(B / b, b, q, prm)
            q = float(q_end)
            stall += b * float(T) / m                     # b programs issue (and stall) T; the others compute
    drain = float(drain_time(q, prm))
    return dict(total_ns=compute + waited + stall + drain, compute_ns=compute, wait_ns=waited, stall_ns=stall,
                drain_ns=drain, rounds=n_rounds, imbalance=imbalance)


def calibrate_rate(tl_: TaskList, hidden: int, inter: int, tiles: TileConfig, n_programs: int,
                   compute_ms: float, assignment: str = "static") -> float:
    """Per-program FLOP/ns such that the model's compute-only time of ``tl_`` equals ``compute_ms`` (the kernel
    measured with every combine store local, tasks assigned by ``assignment``)."""
    unit = CostModel(BurstGapParams.reference(), 1.0, n_programs, assignment=assignment)
    none = np.zeros(max(tl_.grid.n_pool, 1), dtype=np.int64)
    return predict_kernel_ns(tl_, none, unit, hidden, inter, tiles)["total_ns"] / (compute_ms * 1e6)


def build_schedule(name: str, grid: TileGrid, n_sms: int, lag: int | None = None,
                   model: tuple | None = None) -> TaskList:
    """The task list of schedule ``name`` (SCHEDULES) for one rank's tiles; checked by ``check_tasks``.

    ``lag`` (schedule ``lag``): Linear-1 tiles between a row block's last producer and its Linear-2 tiles
    (default n_sms). ``model`` (``model_guided``): (CostModel, remote rows per block [n_pool], hidden,
    intermediate, TileConfig); the candidate with the least predicted time wins."""
    if n_sms < 1:
        raise ValueError(f"n_sms must be >= 1, got {n_sms}")
    if name == "expert_wave":
        return _task_list(name, "", schedule_expert_wave(grid, n_sms), grid)
    if name == "interleaved":
        return _task_list(name, "", schedule_interleaved(grid, n_sms), grid)
    if name == "lag":
        lag = n_sms if lag is None else lag
        if lag < 0:
            raise ValueError(f"lag must be >= 0, got {lag}")
        return _task_list(name, f"lag={lag}", schedule_lag(grid, lag), grid)
    if name == "model_guided":
        if model is None:
            raise ValueError("model_guided needs model=(CostModel, remote rows per block, hidden, inter, tiles)")
        cands = [build_schedule("expert_wave", grid, n_sms), build_schedule("interleaved", grid, n_sms)]
        cands += [build_schedule("lag", grid, n_sms, lag=int(round(f * n_sms))) for f in LAG_CANDIDATES]
        cost, remote, hidden, inter, tiles = model
        pred = [predict_kernel_ns(c, remote, cost, hidden, inter, tiles)["total_ns"] for c in cands]
        best = cands[int(np.argmin(pred))]
        return TaskList(name, best.param or best.schedule, best.tasks, grid, checked=True)
    raise ValueError(f"schedule must be one of {SCHEDULES}, got {name!r}")


# ----------------------------------------------------------------------------------------- weights, inputs
def quantize_fp8(t: torch.Tensor, block_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., M, N] -> (e4m3 [..., M, N], fp32 scales [..., M / block_rows, N / 128]): per block_rows x 128 block,
    scale = max(amax, 1e-4) / 448 (as the kernel quantises the intermediate)."""
    *lead, M, N = t.shape
    b = t.float().reshape(*lead, M // block_rows, block_rows, N // FP8_BLOCK, FP8_BLOCK)
    scale = b.abs().amax(dim=(-3, -1)).clamp_min(FP8_AMAX_FLOOR) / FP8_MAX          # [..., M/br, N/128]
    q = (b / scale[..., :, None, :, None]).reshape(t.shape).to(torch.float8_e4m3fn)
    return q, scale


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, block_rows: int) -> torch.Tensor:
    *lead, M, N = q.shape
    b = q.float().reshape(*lead, M // block_rows, block_rows, N // FP8_BLOCK, FP8_BLOCK)
    return (b * scale[..., :, None, :, None]).reshape(q.shape)


def expert_weights(hidden: int, inter: int, expert: int, seed: int, device, dtype: torch.dtype
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert ``expert``'s (w1 [2I, Hd], w2 [Hd, I]) in ``dtype``, seeded per expert (same values on any rank of
    one device type): N(0, 1) / sqrt(fan-in), so activations stay O(1)."""
    g = torch.Generator(device=device).manual_seed(1_000_003 * seed + 31 * expert + 5)
    w1 = torch.randn(2 * inter, hidden, generator=g, device=device).div_(math.sqrt(hidden)).to(dtype)
    w2 = torch.randn(hidden, inter, generator=g, device=device).div_(math.sqrt(inter)).to(dtype)
    return w1, w2


@dataclass
class RankWeights:
    """One rank's experts: w1 [El, 2I, Hd], w2 [El, Hd, I] (activation dtype); fp8 scales w1s, w2s or None;
    ``w1_hi``, ``w2_hi``: the bf16/fp16/fp32 weights the fp8 ones were quantised from (the unfused baseline)."""

    w1: torch.Tensor
    w2: torch.Tensor
    w1s: torch.Tensor | None = None
    w2s: torch.Tensor | None = None
    w1_hi: torch.Tensor | None = None
    w2_hi: torch.Tensor | None = None


def rank_weights(hidden: int, inter: int, experts: int, P: int, rank: int, seed: int, device, dtype: str
                 ) -> RankWeights:
    """Rank ``rank``'s local experts (global ids rank * El ..), generated expert by expert."""
    El = experts // P
    hi = OUT_DTYPES[dtype]
    w1 = torch.empty(El, 2 * inter, hidden, dtype=hi, device=device)
    w2 = torch.empty(El, hidden, inter, dtype=hi, device=device)
    for le in range(El):
        w1[le], w2[le] = expert_weights(hidden, inter, rank * El + le, seed, device, hi)
    if dtype != "fp8":
        return RankWeights(w1, w2)
    q1 = torch.empty(w1.shape, dtype=torch.float8_e4m3fn, device=device)
    q2 = torch.empty(w2.shape, dtype=torch.float8_e4m3fn, device=device)
    s1 = torch.empty(El, 2 * inter // FP8_BLOCK, hidden // FP8_BLOCK, dtype=torch.float32, device=device)
    s2 = torch.empty(El, hidden // FP8_BLOCK, inter // FP8_BLOCK, dtype=torch.float32, device=device)
    for le in range(El):   # expert by expert: a float32 copy of all experts would not fit (DeepSeek-V4-Pro)
        q1[le], s1[le] = quantize_fp8(w1[le], FP8_BLOCK)
        q2[le], s2[le] = quantize_fp8(w2[le], FP8_BLOCK)
    return RankWeights(q1, q2, s1, s2, w1, w2)


def reference_weights(hidden: int, inter: int, seed: int, device, dtype: str) -> Callable:
    """e -> (w1, w2) as the layer computes with them, in float32: the generated weights, or for fp8 their
    dequantised 128x128-block quantisation."""
    def get(e: int):
        w1, w2 = expert_weights(hidden, inter, e, seed, device, OUT_DTYPES[dtype])
        if dtype == "fp8":
            return (dequantize_fp8(*quantize_fp8(w1, FP8_BLOCK), FP8_BLOCK),
                    dequantize_fp8(*quantize_fp8(w2, FP8_BLOCK), FP8_BLOCK))
        return w1.float(), w2.float()
    return get


def rank_tokens(tokens: int, hidden: int, seed: int, rank: int, device, dtype: str) -> torch.Tensor:
    """Rank ``rank``'s layer input x [T, Hd] (bf16 for fp8 layers: the dispatch quantises it)."""
    g = torch.Generator(device=device).manual_seed(1_000_003 * seed + 104_729 * (rank + 1) + 3)
    return torch.randn(tokens, hidden, generator=g, device=device).to(OUT_DTYPES[dtype])


# ------------------------------------------------------------------------------------------------ reference
def moe_reference(x: torch.Tensor, ids: torch.Tensor, wts: torch.Tensor, weights: Callable,
                  dtype: torch.dtype = torch.float32, fp8: bool = False) -> torch.Tensor:
    """One rank's combine buffer [K, T, Hd] computed with torch: row (slot, token) = expert ids[token, slot]'s
    (silu(x W_g^T) * (x W_u^T) * weight) W2^T. x [T, Hd], ids / wts [T, K], ``weights(e)`` -> (w1 [2I, Hd],
    w2 [Hd, I]).

    ``dtype=float32`` (TF32 off): the reference. ``dtype`` = the layer's fp16/bf16: PyTorch's own error at that
    dtype (each op rounds to it), which the kernel may exceed by at most 2x. ``fp8``: x is quantised 1x128 and
    the intermediate too (as the kernel does), both dequantised, and the math is float32: the kernel's own
    quantisation, emulated."""
    T, K = ids.shape
    Hd = x.shape[1]
    if fp8:
        x = dequantize_fp8(*quantize_fp8(x, 1), 1)
    out = torch.full((K, T, Hd), float("nan"), dtype=dtype, device=x.device)
    flat = ids.flatten().to(x.device)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for e in torch.unique(flat).tolist():
            items = (flat == e).nonzero().flatten()
            tok, slot = items // K, items % K
            w1, w2 = (w.to(dtype) for w in weights(e))
            I = w2.shape[1]
            gu = x[tok].to(dtype) @ w1.T                                        # [n, 2I]
            h = torch.nn.functional.silu(gu[:, :I]) * gu[:, I:] * wts.to(x.device)[tok, slot].to(dtype)[:, None]
            if fp8:
                h = dequantize_fp8(*quantize_fp8(h, 1), 1)
            out[slot, tok] = h @ w2.T                                           # [n, Hd]
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return out


def topk_reduce(combine: torch.Tensor) -> torch.Tensor:
    """[K, T, Hd] -> [T, Hd]: the sum over top-k slots in float32, rounded to the buffer's dtype once."""
    return combine.float().sum(0).to(combine.dtype)


def check_close(out: torch.Tensor, ref: torch.Tensor, torch_out: torch.Tensor | None, dtype: str, what: str
                ) -> tuple[float, float]:
    """No NaN (every element written); relative L2 error to the float32 reference at most 2x PyTorch's own
    at that dtype plus a floor (fp8: at most FP8_REL_L2 against the emulated quantisation)."""
    nan = int(torch.isnan(out).sum())
    if nan:
        bad = torch.isnan(out).nonzero()[0].tolist()
        raise AssertionError(f"{what}: {nan} of {out.numel()} elements are NaN (never written); first at "
                             f"[slot, token, col] = {bad}")
    err = rel_l2(out, ref)
    if dtype == "fp8":
        if not err <= FP8_REL_L2:
            raise AssertionError(f"{what}: relative L2 error {err:.3g} to the fp8 emulation > {FP8_REL_L2}")
        return err, float("nan")
    err_pt = rel_l2(torch_out, ref)
    if not err <= 2 * err_pt + REL_L2_FLOOR[dtype]:
        raise AssertionError(f"{what}: relative L2 error {err:.3g} > 2 x PyTorch's {err_pt:.3g} "
                             f"+ {REL_L2_FLOOR[dtype]:g}")
    return err, err_pt


# --------------------------------------------------------------------------------------------------- buffers
@dataclass
class MoEBuffers:
    """Symmetric buffers of the layer (receive rows / scales / meta, combine, barrier flags) with their peer-
    pointer tables on each local rank's device, and each rank's local intermediate and dependency counters."""

    world_size: int
    cap_rows: int
    tokens: int
    hidden: int
    inter: int
    topk: int
    dtype: str
    recv_x: object                                  # SymmTensor [cap * Hd] (uint8 storage for fp8)
    recv_xs: object | None                          # SymmTensor fp32 [cap * Hd/128] (fp8)
    recv_meta: object                               # SymmTensor int32 [cap * 4]
    combine: object                                 # SymmTensor [K * T * Hd] output dtype
    flags: object                                   # SymmTensor int32 [P]
    tables: dict[int, dict[str, torch.Tensor]]      # rank -> name -> int64 [P] addresses
    h: dict[int, torch.Tensor]                      # rank -> [cap, I] intermediate
    hs: dict[int, torch.Tensor | None]              # rank -> fp32 [cap, I/128] (fp8)
    counters: dict[int, torch.Tensor]               # rank -> int32 [cap blocks]
    status: dict[int, torch.Tensor]                 # rank -> int64 [P, 6] barrier waits
    launches: dict[int, int]                        # rank -> experts-kernel launches since the counters were zeroed
    n1: dict[int, tuple]                            # rank -> (Linear-1 column blocks, row blocks) of those launches
    epoch: int = 0
    tickets: dict[int, torch.Tensor] = field(default_factory=dict)   # rank -> int32 [1] (dynamic assignment)
    drawn: dict[int, int] = field(default_factory=dict)              # rank -> tickets drawn since they were zeroed

    def x_view(self, rank: int) -> torch.Tensor:
        t = self.recv_x.local(rank)
        return (t.view(torch.float8_e4m3fn) if self.dtype == "fp8" else t).view(self.cap_rows, self.hidden)

    def xs_view(self, rank: int) -> torch.Tensor | None:
        return None if self.recv_xs is None else self.recv_xs.local(rank).view(self.cap_rows, -1)

    def meta_view(self, rank: int) -> torch.Tensor:
        return self.recv_meta.local(rank).view(self.cap_rows, META_FIELDS)

    def combine_view(self, rank: int, tokens: int | None = None) -> torch.Tensor:
        """Rank ``rank``'s combine buffer [K, T, Hd] for a layer of ``tokens`` (<= capacity) tokens."""
        T = self.tokens if tokens is None else tokens
        return self.combine.local(rank)[: self.topk * T * self.hidden].view(self.topk, T, self.hidden)

    def reset_counters(self, rank: int) -> None:
        self.counters[rank].zero_()
        if rank in self.tickets:
            self.tickets[rank].zero_()
        self.drawn[rank] = 0
        self.launches[rank] = 0


def moe_buffers(world, cap_rows: int, tokens: int, hidden: int, inter: int, topk: int, experts_local: int,
                dtype: str | None = None, min_block_m: int = 16) -> MoEBuffers:
    """Allocate (collectively, on GPUs) the layer's buffers for up to ``cap_rows`` received rows per rank,
    ``tokens`` tokens per rank and row blocks of >= ``min_block_m`` rows; flags and counters zeroed."""
    P = world.world_size
    dtype = dtype or default_dtype()
    validate_dtype(dtype)
    if cap_rows < 1 or tokens < 1:
        raise ValueError(f"cap_rows and tokens must be >= 1, got {cap_rows}, {tokens}")
    fp8 = dtype == "fp8"
    act = torch.uint8 if fp8 else ACT_DTYPES[dtype]
    recv_x = world.symmetric_empty(cap_rows * hidden, act)
    recv_xs = world.symmetric_empty(cap_rows * (hidden // FP8_BLOCK), torch.float32) if fp8 else None
    recv_meta = world.symmetric_empty(cap_rows * META_FIELDS, torch.int32)   # zeroed below: a kernel that reads
    #   rows no dispatch wrote yet (a compile run without the barrier) still finds valid ranks and tokens
    combine = world.symmetric_empty(topk * tokens * hidden, OUT_DTYPES[dtype])
    flags = world.symmetric_empty(P, torch.int32)
    tables, h, hs, counters, status = {}, {}, {}, {}, {}
    n_blocks = cap_rows // min_block_m + experts_local   # sum over experts of ceil(rows / BM)
    for r in world.local_ranks:
        dev = world.device(r)
        flags.local(r).zero_()
        recv_meta.local(r).zero_()
        t = {"x": recv_x.ptrs, "meta": recv_meta.ptrs, "combine": combine.ptrs, "flags": flags.ptrs,
             "combine_local": [combine.ptrs[r]] * P, "xs": recv_xs.ptrs if fp8 else [0] * P}
        tables[r] = {k: torch.tensor(v, dtype=torch.int64, device=dev) for k, v in t.items()}
        h[r] = torch.empty(cap_rows, inter, dtype=act, device=dev)
        if fp8:
            h[r] = h[r].view(torch.float8_e4m3fn)
        hs[r] = torch.empty(cap_rows, inter // FP8_BLOCK, dtype=torch.float32, device=dev) if fp8 else None
        counters[r] = torch.zeros(n_blocks, dtype=torch.int32, device=dev)
        status[r] = torch.zeros(P, STATUS_FIELDS, dtype=torch.int64, device=dev)
    bufs = MoEBuffers(P, cap_rows, tokens, hidden, inter, topk, dtype, recv_x, recv_xs, recv_meta, combine, flags,
                      tables, h, hs, counters, status, {r: 0 for r in world.local_ranks},
                      {r: (0, 0) for r in world.local_ranks},
                      tickets={r: torch.zeros(1, dtype=torch.int32, device=world.device(r)) for r in world.local_ranks},
                      drawn={r: 0 for r in world.local_ranks})
    world.barrier()  # every rank's flags are zero before anyone signals
    return bufs


# ------------------------------------------------------------------------------------------------- launchers
@dataclass
class RankInputs:
    """One rank's layer inputs: tokens x [T, Hd] (output dtype; bf16 for fp8), routing ids / weights [T, K],
    its experts' weights and its layout."""

    x: torch.Tensor
    ids: torch.Tensor
    wts: torch.Tensor
    weights: RankWeights
    layout: RankLayout
    _dev: dict = field(default_factory=dict, repr=False)

    def routing_on(self, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(dest int32 [T*K, 2], router weight bits int32 [T*K], expert offsets int32 [El + 1]) on ``device``."""
        device = torch.device(device)
        if device not in self._dev:
            self._dev[device] = (self.layout.dest.to(device).contiguous(),
                                 self.wts.float().contiguous().view(torch.int32).flatten().to(device),
                                 self.layout.offsets.to(device))
        return self._dev[device]


def _pow2_divisor(n: int, cap: int) -> int:
    b = 1
    while b * 2 <= cap and n % (b * 2) == 0:
        b *= 2
    return b


def _validate_layer(world, bufs: MoEBuffers, inputs: Mapping[int, RankInputs], tiles: TileConfig) -> None:
    P = world.world_size
    if bufs.world_size != P:
        raise ValueError(f"buffers are for {bufs.world_size} ranks, the world has {P}")
    for r in world.local_ranks:
        if r not in inputs:
            raise ValueError(f"no inputs for local rank {r}")
        inp = inputs[r]
        T, Hd = inp.x.shape
        K = inp.ids.shape[1]
        E = inp.layout.experts
        validate_problem(Hd, bufs.inter, E, K, T, P, tiles, bufs.dtype)
        El = E // P
        if (Hd, K) != (bufs.hidden, bufs.topk) or T > bufs.tokens:
            raise ValueError(f"rank {r}: layer [T={T}, Hd={Hd}, K={K}] does not fit buffers for T <= {bufs.tokens}, "
                             f"Hd = {bufs.hidden}, K = {bufs.topk}")
        if inp.x.dtype != OUT_DTYPES[bufs.dtype] or inp.x.device != world.device(r) or not inp.x.is_contiguous():
            raise ValueError(f"rank {r}: x must be contiguous {OUT_DTYPES[bufs.dtype]} on {world.device(r)}, got "
                             f"{inp.x.dtype} on {inp.x.device}")
        if inp.ids.shape != (T, K) or inp.wts.shape != (T, K):
            raise ValueError(f"rank {r}: ids and weights must be [T, K] = {[T, K]}")
        w = inp.weights
        want = ACT_DTYPES[bufs.dtype]
        if w.w1.shape != (El, 2 * bufs.inter, Hd) or w.w2.shape != (El, Hd, bufs.inter):
            raise ValueError(f"rank {r}: w1 must be [El, 2I, Hd] = {[El, 2 * bufs.inter, Hd]} and w2 [El, Hd, I], got "
                             f"{list(w.w1.shape)}, {list(w.w2.shape)}")
        if w.w1.dtype != want or w.w2.dtype != want or not (w.w1.is_contiguous() and w.w2.is_contiguous()):
            raise ValueError(f"rank {r}: weights must be contiguous {want}, got {w.w1.dtype}, {w.w2.dtype}")
        if bufs.dtype == "fp8" and (w.w1s is None or w.w2s is None):
            raise ValueError(f"rank {r}: fp8 weights need their scales w1s, w2s")
        if inp.layout.rows > bufs.cap_rows:
            raise ValueError(f"rank {r} receives {inp.layout.rows} rows, the buffers hold {bufs.cap_rows}")
        if inp.layout.world_size != P or inp.layout.rank != r:
            raise ValueError(f"rank {r}: layout is for rank {inp.layout.rank} of {inp.layout.world_size}")


def dispatch(world, bufs: MoEBuffers, inputs: Mapping[int, RankInputs], barrier: bool = True, check: bool = True,
             max_polls: int = MAX_POLLS) -> None:
    """Push every local rank's items into the owners' receive buffers (fp8: quantise x 1x128 first), then the
    dispatch barrier. Emulated ranks: every rank pushes, then the barrier's signals, then its waits."""
    fp8 = bufs.dtype == "fp8"
    for r in world.local_ranks:
        inp = inputs[r]
        T, Hd = inp.x.shape
        K = inp.ids.shape[1]
        x, xs = quantize_fp8(inp.x, 1) if fp8 else (inp.x, inp.x)
        raw = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[x.element_size()]
        dest, wbits, _ = inp.routing_on(world.device(r))
        n_items = T * K
        block_r = 16
        tab = bufs.tables[r]
        dispatch_push_kernel[(-(-n_items // block_r),)](
            x.view(raw), xs, dest, wbits, tab["x"], tab["xs"], tab["meta"], r, n_items, K, Hd,
            BLOCK_R=block_r, BLOCK_H=_pow2_divisor(Hd, 512), SCALE_COLS=triton_next_pow2(max(Hd // FP8_BLOCK, 1)),
            FP8=fp8, num_warps=4)
    if barrier:
        moe_barrier(world, bufs, "dispatch", check=check, max_polls=max_polls)


def triton_next_pow2(n: int) -> int:
    return 1 << (max(n, 1) - 1).bit_length()


def _validate_experts(world, bufs: MoEBuffers, inputs, tasks, tiles: TileConfig, n_programs, max_polls, ts,
                      validate: bool) -> list[tuple[int, int]]:
    """Everything ``run_experts`` checks before launching; returns [(rank, programs)]."""
    if max_polls < 1:
        raise ValueError(f"max_polls must be >= 1, got {max_polls}")
    launches = []
    for r in world.local_ranks:
        tl_ = tasks[r]
        if validate and not tl_.checked:   # (host time: never inside a timed loop for a built list)
            check_tasks(tl_.tasks, tl_.grid)
            tl_.checked = True
        grid = tl_.grid
        if grid.block_m != tiles.block_m or grid.n1 != bufs.inter // tiles.block_n1 or \
                grid.n2 != bufs.hidden // tiles.block_n2:
            raise ValueError(f"rank {r}: task list was built for other tiles than {tiles}")
        if grid.n_pool > bufs.counters[r].numel():
            raise ValueError(f"rank {r}: {grid.n_pool} row blocks exceed the {bufs.counters[r].numel()} counters")
        if tuple(grid.expert_rows) != tuple(inputs[r].layout.expert_rows):
            raise ValueError(f"rank {r}: task list was built for another routing layout")
        n = tl_.n_tasks
        if env.interpreted():
            n_prog = n if n_programs is None else n_programs
            if n_prog != 1 and n_prog < n:
                raise ValueError(f"under the interpreter programs run in order: n_programs must be 1 or >= the "
                                 f"{n} tasks, got {n_prog}")
        else:
            sms = torch.cuda.get_device_properties(world.device(r)).multi_processor_count
            n_prog = min(sms, n) if n_programs is None else n_programs
            if not 1 <= n_prog <= sms:
                raise ValueError(f"n_programs must be in [1, {sms}] (all resident, or a wait could deadlock)")
        if ts is not None and (ts[r].dtype != torch.int64 or ts[r].numel() < 2 * n):
            raise ValueError(f"ts[{r}] must be int64 with >= {2 * n} elements ([n_tasks, 2])")
        launches.append((r, max(n_prog, 1)))
    return launches


def run_experts(world, bufs: MoEBuffers, inputs: Mapping[int, RankInputs], tasks: Mapping[int, TaskList],
                tiles: TileConfig, n_programs: int | None = None, barrier: bool = True, check: bool = True,
                max_polls: int = MAX_POLLS, local_combine: bool = False,
                ts: Mapping[int, torch.Tensor] | None = None, validate: bool = True, dynamic: bool = False) -> None:
    """Launch the persistent experts kernel on every local rank (its task list), then the combine barrier.

    ``n_programs``: GPU default = SMs (all resident); under the interpreter one program per task (or 1).
    ``check``: read every wait's status (a host sync) and raise RuntimeError naming rank, expert and tile of a
    timed-out dependency; then the barrier's. ``local_combine``: every combine store goes to this rank's own
    buffer (the compute-only control; its output is meaningless). ``validate=False`` skips ``check_tasks``
    (tests that plant a missing dependency). ``dynamic``: programs claim the list's tasks in order through an
    atomic ticket instead of the static task i -> program i % n_programs (same tiles, same bits)."""
    launches = _validate_experts(world, bufs, inputs, tasks, tiles, n_programs, max_polls, ts, validate)
    fp8 = bufs.dtype == "fp8"
    for r, n_prog in launches:
        tl_ = tasks[r]
        n1 = bufs.inter // tiles.block_n1
        # expected = launches * n1 holds only while every launch covers the same row blocks (each launch's list
        # holds every tile of its grid: row blocks 0 .. n_pool - 1): a new grid shape starts the count afresh
        if bufs.n1[r] != (n1, tl_.grid.n_pool):
            bufs.reset_counters(r)
            bufs.n1[r] = (n1, tl_.grid.n_pool)
        bufs.launches[r] += 1
        expected = bufs.launches[r] * n1
        if expected > INT32_MAX:
            bufs.reset_counters(r)
            bufs.launches[r] = 1
            expected = n1
        if bufs.drawn.get(r, 0) + tl_.n_tasks + n_prog > INT32_MAX:
            bufs.reset_counters(r)
            bufs.launches[r] = 1
            expected = n1
        ticket_base = bufs.drawn.get(r, 0)
        if dynamic:
            bufs.drawn[r] = ticket_base + tl_.n_tasks + n_prog          # every program draws once past the list
        task_t, status = tl_.on(world.device(r))
        inp = inputs[r]
        w = inp.weights
        offs = inp.routing_on(world.device(r))[2]
        x = bufs.x_view(r)
        comb = bufs.combine_view(r, inp.x.shape[0])
        table = bufs.tables[r]["combine_local" if local_combine else "combine"]
        timed = ts is not None
        megamoe_kernel[(n_prog,)](
            x, bufs.xs_view(r) if fp8 else x, w.w1, w.w1s if fp8 else w.w1, w.w2, w.w2s if fp8 else w.w2,
            bufs.h[r], bufs.hs[r] if fp8 else bufs.h[r], bufs.meta_view(r), offs, task_t, bufs.counters[r], table,
            comb, status, ts[r] if timed else status, bufs.tickets[r], tl_.n_tasks, r, inp.x.shape[0], bufs.hidden,
            bufs.inter, expected, max_polls, ticket_base,
            BLOCK_M=tiles.block_m, BLOCK_N1=tiles.block_n1, BLOCK_N2=tiles.block_n2, BLOCK_K=tiles.block_k,
            FP8=fp8, TIMED=timed, DEVICE=not env.interpreted(), DYNAMIC=dynamic, num_warps=tiles.num_warps,
            num_stages=tiles.num_stages)
    if check:
        for r, _ in launches:
            try:
                check_task_status(tasks[r], r, inputs[r].layout, bufs.inter // tiles.block_n1, world.device(r))
            except RuntimeError:
                bufs.reset_counters(r)   # a failed launch leaves the counters out of step with the epoch
                raise
    if barrier:
        moe_barrier(world, bufs, "combine", check=check, max_polls=max_polls)


def check_task_status(tl_: TaskList, rank: int, layout: RankLayout, n1: int, device) -> None:
    """Raise RuntimeError naming rank, expert and tile of the first Linear-2 task whose wait timed out."""
    st = tl_.on(device)[1].cpu()
    bad = torch.nonzero(st[:, 5]).flatten()
    if bad.numel():
        waiter, task, expected, seen, polls, _ = (int(v) for v in st[int(bad[0])])
        kind, e, rb, cb, pool = (int(v) for v in tl_.tasks[task])
        base = expected - n1
        El = layout.experts_local
        raise RuntimeError(
            f"MegaMoE: rank {waiter} timed out in Linear-2 task {task} of schedule {tl_.schedule} (expert "
            f"{rank * El + e} = local {e}, row block {rb}, column block {cb}): it waited for all {n1} Linear-1 "
            f"tiles of row block {pool} and saw {seen - base} (counter {seen}, expected {expected}) after {polls} "
            f"polls; {bad.numel()} Linear-2 task(s) timed out: a missing or late Linear-1 producer")


def moe_barrier(world, bufs: MoEBuffers, phase: str, check: bool = True, max_polls: int = MAX_POLLS,
                silent_ranks: Sequence[int] = ()) -> None:
    """Every rank releases the next epoch into every peer's flags (after a system-scope fence) and waits
    (bounded) for all peers' (xstage.ranks.epoch_barrier)."""
    bufs.epoch += 1
    epoch_barrier(world, {r: bufs.tables[r]["flags"] for r in world.local_ranks}, bufs.flags, bufs.status,
                  bufs.epoch, f"MegaMoE {phase} barrier", max_polls, check, silent_ranks)


def megamoe_layer(world, bufs: MoEBuffers, inputs: Mapping[int, RankInputs], tasks: Mapping[int, TaskList],
                  tiles: TileConfig, check: bool = True, max_polls: int = MAX_POLLS,
                  n_programs: int | None = None, dynamic: bool = False) -> dict[int, torch.Tensor]:
    """The whole fused layer on every local rank: dispatch + barrier, experts kernel + barrier, top-k reduction.
    Returns {rank: out [T, Hd]}; the combine buffers stay in ``bufs`` (``combine_view``)."""
    _validate_layer(world, bufs, inputs, tiles)
    _validate_experts(world, bufs, inputs, tasks, tiles, n_programs, max_polls, None, True)
    dispatch(world, bufs, inputs, check=check, max_polls=max_polls)
    run_experts(world, bufs, inputs, tasks, tiles, n_programs=n_programs, check=check, max_polls=max_polls,
                dynamic=dynamic)
    return {r: topk_reduce(bufs.combine_view(r, inputs[r].x.shape[0])) for r in world.local_ranks}


# ------------------------------------------------------------------------------------------ problem set-up
@dataclass
class Problem:
    """One case on one world: every rank's routing and layout (all ranks), the local ranks' inputs, tiles."""

    case: MoECase
    dtype: str
    tiles: TileConfig
    ids: list[torch.Tensor]
    wts: list[torch.Tensor]
    layouts: list[RankLayout]
    inputs: dict[int, RankInputs]

    @property
    def cap_rows(self) -> int:
        return max(lay.rows for lay in self.layouts)

    def grid(self, rank: int) -> TileGrid:
        s = self.case.shape
        return TileGrid.of(self.layouts[rank], s.hidden, s.intermediate, self.tiles)


def routing_of(case: MoECase, P: int) -> tuple[list, list, list[RankLayout]]:
    """Every rank's (ids, weights) and layout for ``case`` on P ranks."""
    s = case.shape
    rw = [route(case.tokens, s.experts, s.topk, case.routing, case.seed, r) for r in range(P)]
    ids, wts = [a for a, _ in rw], [b for _, b in rw]
    return ids, wts, build_layouts(ids, s.experts)


def make_problem(world, case: MoECase, dtype: str, tiles: TileConfig | None = None, weight_seed: int = 0,
                 weights: Mapping[int, RankWeights] | None = None) -> Problem:
    """Routing, layouts and inputs of ``case`` for every local rank (weights generated unless given)."""
    P = world.world_size
    s = case.shape
    ids, wts, layouts = routing_of(case, P)
    if tiles is None:
        tiles = default_tiles(dtype, case.tokens * P * s.topk / s.experts)
    validate_problem(s.hidden, s.intermediate, s.experts, s.topk, case.tokens, P, tiles, dtype)
    inputs = {}
    for r in world.local_ranks:
        dev = world.device(r)
        w = weights[r] if weights is not None else rank_weights(s.hidden, s.intermediate, s.experts, P, r,
                                                                 weight_seed, dev, dtype)
        inputs[r] = RankInputs(rank_tokens(case.tokens, s.hidden, case.seed, r, dev, dtype), ids[r], wts[r], w,
                               layouts[r])
    return Problem(case, dtype, tiles, ids, wts, layouts, inputs)


def build_tasks(problem: Problem, schedule: str, n_sms: int, rank: int, cost: CostModel | None = None,
                lag: int | None = None) -> TaskList:
    """One rank's task list of ``schedule`` (model_guided: with ``cost``, else a default rate)."""
    s = problem.case.shape
    grid = problem.grid(rank)
    model = None
    if schedule == "model_guided":
        cost = cost or CostModel.from_tflops(BurstGapParams.reference(), 500.0, n_sms,
                                             OUT_DTYPES[problem.dtype].itemsize)
        model = (cost, grid.remote_rows_per_block(problem.layouts[rank]), s.hidden, s.intermediate, problem.tiles)
    return build_schedule(schedule, grid, n_sms, lag=lag, model=model)


# ------------------------------------------------------------------------------------ unfused baseline (GPU)
_GROUPED_MM_WARNED = [False]


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, offs_list: Sequence[int]) -> torch.Tensor:
    """a [M, K] @ b [G, K, N] with row groups ending at ``offs`` (int32 cumulative; torch._grouped_mm, bf16 on
    sm_90 in torch 2.11). Without it (older torch, or a dtype it rejects) a per-group loop, said once on stderr."""
    fn = getattr(torch, "_grouped_mm", None)
    if fn is not None:
        try:
            return fn(a, b, offs=offs)
        except (RuntimeError, NotImplementedError) as e:
            why = f"torch._grouped_mm failed ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
    else:
        why = f"torch {torch.__version__} has no torch._grouped_mm"
    if not _GROUPED_MM_WARNED[0]:
        print(f"megamoe: {why}; the unfused baseline uses a per-expert matmul loop", file=sys.stderr)
        _GROUPED_MM_WARNED[0] = True
    out = torch.empty(a.shape[0], b.shape[2], dtype=a.dtype, device=a.device)
    start = 0
    for g, end in enumerate(offs_list):
        if end > start:
            out[start:end] = a[start:end] @ b[g]
        start = end
    return out


def make_unfused(world, inp: RankInputs, weights_hi: tuple[torch.Tensor, torch.Tensor]) -> Callable[[], torch.Tensor]:
    """The unfused layer on this rank (one process per rank): all_to_all_single dispatch (rows sorted by owner
    and expert), relayout to expert-major, grouped GEMM Linear-1, SwiGLU, grouped GEMM Linear-2, relayout back,
    all_to_all_single combine, and the router-weighted top-k sum. Index plans are built here, outside the
    returned fn(). ``weights_hi``: (w1 [El, 2I, Hd], w2 [El, Hd, I]) in bf16 (fp16/fp32 on CPU)."""
    lay = inp.layout
    r, P, El = lay.rank, lay.world_size, lay.experts_local
    T, Hd = inp.x.shape
    K = inp.ids.shape[1]
    dev = inp.x.device
    w1, w2 = weights_hi
    I = w2.shape[2]
    counts = lay.counts                                                   # [P, E]
    flat = inp.ids.flatten().cpu()
    order = torch.argsort(flat, stable=True)                               # send order: by expert (owner-major)
    send_counts = counts[r].view(P, El).sum(1).tolist()
    recv_counts = counts[:, r * El:(r + 1) * El].sum(1).tolist()
    # received rows: source-major, then local expert, then the source's item order -> expert-major (fused layout)
    recv_start = [0, *itertools.accumulate(recv_counts)]
    mine = counts[:, r * El:(r + 1) * El]                                  # [P, El]
    src_expert_start = mine.cumsum(1) - mine                               # within each source's block
    to_fused = torch.cat([torch.arange(int(mine[s, le])) + recv_start[s] + int(src_expert_start[s, le])
                          for le in range(El) for s in range(P)]) if lay.rows else torch.zeros(0, dtype=torch.long)
    to_recv = torch.empty_like(to_fused)
    to_recv[to_fused] = torch.arange(to_fused.numel())
    tok = (order // K).to(dev)
    comb_idx = ((order % K) * T + order // K).to(dev)                      # send position -> slot * T + token
    to_fused, to_recv = to_fused.to(dev), to_recv.to(dev)
    offs_list = list(itertools.accumulate(lay.expert_rows))
    offs = torch.tensor(offs_list, dtype=torch.int32, device=dev)
    wk = inp.wts.to(dev).T.contiguous()[..., None].float()                 # [K, T, 1]
    recv = torch.empty(lay.rows, Hd, dtype=inp.x.dtype, device=dev)
    ret = torch.empty(T * K, Hd, dtype=inp.x.dtype, device=dev)
    comb = torch.empty(K * T, Hd, dtype=inp.x.dtype, device=dev)
    w1t, w2t = w1.transpose(1, 2), w2.transpose(1, 2)                     # [El, Hd, 2I], [El, I, Hd] (views)
    dist = world.dist

    def run() -> torch.Tensor:
        send = inp.x.index_select(0, tok)
        dist.all_to_all_single(recv, send, recv_counts, send_counts)
        xe = recv.index_select(0, to_fused)
        gu = grouped_mm(xe, w1t, offs, offs_list)                          # [R, 2I]
        h = torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]
        y = grouped_mm(h, w2t, offs, offs_list)                            # [R, Hd]
        dist.all_to_all_single(ret, y.index_select(0, to_recv), send_counts, recv_counts)
        comb.index_copy_(0, comb_idx, ret)
        return (comb.view(K, T, Hd).float() * wk).sum(0).to(inp.x.dtype)

    xg = torch.randn(lay.rows, Hd, device=dev).to(inp.x.dtype)           # the GEMM phases alone, on this rank's
    #                                                                       rows (expert-major), no communication

    def gemm() -> torch.Tensor:
        gu = grouped_mm(xg, w1t, offs, offs_list)
        return grouped_mm(torch.nn.functional.silu(gu[:, :I]) * gu[:, I:], w2t, offs, offs_list)
    run.gemm = gemm
    return run


# ------------------------------------------------------------------------------------------- correctness job
def _agree(world, check: Callable[[], None]) -> None:
    """Run a rank-local check; on GPUs every rank learns every rank's failure and all raise together (a rank
    that raised alone would leave its peer waiting in the next collective)."""
    if world.emulated:
        check()
        return
    try:
        check()
        msg = None
    except (AssertionError, RuntimeError) as e:
        msg = f"rank {world.local_ranks[0]}: {type(e).__name__}: {e}"
    msgs = [None] * world.world_size
    world.dist.all_gather_object(msgs, msg)
    bad = [m for m in msgs if m]
    if bad:
        raise AssertionError("; ".join(bad))


def _poison(world, bufs: MoEBuffers, tokens: int) -> None:
    for r in world.local_ranks:
        bufs.combine_view(r, tokens).fill_(float("nan"))
    world.barrier()


def check_job(world, cases: Sequence, seed: int, dtype: str | None = None, tiles: TileConfig | None = None,
              schedules: Sequence[str] = SCHEDULES, n_sms: int | None = None, max_polls: int = MAX_POLLS,
              n_programs: int | None = None, assignments: Sequence[str] = ("static",)) -> list[dict]:
    """For each case (an MoECase or (hidden, intermediate, experts, topk, tokens, routing)): poison every combine
    buffer with NaN, run the whole fused layer with each schedule, and require (1) the first schedule's combine
    buffer [K, T, Hd] (every element: no NaN) within 2x PyTorch's own error of the float32 reference (fp8:
    within FP8_REL_L2 of the float32 emulation of its quantisation); (2) every other schedule's combine buffer
    bit-identical to it; (3) on GPUs, the unfused baseline close to the fused output. ``assignments``: each
    schedule runs with each of them (``static``: task i on program i % n; ``dynamic``: atomic ticket), all
    bit-identical. Runs on every rank (GPU) or once for an emulated world. Returns one dict per (case, local
    rank)."""
    P = world.world_size
    dtype = dtype or default_dtype()
    validate_dtype(dtype)
    cases = [as_case(c, seed + i) for i, c in enumerate(cases)]
    bad = [s for s in schedules if s not in SCHEDULES]
    if bad or not schedules:
        raise ValueError(f"schedules must be a non-empty subset of {SCHEDULES}, got {list(schedules)}")
    if not assignments or any(a not in ASSIGNMENTS for a in assignments):
        raise ValueError(f"assignments must be a non-empty subset of {ASSIGNMENTS}, got {list(assignments)}")
    runs = [(sched, a) for sched in schedules for a in assignments]
    probs = []
    for c in cases:
        s = c.shape
        t = tiles or default_tiles(dtype, c.tokens * P * s.topk / s.experts)
        validate_problem(s.hidden, s.intermediate, s.experts, s.topk, c.tokens, P, t, dtype)
        probs.append((c, t))
    dev0 = world.device(world.local_ranks[0])
    sms = n_sms or (2 if env.interpreted() else torch.cuda.get_device_properties(dev0).multi_processor_count)
    results = []
    for c, t in probs:
        s = c.shape
        prob = make_problem(world, c, dtype, t, weight_seed=seed)
        bufs = moe_buffers(world, max(prob.cap_rows, 1), c.tokens, s.hidden, s.intermediate, s.topk,
                           s.experts // P, dtype, min_block_m=t.block_m)
        first, errs = {}, {}
        for sched, assign in runs:
            lead = (sched, assign) == runs[0]
            dyn = assign == "dynamic"
            tasks = {r: build_tasks(prob, sched, sms, r) for r in world.local_ranks}
            if not world.emulated and (lead or dyn):   # compile before any barrier waits on a peer
                dispatch(world, bufs, prob.inputs, barrier=False)
                run_experts(world, bufs, prob.inputs, tasks, t, barrier=False, check=False, n_programs=n_programs,
                            dynamic=dyn)
                world.barrier()
            _poison(world, bufs, c.tokens)
            outs = megamoe_layer(world, bufs, prob.inputs, tasks, t, max_polls=max_polls, n_programs=n_programs,
                                 dynamic=dyn)
            world.barrier()
            if lead and not world.emulated:   # collective: every rank, before any check
                r = world.local_ranks[0]
                w = prob.inputs[r].weights
                unf = make_unfused(world, prob.inputs[r], (w.w1_hi if dtype == "fp8" else w.w1,
                                                          w.w2_hi if dtype == "fp8" else w.w2))()

            def check():
                for r in world.local_ranks:
                    comb = bufs.combine_view(r, c.tokens)
                    what = f"{c.name} (seed {c.seed}, weights {seed}) {dtype} P={P} rank {r} {sched} {assign}"
                    if not lead:
                        check_bit_identical(comb, first[r], f"{what} vs {' '.join(runs[0])}")
                        continue
                    inp = prob.inputs[r]
                    ref_w = reference_weights(s.hidden, s.intermediate, seed, world.device(r), dtype)
                    ref = moe_reference(inp.x, inp.ids, inp.wts, ref_w, fp8=dtype == "fp8")
                    pt = None if dtype == "fp8" else moe_reference(inp.x, inp.ids, inp.wts, ref_w,
                                                                   dtype=OUT_DTYPES[dtype])
                    errs[r] = check_close(comb, ref, pt, dtype, what)
                    first[r] = comb.clone()
                    if not world.emulated:
                        e_unf = rel_l2(unf, outs[r])
                        if not e_unf <= UNFUSED_REL_L2[dtype]:
                            raise AssertionError(f"{what}: the unfused baseline differs from the fused layer by "
                                                 f"{e_unf:.3g} (relative L2)")
            _agree(world, check)
            world.barrier()
        for r in world.local_ranks:
            lay = prob.layouts[r]
            results.append(dict(case=c.name, dtype=dtype, P=P, rank=r, rows=lay.rows, remote_rows=lay.remote_rows,
                                rel_l2=errs[r][0], rel_l2_torch=errs[r][1], schedules=len(schedules),
                                runs=len(runs)))
        del prob, bufs, first
        if not world.emulated:
            torch.cuda.empty_cache()
    return results


def missing_dependency_job(world, rank: int = 0, max_polls: int = 1000, seed: int = 0,
                           case=(256, 256, 4, 2, 64, "uniform"), dtype: str | None = None) -> None:
    """A planted missing dependency: rank ``rank``'s task list loses one Linear-1 tile; its Linear-2 tiles'
    waits must time out and the host must raise a RuntimeError naming rank, expert and tile (checked here)."""
    P = world.world_size
    dtype = dtype or default_dtype()
    c = as_case(case, seed)
    prob = make_problem(world, c, dtype, weight_seed=seed)
    s = c.shape
    bufs = moe_buffers(world, max(prob.cap_rows, 1), c.tokens, s.hidden, s.intermediate, s.topk, s.experts // P,
                       dtype, min_block_m=prob.tiles.block_m)
    sms = 2 if env.interpreted() else torch.cuda.get_device_properties(world.device(world.local_ranks[0])
                                                                        ).multi_processor_count
    tasks = {r: build_tasks(prob, "expert_wave", sms, r) for r in world.local_ranks}
    dispatch(world, bufs, prob.inputs, check=False)
    if not world.emulated:  # compile first, so that the timed-out waits are the planted ones only
        run_experts(world, bufs, prob.inputs, tasks, prob.tiles, barrier=False)
        world.barrier()
    if rank not in world.local_ranks:           # a GPU rank other than the planted one runs normally
        run_experts(world, bufs, prob.inputs, tasks, prob.tiles, barrier=False, max_polls=max_polls)
        world.barrier()
        return
    t = tasks[rank].tasks
    victim = int(np.nonzero(t[:, 0] == KIND_L1)[0][0])                   # the first Linear-1 tile goes missing
    e, rb = int(t[victim, 1]), int(t[victim, 2])
    tasks[rank] = TaskList("planted", "", np.delete(t, victim, axis=0), tasks[rank].grid)
    El = s.experts // P
    try:
        run_experts(world, bufs, prob.inputs, tasks, prob.tiles, barrier=False, max_polls=max_polls, validate=False)
    except RuntimeError as err:
        where = f"rank {rank} timed out in Linear-2 task"
        tile = f"(expert {rank * El + e} = local {e}, row block {rb},"
        if where not in str(err) or tile not in str(err):
            raise AssertionError(f"wrong report: {err}") from err
    else:
        raise AssertionError("the layer finished although a Linear-1 producer was missing")
    world.barrier()


# ------------------------------------------------------------------------------------------------------ sweep
MEGAMOE = data.Schema(
    "megamoe", 2,
    {"shape": "str", "hidden": "int64", "intermediate": "int64", "experts": "int64", "topk": "int64",
     "tokens": "int64", "routing": "str", "seed": "int64", "P": "int64", "dtype": "str", "schedule": "str",
     "schedule_param": "str", "block_m": "int64", "n_tasks": "int64", "rows": "int64", "remote_bytes": "int64",
     "kernel_ms": "float64", "kernel_ms_min": "float64", "n_timed": "int64", "calls_per_run": "int64",
     "tflops": "float64",
     "compute_ms": "float64", "dispatch_ms": "float64", "layer_ms": "float64", "unfused_ms": "float64",
     "grouped_mm_ms": "float64", "compute_sched_ms": "float64",
     "predicted_ms": "float64", "predicted_speedup": "float64"},
    ("shape", "tokens", "routing", "P", "dtype"),
)
# Columns (per configuration, dtype and schedule; every time is the median over repeats of the max over ranks):
#   kernel_ms          CUDA events around the experts kernel alone (no barrier); kernel_ms_min its minimum
#   n_timed            timed runs (after warm-up), each of calls_per_run back-to-back calls (times are per call)
#   tflops             GEMM FLOPs of all ranks / P / kernel_ms (per GPU)
#   rows, remote_bytes the busiest rank's received rows, and the largest remote combine bytes of a rank
#   compute_ms         the expert_wave kernel with every combine store local (compute-only control; same per row)
#   dispatch_ms        dispatch push + its barrier; layer_ms: the whole fused layer (dispatch, barrier, kernel,
#                      barrier, top-k sum); unfused_ms: NCCL all_to_all + torch._grouped_mm layer (bf16 weights,
#                      also on fp8 rows); routing layout and task lists are built outside all timed regions
#   grouped_mm_ms      the GEMM phases alone in torch: torch._grouped_mm Linear-1, SwiGLU, torch._grouped_mm
#                      Linear-2 on this rank's rows in bf16 (no communication); compare with compute_ms
#   compute_sched_ms   this schedule's kernel with every combine store local (v2; NaN in v1 records, which have
#                      the compute-only control of expert_wave alone, compute_ms): kernel_ms - compute_sched_ms is
#                      what the remote combine costs this schedule, compute_sched_ms - compute_ms its tile order
#   predicted_ms       the Burst-Gap prediction of kernel_ms (module docstring; max over ranks)
#   predicted_speedup  predicted expert_wave / predicted this schedule
#   schedule_param     lag=<tiles> for lag; model_guided's chosen candidate


def _median(xs: Sequence[float]) -> float:
    return float(np.median(np.asarray(xs, dtype=np.float64)))


def _measure_case(world, prob: Problem, bufs: MoEBuffers, schedules: Sequence[str], repeats: int, warmup: int,
                  prm: BurstGapParams, unfused_cache: dict, assignment: str = "static") -> dict:
    """On this rank: check, then time every schedule's kernel and layer, dispatch, the compute-only control and
    the unfused baseline. Returns per-rank lists and predictions (gathered by the job)."""
    from .bench import time_ms

    def timed(fn, inner):    # ms per call: ``inner`` back-to-back calls per timed run (launch latency hidden)
        def calls():
            for _ in range(inner):
                fn()
        return [ms / inner for ms in time_ms(calls, warmup=warmup, reps=repeats)]

    rank = world.local_ranks[0]
    dyn = assignment == "dynamic"
    c, s, t = prob.case, prob.case.shape, prob.tiles
    dev = world.device(rank)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    inp = prob.inputs[rank]
    clock = [time.perf_counter()]
    phases: dict[str, float] = {}

    def lap(name: str) -> None:   # host seconds per phase (the sweep's log says where a configuration's time goes)
        now = time.perf_counter()
        phases[name] = round(now - clock[0], 2)
        clock[0] = now
    base = {rank: build_tasks(prob, "expert_wave", sms, rank)}
    # compile everything before the first barrier (no rank spins on a peer's compiler), then the local control
    dispatch(world, bufs, prob.inputs, barrier=False)
    run_experts(world, bufs, prob.inputs, base, t, barrier=False, check=False, dynamic=dyn)
    run_experts(world, bufs, prob.inputs, base, t, barrier=False, check=False, local_combine=True, dynamic=dyn)
    world.barrier()
    lap("compile")
    probe = _median(time_ms(lambda: run_experts(world, bufs, prob.inputs, base, t, barrier=False, check=False,
                                                dynamic=dyn), warmup=1, reps=3))
    inners = [None] * world.world_size   # every rank the same (the layer and the baseline are collective)
    world.dist.all_gather_object(inners, min(CALLS_MAX, max(1, math.ceil(CALLS_TARGET_MS / max(probe, 1e-3)))))
    inner = max(inners)
    compute = timed(lambda: run_experts(world, bufs, prob.inputs, base, t, barrier=False, check=False,
                                        local_combine=True, dynamic=dyn), inner)
    rate = calibrate_rate(base[rank], s.hidden, s.intermediate, t, sms, _median(compute), assignment)
    cost = CostModel(prm, rate, sms, OUT_DTYPES[prob.dtype].itemsize, assignment)
    remote = prob.grid(rank).remote_rows_per_block(prob.layouts[rank])
    lap("probe+compute")
    lists = {name: (base[rank] if name == "expert_wave" else build_tasks(prob, name, sms, rank, cost=cost))
             for name in schedules}
    lap("schedules")
    # correctness before timing: expert_wave's output close to the unfused baseline; every schedule bit-identical
    if c.name not in unfused_cache:
        unfused_cache.clear()
        w = inp.weights
        unfused_cache[c.name] = make_unfused(world, inp, (w.w1_hi if w.w1_hi is not None else w.w1,
                                                          w.w2_hi if w.w2_hi is not None else w.w2))
    unfused = unfused_cache[c.name]
    want = []
    for name in schedules:
        _poison(world, bufs, c.tokens)
        out = megamoe_layer(world, bufs, prob.inputs, {rank: lists[name]}, t, dynamic=dyn)[rank]
        torch.cuda.synchronize()
        comb = bufs.combine_view(rank, c.tokens)
        unf = unfused() if not want else None      # collective: every rank at the same schedule

        def check():
            what = f"{c.name} {prob.dtype} rank {rank}"
            if want:
                check_bit_identical(comb, want[0], f"{what}: {name} vs {schedules[0]}")
                return
            if torch.isnan(comb).any():
                raise AssertionError(f"{what}: combine buffer not fully written (NaN left)")
            err = rel_l2(unf, out)
            if not err <= UNFUSED_REL_L2[prob.dtype]:
                raise AssertionError(f"{what}: fused vs unfused relative L2 {err:.3g}")
            want.append(comb.clone())
        _agree(world, check)
        world.barrier()
    del want
    lap("check")
    res = {"compute": compute, "sched": {}, "inner": inner, "phases": phases}
    for name in schedules:
        tasks = {rank: lists[name]}
        world.barrier()
        kern = timed(lambda: run_experts(world, bufs, prob.inputs, tasks, t, barrier=False, check=False,
                                         dynamic=dyn), inner)
        local = timed(lambda: run_experts(world, bufs, prob.inputs, tasks, t, barrier=False, check=False,
                                          local_combine=True, dynamic=dyn), inner)   # this order, no remote stores
        _agree(world, lambda: check_task_status(lists[name], rank, prob.layouts[rank], s.intermediate // t.block_n1,
                                                dev))
        world.barrier()
        layer = timed(lambda: (dispatch(world, bufs, prob.inputs, check=False),
                               run_experts(world, bufs, prob.inputs, tasks, t, check=False, dynamic=dyn),
                               topk_reduce(bufs.combine_view(rank, c.tokens))), inner)
        pred = predict_kernel_ns(lists[name], remote, cost, s.hidden, s.intermediate, t)["total_ns"] / 1e6
        res["sched"][name] = dict(kernel=kern, layer=layer, pred=pred, param=lists[name].param or "",
                                  n_tasks=lists[name].n_tasks, local=local)
    world.barrier()
    res["dispatch"] = timed(lambda: dispatch(world, bufs, prob.inputs, check=False), inner)
    world.barrier()
    res["unfused"] = timed(unfused, inner)
    world.barrier()
    res["grouped_mm"] = timed(unfused.gemm, inner)
    world.barrier()
    lap("timing")
    return res


def _rows_for(prob: Problem, P: int, parts: list[dict], repeats: int) -> pd.DataFrame:
    c, s = prob.case, prob.case.shape

    def agg(get):                        # per repeat the max over ranks, then the median (and the minimum)
        per = np.max(np.array([get(p) for p in parts], dtype=np.float64), axis=0)
        return float(np.median(per)), float(per.min())

    flops = sum(gemm_flops(lay.rows, s.hidden, s.intermediate) for lay in prob.layouts)
    remote = max(remote_combine_bytes(lay.remote_rows, s.hidden, OUT_DTYPES[prob.dtype].itemsize)
                 for lay in prob.layouts)
    compute, _ = agg(lambda p: p["compute"])
    dispatch_ms, _ = agg(lambda p: p["dispatch"])
    unfused_ms, _ = agg(lambda p: p["unfused"])
    grouped_ms, _ = agg(lambda p: p["grouped_mm"])
    pred = {n: max(p["sched"][n]["pred"] for p in parts) for n in parts[0]["sched"]}
    rows = []
    for name in parts[0]["sched"]:
        kern, kern_min = agg(lambda p: p["sched"][name]["kernel"])
        local, _ = agg(lambda p: p["sched"][name]["local"])
        layer, _ = agg(lambda p: p["sched"][name]["layer"])
        rows.append(dict(shape=s.name, hidden=s.hidden, intermediate=s.intermediate, experts=s.experts,
                         topk=s.topk, tokens=c.tokens, routing=c.routing, seed=c.seed, P=P, dtype=prob.dtype,
                         schedule=name, block_m=prob.tiles.block_m,
                         schedule_param="|".join(dict.fromkeys(p["sched"][name]["param"] for p in parts)),
                         n_tasks=max(p["sched"][name]["n_tasks"] for p in parts),
                         rows=max(lay.rows for lay in prob.layouts), remote_bytes=remote, kernel_ms=kern,
                         kernel_ms_min=kern_min, n_timed=repeats, calls_per_run=parts[0]["inner"],
                         tflops=flops / P / (kern * 1e-3) / 1e12,
                         compute_ms=compute, dispatch_ms=dispatch_ms, layer_ms=layer, unfused_ms=unfused_ms,
                         grouped_mm_ms=grouped_ms, compute_sched_ms=local,
                         predicted_ms=pred[name],
                         predicted_speedup=pred.get("expert_wave", float("nan")) / pred[name]))
    return pd.DataFrame(rows)


def megamoe_job(world, cases: Sequence[MoECase], folder: str, meta: dict, dtypes: Sequence[str],
                schedules: Sequence[str], repeats: int, warmup: int, prm: dict, seed: int,
                deadline: float | None, assignment: str = "static") -> None:
    """Runs on every rank: (case, dtype) pairs not yet in ``folder`` are checked, timed and appended one at a
    time (shape by shape: weights are generated once per shape and dtype). Stops starting new pairs after
    ``deadline`` (time.time()); a re-run resumes."""
    rank, P = world.local_ranks[0], world.world_size
    csv = Path(folder) / f"{MEGAMOE.name}.csv"
    todo = [None]
    if rank == 0:
        data.start_file(folder, MEGAMOE, meta)
        done = data.done_keys(csv, MEGAMOE)
        todo = [[(c, d) for c in cases for d in dtypes if c.key(P, d) not in done]]
    world.dist.broadcast_object_list(todo, src=0)
    todo = todo[0]
    params = BurstGapParams(**prm)
    dev = world.device(rank)
    unfused_cache: dict = {}

    def out_of_time() -> bool:
        """Rank 0's clock decides for every rank (a collective: all ranks stop at the same configuration)."""
        go = [deadline is None or time.time() < deadline]
        world.dist.broadcast_object_list(go, src=0)
        if not go[0] and rank == 0:
            print("megamoe: time budget reached; run again to resume", file=sys.stderr, flush=True)
        return not go[0]

    for shape in dict.fromkeys(c.shape for c, _ in todo):
        for dtype in [d for d in dtypes if any(c.shape == shape and dd == d for c, dd in todo)]:
            mine = [c for c, d in todo if c.shape == shape and d == dtype]
            if out_of_time():
                return
            t0 = time.perf_counter()
            w = rank_weights(shape.hidden, shape.intermediate, shape.experts, P, rank, seed, dev, dtype)
            cap = max(lay.rows for c in mine for lay in routing_of(c, P)[2])
            tiles = {c.name: default_tiles(dtype, c.tokens * P * shape.topk / shape.experts) for c in mine}
            bufs = moe_buffers(world, max(cap, 1), max(c.tokens for c in mine), shape.hidden, shape.intermediate,
                               shape.topk, shape.experts // P, dtype,
                               min_block_m=min(t.block_m for t in tiles.values()))
            if rank == 0:
                print(f"megamoe: {shape.name} {dtype} weights and buffers in {time.perf_counter() - t0:.1f} s",
                      file=sys.stderr, flush=True)
            for c in mine:
                if out_of_time():
                    return
                t0 = time.perf_counter()
                prob = make_problem(world, c, dtype, tiles[c.name], weights={rank: w}, weight_seed=seed)
                t_setup = time.perf_counter() - t0
                res = _measure_case(world, prob, bufs, schedules, repeats, warmup, params, unfused_cache,
                                    assignment)
                parts = [None] * P
                world.dist.all_gather_object(parts, res)
                if rank == 0:
                    data.append_rows(csv, MEGAMOE, _rows_for(prob, P, parts, repeats))
                    ph = " ".join(f"{k} {v:.1f}" for k, v in res["phases"].items())
                    print(f"megamoe: {c.name} {dtype} done in {time.perf_counter() - t0:.1f} s (setup "
                          f"{t_setup:.1f} {ph}; inner {res['inner']})", file=sys.stderr, flush=True)
                del prob
            del w, bufs
            unfused_cache.clear()
            torch.cuda.empty_cache()


def recorded_params(machine: str = "h200x2") -> BurstGapParams:
    """Burst-Gap parameters fitted to ``data/<machine>``'s recorded burst-gap sweep (the reference values when
    there is none)."""
    from . import studies

    try:
        df, _ = studies.burst_gap_data("recorded", machine)
    except (data.DataError, ValueError):
        return BurstGapParams.reference()
    return studies.default_params(df)


def run_megamoe(out: str | Path, world_size: int = 2, dtypes: Sequence[str] = DTYPES_GPU,
                cases: Sequence[MoECase] | None = None, schedules: Sequence[str] = SCHEDULES, repeats: int = 20,
                warmup: int = 3, prm: BurstGapParams | None = None, seed: int = 0, max_minutes: float | None = None,
                command: str = "", assignment: str = "static") -> Path:
    """Run (or resume) the MegaMoE sweep on ``world_size`` GPUs into ``out``/megamoe.csv; returns its path.
    ``max_minutes``: start no new (case, dtype) after that long (a re-run resumes). ``prm``: Burst-Gap
    parameters of the predictions (default: fitted to data/h200x2). ``assignment``: how the kernel's programs
    take tasks (``ASSIGNMENTS``); one folder holds one assignment (recorded in the sidecar's params). Parameters
    are validated before the GPUs are checked and anything launches."""
    if world_size < 2:
        raise ValueError(f"world_size must be >= 2 (the combine needs peers), got {world_size}")
    if repeats < 20 or warmup < 1:
        raise ValueError(f"repeats must be >= 20 and warmup >= 1, got {repeats}, {warmup}")
    if not dtypes or any(d not in DTYPES_GPU for d in dtypes):
        raise ValueError(f"dtypes must be a non-empty subset of {DTYPES_GPU}, got {list(dtypes)}")
    if not schedules or any(s not in SCHEDULES for s in schedules) or schedules[0] != "expert_wave":
        raise ValueError(f"schedules must be a subset of {SCHEDULES} starting with expert_wave, got {list(schedules)}")
    cases = list(CASES if cases is None else cases)
    if not cases:
        raise ValueError("no cases")
    if len({c.name for c in cases}) != len(cases):
        raise ValueError("case names must be unique")
    for c in cases:
        s = c.shape
        if s.experts % world_size:
            raise ValueError(f"{c.name}: experts ({s.experts}) must be a positive multiple of the number of ranks "
                             f"({world_size})")
        for d in dtypes:
            t = TileConfig(64, 128, 128, 128 if d == "fp8" else 64)
            t.validate(d)
            for what, n, b in (("hidden", s.hidden, 128), ("intermediate", s.intermediate, 128)):
                if n % b:
                    raise ValueError(f"{c.name}: {what} ({n}) is not tile-aligned (a multiple of {b})")
    if max_minutes is not None and max_minutes <= 0:
        raise ValueError(f"max_minutes must be > 0, got {max_minutes}")
    if assignment not in ASSIGNMENTS:
        raise ValueError(f"assignment must be one of {ASSIGNMENTS}, got {assignment!r}")
    side = Path(out) / f"{MEGAMOE.name}.json"
    if side.exists():
        had = data.read_meta(side, MEGAMOE).get("params", {}).get("assignment", "static")
        if had != assignment:
            raise ValueError(f"{side.parent} holds a {had}-assignment sweep; record the {assignment} one in another "
                             f"folder (e.g. {Path(out) / assignment})")
    env.require_gpus(world_size, "the MegaMoE sweep")
    from .ranks import spawn

    prm = prm or recorded_params()
    params = dict(world_size=world_size, dtypes=list(dtypes), cases=[c.name for c in cases],
                  schedules=list(schedules), repeats=repeats, warmup=warmup, prm=prm.as_dict(), seed=seed,
                  zipf_exponent=ZIPF_EXPONENT, hot_fraction=HOT_FRACTION, source="gpu", assignment=assignment)
    meta = env.provenance(command, params)
    deadline = None if max_minutes is None else time.time() + 60 * max_minutes
    spawn(megamoe_job, world_size, cases, str(out), meta, list(dtypes), list(schedules), repeats, warmup,
          prm.as_dict(), seed, deadline, assignment)
    return Path(out) / f"{MEGAMOE.name}.csv"


def repredict(df: pd.DataFrame, prm: BurstGapParams, n_sms: int, assignment: str = "static") -> pd.DataFrame:
    """The current ``predict_kernel_ns`` applied to recorded MegaMoE rows (a model, computed, never measured):
    per configuration and dtype, every rank's task list is rebuilt from the seeded routing (model_guided: the
    recorded choice), the per-program GEMM rate calibrated on the recorded compute-only time, and the prediction
    taken as the maximum over ranks. ``assignment``: predict as if the kernel had assigned tasks so (``dynamic``
    on static records: what a dynamic run should show, with the static compute-only calibration). Returns the
    rows' keys + schedule with ``model_ms`` and ``model_speedup`` (expert_wave / schedule) and ``imbalance``
    (busiest program / mean, max over ranks)."""
    cases = {(c.shape.name, c.tokens, c.routing): c for c in CASES}
    out = []
    keys = ["shape", "tokens", "routing", "P", "dtype"]
    for (name, tokens, routing, P, dtype), g in df.groupby(keys, sort=False):
        c = cases.get((name, tokens, routing))
        if c is None:
            raise ValueError(f"{name} T={tokens} {routing} is not one of the 84 configurations")
        s = c.shape
        _, _, layouts = routing_of(c, int(P))
        rows = g.drop_duplicates("schedule").set_index("schedule")
        tiles = gpu_tiles(dtype, int(rows.block_m.iloc[0]))
        out_bytes = OUT_DTYPES[dtype].itemsize
        pred: dict[str, list] = {}
        for r in range(int(P)):
            grid = TileGrid.of(layouts[r], s.hidden, s.intermediate, tiles)
            ew = build_schedule("expert_wave", grid, n_sms)
            rate = calibrate_rate(ew, s.hidden, s.intermediate, tiles, n_sms, float(rows.compute_ms.iloc[0]))
            cost = CostModel(prm, rate, n_sms, out_bytes, assignment)
            remote = grid.remote_rows_per_block(layouts[r])
            for sched, row in rows.iterrows():
                if sched == "model_guided":   # the recorded choice of this rank ("a|b": rank 0's, rank 1's)
                    ch = str(row.schedule_param).split("|")
                    ch = ch[r] if len(ch) == int(P) else ch[0]
                    if not (ch.startswith("lag=") or ch in ("expert_wave", "interleaved")):
                        raise ValueError(f"{name} T={tokens} {routing} {dtype}: model_guided's recorded choice "
                                         f"{row.schedule_param!r} names no candidate")
                    tl_ = build_schedule("lag", grid, n_sms, lag=int(ch.split("=")[1])) if ch.startswith("lag=") \
                        else build_schedule(ch, grid, n_sms)
                elif sched == "lag":
                    lag = str(row.schedule_param)
                    tl_ = build_schedule("lag", grid, n_sms, lag=int(lag.split("=")[1]) if lag.startswith("lag=")
                                         else None)
                else:
                    tl_ = ew if sched == "expert_wave" else build_schedule(sched, grid, n_sms)
                p = predict_kernel_ns(tl_, remote, cost, s.hidden, s.intermediate, tiles)
                pred.setdefault(sched, []).append((p["total_ns"] / 1e6, p["imbalance"]))
        base = max(t for t, _ in pred["expert_wave"]) if "expert_wave" in pred else float("nan")
        for sched, v in pred.items():
            ms = max(t for t, _ in v)
            out.append(dict(zip(keys, (name, tokens, routing, P, dtype)), schedule=sched, model_ms=ms,
                            model_speedup=base / ms, imbalance=max(i for _, i in v)))
    return pd.DataFrame(out)


def summary_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per configuration and dtype: kernel ms of each schedule, its measured speedup over expert_wave
    (``speedup_<schedule>``) and the model's (``pred_<schedule>``); then one ``geomean`` and one ``max`` row per
    dtype over the configurations."""
    idx = ["shape", "tokens", "routing", "P", "dtype"]
    k = df.pivot_table(index=idx, columns="schedule", values="kernel_ms", aggfunc="median")
    p = df.pivot_table(index=idx, columns="schedule", values="predicted_speedup", aggfunc="median")
    out = k.round(4)
    out.columns = [f"{c}_ms" for c in out.columns]
    others = [c for c in k.columns if c != "expert_wave"] if "expert_wave" in k else []
    for c in others:
        out[f"speedup_{c}"] = (k["expert_wave"] / k[c]).round(3)
        out[f"pred_{c}"] = p[c].round(3)
    out = out.reset_index()
    out["n_configs"] = 1
    agg = []
    for dt, g in out.groupby("dtype"):
        for stat in ("geomean", "max"):
            row = {"shape": stat, "dtype": dt, "n_configs": len(g)}
            for c in others:
                for col in (f"speedup_{c}", f"pred_{c}"):
                    v = g[col].dropna()
                    row[col] = round(float(np.exp(np.log(v).mean()) if stat == "geomean" else v.max()), 3) \
                        if len(v) else float("nan")
            agg.append(row)
    return pd.concat([out, pd.DataFrame(agg)], ignore_index=True)
