"""8-rank traffic on 2 GPUs: one GPU's egress under EP = 8, reproduced on a pair of GPUs (issue 13).

With two ranks, half of every combine stays on its own GPU, so the paper's 8-GPU regime (7/8 of the traffic
remote) never appears. On an 8-GPU HGX node a GPU's NVLink egress is 18 links into the switches whatever the
destination; on the two-GPU machine the same 18 links join the pair. :class:`TrafficWorld` wraps a 2-rank world
(``TorchSymmWorld`` on 2 GPUs, ``EmulatedWorld(2)`` on the CPU) into a world of ``traffic_ranks`` = L logical ranks
(default 8) of which GPU g plays ONE, L_g = g * L / 2 (L_0 = 0, L_1 = 4): its experts (E / L), its received rows
and its egress are those of a rank of an L-rank layer. The layer runs through the same launchers and kernels
(``xstage.moe``); three things differ, all here:

- Symmetric buffers (:meth:`TrafficWorld.symmetric_empty`). A destination buffer (one that peers store into: the
  combine) gets a slot for every logical rank on every GPU. GPU g's pointer table maps L_g to its own slot and
  every other logical rank j to the PEER's slot j: the peer's real buffer for j = L_peer, a "sink" otherwise. So
  7/8 of rank L_g's combine stores cross to the peer (1/8 into its real buffer, 6/8 into sinks), 1/8 stay local.
  Any other buffer (receive rows, meta, flags) has one slot per GPU; the table names the two real ranks and holds
  0 (no address) for the others: nothing is ever stored there.
- Dispatch (:meth:`TrafficWorld.dispatch_push`, :func:`push`). GPU g pushes the rows that owner L_peer
  receives from the 7 sources other than L_peer (it makes those sources' seeded tokens, and every source's
  routing is planned on the host), plus source L_g's rows to itself; nothing goes into sinks. Every REAL receive
  buffer then holds exactly the rows an L-rank layer would put there, 7/8 of them from the peer, and GPU g's
  dispatch egress is the L-rank layer's in expectation (the rows L_peer gets from 7 sources, not the rows L_g
  sends to 7 owners: equal counts only on average). The push is the dispatch kernel (``dispatch_push_kernel``,
  ``kernels/moe.py``) with an item list (constexpr ITEMS: each item names source, token, slot, owner, row and
  weight, instead of its position in one source's [T, K] list, so that items can be skipped); one launch per GPU,
  as the real dispatch.
- Barriers (:meth:`TrafficWorld.epoch_barrier`) run over the two GPUs (the logical ranks without a GPU never
  signal).

The real combine buffer of L_g then holds the rows that owners L_0 and L_1 computed for it (2 of 8 owners); the
sinks on GPU g hold what owner L_peer computed for the other sources. Rows of owners without a GPU are never
written (poisoned rows stay poisoned): the top-k sum of a traffic layer is not a layer output, and the check is
where every row lands (:func:`landing`, :func:`check_job`), bit for bit against an emulated 8-rank layer on the
CPU (tests/test_traffic8.py) and against the float32 reference on GPUs. Every label says "8-rank traffic on 2
GPUs" (:func:`label`), never "8 GPUs".

Legend: L = traffic (logical) ranks, G = 2 GPUs, L_g = the logical rank GPU g plays, E = experts, El = E / L,
K = top-k, T = tokens per rank, Hd = hidden, R = rows a rank receives.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch

from . import env
from .kernels.moe import FP8_BLOCK, dispatch_push_kernel
from .moe import (_pow2_divisor, agree_on_checks, build_tasks, dispatch, make_problem, megamoe_layer, moe_buffers,
                  run_experts, triton_next_pow2)
from .moe_reference import (check_close, moe_reference, quantize_fp8, rank_tokens, reference_weights)
from .moe_plan import (ACT_DTYPES, ASSIGNMENTS, OUT_DTYPES, SCHEDULES, as_case, default_dtype, default_tiles,
                       dispatch_bytes, remote_combine_bytes, validate_dtype)
from .numeric import check_bit_identical
from .ranks import SymmTensor, epoch_barrier

TRAFFIC_RANKS = 8               # the paper's EP size
SLOT_ALIGN = 256                # bytes: every slot of a symmetric buffer starts >= 16 B aligned (kernels assume it)


def label(traffic_ranks: int = TRAFFIC_RANKS, gpus: int = 2) -> str:
    """What every figure and message calls this world: '8-rank traffic on 2 GPUs' (never '8 GPUs')."""
    return f"{traffic_ranks}-rank traffic on {gpus} GPUs"


def validate_traffic(traffic_ranks: int, world_size: int, experts: Sequence[int] = ()) -> None:
    """One clear ValueError before anything is allocated or launched."""
    if world_size != 2:
        raise ValueError(f"{traffic_ranks}-rank traffic needs a 2-rank world (each GPU's peer is the other GPU), "
                         f"got {world_size} ranks")
    if traffic_ranks <= world_size or traffic_ranks % world_size:
        raise ValueError(f"traffic ranks must be a multiple of the world size ({world_size}) larger than it, got "
                         f"{traffic_ranks}")
    bad = [e for e in experts if e % traffic_ranks]
    if bad:
        raise ValueError(f"experts ({bad[0]}) must be a positive multiple of the traffic ranks ({traffic_ranks})")


# ------------------------------------------------------------------------------------------------------ world
class _GatherOverGPUs:
    """``world.dist`` of a traffic world: collectives over the GPUs that exist. ``all_gather_object(lst, obj)``
    leaves one entry per GPU in ``lst`` (its length becomes the GPU count: callers size it by ``world_size``,
    the logical ranks); everything else is the process group's own."""

    def __init__(self, dist):
        self._dist = dist

    def all_gather_object(self, lst: list, obj) -> None:
        out = [None] * self._dist.get_world_size()
        self._dist.all_gather_object(out, obj)
        lst[:] = out

    def __getattr__(self, name):
        return getattr(self._dist, name)


