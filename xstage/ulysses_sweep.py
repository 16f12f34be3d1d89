"""The Ulysses sweep: every shape checked bit for bit, the attention tuned, then every method timed on GPUs.

``run_ulysses`` is what ``xstage sweep ulysses`` calls. Two worlds (``WORLDS``):

- ``gpus``: one process per GPU (:func:`xstage.ranks.spawn`), NCCL all-to-alls; every rank times, the rows keep
  the max over ranks.
- ``one-gpu``: every rank of the layer in this process on ONE GPU (:class:`xstage.ranks.OneGPUWorld`), ranks run
  one after another; ``link="local"`` (every buffer in device memory: a compute-only control) or ``"host"`` (the
  peers' outputs and receive buffers in pinned host memory: the observed rank's remote stores cross PCIe). There
  is no NCCL: the serial and overlapped baselines send by copies (``xstage.ulysses.send_copies``: one
  asynchronous cudaMemcpy per destination, then the receiver's relayout). Only the observed rank (0) is timed:
  its fused kernel (plus the end-of-layer barrier of all ranks: 2P one-program launches), its attention, its
  share of the all-to-all; the peers' kernels and sends ran before, untimed.

Per shape the job tunes our attention (``tune_config`` over ``xstage.ulysses.H200_CONFIGS``), checks the fused
layer bit for bit against our attention + the all-to-all (NCCL, or by indexing and by copies in the one-GPU
world: every rank's output, poisoned with NaN first), picks the overlapped baseline's head-chunk count by timing
``xstage.ulysses.overlap_chunk_candidates`` (the times and the choice go to the sidecar, ``overlap_chunks``),
times every method of ``xstage.ulysses.METHODS`` and appends its rows (schema ``ulysses``, xstage.data;
resumable: shapes already recorded are skipped). With device timers the sidecar also gets the fused epilogue's
per-program times split by where the tile goes (``bursts``: tiles stored to a peer vs to this rank's own rows),
which ``xstage.ulysses_analysis.ulysses_bursts`` sets beside the stage model of the link.

FA-class methods (``xstage.fa4.METHODS``, the optional extra ``fa4``, Hopper only): ``fa`` (FA4 alone through its
interface, ``flash_attn_func``), ``fa_kernel`` (the same kernel launched as the fused one is, checked bit for bit),
``fa_serial`` (FA4, then the post-attention all-to-all as ``serial_*`` does it) and ``fa_fused`` (the all-to-all
fused into FA4's kernel, ``xstage.fa4.ulysses_fused_fa``, then the end-of-layer barrier; its sender-visible time
is CUDA events around the kernel alone, its end to end includes the barrier), timed round-robin beside ours and
cuDNN. Where FA4 is missing they are dropped with one line and the sidecar's ``params.fa4`` says so (``absent``);
a shape where an FA check fails keeps its other methods and names the error (``fa4_failed``).

Gluon methods (``xstage.ulysses_gluon.SWEEP_METHODS``, Hopper and Triton >= 3.5 only): ``gluon`` (our attention in
Gluon, ``SWEEP_CONFIGS[D]``), ``gluon_serial`` (it, then the all-to-all as ``serial_*``) and ``gluon_fused`` (the
all-to-all in its epilogue, ``xstage.ulysses_gluon.ulysses_fused``, then the end-of-layer barrier; sender-visible:
CUDA events around the kernel), checked as FA4's are (Gluon alone against our attention, the fused layer bit for bit
against Gluon alone + the all-to-all, outputs poisoned first) and timed in the same rounds. Where Gluon cannot run
they are dropped with one line (``params.gluon``: ``absent``); a failed check names its error (``gluon_failed``).
"""
from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import pandas as pd
import torch

