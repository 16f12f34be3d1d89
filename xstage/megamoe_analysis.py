"""MegaMoE's results from its records: the per-configuration speedups, summaries, goals and coverage the notebook,
the README's headline rows and docs/megamoe.md show (analysis layer: reads records, never measures).

Five current records (xstage.records, studies megamoe, megamoe_controls, megamoe_gemm_bf16, megamoe_gemm_fp8):

- ``data/h200x2/megamoe``: the 84 configurations per dtype on 2 H200s over NVLink, made with the first kernels;
- ``data/h200x1/megamoe_pcie``: the same 84 on one H200, two ranks in one process, each peer's combine stores
  crossing PCIe into pinned host memory (the current kernels; the model's prediction recorded beside);
- ``data/h200x1/megamoe_controls``: compute only (every store local), each schedule's time / Expert-Wave's;
- ``data/h200x1/megamoe_gemm_bf16`` / ``megamoe_gemm_fp8``: our GEMM phases against ``torch._grouped_mm`` /
  ``torch._scaled_grouped_mm`` timed in the same rounds.

A speedup is Expert-Wave's kernel time over the schedule's (> 1: the schedule is faster); a compute-only ratio is
the schedule's time over Expert-Wave's (> 1: slower); a GEMM ratio is the library's time over ours (> 1: ours
faster). A configuration = (shape, tokens per rank T, routing) of xstage.moe_plan.CASES (84 of them), per rank
count P and dtype; "config" names it <shape>_T<tokens>_<routing> (MoECase.name). The re-predictions of recorded
rows by the cost model are xstage.megamoe_model_analysis.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from . import data, records
from .moe_plan import (BASELINE, CASES, LAG_VERSION, ORDER_VERSION, SCHEDULES, TILES_VERSION, expected_configs,
                       gemm_flops, selection)
from .numeric import geomean
from .sources import NoRecordedData, paper_number

DOCS_PAGE = "megamoe.md"
NOTEBOOK = "03"
KEYS = ["shape", "tokens", "routing", "P", "dtype"]
MODEL_TOLERANCE = 0.10                 # |predicted - measured| / measured speedup counted as "within"
FUSED_OVER_UNFUSED_GOAL = 1.3          # geomean of unfused_ms / layer_ms (the goal)
GEMM_OVER_GROUPED_MM_GOAL = 0.7        # our compute-only kernel's TFLOP/s / torch._grouped_mm's (same rows)
GEMM_GOALS = dict(geomean=0.95, min_big=0.9, min_rows=2048)    # ours / the library
ORDER_GOALS = dict(geomean=1.02, worst=1.05)                   # compute only: schedule / Expert-Wave
MIN_ROWS = GEMM_GOALS["min_rows"]      # the GEMM goal's row threshold (rows on rank 0)
# the variant of each GEMM record that the current tiles are (bf16: the default; fp8: one pipeline stage more)
LIBRARY_VARIANT = {"megamoe_gemm_bf16": ("default", ("default",)),
                   "megamoe_gemm_fp8": ("s_plus", ("default", "bm_alt", "s_plus"))}
_MEDIANS = ["kernel_ms", "predicted_ms", "predicted_speedup", "layer_ms", "unfused_ms", "compute_ms",
            "grouped_mm_ms", "compute_sched_ms", "rows"]
_DIMS = ["hidden", "intermediate", "experts", "topk"]
RUNS_FILES = ("runs.jsonl.gz", "runs.jsonl")     # every timed run of a sweep (moe_sweep.RUNS_ENV's lines)
RUN_KINDS = ("kernel_ms", "local_ms", "layer_ms")   # per run: the kernel alone, compute only, the layer
# The recorded MegaMoE sweeps by world and link (``xstage sweep megamoe --world W --link L``): the registered
# record (study, machine, link) and the label every figure and table of it carries.
WORLDS = {
    ("gpus", "nvlink"): (("megamoe", "h200x2", "nvlink"), "2 H200s, one rank per GPU, combine over NVLink"),
    ("one-gpu", "host"): (("megamoe", "h200x1", "host"),
                          "one H200, 2 ranks in one process, combine over PCIe (Gen 5 x16) to host memory"),
}


def config_names(t: pd.DataFrame) -> pd.Series:
    """``<shape>_T<tokens>_<routing>`` per row (xstage.moe_plan.MoECase.name)."""
    return t["shape"].astype(str) + "_T" + t.tokens.astype(str) + "_" + t.routing.astype(str)


def _table_order(t: pd.DataFrame, extra: list[str]) -> pd.DataFrame:
    """Rows in table order (xstage.moe_plan.CASES: shapes, tokens, routings), then by P, dtype and ``extra``;
    configurations outside the table last."""
    pos = {c.name: i for i, c in enumerate(CASES)}
    t = t.assign(_pos=t.config.map(pos).fillna(len(pos)))
    return t.sort_values(["_pos", "config", "P", "dtype"] + extra).drop(columns="_pos").reset_index(drop=True)


def speedups(df: pd.DataFrame) -> pd.DataFrame:
    """Per configuration, rank count, dtype and schedule (medians of the recorded rows; a sweep records one):

      speedup           expert_wave kernel_ms / this schedule's kernel_ms (1 for expert_wave itself)
      predicted_speedup the Burst-Gap model's expert_wave / this schedule (recorded)
      model_error       (predicted_speedup - speedup) / speedup
      fused_speedup     unfused_ms / layer_ms: the fused layer with this schedule against NCCL all_to_all +
                        torch._grouped_mm (the unfused baseline)
      gemm_efficiency   grouped_mm_ms / compute_ms: our kernel with every combine store local (compute only)
                        against torch._grouped_mm on the same rows = ratio of their TFLOP/s; NaN where the data
                        has no grouped_mm_ms or it is NaN
      compute_tflops, grouped_mm_tflops   GEMM FLOPs of the busiest rank's rows / compute_ms, / grouped_mm_ms

    A configuration without an expert_wave row keeps its rows, with NaN speedups (never dropped). Columns:
    config, shape, tokens, routing, P, dtype, schedule, the dimensions, the medians and the ratios above."""
    if df.empty:
        raise ValueError("no MegaMoE rows")
    d = df.assign(**{c: np.nan for c in ("grouped_mm_ms", "compute_sched_ms") if c not in df})
    t = d.groupby(KEYS + ["schedule"])[_MEDIANS].median().reset_index()
    dims = d.groupby(KEYS)[_DIMS].first()
    base = t[t.schedule == BASELINE].set_index(KEYS).kernel_ms.rename("expert_wave_ms")
    t = t.join(dims, on=KEYS).join(base, on=KEYS)
    t["speedup"] = t.expert_wave_ms / t.kernel_ms
    t["model_error"] = (t.predicted_speedup - t.speedup) / t.speedup
    t["fused_speedup"] = t.unfused_ms / t.layer_ms
    t["gemm_efficiency"] = t.grouped_mm_ms / t.compute_ms
    flops = gemm_flops(t.rows.astype(float), t.hidden.astype(float), t.intermediate.astype(float))
    t["compute_tflops"] = flops / (t.compute_ms * 1e-3) / 1e12
    t["grouped_mm_tflops"] = flops / (t.grouped_mm_ms * 1e-3) / 1e12
    t.insert(0, "config", config_names(t))
    t["_s"] = t.schedule.map({s: i for i, s in enumerate(SCHEDULES)}).fillna(len(SCHEDULES))
    return _table_order(t, ["_s", "schedule"]).drop(columns="_s")


def summary(df: pd.DataFrame, schedules=None, shapes=None,
                    tolerance: float = MODEL_TOLERANCE) -> pd.DataFrame:
    """One row per (dtype, schedule) over the configurations (every one the data has; none dropped):

      configs                configurations with a measured speedup (expert_wave and this schedule timed)
      expected               configurations of a complete record per dtype (84, or those of ``shapes``)
      geomean_speedup, max_speedup, max_config   over expert_wave (kernel time)
      geomean_predicted      the model's predicted speedup, geomean over the same configurations
      within_tolerance       fraction of configurations whose |model_error| <= ``tolerance`` (0.1)
      median_abs_model_error
      fused_geomean, fused_min   unfused_ms / layer_ms (the fused layer over the unfused baseline)
      gemm_efficiency_geomean    grouped_mm_ms / compute_ms (NaN without grouped_mm_ms); per dtype, the same
                                 on every schedule's row (compute_ms is the compute-only expert_wave kernel)

    schedules: which rows (None = those in the data, table order); expert_wave's row has speedup 1 and no
    model error, and its fused columns are the Expert-Wave layer's."""
    sp = speedups(df)
    keep = [s for s in SCHEDULES if s in set(sp.schedule) and (schedules is None or s in schedules)]
    sp = sp[sp.schedule.isin(keep)]
    other = sp.schedule != BASELINE
    abs_err = sp.model_error.abs().where(other)
    sp = sp.assign(abs_err=abs_err, within=(abs_err <= tolerance).astype(float).where(abs_err.notna()))
    g = sp.groupby(["dtype", "schedule"], sort=False)
    out = pd.DataFrame({
        "configs": g.speedup.count(), "geomean_speedup": g.speedup.apply(geomean),
        "max_speedup": g.speedup.max(), "geomean_predicted": g.predicted_speedup.apply(geomean),
        "within_tolerance": g.within.mean(), "median_abs_model_error": g.abs_err.median(),
        "fused_geomean": g.fused_speedup.apply(geomean), "fused_min": g.fused_speedup.min(),
        "gemm_efficiency_geomean": g.gemm_efficiency.apply(geomean)})
    best = sp.dropna(subset=["speedup"])
    best = best.loc[best.groupby(["dtype", "schedule"]).speedup.idxmax()].set_index(["dtype", "schedule"]).config
    out.insert(3, "max_config", best.reindex(out.index))
    out.loc[out.index.get_level_values("schedule") == BASELINE, "max_config"] = None
    out.insert(1, "expected", len(expected_configs(shapes)))
    out = out.reset_index()
    out["_s"] = out.schedule.map({s: i for i, s in enumerate(SCHEDULES)})
    return out.sort_values(["dtype", "_s"]).drop(columns="_s").reset_index(drop=True)


