"""The combine's store pattern on a link: row segments at scattered rows against a contiguous stream (issue 15,
item 4, session 8).

Why: on the host link (pinned host memory over PCIe) the MegaMoE combine drains at 30-40 GB/s while the burst-gap
harness's contiguous 16-byte streams reach 51-52 GB/s (docs/lab-notebook.md, "The cost model on the host-link
record"). A Linear-2 tile stores BM rows x one segment of BN2 x 2 B (512 B bf16, 256 B fp8) at scattered (slot,
token) rows of a buffer with a row pitch of Hd x 2 B; this measures that pattern's sustained rate beside
contiguous stores of the same bytes into the same buffer, so the combine's rate in the cost model can be a
measured parameter.

Kernel -> launcher -> reference, in that order (the kernel is ``xstage.kernels.scatter_store``). Legend as the
kernel's: R rows, W int32 per row (pitch), BM rows per tile, S int32 per segment, NB = R / BM, NT tiles, P programs.

Patterns (``PATTERNS``), each covering every (row block, column block) once, so the destination must equal the
payload over [0, R W) bit for bit:
  contiguous  W = S (one segment per row), rows in order, tiles in order: tile t writes BM S contiguous int32
  segments    the pitch of the combine (W = Hd x 2 B / 4), rows in order, tiles in the combine's order
              (``TILE_SWIZZLE`` row blocks at a time, column blocks outer: moe_plan.TileGrid's order)
  scattered   as ``segments`` with the rows in a seeded random order (the (slot, token) rows of the combine)
  scattered4  as ``scattered`` with 4-byte stores (WIDE=False)
and ``stream`` (the harness's ``xstage.remote_store.launch_stream``: 16-byte stores, one long burst per program),
the reference every rate divides.
"""
from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import torch

from . import bench, env
from .kernels.scatter_store import row_segment_store_kernel
from .moe_plan import TILE_SWIZZLE
from .remote_store import POISON, destination_buffer, launch_stream, payload_reference

PATTERNS = ("contiguous", "segments", "scattered", "scattered4")
NUM_WARPS = 8                       # the MegaMoE kernel's
STREAM_WARPS = 4                    # the stream as data/h200x1/bandwidth.csv recorded it (128 rows x 16 B per step)
# The measurement (fixed before the run): the combine's segments (bf16 512 B, fp8 256 B) with bf16's and fp8's row
# blocks (BM 128 and 64), at Qwen3 / Flash / Mixtral's row pitch (Hd 4096: 8 KiB) and Pro's (Hd 7168: 14 KiB), into
# 128 MiB of host memory (the order of rank 0's remote combine bytes at T = 4096), and a small footprint (16 MiB).
SEGMENT_BYTES = (512, 256)
BLOCK_M = (128, 64)
PITCH_BYTES = (8192, 14336)
FOOTPRINT_BYTES = (128 << 20, 16 << 20)


