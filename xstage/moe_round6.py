"""MegaMoE round 6 (issue 15, item 3; session 8): model_guided's list under the positional wait term and under
the event walk in time, measured in the same rounds, compute only, on one GPU.

Study ``lists6`` (schema ``megamoe_gemm``, xstage.data; the pattern of round 5's study ``lists`` in
xstage.moe_gemm): per (configuration, dtype), rank 0 timed in the one-GPU world (link local, every combine store
local), dynamic assignment, the default tiles and order, one row per list of :data:`LISTS6`:
  expert_wave         the baseline every ratio divides
  lag                 lag = n_sms (the default lag list; context)
  model_guided        chosen with the positional wait term (``wait='positions'``: what every record so far ran)
  model_guided_time   chosen with the event walk (``wait='time'``, ``moe_plan.wait_walk``)
each model_guided with the per-program rate calibrated on this run's Expert-Wave compute-only time under its own
wait model and the host link's stage model (``studies.recorded_params('h200x1')``, as the host sweep chooses).
Before timing, every list of every rank runs the whole layer (combine poisoned first), bit-identical to
Expert-Wave static; then one launch per list with per-task device timestamps (the task_* columns), then the
lists round-robin (``moe_gemm._round_robin``). The row's ``note`` is the list's param (model_guided: its choice).
Resumable per (study, configuration, dtype).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from . import bench, data, env
from .data import MEGAMOE_GEMM
from .moe import build_tasks, dispatch, make_problem, moe_buffers, rank_weights, run_experts
from .moe_gemm import CONTROL_ROUNDS, _pairs, _round_robin, _row, _runs_bit_identical, task_stats
from .moe_plan import OUT_DTYPES, CostModel, calibrate_rate, cases_by_name, default_tiles, gemm_flops

STUDY = "lists6"
# name -> (schedule, wait model of model_guided's cost model or None)
LISTS6 = {"expert_wave": ("expert_wave", None), "model_guided": ("model_guided", "positions"),
          "model_guided_time": ("model_guided", "time")}
# The configurations, fixed before the run (scripts/megamoe_wait_choices.py on round 4's A/B, rank 0, the recorded
# Expert-Wave compute-only time as the rate): per dtype, in table order, every one whose model_guided choice the
# time model changes (bf16 32, fp8 35 of 84), plus as controls round 5's lists configurations (DeepSeek-V4-Pro and
# Qwen3 at T >= 2048) without Pro T8192 (the slowest; its choice changes in neither dtype) whatever their change.
LISTS6_CASES = {
    "bf16": ("deepseek_v4_flash_T128_uniform", "deepseek_v4_flash_T128_hot", "deepseek_v4_flash_T256_uniform",
             "deepseek_v4_flash_T256_hot", "deepseek_v4_flash_T1024_uniform", "deepseek_v4_flash_T1024_zipf",
             "deepseek_v4_flash_T1024_hot", "deepseek_v4_flash_T4096_zipf", "deepseek_v4_pro_T128_uniform",
             "deepseek_v4_pro_T256_uniform", "deepseek_v4_pro_T512_uniform", "deepseek_v4_pro_T512_zipf",
             "deepseek_v4_pro_T512_hot", "deepseek_v4_pro_T1024_uniform", "deepseek_v4_pro_T1024_zipf",
             "deepseek_v4_pro_T2048_uniform", "deepseek_v4_pro_T2048_zipf", "deepseek_v4_pro_T2048_hot",
             "deepseek_v4_pro_T4096_uniform", "deepseek_v4_pro_T4096_zipf", "deepseek_v4_pro_T4096_hot",
             "qwen3_235b_T256_zipf", "qwen3_235b_T1024_uniform", "qwen3_235b_T1024_zipf", "qwen3_235b_T1024_hot",
             "qwen3_235b_T2048_uniform", "qwen3_235b_T2048_zipf", "qwen3_235b_T2048_hot", "qwen3_235b_T4096_uniform",
             "qwen3_235b_T4096_zipf", "qwen3_235b_T4096_hot", "qwen3_235b_T8192_uniform", "qwen3_235b_T8192_zipf",
             "qwen3_235b_T8192_hot", "mixtral_8x7b_T128_uniform", "mixtral_8x7b_T128_zipf", "mixtral_8x7b_T128_hot",
             "mixtral_8x7b_T2048_zipf", "mixtral_8x7b_T4096_zipf", "mixtral_8x7b_T8192_hot"),
    "fp8": ("deepseek_v4_flash_T128_uniform", "deepseek_v4_flash_T128_zipf", "deepseek_v4_flash_T256_uniform",
            "deepseek_v4_flash_T256_zipf", "deepseek_v4_flash_T512_uniform", "deepseek_v4_flash_T1024_uniform",
            "deepseek_v4_flash_T1024_hot", "deepseek_v4_flash_T2048_uniform", "deepseek_v4_flash_T4096_uniform",
            "deepseek_v4_flash_T8192_hot", "deepseek_v4_pro_T128_uniform", "deepseek_v4_pro_T128_zipf",
            "deepseek_v4_pro_T256_uniform", "deepseek_v4_pro_T256_hot", "deepseek_v4_pro_T512_hot",
            "deepseek_v4_pro_T1024_uniform", "deepseek_v4_pro_T1024_zipf", "deepseek_v4_pro_T2048_uniform",
            "deepseek_v4_pro_T2048_zipf", "deepseek_v4_pro_T2048_hot", "deepseek_v4_pro_T4096_uniform",
            "deepseek_v4_pro_T4096_zipf", "deepseek_v4_pro_T4096_hot", "qwen3_235b_T128_zipf",
            "qwen3_235b_T256_uniform", "qwen3_235b_T256_hot", "qwen3_235b_T512_uniform", "qwen3_235b_T1024_uniform",
            "qwen3_235b_T2048_uniform", "qwen3_235b_T2048_zipf", "qwen3_235b_T2048_hot", "qwen3_235b_T4096_uniform",
            "qwen3_235b_T4096_zipf", "qwen3_235b_T4096_hot", "qwen3_235b_T8192_uniform", "qwen3_235b_T8192_zipf",
            "qwen3_235b_T8192_hot", "mixtral_8x7b_T128_uniform", "mixtral_8x7b_T128_zipf",
            "mixtral_8x7b_T256_zipf", "mixtral_8x7b_T256_hot", "mixtral_8x7b_T512_uniform", "mixtral_8x7b_T512_hot",
            "mixtral_8x7b_T1024_zipf", "mixtral_8x7b_T1024_hot"),
}


def _case(world, c, dtype, w, prm, sms, rounds) -> list[dict]:
    from .model import params_from_dict

    P = world.world_size
    s = c.shape
    dev = world.device(0)
    d = default_tiles(dtype, c.tokens * P * s.topk / s.experts)
    prob = make_problem(world, c, dtype, d, weights=w, weight_seed=0)
    bufs = moe_buffers(world, max(prob.cap_rows, 1), c.tokens, s.hidden, s.intermediate, s.topk, s.experts // P,
                       dtype, min_block_m=d.block_m)
    what = f"{c.name} {dtype}"
    flops = gemm_flops(prob.layouts[0].rows, s.hidden, s.intermediate)
    ew = build_tasks(prob, "expert_wave", sms, 0)
    dispatch(world, bufs, prob.inputs)
    ms_ew = bench.median(bench.time_ms(lambda: run_experts(world, bufs, prob.inputs, {0: ew}, d, barrier=False,
                                                           check=False, local_combine=True, dynamic=True,
                                                           ranks=[0]), warmup=2, reps=3))
    lists = {}
    for name, (sch, wait) in LISTS6.items():
        cost = CostModel(params_from_dict(prm), calibrate_rate(ew, s.hidden, s.intermediate, d, sms, ms_ew,
                                                               "dynamic", wait),
                         sms, OUT_DTYPES[dtype].itemsize, "dynamic", wait)
        lists[name] = {r: build_tasks(prob, sch, sms, r, cost=cost) for r in world.local_ranks}
    ref = {("expert_wave[static]", "static"): {r: build_tasks(prob, "expert_wave", sms, r)
                                               for r in world.local_ranks}}
    # bit-identical first: every list (dynamic) vs expert_wave static, combine poisoned before each layer
    _runs_bit_identical(world, bufs, prob, d, {**ref, **{(n, "dynamic"): ls for n, ls in lists.items()}}, what)
    methods, info = {}, {}
    for name, ls in lists.items():
        key = f"ours:{name}"
        methods[key] = (lambda tl_={0: ls[0]}: run_experts(world, bufs, prob.inputs, tl_, d, barrier=False,
                                                            check=False, local_combine=True, dynamic=True, ranks=[0]))
        ts = torch.zeros(2 * max(ls[0].n_tasks, 1), dtype=torch.int64, device=dev)
        run_experts(world, bufs, prob.inputs, {0: ls[0]}, d, barrier=False, check=True, local_combine=True,
                    dynamic=True, ranks=[0], ts={0: ts})
        info[key] = (name, LISTS6[name][0], ls[0].param, task_stats(ls[0], ts, min(sms, ls[0].n_tasks)))
    times, inner = _round_robin(methods, rounds)
    rows = []
    for key in methods:
        name, sch, note, task = info[key]
        rows.append(_row(prob, STUDY, dtype, "ours", name, d, sch, "dynamic", name == sch, "ok", note,
                         float("nan"), times[key], inner, flops, task))
    del prob, bufs, methods
    return rows


def job(world, cases, dtypes, folder, meta, prm, deadline: float | None, rounds: int = CONTROL_ROUNDS) -> None:
    """Per (case, dtype) not yet in ``folder`` (moe_gemm's order: shape by shape, weights once per shape and
    dtype), check, time, append; stops starting pairs after ``deadline``."""
    from .resume import pending

    P = world.world_size
    csv, todo, _ = pending(world, folder, MEGAMOE_GEMM, meta, _pairs(cases, dtypes),
                           lambda cd: (STUDY, *cd[0].key(P, cd[1])))
    sms = torch.cuda.get_device_properties(world.device(0)).multi_processor_count
    for shape, dtype in dict.fromkeys((c.shape, d) for c, d in todo):
        if deadline is not None and time.time() > deadline:
            break
        w = {r: rank_weights(shape.hidden, shape.intermediate, shape.experts, P, r, 0, world.device(0), dtype)
             for r in world.local_ranks}
        for c in [c for c, d in todo if c.shape == shape and d == dtype]:
            if deadline is not None and time.time() > deadline:
                break
            t0 = time.perf_counter()
            rows = _case(world, c, dtype, w, prm, sms, rounds)
            data.append_rows(csv, MEGAMOE_GEMM, pd.DataFrame(rows))
            print(f"megamoe ({STUDY}): {c.name} {dtype} in {time.perf_counter() - t0:.1f} s: " +
                  " ".join(f"{r['variant']} {r['ms']:.3f} [{r['note']}]" for r in rows), file=sys.stderr, flush=True)
            torch.cuda.empty_cache()
        del w
        torch.cuda.empty_cache()
    if deadline is not None and time.time() > deadline:
        print(f"megamoe ({STUDY}): time budget reached; run again to resume", file=sys.stderr, flush=True)


def run(out: str | Path, cases: Sequence[str], dtypes: Sequence[str] = ("bf16", "fp8"),
        max_minutes: float | None = None, command: str = "", rounds: int | None = None) -> Path:
    """Run (or resume) study ``lists6`` into ``out``/megamoe_gemm.csv on one GPU; returns its path."""
    from .moe_plan import ORDER_VERSION, TILE_SWIZZLE, TILES_VERSION, WAIT_DEFAULT

    cs = cases_by_name(cases)
    if not cs:
        raise ValueError("no configurations")
    if not dtypes or any(d not in ("bf16", "fp8") for d in dtypes):
        raise ValueError(f"dtypes must be a non-empty subset of ('bf16', 'fp8'), got {list(dtypes)}")
    if rounds is not None and rounds < 5:
        raise ValueError(f"rounds must be >= 5, got {rounds}")
    if max_minutes is not None and max_minutes <= 0:
        raise ValueError(f"max_minutes must be > 0, got {max_minutes}")
    env.require_gpus(1, "the MegaMoE lists6 study")
    from .ranks import OneGPUWorld
    from .studies import recorded_params

    prm = recorded_params("h200x1")
    params = dict(study=STUDY, study_cases=list(cases), dtypes=list(dtypes), rounds=rounds or CONTROL_ROUNDS,
                  world="one-gpu", world_size=2, link="local", observed_rank=0, assignment="dynamic",
                  lists6={n: dict(schedule=s, wait=w) for n, (s, w) in LISTS6.items()}, wait_default=WAIT_DEFAULT,
                  prm=prm.as_dict(), source="gpu", tiles_version=TILES_VERSION, order_version=ORDER_VERSION,
                  tile_swizzle=TILE_SWIZZLE)
    meta = env.provenance(command, params)
    env.apply_safe_env()
    deadline = None if max_minutes is None else time.time() + 60 * max_minutes
    world = OneGPUWorld(2, link="local", observed=0)
    job(world, cs, list(dtypes), str(out), meta, prm.as_dict(), deadline, rounds or CONTROL_ROUNDS)
    return Path(out) / f"{MEGAMOE_GEMM.name}.csv"


# ---------------------------------------------------------------------------------------------- the record
SUB = "megamoe_round6_lists"        # data/<machine>/megamoe_round6_lists/: study lists6


def lists_table(df: pd.DataFrame) -> pd.DataFrame:
    """Study ``lists6`` per configuration, dtype and list: the compute-only time over Expert-Wave's in the same
    rounds (``over_ew``), the tile-time ratios, the share of Linear-2 tiles that waited, the list's param, and
    ``same_list`` (model_guided's two choices are one list: their two rows time the same list twice, a noise
    floor)."""
    from .studies import _config, _over_expert_wave

    d = df[df.study == STUDY].assign(config=lambda x: _config(x))
    cols = ["config", "dtype", "rows", "variant", "schedule", "param", "ms", "over_ew", "l1_tile_rel",
            "l2_tile_rel", "task_busy", "ew_task_busy", "task_waited"]
    if d.empty:
        return pd.DataFrame(columns=cols + ["same_list"])
    key = ["config", "dtype"]
    ew = d[d.variant == "expert_wave"].drop_duplicates(key).set_index(key)
    out = _over_expert_wave(d, ew.reindex(pd.MultiIndex.from_frame(d[key])), cols)
    mg = out[out.schedule == "model_guided"].pivot_table(index=key, columns="variant", values="param",
                                                          aggfunc="first")
    same = (mg["model_guided"] == mg["model_guided_time"]).rename("same_list")
    return out.merge(same.reset_index(), on=key, how="left")


def lists_summary(per: pd.DataFrame) -> pd.DataFrame:
    """Per dtype: configurations, and where model_guided's two choices differ (``changed``) the geomean and worst
    of each choice's time over Expert-Wave, the geomean of the new choice over the old (time / positions), how
    many configurations the new choice is slower than the old by more than the same-list noise (the largest
    |log ratio| of the two rows where both time one list), and the worst configuration."""
    from .numeric import geomean

    out = []
    for dt, g in per.groupby("dtype", sort=False):
        w = g.pivot_table(index="config", columns="variant", values="over_ew", aggfunc="first")
        same = g.drop_duplicates("config").set_index("config").same_list.reindex(w.index).fillna(False).astype(bool)
        r = w["model_guided_time"] / w["model_guided"]
        noise = float(np.abs(np.log(r[same])).max()) if same.any() else float("nan")
        ch = r[~same]
        out.append(dict(dtype=dt, configs=len(w), changed=int((~same).sum()), noise_same_list=noise,
                        old_geomean=geomean(w.model_guided[~same]) if len(ch) else float("nan"),
                        old_worst=float(w.model_guided[~same].max()) if len(ch) else float("nan"),
                        new_geomean=geomean(w.model_guided_time[~same]) if len(ch) else float("nan"),
                        new_worst=float(w.model_guided_time[~same].max()) if len(ch) else float("nan"),
                        new_over_old_geomean=geomean(ch) if len(ch) else float("nan"),
                        new_over_old_worst=float(ch.max()) if len(ch) else float("nan"),
                        worst_config=str(ch.idxmax()) if len(ch) else "",
                        slower_beyond_noise=int((np.log(ch) > noise).sum()) if len(ch) else 0,
                        faster_beyond_noise=int((np.log(ch) < -noise).sum()) if len(ch) else 0))
    return pd.DataFrame(out)


# ------------------------------------------------------------------- the host-link record, re-scored
# The combine's drain rate inside the fused kernel on the host link (GB/s), a candidate, not applied by default
# (the records and the host stage fit keep the harness's D = 51.24): chosen on round 9's host record alone, with
# stall model ``round``, as the best of 38-51.24 GB/s (flat 42-46); no recorded kernel moved its remote bytes
# faster than 43.0 GB/s on average (docs/lab-notebook.md, session 15 "Host-link MegaMoE model"). Use: host_rescore(df, meta,
# drain_gbps=HOST_KERNEL_DRAIN_GBPS, stall="round").
HOST_KERNEL_DRAIN_GBPS = 44.0


def host_rescore(df: pd.DataFrame, meta: dict, drain_gbps: float | None = None, wait: str | None = None,
                 stall: str | None = None, prm=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The cost model (``moe_plan.repredict``) on a recorded host-link sweep (schema ``megamoe``) with the stage
    parameters it recorded (its sidecar's ``prm``; or ``prm``, e.g. the host link's full model now,
    ``xstage.model.load_params``), the drain rate replaced by ``drain_gbps`` when given (the
    combine's measured rate), wait model ``wait`` and stall model ``stall`` (None: the record's own,
    moe_plan.record_wait / record_stall). Returns (per configuration and schedule: measured and
    predicted speedup over Expert-Wave and the model's error; per dtype and schedule: configurations, the share
    within +-10 % (studies.MODEL_TOLERANCE), the median |error|, over- and under-predictions beyond it)."""
    import dataclasses

    from .model import params_from_dict
    from .studies import MODEL_TOLERANCE, repredicted_speedups

    p = meta.get("params", {})
    if prm is None:
        if "prm" not in p:
            raise ValueError("the record's sidecar holds no prm (the parameters the sweep predicted with)")
        prm = params_from_dict(p["prm"])
    if drain_gbps is not None:
        if not (np.isfinite(drain_gbps) and drain_gbps > 0):
            raise ValueError(f"drain_gbps must be positive, got {drain_gbps}")
        prm = dataclasses.replace(prm, drain_gbps=float(drain_gbps))
    sp = repredicted_speedups(df, meta, prm, wait, stall)
    g = sp.groupby(["dtype", "schedule"], sort=False)
    summ = pd.DataFrame({
        "configs": g.size(),
        "within_10pct": g.model_error.apply(lambda e: float((e.abs() <= MODEL_TOLERANCE).mean())),
        "median_abs_error": g.model_error.apply(lambda e: float(e.abs().median())),
        "over_predicted": g.model_error.apply(lambda e: int((e > MODEL_TOLERANCE).sum())),
        "under_predicted": g.model_error.apply(lambda e: int((e < -MODEL_TOLERANCE).sum())),
    }).reset_index()
    return sp[["config", "dtype", "schedule", "speedup", "predicted_speedup", "model_error"]], summ


