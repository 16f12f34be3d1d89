"""Ulysses with 8-rank traffic on 2 GPUs (issue 13): one GPU's compute and egress of an 8-rank Ulysses layer.

At P = L ranks (L = ``traffic_ranks``, 8), rank r computes heads r * H/L .. over the full sequence, and the fused
epilogue (``xstage.kernels.attention``) stores each output row to the rank that owns it (S/L rows per owner): 7/8
of every rank's output is remote. :class:`xstage.traffic.TrafficWorld` carries that on 2 GPUs through the same
launchers and kernel (``xstage.ulysses``): GPU g plays logical rank L_g = g * L / 2 (L_0 = 0, L_1 = 4) with H/L
heads; the output out[j] [S/L, H, D] is a destination buffer, L slots on every GPU, and GPU g's pointer table
(``SymmTensor.table(L_g)``, which ``ulysses_buffers`` reads) sends the rows of every owner j != L_g to the peer's
slot j: the peer's real output for j = L_peer, a sink otherwise. So 7/8 of GPU g's output crosses the link (1/8 into
the peer's real output, 6/8 into sinks) and 1/8 stays local; the end-of-attention barrier takes the world's hook
(over the 2 GPUs). The pre-attention all-to-all is not fused: each GPU's q, k, v are the L-rank layer's rows for
its rank's heads, built on the host (as ``xstage.ulysses.check_job`` does for every world).

What a traffic layer leaves (:func:`landing`): the real out[L_g] holds the head groups of the ranks L_0 and L_1
(2 of 8 head groups), every other head group stays unwritten (poisoned rows stay poisoned); each sink
j on GPU g holds the peer's head group (rank L_peer's rows j * S/L ..); GPU g's slot of L_peer is never written.
:func:`check_layer` checks exactly that, bit for bit, against our attention of the played ranks (every GPU can
compute both: the inputs are seeded), and the CPU tests against the emulated 8-rank layer (``EmulatedWorld(8)``).

The serial baseline has no 2-GPU equivalent (an 8-rank all_to_all is not a 2-rank one). ``serial_bytes`` times the
bytes: our attention, then ONE 2-rank ``all_to_all_single`` in which GPU g sends 1/L of its output to itself and
(L-1)/L to the peer (:func:`a2a_splits`: the bytes rank L_g sends and receives at L ranks), then the L-rank
relayout. Its rows are not those the L-rank layer sends where they differ (GPU 1's own chunk is the last S/L rows,
not rank 4's), so its output is not the layer's: checked bit for bit is what it moved (every received chunk is the
sender's chunk), and it is labelled so everywhere. Every label says "8-rank traffic on 2 GPUs", never "8 GPUs".

Legend: L = traffic (logical) ranks, S = sequence, H = heads, Hl = H / L heads per GPU, D = head dim, Sl = S / L
rows per owner, L_g = the logical rank GPU g plays.
"""
from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Mapping, Sequence

import pandas as pd
import torch

from . import bench, data, env
from .numeric import check_bit_identical
from .ranks import require_world, spawn
from .resume import pending
from .traffic import TRAFFIC_RANKS, TrafficWorld, label, validate_traffic
from .ulysses import (H200_CONFIGS, MAX_POLLS, UlyssesShape, _as_shape, _random_inputs, alltoall_bytes,
                      attention_forward, attention_reference, check_barrier_status, check_close, default_config,
                      default_dtype, n_programs, relayout_received, sender_visible_ms, shapes_for, ulysses_buffers,
                      ulysses_fused, validate_shape, validate_torch_dtype)
from .ulysses_measure import epilogue_bursts, record_shape, tune_config

METHODS = ("fused", "serial_bytes", "attention_only")
METHOD_HELP = {
    "fused": "the fused layer (attention + the output rows stored to their owners) and the end-of-attention barrier "
             "over the 2 GPUs",
    "serial_bytes": "our attention, then one 2-rank NCCL all_to_all_single moving the bytes rank L_g moves at 8 "
                    "ranks (1/8 to itself, 7/8 to the peer) and the 8-rank relayout: the bytes only, not the layer's "
                    "output",
    "attention_only": "our attention alone (the GPU's H/8 heads over the full sequence)",
}


