"""MegaMoE's compute-only studies on one GPU: the GEMM phases against the library and the schedules' order cost.

One process, one GPU (:class:`xstage.ranks.OneGPUWorld`, two ranks, link local: every combine store into rank 0's
own buffer), rank 0 timed, the 84 configurations of xstage.moe_plan.CASES in table order, per dtype:

- study ``library``: the Expert-Wave kernel's compute-only time with the default tiles (xstage.moe_plan.default_tiles;
  for fp8 also the other row block's tiles, ``bm_alt``) beside ``torch._grouped_mm`` (Linear-1, SwiGLU, Linear-2
  on the same rows) and, for fp8, ``torch._scaled_grouped_mm`` (rowwise scales, fast accumulation), in the same
  rounds. Before any timing each variant's whole layer (combine poisoned) is checked against the float32
  reference on rank 0 and the default's static and dynamic runs bit-identical on every rank; whether ``bm_alt``
  is bit-identical to the default goes into its row's note. A library call that fails is recorded with status
  ``unavailable`` and NaN times, never 0.
- study ``controls``: the default tiles' compute-only time of every schedule under the default assignment
  (dynamic), each list bit-identical to Expert-Wave static first (combine poisoned), in the same rounds, and one
  launch per list with per-task device timestamps (the task_* columns: what the order costs, tile by tile).

Every method of a configuration is timed round-robin (warm-up of all, then each round one run of each method):
clock drift between method blocks cannot favour one. One row per method (schema ``megamoe_gemm``, xstage.data),
appended per (study, configuration, dtype): resumable (``xstage.resume``). The analysis of the records is
xstage.megamoe_analysis (``controls``, ``library_ratios``).
"""
from __future__ import annotations

import dataclasses
import math
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from . import bench, data, env
from .data import MEGAMOE_GEMM
from .kernels.moe import megamoe_kernel, megamoe_tma_kernel
from .model import params_from_dict
from .moe import (MAX_POLLS, build_tasks, dispatch, hi_weights, make_problem, megamoe_layer, moe_buffers,
                  poison_combine, run_experts)
from .moe_reference import (check_close, dequantize_fp8, moe_reference, rank_weights)
from .moe_plan import (CASES, FP8_BLOCK, KIND_L1, LAG_VERSION, ORDER_VERSION, OUT_DTYPES, SCHEDULES, STALL_DEFAULT,
                       TILE_SWIZZLE, TILES_VERSION, WAIT_DEFAULT, CostModel, TileConfig, calibrate_rate, cases_by_name,
                       default_tiles, gemm_flops, gpu_tiles)
from .moe_unfused import _unfused_gemms, _unfused_plan
from .numeric import check_bit_identical
from .ranks import OneGPUWorld
from .resume import pending
from .sources import recorded_params

STUDIES = ("library", "controls")
DTYPES = ("bf16", "fp8")
ROUNDS = {"library": 10, "controls": 6}      # timed rounds (each times every method once)
CALLS_TARGET_MS = 2.0        # back-to-back calls per timed run (as the sweep), at most CALLS_MAX
CALLS_MAX = 16


def library_variants(dtype: str, d: TileConfig) -> dict[str, TileConfig]:
    """The tiles timed beside the library: the default ``d``, and for fp8 the other row block's default tiles
    (``bm_alt``: BM 64 <-> 128), so both row blocks of the BM rule are timed on every configuration."""
    out = {"default": d}
    if dtype == "fp8":
        out["bm_alt"] = gpu_tiles(dtype, 128 if d.block_m == 64 else 64)
    return out


