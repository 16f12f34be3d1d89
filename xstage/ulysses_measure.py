"""What every Ulysses measurement shares (the sweep, the attention ladder, the 8-rank traffic run): tuning our
attention's launch config, the overlapped baseline's head chunks, a shape's random inputs, the fused layer's
bit-for-bit check against attention + the all-to-all, the fused epilogue's per-program times split by where each
tile goes, and one shape's rows and sidecar entries (schema ``ulysses``, xstage.data).

Legend: S = sequence length, H = heads, Hl = H / P heads per rank, D = head dim, P = ranks.
"""
from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from . import bench, data
from .bench import median
from .numeric import check_bit_identical
from .ulysses import (AttnConfig, UlyssesBuffers, UlyssesShape, attention_flops, attention_forward, make_overlapped,
                      n_programs, post_all_to_all, post_all_to_all_copies, post_all_to_all_nccl, ulysses_fused)


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


def tune_chunks(world, q, k, v, config: AttnConfig, candidates: Sequence[int], reps: int = 3,
                rank: int | None = None) -> tuple[int, dict[int, float]]:
    """The overlapped baseline's fastest head-chunk count on this shape: every candidate timed (median of
    ``reps``; the max over ranks with one process per GPU, every rank timing each candidate together).
    Returns (chosen, {chunks: ms})."""
    times = {}
    for n in candidates:
        fn = make_overlapped(world, q, k, v, n, config, rank=rank)
        if not world.emulated:
            world.barrier()
        ms = median(bench.time_ms(fn, warmup=1, reps=reps))
        if not world.emulated:
            every = [None] * world.world_size
            world.dist.all_gather_object(every, ms)
            ms = max(every)
        times[n] = float(ms)
        del fn
    chosen = min(times, key=times.get)
    print(f"ulysses: overlapped S={q.shape[0]} Hl={q.shape[1]}: chunks {chosen} "
          f"({', '.join(f'{n}: {t:.3f} ms' for n, t in times.items())})", file=sys.stderr, flush=True)
    return chosen, times