# ------------------------------------------------------------------------------------------------ validation
def validate(world, S: int, H: int, D: int) -> None:
    """One clear ValueError before anything is allocated or launched: a TrafficWorld, H and S divisible by its
    logical ranks (``xstage.ulysses.validate_shape`` at P = L)."""
    if not isinstance(world, TrafficWorld):
        raise ValueError(f"Ulysses with {TRAFFIC_RANKS}-rank traffic needs a xstage.traffic.TrafficWorld, got "
                         f"{type(world).__name__}")
    validate_traffic_shape(S, H, D, world.traffic_ranks)


def validate_traffic_shape(S: int, H: int, D: int, traffic_ranks: int) -> None:
    """``xstage.ulysses.validate_shape`` at P = ``traffic_ranks``, its error naming the traffic world."""

    try:
        validate_shape(S, H, D, traffic_ranks)
    except ValueError as e:
        raise ValueError(f"{label(traffic_ranks)}: {e} (the logical ranks)") from None


# ------------------------------------------------------------------------------------------- where rows land
def landing(world: TrafficWorld, gpu: int, slot: int) -> list[int]:
    """The head groups (logical ranks whose heads) that land in GPU ``gpu``'s slot ``slot`` of the output: both
    played ranks in the GPU's own output (slot L_g), the peer's rank in a sink, none in the slot of the peer's
    rank (the peer's real output is on the peer)."""
    me, peer = world.played[gpu], world.played[1 - gpu]
    return sorted(world.played) if slot == me else [] if slot == peer else [peer]


