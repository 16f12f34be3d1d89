"""The Ulysses sweep: every shape checked bit for bit, the attention tuned, then every method timed on GPUs.

``run_ulysses`` is what ``xstage sweep ulysses`` calls: it validates, starts one process per GPU
(:func:`xstage.ranks.spawn`) and runs ``ulysses_job`` on each. Per shape the job tunes our attention on rank 0
(``tune_config`` over ``xstage.ulysses.H200_CONFIGS``), checks the fused layer bit for bit against our attention
+ NCCL, times every method of ``xstage.ulysses.METHODS`` and appends its rows (schema ``ulysses``, xstage.data;
resumable: shapes already recorded are skipped).
"""
from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import pandas as pd
import torch

from . import bench, data, env
from .bench import median
from .data import ULYSSES
from .numeric import check_bit_identical, rel_l2
from .resume import pending
from .ulysses import (H200_CONFIGS, METHODS, OVERLAP_CHUNKS, AttnConfig, UlyssesBuffers, UlyssesShape,
                      attention_flops, attention_forward, check_barrier_status, default_dtype, make_overlapped,
                      n_programs, post_all_to_all_nccl, sdpa_cudnn, sender_visible_ms, shapes_for, ulysses_buffers,
                      ulysses_fused, validate_shape)


def tune_config(q, k, v, candidates: Sequence[AttnConfig], reps: int = 5) -> AttnConfig:
    """The fastest candidate for our attention on these inputs (GPU); candidates that fail to compile are
    skipped."""
    best, best_ms = None, float("inf")
    for cfg in candidates:
        try:
            ms = median(bench.time_ms(lambda: attention_forward(q, k, v, config=cfg), warmup=2, reps=reps))
        except Exception as e:  # noqa: BLE001 (e.g. triton OutOfResources: too much shared memory)
            print(f"ulysses: config {cfg} failed: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        print(f"ulysses: tune S={q.shape[0]} D={q.shape[2]} {cfg}: {ms:.3f} ms", file=sys.stderr, flush=True)
        if ms < best_ms:
            best, best_ms = cfg, ms
    if best is None:
        raise RuntimeError(f"no attention config compiled: {candidates}")
    return best


def _measure_shape(world, shape: UlyssesShape, bufs: UlyssesBuffers, methods, repeats: int, warmup: int,
                   config: AttnConfig, chunks: int, seed: int) -> dict[str, list[tuple[float, float]]]:
    """(sender-visible ms, end-to-end ms) per repeat for each method on this rank. Checks bit-exactness of the
    fused layer against our attention + NCCL before timing."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rank = world.local_ranks[0]
    P, S, H, D = world.world_size, shape.S, shape.H, shape.D
    Hl = H // P
    dev = world.device(rank)
    g = torch.Generator(device=dev).manual_seed(seed + rank)
    q, k, v = (torch.randn(S, Hl, D, generator=g, device=dev).to(bufs.dtype) for _ in range(3))
    npg = n_programs(S, Hl, config)
    ts = torch.zeros(warmup + repeats, npg, 2, dtype=torch.int64, device=dev)
    calls = [0]

    def fused():
        i = calls[0] % (warmup + repeats)
        calls[0] += 1
        ulysses_fused(world, {rank: q}, {rank: k}, {rank: v}, bufs, config=config, ts={rank: ts[i]}, check=False)

    # correctness before timing: compile both variants without the barrier (no rank spins on a peer's
    # compiler), then the checked layer, bit-exact against our attention + NCCL
    ulysses_fused(world, {rank: q}, {rank: k}, {rank: v}, bufs, config=config, barrier=False)
    ulysses_fused(world, {rank: q}, {rank: k}, {rank: v}, bufs, config=config, barrier=False, ts={rank: ts[0]})
    world.barrier()
    bufs.out_view(rank, S, H, D).fill_(float("nan"))
    world.barrier()
    out = ulysses_fused(world, {rank: q}, {rank: k}, {rank: v}, bufs, config=config)[rank]
    torch.cuda.synchronize()
    serial = post_all_to_all_nccl(attention_forward(q, k, v, config=config), world)
    check_bit_identical(out, serial, f"{shape.name} P={P} rank {rank}: fused vs attention + NCCL all-to-all")
    del serial

    recv = torch.empty_like(q)
    fns = {
        "fused": fused,
        "serial_triton": lambda: post_all_to_all_nccl(attention_forward(q, k, v, config=config), world, recv),
        "serial_cudnn": lambda: post_all_to_all_nccl(sdpa_cudnn(q, k, v), world, recv),
        "overlapped": make_overlapped(world, q, k, v, chunks, config),
        "attention_only": lambda: attention_forward(q, k, v, config=config),
        "sdpa_only": lambda: sdpa_cudnn(q, k, v),
    }
    if any("cudnn" in m or "sdpa" in m for m in methods):  # cuDNN SDPA must run here, on every rank
        try:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                err = rel_l2(sdpa_cudnn(q, k, v), attention_forward(q, k, v, config=config))
            ok = err < 2e-2
            why = f"cuDNN SDPA differs from our attention by {err:.3g} (relative L2)"
        except RuntimeError as e:
            ok, why = False, f"cuDNN SDPA failed: {e}"
        oks = [None] * world.world_size
        world.dist.all_gather_object(oks, ok)
        if not all(oks):
            print(f"ulysses: {shape.name}: skipping the cuDNN baselines on every rank (rank {rank}: "
                  f"{'ok' if ok else why})", file=sys.stderr)
            methods = [m for m in methods if "cudnn" not in m and "sdpa" not in m]
    res = {}
    for m in methods:
        world.barrier()
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            calls[0] = 0
            e2e = bench.time_ms(fns[m], warmup=warmup, reps=repeats)
        if m == "fused":
            check_barrier_status(bufs, rank)
            sv = [sender_visible_ms(ts[warmup + i], npg) for i in range(repeats)]
        else:
            sv = e2e
        res[m] = list(zip(sv, e2e))
    world.barrier()
    return res


def ulysses_job(world, shapes: Sequence[UlyssesShape], folder: str, meta: dict, repeats: int, warmup: int,
                methods: Sequence[str], tune: bool, chunks: int, seed: int) -> None:
    """Runs on every rank: shapes not yet in ``folder`` are checked, timed and appended (one shape at a time)."""
    rank, P = world.local_ranks[0], world.world_size
    csv, todo, _ = pending(world, folder, ULYSSES, meta, shapes, lambda s: s.key(P))
    if not todo:
        return
    big = max(todo, key=lambda s: s.S // P * s.H * s.D)
    bufs = ulysses_buffers(world, big.S, big.H, big.D, default_dtype())
    for shape in todo:
        Hl, dev = shape.H // P, world.device(rank)
        choice = [H200_CONFIGS[shape.D][0]]
        if tune and rank == 0:
            g = torch.Generator(device=dev).manual_seed(seed)
            q, k, v = (torch.randn(shape.S, Hl, shape.D, generator=g, device=dev).to(bufs.dtype) for _ in range(3))
            choice = [tune_config(q, k, v, H200_CONFIGS[shape.D])]
            del q, k, v
        world.dist.broadcast_object_list(choice, src=0)
        cfg = choice[0]
        res = _measure_shape(world, shape, bufs, methods, repeats, warmup, cfg, chunks, seed)
        parts = [None] * P
        world.dist.all_gather_object(parts, res)
        if rank == 0:
            flops = attention_flops(shape.S, shape.H, shape.D) / P
            rows = []
            for m in parts[0]:
                for i in range(repeats):
                    sv = max(p[m][i][0] for p in parts)
                    e2e = max(p[m][i][1] for p in parts)
                    rows.append(dict(shape=shape.name, S=shape.S, H=shape.H, D=shape.D, P=P, method=m,
                                     sender_visible_ms=sv, end_to_end_ms=e2e, repeat=i,
                                     tflops=flops / (e2e * 1e-3) / 1e12))
            data.append_rows(csv, ULYSSES, pd.DataFrame(rows))
            side = Path(folder) / f"{ULYSSES.name}.json"
            m = data.read_meta(side, ULYSSES)
            m.setdefault("configs", {})[shape.name] = asdict(cfg)
            data.write_json_atomic(side, m)
            print(f"ulysses: {shape.name} done ({cfg})", file=sys.stderr, flush=True)
        torch.cuda.empty_cache()


def run_ulysses(out: str | Path, world_size: int = 2, shapes: Sequence[UlyssesShape] | None = None,
                repeats: int = 10, warmup: int = 3, methods: Sequence[str] = METHODS, tune: bool = True,
                chunks: int = OVERLAP_CHUNKS, seed: int = 0, command: str = "") -> Path:
    """Run (or resume) the Ulysses sweep on ``world_size`` GPUs into ``out``/ulysses.csv; returns its path.
    Parameters are validated before the GPUs are checked and anything launches."""
    if world_size < 2:
        raise ValueError(f"world_size must be >= 2 (the all-to-all needs peers), got {world_size}")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats}, {warmup}")
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise ValueError(f"methods must be a non-empty subset of {METHODS}, got {list(methods)}")
    if chunks < 1:
        raise ValueError(f"chunks must be >= 1, got {chunks}")
    # the default table is fitted to P (rounded, filtered, said on stderr); shapes given explicitly must fit
    shapes = shapes_for(world_size) if shapes is None else list(shapes)
    if not shapes:
        raise ValueError(f"no shape runs on {world_size} ranks")
    for s in shapes:
        validate_shape(s.S, s.H, s.D, world_size)
    if len({s.key(world_size) for s in shapes}) != len(shapes):
        raise ValueError("shape names must be unique")
    env.require_gpus(world_size, "the Ulysses sweep")
    from .ranks import spawn

    params = dict(world_size=world_size, shapes=[asdict(s) for s in shapes], repeats=repeats, warmup=warmup,
                  methods=list(methods), tune=tune, chunks=chunks, seed=seed, source="gpu")
    meta = env.provenance(command, params)
    spawn(ulysses_job, world_size, list(shapes), str(out), meta, repeats, warmup, list(methods), tune, chunks, seed)
    return Path(out) / f"{ULYSSES.name}.csv"