class TrafficWorld:
    """``traffic_ranks`` logical ranks on a 2-rank ``base`` world: GPU g plays logical rank ``played[g]`` =
    g * traffic_ranks / 2 (module docstring). ``world_size`` = traffic_ranks; ``local_ranks`` = the logical ranks
    this process's GPUs play; ``emulated`` and ``link`` are the base world's."""

    def __init__(self, base, traffic_ranks: int = TRAFFIC_RANKS):
        if isinstance(base, TrafficWorld):
            raise ValueError("a TrafficWorld's base must be a world of GPUs (or emulated ranks), not another one")
        validate_traffic(traffic_ranks, base.world_size)
        self.base = base
        self.traffic_ranks = traffic_ranks
        self.gpus = base.world_size
        self.world_size = traffic_ranks
        self.played = [g * (traffic_ranks // self.gpus) for g in range(self.gpus)]   # GPU -> its logical rank
        self.local_ranks = [self.played[g] for g in base.local_ranks]
        self.emulated = base.emulated
        self.link = base.link
        self.label = label(traffic_ranks, self.gpus)
        self._barrier_tables: dict[int, tuple] = {}

    # ranks
    def gpu_of(self, rank: int) -> int:
        """The GPU (base rank) that plays logical rank ``rank``; ValueError for a rank no GPU plays."""
        if rank not in self.played:
            raise ValueError(f"logical rank {rank} is played by no GPU of this {self.label} world (ranks "
                             f"{self.played})")
        return self.played.index(rank)

    def peer_of(self, rank: int) -> int:
        """The logical rank the other GPU plays."""
        return self.played[1 - self.gpu_of(rank)]

    def device(self, rank: int) -> torch.device:
        return self.base.device(self.gpu_of(rank))

    @property
    def dist(self):
        return _GatherOverGPUs(self.base.dist)

    def barrier(self) -> None:
        self.base.barrier()

    # memory
    def symmetric_empty(self, numel: int, dtype: torch.dtype, destination: bool = False):
        """A destination buffer: L slots of ``numel`` on every GPU, GPU g's table = its own slot L_g and the peer's
        slot j for every other j. Any other buffer: one slot per GPU, the table names the two played ranks and
        holds 0 for the rest. ``local(L_g)`` is GPU g's real slot; ``handle`` the base buffer (every slot)."""
        esize = torch.empty(0, dtype=dtype).element_size()
        stride = -(-numel * esize // SLOT_ALIGN) * SLOT_ALIGN // esize     # elements per slot, aligned
        L = self.traffic_ranks
        slots = L if destination else 1
        base = self.base.symmetric_empty(stride * slots, dtype, destination=destination)

        def addr(g: int, j: int) -> int:          # GPU g's slot of logical rank j, as this process sees it
            return base.ptrs[g] + (j if destination else 0) * stride * esize

        tensors, views = {}, {}
        for g in self.base.local_ranks:
            me, peer = self.played[g], self.played[1 - g]
            tensors[me] = base.local(g)[(me if destination else 0) * stride:][:numel]
            if destination:
                views[me] = [addr(g, j) if j == me else addr(1 - g, j) for j in range(L)]
            else:
                views[me] = [addr(g, j) if j == me else addr(1 - g, j) if j == peer else 0 for j in range(L)]
        first = views[self.local_ranks[0]]
        return SymmTensor(tensors, first, handle=_Slots(base, stride, slots, numel), views=views)

    def slot(self, buf, gpu: int, rank: int) -> torch.Tensor:
        """GPU ``gpu``'s slot of logical rank ``rank`` in destination buffer ``buf`` (a local GPU's): the real
        buffer for rank = played[gpu], a sink (or the unused slot of the peer's rank) otherwise."""
        s = buf.handle
        if not isinstance(s, _Slots) or s.slots != self.traffic_ranks:
            raise ValueError("slot() needs a destination buffer of this TrafficWorld")
        return s.base.local(gpu)[rank * s.stride:][:s.numel]

    def poison_destinations(self, buf, value: float = float("nan")) -> None:
        """Fill every slot of destination buffer ``buf`` on this process's GPUs (sinks included)."""
        for g in self.base.local_ranks:
            buf.handle.base.local(g).fill_(value)

    # barrier
    def epoch_barrier(self, flag_table, flags, status, epoch: int, what: str, max_polls: int, check: bool = True,
                      silent_ranks: Sequence[int] = ()) -> None:
        """``xstage.ranks.epoch_barrier`` over the GPUs: GPU g signals and waits as base rank g in the flags of the
        played ranks (``flags.table(L_g)`` names both GPUs' real flags)."""
        key = id(flags)
        if key not in self._barrier_tables or self._barrier_tables[key][0] is not flags:
            tables = {g: torch.tensor([flags.table(self.played[g])[self.played[h]] for h in range(self.gpus)],
                                      dtype=torch.int64, device=self.base.device(g)) for g in self.base.local_ranks}
            base_flags = SymmTensor({g: flags.local(self.played[g]) for g in self.base.local_ranks},
                                    [flags.table(self.local_ranks[0])[r] for r in self.played])
            self._barrier_tables[key] = (flags, tables, base_flags)
        _, tables, base_flags = self._barrier_tables[key]
        epoch_barrier(self.base, tables, base_flags, {g: status[self.played[g]] for g in self.base.local_ranks},
                      epoch, f"{what} ({self.label}: GPU g plays logical rank {self.played}[g])", max_polls, check,
                      [self.gpu_of(r) for r in silent_ranks])

    # dispatch
    def source_pushes(self, case, dtype: str, rank: int, ids, wts, layouts, own) -> "SourcePushes":
        """What GPU gpu_of(rank) pushes (called by ``xstage.moe.make_problem``): the items owner L_peer receives
        from every source but L_peer, and source ``rank``'s items to itself, with every played source's tokens
        (seeded as ``xstage.moe_reference.rank_tokens``, so bit-identical to the L-rank layer's)."""
        return plan_pushes(self, case, dtype, rank, wts, layouts, own)

    def dispatch_push(self, bufs, inputs: Mapping, ranks: Sequence[int]) -> None:
        """``xstage.moe.dispatch``'s pushes in this world: one dispatch-kernel launch (ITEMS) per GPU."""
        for r in ranks:
            if getattr(inputs[r], "pushes", None) is None:
                raise ValueError(f"rank {r}: no source pushes: make the problem on this {self.label} world "
                                 f"(xstage.moe.make_problem)")
        for r in ranks:
            push(bufs, inputs[r].pushes, bufs.tables[r])


@dataclass
class _Slots:
    """A traffic world's base buffer and how it is cut (``SymmTensor.handle``: keeps it alive)."""

    base: object        # the base world's SymmTensor
    stride: int         # elements per slot
    slots: int          # L (destination) or 1
    numel: int          # elements each slot exposes


# --------------------------------------------------------------------------------------------------- dispatch
@dataclass
class SourcePushes:
    """One GPU's dispatch in a traffic world (built once per problem, outside every timed region): the item list,
    every played source's tokens (hi dtype: the reference's; raw bits: the kernel's) and the tables."""

    rank: int                                  # the logical rank the GPU plays
    items: torch.Tensor                        # int32 [n, 6] on the GPU
    x: dict[int, torch.Tensor]                 # source -> tokens [T, Hd] (output dtype; bf16 for fp8 layers)
    raw: dict[int, torch.Tensor]               # source -> what the kernel reads (fp8: quantised e4m3) as raw bits
    xs: dict[int, torch.Tensor]                # source -> fp32 [T, Hd/128] scales (fp8)
    src_x_table: torch.Tensor                  # int64 [L]
    src_xs_table: torch.Tensor                 # int64 [L]
    own_x: torch.Tensor                        # the rank's own tokens (RankInputs.x): quantised per call with fp8
    fp8: bool
    hidden: int
    remote_items: int                          # items pushed to the peer (dispatch egress)
    local_items: int                           # items pushed to the GPU's own receive buffer
    keep: list = field(default_factory=list, repr=False)


def plan_pushes(world: TrafficWorld, case, dtype: str, rank: int, wts, layouts, own) -> SourcePushes:
    """The items GPU gpu_of(rank) pushes (TrafficWorld.source_pushes)."""
    L, peer = world.traffic_ranks, world.peer_of(rank)
    dev = world.device(rank)
    s = case.shape
    T, K, Hd = case.tokens, s.topk, s.hidden
    fp8 = dtype == "fp8"
    rows, xs_hi, raw, scales = [], {}, {}, {}
    remote = local = 0
    for src in range(L):
        if src == peer:
            continue                                   # the peer pushes its own rows
        dest = layouts[src].dest.long()                # [T*K, 2] (owner, row) of source src's items
        to = (dest[:, 0] == peer) | ((dest[:, 0] == rank) & (src == rank))
        f = torch.nonzero(to).flatten()
        wb = wts[src].float().contiguous().view(torch.int32).flatten()
        rows.append(torch.stack([torch.full_like(f, src), f // K, f % K, dest[f, 0], dest[f, 1], wb[f].long()], 1))
        n_remote = int((dest[f, 0] == peer).sum())
        remote += n_remote
        local += f.numel() - n_remote
        x = own.x if src == rank else rank_tokens(T, Hd, case.seed, src, dev, dtype)
        xs_hi[src] = x
        if fp8:
            q, sc = quantize_fp8(x, 1)
            raw[src], scales[src] = q.view(torch.uint8), sc
        else:
            raw[src] = x.view({2: torch.int16, 4: torch.int32}[x.element_size()])
    items = torch.cat(rows).to(torch.int32).contiguous().to(dev)
    tab = [raw[j].data_ptr() if j in raw else 0 for j in range(L)]
    stab = [scales[j].data_ptr() if j in scales else 0 for j in range(L)]
    return SourcePushes(rank, items, xs_hi, raw, scales, torch.tensor(tab, dtype=torch.int64, device=dev),
                        torch.tensor(stab, dtype=torch.int64, device=dev), own.x, fp8, Hd, remote, local)


def push(bufs, pk: SourcePushes, tables: Mapping[str, torch.Tensor]) -> None:
    """Launch one GPU's dispatch (fp8: its own tokens quantised 1x128 first, as every rank of the real layer does;
    the other sources' were quantised when the problem was made)."""
    if pk.fp8:
        q, sc = quantize_fp8(pk.own_x, 1)
        pk.raw[pk.rank].copy_(q.view(torch.uint8))
        pk.xs[pk.rank].copy_(sc)
    n = pk.items.shape[0]
    if n == 0:
        return
    Hd = pk.hidden
    # the dispatch kernel with an item list (ITEMS): x_ptr gives the rows' type, xs_ptr / dest_ptr / wbits_ptr are
    # the sources' scale table, the items, the sources' row table (kernels/moe.py); rank and K are unused
    dispatch_push_kernel[(-(-n // 16),)](
        pk.raw[pk.rank], pk.src_xs_table, pk.items, pk.src_x_table, tables["x"], tables["xs"], tables["meta"], 0, n,
        1, Hd, BLOCK_R=16, BLOCK_H=_pow2_divisor(Hd, 512), SCALE_COLS=triton_next_pow2(max(Hd // FP8_BLOCK, 1)),
        FP8=pk.fp8, ITEMS=True, num_warps=4)


# ----------------------------------------------------------------------------------------- landing, egress
def landing(world: TrafficWorld, prob, gpu: int, rank: int) -> torch.Tensor:
    """bool [K, T]: the rows (slot, token) of source ``rank`` that land in GPU ``gpu``'s slot ``rank`` of the
    combine: owners L_0 and L_1 for the GPU's own rank, owner L_peer for a sink, none for the peer's rank."""
    me, peer = world.played[gpu], world.played[1 - gpu]
    owners = [me, peer] if rank == me else [] if rank == peer else [peer]
    dest = prob.layouts[rank].dest[:, 0].long()                        # [T*K] owner of each (token, slot) item
    T, K = prob.ids[rank].shape
    return torch.isin(dest, torch.tensor(owners, dtype=torch.long)).view(T, K).T.contiguous()


def egress(world: TrafficWorld, layouts, hidden: int, out_bytes: int = 2, act_bytes: int = 2, fp8: bool = False
           ) -> dict[int, dict]:
    """Per GPU the bytes its layer stores over the link and locally, from the layouts: combine (its owner's rows
    of other sources: remote; its own source's: local) and dispatch (rows into the peer from the 7 sources other
    than the peer: remote; its own rows to itself: local), with ``remote_share`` of each."""
    out = {}
    for g, me in enumerate(world.played):
        peer = world.played[1 - g]
        lay, lp = layouts[me], layouts[peer]
        comb_remote = remote_combine_bytes(lay.remote_rows, hidden, out_bytes)
        comb_local = remote_combine_bytes(lay.rows - lay.remote_rows, hidden, out_bytes)
        disp_remote = dispatch_bytes(lp.remote_rows, hidden, act_bytes, fp8)
        disp_local = dispatch_bytes(lay.rows - lay.remote_rows, hidden, act_bytes, fp8)
        out[g] = dict(rank=me, combine_remote=comb_remote, combine_local=comb_local, dispatch_remote=disp_remote,
                      dispatch_local=disp_local,
                      combine_remote_share=comb_remote / max(comb_remote + comb_local, 1),
                      dispatch_remote_share=disp_remote / max(disp_remote + disp_local, 1))
    return out


def poison(world: TrafficWorld, bufs) -> None:
    """NaN into every combine slot of this process's GPUs, sinks included (before every checked layer)."""
    world.poison_destinations(bufs.combine)
    world.barrier()


def check_landing(world: TrafficWorld, prob, bufs, what: str, weight_seed: int | None = None) -> dict:
    """Every combine slot on this process's GPUs: the rows that owners L_0 / L_1 store for a source land at that
    source's (slot, token) and nowhere else (every other row still NaN); given the layer's ``weight_seed``, the
    landed rows within 2x PyTorch's own error of the float32 reference (fp8: within FP8_REL_L2 of its emulation,
    ``xstage.moe_reference.check_close``; each landed row is one (token, slot) item of the reference). Returns
    {gpu: the landed rows, [n, Hd] in source-major (source, slot, token) order} (for bit-identity checks)."""
    c, s = prob.case, prob.case.shape
    reference = weight_seed is not None
    out = {}
    for g in world.base.local_ranks:
        me = world.played[g]
        dev = world.device(me)
        pk = prob.inputs[me].pushes
        got, xs, ids, wts = [], [], [], []
        for j in range(world.traffic_ranks):
            comb = world.slot(bufs.combine, g, j)[: s.topk * c.tokens * s.hidden].view(s.topk, c.tokens, s.hidden)
            comb = comb.to(dev)
            m = landing(world, prob, g, j).to(dev)
            stray = torch.isnan(comb[~m]).logical_not().any(1)
            if stray.any():
                k, t = (int(v) for v in torch.nonzero(~m)[int(torch.nonzero(stray)[0])])
                raise AssertionError(f"{what}: GPU {g} (rank {me}) slot {j}: {int(stray.sum())} row(s) written "
                                     f"that no played owner stores there; first (slot, token) = ({k}, {t})")
            slot, tok = torch.nonzero(m, as_tuple=True)
            got.append(comb[slot, tok])
            if reference and slot.numel():
                xs.append(pk.x[j][tok])                 # (no row lands in the peer's slot: j != L_peer)
                ids.append(prob.ids[j].to(dev)[tok, slot])
                wts.append(prob.wts[j].to(dev)[tok, slot])
        rows = torch.cat(got)
        if reference and xs:
            ref_w = reference_weights(s.hidden, s.intermediate, weight_seed, dev, prob.dtype)
            x, i, w = torch.cat(xs), torch.cat(ids)[:, None], torch.cat(wts)[:, None]
            ref = moe_reference(x, i, w, ref_w, fp8=prob.dtype == "fp8")
            pt = None if prob.dtype == "fp8" else moe_reference(x, i, w, ref_w, dtype=OUT_DTYPES[prob.dtype])
            check_close(rows[None], ref, pt, prob.dtype, f"{what} GPU {g} (rank {me}), landed rows")
        out[g] = rows
    return out


def check_schedules(world: TrafficWorld, prob, bufs, lists: Mapping[int, Mapping], schedules: Sequence[str], tiles,
                    dynamic: bool = False, weight_seed: int | None = None, assignments: Sequence[str] | None = None,
                    n_programs: int | None = None) -> dict:
    """Run the layer once per schedule (and assignment), every combine slot poisoned first: the first run's rows
    land where :func:`check_landing` says (against the float32 reference, given ``weight_seed``), every later
    run's landed rows are bit-identical to the first's. ``lists[r][schedule]``: local rank r's task lists.
    ``assignments``: each schedule with each of them (default: ``dynamic`` or static). Returns {gpu: the first
    run's landed rows}. No unfused baseline: an 8-rank all-to-all has no 2-GPU equivalent."""
    assignments = tuple(assignments or (("dynamic",) if dynamic else ("static",)))
    first: dict = {}
    compiled: set = set()
    c = prob.case
    for sched in schedules:
        tasks = {r: lists[r][sched] for r in world.local_ranks}
        for a in assignments:
            if not world.emulated and a not in compiled:   # compile before any barrier waits on a peer (GPUs)
                dispatch(world, bufs, prob.inputs, barrier=False)
                run_experts(world, bufs, prob.inputs, tasks, tiles, barrier=False, check=False, n_programs=n_programs,
                            dynamic=a == "dynamic")
                world.barrier()
                compiled.add(a)
            poison(world, bufs)
            megamoe_layer(world, bufs, prob.inputs, tasks, tiles, n_programs=n_programs, dynamic=a == "dynamic")
            world.barrier()
            what = f"{c.name} (seed {c.seed}, weights {weight_seed}) {prob.dtype} {sched} {a} ({world.label})"

            def check():
                got = check_landing(world, prob, bufs, what, weight_seed if not first else None)
                if not first:
                    first.update(got)
                    return
                for g, rows in got.items():
                    check_bit_identical(rows, first[g], f"{what} GPU {g} vs {schedules[0]} {assignments[0]}")
            agree_on_checks(world, check)
            world.barrier()
    return first


def check_job(world: TrafficWorld, cases: Sequence, seed: int, dtype: str | None = None, tiles=None,
              schedules: Sequence[str] | None = None, n_sms: int | None = None,
              assignments: Sequence[str] = ("static",), n_programs: int | None = None) -> list[dict]:
    """``xstage.moe.check_job`` for a traffic world: per case, :func:`check_schedules` over every schedule and
    assignment (landing, the float32 reference, bit-identical runs). Returns one dict per (case, GPU) with what
    its GPU pushed and its egress (:func:`egress`)."""
    if not isinstance(world, TrafficWorld):
        raise ValueError("xstage.traffic.check_job needs a TrafficWorld")
    P = world.world_size
    dtype = dtype or default_dtype()
    validate_dtype(dtype)
    schedules = tuple(SCHEDULES if schedules is None else schedules)
    if not schedules or any(x not in SCHEDULES for x in schedules):
        raise ValueError(f"schedules must be a non-empty subset of {SCHEDULES}, got {list(schedules)}")
    if not assignments or any(a not in ASSIGNMENTS for a in assignments):
        raise ValueError(f"assignments must be a non-empty subset of {ASSIGNMENTS}, got {list(assignments)}")
    cases = [as_case(c, seed + i) for i, c in enumerate(cases)]
    validate_traffic(world.traffic_ranks, world.gpus, [c.shape.experts for c in cases])
    dev0 = world.device(world.local_ranks[0])
    sms = n_sms or (2 if env.interpreted() else torch.cuda.get_device_properties(dev0).multi_processor_count)
    results = []
    for c in cases:
        s = c.shape
        t = tiles or default_tiles(dtype, c.tokens * P * s.topk / s.experts)
        prob = make_problem(world, c, dtype, t, weight_seed=seed)
        bufs = moe_buffers(world, max(prob.cap_rows, 1), c.tokens, s.hidden, s.intermediate, s.topk,
                           s.experts // P, dtype, min_block_m=t.block_m)
        lists = {r: {x: build_tasks(prob, x, sms, r) for x in schedules} for r in world.local_ranks}
        check_schedules(world, prob, bufs, lists, schedules, t, weight_seed=seed, assignments=assignments,
                        n_programs=n_programs)
        eg = egress(world, prob.layouts, s.hidden, OUT_DTYPES[dtype].itemsize, ACT_DTYPES[dtype].itemsize,
                    fp8=dtype == "fp8")
        for g in world.base.local_ranks:
            pk = prob.inputs[world.played[g]].pushes
            results.append(dict(case=c.name, dtype=dtype, traffic_ranks=P, gpus=world.gpus, gpu=g,
                                rank=world.played[g], rows=prob.layouts[world.played[g]].rows,
                                pushed_remote=pk.remote_items, pushed_local=pk.local_items,
                                runs=len(schedules) * len(assignments),
                                **{k: v for k, v in eg[g].items() if k != "rank"}))
        del prob, bufs
        if dev0.type == "cuda":
            torch.cuda.empty_cache()
    return results


def gpu_check_job(world, traffic_ranks: int, cases: Sequence, seed: int, dtype: str, schedules: Sequence[str],
                  assignments: Sequence[str]) -> None:
    """:func:`check_job` on the traffic world over this process's GPU (``xstage.ranks.spawn`` runs it on 2 GPUs;
    tests/test_traffic8.py). Every GPU pushes remote rows and each owner's rows cross: checked here too."""
    world = TrafficWorld(world, traffic_ranks)
    res = check_job(world, cases, seed, dtype, schedules=schedules, assignments=assignments)
    for r in res:
        if not (r["pushed_remote"] > 0 and r["combine_remote"] > r["combine_local"]):
            raise AssertionError(f"{r['case']} GPU {r['gpu']}: nothing crossed ({r})")


class PlayedWorld:
    """A stand-in 2-rank base world for layout arithmetic only (no buffers, no devices)."""

    world_size = 2
    local_ranks = [0, 1]
    emulated = True
    link = "none"