def egress(world: TrafficWorld, bufs, S: int, H: int, D: int) -> dict[int, dict]:
    """Per GPU (of this process) the bytes its fused kernel stores over the link and locally, from its pointer
    table (``bufs.out_table``: an entry inside the peer's memory is remote) and the layout (S/L rows per owner,
    H/L heads): ``remote``, ``local`` and ``remote_share`` ((L-1)/L)."""
    L = world.traffic_ranks
    base = bufs.out.handle.base
    size = base.local(world.base.local_ranks[0]).numel() * base.local(world.base.local_ranks[0]).element_size()
    row_bytes = (H // L) * D * bufs.out.local(world.local_ranks[0]).element_size()
    out = {}
    for g in world.base.local_ranks:
        me = world.played[g]
        tab = bufs.out_table[me].tolist()
        on_peer = [base.ptrs[1 - g] <= a < base.ptrs[1 - g] + size for a in tab]
        mine = [base.ptrs[g] <= a < base.ptrs[g] + size for a in tab]
        if not all(p or m for p, m in zip(on_peer, mine)):
            raise AssertionError(f"GPU {g}: an output table entry points at neither GPU's buffer: {tab}")
        remote = sum(on_peer) * (S // L) * row_bytes
        local = sum(mine) * (S // L) * row_bytes
        out[g] = dict(rank=me, remote=remote, local=local, remote_share=remote / max(remote + local, 1))
    return out


def slot_view(world: TrafficWorld, bufs, gpu: int, slot: int, S: int, H: int, D: int) -> torch.Tensor:
    """GPU ``gpu``'s slot ``slot`` of the output as [Sl, L, Hl, D] (head group j = rank j's heads)."""
    L = world.traffic_ranks
    return world.slot(bufs.out, gpu, slot)[: S // L * H * D].view(S // L, L, H // L, D)


def check_layer(world: TrafficWorld, bufs, S: int, H: int, D: int, o: Mapping[int, torch.Tensor], what: str) -> int:
    """Every slot on this process's GPUs, after a fused layer whose outputs were poisoned with NaN: the head groups
    of :func:`landing` bit for bit equal to ``o[r]`` (rank r's attention output [S, Hl, D], for both played ranks)
    at the slot's rows, every other element still NaN. Returns the elements checked."""
    L, Sl = world.traffic_ranks, S // world.traffic_ranks
    n = 0
    for g in world.base.local_ranks:
        for j in range(L):
            got = slot_view(world, bufs, g, j, S, H, D)
            dev = got.device
            land = landing(world, g, j)
            for r in land:
                check_bit_identical(got[:, r], o[r][j * Sl:(j + 1) * Sl].to(dev),
                                    f"{what}: GPU {g} (rank {world.played[g]}) slot {j}, head group {r}")
                n += got[:, r].numel()
            rest = [h for h in range(L) if h not in land]
            if rest and not torch.isnan(got[:, rest]).all():
                bad = [h for h in rest if not torch.isnan(got[:, h]).all()]
                raise AssertionError(f"{what}: GPU {g} (rank {world.played[g]}) slot {j}: head group(s) {bad} "
                                     f"written, which no played rank stores there")
    return n


# --------------------------------------------------------------------------------------------- the inputs
def layer_inputs(world: TrafficWorld, S: int, H: int, D: int, dtype: torch.dtype, seed: int, ranks: Sequence[int]
                 ) -> dict[int, tuple]:
    """{rank: (q, k, v)} [S, Hl, D] of the L-rank layer for ``ranks`` (played ranks): its inputs after the
    pre-attention all-to-all, built on the host from the layer's q, k, v [S, H, D] (seeded: the same on every GPU
    and in the emulated L-rank layer of the tests)."""

    Hl = H // world.traffic_ranks
    out = {}
    for r in ranks:
        dev = world.device(r)
        q_all, k_all, v_all = _random_inputs(UlyssesShape("traffic", S, H, D), dtype, dev, seed)
        out[r] = tuple(x[:, r * Hl:(r + 1) * Hl].contiguous() for x in (q_all, k_all, v_all))
    return out


# ------------------------------------------------------------------------------------------ the byte baseline
def a2a_splits(world: TrafficWorld, gpu: int, S: int, H: int, D: int) -> list[int]:
    """``serial_bytes``' split sizes (elements, in base-rank order; input = output: both GPUs send what they
    receive): 1/L of GPU g's output [S, Hl, D] to itself and (L-1)/L to the peer, each chunk a contiguous range of
    rows of its output (GPU 0: its first S/L rows to itself; GPU 1: its last S/L rows)."""
    L = world.traffic_ranks
    own, peer = S // L * (H // L) * D, (L - 1) * (S // L) * (H // L) * D
    return [own, peer] if gpu == 0 else [peer, own]


def serial_bytes_copies(world: TrafficWorld, o: Mapping[int, torch.Tensor], recv: Mapping[int, torch.Tensor]
                        ) -> None:
    """``serial_bytes``' all-to-all where one process drives both GPUs (the CPU tests): the same chunks by copies,
    recv[r] (rank r's receive buffer, [S, Hl, D]) = its chunk from base rank 0, then from base rank 1."""
    S, Hl, D = next(iter(o.values())).shape
    H = Hl * world.traffic_ranks
    for g in world.base.local_ranks:
        dst = recv[world.played[g]].reshape(-1)
        at = 0
        for h in range(world.gpus):                       # sender h, in base-rank order
            sp = a2a_splits(world, h, S, H, D)
            start = sum(sp[:g])
            dst[at:at + sp[g]].copy_(o[world.played[h]].reshape(-1)[start:start + sp[g]].to(dst.device))
            at += sp[g]


def expected_received(world: TrafficWorld, gpu: int, o: Mapping[int, torch.Tensor]) -> torch.Tensor:
    """What GPU ``gpu``'s ``serial_bytes`` receive buffer must hold (flat): each sender's chunk for it, in
    base-rank order (``o`` has both played ranks' outputs)."""
    S, Hl, D = next(iter(o.values())).shape
    H = Hl * world.traffic_ranks
    parts = []
    for h in range(world.gpus):
        sp = a2a_splits(world, h, S, H, D)
        start = sum(sp[:gpu])
        parts.append(o[world.played[h]].reshape(-1)[start:start + sp[gpu]])
    return torch.cat(parts)


def make_serial_bytes(world: TrafficWorld, rank: int, q, k, v, config, recv: torch.Tensor,
                      o_peer: torch.Tensor | None = None):
    """fn() -> [Sl, H, D]: ``serial_bytes`` of rank ``rank``: our attention, the 2-rank all-to-all of
    :func:`a2a_splits` (one process per GPU: NCCL ``all_to_all_single``; one process driving both GPUs, the CPU
    tests: :func:`serial_bytes_copies` with the peer's output ``o_peer`` computed before), then
    ``xstage.ulysses.relayout_received`` at L ranks."""

    S, Hl, D = q.shape
    L, g = world.traffic_ranks, world.gpu_of(rank)
    sp = a2a_splits(world, g, S, Hl * L, D)
    flat = recv.reshape(-1)
    peer = world.peer_of(rank)
    if world.emulated and o_peer is None:
        raise ValueError("one process driving both GPUs: serial_bytes needs the peer's output (o_peer)")
    recv_peer = torch.empty_like(recv) if world.emulated else None

    def run():
        o = attention_forward(q, k, v, config=config)
        if world.emulated:
            serial_bytes_copies(world, {rank: o, peer: o_peer}, {rank: recv, peer: recv_peer})
        else:
            world.dist.all_to_all_single(flat, o.reshape(-1), sp, sp)
        return relayout_received(recv, L, S, Hl, D)
    return run


# ------------------------------------------------------------------------------------------- correctness job
def check_job(world: TrafficWorld, cases: Sequence, seed: int, dtype: torch.dtype | None = None, config=None,
              max_polls: int | None = None) -> list[dict]:
    """For each case (an UlyssesShape or (S, H, D)): every slot of the output poisoned with NaN, the fused layer on
    the traffic world, then (1) :func:`check_layer` (bit for bit against our attention of both played ranks, the
    rest still NaN), (2) the real outputs' two head groups within 2x PyTorch's error of the float32 reference,
    (3) the bytes that crossed (:func:`egress`, (L-1)/L). Returns one dict per (case, GPU of this process)."""

    if not isinstance(world, TrafficWorld):
        raise ValueError("xstage.traffic_ulysses.check_job needs a TrafficWorld")
    L = world.traffic_ranks
    dtype = dtype or default_dtype()
    validate_torch_dtype(dtype)
    cases = [_as_shape(c) for c in cases]
    for c in cases:
        validate(world, c.S, c.H, c.D)
        (config or default_config(c.D)).validate()
    big = max(cases, key=lambda c: c.S // L * c.H * c.D)
    bufs = ulysses_buffers(world, big.S, big.H, big.D, dtype)
    results = []
    for i, c in enumerate(cases):
        S, H, D, Hl, Sl = c.S, c.H, c.D, c.H // L, c.S // L
        cfg = config or default_config(D)
        s_i = seed + 1000 * i
        qkv = layer_inputs(world, S, H, D, dtype, s_i, world.played)    # both played ranks, on every local GPU
        local = {r: qkv[r] for r in world.local_ranks}
        q, k, v = ({r: t[j] for r, t in local.items()} for j in range(3))
        if not world.emulated:   # compile before the first barrier, so that no GPU waits on its peer's compiler
            ulysses_fused(world, q, k, v, bufs, config=cfg, barrier=False)
            world.barrier()
        world.poison_destinations(bufs.out)
        world.barrier()
        ulysses_fused(world, q, k, v, bufs, config=cfg, max_polls=max_polls or MAX_POLLS)
        world.barrier()
        o = {r: attention_forward(*qkv[r], config=cfg) for r in world.played}   # (per GPU: both ranks' heads)
        what = f"{c.name} ({label(L, world.gpus)})"
        check_layer(world, bufs, S, H, D, o, what)
        eg = egress(world, bufs, S, H, D)
        dev = world.device(world.local_ranks[0])
        q_all, k_all, v_all = _random_inputs(c, dtype, dev, s_i)
        for g in world.base.local_ranks:
            me = world.played[g]
            heads = torch.cat([torch.arange(r * Hl, (r + 1) * Hl) for r in sorted(world.played)]).to(dev)
            rows = slice(me * Sl, (me + 1) * Sl)
            got = slot_view(world, bufs, g, me, S, H, D)[:, sorted(world.played)].reshape(Sl, -1, D).to(dev)
            ref = attention_reference(q_all[:, heads], k_all[:, heads], v_all[:, heads], rows=rows)
            pt = attention_reference(q_all[:, heads], k_all[:, heads], v_all[:, heads], rows=rows, upcast=False)
            err, err_pt = check_close(got, ref, pt, f"{what} GPU {g} (rank {me})")
            results.append(dict(case=c.name, S=S, H=H, D=D, traffic_ranks=L, gpus=world.gpus, gpu=g, rank=me,
                                rel_l2=err, rel_l2_torch=err_pt, straddles=bool(Sl % cfg.block_m),
                                **{kk: vv for kk, vv in eg[g].items() if kk != "rank"}))
        del qkv, local, q, k, v, o, q_all, k_all, v_all
    return results


def gpu_check_job(world, traffic_ranks: int, cases: Sequence, seed: int) -> None:
    """:func:`check_job` on the traffic world over this process's GPU (``xstage.ranks.spawn`` runs it on 2 GPUs:
    tests/test_traffic8_ulysses.py); every GPU's output must cross ((L-1)/L of its bytes remote)."""
    tw = TrafficWorld(world, traffic_ranks)
    for r in check_job(tw, cases, seed):
        if abs(r["remote_share"] - (traffic_ranks - 1) / traffic_ranks) > 1e-9:
            raise AssertionError(f"{r['case']} GPU {r['gpu']}: remote share {r['remote_share']} "
                                 f"(expected {traffic_ranks - 1}/{traffic_ranks})")


# ------------------------------------------------------------------------------------------------ the sweep
def _check_serial_bytes(world: TrafficWorld, rank: int, o: Mapping[int, torch.Tensor], recv: torch.Tensor, run,
                        what: str) -> None:
    """Before timing ``serial_bytes``: poison the receive buffer, run it once, every received chunk bit for bit
    the sender's (``o``: both played ranks' attention outputs, computed on this GPU)."""
    recv.fill_(float("nan"))
    world.barrier()
    run()
    world.barrier()
    check_bit_identical(recv.reshape(-1), expected_received(world, world.gpu_of(rank), o).to(recv.device),
                        f"{what} rank {rank}: serial_bytes received chunks")


def measure_shape(world: TrafficWorld, shape, bufs, methods: Sequence[str], repeats: int, warmup: int, config,
                  seed: int) -> tuple[dict, dict]:
    """({method: [(sender-visible ms, end-to-end ms)] per repeat} of this process's GPU, extras). One process per
    GPU (the sweep): the fused layer checked first (:func:`check_layer`, every slot poisoned), then
    ``serial_bytes``' movement; then every method warmed up and timed round-robin (``xstage.bench``). One process
    driving both GPUs (the CPU tests of the flow): both kernels run in the check, GPU 0's rank is timed."""

    L, S, H, D = world.traffic_ranks, shape.S, shape.H, shape.D
    Hl = H // L
    rank = world.local_ranks[0]
    what = f"{shape.name} P={L} ({world.label})"
    qkv = layer_inputs(world, S, H, D, bufs.dtype, seed, world.played)
    q, k, v = qkv[rank]
    every = {j: {r: qkv[r][j] for r in world.local_ranks} for j in range(3)}     # this process's ranks
    dev = world.device(rank)
    npg = n_programs(S, Hl, config)
    ts = torch.zeros(warmup + repeats, npg, 2, dtype=torch.int64, device=dev)
    if not world.emulated:   # compile both variants without the barrier (no GPU spins on its peer's compiler)
        ulysses_fused(world, {rank: q}, {rank: k}, {rank: v}, bufs, config=config, barrier=False)
        ulysses_fused(world, {rank: q}, {rank: k}, {rank: v}, bufs, config=config, barrier=False, ts={rank: ts[0]})
        world.barrier()
    world.poison_destinations(bufs.out)
    world.barrier()
    ulysses_fused(world, every[0], every[1], every[2], bufs, config=config)
    world.barrier()
    o = {r: attention_forward(*qkv[r], config=config) for r in world.played}
    check_layer(world, bufs, S, H, D, o, what)
    calls = [0]

    def fused():
        i = calls[0] % (warmup + repeats)
        calls[0] += 1
        ulysses_fused(world, {rank: q}, {rank: k}, {rank: v}, bufs, config=config, ts={rank: ts[i]}, check=False,
                      ranks=[rank])

    recv = torch.empty_like(q)
    fns = {"fused": fused, "attention_only": lambda: attention_forward(q, k, v, config=config)}
    if "serial_bytes" in methods:
        fns["serial_bytes"] = make_serial_bytes(world, rank, q, k, v, config, recv,
                                                o[world.peer_of(rank)] if world.emulated else None)
        _check_serial_bytes(world, rank, o, recv, fns["serial_bytes"], what)
    calls[0] = 0
    times = bench.round_robin_ms({m: fns[m] for m in methods}, repeats, warmup=warmup, before=world.barrier)
    res, extras = {}, {}
    for m in methods:
        e2e = times[m]
        if m == "fused":
            check_barrier_status(bufs, rank)
            sv = [sender_visible_ms(ts[warmup + i], npg) for i in range(repeats)]
            b = epilogue_bursts(ts[warmup + repeats - 1], S, Hl, D, L, rank, config, bufs.dtype.itemsize)
            if b is not None:
                extras["bursts"] = b
        else:
            sv = e2e
        res[m] = list(zip(sv, e2e))
    extras["egress"] = {str(g): e for g, e in egress(world, bufs, S, H, D).items()}
    world.barrier()
    return res, extras


def sweep_job(world, traffic_ranks: int, shapes: Sequence, folder: str, meta: dict, repeats: int, warmup: int,
              methods: Sequence[str], tune: bool, seed: int) -> None:
    """On each of the 2 GPUs (``xstage.ranks.spawn``): shapes not yet in ``folder`` checked, timed and appended
    (schema ``ulysses_traffic``; resumable, one shape at a time). ``world``: the base world of this process (a
    TrafficWorld is accepted as it is)."""

    tw = world if isinstance(world, TrafficWorld) else TrafficWorld(world, traffic_ranks)
    L = tw.traffic_ranks
    schema = data.ULYSSES_TRAFFIC
    csv, todo, _ = pending(tw, folder, schema, meta, shapes, lambda s: s.key(L))
    if not todo:
        return
    writer = tw.local_ranks[0] == 0
    big = max(todo, key=lambda s: s.S // L * s.H * s.D)
    dtype = torch.float16 if env.interpreted() else torch.bfloat16
    bufs = ulysses_buffers(tw, big.S, big.H, big.D, dtype)
    rank = tw.local_ranks[0]
    for shape in todo:
        Hl, dev = shape.H // L, tw.device(rank)
        choice = [H200_CONFIGS[shape.D][0] if not env.interpreted() else None]
        if tune and writer:
            g = torch.Generator(device=dev).manual_seed(seed)
            qq, kk, vv = (torch.randn(shape.S, Hl, shape.D, generator=g, device=dev).to(dtype) for _ in range(3))
            choice = [tune_config(qq, kk, vv, H200_CONFIGS[shape.D])]
            del qq, kk, vv
        if not tw.emulated:
            tw.dist.broadcast_object_list(choice, src=0)
        cfg = choice[0] or default_config(shape.D)
        res, extras = measure_shape(tw, shape, bufs, methods, repeats, warmup, cfg, seed)
        parts = [(res, extras["egress"])]
        if not tw.emulated:
            parts = [None] * L
            tw.dist.all_gather_object(parts, (res, extras["egress"]))   # one entry per GPU
        extras["egress"] = {g: e for _, eg in parts for g, e in eg.items()}        # every GPU's, from its table
        parts = [p[0] for p in parts]
        if writer:
            record_shape(csv, folder, schema, shape, L, parts, repeats, cfg, extras, traffic_ranks=L, gpus=tw.gpus)
            print(f"ulysses ({tw.label}): {shape.name} P={L} done ({cfg})", file=sys.stderr, flush=True)
        if dev.type == "cuda":
            torch.cuda.empty_cache()


def run(out: str | Path, traffic_ranks: int = TRAFFIC_RANKS, world_size: int = 2, shapes: Sequence | None = None,
        repeats: int = 10, warmup: int = 3, methods: Sequence[str] = METHODS, tune: bool = True, seed: int = 0,
        command: str = "", world: str = "gpus", link: str | None = None) -> Path:
    """``xstage sweep ulysses --traffic-ranks L``: Ulysses with L-rank traffic on 2 GPUs into ``out``/
    ulysses_traffic.csv (a folder of its own named traffic<L>, e.g. data/h200x2/traffic8); returns its path. Every
    parameter is validated (one clear error) before the GPUs are checked and anything launches."""

    if world != "gpus":
        raise ValueError(f"traffic ranks are for the gpus world (2 GPUs, NVLink peers), got world {world!r} "
                         f"(a one-GPU machine has no peer to carry {label(traffic_ranks)})")
    if link is not None:
        raise ValueError(f"link {link!r} is for --world one-gpu; {label(traffic_ranks)} crosses NVLink")
    validate_traffic(traffic_ranks, world_size)
    if Path(out).name != f"traffic{traffic_ranks}":
        raise ValueError(f"record {traffic_ranks}-rank traffic in a folder of its own named traffic{traffic_ranks} "
                         f"(e.g. data/h200x2/traffic{traffic_ranks}), got {out}")
    if (Path(out) / f"{data.ULYSSES.name}.json").exists():
        raise ValueError(f"{out} holds a {data.ULYSSES.name} sweep; record the {data.ULYSSES_TRAFFIC.name} one in "
                         f"another folder")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats}, {warmup}")
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods or "fused" not in methods:
        raise ValueError(f"methods must be a subset of {METHODS} with fused, got {list(methods)} (the FA and cuDNN "
                         f"methods are not run with {label(traffic_ranks)})")
    shapes = shapes_for(traffic_ranks) if shapes is None else list(shapes)
    if not shapes:
        raise ValueError(f"no shape runs on {traffic_ranks} logical ranks")
    for s in shapes:
        validate_traffic_shape(s.S, s.H, s.D, traffic_ranks)
    if len({s.key(traffic_ranks) for s in shapes}) != len(shapes):
        raise ValueError("shape names must be unique")
    side = Path(out) / f"{data.ULYSSES_TRAFFIC.name}.json"
    if side.exists():
        had = data.read_meta(side, data.ULYSSES_TRAFFIC).get("params", {})
        if had.get("traffic_ranks") != traffic_ranks:
            raise ValueError(f"{out} holds a sweep of traffic ranks {had.get('traffic_ranks')}; record traffic ranks "
                             f"{traffic_ranks} in another folder")
    require_world(world_size, f"the Ulysses sweep with {label(traffic_ranks, world_size)}", option="--ranks")
    env.apply_safe_env()

    params = dict(world=world, world_size=world_size, traffic_ranks=traffic_ranks, gpus=world_size,
                  played=[g * (traffic_ranks // world_size) for g in range(world_size)], label=label(traffic_ranks),
                  shapes=[asdict(s) for s in shapes], repeats=repeats, warmup=warmup, methods=list(methods),
                  method_help={m: METHOD_HELP[m] for m in methods}, tune=tune, seed=seed, source="gpu",
                  link="nvlink", transport="fused: peer stores; serial_bytes: NCCL all_to_all_single (2 ranks)",
                  timing="every method warmed up, then each repeat round-robin over the methods")
    meta = env.provenance(command, params)
    spawn(sweep_job, world_size, traffic_ranks, list(shapes), str(out), meta, repeats, warmup, list(methods), tune,
          seed)
    return Path(out) / f"{data.ULYSSES_TRAFFIC.name}.csv"


# ------------------------------------------------------------------------------------------------ prediction
def predicted_fused_over_serial(df, meta: dict, traffic_ranks: int = TRAFFIC_RANKS) -> pd.DataFrame:
    """What recorded 2-rank Ulysses rows ``df`` (schema ulysses, P = 2, one process per GPU; ``meta`` its sidecar)
    predict for the same shapes with ``traffic_ranks``-rank traffic on 2 GPUs. A model, computed, never measured;
    each shape anchored to its own P = 2 medians:

    - attention: the shape's ``attention_only`` time per wave of output tiles (ceil(tiles / SMs), tiles =
      cdiv(S, BLOCK_M) x heads per GPU, the shape's recorded BLOCK_M), times the waves of H / L heads;
    - the all-to-all: the shape's ``serial_triton - attention_only`` scaled by the law latency + bytes / rate fitted
      over every shape (least squares; bytes = ``xstage.ulysses.alltoall_bytes``), from the P = 2 bytes to the
      bytes GPU g sends with L-rank traffic ((L-1)/L of its [S, H/L, D] output: what ``serial_bytes`` moves);
    - the fused layer: the L-rank attention plus the shape's own ``fused - attention_only`` at P = 2 (the barrier and
      whatever of the drain is not hidden; 7/16 of the P = 2 bytes cross now), at least 0: where the recorded fused
      layer ran faster than attention alone (up to 6 %, the spread between timing blocks) it counts as 0, so that
      the noise is not carried to an attention four times shorter.

    Returns per shape the recorded ``measured_p2`` (serial_triton / fused), ``model_traffic`` (serial_bytes /
    fused with L-rank traffic) and ``bound_traffic`` ((attention + all-to-all) / attention: a fused layer that
    hides everything and pays nothing), with the times behind them (ms); ``attrs["alltoall_fit"]`` the law."""
    import numpy as np


    if set(df.P) != {2}:
        raise ValueError(f"predicted_fused_over_serial needs recorded P = 2 rows, got P = {sorted(set(df.P))}")
    sms = int(meta.get("sm_count") or 132)
    med = df.groupby(["shape", "S", "H", "D", "method"]).end_to_end_ms.median().unstack("method").reset_index()
    L = traffic_ranks

    def waves(S, heads, bm):
        return -(-(-(-S // bm) * heads) // sms)

    b2 = np.array([alltoall_bytes(r.S, r.H, r.D, 2) for r in med.itertuples()], dtype=float)
    comm2 = (med.serial_triton - med.attention_only).to_numpy()
    fit = np.linalg.lstsq(np.stack([np.ones_like(b2), b2], 1), comm2, rcond=None)[0]
    rows = []
    for r, b, c2 in zip(med.itertuples(), b2, comm2):
        if r.H % L or r.S % L:
            continue
        bm = int(meta.get("configs", {}).get(r.shape, {}).get("block_m", 128))
        attn8 = r.attention_only * waves(r.S, r.H // L, bm) / waves(r.S, r.H // 2, bm)
        b8 = (L - 1) * (r.S // L) * (r.H // L) * r.D * 2
        comm8 = c2 * (fit[0] + fit[1] * b8) / (fit[0] + fit[1] * b)
        over = max(r.fused - r.attention_only, 0.0)
        rows.append(dict(shape=r.shape, S=r.S, H=r.H, D=r.D, measured_p2=r.serial_triton / r.fused,
                         model_traffic=(attn8 + comm8) / (attn8 + over), bound_traffic=(attn8 + comm8) / attn8,
                         attention_ms_p2=r.attention_only, attention_ms_traffic=attn8, alltoall_ms_p2=c2,
                         alltoall_ms_traffic=comm8, fused_overhead_ms=over, bytes_p2=int(b), bytes_traffic=int(b8)))
    out = pd.DataFrame(rows)
    out.attrs["alltoall_fit"] = dict(latency_ms=float(fit[0]), gb_per_s=float(1e-6 / fit[1]) if fit[1] > 0
                                     else float("inf"))
    return out
