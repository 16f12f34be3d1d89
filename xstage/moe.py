"""MegaMoE on GPUs: fused Linear-1 -> SwiGLU -> Linear-2 -> remote-store combine, with the schedule as data.

Host side of ``xstage.kernels.moe`` that touches devices: the symmetric buffers, validated launchers (dispatch
push, the fused experts kernel, the end-of-phase epoch barrier, the whole layer), the unfused GPU baseline (NCCL
all_to_all + ``torch._grouped_mm``) and the correctness jobs. The seeded inputs, the fp8 quantisation and the
float32 reference are ``xstage.moe_reference``. What the layer computes and in which order (cases, routing,
layouts, schedules, the cost model) is planned on the CPU in ``xstage.moe_plan``; the sweep is
``xstage.moe_sweep``.

Legend: P = ranks, E = experts, El = E / P experts per rank, K = top-k, T = tokens per rank, Hd = hidden,
I = intermediate, R = rows a rank receives, BM = rows per row block, n = programs of the persistent kernel.

The layer on every rank r (``megamoe_layer``):
  1. dispatch: rank r pushes each (token, slot) item's row x[token] [Hd] (fp8 + 1x128 scales with FP8) and its
     meta (r, token, slot, router weight) into the receive buffer of the expert's owner, at the row the host
     layout assigned (owner's layout: expert-major; within an expert by source rank, then by (token, slot));
     then an epoch barrier (every rank's pushes are visible).
  2. experts: the persistent kernel walks the schedule's task list; Linear-2 epilogues store each output row
     into the combine buffer [K, T, Hd] of the row's source rank (peer pointer, or local); then an epoch barrier.
  3. top-k reduction: out[T, Hd] = sum over slots of the combine buffer (float32 sum, a torch op).

Dtypes (``xstage.moe_plan.DTYPE_REGISTRY``): ``bf16`` and ``fp8`` on GPUs; ``fp16`` and ``fp32`` under Triton's
interpreter (its bf16 ``tl.dot`` is wrong and it has no fp8).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from . import env
from .kernels import moe as _device
from .kernels.moe import dispatch_push_kernel, megamoe_kernel
from .kernels.sync import PEER_MAX_POLLS
from .model import BurstGapParams
from .moe_plan import (ACT_DTYPES, ASSIGNMENTS, FP8_BLOCK, INT32_MAX, KIND_L1, META_FIELDS, OUT_DTYPES,
                       SCHEDULES, STATUS_FIELDS, TILE_SWIZZLE, UNFUSED_REL_L2, CostModel, MoECase,
                       RankLayout, TaskList, TileConfig, TileGrid, as_case, build_schedule, check_tasks,
                       default_dtype, default_tiles, routing_of, validate_dtype, validate_problem)
from .moe_reference import (RankWeights, check_close, moe_reference, quantize_fp8, rank_tokens, rank_weights,
                            reference_weights, topk_reduce)
from .moe_unfused import make_unfused, make_unfused_one_process
from .numeric import check_bit_identical, rel_l2
from .ranks import epoch_barrier

MAX_POLLS = PEER_MAX_POLLS  # bound on every wait (~seconds on a GPU): a peer still compiling must fit


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
    comb_arg: dict[int, torch.Tensor] = field(default_factory=dict)  # rank -> the kernel's comb_ptr argument (only its
    #   element type is used) on the rank's device, where its combine buffer lives in host memory

    def kernel_comb(self, rank: int, device) -> torch.Tensor:
        """Rank ``rank``'s combine buffer as the experts kernel's ``comb_ptr`` argument: the buffer itself, or,
        where it lives in pinned host memory (a one-GPU host-link world), a device tensor of its dtype (the kernel
        reads only the element type from it; every store goes through the address table)."""
        comb = self.combine.local(rank)
        if comb.device == torch.device(device):
            return comb
        if rank not in self.comb_arg:
            self.comb_arg[rank] = torch.empty(1, dtype=comb.dtype, device=device)
        return self.comb_arg[rank]

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
    # the combine is what peers store into (destination): OneGPUWorld(link="host") puts the peers' in pinned host
    # memory, so the observed rank's remote combine stores cross PCIe
    combine = world.symmetric_empty(topk * tokens * hidden, OUT_DTYPES[dtype], destination=True)
    flags = world.symmetric_empty(P, torch.int32)
    tables, h, hs, counters, status = {}, {}, {}, {}, {}
    n_blocks = cap_rows // min_block_m + experts_local   # sum over experts of ceil(rows / BM)
    for r in world.local_ranks:
        dev = world.device(r)
        flags.local(r).zero_()
        recv_meta.local(r).zero_()
        t = {"x": recv_x.table(r), "meta": recv_meta.table(r), "combine": combine.table(r), "flags": flags.table(r),
             "combine_local": [combine.table(r)[r]] * P, "xs": recv_xs.table(r) if fp8 else [0] * P}
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
    pushes: object = field(default=None, repr=False)   # xstage.traffic.TrafficWorld: the rows this rank's GPU
    #                                                    pushes for the sources it plays (set by make_problem)

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


def _ranks(world, ranks: Sequence[int] | None) -> list[int]:
    """The local ranks a launcher runs (default: all of them); ValueError for a rank this process does not drive."""
    if ranks is None:
        return list(world.local_ranks)
    bad = [r for r in ranks if r not in world.local_ranks]
    if bad or not ranks:
        raise ValueError(f"ranks must be a non-empty subset of this process's ranks {world.local_ranks}, got "
                         f"{list(ranks)}")
    return list(ranks)


def dispatch(world, bufs: MoEBuffers, inputs: Mapping[int, RankInputs], barrier: bool = True, check: bool = True,
             max_polls: int = MAX_POLLS, ranks: Sequence[int] | None = None) -> None:
    """Push every local rank's items into the owners' receive buffers (fp8: quantise x 1x128 first), then the
    dispatch barrier. Emulated ranks: every rank pushes, then the barrier's signals, then its waits.
    ``ranks``: which local ranks push (default all; a one-process world times one rank's push); the barrier
    always takes every rank."""
    ranks = _ranks(world, ranks)
    fp8 = bufs.dtype == "fp8"
    if getattr(world, "dispatch_push", None) is not None:   # xstage.traffic.TrafficWorld: each GPU pushes the rows
        world.dispatch_push(bufs, inputs, ranks)             # of the sources it plays (inputs[r].pushes)
        ranks = []
    for r in ranks:
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
                      validate: bool, ranks: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """Everything ``run_experts`` checks before launching; returns [(rank, programs)]."""
    if max_polls < 1:
        raise ValueError(f"max_polls must be >= 1, got {max_polls}")
    launches = []
    for r in _ranks(world, ranks):
        if r not in tasks:
            raise ValueError(f"no task list for rank {r}")
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


def _tma_main_loops(tiles: TileConfig, fp8: bool) -> bool:
    """Whether ``tiles`` asks for the TMA main loops (``tiles.tma``: the default of both dtypes on GPUs; bit-identical
    to the pointer loops on all 84 configurations). Sets
    Triton's allocator for the tiles' device-side tensor descriptors (a few hundred bytes of global scratch per
    program). ``fp8`` is kept for the callers (both dtypes take the same path)."""
    del fp8
    if not tiles.tma:
        return False
    import triton

    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8,
                                                                     device="cpu" if env.interpreted() else "cuda"))
    return True


def run_experts(world, bufs: MoEBuffers, inputs: Mapping[int, RankInputs], tasks: Mapping[int, TaskList],
                tiles: TileConfig, n_programs: int | None = None, barrier: bool = True, check: bool = True,
                max_polls: int = MAX_POLLS, local_combine: bool = False,
                ts: Mapping[int, torch.Tensor] | None = None, validate: bool = True, dynamic: bool = False,
                ranks: Sequence[int] | None = None) -> None:
    """Launch the persistent experts kernel on every local rank (its task list), then the combine barrier.

    ``n_programs``: GPU default = SMs (all resident); under the interpreter one program per task (or 1).
    ``check``: read every wait's status (a host sync) and raise RuntimeError naming rank, expert and tile of a
    timed-out dependency; then the barrier's. ``local_combine``: every combine store goes to this rank's own
    buffer (the compute-only control; its output is meaningless). ``validate=False`` skips ``check_tasks``
    (tests that plant a missing dependency). ``dynamic``: programs claim the list's tasks in order through an
    atomic ticket instead of the static task i -> program i % n_programs (same tiles, same bits). ``ranks``:
    which local ranks launch (default all; a one-process world times the observed rank alone: its kernel only
    reads its own receive buffer and counters, so it never waits on another rank); the barrier takes every
    rank."""
    launches = _validate_experts(world, bufs, inputs, tasks, tiles, n_programs, max_polls, ts, validate, ranks)
    fp8 = bufs.dtype == "fp8"
    tma = _tma_main_loops(tiles, fp8)
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
        comb = bufs.kernel_comb(r, world.device(r))
        table = bufs.tables[r]["combine_local" if local_combine else "combine"]
        timed = ts is not None
        (_device.megamoe_tma_kernel if tma else megamoe_kernel)[(n_prog,)](
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
                  n_programs: int | None = None, dynamic: bool = False,
                  ranks: Sequence[int] | None = None) -> dict[int, torch.Tensor]:
    """The whole fused layer on every local rank: dispatch + barrier, experts kernel + barrier, top-k reduction.
    Returns {rank: out [T, Hd]} (on the rank's device); the combine buffers stay in ``bufs`` (``combine_view``).

    One process driving every rank (``world.emulated``: the CPU world, the one-GPU world) runs the ranks one after
    another in phases: every rank's dispatch push, every rank's barrier signal, then the waits; every rank's
    experts kernel, the signals, the waits; the reductions. Kernels only push, so no rank ever waits on a rank not
    yet launched. ``ranks``: the ranks whose dispatch, kernel and reduction run (default all: a one-process world
    times the observed rank's layer with the others' outputs left from an earlier full run); the barriers always
    take every rank (their signals come before any wait)."""
    _validate_layer(world, bufs, inputs, tiles)
    _validate_experts(world, bufs, inputs, tasks, tiles, n_programs, max_polls, None, True, ranks)
    dispatch(world, bufs, inputs, check=check, max_polls=max_polls, ranks=ranks)
    run_experts(world, bufs, inputs, tasks, tiles, n_programs=n_programs, check=check, max_polls=max_polls,
                dynamic=dynamic, ranks=ranks)
    return {r: topk_reduce(bufs.combine_view(r, inputs[r].x.shape[0]).to(world.device(r)))
            for r in _ranks(world, ranks)}


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
    swizzle: int = TILE_SWIZZLE     # tile order inside an expert (moe_plan.TileGrid; 0: row-block-major)

    @property
    def cap_rows(self) -> int:
        return max(lay.rows for lay in self.layouts)

    def grid(self, rank: int) -> TileGrid:
        s = self.case.shape
        return TileGrid.of(self.layouts[rank], s.hidden, s.intermediate, self.tiles, self.swizzle)


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
    if getattr(world, "source_pushes", None) is not None:   # xstage.traffic.TrafficWorld: the rows each GPU pushes
        for r in world.local_ranks:                          # for the sources it plays (seeded, planned on the host)
            inputs[r].pushes = world.source_pushes(case, dtype, r, ids, wts, layouts, inputs[r])
    return Problem(case, dtype, tiles, ids, wts, layouts, inputs)


def build_tasks(problem: Problem, schedule: str, n_sms: int, rank: int, cost: CostModel | None = None,
                lag: int | None = None, group: int | None = None, order: int | None = None) -> TaskList:
    """One rank's task list of ``schedule`` (model_guided: with ``cost``, else a default rate); ``group``: row
    blocks per chunk of the mixing schedules (None: the rule's, ``moe_plan.order_group``); ``order``: the order
    version (None: ``moe_plan.ORDER_VERSION``; 1: single tiles, no chunks)."""
    s = problem.case.shape
    grid = problem.grid(rank)
    model = None
    if schedule == "model_guided":
        cost = cost or CostModel.from_tflops(BurstGapParams.reference(), 500.0, n_sms,
                                             OUT_DTYPES[problem.dtype].itemsize)
        model = (cost, grid.remote_rows_per_block(problem.layouts[rank]), s.hidden, s.intermediate, problem.tiles)
    return build_schedule(schedule, grid, n_sms, lag=lag, model=model, group=group, order=order)


# ------------------------------------------------------------------------------------------- correctness job
def hi_weights(w: RankWeights) -> tuple[torch.Tensor, torch.Tensor]:
    """The weights the unfused baseline multiplies with: bf16 (for fp8 layers the weights they were quantised
    from; fp16/fp32 on the CPU)."""
    return (w.w1_hi if w.w1_hi is not None else w.w1, w.w2_hi if w.w2_hi is not None else w.w2)


def world_label(world) -> str:
    """' (one GPU, link host)' for a one-GPU world, '' otherwise: failure messages say which world failed."""
    if getattr(world, "traffic_ranks", None):   # xstage.traffic.TrafficWorld
        return f" ({world.label})"
    if world.emulated and getattr(world, "link", "emulated") != "emulated":
        return f" (one GPU, link {world.link})"
    return ""


def agree_on_checks(world, check: Callable[[], None]) -> None:
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


def poison_combine(world, bufs: MoEBuffers, tokens: int) -> None:
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
    bit-identical to it; (3) the unfused baseline close to the fused output (NCCL all_to_all on GPUs; copies
    between the ranks' tensors where one process drives every rank, :func:`make_unfused_one_process`;
    ``OneGPUWorld`` runs this same job on one GPU, link local or host). ``assignments``: each
    schedule runs with each of them (``static``: task i on program i % n; ``dynamic``: atomic ticket), all
    bit-identical. Runs on every rank (GPU) or once for an emulated world. Returns one dict per (case, local
    rank)."""
    if getattr(world, "traffic_ranks", None):   # rows of owners no GPU plays stay unwritten there, by design
        raise ValueError(f"check_job cannot check this world ({world.label}): use xstage.traffic.check_job")
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
    unf = None
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
            poison_combine(world, bufs, c.tokens)
            outs = megamoe_layer(world, bufs, prob.inputs, tasks, t, max_polls=max_polls, n_programs=n_programs,
                                 dynamic=dyn)
            world.barrier()
            if lead and not world.emulated:   # collective: every rank, before any check
                r = world.local_ranks[0]
                unf = {r: make_unfused(world, prob.inputs[r], hi_weights(prob.inputs[r].weights))()}
            elif lead:                          # one process drives every rank: the all_to_alls become copies
                unf = make_unfused_one_process(world, prob.inputs, {r: hi_weights(prob.inputs[r].weights)
                                                                    for r in world.local_ranks}).full()

            def check():
                for r in world.local_ranks:
                    comb = bufs.combine_view(r, c.tokens).to(world.device(r))   # (host memory: a peer's, link=host)
                    what = (f"{c.name} (seed {c.seed}, weights {seed}) {dtype} P={P} rank {r} {sched} {assign}"
                            f"{world_label(world)}")
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
                    if unf is not None:
                        e_unf = rel_l2(unf[r], outs[r])
                        if not e_unf <= UNFUSED_REL_L2[dtype]:
                            raise AssertionError(f"{what}: the unfused baseline differs from the fused layer by "
                                                 f"{e_unf:.3g} (relative L2)")
            agree_on_checks(world, check)
            world.barrier()
        for r in world.local_ranks:
            lay = prob.layouts[r]
            results.append(dict(case=c.name, dtype=dtype, P=P, rank=r, rows=lay.rows, remote_rows=lay.remote_rows,
                                rel_l2=errs[r][0], rel_l2_torch=errs[r][1], schedules=len(schedules),
                                runs=len(runs)))
        del prob, bufs, first
        if world.device(world.local_ranks[0]).type == "cuda":   # a GPU world, one process per rank or all in one
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
