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

import torch


LEAD_CYCLES = 2_000_000   # a GPU-side wait of ~1-1.4 ms (H100 / H200 clocks) ahead of a timed run (``lead``)


def time_ms(fn: Callable[[], None], warmup: int = 3, reps: int = 10, device: torch.device | None = None,
            lead: bool = False) -> list[float]:
    """Milliseconds of each of ``reps`` runs of ``fn`` (after ``warmup`` runs), timed with CUDA events.

    The start event is recorded on an idle GPU, so a run's time includes the host's work to launch its first kernel
    (the rest hide behind the kernels before them). ``lead``: the GPU first waits LEAD_CYCLES (``torch.cuda._sleep``)
    ahead of the start event, so the host has queued the run before its clock starts: the GPU's time alone, as in
    a layer whose launches run ahead of the GPU (docs/findings.md, tooling)."""
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


def host_us(fn: Callable[[], None], calls: int = 20, rounds: int = 7, cycles_per_call: int = 1_000_000,
            device: torch.device | None = None) -> dict:
    """Host microseconds per call of ``fn`` with the GPU never the bottleneck: each round queues a GPU-side wait
    (``torch.cuda._sleep``, ``cycles_per_call`` cycles per call: ~0.5-0.7 ms on an H100 / H200, more than any call's
    host time), then times ``calls`` calls with the host clock (each launch is queued behind the wait, none waits on
    the GPU), then synchronizes. ``covered``: the wait was still running when the last call returned (an event
    recorded after the wait had not completed), in every round. Returns {"us": median over rounds, "rounds": [us per
    call each round], "covered": bool}."""
    import time

    fn()
    torch.cuda.synchronize(device)
    out, covered = [], True
    for _ in range(rounds):
        torch.cuda._sleep(calls * cycles_per_call)
        after_wait = torch.cuda.Event()
        after_wait.record()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        dt = time.perf_counter() - t
        covered &= not after_wait.query()
        torch.cuda.synchronize(device)
        out.append(dt / calls * 1e6)
    return {"us": statistics.median(out), "rounds": out, "covered": covered}


def median(xs: list[float]) -> float:
    return statistics.median(xs)