from . import bench, data, env, fa4, ulysses_records
from . import ulysses_gluon as gluon
from .data import ULYSSES, ULYSSES_FUSED_OUTPUTS
from .numeric import check_bit_identical, rel_l2
from .ranks import ONE_GPU_LINKS, OneGPUWorld, require_one_process, require_world, spawn
from .resume import pending
from .sources import source_data
from .ulysses import (H200_CONFIGS, METHODS, AttnConfig, UlyssesBuffers, UlyssesShape, attention_forward,
                      check_barrier_status, default_dtype, make_overlapped, n_programs, overlap_chunk_candidates,
                      overlap_receive_buffers, post_all_to_all, post_all_to_all_nccl, receive_buffers,
                      relayout_received, sdpa_cudnn, send_copies, sender_visible_ms, shapes_for, ulysses_buffers,
                      ulysses_fused, validate_shape)
from .ulysses_measure import check_fused, epilogue_bursts, make_inputs, record_shape, tune_chunks, tune_config

WORLDS = ("gpus", "one-gpu")
WORLD_HELP = {"gpus": "one process per GPU, NCCL all-to-alls, peers over NVLink",
              "one-gpu": "every rank on one GPU, one after another; all-to-alls by copies (no NCCL)"}


def _overlapped_checked(world, qkv: dict, chunks: int, config: AttnConfig, rank: int, want: dict, what: str):
    """One process driving every rank: the overlapped pipeline of every rank over shared receive buffers, each
    run once (the peers' sends), then ``rank``'s checked bit for bit; returns ``rank``'s pipeline (timed: its
    relayout reads the peers' blocks of that first round)."""
    S, Hl, D = qkv[rank][0].shape
    recvs = overlap_receive_buffers(world, S, Hl, D, qkv[rank][0].dtype, chunks)
    fns = {r: make_overlapped(world, *qkv[r], chunks, config, rank=r, recvs=recvs) for r in qkv}
    for r in fns:
        if r != rank:
            fns[r]()
    got = fns[rank]()
    check_bit_identical(got, want[rank], f"{what} rank {rank}: overlapped ({chunks} head chunks) vs indexing")
    return fns[rank]


