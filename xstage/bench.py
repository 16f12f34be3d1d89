"""The one timing loop of xstage (CUDA events, warm-up, medians) and the peak-bandwidth benchmark.

``time_ms`` is what every benchmark and sweep uses; never write a second timing loop.
Peak bandwidth: SM remote stores (``stream_store_kernel`` through a peer pointer, several grid/warp/unroll
variants) against the copy engine's peer copy (``cudaMemcpyPeerAsync`` through ``Tensor.copy_`` across
devices) in the same run, plus local stores as a control.
"""
from __future__ import annotations

import statistics
from typing import Callable

import pandas as pd
import torch


def time_ms(fn: Callable[[], None], warmup: int = 3, reps: int = 10, device: torch.device | None = None
            ) -> list[float]:
    """Milliseconds of each of ``reps`` runs of ``fn`` (after ``warmup`` runs), timed with CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize(device)
    out = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end))
    return out


def median(xs: list[float]) -> float:
    return statistics.median(xs)


BW_PROGRAMS_PER_SM = (1, 2, 4, 8)
BW_WARPS = (4, 8, 16)
BW_UNROLL = (1, 2, 4)
BW_TMA_ROWS = (16, 32, 64)


def bandwidth_worker(world, out_rows: list, bytes_per_program: int = 4 << 20, reps: int = 10) -> None:
    """Rank 0 measures; the others wait. Appends rows (schema ``bandwidth``) to ``out_rows`` on rank 0."""
    from .remote_store import launch_stream, launch_stream_tma, payload_reference

    rank, dev = world.local_ranks[0], world.device(0)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    max_bytes = max(BW_PROGRAMS_PER_SM) * sms * bytes_per_program
    symm = world.symmetric_empty(max_bytes // 4, torch.int32)
    local = torch.empty(max_bytes // 4, dtype=torch.int32, device=dev)
    world.barrier()
    if rank == 0:
        peer = 1
        rows = []
        for target, addr in (("remote", symm.ptr(peer)), ("local", local.data_ptr())):
            for pps in BW_PROGRAMS_PER_SM:
                for warps in BW_WARPS:
                    for unroll in BW_UNROLL:
                        programs, r = pps * sms, 32 * warps * unroll
                        ms = time_ms(lambda: launch_stream(addr, programs, bytes_per_program, 16, r, warps),
                                     reps=reps)
                        total = programs * bytes_per_program
                        rows += [dict(method="sm_store", target=target, programs=programs, num_warps=warps, rows=r,
                                      store_bytes=16, bytes=total, repeat=i, ms=m, gbps=total / m / 1e6)
                                 for i, m in enumerate(ms)]
            for pps in BW_PROGRAMS_PER_SM[:3]:
                for tile_rows in BW_TMA_ROWS:
                    programs, total = pps * sms, pps * sms * bytes_per_program
                    ms = time_ms(lambda: launch_stream_tma(addr, programs, bytes_per_program, tile_rows, 64),
                                 reps=reps)
                    rows += [dict(method="sm_tma_store", target=target, programs=programs, num_warps=4,
                                  rows=tile_rows, store_bytes=tile_rows * 256, bytes=total, repeat=i, ms=m,
                                  gbps=total / m / 1e6) for i, m in enumerate(ms)]
        # both store paths write the payload bit for bit (checked on the local target)
        for launch in (lambda: launch_stream(local.data_ptr(), sms, bytes_per_program, seed=11),
                       lambda: launch_stream_tma(local.data_ptr(), sms, bytes_per_program, seed=11)):
            local.fill_(-1)
            launch()
            torch.cuda.synchronize()
            n = sms * bytes_per_program // 4
            if not torch.equal(local[:n].cpu(), payload_reference(0, n, 11)):
                raise AssertionError("stream store kernel wrote wrong data")
        # copy engine: a cross-device copy in this process (cudaMemcpyPeerAsync), same byte counts
        for total in sorted({pps * sms * bytes_per_program for pps in BW_PROGRAMS_PER_SM}):
            src = torch.randint(-2**31, 2**31 - 1, (total // 4,), dtype=torch.int32, device=dev)
            dst = torch.empty(total // 4, dtype=torch.int32, device=torch.device("cuda", peer))
            ms = time_ms(lambda: dst.copy_(src, non_blocking=True), reps=reps)
            torch.cuda.synchronize(dst.device)
            if not torch.equal(dst.cpu(), src.cpu()):
                raise AssertionError("copy-engine peer copy corrupted data")
            rows += [dict(method="ce_peer_copy", target="remote", programs=0, num_warps=0, rows=0, store_bytes=0,
                          bytes=total, repeat=i, ms=m, gbps=total / m / 1e6) for i, m in enumerate(ms)]
            del src, dst
        out_rows.extend(rows)
    world.barrier()


def bandwidth_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Median GB/s per variant; best SM remote-store variant over the copy engine (same run)."""
    med = (df.groupby(["method", "target", "programs", "num_warps", "rows", "bytes"], as_index=False)["gbps"]
           .median().sort_values("gbps", ascending=False))
    return med