def coverage(df: pd.DataFrame, dtypes=None, shapes=None, schedules=None) -> pd.DataFrame:
    """Per dtype and rank count: how many of the expected configurations (:func:`expected_configs`) the data
    has at all (``present``) and with a kernel time of expert_wave and of every one of ``schedules``
    (``complete``; None = every schedule in the data), and the names of those absent (``missing``; table
    order). A dtype without a single row is still listed (present 0). Columns: dtype, P, expected, present,
    complete, missing."""
    sel = selection(dtypes=dtypes, shapes=shapes, schedules=schedules)
    want = expected_configs(sel["shapes"])
    need = [BASELINE] + [s for s in (sel["schedules"] if schedules is not None else
                                             sorted(set(df.schedule))) if s != BASELINE]
    d = df.assign(config=config_names(df))
    times = d.pivot_table(index=["dtype", "P", "config"], columns="schedule", values="kernel_ms", aggfunc="median")
    times = times.reindex(columns=need)
    done = times.notna().all(axis=1).rename("done").reset_index()
    ranks = sorted(set(int(p) for p in d.P)) or [pd.NA]
    grid = pd.MultiIndex.from_product([sel["dtypes"], ranks], names=["dtype", "P"]).to_frame(index=False)
    got = done[done.config.isin(want)].groupby(["dtype", "P"]).agg(
        present=("config", "nunique"), complete=("done", "sum"), names=("config", set))
    out = grid.join(got, on=["dtype", "P"]) if len(got) else grid.assign(present=0, complete=0, names=None)
    out["present"] = out.present.fillna(0).astype(int)
    out["complete"] = out.complete.fillna(0).astype(int)
    out["missing"] = [[w for w in want if not (isinstance(n, set) and w in n)] for n in out.names]
    out.insert(2, "expected", len(want))
    return out.drop(columns="names")