def _cudnn_ok(world, q, k, v, config: AttnConfig, name: str) -> bool:
    """Whether cuDNN SDPA runs here and agrees with our attention (on every rank, one process per GPU)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    try:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            err = rel_l2(sdpa_cudnn(q, k, v), attention_forward(q, k, v, config=config))
        ok, why = err < 2e-2, f"cuDNN SDPA differs from our attention by {err:.3g} (relative L2)"
    except RuntimeError as e:
        ok, why = False, f"cuDNN SDPA failed: {e}"
    oks = [ok]
    if not world.emulated:
        oks = [None] * world.world_size
        world.dist.all_gather_object(oks, ok)
    if not all(oks):
        print(f"ulysses: {name}: skipping the cuDNN baselines ({'another rank' if ok else why})", file=sys.stderr)
    return all(oks)


def _fa_methods(world, shape: UlyssesShape, bufs: UlyssesBuffers, qkv: dict, config: AttnConfig, rank: int,
                serial, n_calls: int) -> tuple[dict, list, dict]:
    """FA4's methods (``xstage.fa4.METHODS``), checked before any timing: FA alone against our attention
    (relative L2 below 2e-2, as for cuDNN), then the fused FA layer bit for bit against FA alone + the all-to-all,
    every output poisoned with NaN first (one process driving every rank: every rank's output, the all-to-all by
    indexing; one process per GPU: this rank's, NCCL). Returns ({method: fn}, events, failed): ``events[i]`` = (start,
    end) CUDA events around ``fa_fused``'s kernel in its i-th call (warm-ups included), the sender's view, and
    {method: error} for the FA methods that failed their check (not timed; all three when FA alone fails)."""
    P, S, H = world.world_size, shape.S, shape.H
    q, k, v = qkv[rank]
    what = f"{shape.name} P={P}"
    failed = {}
    try:
        err = rel_l2(fa4.attention(q, k, v), attention_forward(q, k, v, config=config))
        if not err < 2e-2:
            raise AssertionError(f"{what}: FA4 differs from our attention by {err:.3g} (relative L2)")
    except Exception as e:  # noqa: BLE001 (recorded: FA4 cannot run or is wrong here; nothing of it is timed)
        why = f"{type(e).__name__}: {e}"
        print(f"ulysses: {what}: FA4 methods not timed: {why}", file=sys.stderr, flush=True)
        return {}, [], {m: why for m in fa4.METHODS}
    try:   # FA's kernel launched directly is FA's interface, bit for bit
        check_bit_identical(fa4.attention_kernel(q, k, v), fa4.attention(q, k, v), f"{what}: FA kernel vs FA")
    except Exception as e:  # noqa: BLE001
        why = f"{type(e).__name__}: {e}"
        print(f"ulysses: {what}: fa_kernel not timed: {why}", file=sys.stderr, flush=True)
        failed["fa_kernel"] = why
    try:
        _check_fa_fused(world, shape, bufs, qkv, rank, what)
    except Exception as e:  # noqa: BLE001 (the fused kernel failed or differs: not timed, FA alone still is)
        why = f"{type(e).__name__}: {e}"
        print(f"ulysses: {what}: fa_fused not timed: {why}", file=sys.stderr, flush=True)
        failed["fa_fused"] = why
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n_calls)]
    calls = [0]

    def fused():
        i = calls[0] % n_calls
        calls[0] += 1
        fa4.ulysses_fused_fa(world, {rank: q}, {rank: k}, {rank: v}, bufs, check=False, ranks=[rank],
                             events=events[i])

    kout = torch.empty_like(q)
    fns = {"fa": lambda: fa4.attention(q, k, v), "fa_serial": lambda: serial(lambda: fa4.attention(q, k, v)),
           "fa_kernel": lambda: fa4.attention_kernel(q, k, v, out=kout), "fa_fused": fused}
    return {m: f for m, f in fns.items() if m not in failed}, events, failed


def _check_fa_fused(world, shape: UlyssesShape, bufs: UlyssesBuffers, qkv: dict, rank: int, what: str) -> None:
    """The fused FA layer bit for bit against FA alone + the all-to-all (``_check_fused_layer``)."""
    _check_fused_layer(world, shape, bufs, qkv, rank, f"{what}: FA", lambda *a, **kw: fa4.ulysses_fused_fa(*a, **kw),
                       fa4.attention)


def _check_fused_layer(world, shape: UlyssesShape, bufs: UlyssesBuffers, qkv: dict, rank: int, what: str, fused,
                       alone) -> None:
    """A fused layer ``fused(world, q, k, v, bufs, barrier=...)`` bit for bit against its attention alone
    (``alone(q, k, v)``) + the all-to-all, every output poisoned with NaN first (one process driving every rank:
    every rank's output, the all-to-all by indexing; one process per GPU: this rank's, NCCL)."""
    P, S, H = world.world_size, shape.S, shape.H
    q, k, v = qkv[rank]
    qd, kd, vd = ({r: t[i] for r, t in qkv.items()} for i in range(3))
    if world.emulated:
        for r in range(P):
            bufs.out_view(r, S, H, shape.D).fill_(float("nan"))
        world.barrier()
        outs = fused(world, qd, kd, vd, bufs)
        world.barrier()
        want = post_all_to_all([alone(*qkv[r]) for r in range(P)])
        for r in range(P):
            check_bit_identical(outs[r].to(want[r].device), want[r], f"{what} fused vs alone + all-to-all, rank {r}")
    else:
        fused(world, qd, kd, vd, bufs, barrier=False)    # compiled before any rank waits
        world.barrier()
        bufs.out_view(rank, S, H, shape.D).fill_(float("nan"))
        world.barrier()
        out = fused(world, qd, kd, vd, bufs)[rank]
        torch.cuda.synchronize()
        check_bit_identical(out, post_all_to_all_nccl(alone(q, k, v), world),
                            f"{what} fused vs alone + NCCL all-to-all, rank {rank}")


def _gluon_methods(world, shape: UlyssesShape, bufs: UlyssesBuffers, qkv: dict, config: AttnConfig, rank: int,
                   serial, n_calls: int) -> tuple[dict, list, dict]:
    """The Gluon methods (``xstage.ulysses_gluon.SWEEP_METHODS``), checked before any timing as FA4's are: Gluon
    alone against our attention (relative L2 below 2e-2), then the fused Gluon layer bit for bit against Gluon alone +
    the all-to-all, every output poisoned with NaN first. Returns ({method: fn}, events, failed), as ``_fa_methods``."""
    P, S, H, D = world.world_size, shape.S, shape.H, shape.D
    q, k, v = qkv[rank]
    what = f"{shape.name} P={P}"
    cfg = gluon.sweep_config(D)
    failed = {}
    try:
        err = rel_l2(gluon.attention_forward(q, k, v, config=cfg), attention_forward(q, k, v, config=config))
        if not err < 2e-2:
            raise AssertionError(f"{what}: Gluon {cfg.label} differs from our attention by {err:.3g} (relative L2)")
    except Exception as e:  # noqa: BLE001 (recorded: Gluon cannot run or is wrong here; nothing of it is timed)
        why = f"{type(e).__name__}: {e}"
        print(f"ulysses: {what}: Gluon methods not timed: {why}", file=sys.stderr, flush=True)
        return {}, [], {m: why for m in gluon.SWEEP_METHODS}
    try:
        _check_fused_layer(world, shape, bufs, qkv, rank, f"{what}: Gluon",
                           lambda *a, **kw: gluon.ulysses_fused(*a, config=cfg, **kw),
                           lambda q, k, v: gluon.attention_forward(q, k, v, config=cfg))
    except Exception as e:  # noqa: BLE001 (the fused kernel failed or differs: not timed, Gluon alone still is)
        why = f"{type(e).__name__}: {e}"
        print(f"ulysses: {what}: gluon_fused not timed: {why}", file=sys.stderr, flush=True)
        failed["gluon_fused"] = why
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n_calls)]
    calls = [0]

    def fused():
        i = calls[0] % n_calls
        calls[0] += 1
        gluon.ulysses_fused(world, {rank: q}, {rank: k}, {rank: v}, bufs, cfg, check=False, ranks=[rank],
                            events=events[i])

    fns = {"gluon": lambda: gluon.attention_forward(q, k, v, config=cfg),
           "gluon_serial": lambda: serial(lambda: gluon.attention_forward(q, k, v, config=cfg)), "gluon_fused": fused}
    return {m: f for m, f in fns.items() if m not in failed}, events, failed


def _measure_shape(world, shape: UlyssesShape, bufs: UlyssesBuffers, methods, repeats: int, warmup: int,
                   config: AttnConfig, chunks: int | None, seed: int) -> tuple[dict, dict]:
    """({method: [(sender-visible ms, end-to-end ms)] per repeat} of the measured rank (this process's rank;
    the observed rank of a one-process world), {"overlap_chunks": ..., "bursts": ...}). The fused layer is
    checked bit for bit first."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    P, S, H, D = world.world_size, shape.S, shape.H, shape.D
    Hl = H // P
    rank = getattr(world, "observed", 0) if world.emulated else world.local_ranks[0]
    qkv = make_inputs(world, shape, bufs.dtype, seed, range(P) if world.emulated else [rank])
    recv = receive_buffers(world, S, Hl, D, bufs.dtype) if world.emulated else None
    want = check_fused(world, shape, bufs, qkv, config, recv)
    q, k, v = qkv[rank]
    dev = world.device(rank)
    npg = n_programs(S, Hl, config)
    ts = torch.zeros(warmup + repeats, npg, 2, dtype=torch.int64, device=dev)
    calls = [0]

    def fused():
        i = calls[0] % (warmup + repeats)
        calls[0] += 1
        ulysses_fused(world, {rank: q}, {rank: k}, {rank: v}, bufs, config=config, ts={rank: ts[i]}, check=False,
                      ranks=[rank])

    if world.emulated:   # this rank's sends by copies and its relayout; the peers' blocks came in the check
        def serial(attn):
            send_copies(world, rank, attn(), recv)
            return relayout_received(recv.local(rank), P, S, Hl, D)
    else:
        nccl_recv = torch.empty_like(q)

        def serial(attn):
            return post_all_to_all_nccl(attn(), world, nccl_recv)
    extras = {}
    if "overlapped" in methods:
        if chunks is None:
            n, times = tune_chunks(world, q, k, v, config, overlap_chunk_candidates(Hl), rank=rank)
            extras["overlap_chunks"] = {"chosen": n, "ms": {str(c): t for c, t in times.items()}, "tuned": True}
        else:
            n = chunks
            extras["overlap_chunks"] = {"chosen": n, "tuned": False}
    fns = {
        "fused": fused,
        "serial_triton": lambda: serial(lambda: attention_forward(q, k, v, config=config)),
        "serial_cudnn": lambda: serial(lambda: sdpa_cudnn(q, k, v)),
        "overlapped": (None if "overlapped" not in methods else
                       _overlapped_checked(world, qkv, n, config, rank, want, f"{shape.name} P={P}")
                       if world.emulated else make_overlapped(world, q, k, v, n, config)),
        "attention_only": lambda: attention_forward(q, k, v, config=config),
        "sdpa_only": lambda: sdpa_cudnn(q, k, v),
    }
    fa_events = []
    if any(m in fa4.METHODS for m in methods):
        fa_fns, fa_events, failed = _fa_methods(world, shape, bufs, qkv, config, rank, serial, warmup + repeats)
        fns.update(fa_fns)
        if failed:   # recorded as absent with the error (no rows), the other methods still timed
            extras["fa4_failed"] = failed
            methods = [m for m in methods if m not in failed]
    gluon_events = []
    if any(m in gluon.SWEEP_METHODS for m in methods):
        g_fns, gluon_events, failed = _gluon_methods(world, shape, bufs, qkv, config, rank, serial, warmup + repeats)
        fns.update(g_fns)
        if failed:
            extras["gluon_failed"] = failed
            methods = [m for m in methods if m not in failed]
    if any("cudnn" in m or "sdpa" in m for m in methods) and not _cudnn_ok(world, q, k, v, config, shape.name):
        methods = [m for m in methods if "cudnn" not in m and "sdpa" not in m]
    # every method warmed up (and compiled) first, then the repeats round-robin over the methods, so that a
    # drift of the GPU's clocks over the run falls on every method alike (timing them one block after another
    # gave later methods a different clock, docs/findings.md)
    calls[0] = 0
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        times = bench.round_robin_ms({m: fns[m] for m in methods}, repeats, warmup=warmup, before=world.barrier)
    res = {}
    for m in methods:
        e2e = times[m]
        if m == "fused":
            for r in (range(P) if world.emulated else [rank]):
                check_barrier_status(bufs, r)
            sv = [sender_visible_ms(ts[warmup + i], npg) for i in range(repeats)]
            b = epilogue_bursts(ts[warmup + repeats - 1], S, Hl, D, P, rank, config,
                                bufs.out.local(rank).element_size())
            if b is not None:
                extras["bursts"] = b
        elif m == "fa_fused":   # the sender's view: CUDA events around the kernel (before the barrier), same clock
            check_barrier_status(bufs, rank)
            sv = [fa_events[warmup + i][0].elapsed_time(fa_events[warmup + i][1]) for i in range(repeats)]
        elif m == "gluon_fused":   # as fa_fused: CUDA events around the kernel, then the barrier's status
            check_barrier_status(bufs, rank)
            sv = [gluon_events[warmup + i][0].elapsed_time(gluon_events[warmup + i][1]) for i in range(repeats)]
        else:
            sv = e2e
        res[m] = list(zip(sv, e2e))
    world.barrier()
    return res, extras