def _rowwise_fp8(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """t [..., N, K] -> (e4m3 [..., N, K], float32 scales [..., N]): one scale per row (amax / 448)."""
    s = t.float().abs().amax(-1).clamp_min(1e-12) / torch.finfo(torch.float8_e4m3fn).max
    return (t.float() / s[..., None]).to(torch.float8_e4m3fn), s

def rowwise_weights(w_hi: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """(w1 [El, 2I, Hd], w2 [El, Hd, I]) bf16 -> the library's fp8 operands (q1t [El, Hd, 2I] column-major, s1
    [El, 2I], q2t [El, I, Hd], s2 [El, Hd]), quantised expert by expert (a float32 copy of every expert at once
    would not fit: DeepSeek-V4-Pro)."""
    w1, w2 = w_hi
    q1 = torch.empty(w1.shape, dtype=torch.float8_e4m3fn, device=w1.device)
    q2 = torch.empty(w2.shape, dtype=torch.float8_e4m3fn, device=w2.device)
    s1 = torch.empty(w1.shape[:2], dtype=torch.float32, device=w1.device)
    s2 = torch.empty(w2.shape[:2], dtype=torch.float32, device=w2.device)
    for e in range(w1.shape[0]):
        q1[e], s1[e] = _rowwise_fp8(w1[e])
        q2[e], s2[e] = _rowwise_fp8(w2[e])
    return q1.transpose(1, 2), s1, q2.transpose(1, 2), s2

def _add_library_methods(prob, inp, dtype, dev, study, flops, methods, info, rows, info_tail, wq=None) -> None:
    """The library baselines on the same rows (torch._grouped_mm, and torch._scaled_grouped_mm for FP8), each run
    once: into ``methods`` / ``info`` (``info_tail`` ends its info tuple) when torch can, else an "unavailable"
    row with the reason (recorded, never 0)."""
    s = prob.case.shape
    plan = _unfused_plan(inp, hi_weights(inp.weights))
    xg = torch.randn(prob.layouts[0].rows, s.hidden, device=dev).to(inp.x.dtype)   # bf16 (also for fp8)
    libs = {"torch._grouped_mm": lambda: _unfused_gemms(plan, xg)}

    def unavailable(name, e):
        rows.append(_row(prob, study, dtype, name, "", None, "", "", False, "unavailable",
                         f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", float("nan"), [], 0,
                         flops))

    if dtype == "fp8":
        try:
            libs["torch._scaled_grouped_mm"] = scaled_grouped_gemms(plan, hi_weights(inp.weights),
                                                                    prob.layouts[0].rows, s.hidden, dev, wq)
        except Exception as e:  # noqa: BLE001 - recorded, never 0
            unavailable("torch._scaled_grouped_mm", e)
    for n, fn in libs.items():
        try:
            fn()
            torch.cuda.synchronize()
            methods[n] = fn
            info[n] = (n, "", None, "", "", False, *info_tail)
        except Exception as e:  # noqa: BLE001 - recorded, never 0
            unavailable(n, e)

def scaled_grouped_gemms(p, w_hi: tuple[torch.Tensor, torch.Tensor], rows: int, hidden: int, dev,
                         wq: tuple[torch.Tensor, ...] | None = None) -> Callable[[], torch.Tensor]:
    """torch._scaled_grouped_mm Linear-1 (x rowwise-quantised, w1 per output channel), SwiGLU in bf16, the
    intermediate quantised per row, Linear-2, on ``rows`` expert-major rows; raises where torch cannot (the
    caller records "unavailable"). ``wq``: the weights already quantised (:func:`rowwise_weights`)."""
    fn = getattr(torch, "_scaled_grouped_mm", None)
    if fn is None:
        raise RuntimeError(f"torch {torch.__version__} has no torch._scaled_grouped_mm")
    q1t, s1, q2t, s2 = wq if wq is not None else rowwise_weights(w_hi)
    xq, xs = _rowwise_fp8(torch.randn(rows, hidden, device=dev))
    I = w_hi[1].shape[2]

    def run() -> torch.Tensor:
        gu = fn(xq, q1t, xs, s1, offs=p.offs, out_dtype=torch.bfloat16, use_fast_accum=True)   # [R, 2I]
        h = torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]
        hq, hs = _rowwise_fp8(h)
        return fn(hq, q2t, hs, s2, offs=p.offs, out_dtype=torch.bfloat16, use_fast_accum=True)
    return run

def _round_robin(methods: dict[str, Callable[[], None]], rounds: int) -> tuple[dict, int]:
    """{name: [ms per call] * rounds}, calls per timed run: every method warmed, then round by round."""
    for fn in methods.values():
        fn()
    torch.cuda.synchronize()
    probe = min(bench.median(bench.time_ms(fn, warmup=1, reps=3)) for fn in methods.values())
    inner = min(CALLS_MAX, max(1, math.ceil(CALLS_TARGET_MS / max(probe, 1e-3))))

    def calls(fn):
        def c():
            for _ in range(inner):
                fn()
        return c
    # settle=1: one untimed call first, so the switch from the previous method (its counters reset, L2
    # contents) stays outside the timed run
    ms = bench.round_robin_ms({n: calls(fn) for n, fn in methods.items()}, rounds, warmup=0, settle=1)
    return {n: [t / inner for t in v] for n, v in ms.items()}, inner

def _row(prob, study, dtype, method, variant, tiles, schedule, assignment, is_default, status, note, rel, times,
         inner, flops, task: dict | None = None):
    c, s = prob.case, prob.case.shape
    ms = float(np.median(times)) if times else float("nan")
    variant, schedule, assignment, note = (v or "-" for v in (variant, schedule, assignment, note))
    return dict(study=study, shape=s.name, hidden=s.hidden, intermediate=s.intermediate, experts=s.experts,
                topk=s.topk, tokens=c.tokens, routing=c.routing, seed=c.seed, P=len(prob.layouts), dtype=dtype,
                rank=0, rows=prob.layouts[0].rows, method=method, variant=variant,
                tiles=tile_label(tiles) if tiles is not None else "-", block_m=tiles.block_m if tiles else 0,
                block_n1=tiles.block_n1 if tiles else 0, block_n2=tiles.block_n2 if tiles else 0,
                block_k=tiles.block_k if tiles else 0, num_warps=tiles.num_warps if tiles else 0,
                num_stages=tiles.num_stages if tiles else 0, tma=bool(tiles.tma) if tiles else False,
                schedule=schedule, assignment=assignment,
                is_default=is_default, status=status, note=note[:200], rel_l2=rel, ms=ms,
                ms_min=float(np.min(times)) if times else float("nan"), n_timed=len(times), calls_per_run=inner,
                tflops=flops / (ms * 1e-3) / 1e12 if times else float("nan"),
                **{c: float((task or {}).get(c, float("nan"))) for c in data.MEGAMOE_TASK_COLUMNS})

def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors hold the same bits (xstage.numeric.check_bit_identical, as a yes / no)."""
    try:
        check_bit_identical(a, b, "")
    except AssertionError:
        return False
    return True

def _runs_bit_identical(world, bufs, prob, tiles, lists, what) -> dict:
    """Every task list of ``lists`` ({(schedule, assignment): {rank: tasks}}) run as the whole layer with
    ``tiles``, combine poisoned first; every rank's combine bit-identical to the first list's. Returns the first
    list's combine per rank."""
    first, lead = {}, None
    for (sched, assign), tasks in lists.items():
        lead = lead or f"{sched} {assign}"
        poison_combine(world, bufs, prob.case.tokens)
        megamoe_layer(world, bufs, prob.inputs, tasks, tiles, dynamic=assign == "dynamic")
        torch.cuda.synchronize()
        for r in world.local_ranks:
            comb = bufs.combine_view(r, prob.case.tokens)
            if r in first:
                check_bit_identical(comb, first[r], f"{what} rank {r}: {sched} {assign} vs {lead}")
            else:
                first[r] = comb.clone()
    return first

def task_stats(tl_, ts: torch.Tensor, n_programs: int) -> dict:
    """Per-task device timestamps of one launch (``ts`` [n_tasks, 2] ns: start, after the last store) and the
    launch's wait status -> the task_* columns (xstage.data.MEGAMOE_GEMM)."""
    t = ts.view(-1, 2)[: tl_.n_tasks].cpu().numpy().astype(np.float64)
    dur = t[:, 1] - t[:, 0]
    span = float(t[:, 1].max() - t[:, 0].min())
    l1 = tl_.tasks[:, 0] == KIND_L1
    polls = tl_.on(ts.device)[1][:, 4].cpu().numpy()[: tl_.n_tasks]
    return dict(task_l1_us=float(np.median(dur[l1])) / 1e3 if l1.any() else float("nan"),
                task_l2_us=float(np.median(dur[~l1])) / 1e3 if (~l1).any() else float("nan"),
                task_busy=float(dur.sum() / (n_programs * span)) if span > 0 else float("nan"),
                task_span_us=span / 1e3, task_waited=float((polls[~l1] > 0).mean()) if (~l1).any() else 0.0)

def _pairs(cases, dtypes) -> list[tuple]:
    """The fixed order of a study: shape by shape (the table's), each dtype, the shape's configurations in table
    order (weights are generated once per shape and dtype)."""
    shapes = list(dict.fromkeys(c.shape for c in cases))
    return [(c, d) for sh in shapes for d in dtypes for c in cases if c.shape == sh]

def _layer_weights_f32(prob) -> Callable:
    """e -> (w1, w2) in float32 from the weights the layer holds (every rank's, one process): what
    ``xstage.moe_reference.reference_weights`` regenerates from the seed (the same generator; for fp8 the same 128 x 128
    quantisation, dequantised), without generating every expert again per configuration."""
    El = prob.case.shape.experts // len(prob.layouts)

    def get(e: int):
        w = prob.inputs[e // El].weights
        le = e % El
        if prob.dtype == "fp8":
            return (dequantize_fp8(w.w1[le], w.w1s[le], FP8_BLOCK), dequantize_fp8(w.w2[le], w.w2s[le], FP8_BLOCK))
        return w.w1[le].float(), w.w2[le].float()
    return get

def tile_label(t: TileConfig) -> str:
    tma = " tma" if t.tma else ""
    return f"{t.block_m}x{t.block_n1}x{t.block_n2}x{t.block_k} w{t.num_warps} s{t.num_stages}{tma}"


def study_job(world, cases, dtypes, folder, meta, study: str, prm, deadline: float | None,
              rounds: int | None = None) -> None:
    """Study ``library`` or ``controls`` (module docstring) on rank 0 of ``world`` (one process): per (case, dtype)
    not yet in ``folder``, in :func:`_pairs` order, check, time, append; stops starting pairs after
    ``deadline``."""
    P = world.world_size
    csv, todo, _ = pending(world, folder, MEGAMOE_GEMM, meta, _pairs(cases, dtypes),
                           lambda cd: (study, *cd[0].key(P, cd[1])))
    dev = world.device(0)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    rounds = rounds or ROUNDS[study]
    for shape, dtype in dict.fromkeys((c.shape, d) for c, d in todo):
        if deadline is not None and time.time() > deadline:
            break
        t0 = time.perf_counter()
        s = shape
        w = {r: rank_weights(s.hidden, s.intermediate, s.experts, P, r, 0, dev, dtype) for r in world.local_ranks}
        wq = rowwise_weights(hi_weights(w[0])) if study == "library" and dtype == "fp8" else None
        print(f"megamoe-gemm ({study}): {s.name} {dtype} weights in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr, flush=True)
        for c in [c for c, d in todo if c.shape == shape and d == dtype]:
            if deadline is not None and time.time() > deadline:
                break
            t0 = time.perf_counter()
            rows = (_library_case if study == "library" else _controls_case)(world, c, dtype, w, wq, prm, sms, rounds)
            data.append_rows(csv, MEGAMOE_GEMM, pd.DataFrame(rows))
            summary = " ".join(f"{r['method'].replace('torch.', '')}:{r['variant']}:{r['schedule']} {r['ms']:.3f}"
                               for r in rows)
            print(f"megamoe-gemm ({study}): {c.name} {dtype} in {time.perf_counter() - t0:.1f} s: {summary}",
                  file=sys.stderr, flush=True)
            torch.cuda.empty_cache()
        del w, wq
        torch.cuda.empty_cache()
    if deadline is not None and time.time() > deadline and todo:
        print(f"megamoe-gemm ({study}): time budget reached; run again to resume", file=sys.stderr, flush=True)


def _setup(world, c, dtype, w, variants):
    P = world.world_size
    s = c.shape
    prob = make_problem(world, c, dtype, variants["default"], weights=w, weight_seed=0)
    bufs = moe_buffers(world, max(prob.cap_rows, 1), c.tokens, s.hidden, s.intermediate, s.topk, s.experts // P,
                       dtype, min_block_m=min(t.block_m for t in variants.values()))
    return prob, bufs, f"{c.name} {dtype}", gemm_flops(prob.layouts[0].rows, s.hidden, s.intermediate)


def _library_case(world, c, dtype, w, wq, prm, sms, rounds) -> list[dict]:
    P = world.world_size
    s = c.shape
    d = default_tiles(dtype, c.tokens * P * s.topk / s.experts)
    variants = library_variants(dtype, d)
    prob, bufs, what, flops = _setup(world, c, dtype, w, variants)
    inp = prob.inputs[0]
    rows, methods, info, notes = [], {}, {}, {}
    ref_w = _layer_weights_f32(prob)
    ref = (moe_reference(inp.x, inp.ids, inp.wts, ref_w, fp8=dtype == "fp8"),
           None if dtype == "fp8" else moe_reference(inp.x, inp.ids, inp.wts, ref_w, dtype=OUT_DTYPES[dtype]))
    base = None
    for name, t in variants.items():
        runs = [("expert_wave", "dynamic"), ("expert_wave", "static")] if name == "default" else \
            [("expert_wave", "dynamic")]
        p = dataclasses.replace(prob, tiles=t)
        ls = {(sch, a): {r: build_tasks(p, sch, sms, r) for r in world.local_ranks} for sch, a in runs}
        first = _runs_bit_identical(world, bufs, p, t, ls, f"{what} {tile_label(t)}")
        err = check_close(first[0], ref[0], ref[1], dtype, f"{what} {tile_label(t)}")[0]
        if name == "default":
            base = first
        else:               # within tolerance (above); whether bit-identical too goes in the note
            notes[f"ours:{name}"] = f"bit_identical={int(all(_same_bits(first[r], base[r]) for r in world.local_ranks))}"
        del first
        tasks = {0: ls[("expert_wave", "dynamic")][0]}
        methods[f"ours:{name}"] = (lambda tasks=tasks, t=t: run_experts(
            world, bufs, prob.inputs, tasks, t, barrier=False, check=False, local_combine=True, dynamic=True,
            ranks=[0]))
        info[f"ours:{name}"] = ("ours", name, t, "expert_wave", "dynamic", name == "default", err, None)
    del ref, base
    _add_library_methods(prob, inp, dtype, world.device(0), "library", flops, methods, info, rows,
                         (float("nan"), None), wq)
    times, inner = _round_robin(methods, rounds)
    for key in methods:
        method, variant, t, sch, a, is_def, err, task = info[key]
        rows.append(_row(prob, "library", dtype, method, variant, t, sch, a, is_def, "ok", notes.get(key, ""), err,
                         times[key], inner, flops, task))
    del prob, bufs, methods
    return rows


def _controls_case(world, c, dtype, w, wq, prm, sms, rounds) -> list[dict]:
    P = world.world_size
    s = c.shape
    dev = world.device(0)
    d = default_tiles(dtype, c.tokens * P * s.topk / s.experts)
    prob, bufs, what, flops = _setup(world, c, dtype, w, {"default": d})
    ew = build_tasks(prob, "expert_wave", sms, 0)
    dispatch(world, bufs, prob.inputs)
    ms_ew = bench.median(bench.time_ms(lambda: run_experts(world, bufs, prob.inputs, {0: ew}, d, barrier=False,
                                                           check=False, local_combine=True, dynamic=True,
                                                           ranks=[0]), warmup=2, reps=3))
    cost = CostModel(params_from_dict(prm), calibrate_rate(ew, s.hidden, s.intermediate, d, sms, ms_ew, "dynamic"),
                     sms, OUT_DTYPES[dtype].itemsize, "dynamic")
    lists = {sch: {r: build_tasks(prob, sch, sms, r, cost=cost) for r in world.local_ranks} for sch in SCHEDULES}
    # bit-identical first: every list vs expert_wave static (combine poisoned before each layer)
    ref_lists = {("expert_wave[static]", "static"): {r: build_tasks(prob, "expert_wave", sms, r)
                                                     for r in world.local_ranks}}
    _runs_bit_identical(world, bufs, prob, d, {**ref_lists, **{(sch, "dynamic"): ls for sch, ls in lists.items()}},
                        what)
    methods, tasks = {}, {}
    for sch, ls in lists.items():
        methods[sch] = (lambda tl_={0: ls[0]}: run_experts(world, bufs, prob.inputs, tl_, d, barrier=False,
                                                            check=False, local_combine=True, dynamic=True, ranks=[0]))
        ts = torch.zeros(2 * max(ls[0].n_tasks, 1), dtype=torch.int64, device=dev)   # one launch with timestamps
        run_experts(world, bufs, prob.inputs, {0: ls[0]}, d, barrier=False, check=True, local_combine=True,
                    dynamic=True, ranks=[0], ts={0: ts})
        tasks[sch] = task_stats(ls[0], ts, min(sms, ls[0].n_tasks))
    times, inner = _round_robin(methods, rounds)
    rows = [_row(prob, "controls", dtype, "ours", "default", d, sch, "dynamic", True, "ok", lists[sch][0].param or "",
                 float("nan"), times[sch], inner, flops, tasks[sch]) for sch in methods]
    del prob, bufs, methods
    return rows


def warm(dtypes: Sequence[str] = DTYPES, part: int = 0, parts: int = 1) -> int:
    """Compile (no launch) the default tiles of both row-block classes, static and dynamic, with and without
    per-task timestamps (every ``parts``-th from ``part``: run several processes side by side) into Triton's cache,
    with arguments of the launch's dtypes and alignment; returns how many. Run beside another job to take the
    compiles off the device's clock."""
    todo = sorted({(dtype, default_tiles(dtype, rpe), dyn, timed) for dtype in dtypes for rpe in (32.0, 1024.0)
                   for dyn, timed in ((False, False), (True, False), (True, True))}, key=str)
    dev = torch.device("cuda", 0)
    n = 0
    for dtype, t, dyn, timed in todo[part::parts]:
        fp8 = dtype == "fp8"
        act = torch.float8_e4m3fn if fp8 else torch.bfloat16
        a = torch.empty(64, device=dev, dtype=torch.uint8).view(act) if fp8 else torch.empty(64, device=dev,
                                                                                             dtype=act)
        f32 = torch.empty(64, device=dev, dtype=torch.float32)
        sc = f32 if fp8 else a
        i32 = torch.empty(64, device=dev, dtype=torch.int32)
        i64 = torch.empty(64, device=dev, dtype=torch.int64)
        comb = torch.empty(64, device=dev, dtype=OUT_DTYPES[dtype])
        try:
            (megamoe_tma_kernel if t.tma else megamoe_kernel).warmup(
                a, sc, a, sc, a, sc, a, sc, i32, i32, i32, i32, i64, comb, i64, i64, i32, 100, 0, 100, 4096, 2048, 7,
                MAX_POLLS, 0, BLOCK_M=t.block_m, BLOCK_N1=t.block_n1, BLOCK_N2=t.block_n2, BLOCK_K=t.block_k, FP8=fp8,
                TIMED=timed, DEVICE=True, DYNAMIC=dyn, num_warps=t.num_warps, num_stages=t.num_stages, grid=(1,))
        except Exception as e:  # noqa: BLE001 - the study compiles it itself then
            print(f"megamoe-gemm warm: {dtype} {tile_label(t)} failed: {type(e).__name__}: {e}",
                  file=sys.stderr, flush=True)
            continue
        n += 1
        print(f"megamoe-gemm warm: {dtype} {tile_label(t)}{' dynamic' if dyn else ''}{' timed' if timed else ''}",
              file=sys.stderr, flush=True)
    return n


def run_megamoe_gemm(out: str | Path, study: str = "library", cases: Sequence[str] | None = None,
                     dtypes: Sequence[str] = DTYPES, max_minutes: float | None = None, command: str = "",
                     rounds: int | None = None) -> Path:
    """Run (or resume) a study of this module into ``out``/megamoe_gemm.csv on one GPU; returns its path.
    ``cases``: default all 84 in table order. Parameters are checked before the GPU is."""
    if study not in STUDIES:
        raise ValueError(f"study must be one of {', '.join(STUDIES)}, got {study!r}")
    cs = cases_by_name(list(cases) if cases is not None else [c.name for c in CASES])
    if not dtypes or any(d not in DTYPES for d in dtypes):
        raise ValueError(f"dtypes must be a non-empty subset of {DTYPES}, got {list(dtypes)}")
    if rounds is not None and rounds < 5:
        raise ValueError(f"rounds must be >= 5, got {rounds}")
    if max_minutes is not None and max_minutes <= 0:
        raise ValueError(f"max_minutes must be > 0, got {max_minutes}")
    env.require_gpus(1, "the MegaMoE GEMM study")
    prm = recorded_params("h200x1")
    params = dict(study=study, study_cases=[c.name for c in cs], dtypes=list(dtypes), rounds=rounds or ROUNDS[study],
                  world="one-gpu", world_size=2, link="local", observed_rank=0, prm=prm.as_dict(), source="gpu",
                  fp8_library="torch._scaled_grouped_mm rowwise, use_fast_accum", tiles_version=TILES_VERSION,
                  order_version=ORDER_VERSION, tile_swizzle=TILE_SWIZZLE, wait_default=dict(WAIT_DEFAULT),
                  stall_default=STALL_DEFAULT, lag_version=LAG_VERSION)
    meta = env.provenance(command, params)
    env.apply_safe_env()
    deadline = None if max_minutes is None else time.time() + 60 * max_minutes
    study_job(OneGPUWorld(2, link="local", observed=0), cs, list(dtypes), str(out), meta, study, prm.as_dict(),
              deadline, rounds)
    return Path(out) / f"{MEGAMOE_GEMM.name}.csv"