def coverage_line(cov: pd.DataFrame, show: int = 3) -> str:
    """One line from :func:`coverage`: 'bf16: 84 of 84 configurations (84 with every schedule); fp8:
    60 of 84 ..., missing a, b, c, ... (+21 more)', naming the first ``show`` missing configurations (0: none)."""
    parts = []
    for r in cov.itertuples(index=False):
        p = "" if pd.isna(r.P) or cov.P.nunique() < 2 else f", P={r.P}"
        s = f"{r.dtype}{p}: {r.present} of {r.expected} configurations ({r.complete} with every schedule)"
        if r.missing and show:
            more = f", ... (+{len(r.missing) - show} more)" if len(r.missing) > show else ""
            s += f", missing {', '.join(r.missing[:show])}{more}"
        parts.append(s)
    return "; ".join(parts)


def goals(summary: pd.DataFrame, schedule: str = "interleaved") -> pd.DataFrame:
    """The study's goals against :func:`summary` of ``schedule`` (the paper's interleaved by default),
    per dtype: its geomean and maximum speedup over Expert-Wave beside the paper's (data/paper/headline.csv),
    the fraction of configurations the model predicts within the tolerance (goal: all), the fused layer over
    the unfused baseline (geomean, goal >= FUSED_OVER_UNFUSED_GOAL) and the GEMM phases over torch._grouped_mm
    (geomean, goal >= GEMM_OVER_GROUPED_MM_GOAL; NaN without grouped_mm_ms). ``met`` is None where the data has
    no value; the paper's numbers are a comparison (8 GPUs), not a pass mark. Columns: quantity, dtype,
    schedule, configs, expected, ours, target, met."""
    rows = summary[summary.schedule == schedule]
    if rows.empty:
        raise ValueError(f"the summary has no {schedule} rows; schedules: {sorted(set(summary.schedule))}")
    specs = [("geomean speedup over Expert-Wave (paper, 8 GPUs)", "geomean_speedup",
              paper_number("megamoe", "geomean_speedup"), None),
             ("max speedup over Expert-Wave (paper, 8 GPUs)", "max_speedup", paper_number("megamoe", "max_speedup"),
              None),
             (f"model within ±{MODEL_TOLERANCE:.0%} of measured (fraction of configurations)", "within_tolerance",
              1.0, "ge"),
             ("fused layer / unfused baseline (geomean)", "fused_geomean", FUSED_OVER_UNFUSED_GOAL, "ge"),
             ("GEMM phases / torch._grouped_mm (geomean)", "gemm_efficiency_geomean", GEMM_OVER_GROUPED_MM_GOAL,
              "ge")]
    out = pd.concat([rows.assign(quantity=q, ours=rows[col], target=t, _cmp=cmp) for q, col, t, cmp in specs],
                    ignore_index=True)
    out["met"] = (out.ours >= out.target).astype(object).where(out._cmp.notna() & out.ours.notna(), None)
    return out[["quantity", "dtype", "schedule", "configs", "expected", "ours", "target", "met"]]


def schedule_controls(df: pd.DataFrame) -> pd.DataFrame:
    """The compute-only controls of one record, per dtype and schedule, over the configurations with both
    (``compute_sched_ms``): ``compute_only_geomean`` / ``compute_only_worst`` = this
    schedule's kernel with every combine store local / Expert-Wave's the same way (what its tile order costs,
    > 1: slower), and ``combine_cost_geomean`` / ``combine_cost_max`` = the schedule's kernel / its own
    compute-only control (what the remote combine adds to it)."""
    sp = speedups(df)
    ew = sp[sp.schedule == BASELINE].set_index(KEYS).compute_sched_ms.rename("_ewc")
    t = sp.join(ew, on=KEYS)
    t = t.assign(order=t.compute_sched_ms / t._ewc, comb=t.kernel_ms / t.compute_sched_ms).dropna(
        subset=["order", "comb"])
    g = t.groupby(["dtype", "schedule"], sort=False)
    return pd.DataFrame({"controls": g.order.count(), "compute_only_geomean": g.order.apply(geomean),
                         "compute_only_worst": g.order.max(), "combine_cost_geomean": g.comb.apply(geomean),
                         "combine_cost_max": g.comb.max()}).reset_index()