def ulysses_job(world, shapes: Sequence[UlyssesShape], folder: str, meta: dict, repeats: int, warmup: int,
                methods: Sequence[str], tune: bool, chunks: int | None, seed: int) -> None:
    """Runs on every rank (one process per GPU) or once (one process driving every rank): shapes not yet in
    ``folder`` are checked, timed and appended (one shape at a time)."""
    P = world.world_size
    rank = getattr(world, "observed", 0) if world.emulated else world.local_ranks[0]
    writer = world.local_ranks[0] == 0
    csv, todo, _ = pending(world, folder, ULYSSES, meta, shapes, lambda s: s.key(P))
    if not todo:
        return
    big = max(todo, key=lambda s: s.S // P * s.H * s.D)
    bufs = ulysses_buffers(world, big.S, big.H, big.D, default_dtype())
    for shape in todo:
        Hl, dev = shape.H // P, world.device(rank)
        choice = [H200_CONFIGS[shape.D][0]]
        if tune and (world.emulated or rank == 0):
            g = torch.Generator(device=dev).manual_seed(seed)
            q, k, v = (torch.randn(shape.S, Hl, shape.D, generator=g, device=dev).to(bufs.dtype) for _ in range(3))
            choice = [tune_config(q, k, v, H200_CONFIGS[shape.D])]
            del q, k, v
        if not world.emulated:
            world.dist.broadcast_object_list(choice, src=0)
        cfg = choice[0]
        res, extras = _measure_shape(world, shape, bufs, methods, repeats, warmup, cfg, chunks, seed)
        parts = [res]
        if not world.emulated:
            parts = [None] * P
            world.dist.all_gather_object(parts, res)
        if writer:
            record_shape(csv, folder, ULYSSES, shape, P, parts, repeats, cfg, extras)
            print(f"ulysses: {shape.name} P={P} done ({cfg})", file=sys.stderr, flush=True)
        if dev.type == "cuda":
            torch.cuda.empty_cache()


def check_outputs_placement(out: str | Path, link: str) -> None:
    """One clear error, before anything launches, where ``out`` holds a one-GPU host-link record whose fused
    outputs were elsewhere than this sweep puts them (``xstage.data.ulysses_fused_outputs``: device memory before
    commit 9b3934c, destination buffers since): the two placements never share a file. The local link keeps
    every buffer in device memory either way, so its records continue."""
    side = Path(out) / f"{ULYSSES.name}.json"
    if link != "host" or not side.is_file():
        return
    meta = data.read_meta(side, ULYSSES)
    for run in [meta, *meta.get("runs", [])]:
        placed = data.ulysses_fused_outputs(run)
        if placed != ULYSSES_FUSED_OUTPUTS:
            raise data.DataError(
                f"{side} was recorded with the fused outputs in {placed} (run of {run.get('date_utc', '?')}); this "
                f"sweep stores them in {ULYSSES_FUSED_OUTPUTS} buffers (pinned host memory for the host link's "
                f"peers): record into a new folder")


def fa4_methods(methods: Sequence[str]) -> tuple[list[str], dict]:
    """The methods that run here and the sidecar's ``fa4`` entry: FA4's methods are dropped, with one line on
    stderr, where ``xstage.fa4.available()`` says no (recorded as ``absent``: no rows, never a 0 time)."""
    ok, why = fa4.available()
    asked = [m for m in methods if m in fa4.METHODS]
    if ok:
        return list(methods), {"available": True, "why": why, "versions": fa4.versions(), "absent": []}
    print(f"ulysses: skipping {', '.join(asked)}: {why}", file=sys.stderr)
    kept = [m for m in methods if m not in fa4.METHODS]
    if not kept:
        raise RuntimeError(f"nothing to run: {why}")
    return kept, {"available": False, "why": why, "absent": asked}


def gluon_methods(methods: Sequence[str]) -> tuple[list[str], dict]:
    """The methods that run here and the sidecar's ``gluon`` entry: the Gluon methods are dropped, with one line on
    stderr, where ``xstage.ulysses_gluon.available()`` says no (recorded as ``absent``: no rows, never a 0 time)."""
    ok, why = gluon.available()
    asked = [m for m in methods if m in gluon.SWEEP_METHODS]
    configs = {str(D): c.label for D, c in gluon.SWEEP_CONFIGS.items()}
    if ok:
        return list(methods), {"available": True, "why": why, "configs": configs, "absent": []}
    print(f"ulysses: skipping {', '.join(asked)}: {why}", file=sys.stderr)
    kept = [m for m in methods if m not in gluon.SWEEP_METHODS]
    if not kept:
        raise RuntimeError(f"nothing to run: {why}")
    return kept, {"available": False, "why": why, "configs": configs, "absent": asked}


ALL_METHODS = METHODS + fa4.METHODS + gluon.SWEEP_METHODS   # what the sweep can time (the extras' where they run)


def run_ulysses(out: str | Path, world_size: int = 2, shapes: Sequence[UlyssesShape] | None = None,
                repeats: int = 10, warmup: int = 3, methods: Sequence[str] = ALL_METHODS, tune: bool = True,
                chunks: int | None = None, seed: int = 0, command: str = "", world: str = "gpus",
                link: str | None = None) -> Path:
    """Run (or resume) the Ulysses sweep into ``out``/ulysses.csv; returns its path. ``world``: ``gpus`` (one
    process per GPU, ``world_size`` GPUs) or ``one-gpu`` (``world_size`` ranks on one GPU, ``link`` "local" or
    "host"; see the module docstring). ``chunks``: the overlapped baseline's head chunks (None: timed per shape
    over the candidates, the fastest kept). Parameters are validated before the GPUs are checked and anything
    launches."""
    if world not in WORLDS:
        raise ValueError(f"world must be one of {', '.join(WORLDS)}, got {world!r}")
    if world == "one-gpu":
        link = "host" if link is None else link
        if link not in ONE_GPU_LINKS:
            raise ValueError(f"link must be one of {', '.join(ONE_GPU_LINKS)} for the one-GPU world, got {link!r}")
    elif link is not None:
        raise ValueError(f"link {link!r} is for --world one-gpu (the gpus world's peers are NVLink peers)")
    if world_size < 2:
        raise ValueError(f"world_size must be >= 2 (the all-to-all needs peers), got {world_size}")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats}, {warmup}")
    bad = [m for m in methods if m not in ALL_METHODS]
    if bad or not methods:
        raise ValueError(f"methods must be a non-empty subset of {ALL_METHODS}, got {list(methods)}")
    if chunks is not None and chunks < 1:
        raise ValueError(f"chunks must be >= 1, got {chunks}")
    # the default table is fitted to P (rounded, filtered, said on stderr); shapes given explicitly must fit
    shapes = shapes_for(world_size) if shapes is None else list(shapes)
    if not shapes:
        raise ValueError(f"no shape runs on {world_size} ranks")
    for s in shapes:
        validate_shape(s.S, s.H, s.D, world_size)
    if len({s.key(world_size) for s in shapes}) != len(shapes):
        raise ValueError("shape names must be unique")
    params = dict(world=world, world_size=world_size, shapes=[asdict(s) for s in shapes], repeats=repeats,
                  warmup=warmup, methods=list(methods), tune=tune, chunks=chunks, seed=seed, source="gpu",
                  timing="every method warmed up, then each repeat round-robin over the methods")
    methods = list(methods)
    if world == "one-gpu":
        check_outputs_placement(out, link)
        require_one_process("the one-GPU Ulysses sweep (--world one-gpu)")
        env.require_gpus(1, "the one-GPU Ulysses sweep")
        env.apply_safe_env()
        if any(m in fa4.METHODS for m in methods):   # after the GPU check: without GPUs that is the one error
            methods, params["fa4"] = fa4_methods(methods)
        if any(m in gluon.SWEEP_METHODS for m in methods):
            methods, params["gluon"] = gluon_methods(methods)
        params.update(link=link, observed=0, transport="copies (cudaMemcpyAsync per destination, then relayout)",
                      fused_outputs=ULYSSES_FUSED_OUTPUTS)
        meta = env.provenance(command, params)
        ulysses_job(OneGPUWorld(world_size, link), list(shapes), str(out), meta, repeats, warmup, list(methods),
                    tune, chunks, seed)
    else:
        require_world(world_size, "the Ulysses sweep", option="--ranks")
        if any(m in fa4.METHODS for m in methods):
            methods, params["fa4"] = fa4_methods(methods)
        if any(m in gluon.SWEEP_METHODS for m in methods):
            methods, params["gluon"] = gluon_methods(methods)
        params.update(link="nvlink", transport="NCCL all_to_all_single")
        meta = env.provenance(command, params)
        spawn(ulysses_job, world_size, list(shapes), str(out), meta, repeats, warmup, list(methods), tune, chunks,
              seed)
    return Path(out) / f"{ULYSSES.name}.csv"