# ------------------------------------------------------------------------------------------------ launcher
def plan(rows: int, pitch_bytes: int, seg_bytes: int, block_m: int, pattern: str, seed: int = 0
         ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(rows int32 [NB * BM], tiles int32 [NT, 2], pitch in int32) of ``pattern`` (module docstring) on the CPU;
    ValueError on a shape the kernel cannot store."""
    if pattern not in PATTERNS:
        raise ValueError(f"pattern must be one of {', '.join(PATTERNS)}, got {pattern!r}")
    if seg_bytes % 16 or seg_bytes < 16 or seg_bytes & (seg_bytes - 1):
        raise ValueError(f"seg_bytes must be a power of two >= 16, got {seg_bytes}")
    if block_m < 1 or block_m & (block_m - 1):
        raise ValueError(f"block_m must be a power of two, got {block_m}")
    if pattern == "contiguous":
        pitch_bytes = seg_bytes
    if pitch_bytes % seg_bytes:
        raise ValueError(f"pitch_bytes ({pitch_bytes}) must be a multiple of seg_bytes ({seg_bytes})")
    if rows < block_m or rows % block_m:
        raise ValueError(f"rows ({rows}) must be a positive multiple of block_m ({block_m})")
    nb, nseg = rows // block_m, pitch_bytes // seg_bytes
    order = torch.arange(rows, dtype=torch.int32)
    if pattern.startswith("scattered"):
        order = torch.randperm(rows, generator=torch.Generator().manual_seed(seed)).to(torch.int32)
    g = TILE_SWIZZLE if pattern != "contiguous" else 1
    tiles = [(rb, cb) for g0 in range(0, nb, g) for cb in range(nseg) for rb in range(g0, min(nb, g0 + g))]
    return order, torch.tensor(tiles, dtype=torch.int32).reshape(-1, 2), pitch_bytes // 4


def launch_row_segments(dst: torch.Tensor, rows: torch.Tensor, tiles: torch.Tensor, pitch: int, block_m: int,
                        seg_bytes: int, wide: bool = True, programs: int = 132, seed: int = 0,
                        num_warps: int = NUM_WARPS) -> None:
    """Store the tiles (``plan``) into ``dst`` (int32 [>= R W]; rows / tiles on dst's kernel device)."""
    s = seg_bytes // 4
    n = rows.numel() * pitch
    if dst.dtype != torch.int32 or dst.numel() < n:
        raise ValueError(f"dst must be int32 with >= {n} elements, got {dst.dtype} {dst.numel()}")
    if rows.numel() % block_m or tiles.ndim != 2 or tiles.shape[1] != 2 or pitch % s or programs < 1:
        raise ValueError("rows must be whole row blocks, tiles [NT, 2], pitch a multiple of the segment, "
                         "programs >= 1")
    if dst.data_ptr() % 16:
        raise ValueError("dst must be 16 B aligned")
    cols = torch.arange(s, dtype=torch.int32, device=rows.device)
    row_segment_store_kernel[(programs,)](dst.data_ptr(), rows, tiles, cols, tiles.shape[0], pitch, seed, BM=block_m,
                                          S=s, WIDE=wide, num_warps=num_warps)


# ----------------------------------------------------------------------------------------------- reference
@functools.lru_cache(maxsize=4)
def _reference(n: int, seed: int) -> torch.Tensor:
    return payload_reference(0, n, seed)


def check_destination(dst: torch.Tensor, n: int, seed: int, what: str) -> None:
    """``dst[:n]`` equals the payload over [0, n) bit for bit (every element written once, none left poisoned)."""
    got = dst[:n].cpu()
    want = _reference(n, seed)
    if not torch.equal(got, want):
        bad = (got != want).nonzero()
        raise AssertionError(f"{what}: {bad.numel()} of {n} int32 differ from the payload (first at {int(bad[0])}; "
                             f"{int((got == POISON).sum())} still poisoned)")


# -------------------------------------------------------------------------------------------- measurement
def cases() -> list[dict]:
    """The fixed grid: every (pattern, segment, row block, pitch, footprint), plus the stream per footprint."""
    out = [dict(pattern="stream", seg_bytes=16, block_m=0, pitch_bytes=0, footprint=f) for f in FOOTPRINT_BYTES]
    for f in FOOTPRINT_BYTES:
        for seg in SEGMENT_BYTES:
            for bm in BLOCK_M:
                out.append(dict(pattern="contiguous", seg_bytes=seg, block_m=bm, pitch_bytes=seg, footprint=f))
                for pitch in PITCH_BYTES:
                    for pat in PATTERNS[1:]:
                        if pat == "scattered4" and (f != FOOTPRINT_BYTES[0] or pitch != PITCH_BYTES[0]):
                            continue                       # the store width once, at the combine's size
                        out.append(dict(pattern=pat, seg_bytes=seg, block_m=bm, pitch_bytes=pitch, footprint=f))
    return out


def measure(target: str = "host", programs: int = 132, reps: int = 10, seed: int = 5, device=None) -> pd.DataFrame:
    """Every case of :func:`cases` on ``target`` ('host' or 'local'): checked bit for bit first (poisoned, one
    launch, compared with the payload), then ``reps`` timed launches (``bench.time_ms``). Rows in schema
    ``bandwidth`` (method ``row_<pattern>_p<pitch bytes>`` or ``sm_store`` for the stream; rows = BM, store_bytes =
    segment bytes, bytes = the bytes one launch writes). ``device``: the kernels' device (default cuda:0; the CPU
    under Triton's interpreter, for tests)."""
    if target not in ("host", "local"):
        raise ValueError(f"target must be 'host' or 'local', got {target!r}")
    if device is None:
        env.require_gpus(1, "the row-segment store measurement")
    dev = torch.device("cuda", 0) if device is None else torch.device(device)
    buf = destination_buffer(max(FOOTPRINT_BYTES) // 4, target, dev)
    out = []
    for c in cases():
        f = c["footprint"]
        if c["pattern"] == "stream":
            per = f // programs // (128 * 16) * (128 * 16)
            nbytes = per * programs
            fn = (lambda per=per: launch_stream(buf.data_ptr(), programs, per, 16, 128, STREAM_WARPS, seed=seed))
            method, rows_, seg = "sm_store", 128, 16
        else:
            rows_n = f // c["pitch_bytes"] // c["block_m"] * c["block_m"]
            rows, tiles, pitch = plan(rows_n, c["pitch_bytes"], c["seg_bytes"], c["block_m"], c["pattern"], seed)
            rows, tiles = rows.to(dev), tiles.to(dev)
            nbytes = rows_n * pitch * 4
            fn = (lambda rows=rows, tiles=tiles, pitch=pitch, c=c: launch_row_segments(
                buf, rows, tiles, pitch, c["block_m"], c["seg_bytes"], c["pattern"] != "scattered4", programs, seed))
            method, rows_, seg = f"row_{c['pattern']}_p{c['pitch_bytes']}", c["block_m"], c["seg_bytes"]
        buf.fill_(POISON)
        fn()
        torch.cuda.synchronize()
        check_destination(buf, nbytes // 4, seed, f"{method} BM {rows_} seg {seg} B, {nbytes} B on {target}")
        ms = bench.time_ms(fn, warmup=2, reps=reps)
        warps = STREAM_WARPS if method == "sm_store" else NUM_WARPS
        out += [dict(method=method, target=target, programs=programs, num_warps=warps, rows=rows_,
                     store_bytes=seg, bytes=nbytes, repeat=i, ms=m, gbps=nbytes / m / 1e6) for i, m in enumerate(ms)]
    return pd.DataFrame(out)


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """Median GB/s per (method, rows, store_bytes, bytes), and over the stream of the same bytes (same target)."""
    g = df.groupby(["target", "method", "rows", "store_bytes", "bytes"], sort=False).gbps.median().reset_index()
    stream = g[g.method == "sm_store"].set_index(["target", "bytes"]).gbps
    # the stream of the same footprint: its bytes are the footprint rounded down to whole loop steps
    ref = [float(stream.xs(t, level=0).iloc[np.argmin(np.abs(stream.xs(t, level=0).index.values - b))])
           for t, b in zip(g.target, g["bytes"])]
    return g.assign(over_stream=g.gbps / np.array(ref))


# ------------------------------------------------------------------- the same stores beside other work
BESIDE = ("alone", "copy")          # what runs on a second stream meanwhile (_background)
BESIDE_CALLS = 6                     # background launches queued before each timed store launch


def _background(kind: str, dev) -> "callable":
    """One launch of the background work on the current stream: ``copy`` a 1 GiB device-to-device copy (HBM-bound,
    ~0.6 ms; its blocks are small, so the store kernel's programs stay resident beside them), ``gemm`` a bf16
    8192^3 matmul (not in BESIDE: cuBLAS's programs fill the register file, so a store kernel would only queue
    behind it), ``alone`` nothing."""
    if kind == "alone":
        return lambda: None
    if kind == "copy":
        a = torch.empty(1 << 28, dtype=torch.int32, device=dev).random_()
        b = torch.empty_like(a)
        return lambda: b.copy_(a)
    if kind == "gemm":
        x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        y = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        out = torch.empty_like(x)
        return lambda: torch.mm(x, y, out=out)
    raise ValueError(f"beside must be one of {', '.join(BESIDE)}, got {kind!r}")


def measure_beside(target: str = "host", programs: int = 132, reps: int = 10, seed: int = 7) -> pd.DataFrame:
    """The combine's pattern (scattered 512 B segments, BM 128, pitch 8 KiB, 128 MiB) and the harness's stream,
    each timed on its own stream while BESIDE_CALLS launches of background work (``BESIDE``) were queued first on a
    second stream (the GEMMs of the fused kernel share the GPU with its combine stores: does the link's rate hold
    beside HBM or tensor-core work?). Each destination poisoned, stored once beside the work, checked bit for bit;
    then ``reps`` timed launches (CUDA events on the store stream). Rows in schema ``bandwidth`` with method
    ``<method>+<beside>``."""
    if target not in ("host", "local"):
        raise ValueError(f"target must be 'host' or 'local', got {target!r}")
    env.require_gpus(1, "the row-segment store measurement")
    dev = torch.device("cuda", 0)
    f = FOOTPRINT_BYTES[0]
    buf = destination_buffer(f // 4, target, dev)
    rows_n = f // 8192 // 128 * 128
    rows, tiles, pitch = plan(rows_n, 8192, 512, 128, "scattered", seed)
    rows, tiles = rows.to(dev), tiles.to(dev)
    per = f // programs // (128 * 16) * (128 * 16)
    stores = {"row_scattered_p8192": (lambda: launch_row_segments(buf, rows, tiles, pitch, 128, 512, True, programs,
                                                                  seed), rows_n * pitch * 4, 128, 512, NUM_WARPS),
              "sm_store": (lambda: launch_stream(buf.data_ptr(), programs, per, 16, 128, STREAM_WARPS, seed=seed),
                           per * programs, 128, 16, STREAM_WARPS)}
    side, main = torch.cuda.Stream(dev), torch.cuda.current_stream(dev)
    out = []
    for kind in BESIDE:
        with torch.cuda.stream(side):
            bg = _background(kind, dev)
        torch.cuda.synchronize()
        for method, (fn, nbytes, rows_, seg, warps) in stores.items():
            def once(fn=fn) -> float:
                with torch.cuda.stream(side):
                    for _ in range(BESIDE_CALLS):
                        bg()
                t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                t0.record(main)
                fn()
                t1.record(main)
                torch.cuda.synchronize()
                return t0.elapsed_time(t1)
            buf.fill_(POISON)
            once()
            check_destination(buf, nbytes // 4, seed, f"{method} beside {kind} on {target}")
            once()
            ms = [once() for _ in range(reps)]
            out += [dict(method=f"{method}+{kind}", target=target, programs=programs, num_warps=warps, rows=rows_,
                         store_bytes=seg, bytes=nbytes, repeat=i, ms=m, gbps=nbytes / m / 1e6)
                    for i, m in enumerate(ms)]
        del bg
        torch.cuda.empty_cache()
    return pd.DataFrame(out)


def summary_beside(df: pd.DataFrame) -> pd.DataFrame:
    """Median GB/s per store method and background (``<method>+<beside>``), and over the same stores alone."""
    g = df.assign(store=df.method.str.split("+").str[0], beside=df.method.str.split("+").str[1]).groupby(
        ["target", "store", "beside"], sort=False).gbps.median().reset_index()
    alone = g[g.beside == "alone"].set_index(["target", "store"]).gbps
    return g.assign(over_alone=g.gbps.to_numpy() / alone.reindex(pd.MultiIndex.from_frame(g[["target", "store"]]))
                    .to_numpy())