def links_table(records: dict) -> pd.DataFrame:
    """Records side by side ({label: (df, meta)}): per record, dtype and schedule the measured geomean and max
    speedup over Expert-Wave (:func:`summary`, with the model the sweep predicted with: geomean predicted,
    fraction within ±10 %, median |error| of the speedup) and the compute-only controls
    (:func:`schedule_controls`). Columns: record, dtype, schedule, configs, expected, geomean_speedup,
    max_speedup, geomean_predicted, within_tolerance, median_abs_model_error, compute_only_geomean,
    compute_only_worst, combine_cost_geomean, combine_cost_max."""
    out = []
    for label, (df, _) in records.items():
        summ = summary(df)
        ctl = schedule_controls(df)
        t = summ.merge(ctl, on=["dtype", "schedule"], how="left").assign(record=label)
        out.append(t[["record", "dtype", "schedule", "configs", "expected", "geomean_speedup", "max_speedup",
                      "geomean_predicted", "within_tolerance", "median_abs_model_error", "compute_only_geomean",
                      "compute_only_worst", "combine_cost_geomean", "combine_cost_max"]])
    if not out:
        raise ValueError("no records")
    return pd.concat(out, ignore_index=True)


def caption_lines(summary: pd.DataFrame, schedule: str = "interleaved") -> dict[str, str]:
    """One line per figure for its caption's ``ours`` (from :func:`summary`): ``speedup``, ``model``,
    ``fused``, ``gemm``; each names the dtype and how many configurations of how many it covers."""
    s = summary[summary.schedule == schedule]
    if s.empty:
        raise ValueError(f"the summary has no {schedule} rows; schedules: {sorted(set(summary.schedule))}")
    n = lambda r: f"{r.configs}/{r.expected} configs"  # noqa: E731
    gemm = s.set_index("dtype").gemm_efficiency_geomean
    return {
        "speedup": "; ".join(f"{r.dtype}: {r.schedule} {r.geomean_speedup:.2f}x geomean, {r.max_speedup:.2f}x max "
                             f"over Expert-Wave ({n(r)})" for r in s.itertuples()),
        "model": "; ".join(f"{r.dtype}: {r.within_tolerance:.0%} of {r.schedule} configurations within "
                           f"±{MODEL_TOLERANCE:.0%} (median |error| {r.median_abs_model_error:.1%})"
                           for r in s.itertuples()),
        "fused": "; ".join(f"{r.dtype}: the fused layer ({r.schedule}) {r.fused_geomean:.2f}x the unfused baseline "
                           f"(geomean; goal >= {FUSED_OVER_UNFUSED_GOAL})" for r in s.itertuples()),
        "gemm": "; ".join(f"{d}: " + (f"{v:.2f}x torch._grouped_mm (geomean)" if pd.notna(v) else
                                      "torch._grouped_mm not recorded") for d, v in gemm.items()),
    }


def world_label(meta: dict) -> str:
    """The card, world and link a MegaMoE record was measured in, and which kernels, from its sidecar (records
    before the one-GPU world were one process per GPU over NVLink): e.g. 'one H200, 2 ranks in one process,
    combine over PCIe to host memory (rank 0's times); the current kernels (...)'."""
    prm = meta.get("params", {})
    world, link = prm.get("world", "gpus"), prm.get("link", "nvlink")
    if (world, link) in WORLDS and (world != "gpus" or int(meta.get("gpu_count", 2)) == 2):
        label = WORLDS[(world, link)][1]
    else:
        label = f"{meta.get('gpu_count', '?')}x {meta.get('gpu_name', 'GPU')}, world {world}, link {link}"
    return label + (" (rank 0's times)" if world == "one-gpu" else "") + "; " + kernels_label(meta)


def kernels_label(meta: dict) -> str:
    """Which kernels a MegaMoE record ran, from its sidecar: the current kernels (its tile, order and lag rules
    are moe_plan's defaults) or the first kernels (static assignment, pointer main loops, row-block-major tiles:
    a sidecar that names none of the rules)."""
    p = meta.get("params", {})
    if "tiles_version" not in p:
        return "the first kernels (static assignment, pointer main loops, row-block-major tiles)"
    current = (p.get("tiles_version"), p.get("order_version"), p.get("lag_version")) == (
        TILES_VERSION, ORDER_VERSION, LAG_VERSION)
    return ("the current kernels" if current else "earlier kernels") + (
        f" ({p.get('assignment', 'static')} assignment, TMA main loops, swizzled tiles)")


def world_data(world: str, link: str, dtypes=None, shapes=None) -> tuple[pd.DataFrame, dict]:
    """The current recorded MegaMoE sweep of ``world`` and ``link`` (:data:`WORLDS`, xstage.records): rows of the
    selection and provenance (with ``label``: :func:`world_label`). :class:`NoRecordedData` when it is not in
    data/."""
    if (world, link) not in WORLDS:
        raise ValueError(f"(world, link) must be one of {sorted(WORLDS)}, got {(world, link)!r}")
    (study, machine, rlink), label = WORLDS[(world, link)]
    sel = selection(dtypes=dtypes, shapes=shapes)
    rec = records.record(study, machine, rlink)
    if not data.paths(rec.path, data.MEGAMOE)[0].is_file():
        raise NoRecordedData(f"no recorded MegaMoE data for {label} (data/{machine}/{rec.folder}); run "
                             f"`{rec.command}`")
    df, meta = data.load(rec.path, data.MEGAMOE)
    df = df[df.dtype.isin(sel["dtypes"]) & df["shape"].isin(sel["shapes"])].reset_index(drop=True)
    if df.empty:
        raise NoRecordedData(f"{rec.path} has no rows of dtypes {sel['dtypes']} and shapes {sel['shapes']}")
    return df, {**meta, "source": "recorded", "label": world_label(meta)}