def ulysses_data(source: str = "auto", machine: str = "h200x2", out: str | Path | None = None,
                 link: str | None = None, record: str | None = None) -> tuple[pd.DataFrame, dict]:
    """Ulysses attention rows (schema xstage.data.ULYSSES: per shape, method, repeat) and provenance;
    ``df.attrs["world"]`` says which world and link the rows come from (every Ulysses figure's title shows it).

    source:  recorded (xstage.ulysses_records.recorded_folder: data/<machine>/ulysses; with ``link``:
             data/<machine>/ULYSSES_ONE_GPU_RECORDS[link]/), gpu (run or resume the sweep into ``out``: on every
             visible GPU, or with ``link`` the one-GPU world, by default into <out>/ULYSSES_ONE_GPU_RECORDS[link]),
             or auto (gpu when the GPUs are visible, else recorded). There is no simulated source.
    machine: the folder under data/ (recorded); gpu ignores it (the default folder is named after this
             machine's GPUs, xstage.sources.default_out).
    out:     where a gpu sweep writes; a folder already holding a sweep resumes it.
    link:    None: one process per GPU (NCCL, NVLink peers); "local" / "host": the one-GPU world
             (xstage.ranks.OneGPUWorld: every rank on one GPU, the peers' outputs in device memory or in pinned
             host memory, all-to-alls by copies).
    record:  with ``link``, recorded only: another folder under data/<machine>/ than the link's record, e.g.
             ULYSSES_HOST_BEFORE_FIX (fused outputs in device memory; ``df.attrs["world"]`` says so).
    """
    ulysses_records.check_link(link, record, source)
    name = None if link is None else record or ulysses_records.ULYSSES_ONE_GPU_RECORDS[link]

    def run(folder: Path) -> None:
        if link is None:
            run_ulysses(folder, world_size=torch.cuda.device_count(),
                        command="xstage.ulysses_sweep.ulysses_data('gpu')")
        else:
            run_ulysses(folder, world="one-gpu", link=link,
                        command=f"xstage.ulysses_sweep.ulysses_data('gpu', link={link!r})")

    def gpu_folder(folder: Path) -> Path:
        return folder if link is None else folder / name

    df, meta, _ = source_data(source, data.ULYSSES, "the Ulysses study",
                              lambda: ulysses_records.recorded_folder(machine, link, record), run, out,
                              gpu_folder=gpu_folder if out is None else (lambda f: f))
    return ulysses_records.label_world(df, meta), meta