def epilogue_bursts(ts: torch.Tensor, S: int, Hl: int, D: int, P: int, rank: int, config: AttnConfig,
                    elem_bytes: int = 2) -> dict | None:
    """The fused kernel's programs of one timed run (``ts`` [n_programs, 2] global-timer ns), split by where
    their output tile goes: ``remote`` (every row owned by a peer), ``local`` (every row this rank's own),
    ``straddle`` (both). Per kind: programs and the median / p10 / p90 program time (start -> last store
    issued, ns); and the most programs running at once, the tile's bytes (BLOCK_M x D), the kernel's span.
    None without device timers (the interpreter writes 0)."""
    t = ts.reshape(-1)[: 2 * n_programs(S, Hl, config)].view(-1, 2).cpu().numpy().astype(np.int64)
    if not ((t[:, 1] >= t[:, 0]).all() and t[:, 1].max() > t[:, 0].min()):
        return None
    n_m = -(-S // config.block_m)
    m = np.arange(len(t)) % n_m                                         # program id = head * n_m + query block
    Sl = S // P
    first, last = m * config.block_m // Sl, (np.minimum((m + 1) * config.block_m, S) - 1) // Sl
    kind = np.where(first != last, "straddle", np.where(first == rank, "local", "remote"))
    dur = (t[:, 1] - t[:, 0]).astype(float)
    ev = np.concatenate([np.stack([t[:, 0], np.ones(len(t))], 1), np.stack([t[:, 1], -np.ones(len(t))], 1)])
    ev = ev[np.lexsort((ev[:, 1], ev[:, 0]))]                           # ends before starts at equal times
    out = {"programs": int(len(t)), "concurrent_max": int(np.cumsum(ev[:, 1]).max()),
           "tile_bytes": int(config.block_m * D * elem_bytes), "span_ns": float(t[:, 1].max() - t[:, 0].min()),
           "block_m": config.block_m}
    for k in ("remote", "local", "straddle"):
        d = dur[kind == k]
        out[k] = ({"programs": int(len(d)), "median_ns": float(np.median(d)), "p10_ns": float(np.quantile(d, 0.1)),
                   "p90_ns": float(np.quantile(d, 0.9))} if len(d) else {"programs": 0})
    return out


def sidecar_key(shape: str, P: int) -> str:
    """The key of a shape's entries in the sidecar's ``configs`` / ``overlap_chunks`` / ``bursts``."""
    return f"{shape}/P{P}"


def make_inputs(world, shape: UlyssesShape, dtype: torch.dtype, seed: int, ranks: Sequence[int]) -> dict:
    """{rank: (q, k, v)} [S, Hl, D] for ``ranks``, each rank's own random draw (seed + rank)."""
    Hl, out = shape.H // world.world_size, {}
    for r in ranks:
        dev = world.device(r)
        g = torch.Generator(device=dev).manual_seed(seed + r)
        out[r] = tuple(torch.randn(shape.S, Hl, shape.D, generator=g, device=dev).to(dtype) for _ in range(3))
    return out


def check_fused(world, shape: UlyssesShape, bufs: UlyssesBuffers, qkv: dict, config: AttnConfig,
                 recv=None) -> dict:
    """Bit-exactness before any timing, every output poisoned with NaN first: the fused layer against our
    attention + the all-to-all. One process per GPU: NCCL, this rank. One process driving every rank: every
    rank's output against the all-to-all by indexing (the reference layout) and the copies baseline too
    (which leaves every peer's block in ``recv``, where the timed runs' relayout reads them). Returns
    {rank: the expected output} (one process driving every rank; {} otherwise)."""
    P, S, H, D = world.world_size, shape.S, shape.H, shape.D
    q, k, v = ({r: t[i] for r, t in qkv.items()} for i in range(3))
    what = f"{shape.name} P={P}"
    if world.emulated:
        for r in range(P):
            bufs.out_view(r, S, H, D).fill_(float("nan"))
        world.barrier()
        outs = ulysses_fused(world, q, k, v, bufs, config=config)
        world.barrier()
        local = {r: attention_forward(q[r], k[r], v[r], config=config) for r in range(P)}
        want = post_all_to_all([local[r] for r in range(P)])
        copies = post_all_to_all_copies(world, local, recv)
        for r in range(P):
            dev = want[r].device
            check_bit_identical(outs[r].to(dev), want[r], f"{what} rank {r}: fused vs attention + all-to-all")
            check_bit_identical(copies[r].to(dev), want[r], f"{what} rank {r}: all-to-all by copies vs indexing")
        return dict(enumerate(want))
    rank = world.local_ranks[0]
    # compile both variants without the barrier (no rank spins on a peer's compiler), then the checked layer
    ts = torch.zeros(n_programs(S, H // P, config), 2, dtype=torch.int64, device=world.device(rank))
    ulysses_fused(world, q, k, v, bufs, config=config, barrier=False)
    ulysses_fused(world, q, k, v, bufs, config=config, barrier=False, ts={rank: ts})
    world.barrier()
    bufs.out_view(rank, S, H, D).fill_(float("nan"))
    world.barrier()
    out = ulysses_fused(world, q, k, v, bufs, config=config)[rank]
    torch.cuda.synchronize()
    serial = post_all_to_all_nccl(attention_forward(q[rank], k[rank], v[rank], config=config), world)
    check_bit_identical(out, serial, f"{what} rank {rank}: fused vs attention + NCCL all-to-all")
    return {}


def record_shape(csv, folder, schema, shape: UlyssesShape, P: int, parts, repeats: int, cfg: AttnConfig,
                 extras: dict, **columns) -> None:
    """One shape's rows (every method and repeat; a time is the slowest rank's: ``parts`` holds each rank's
    {method: [(sender_visible_ms, end_to_end_ms)] per repeat}) appended to ``csv``, then its tuned config and
    ``extras`` into the sidecar under the shape's key. ``columns``: constant columns the schema adds."""
    flops = attention_flops(shape.S, shape.H, shape.D) / P
    rows = []
    for m in parts[0]:
        for i in range(repeats):
            sv = max(p[m][i][0] for p in parts)
            e2e = max(p[m][i][1] for p in parts)
            rows.append(dict(shape=shape.name, S=shape.S, H=shape.H, D=shape.D, P=P, method=m,
                             sender_visible_ms=sv, end_to_end_ms=e2e, repeat=i,
                             tflops=flops / (e2e * 1e-3) / 1e12, **columns))
    data.append_rows(csv, schema, pd.DataFrame(rows))
    side = Path(folder) / f"{schema.name}.json"
    m = data.read_meta(side, schema)
    key = sidecar_key(shape.name, P)
    m.setdefault("configs", {})[key] = asdict(cfg)
    for name, value in extras.items():
        m.setdefault(name, {})[key] = value
    data.write_json_atomic(side, m)