def over_84(controls: pd.DataFrame, lists6: pd.DataFrame) -> pd.DataFrame:
    """model_guided's compute-only time over Expert-Wave's on the 84 configurations per dtype, from the records
    there are: round 4's A/B (``controls``: studies.megamoe_round3_controls rows, dynamic, variant default) and
    study lists6 (``lists6``: :func:`lists_table` rows). Per dtype and source: ``recorded`` (the A/B's
    model_guided, what the positional model chose in that run), ``positions`` (lists6's model_guided where lists6
    measured the configuration, else the A/B's), ``time`` (lists6's model_guided_time where measured, else the
    A/B's: lists6 holds every configuration whose choice the time model changes, chosen before the run), with
    configurations, geomean, worst, the worst configuration and how many rows came from lists6."""
    from .numeric import geomean

    c = controls[(controls.schedule == "model_guided") & (controls.assignment == "dynamic") &
                 (controls.variant == "default")].set_index(["dtype", "config"]).over_ew
    out = []
    for src, variant in (("recorded", None), ("positions", "model_guided"), ("time", "model_guided_time")):
        r = c.copy()
        n6 = 0
        if variant is not None:
            l6 = lists6[lists6.variant == variant].set_index(["dtype", "config"]).over_ew
            l6 = l6[l6.index.isin(r.index)]
            r.loc[l6.index] = l6
            n6 = l6.groupby(level=0).size()
        for dt, g in r.groupby(level=0, sort=False):
            out.append(dict(dtype=dt, source=src, configs=len(g), from_lists6=int(n6.get(dt, 0)) if variant else 0,
                            geomean=geomean(g.to_numpy()), worst=float(g.max()),
                            worst_config=str(g.idxmax()[1])))
    return pd.DataFrame(out)