def pairs_line(df: pd.DataFrame, what: str = "host-link sweep") -> str:
    """How much of a sweep a record holds, in (configuration, dtype) pairs of the 84 x bf16 / fp8 (168) with
    every schedule: e.g. 'host-link sweep: 62 of 168 (configuration, dtype) pairs (bf16 0 of 84, fp8 62 of 84)'."""
    cov = coverage(df)
    per = {r.dtype: (int(r.complete), int(r.expected)) for r in cov.itertuples(index=False)}
    n, total = sum(c for c, _ in per.values()), sum(e for _, e in per.values())
    return (f"{what}: {n} of {total} (configuration, dtype) pairs ("
            + ", ".join(f"{d} {c} of {e}" for d, (c, e) in per.items()) + ")")


def host_summary(df: pd.DataFrame, tolerance: float = MODEL_TOLERANCE) -> pd.DataFrame:
    """A host-link sweep (``df``) per dtype and schedule over the configurations it holds: ``configs`` (of 84),
    measured speedup over Expert-Wave (geomean, max), the model's predicted speedup with the host link's fitted
    stage model as the sweep recorded it (geomean, max), how many within ``tolerance`` (10 %) of the measured one
    (``within``) and the fraction."""
    sp = speedups(df)
    sp = sp[sp.schedule != BASELINE].dropna(subset=["speedup"])
    sp = sp.assign(within=(sp.model_error.abs() <= tolerance))
    out = []
    for (dt, sch), g in sp.groupby(["dtype", "schedule"], sort=False):
        out.append(dict(dtype=dt, schedule=sch, configs=len(g), expected=len(expected_configs()),
                        geomean_speedup=geomean(g.speedup), max_speedup=float(g.speedup.max()),
                        max_config=g.loc[g.speedup.idxmax(), "config"], geomean_predicted=geomean(g.predicted_speedup),
                        max_predicted=float(g.predicted_speedup.max()), within=int(g.within.sum()),
                        within_tolerance=float(g.within.mean())))
    return pd.DataFrame(out)


def controls(df: pd.DataFrame) -> pd.DataFrame:
    """A compute-only controls record (schema ``megamoe_gemm``, e.g. ``records.record("megamoe_controls")``), per
    configuration, dtype, assignment, schedule and variant: the compute-only
    time over Expert-Wave's under the same assignment and in the same rounds (``over_ew``, > 1: slower),
    Expert-Wave's over static Expert-Wave's (``ew_over_static``), and from the launch with per-task timestamps
    (dynamic only) each tile kind's median time over Expert-Wave's (``l1_tile_rel``, ``l2_tile_rel``), the busy
    share of the programs (``task_busy``) and the share of Linear-2 tiles that waited (``task_waited``)."""
    d = df.assign(config=config_names(df))
    cols = ["config", "dtype", "rows", "assignment", "schedule", "variant", "param", "ms", "over_ew",
            "ew_over_static", "l1_tile_rel", "l2_tile_rel", "task_busy", "ew_task_busy", "task_waited"]
    if d.empty:
        return pd.DataFrame(columns=cols)
    ew = d[(d.schedule == "expert_wave") & (d.variant == "default")].set_index(["config", "dtype", "assignment"])
    ew = ew[~ew.index.duplicated()]
    k = pd.MultiIndex.from_frame(d[["config", "dtype", "assignment"]])
    base = ew.reindex(k)
    if "static" not in set(ew.index.get_level_values("assignment")):
        return _over_expert_wave(d, base, cols, ew_over_static=np.full(len(d), np.nan))
    st = ew.xs("static", level="assignment").reindex(pd.MultiIndex.from_frame(d[["config", "dtype"]]))
    with np.errstate(divide="ignore", invalid="ignore"):
        return _over_expert_wave(d, base, cols, ew_over_static=base.ms.to_numpy() / st.ms.to_numpy())


