"""The one timing loop of xstage (CUDA events, warm-up, medians) and the peak-bandwidth benchmark.

``time_ms`` is what every benchmark and sweep uses; never write a second timing loop.
Peak bandwidth: SM stores (``stream_store_kernel`` through a peer pointer or a pinned host tensor's address,
several grid/warp/unroll variants) against the copy engine on the same link in the same run (peer copy
``cudaMemcpyPeerAsync``, device-to-host copy into pinned memory, both through ``Tensor.copy_``), plus local
stores as a control.
"""
from __future__ import annotations

import statistics
from typing import Callable, Mapping

import pandas as pd
import torch


LEAD_CYCLES = 2_000_000   # a GPU-side wait of ~1-1.4 ms (H100 / H200 clocks) ahead of a timed run (``lead``)


def time_ms(fn: Callable[[], None], warmup: int = 3, reps: int = 10, device: torch.device | None = None,
            lead: bool = False) -> list[float]:
    """Milliseconds of each of ``reps`` runs of ``fn`` (after ``warmup`` runs), timed with CUDA events.

    The start event is recorded on an idle GPU, so a run's time includes the host's work to launch its first kernel
    (the rest hide behind the kernels before them). ``lead``: the GPU first waits LEAD_CYCLES (``torch.cuda._sleep``)
    ahead of the start event, so the host has queued the run before its clock starts: the GPU's time alone, as in
    a layer whose launches run ahead of the GPU (docs/lab-notebook.md)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize(device)
    out = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if lead:
            torch.cuda._sleep(LEAD_CYCLES)
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end))
    return out


def round_robin_ms(fns: Mapping[str, Callable[[], None]], repeats: int, warmup: int = 1, settle: int = 0,
                   before: Callable[[], None] | None = None, lead: bool = False) -> dict[str, list[float]]:
    """Several methods timed side by side: each warmed up (``warmup`` runs, compiling it), then ``repeats`` rounds
    of one timed run of each method (after ``settle`` untimed runs of it), so that a drift of the GPU's clocks
    over the run falls on every method alike. ``before`` runs before every warm-up and timed run (a barrier);
    ``lead``: see :func:`time_ms`. Returns {method: [ms per round]}."""
    before = before or (lambda: None)
    for fn in fns.values():
        before()
        time_ms(fn, warmup=warmup, reps=0)
    out = {m: [] for m in fns}
    for _ in range(repeats):
        for m, fn in fns.items():
            before()
            out[m] += time_ms(fn, warmup=settle, reps=1, lead=lead)
    return out


def sustained_ms(fn: Callable[[], None], seconds: float, ms_hint: float) -> tuple[int, float]:
    """``fn`` run back to back for ``seconds`` (batches of ~50 ms, the host waiting on the batch before the last, so
    the GPU's queue never empties): (runs, ms per run from CUDA events around all of them). For readings that need
    a steady load (clocks, power: xstage.attention_clocks)."""
    import time

    batch = max(1, int(50.0 / max(ms_hint, 1e-3)))
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    n, prev, t0 = 0, None, time.monotonic()
    while time.monotonic() - t0 < seconds:
        for _ in range(batch):
            fn()
        n += batch
        ev = torch.cuda.Event()
        ev.record()
        if prev is not None:
            prev.synchronize()
        prev = ev
    end.record()
    torch.cuda.synchronize()
    return n, start.elapsed_time(end) / n


def median(xs: list[float]) -> float:
    return statistics.median(xs)


BW_PROGRAMS_PER_SM = (1, 2, 4, 8)
BW_WARPS = (4, 8, 16)
BW_UNROLL = (1, 2, 4)
BW_TMA_ROWS = (16, 32, 64)


def bandwidth_worker(world, out_rows: list, bytes_per_program: int = 4 << 20, reps: int = 10,
                     host_bytes_per_program: int = 1 << 20) -> None:
    """Rank 0 measures; the others wait. Appends rows (schema ``bandwidth``) to ``out_rows`` on rank 0.

    Targets: ``remote`` (peer over NVLink, with >= 2 ranks) against the copy engine's peer copy; ``host``
    (pinned host memory over PCIe, ``host_bytes_per_program`` per program: the link is ~7x slower) against the
    copy engine's device-to-host copy; ``local`` (this GPU's memory) as the control."""
    from .remote_store import destination_buffer, launch_stream, launch_stream_tma, payload_reference

    rank, dev = world.local_ranks[0], world.device(0)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    max_bytes = max(BW_PROGRAMS_PER_SM) * sms * bytes_per_program
    host_bytes = max(BW_PROGRAMS_PER_SM) * sms * host_bytes_per_program
    symm = world.symmetric_empty(max_bytes // 4, torch.int32) if world.world_size > 1 else None
    local = torch.empty(max_bytes // 4, dtype=torch.int32, device=dev)
    host = destination_buffer(host_bytes // 4, "host", dev)
    world.barrier()
    if rank == 0:
        rows = []
        targets = [("host", host.data_ptr(), host_bytes_per_program), ("local", local.data_ptr(), bytes_per_program)]
        if symm is not None:
            targets.insert(0, ("remote", symm.ptr(1), bytes_per_program))
        for target, addr, per_prog in targets:
            for pps in BW_PROGRAMS_PER_SM:
                for warps in BW_WARPS:
                    for unroll in BW_UNROLL:
                        programs, r = pps * sms, 32 * warps * unroll
                        ms = time_ms(lambda: launch_stream(addr, programs, per_prog, 16, r, warps), reps=reps)
                        total = programs * per_prog
                        rows += [dict(method="sm_store", target=target, programs=programs, num_warps=warps, rows=r,
                                      store_bytes=16, bytes=total, repeat=i, ms=m, gbps=total / m / 1e6)
                                 for i, m in enumerate(ms)]
            for pps in BW_PROGRAMS_PER_SM[:3]:
                for tile_rows in BW_TMA_ROWS:
                    programs, total = pps * sms, pps * sms * per_prog
                    ms = time_ms(lambda: launch_stream_tma(addr, programs, per_prog, tile_rows, 64), reps=reps)
                    rows += [dict(method="sm_tma_store", target=target, programs=programs, num_warps=4,
                                  rows=tile_rows, store_bytes=tile_rows * 256, bytes=total, repeat=i, ms=m,
                                  gbps=total / m / 1e6) for i, m in enumerate(ms)]
        # both store paths write the payload bit for bit, into device memory and into pinned host memory
        n = sms * host_bytes_per_program // 4
        for buf in (local, host):
            for launch in (lambda: launch_stream(buf.data_ptr(), sms, host_bytes_per_program, seed=11),
                           lambda: launch_stream_tma(buf.data_ptr(), sms, host_bytes_per_program, seed=11)):
                buf.fill_(-1)
                launch()
                torch.cuda.synchronize()
                if not torch.equal(buf[:n].cpu(), payload_reference(0, n, 11)):
                    raise AssertionError(f"stream store kernel wrote wrong data into {buf.device} memory")
        # copy engine, same byte counts: a cross-device copy in this process (cudaMemcpyPeerAsync), and a
        # device-to-host copy into pinned memory (cudaMemcpyAsync D2H)
        ce = [("ce_d2h_copy", "host", host_bytes_per_program)]
        if symm is not None:
            ce.insert(0, ("ce_peer_copy", "remote", bytes_per_program))
        for method, target, per_prog in ce:
            for total in sorted({pps * sms * per_prog for pps in BW_PROGRAMS_PER_SM}):
                src = torch.randint(-2**31, 2**31 - 1, (total // 4,), dtype=torch.int32, device=dev)
                dst = (torch.empty(total // 4, dtype=torch.int32, device=torch.device("cuda", 1))
                       if target == "remote" else host[: total // 4])
                ms = time_ms(lambda: dst.copy_(src, non_blocking=True), reps=reps)
                torch.cuda.synchronize()
                if not torch.equal(dst.cpu(), src.cpu()):
                    raise AssertionError(f"copy engine ({method}) corrupted data")
                rows += [dict(method=method, target=target, programs=0, num_warps=0, rows=0, store_bytes=0,
                              bytes=total, repeat=i, ms=m, gbps=total / m / 1e6) for i, m in enumerate(ms)]
                del src, dst
        out_rows.extend(rows)
    world.barrier()
