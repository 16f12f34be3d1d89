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
                further Linear-1 tiles have been listed after its last producer (``lag_of_rule``: the smallest of
                1, 1.5, 2 rounds of n_sms tiles that the compute-only walk finds as fast as the best).
  model_guided  the candidate (expert_wave, interleaved, lag = 0, n/2, n, 2n, 4n) with the best time predicted
                by the Burst-Gap model (below); its ``param`` names the choice.
Inside an expert every schedule lists its tiles in the grid's order (``TileGrid.swizzle``): row-block-major in
the first kernels, the current ones in groups of TILE_SWIZZLE row blocks with the weight column blocks outer
(``swizzle=G`` in schedule_param); ``l2_traffic`` models what either order reads from DRAM.

Prediction of a schedule's kernel time (``predict_kernel_ns``), documented formula. Program i % n runs task i,
so the list falls into rounds k of n consecutive tasks (what the n programs work on at about the same time).
Tile compute times c1 = 2 BM Hd 2 BN1 / F and c2 = 2 BM I BN2 / F, F = the per-program GEMM rate (FLOP/ns),
calibrated so that the model's time of expert_wave without remote bytes equals the kernel measured with every
combine store sent to a local buffer (``compute_ms``; a given TFLOP/s when not measured). A Linear-2 task less
than a round behind its last producer (distance d < n positions) spins w = c1 (1 - d / n) (wait model
``positions``); wait model ``time`` (``wait_walk``) places every claim in time instead (a consumer spins until its
producers have ended: under dynamic claims short Linear-2 tiles bring a consumer's claim forward); which
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
import itertools
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from . import env
from .model import BurstGapParams
from .moe_cases import (ACT_DTYPES, CASES, DTYPE_REGISTRY, DTYPES_GPU, DTYPES_INTERPRETER, FP8_BLOCK, HOT_FRACTION,
                        INT32_MAX, KIND_L1, KIND_L2, META_FIELDS, OUT_DTYPES, REL_L2_FLOOR, ROUTING_REGISTRY, ROUTINGS,
                        SHAPES, STATUS_FIELDS, TASK_FIELDS, TOKENS_PER_RANK, UNFUSED_REL_L2, ZIPF_EXPONENT, MoECase,
                        MoEDtype, MoEShape, as_case, cases_by_name, dispatch_bytes, gemm_flops, remote_combine_bytes)
from .moe_cost import (ASSIGNMENT_REGISTRY, ASSIGNMENTS, STALL_DEFAULT, STALL_MODELS, WAIT_DEFAULT, WAIT_MODELS,
                       CostModel, calibrate_rate, claim_walk, predict_kernel_ns, record_stall, record_wait,
                       stall_model_of, stall_stage, wait_model_of, wait_walk)
from .registry import Choice, Registry

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
    tma: bool = False     # the main loops load x, W1, W2 through TMA tensor descriptors (the GPU default)

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


# The default tiles on an H200 (sm_90a), the tile rule a sidecar names as params.tiles_version (TILES_VERSION); the
# tiles a recorded MegaMoE row ran with are in the row (block_m .. num_stages, tma; rows of records older than
# those columns read as the first kernels' tiles, xstage.data). bf16: Linear-2 tiles BM x 256, 4
# stages, the main loops through TMA tensor descriptors (x, W1, W2); BM 64 where experts get < BF16_BM64_ROWS rows
# on average, else 128. fp8: BN1 = BN2 = BK = 128 (the scale block), through TMA, BM 64 with 5 stages, or BM 128
# with 4 where experts get >= FP8_BM128_ROWS rows on average. Each choice won an A/B in the same rounds on one H200
# (docs/findings.md; the GEMM records data/h200x1/megamoe_gemm_bf16 and megamoe_gemm_fp8 hold the last ones).
TILES_VERSION = 6
FP8_BM128_ROWS = 96         # fp8: average rows per expert from which BM = 128 (else 64)
BF16_BM64_ROWS = 96         # bf16: average rows per expert below which BM = 64 (else 128)


def default_tiles(dtype: str, rows_per_expert: float | None = None) -> TileConfig:
    """The default tiles of ``dtype`` where experts get ``rows_per_expert`` rows on average (None: unknown, BM 64
    for fp8, 128 for bf16): :func:`gpu_tiles` with the row-block rule above; small tiles (pointer loops) under the
    interpreter."""
    if env.interpreted():
        return INTERPRETER_TILES
    return gpu_default_tiles(dtype, rows_per_expert)


def gpu_default_tiles(dtype: str, rows_per_expert: float | None = None) -> TileConfig:
    """The GPU's default tiles of ``dtype`` (the row-block rule above), on any machine (the 8-GPU prediction,
    xstage.scale_analysis, prices the tiles a GPU sweep would run)."""
    rpe = rows_per_expert
    if dtype == "fp8":
        return gpu_tiles(dtype, 128 if rpe is not None and rpe >= FP8_BM128_ROWS else 64)
    return gpu_tiles(dtype, 64 if rpe is not None and rpe < BF16_BM64_ROWS else 128)


def gpu_tiles(dtype: str, block_m: int) -> TileConfig:
    """The H200 tiles of ``dtype`` with row blocks of ``block_m`` (the rule above), through the TMA main loops."""
    if dtype == "fp8":
        return TileConfig(block_m, 128, 128, 128, 8, 4 if block_m == 128 else 5, tma=True)
    return TileConfig(block_m, 128, 256, 64, 8, 4, tma=True)


def tiles_of_row(row) -> TileConfig:
    """The tiles a recorded MegaMoE row ran with (an older row read through its migration: tma False)."""
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


LAG_CANDIDATES = (0.0, 0.5, 1.0, 2.0, 4.0)   # model_guided's lags, in units of n_sms Linear-1 tiles
WAVE_FILL = 2               # expert_wave: a wave's Linear-1 tiles reach WAVE_FILL x n_sms


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


# The list forms of the schedules that mix Linear-1 and Linear-2 tiles (``order``; named in schedule_param, so a
# recorded row rebuilds the list it ran, :func:`parse_schedule_param`):
#   1  one tile at a time: interleaved spreads single Linear-2 tiles among the next wave's Linear-1 tiles; lag lists
#      a row block's Linear-2 tiles as soon as it is ready (no chunk in the param: the first kernels' lists).
#   3  in chunks of ``order_group`` row blocks (``chunk=G`` / ``lag=L,group=G``), so that the tiles running at the
#      same time share operands as Expert-Wave's do (a chunk's Linear-2 tiles read the same intermediate rows and
#      the same weight columns, as DeepGEMM's scheduler claims Linear-2 tiles in pool-block order).
#   4  (ORDER_VERSION, the default) 3, and lag's releases never split a swizzle group of row blocks (``align=1``;
#      interleaved's lists are 3's): a release that ends between an expert's two row blocks reads each of its W2
#      column blocks twice (DeepSeek-V4-Pro T2048 uniform bf16: lag's list 1.045-1.060x Expert-Wave's compute-only time,
#      aligned 1.00x; docs/findings.md).
ORDER_VERSION = 4
ORDER_VERSIONS = (1, 3, ORDER_VERSION)  # the list forms build_schedule builds
# Tile order inside an expert (every schedule; ``TileGrid.swizzle``, recorded as ``swizzle=G`` in schedule_param,
# absent = 0, row-block-major, the first kernels'): groups of TILE_SWIZZLE row blocks, column blocks outer, so the
# row blocks that read one weight column block run back to back (as a grouped GEMM rasterises for L2 reuse). Why:
# with row-block-major tiles a Linear-1 tile re-reads its weight column block one row block (N1 tiles, ~43 MB for
# DeepSeek-V4-Pro fp8) later, about the H200's 50 MB L2, and a mixing list puts Linear-2 tiles in between: an LRU
# model of the L2 over the list order (at commit 8ed668e) gives Pro fp8's mixing lists a cost of 1.4-4x Expert-Wave's DRAM bytes,
# and their measured compute-only cost followed it (1.14-1.15x Expert-Wave's geomean, swizzled 1.00-1.01x).
TILE_SWIZZLE = 8


def order_group(grid: TileGrid, n_sms: int) -> int:
    """Row blocks per chunk (list forms 3 and 4): about half the programs' worth of Linear-2 tiles
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


# Schedule ``lag``'s lag when none is given (the rule a sidecar names as params.lag_version, LAG_VERSION; every
# list's schedule_param names the lag it used, ``lag=N``, so a recorded row re-predicts the same whatever the rule):
# the smallest of LAG_RULE_CANDIDATES x n_sms whose compute-only walk (``lag_walk_time``) is within
# LAG_RULE_TOLERANCE of the least of them. Why (docs/findings.md): a fixed one-round lag can release an expert's
# Linear-2 tiles inside the last round of Linear-1 tiles and leave the last expert's tiles alone at the end (fp8
# Mixtral T512 hot: 1.08x Expert-Wave's compute-only time); two rounds hold both last experts to the end.
LAG_VERSION = 2
LAG_RULE_CANDIDATES = (1.0, 1.5, 2.0)    # units of n_sms Linear-1 tiles (up to 2n: lag stays a mixing list)
LAG_RULE_TOLERANCE = 0.005               # ties within 0.5 % of the least walk go to the smaller lag


def lag_walk_time(grid: TileGrid, n_sms: int, lag: int, group: int | None, align: bool = False) -> float:
    """Compute-only makespan (units of one Linear-1 tile) of lag's list (chunks of ``group`` row blocks, releases
    aligned to swizzle groups with ``align``; None: each ready row block at once) under dynamic claims:
    ``claim_walk`` with every Linear-1 tile costing 1 and every Linear-2 tile c2 / c1 = N1 / (2 N2) (the FLOP ratio of
    predict_kernel_ns's c1, c2: 2 BM I BN2 / (2 BM Hd 2 BN1)); no rate, no link."""
    tasks = np.array(schedule_lag(grid, lag, group, align), dtype=np.int64).reshape(-1, TASK_FIELDS)
    return 0.0 if not len(tasks) else claim_walk(tasks, 1.0, grid.n1 / (2.0 * max(grid.n2, 1)), n_sms)[0]


def lag_of_rule(grid: TileGrid, n_sms: int, group: int | None = None, align: bool = False) -> int:
    """Lag's lag for ``grid`` and ``group`` row blocks per chunk: the smallest of LAG_RULE_CANDIDATES x n_sms whose
    :func:`lag_walk_time` is within LAG_RULE_TOLERANCE of the least (computed, from the grid alone)."""
    if not grid.n_pool:
        return n_sms
    lags = [int(round(f * n_sms)) for f in LAG_RULE_CANDIDATES]
    t = [lag_walk_time(grid, n_sms, L, group, align) for L in lags]
    best = min(t)
    return next(L for L, x in zip(lags, t) if x <= best * (1.0 + LAG_RULE_TOLERANCE))


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
    (default ``lag_of_rule``). ``model`` (``model_guided``): (CostModel, remote rows per block [n_pool], hidden,
    intermediate, TileConfig); the candidate with the least predicted time wins. ``order`` (interleaved, lag and
    model_guided's candidates): the list form, None = ORDER_VERSION (chunks of ``group`` row blocks, None =
    ``order_group``; every chunk named in the param) or 1 (single tiles, ``group`` must be None)."""
    if n_sms < 1:
        raise ValueError(f"n_sms must be >= 1, got {n_sms}")
    return SCHEDULE_REGISTRY.check(name).impl(grid, n_sms, lag, model, group,
                                              ORDER_VERSION if order is None else order)


def schedule_of_param(schedule: str, param: str, grid: TileGrid, n_sms: int) -> TaskList:
    """The task list a recorded row ran (schedule and schedule_param; model_guided: its recorded choice), on
    ``grid`` with the row's tile order (``swizzle=G``; none: row-block-major). A param without a chunk is list form 1
    (the first kernels' lists)."""
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