def _over_expert_wave(d: pd.DataFrame, base: pd.DataFrame, cols, **more) -> pd.DataFrame:
    """Each row's compute-only time and median tile times over its Expert-Wave row ``base`` (aligned), in the
    84-configuration table's order (timestamps of 0 under the interpreter give NaN ratios)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out = d.assign(param=d.note, over_ew=d.ms.to_numpy() / base.ms.to_numpy(),
                       l1_tile_rel=d.task_l1_us.to_numpy() / base.task_l1_us.to_numpy(),
                       l2_tile_rel=d.task_l2_us.to_numpy() / base.task_l2_us.to_numpy(),
                       ew_task_busy=base.task_busy.to_numpy(), **more)
    order = {c.name: i for i, c in enumerate(CASES)}
    return out.assign(_o=out.config.map(order)).sort_values(["dtype", "_o"], kind="stable")[cols].reset_index(
        drop=True)


def _controls_table_summary(per: pd.DataFrame) -> pd.DataFrame:
    """Per dtype, assignment, schedule and order variant over :func:`controls`: configurations,
    geomean and worst of the compute-only time over Expert-Wave's, whether the issue's goal holds (geomean <=
    1.02, worst <= 1.05), Expert-Wave over static Expert-Wave, and the per-task evidence (geomean tile-time
    ratios, median busy share against Expert-Wave's, median share of Linear-2 tiles that waited)."""
    out = []
    for (dt, a, s, v), g in per.groupby(["dtype", "assignment", "schedule", "variant"], sort=False):
        r = g.over_ew.dropna()
        if r.empty:
            continue
        gm, worst = geomean(r), float(r.max())
        out.append(dict(dtype=dt, assignment=a, schedule=s, variant=v, configs=len(r), over_ew_geomean=gm,
                        over_ew_worst=worst, worst_config=g.loc[r.idxmax(), "config"],
                        goal_met=bool(gm <= ORDER_GOALS["geomean"] and worst <= ORDER_GOALS["worst"]),
                        ew_over_static_geomean=geomean(g.ew_over_static.dropna()),
                        l1_tile_rel=geomean(g.l1_tile_rel.dropna()) if g.l1_tile_rel.notna().any() else float("nan"),
                        l2_tile_rel=geomean(g.l2_tile_rel.dropna()) if g.l2_tile_rel.notna().any() else float("nan"),
                        task_busy=float(g.task_busy.median()), ew_task_busy=float(g.ew_task_busy.median()),
                        task_waited=float(g.task_waited.median())))
    return pd.DataFrame(out)


def controls_summary(per: pd.DataFrame) -> pd.DataFrame:
    """Per dtype and schedule of :func:`controls`: configurations, geomean and worst over
    Expert-Wave (the worst configuration), whether the goal holds (geomean <= 1.02, worst <= 1.05), how many
    configurations are over 1.05, and the per-task evidence (:func:`_controls_table_summary`)."""
    s = _controls_table_summary(per).drop(columns=["ew_over_static_geomean", "variant"])
    over = per[per.over_ew > ORDER_GOALS["worst"]].groupby(["dtype", "schedule"]).size()
    s.insert(s.columns.get_loc("goal_met") + 1, "over_worst",
             [int(over.get((d, c), 0)) for d, c in zip(s.dtype, s.schedule)])
    return s


def library_ratios(df: pd.DataFrame, names: Sequence[str] = ("default",)) -> pd.DataFrame:
    """A GEMM-phase record (schema ``megamoe_gemm``: our Expert-Wave compute-only kernel beside the library in the
    same rounds) per configuration and dtype (table order): each of our variants' time (``<variant>_ms``) and the
    library's, and the library's time / ours (> 1: ours faster), against torch._grouped_mm
    (``<variant>_vs_grouped_mm``) and torch._scaled_grouped_mm (``<variant>_vs_scaled_grouped_mm``); NaN where a
    call was unavailable or a variant not run."""
    d = df[df.status == "ok"].copy()
    d["config"] = [f"{s}_T{t}_{r}" for s, t, r in zip(d["shape"], d.tokens, d.routing)]
    key = ["config", "dtype"]
    base = d[(d.method == "ours") & (d.variant == "default")].drop_duplicates(key).set_index(key)
    out = base[["shape", "rows", "tiles"]].copy()
    for v in names:
        out[f"{v}_ms"] = d[(d.method == "ours") & (d.variant == v)].drop_duplicates(key).set_index(key).ms.reindex(
            out.index)
    for lib in ("grouped_mm", "scaled_grouped_mm"):
        out[f"{lib}_ms"] = d[d.method == f"torch._{lib}"].drop_duplicates(key).set_index(key).ms.reindex(out.index)
        for v in names:
            out[f"{v}_vs_{lib}"] = out[f"{lib}_ms"] / out[f"{v}_ms"]
    out = out.reset_index()
    order = {c.name: i for i, c in enumerate(CASES)}
    return out.assign(_o=out.config.map(order)).sort_values(["dtype", "_o"], kind="stable").drop(
        columns="_o").reset_index(drop=True)


def library_summary(g: pd.DataFrame, min_rows: int = MIN_ROWS, names: Sequence[str] = ("default",)) -> pd.DataFrame:
    """Per dtype and variant of :func:`library_ratios`, against the dtype's library (bf16: torch._grouped_mm, fp8:
    torch._scaled_grouped_mm): configurations, geomean, minimum (and where), the minimum over configurations with
    >= ``min_rows`` rows on rank 0, and that set's size; and each variant's time over the default's (geomean)."""
    out = []
    for dt, gd in g.groupby("dtype", sort=False):
        lib = "grouped_mm" if dt == "bf16" else "scaled_grouped_mm"
        for v in names:
            r = gd[f"{v}_vs_{lib}"].dropna()
            if r.empty:
                continue
            big = r[gd.loc[r.index, "rows"] >= min_rows]
            out.append(dict(dtype=dt, variant=v, library=f"torch._{lib}", configs=len(r), geomean=geomean(r),
                            min=float(r.min()), min_config=gd.loc[r.idxmin(), "config"],
                            min_big=float(big.min()) if len(big) else float("nan"), big_configs=len(big),
                            over_default=geomean(gd.loc[r.index, f"{v}_ms"] / gd.loc[r.index, "default_ms"])))
    return pd.DataFrame(out)


def timed_runs(folder: Path | None = None) -> pd.DataFrame:
    """Every timed run of a MegaMoE sweep that printed them (``XSTAGE_MEGAMOE_RUNS=1``: one JSON line per
    configuration, dtype and schedule, kept as <folder>/runs.jsonl[.gz]; None: the one-H200 PCIe record), long: config, dtype,
    schedule, run (0-based, the order timed; in a sweep timed in rounds run i of every schedule is round i) and
    the kernel-alone, compute-only and layer times. :class:`NoRecordedData` without the file; ValueError on a
    malformed one."""
    folder = Path(folder) if folder is not None else records.folder("megamoe", "h200x1", "host")
    path = next((folder / f for f in RUNS_FILES if (folder / f).is_file()), None)
    if path is None:
        raise NoRecordedData(f"no timed runs recorded in {folder}/ ({' or '.join(RUNS_FILES)}); "
                             f"run the sweep with XSTAGE_MEGAMOE_RUNS=1 and keep its 'megamoe-runs' lines")
    raw = pd.read_json(path, lines=True)
    need = ["config", "dtype", "schedule", *RUN_KINDS]
    missing = [c for c in need if c not in raw.columns]
    if missing or raw.empty:
        raise ValueError(f"{path}: malformed timed runs (missing {', '.join(missing) or 'every line'})")
    out = []
    for r in raw.itertuples(index=False):
        cols = {k: np.asarray(getattr(r, k), np.float64) for k in RUN_KINDS}
        n = {len(v) for v in cols.values()}
        if len(n) != 1 or not all(np.isfinite(v).all() and (v > 0).all() for v in cols.values()):
            raise ValueError(f"{path}: {r.config} {r.dtype} {r.schedule}: runs of unequal length or not positive")
        out.append(pd.DataFrame({"config": r.config, "dtype": r.dtype, "schedule": r.schedule,
                                 "run": np.arange(n.pop()), **cols}))
    return pd.concat(out, ignore_index=True)


def run_drift(runs: pd.DataFrame, quarter: float = 0.25) -> pd.DataFrame:
    """How a configuration's timed runs move while it is timed (:func:`timed_runs`): per config, dtype and
    schedule the kernel-alone median (``ms``), its ``rise`` (median of the last ``quarter`` of the runs over the
    first quarter's, minus 1), and, beside Expert-Wave's runs of the same index (one round each in a sweep timed in
    rounds), the ratio of medians (``over_ew``), the median of the per-round ratios (``over_ew_rounds``) and their
    spread (``rounds_iqr``: interquartile range over the median). Timed in blocks (one schedule after another)
    each schedule's runs rose ~10 % through its block; timed in rounds that rise falls on every schedule alike."""
    rows = []
    for (cfg, dt), g in runs.groupby(["config", "dtype"], sort=False):
        k = {sch: x.sort_values("run").kernel_ms.to_numpy() for sch, x in g.groupby("schedule", sort=False)}
        if BASELINE not in k:
            raise ValueError(f"{cfg} {dt}: no {BASELINE} runs to compare with")
        ew = k[BASELINE]
        for sch, v in k.items():
            q = max(1, int(round(len(v) * quarter)))
            row = dict(config=cfg, dtype=dt, schedule=sch, runs=len(v), ms=float(np.median(v)),
                       rise=float(np.median(v[-q:]) / np.median(v[:q]) - 1))
            if sch != BASELINE and len(v) == len(ew):
                rr = v / ew
                q1, q3 = np.percentile(rr, [25, 75])
                row.update(over_ew=float(np.median(v) / np.median(ew)), over_ew_rounds=float(np.median(rr)),
                           rounds_iqr=float((q3 - q1) / np.median(rr)))
            rows.append(row)
    return pd.DataFrame(rows)


def load_record(study: str, machine: str, link: str, schema: data.Schema) -> tuple[pd.DataFrame, dict]:
    """The current record of ``study`` on ``machine`` and ``link`` (xstage.records): rows and sidecar;
    :class:`NoRecordedData` naming the folder and the command that records it when it is not in data/."""
    rec = records.record(study, machine, link)
    if not data.paths(rec.path, schema)[0].is_file():
        raise NoRecordedData(f"no recorded {study} for {machine} ({_rel(rec)}); run `{rec.command}`")
    return data.load(rec.path, schema)


def gemm_record(study: str) -> pd.DataFrame:
    """The current GEMM-phase record of ``study`` (megamoe_gemm_bf16 / megamoe_gemm_fp8) per dtype and variant
    against its library (:func:`library_summary`), the current tiles' variant first."""
    cur, names = LIBRARY_VARIANT[study]
    df, _ = load_record(study, "h200x1", "local", data.MEGAMOE_GEMM)
    g = library_summary(library_ratios(df, names), names=names)
    g = g[g["dtype"] == ("bf16" if study.endswith("bf16") else "fp8")]
    return pd.concat([g[g.variant == cur], g[g.variant != cur]], ignore_index=True)


# ------------------------------------------------------------------------------- the README and docs page
def _where(rec: records.Record) -> str:
    return {"nvlink": "NVLink, 2x H200", "host": "PCIe to host memory, one H200",
            "local": "compute only, one H200"}[rec.link]


def _rel(rec: records.Record) -> str:
    return f"data/{rec.machine}/{rec.folder}"


@lru_cache(maxsize=None)
def nvlink_summary() -> pd.DataFrame:
    """Per dtype and schedule on 2 H200s over NVLink (first kernels): configurations, geomean / max speedup."""
    df, _ = load_record("megamoe", "h200x2", "nvlink", data.MEGAMOE)
    return summary(df)


@lru_cache(maxsize=None)
def pcie_summary() -> pd.DataFrame:
    """Per dtype and schedule on one H200, combine over PCIe: geomean / max speedup, the model's geomean and how
    many configurations it predicts within ±10 %."""
    df, _ = load_record("megamoe", "h200x1", "host", data.MEGAMOE)
    return host_summary(df)


@lru_cache(maxsize=None)
def controls_record_summary() -> pd.DataFrame:
    """Compute only, dynamic assignment: each schedule's time / Expert-Wave's, geomean and worst, per dtype."""
    df, _ = load_record("megamoe_controls", "h200x1", "local", data.MEGAMOE_GEMM)
    cs = controls_summary(controls(df))
    return cs[cs.schedule != BASELINE].reset_index(drop=True)


@lru_cache(maxsize=None)
def gemm_bf16_summary() -> pd.DataFrame:
    """bf16 GEMM phases (the current tiles) / torch._grouped_mm: geomean, min, min at >= 2048 rows."""
    return gemm_record("megamoe_gemm_bf16").iloc[:1]


@lru_cache(maxsize=None)
def gemm_fp8_summary() -> pd.DataFrame:
    """fp8 GEMM phases (the current tiles: one pipeline stage more) / torch._scaled_grouped_mm."""
    return gemm_record("megamoe_gemm_fp8").iloc[:1]


def _row(table: pd.DataFrame, dtype: str, schedule: str = "interleaved"):
    return table[(table["dtype"] == dtype) & (table.schedule == schedule)].iloc[0]


def headline() -> list[records.Headline]:
    """MegaMoE's README rows (current records only)."""
    nv = nvlink_summary()
    b, f = _row(nv, "bf16"), _row(nv, "fp8")
    paper = (paper_number("megamoe", "geomean_speedup"), paper_number("megamoe", "max_speedup"))
    rec_nv = records.record("megamoe", "h200x2", "nvlink")
    pc = pcie_summary()
    pb, pf = _row(pc, "bf16"), _row(pc, "fp8")
    rec_pc = records.record("megamoe", "h200x1", "host")
    gb, gf = gemm_bf16_summary().iloc[0], gemm_fp8_summary().iloc[0]
    rec_gb, rec_gf = records.record("megamoe_gemm_bf16"), records.record("megamoe_gemm_fp8")
    return [
        records.Headline(
            f"fused MoE layer: interleaved / Expert-Wave kernel time geomean {paper[0]:.2f}x, max {paper[1]:.2f}x "
            "(8 GPUs)",
            f"first kernels, 84 configurations per dtype: geomean **{b.geomean_speedup:.2f} / "
            f"{f.geomean_speedup:.2f}x**, max {b.max_speedup:.2f} / {f.max_speedup:.2f}x (bf16 / fp8)",
            _where(rec_nv), _rel(rec_nv), NOTEBOOK),
        records.Headline(
            "",
            f"combine over PCIe, interleaved / Expert-Wave: bf16 **{pb.geomean_speedup:.3f}** (max "
            f"{pb.max_speedup:.2f}; model {pb.geomean_predicted:.3f}, {int(pb.within)} of {int(pb.configs)} within "
            f"±10 %), fp8 **{pf.geomean_speedup:.3f}** (max {pf.max_speedup:.2f})",
            _where(rec_pc), _rel(rec_pc), NOTEBOOK),
        records.Headline(
            "",
            f"bf16 GEMM phases / `torch._grouped_mm`: geomean **{gb.geomean:.3f}**, min {gb['min']:.3f} "
            f"({gb.min_big:.3f} at >= {MIN_ROWS} rows), {int(gb.configs)} configurations",
            _where(rec_gb), _rel(rec_gb), NOTEBOOK),
        records.Headline(
            "",
            f"fp8 GEMM phases / `torch._scaled_grouped_mm`: geomean **{gf.geomean:.3f}**, min {gf['min']:.3f}, "
            f"{int(gf.configs)} configurations",
            _where(rec_gf), _rel(rec_gf), NOTEBOOK),
    ]


def docs_page() -> str:
    """docs/megamoe.md: the current record's tables and what each shows."""
    rec_nv, rec_pc = records.record("megamoe", "h200x2", "nvlink"), records.record("megamoe", "h200x1", "host")
    nv = nvlink_summary()
    nv = nv[nv.schedule != BASELINE]
    pc = pcie_summary()
    ctl = controls_record_summary()
    gb, gf = gemm_bf16_summary(), gemm_fp8_summary()
    parts = [
        "# MegaMoE: fused dispatch, grouped GEMMs and combine", "",
        "One kernel per rank dispatches tokens to their experts, runs both grouped GEMMs and stores each output "
        "row into its source rank's combine buffer. A schedule orders the kernel's tasks; Expert-Wave (one expert "
        "wave after the other) is the baseline. Speedup = Expert-Wave's kernel time / the schedule's (> 1: faster). "
        "Every table covers the 84 configurations per dtype of `xstage.moe_plan.CASES`; notebook 03 shows them "
        "configuration by configuration.", "",
        f"## One H200, combine over PCIe (`{_rel(rec_pc)}`)", "",
        "Two ranks in one process on one H200; each peer's combine stores cross PCIe into pinned host memory. "
        "`predicted` is the model's geomean speedup recorded beside the run; `within` counts configurations it "
        "predicts within ±10 %.", "",
        records.markdown_table(pc, {"dtype": "", "schedule": "", "configs": "d", "geomean_speedup": ".3f", "max_speedup": ".2f",
                 "geomean_predicted": ".3f", "within": "d"}), "",
        f"## Two H200s over NVLink (`{_rel(rec_nv)}`, the first kernels)", "",
        records.markdown_table(nv, {"dtype": "", "schedule": "", "configs": "d", "geomean_speedup": ".2f", "max_speedup": ".2f"}), "",
        f"## Compute only, every store local (`{_rel(records.record('megamoe_controls'))}`)", "",
        "Each schedule's compute-only time / Expert-Wave's (dynamic assignment; > 1: slower). Goal: geomean <= "
        "1.02, worst <= 1.05.", "",
        records.markdown_table(ctl, {"dtype": "", "schedule": "", "configs": "d", "over_ew_geomean": ".3f", "over_ew_worst": ".3f"}),
        "",
        "## GEMM phases against the library, same rounds", "",
        f"The library's time / ours (> 1: ours faster); `min_big`: the minimum over configurations with >= "
        f"{MIN_ROWS} rows. bf16: `{_rel(records.record('megamoe_gemm_bf16'))}` against `torch._grouped_mm`; "
        f"fp8: `{_rel(records.record('megamoe_gemm_fp8'))}` against `torch._scaled_grouped_mm`.", "",
        records.markdown_table(pd.concat([gb, gf], ignore_index=True),
            {"dtype": "", "library": "", "configs": "d", "geomean": ".3f", "min": ".3f", "min_big": ".3f"}), "",
    ]
    return "\n".join(parts)
