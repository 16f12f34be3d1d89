"""Data access and the small analyses the study notebooks share: where a notebook's numbers come from.

A notebook names a ``source`` and gets rows in the recorded schema plus their provenance, whatever the source:

  recorded   data/<machine>/ (committed measurements; ``variant="free_running"`` -> data/<machine>/free_running)
  gpu        a fresh sweep on this machine's GPUs (default grid, plus the drain runs), written to ``out``
  simulated  the Burst-Gap event simulation with reference parameters on a small grid (seconds on a CPU)
  auto       gpu when GPUs are visible (burst-gap: one GPU measures the host link, two NVLink), else recorded

``meta["source"]`` says which one was used. The analyses here (slowdown over the backpressure-free
expectation, measured onset, bandwidth ratio) are what figures and checks read, so a number in a caption and
the panel beside it come from one place.

Legend: P = issuing programs, b = bytes per program per burst, k = burst index in a train (0 = first).
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from . import data, env, records
from .sources import (VARIANTS, check_machine as _check_machine, check_source as _check_source,
                      check_variant as _check_variant, default_out as _default_out, recorded as _recorded,
                      source_data as _source_data, LINK_MACHINES, PAPER_DIR, paper_numbers, paper_number,
                      default_params, recorded_params, caption_provenance)
from .model import KIB, BurstGapParams
from .numeric import geomean

BURSTS = ("first", "later", "all")

# The simulated source: small enough for a slow CPU (~2 s), wide enough for every panel (P=1 is the
# backpressure-free reference of the slowdown map).
SIMULATED_GRID = dict(burst_kib=(1, 4, 16, 64, 256, 1024, 4096), gap_us=(0, 10, 100), programs=(1, 4, 66, 264),
                      store_bytes=(16,), targets=("remote", "local"), n_bursts=8, repeats=2)
# The host link is ~7x slower than NVLink: its sweep stops at 1 MiB per program (as recorded in data/h200x1).
HOST_BURST_KIB = tuple(2**i for i in range(11))
# The recorded drain runs (a second pass over the same folder): fence after every burst, two gaps, 16 B stores.
DRAIN_GRID = dict(drain=(True,), gap_us=(0, 10), store_bytes=(16,))


# ------------------------------------------------------------------------------------------------ sources
def burst_gap_data(source: str, machine: str = "h200x2", variant: str = "sync", out: str | Path | None = None,
                   grid=None) -> tuple[pd.DataFrame, dict]:
    """Burst-gap rows (schema xstage.data.BURST_GAP) and provenance for ``source``; see the module docstring.

    machine: the folder under data/ (recorded); gpu/simulated ignore it (a gpu sweep's default folder is named
             after this machine's GPUs, xstage.env.machine_name).
    variant: ``sync`` (grid barrier between bursts) or ``free_running`` (none: programs drift apart).
    out:     where a gpu sweep writes (default: see :func:`_default_out`); a folder already holding a sweep
             resumes it. Simulated data goes to a temporary folder unless ``out`` is given.
    grid:    a :class:`xstage.burst_gap_sweep.BurstGapGrid` replacing the default one (gpu/simulated).
    """
    _check_variant(variant)
    src = env.resolve_source(source, gpus_needed=1)   # one GPU measures the host link
    if src == "recorded":
        folder = _recorded("burst_gap" if variant == "sync" else "free_running", machine)
        df, meta = data.load(folder)
        return df, {**meta, "source": "recorded"}

    from dataclasses import replace

    from .burst_gap_sweep import BurstGapGrid, run_burst_gap

    sync = variant == "sync"
    if src == "simulated":
        grid = replace(grid or BurstGapGrid(**SIMULATED_GRID), sync=sync)
        tmp = tempfile.TemporaryDirectory(prefix="xstage-sim-") if out is None else None
        with tmp or contextlib.nullcontext():  # a temporary folder is removed once the rows are loaded
            folder = Path(tmp.name if tmp else out)
            if not sync:
                folder = folder / "free_running"
            run_burst_gap(grid, folder, source="simulated", params=BurstGapParams.reference(),
                          command=f"xstage.studies.burst_gap_data('simulated', variant={variant!r})")
            df, meta = data.load(folder)
        return df, {**meta, "source": "simulated",
                    "note": "Burst-Gap event simulation with BurstGapParams.reference(); it models no drift, so "
                            "the free-running variant looks like the synchronised one."}

    # gpu: the default grid, then the drain runs, into one folder (each resumes what is already there)
    folder = Path(out) if out is not None else _default_out(env.machine_name())
    if not sync:
        folder = folder / "free_running"
    from .burst_gap_sweep import default_targets, world_for

    targets = default_targets()   # one GPU: the host link (pinned host memory) and local; two: NVLink and local
    grid = replace(grid or BurstGapGrid(targets=targets, world_size=world_for(targets),
                                        burst_kib=HOST_BURST_KIB if "host" in targets else BurstGapGrid.burst_kib),
                   sync=sync)
    command = f"xstage.studies.burst_gap_data('gpu', variant={variant!r})"
    run_burst_gap(grid, folder, source="gpu", command=command)
    if grid.drain == (False,):
        run_burst_gap(replace(grid, **DRAIN_GRID), folder, source="gpu", command=command + " [drain runs]")
    df, meta = data.load(folder)
    return df, {**meta, "source": "gpu"}


def bandwidth_data(source: str = "recorded", machine: str = "h200x2",
                   out: str | Path | None = None) -> tuple[pd.DataFrame, dict]:
    """Peak-bandwidth rows (schema xstage.data.BANDWIDTH): SM stores (remote, host, local) and the copy engine
    on each link (peer copy, device-to-host copy). Arguments in the order of every ``*_data`` function.

    source: recorded (data/<machine>/bandwidth/), gpu (run the benchmark into ``out``), or auto. There is
    no simulated bandwidth benchmark: pass ``recorded`` to show a machine's measurements beside simulated data.
    """
    def run(folder: Path) -> None:
        from .burst_gap_sweep import run_bandwidth

        if not data.paths(folder, data.BANDWIDTH)[0].is_file():
            run_bandwidth(folder, command="xstage.studies.bandwidth_data('gpu')")

    df, meta, _ = _source_data(source, data.BANDWIDTH, "the bandwidth benchmark",
                               lambda: _recorded("bandwidth", machine), run, out,
                               no_simulated="source 'simulated' has no bandwidth benchmark; use 'recorded' (or 'gpu')")
    return df, meta












# ------------------------------------------------------------------------------------------------ analyses
def select(df: pd.DataFrame, target: str | None = None, store_bytes: int | None = None, drain: bool = False,
           gap_us: float | None = None) -> pd.DataFrame:
    """Rows of one target / store width / gap; issue-only runs unless ``drain``. ValueError (listing what the
    data has) when nothing matches."""
    sel = df[df.drain.astype(bool) == drain]
    for col, val in (("target", target), ("store_bytes", store_bytes)):
        if val is not None:
            if val not in set(sel[col]):
                raise ValueError(f"{col}={val!r} not in the data (drain={drain}); have {sorted(set(sel[col]))}")
            sel = sel[sel[col] == val]
    if gap_us is not None:
        g = int(round(gap_us * 1000))
        if g not in set(sel.gap_ns):
            raise ValueError(f"gap_us={gap_us} not in the data (drain={drain}); have "
                             f"{sorted(x / 1000 for x in set(sel.gap_ns))}")
        sel = sel[sel.gap_ns == g]
    return sel


def pick_bursts(df: pd.DataFrame, burst: str | int = "first") -> pd.DataFrame:
    """``first`` (k = 0: an empty stage), ``later`` (k >= 1), ``all``, or one burst index."""
    if isinstance(burst, (int, np.integer)) and not isinstance(burst, bool):
        if burst not in set(df.burst):
            raise ValueError(f"burst={burst} not in the data; have 0..{df.burst.max()}")
        return df[df.burst == burst]
    if burst not in BURSTS:
        raise ValueError(f"burst must be one of {', '.join(BURSTS)} or a burst index, got {burst!r}")
    return {"first": df[df.burst == 0], "later": df[df.burst > 0], "all": df}[burst]


def per_config(df: pd.DataFrame, measure: str = "span_ns", keys=("target", "programs", "burst_bytes")) -> pd.DataFrame:
    """Median and quartiles of ``measure`` over repeats, ranks (and bursts) per ``keys``; adds ``gbps`` =
    P * b / median (bytes per ns) for issue measures."""
    g = df.groupby(list(keys))[measure]
    out = pd.DataFrame({"median": g.median(), "q25": g.quantile(0.25), "q75": g.quantile(0.75), "n": g.size()})
    out = out.reset_index()
    if "programs" in out and "burst_bytes" in out:
        out["gbps"] = out.programs * out.burst_bytes / out["median"]
    return out


def slowdown_table(df: pd.DataFrame, target: str = "remote", store_bytes: int = 16, gap_us: float = 0.0,
                   burst: str | int = "first", measure: str = "span_ns") -> pd.DataFrame:
    """Measured slowdown of a burst over its backpressure-free expectation, per (programs, burst_bytes).

    expected(P, b) = t(P_ref, b) + [t(P, b_min) - t(P_ref, b_min)]

    t = median ``measure`` of the selected bursts (same gap, same burst indices), P_ref = the fewest programs
    recorded (1 on the recorded grid: a single program issues at ~50 GB/s, far below any drain rate, so it is
    never backpressured), b_min = the smallest burst. The bracket is the fixed cost of many programs (start
    skew, barrier) measured where bursts are too small to fill anything. slowdown = t(P, b) / expected(P, b):
    1 = no backpressure; when the drain rate caps the burst it approaches P * (rate of one program) / D.
    """
    sel = pick_bursts(select(df, target, store_bytes, gap_us=gap_us), burst)
    t = sel.groupby(["programs", "burst_bytes"])[measure].median().unstack("burst_bytes")
    p_ref, b_min = t.index.min(), t.columns.min()
    expected = t.loc[p_ref].to_numpy()[None, :] + (t[b_min] - t.loc[p_ref, b_min]).to_numpy()[:, None]
    expected = pd.DataFrame(expected, index=t.index, columns=t.columns)
    out = pd.concat({"measured_ns": t.stack(), "expected_ns": expected.stack()}, axis=1).reset_index()
    out["slowdown"] = out.measured_ns / out.expected_ns
    out.attrs.update(reference_programs=int(p_ref), target=target, store_bytes=store_bytes, gap_us=gap_us,
                     burst=burst, measure=measure)
    return out


def measured_onset(slow: pd.DataFrame, threshold: float = 1.5) -> pd.Series:
    """Per program count, the smallest per-program burst size (bytes) whose slowdown (from
    :func:`slowdown_table`) reaches ``threshold`` and stays at or above it for every larger size; NaN if none."""
    out = {}
    for p, g in slow.sort_values("burst_bytes").groupby("programs"):
        above = (g.slowdown >= threshold).to_numpy()
        stays = np.flip(np.logical_and.accumulate(np.flip(above)))  # above here and at every larger size
        out[p] = float(g.burst_bytes.to_numpy()[stays][0]) if stays.any() else np.nan
    return pd.Series(out, name="onset_burst_bytes").rename_axis("programs")


def onset_table(slow: pd.DataFrame, prm: BurstGapParams | None = None, threshold: float = 1.5) -> pd.DataFrame:
    """Measured onset per program count beside the model's b* = C * I / (I - D) / P (empty stage), in KiB."""
    meas = measured_onset(slow, threshold)
    out = pd.DataFrame({"programs": meas.index, "measured_onset_kib": meas.to_numpy() / KIB})
    if prm is not None:
        from .model import onset_burst_bytes

        out["model_onset_kib"] = onset_burst_bytes(out.programs.to_numpy(), prm) / KIB
        out["model_onset_total_kib"] = out.model_onset_kib * out.programs
    return out


def bandwidth_summary(df_bw: pd.DataFrame) -> pd.DataFrame:
    """Best median GB/s per (method, target) over its variants (programs, warps, sizes), with the variant."""
    med = df_bw.groupby(["method", "target", "programs", "num_warps", "store_bytes", "bytes"],
                        as_index=False)["gbps"].median()
    best = med.loc[med.groupby(["method", "target"])["gbps"].idxmax()].reset_index(drop=True)
    return best.sort_values(["target", "gbps"], ascending=[False, False]).reset_index(drop=True)


CE_METHOD = {"remote": "ce_peer_copy", "host": "ce_d2h_copy"}   # the copy engine on each link


def sm_over_ce(df_bw: pd.DataFrame, target: str = "remote") -> float:
    """Best median SM-store GB/s (any SM method) over the copy engine's best median GB/s on the same link
    (``remote``: peer copy; ``host``: device-to-host copy into pinned memory), same run."""
    if target not in CE_METHOD:
        raise ValueError(f"target must be one of {', '.join(CE_METHOD)}, got {target!r}")
    best = bandwidth_summary(df_bw)
    link = best[best.target == target]
    ce = link[link.method == CE_METHOD[target]].gbps
    sm = link[link.method.str.startswith("sm_")].gbps
    if ce.empty or sm.empty:
        raise ValueError(f"bandwidth data needs {target} rows of the copy engine ({CE_METHOD[target]}) and of an "
                         f"SM method")
    return float(sm.max() / ce.max())


# ------------------------------------------------------------------------------------------- study 3: MegaMoE
# Legend: a configuration = (shape, tokens per rank T, routing) of xstage.moe_plan.CASES (84 of them), per rank count
# P and dtype; "config" names it <shape>_T<tokens>_<routing> (MoECase.name).
MEGAMOE_KEYS = ["shape", "tokens", "routing", "P", "dtype"]
MEGAMOE_BASELINE = "expert_wave"       # the schedule every kernel speedup divides
MODEL_TOLERANCE = 0.10                 # |predicted - measured| / measured speedup counted as "within"
FUSED_OVER_UNFUSED_GOAL = 1.3          # geomean of unfused_ms / layer_ms (the issue's goal)
GEMM_OVER_GROUPED_MM_GOAL = 0.7        # our compute-only kernel's TFLOP/s / torch._grouped_mm's (same rows)
_MEGAMOE_MEDIANS = ["kernel_ms", "predicted_ms", "predicted_speedup", "layer_ms", "unfused_ms", "compute_ms",
                    "grouped_mm_ms", "compute_sched_ms", "rows"]
_MEGAMOE_DIMS = ["hidden", "intermediate", "experts", "topk"]


class NoRecordedData(data.DataError):
    """A study's recorded data for this machine (or this selection of it) does not exist yet: a notebook says
    so in one line and skips its figures instead of failing."""


def _names(value, what: str, allowed: tuple[str, ...]) -> list[str]:
    """A non-empty list of distinct names, each in ``allowed``; ValueError naming the parameter otherwise."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ValueError(f"{what} must be a list of names, e.g. {list(allowed[:2])}, got {value!r}")
    bad = [v for v in value if v not in allowed]
    if bad:
        raise ValueError(f"{what}: unknown {', '.join(map(repr, bad))}; choose from {', '.join(allowed)}")
    if not value:
        raise ValueError(f"{what} must name at least one of {', '.join(allowed)}")
    if len(set(value)) != len(value):
        raise ValueError(f"{what} lists a name twice: {list(value)}")
    return list(value)


def megamoe_selection(dtypes=None, schedules=None, shapes=None) -> dict[str, list[str]]:
    """Checked notebook parameters of the MegaMoE study (None = all): ``dtypes`` of xstage.moe_plan.DTYPES_GPU,
    ``schedules`` of xstage.moe_plan.SCHEDULES (compared with expert_wave, which is always added as the baseline;
    at least one other), ``shapes`` by name of xstage.moe_plan.SHAPES. Returns them as lists (table order)."""
    from .moe_plan import DTYPES_GPU, SCHEDULES, SHAPES

    shape_names = tuple(s.name for s in SHAPES)
    sel = {"dtypes": _names(list(DTYPES_GPU) if dtypes is None else dtypes, "dtypes", DTYPES_GPU),
           "schedules": _names(list(SCHEDULES) if schedules is None else schedules, "schedules", SCHEDULES),
           "shapes": _names(list(shape_names) if shapes is None else shapes, "shapes", shape_names)}
    others = [s for s in SCHEDULES if s != MEGAMOE_BASELINE]
    if not set(sel["schedules"]) & set(others):
        raise ValueError(f"schedules must name at least one of {', '.join(others)} (compared with "
                         f"{MEGAMOE_BASELINE}), got {sel['schedules']}")
    sel["schedules"] = [s for s in SCHEDULES if s in sel["schedules"] or s == MEGAMOE_BASELINE]
    sel["dtypes"] = [d for d in DTYPES_GPU if d in sel["dtypes"]]
    sel["shapes"] = [s for s in shape_names if s in sel["shapes"]]
    return sel


def megamoe_expected(shapes=None) -> list[str]:
    """Names of the configurations a complete record holds per dtype: the 84 of xstage.moe_plan.CASES, or those of
    ``shapes`` (table order)."""
    from .moe_plan import CASES

    shapes = megamoe_selection(shapes=shapes)["shapes"]
    return [c.name for c in CASES if c.shape.name in shapes]


def megamoe_data(source: str = "auto", machine: str = "h200x2", out: str | Path | None = None,
                 dtypes=None, shapes=None, assignment: str = "static") -> tuple[pd.DataFrame, dict]:
    """MegaMoE rows (schema xstage.data.MEGAMOE: per configuration, dtype, schedule) and provenance.

    source:  recorded (data/<machine>/megamoe.csv or .csv.gz), gpu (run or resume the sweep on every visible
             GPU into ``out``), or auto (gpu when two GPUs are visible, else recorded). No simulated source.
    machine: the folder under data/ (recorded); gpu ignores it (the default folder is named after this
             machine's GPUs, see :func:`_default_out`).
    out:     where a gpu sweep writes; a folder already holding a sweep resumes it.
    dtypes, shapes: the selection (:func:`megamoe_selection`; None = all): what a gpu sweep runs and which
             recorded rows are returned.
    assignment: static (data/<machine>/) or dynamic (data/<machine>/dynamic/): how the kernel's programs took
             tasks (``xstage.moe_plan.ASSIGNMENTS``); a gpu sweep runs with it.
    Recorded data that is not there (no file, or no row of the selection) raises :class:`NoRecordedData`.
    """
    from .moe_plan import ASSIGNMENTS, CASES

    MEGAMOE = data.MEGAMOE
    if assignment not in ASSIGNMENTS:
        raise ValueError(f"assignment must be one of {', '.join(ASSIGNMENTS)}, got {assignment!r}")

    sel = megamoe_selection(dtypes=dtypes, shapes=shapes)
    sub = "dynamic" if assignment == "dynamic" else ""

    def recorded() -> Path:
        folder = data.machine_dir(machine) / (sub or "megamoe")
        if not data.paths(folder, MEGAMOE)[0].is_file():
            have = sorted(p.name for p in data.DATA_ROOT.iterdir() if data.paths(p / "megamoe", MEGAMOE)[0].is_file()) \
                if data.DATA_ROOT.is_dir() else []
            what = "" if assignment == "static" else " with dynamic assignment"
            how = "" if assignment == "static" else f" --assignment dynamic --out data/{machine}/dynamic"
            raise NoRecordedData(f"no recorded MegaMoE data{what} for machine {machine}; run `xstage sweep megamoe"
                                 f"{how}` on 2 GPUs" + (f" (recorded machines: {', '.join(have)})" if have else ""))
        return folder

    def run(folder: Path) -> None:
        import torch

        from .moe_sweep import run_megamoe

        cases = [c for c in CASES if c.shape.name in sel["shapes"]]
        run_megamoe(folder, recorded_params, world_size=torch.cuda.device_count(), dtypes=sel["dtypes"],
                    cases=cases, assignment=assignment,
                    command=f"xstage.studies.megamoe_data('gpu', dtypes={sel['dtypes']}, shapes={sel['shapes']}, "
                            f"assignment={assignment!r})")

    df, meta, folder = _source_data(source, MEGAMOE, "the MegaMoE study", recorded, run, out,
                                    gpu_folder=lambda f: f / sub if sub else f)
    keep = df.dtype.isin(sel["dtypes"]) & df["shape"].isin(sel["shapes"])
    if not keep.any():
        raise NoRecordedData(f"{data.paths(folder, MEGAMOE)[0]} has no rows of dtypes {sel['dtypes']} and shapes "
                             f"{sel['shapes']} yet ({len(df)} rows of others)")
    return df[keep].reset_index(drop=True), meta


def megamoe_config_names(t: pd.DataFrame) -> pd.Series:
    """``<shape>_T<tokens>_<routing>`` per row (xstage.moe_plan.MoECase.name)."""
    return t["shape"].astype(str) + "_T" + t.tokens.astype(str) + "_" + t.routing.astype(str)


def _megamoe_order(t: pd.DataFrame, extra: list[str]) -> pd.DataFrame:
    """Rows in table order (xstage.moe_plan.CASES: shapes, tokens, routings), then by P, dtype and ``extra``;
    configurations outside the table last."""
    from .moe_plan import CASES

    pos = {c.name: i for i, c in enumerate(CASES)}
    t = t.assign(_pos=t.config.map(pos).fillna(len(pos)))
    return t.sort_values(["_pos", "config", "P", "dtype"] + extra).drop(columns="_pos").reset_index(drop=True)


def megamoe_speedups(df: pd.DataFrame) -> pd.DataFrame:
    """Per configuration, rank count, dtype and schedule (medians of the recorded rows; a sweep records one):

      speedup           expert_wave kernel_ms / this schedule's kernel_ms (1 for expert_wave itself)
      predicted_speedup the Burst-Gap model's expert_wave / this schedule (recorded)
      model_error       (predicted_speedup - speedup) / speedup
      fused_speedup     unfused_ms / layer_ms: the fused layer with this schedule against NCCL all_to_all +
                        torch._grouped_mm (the unfused baseline)
      gemm_efficiency   grouped_mm_ms / compute_ms: our kernel with every combine store local (compute only)
                        against torch._grouped_mm on the same rows = ratio of their TFLOP/s; NaN where the data
                        has no grouped_mm_ms (older records) or it is NaN
      compute_tflops, grouped_mm_tflops   GEMM FLOPs of the busiest rank's rows / compute_ms, / grouped_mm_ms

    A configuration without an expert_wave row keeps its rows, with NaN speedups (never dropped). Columns:
    config, shape, tokens, routing, P, dtype, schedule, the dimensions, the medians and the ratios above."""
    from .moe_plan import SCHEDULES, gemm_flops

    if df.empty:
        raise ValueError("no MegaMoE rows")
    d = df.assign(**{c: np.nan for c in ("grouped_mm_ms", "compute_sched_ms") if c not in df})
    t = d.groupby(MEGAMOE_KEYS + ["schedule"])[_MEGAMOE_MEDIANS].median().reset_index()
    dims = d.groupby(MEGAMOE_KEYS)[_MEGAMOE_DIMS].first()
    base = t[t.schedule == MEGAMOE_BASELINE].set_index(MEGAMOE_KEYS).kernel_ms.rename("expert_wave_ms")
    t = t.join(dims, on=MEGAMOE_KEYS).join(base, on=MEGAMOE_KEYS)
    t["speedup"] = t.expert_wave_ms / t.kernel_ms
    t["model_error"] = (t.predicted_speedup - t.speedup) / t.speedup
    t["fused_speedup"] = t.unfused_ms / t.layer_ms
    t["gemm_efficiency"] = t.grouped_mm_ms / t.compute_ms
    flops = gemm_flops(t.rows.astype(float), t.hidden.astype(float), t.intermediate.astype(float))
    t["compute_tflops"] = flops / (t.compute_ms * 1e-3) / 1e12
    t["grouped_mm_tflops"] = flops / (t.grouped_mm_ms * 1e-3) / 1e12
    t.insert(0, "config", megamoe_config_names(t))
    t["_s"] = t.schedule.map({s: i for i, s in enumerate(SCHEDULES)}).fillna(len(SCHEDULES))
    return _megamoe_order(t, ["_s", "schedule"]).drop(columns="_s")


def megamoe_summary(df: pd.DataFrame, schedules=None, shapes=None,
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
    from .moe_plan import SCHEDULES

    sp = megamoe_speedups(df)
    keep = [s for s in SCHEDULES if s in set(sp.schedule) and (schedules is None or s in schedules)]
    sp = sp[sp.schedule.isin(keep)]
    other = sp.schedule != MEGAMOE_BASELINE
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
    out.loc[out.index.get_level_values("schedule") == MEGAMOE_BASELINE, "max_config"] = None
    out.insert(1, "expected", len(megamoe_expected(shapes)))
    out = out.reset_index()
    out["_s"] = out.schedule.map({s: i for i, s in enumerate(SCHEDULES)})
    return out.sort_values(["dtype", "_s"]).drop(columns="_s").reset_index(drop=True)


def megamoe_coverage(df: pd.DataFrame, dtypes=None, shapes=None, schedules=None) -> pd.DataFrame:
    """Per dtype and rank count: how many of the expected configurations (:func:`megamoe_expected`) the data
    has at all (``present``) and with a kernel time of expert_wave and of every one of ``schedules``
    (``complete``; None = every schedule in the data), and the names of those absent (``missing``; table
    order). A dtype without a single row is still listed (present 0). Columns: dtype, P, expected, present,
    complete, missing."""
    sel = megamoe_selection(dtypes=dtypes, shapes=shapes, schedules=schedules)
    want = megamoe_expected(sel["shapes"])
    need = [MEGAMOE_BASELINE] + [s for s in (sel["schedules"] if schedules is not None else
                                             sorted(set(df.schedule))) if s != MEGAMOE_BASELINE]
    d = df.assign(config=megamoe_config_names(df))
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


def megamoe_coverage_line(cov: pd.DataFrame, show: int = 3) -> str:
    """One line from :func:`megamoe_coverage`: 'bf16: 84 of 84 configurations (84 with every schedule); fp8:
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


def megamoe_goals(summary: pd.DataFrame, schedule: str = "interleaved") -> pd.DataFrame:
    """The study's goals against :func:`megamoe_summary` of ``schedule`` (the paper's interleaved by default),
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


def megamoe_order_cost(df: pd.DataFrame, drain_gbps: float) -> pd.DataFrame:
    """Can the X-Stage explain a schedule's kernel time difference from Expert-Wave? Per configuration, dtype and
    compared schedule (from :func:`megamoe_speedups`):

      extra_ms        this schedule's kernel_ms - Expert-Wave's (positive: slower)
      drain_ms        the busiest rank's remote combine bytes / ``drain_gbps``: the time the stage needs to drain
                      the whole combine. Even with every remote store serialised behind the drain, a schedule
                      can gain or lose at most about this much through the X-Stage
      beyond_stage    |extra_ms| > drain_ms: the difference is something else (tile order, waits, caches)
      ew_comm_share   Expert-Wave's kernel_ms / compute_ms - 1: what its remote combine costs over the same
                      kernel with every store local (0: the combine is hidden already; nothing left to win)
      order_ms        this schedule's compute-only control - Expert-Wave's (``compute_sched_ms``, records of
                      schema v2; NaN before): the difference its tile order makes without any remote store
      comm_ms         kernel_ms - compute_sched_ms: what the remote combine costs this schedule (v2; else NaN)

    ``drain_gbps``: the Burst-Gap drain rate the sweep predicted with (``meta['params']['prm']``)."""
    if not drain_gbps > 0:
        raise ValueError(f"drain_gbps must be > 0, got {drain_gbps}")
    sp = megamoe_speedups(df)
    remote = df.groupby(MEGAMOE_KEYS).remote_bytes.max().rename("remote_bytes")
    t = sp[sp.schedule != MEGAMOE_BASELINE].join(remote, on=MEGAMOE_KEYS)
    ew = sp[sp.schedule == MEGAMOE_BASELINE].set_index(MEGAMOE_KEYS)
    t = t.join((ew.kernel_ms / ew.compute_ms - 1).rename("ew_comm_share"), on=MEGAMOE_KEYS)
    t["extra_ms"] = t.kernel_ms - t.expert_wave_ms
    t["drain_ms"] = t.remote_bytes / (drain_gbps * 1e9) * 1e3
    t["beyond_stage"] = t.extra_ms.abs() > t.drain_ms
    t = t.join(ew.compute_sched_ms.rename("ew_compute_sched_ms"), on=MEGAMOE_KEYS)
    t["order_ms"] = t.compute_sched_ms - t.ew_compute_sched_ms
    t["comm_ms"] = t.kernel_ms - t.compute_sched_ms
    return t[["config", "shape", "tokens", "routing", "P", "dtype", "schedule", "kernel_ms", "expert_wave_ms",
              "compute_ms", "remote_bytes", "extra_ms", "drain_ms", "beyond_stage", "ew_comm_share", "order_ms",
              "comm_ms"]].reset_index(drop=True)


def megamoe_order_cost_line(cost: pd.DataFrame) -> str:
    """One sentence from :func:`megamoe_order_cost`, computed (per dtype)."""
    parts = []
    for d, g in cost.groupby("dtype", sort=False):
        ew = g.drop_duplicates("config").ew_comm_share
        parts.append(f"{d}: Expert-Wave's remote combine costs {ew.median():+.1%} over its compute-only control "
                     f"(median; {ew.min():+.1%} .. {ew.max():+.1%}); the schedules' time differences exceed the "
                     f"whole combine's drain time in {int(g.beyond_stage.sum())} of {len(g)} cases (median "
                     f"{g.extra_ms.median():+.3f} ms against a median drain of {g.drain_ms.median():.3f} ms)"
                     + (f"; the compute-only controls put {g.order_ms.median():+.3f} ms of it on the tile order and "
                        f"{g.comm_ms.median():+.3f} ms on the remote combine (medians)"
                        if g.order_ms.notna().any() else ""))
    return "; ".join(parts)


def megamoe_revised_model(df: pd.DataFrame, meta: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The current model (``xstage.moe_plan.predict_kernel_ns``: the busiest program, static assignment) applied to the
    recorded rows with the Burst-Gap parameters and SM count the sweep ran with (``meta``). Returns (rows with
    ``predicted_speedup`` replaced by the revised model's, so the parity figure can show it; a table per dtype and
    schedule: measured and both models' geomean speedups, the fraction within ±10 %, the median |error| and the
    correlation with the measured speedups)."""
    from .model import BurstGapParams, params_from_dict
    from .moe_plan import record_stall, record_wait, repredict

    recorded = meta.get("params", {}).get("prm")       # the parameters the sweep predicted with, if it kept them
    prm = params_from_dict(recorded) if recorded else BurstGapParams.reference()
    n_sms = int(meta.get("sm_count") or 132)
    rp = repredict(df, prm, n_sms, meta.get("params", {}).get("assignment", "static"), record_wait(meta),
                   record_stall(meta))
    keys = MEGAMOE_KEYS + ["schedule"]
    revised = df.drop(columns=["predicted_speedup"]).merge(
        rp[keys + ["model_speedup"]].rename(columns={"model_speedup": "predicted_speedup"}), on=keys, how="left")
    old, new = megamoe_speedups(df), megamoe_speedups(revised)
    old, new = (x[x.schedule != MEGAMOE_BASELINE] for x in (old, new))

    def stats(t: pd.DataFrame, tag: str) -> pd.DataFrame:
        g = t.groupby(["dtype", "schedule"], sort=False)
        return pd.DataFrame({
            f"{tag}_geomean": g.predicted_speedup.apply(geomean),
            f"{tag}_within_10pct": g.model_error.apply(lambda e: float((e.abs() <= MODEL_TOLERANCE).mean())),
            f"{tag}_median_abs_error": g.model_error.apply(lambda e: float(e.abs().median())),
            f"{tag}_corr": g.apply(lambda x: float(np.corrcoef(x.speedup, x.predicted_speedup)[0, 1])
                                   if len(x) > 2 else float("nan")),
        })
    measured = old.groupby(["dtype", "schedule"], sort=False).speedup.apply(geomean).rename("measured_geomean")
    table = pd.concat([measured, stats(old, "recorded_model"), stats(new, "revised_model")], axis=1).reset_index()
    return revised, table


def repredicted_speedups(df: pd.DataFrame, meta: dict, prm, wait: str | None = None,
                         stall: str | None = None) -> pd.DataFrame:
    """A recorded MegaMoE sweep's speedups over Expert-Wave (:func:`megamoe_speedups`, the baseline's rows
    dropped) with ``predicted_speedup`` re-predicted by the cost model (``moe_plan.repredict``) from stage
    parameters ``prm``, wait model ``wait`` (None: the record's own, moe_plan.record_wait) and stall model
    ``stall`` (None: the record's own, moe_plan.record_stall), for the record's SM count and task assignment, and
    for its observed rank where it timed one (a one-GPU record, sidecar ``params.observed_rank``)."""
    from .moe_plan import record_stall, record_wait, repredict

    p = meta.get("params", {})
    rp = repredict(df, prm, int(meta.get("sm_count") or 132), p.get("assignment", "static"),
                   wait or record_wait(meta), stall or record_stall(meta), observed_rank=p.get("observed_rank"))
    keys = MEGAMOE_KEYS + ["schedule"]
    t = df.drop(columns=["predicted_speedup"]).merge(
        rp[keys + ["model_speedup"]].rename(columns={"model_speedup": "predicted_speedup"}), on=keys, how="left")
    sp = megamoe_speedups(t)
    return sp[sp.schedule != MEGAMOE_BASELINE]


def megamoe_stage_model(df: pd.DataFrame, meta: dict, link: str = "nvlink") -> pd.DataFrame:
    """The MegaMoE cost model with the stage model of ``link`` (its fit in data/, xstage.model.load_params:
    the capacity the round's issuing programs see, the stall, the drain) on the recorded rows: per dtype and
    schedule, measured and predicted geomean speedups, the fraction within +-10 % and the median |error|."""
    from .model import load_params

    sp = repredicted_speedups(df, meta, load_params(data.machine_dir(LINK_MACHINES[link]), link))
    g = sp.groupby(["dtype", "schedule"], sort=False)
    return pd.DataFrame({
        "measured_geomean": g.speedup.apply(geomean), "stage_model_geomean": g.predicted_speedup.apply(geomean),
        "stage_model_within_10pct": g.model_error.apply(lambda e: float((e.abs() <= MODEL_TOLERANCE).mean())),
        "stage_model_median_abs_error": g.model_error.apply(lambda e: float(e.abs().median())),
    }).reset_index()


# The recorded MegaMoE sweeps by world and link (``xstage sweep megamoe --world W --link L``): machine folder,
# subfolder and the label every figure and table of it carries.
MEGAMOE_WORLDS = {
    ("gpus", "nvlink"): ("h200x2", "megamoe", "2 H200s, one rank per GPU, combine over NVLink"),
    ("one-gpu", "host"): ("h200x1", "megamoe_host",
                          "one H200, 2 ranks in one process, combine over PCIe to host memory"),
    ("one-gpu", "local"): ("h200x1", "megamoe_local",
                           "one H200, 2 ranks in one process, every combine store in GPU memory"),
}


def megamoe_world_label(meta: dict) -> str:
    """The world and link a MegaMoE record was measured in, from its sidecar (records before the one-GPU world
    were one process per GPU over NVLink): e.g. 'one H200, 2 ranks in one process, combine over PCIe to host
    memory (rank 0's times)'."""
    prm = meta.get("params", {})
    world, link = prm.get("world", "gpus"), prm.get("link", "nvlink")
    if (world, link) in MEGAMOE_WORLDS and (world != "gpus" or int(meta.get("gpu_count", 2)) == 2):
        label = MEGAMOE_WORLDS[(world, link)][2]
    else:
        label = f"{meta.get('gpu_count', '?')}x {meta.get('gpu_name', 'GPU')}, world {world}, link {link}"
    return label + (" (rank 0's times)" if world == "one-gpu" else "")


# Every recorded one-GPU host-link MegaMoE sweep (folders under data/h200x1/), newest first: round 10's defaults
# (tiles v5: fp8's BM 128 from 96 rows per expert; model_guided by the event walk's waits), round 9's defaults
# (tiles v4: fp8 through the TMA main loops with one stage more too; fp8 first, time-bounded, resumed call by call),
# round 7's defaults (tiles v3: bf16 through the TMA main loops; else as round 4; complete), round 4's defaults
# (dynamic assignment, tiles v2, order v3, tile swizzle 8) and session 4's (static assignment, tiles v1, order
# v1), which MEGAMOE_WORLDS still names as *the* host record (README, earlier sections of notebook 03).
# Round 12 (session 15): tiles v6 (fp8 one stage more), lag version 2; round 13 (session 16): order version 4
# (lag's releases aligned to swizzle groups); round 14 (session 18): round 13's defaults, the schedules timed in
# rounds (moe_sweep.TIMING "round_robin"; every record before it timed each schedule in a block of its own), first.
MEGAMOE_HOST_RECORDS = ("megamoe_pcie", "megamoe_round13_host", "megamoe_round12_host", "megamoe_round10_host", "megamoe_round9_host", "megamoe_round7_host",
                        "megamoe_host_v2", "megamoe_host")


def megamoe_defaults_label(meta: dict) -> str:
    """The kernel defaults a MegaMoE record ran with, from its sidecar: e.g. 'dynamic assignment, tiles v2,
    order v3, tile swizzle 8' (fields a record predates read as their first version: static, v1, row-block-major
    tiles)."""
    p = meta.get("params", {})
    sw = p.get("tile_swizzle")
    return (f"{p.get('assignment', 'static')} assignment, tiles v{p.get('tiles_version', 1)}, order "
            f"v{p.get('order_version', 1)}, " + (f"tile swizzle {sw}" if sw else "row-block-major tiles"))


def megamoe_world_data(world: str, link: str, dtypes=None, shapes=None,
                       record: str | None = None) -> tuple[pd.DataFrame, dict]:
    """The recorded MegaMoE sweep of ``world`` and ``link`` (:data:`MEGAMOE_WORLDS`): rows of the selection and
    provenance (with ``label``: :func:`megamoe_world_label`). :class:`NoRecordedData` when it is not in data/.
    ``record``: another folder of that world and link (one-GPU host link: :data:`MEGAMOE_HOST_RECORDS`); its
    label then also names the record and its defaults (:func:`megamoe_defaults_label`)."""
    if (world, link) not in MEGAMOE_WORLDS:
        raise ValueError(f"(world, link) must be one of {sorted(MEGAMOE_WORLDS)}, got {(world, link)!r}")
    machine, sub, label = MEGAMOE_WORLDS[(world, link)]
    if record is not None:
        known = MEGAMOE_HOST_RECORDS if (world, link) == ("one-gpu", "host") else (sub,)
        if record not in known:
            raise ValueError(f"record must be one of {', '.join(known)} for world {world}, link {link}, got "
                             f"{record!r}")
        sub = record
    sel = megamoe_selection(dtypes=dtypes, shapes=shapes)
    folder = data.machine_dir(machine) / sub
    if not data.paths(folder, data.MEGAMOE)[0].is_file():
        raise NoRecordedData(f"no recorded MegaMoE data for {label} (data/{machine}/{sub}); run `xstage sweep megamoe"
                             + (f" --world {world} --ranks 2 --link {link}" if world != "gpus" else "")
                             + f" --out data/{machine}{'/' + sub if sub else ''}`")
    df, meta = data.load(folder, data.MEGAMOE)
    df = df[df.dtype.isin(sel["dtypes"]) & df["shape"].isin(sel["shapes"])].reset_index(drop=True)
    if df.empty:
        raise NoRecordedData(f"{folder} has no rows of dtypes {sel['dtypes']} and shapes {sel['shapes']}")
    label = megamoe_world_label(meta)
    if record is not None:
        label += f"; data/{machine}/{record}: {megamoe_defaults_label(meta)}"
    return df, {**meta, "source": "recorded", "label": label}


def megamoe_timing_noise(df: pd.DataFrame) -> pd.DataFrame:
    """What the sweep's timing resolves, from one record's own rows: per dtype, the rows where model_guided chose
    expert_wave (the very same task list, timed again in its own block of the run) as ratios to Expert-Wave's
    (``same_list``: how many; ``kernel_min`` / ``kernel_max`` of kernel_ms, ``control_min`` / ``control_max`` of
    compute_sched_ms) and Expert-Wave's compute-only control measured twice (``compute_sched_ms`` /
    ``compute_ms``: ``ew_control_min``, ``ew_control_max``, ``ew_control_std`` of the log). A schedule's ratio
    inside these ranges is not a difference the sweep can tell from 1."""
    out = []
    for dt, g in df.groupby("dtype", sort=False):
        ew = g[g.schedule == MEGAMOE_BASELINE].set_index(MEGAMOE_KEYS)
        mg = g[g.schedule == "model_guided"]
        same = mg[mg.schedule_param.astype(str).str.split(",").str[0] == MEGAMOE_BASELINE].set_index(MEGAMOE_KEYS)
        base = ew.reindex(same.index)
        k, c = same.kernel_ms / base.kernel_ms, same.compute_sched_ms / base.compute_sched_ms
        twice = (ew.compute_sched_ms / ew.compute_ms).dropna()
        out.append(dict(dtype=dt, same_list=len(same), kernel_min=k.min(), kernel_max=k.max(), control_min=c.min(),
                        control_max=c.max(), ew_twice=len(twice), ew_control_min=twice.min(),
                        ew_control_max=twice.max(), ew_control_std=float(np.log(twice).std())))
    return pd.DataFrame(out)


def megamoe_schedule_controls(df: pd.DataFrame) -> pd.DataFrame:
    """The compute-only controls of one record, per dtype and schedule, over the configurations with both
    (records of schema v2: ``compute_sched_ms``): ``compute_only_geomean`` / ``compute_only_worst`` = this
    schedule's kernel with every combine store local / Expert-Wave's the same way (what its tile order costs,
    > 1: slower), and ``combine_cost_geomean`` / ``combine_cost_max`` = the schedule's kernel / its own
    compute-only control (what the remote combine adds to it)."""
    sp = megamoe_speedups(df)
    ew = sp[sp.schedule == MEGAMOE_BASELINE].set_index(MEGAMOE_KEYS).compute_sched_ms.rename("_ewc")
    t = sp.join(ew, on=MEGAMOE_KEYS)
    t = t.assign(order=t.compute_sched_ms / t._ewc, comb=t.kernel_ms / t.compute_sched_ms).dropna(
        subset=["order", "comb"])
    g = t.groupby(["dtype", "schedule"], sort=False)
    return pd.DataFrame({"controls": g.order.count(), "compute_only_geomean": g.order.apply(geomean),
                         "compute_only_worst": g.order.max(), "combine_cost_geomean": g.comb.apply(geomean),
                         "combine_cost_max": g.comb.max()}).reset_index()


def megamoe_links_table(records: dict) -> pd.DataFrame:
    """Records side by side ({label: (df, meta)}): per record, dtype and schedule the measured geomean and max
    speedup over Expert-Wave (:func:`megamoe_summary`, with the model the sweep predicted with: geomean predicted,
    fraction within ±10 %, median |error| of the speedup) and the compute-only controls
    (:func:`megamoe_schedule_controls`). Columns: record, dtype, schedule, configs, expected, geomean_speedup,
    max_speedup, geomean_predicted, within_tolerance, median_abs_model_error, compute_only_geomean,
    compute_only_worst, combine_cost_geomean, combine_cost_max."""
    out = []
    for label, (df, _) in records.items():
        summ = megamoe_summary(df)
        ctl = megamoe_schedule_controls(df)
        t = summ.merge(ctl, on=["dtype", "schedule"], how="left").assign(record=label)
        out.append(t[["record", "dtype", "schedule", "configs", "expected", "geomean_speedup", "max_speedup",
                      "geomean_predicted", "within_tolerance", "median_abs_model_error", "compute_only_geomean",
                      "compute_only_worst", "combine_cost_geomean", "combine_cost_max"]])
    if not out:
        raise ValueError("no records")
    return pd.concat(out, ignore_index=True)


def megamoe_headline(summary: pd.DataFrame, schedule: str = "interleaved") -> dict[str, str]:
    """One line per figure for its caption's ``ours`` (from :func:`megamoe_summary`): ``speedup``, ``model``,
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


# ------------------------------------------------------------------------------- the stage model, per link
# The machines whose records carry each link (what notebooks 01/02 show side by side): NVLink on the 2x H200
# pair, the host link (pinned host memory over PCIe) on one H200.
LINK_TARGET = {"nvlink": "remote", "host": "host"}
RUNG_ORDER = ("fluid", "capacity(P)", "shares", "pool", "stage", "free_store")   # the ladder; each link's full model
# is fit.FULL_RUNG's (NVLink: stage; the host link since session 24: free_store, the rung after stage)


def train_data(source: str = "recorded", machine: str = "h200x1") -> tuple[pd.DataFrame, dict]:
    """Irregular free-running trains (schema xstage.data.BURST_TRAIN). recorded only: a gpu run records with
    ``xstage sweep trains`` (seconds), which the notebooks do not start themselves."""
    src = _check_source(source)
    if src != "recorded":
        raise ValueError("train data is replayed from data/ (record it with `xstage sweep trains --out DIR`)")
    df, meta = data.load(_recorded("trains", machine), data.BURST_TRAIN)
    return df, {**meta, "source": "recorded"}


def stage_fits(links=("nvlink", "host"), rungs=RUNG_ORDER) -> dict:
    """The written fits (data/<machine>/stage_fit_<link>[_<rung>].json) of every link and rung that exists:
    {(link, rung): fit dict with its tables}. A missing rung is left out; a missing full fit (fit.FULL_RUNG) is an
    error."""
    from .fit import full_rung, read_stage_fit

    out = {}
    for link in links:
        for rung in rungs:
            try:
                out[(link, rung)] = read_stage_fit(data.machine_dir(LINK_MACHINES[link]), link, rung)
            except ValueError:
                if rung == full_rung(link):
                    raise
    return out


def stage_errors(fits: dict, min_ns: float = 1000.0) -> pd.DataFrame:
    """Held-out (by train) median and p90 |error| per link, rung and kind of record (bursts >= ``min_ns``)."""
    from .fit import error_summary

    rows = []
    for (link, rung), f in fits.items():
        e = error_summary(f["heldout_table"], min_ns).reset_index()
        rows.append(e.assign(link=link, rung=rung))
    t = pd.concat(rows, ignore_index=True)
    t["rung"] = pd.Categorical(t.rung, RUNG_ORDER, ordered=True)
    return t.sort_values(["link", "rung", "kind"]).reset_index(drop=True)[
        ["link", "rung", "kind", "median_abs_error", "p90_abs_error", "bursts"]]


def stage_params(fits: dict) -> pd.DataFrame:
    """The full model's parameters per link (fit.FULL_RUNG) with their 95 % intervals: the stage parameters, then
    the rung's own (host: free entries f, fitted, and their bound F, fixed: equal ends)."""
    from .fit import RUNG_FIXED, STAGE_UNITS, _rung_params, full_rung

    rows = []
    for (link, rung), f in fits.items():
        if rung != full_rung(link):
            continue
        vals = {**f["params"], "span_overhead_ns": f["span_overhead_ns"]}
        for k in (*_rung_params(rung), *RUNG_FIXED.get(rung, {})):
            rows.append(dict(link=link, parameter=k, value=vals[k], ci95_low=f["ci95_low"][k],
                             ci95_high=f["ci95_high"][k], unit=STAGE_UNITS[k]))
    return pd.DataFrame(rows)


def _sync_as_rows(t: pd.DataFrame, col: str, target: str) -> pd.DataFrame:
    """A fit table's synchronised rows in the burst-gap schema's shape (span_ns = ``col``)."""
    s = t[t.kind == "sync"].copy()
    parts = s.train.str.split(":", expand=True)
    return pd.DataFrame({"target": target, "store_bytes": 16, "drain": False, "programs": s.programs.to_numpy(),
                         "burst_bytes": parts[2].astype(int).to_numpy(), "gap_ns": parts[3].astype(int).to_numpy(),
                         "burst": s.burst.to_numpy(), "span_ns": s[col].to_numpy()})


def onset_model_vs_measured(fit_obj: dict, threshold: float = 1.5, gap_us: float = 0.0) -> pd.DataFrame:
    """Onset of backpressure per program count, measured and predicted by the same rule on the same grid
    (:func:`measured_onset` over :func:`slowdown_table` of the first bursts): the prediction is each held-out
    configuration's (its fold fitted without it). KiB per program; ``ratio`` = model / measured."""
    t = fit_obj["heldout_table"]
    target = LINK_TARGET[fit_obj["link"]]
    out = {}
    for name, col in (("measured_onset_kib", "measured_ns"), ("model_onset_kib", "predicted_ns")):
        rows = _sync_as_rows(t, col, target)
        out[name] = measured_onset(slowdown_table(rows, target, 16, gap_us, "first"), threshold) / KIB
    res = pd.DataFrame(out).rename_axis("programs").reset_index()
    res["ratio"] = res.model_onset_kib / res.measured_onset_kib
    res.insert(0, "link", fit_obj["link"])
    return res


def trains_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per (target, train, programs, burst): median over repeats of the median / p10 / p90 program and the
    start skew, with the burst's size and the gap after it."""
    return (df.groupby(["target", "train", "programs", "burst"], as_index=False)
            .agg(burst_bytes=("burst_bytes", "first"), gap_ns=("gap_ns", "first"), issue_ns=("issue_ns", "median"),
                 issue_p10_ns=("issue_p10_ns", "median"), issue_p90_ns=("issue_p90_ns", "median"),
                 start_skew_ns=("start_skew_ns", "median")))


def score_trains(folder, link: str = "host", min_ns: float = 1000.0, prm=None, drop_legacy_reads: bool = False
                 ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A link's fitted stage model (xstage.model.load_params, unchanged; or ``prm``, e.g. another rung's fit)
    against trains recorded apart from its fit (``folder``'s burst_train record): per (train, programs, burst)
    measured median program and prediction, and the median / p90 |error| over bursts >= ``min_ns``.
    The bursts of :func:`xstage.data.legacy_read_bursts` (the legacy kernel's read, which waits behind the
    program's stores) are predicted with that wait (``predict_train(read_fence=...)``) where the arbitration
    models it; ``drop_legacy_reads``: they are predicted in their train but not scored."""
    from .model import load_params, models_read_fence, predict_train

    if prm is None:
        prm = load_params(data.machine_dir(LINK_MACHINES[link]), link)
    df, meta = data.load(folder, data.BURST_TRAIN)
    t = trains_summary(df[df.target == LINK_TARGET[link]])
    parts = []
    for (name, p), g in t.groupby(["train", "programs"], sort=False):
        g = g.sort_values("burst")
        fence = data.legacy_read_bursts(meta, len(g)) if models_read_fence(prm) else ()
        parts.append(g.assign(predicted_ns=predict_train(prm, int(p), g.burst_bytes.to_numpy(),
                                                         g.gap_ns.to_numpy(), read_fence=fence)))
    rows = pd.concat(parts, ignore_index=True).rename(columns={"issue_ns": "measured_ns"})
    if drop_legacy_reads:
        rows = rows[~rows.burst.isin(data.legacy_read_bursts(meta, int(rows.burst.max()) + 1))].reset_index(drop=True)
    rows["rel_error"] = rows.predicted_ns / rows.measured_ns - 1
    big = rows[rows.measured_ns >= min_ns]
    a = big.rel_error.abs()
    summary = pd.DataFrame({"median_abs_error": [a.median()], "p90_abs_error": [a.quantile(0.9)],
                            "bursts": [len(big)], "median_abs_error_above_320kib":
                            [big[big.burst_bytes > 320 * KIB].rel_error.abs().median()]})
    return rows, summary


TRAIN_SMALL = "trains_small_bursts"   # session 18 (S18-2): bursts 2-48 KiB, gaps 0.5-50 us, P 66-200, per program, recorded
                                  # after the full model and every candidate rung were written
# the held-out families re-recorded with the clean kernel (stage trains-clean of scripts/device_session.sh, run S22-1:
# the same seeds, sizes, gaps and program counts, and seed 22, never recorded before), scored where recorded
CLEAN_SCORED_RECORDS = ("independent_clean", "train_programs_p_clean", "train_programs_new_p_clean",
                        "train_small_clean", "train_seed22_clean")
LEGACY_SCORED_RECORDS = ("independent", "train_programs_p", "train_programs_new_p", TRAIN_SMALL)   # legacy kernel
SCORED_TRAIN_RECORDS = (*LEGACY_SCORED_RECORDS, *CLEAN_SCORED_RECORDS)   # never fitted (those present)


def scores_by_programs(link: str = "host", machine: str = "h200x1", min_ns: float = 1000.0, prm=None,
                       records=SCORED_TRAIN_RECORDS) -> pd.DataFrame:
    """The fitted model on every never-fitted train record of ``machine`` (:data:`SCORED_TRAIN_RECORDS`), per
    record and program count: bursts >= ``min_ns``, median / p90 |error| and the median signed error (> 0: the
    model is too slow), plus each record's row over all its program counts (programs = 0)."""
    rows = []
    for sub in records:
        folder = data.machine_dir(machine) / sub
        if not data.paths(folder, data.BURST_TRAIN)[0].is_file():
            continue
        r, _ = score_trains(folder, link, min_ns, prm)
        r = r[r.measured_ns >= min_ns]
        for P, g in [*r.groupby("programs"), (0, r)]:
            e = g.rel_error
            rows.append({"record": sub, "programs": int(P), "bursts": len(g), "median_abs_error": e.abs().median(),
                         "p90_abs_error": e.abs().quantile(0.9), "median_error": e.median()})
    return pd.DataFrame(rows)


TRAIN_PROCESSES = ("train_processes_p0", "train_processes_p1", "train_processes_p2")   # S8-1: one chip, 3 processes


def record_floor(machine: str = "h200x1", min_ns: float = 1000.0) -> pd.DataFrame:
    """What a second record of the same trains reproduces, per program count: median |ratio - 1| of the median
    program's issue time (median over repeats) between two records of the same (train, programs, burst), bursts
    >= ``min_ns`` in the first. Pairs: processes on one chip (S8-1, :data:`TRAIN_PROCESSES`), and records made
    in other calls, on another chip or the same (the fitted seed-0 family, S7-1's re-record, S8-1's first process). The
    floor under any model's error on a record it was not fitted on; ``within`` is the repeats' own spread."""
    root = data.machine_dir(machine)
    recs = {"fitted family": root, "S7-1": root / TRAIN_PROGRAMS}
    recs.update({f"S8-1 process {i}": root / sub for i, sub in enumerate(TRAIN_PROCESSES)})
    key = ["train", "programs", "burst"]
    med, within = {}, {}
    for name, folder in recs.items():
        if not data.paths(folder, data.BURST_TRAIN)[0].is_file():
            continue
        df, _ = data.load(folder, data.BURST_TRAIN)
        df = df[df.target == "host"]
        med[name] = df.groupby(key).issue_ns.median()
        within[name] = df.groupby(key).issue_ns.agg(lambda x: (x / x.median() - 1).abs().median())
    pairs = [("S8-1 process 0", "S8-1 process 1", "processes, one call"),
             ("S8-1 process 0", "S8-1 process 2", "processes, one call"),
             ("S8-1 process 1", "S8-1 process 2", "processes, one call"),
             ("fitted family", "S8-1 process 0", "records, two calls"),
             ("fitted family", "S7-1", "records, two calls"),
             ("S7-1", "S8-1 process 0", "records, two calls")]
    rows = []
    for a, b, kind in pairs:
        if a not in med or b not in med:
            continue
        j = pd.concat([med[a].rename("a"), med[b].rename("b")], axis=1).dropna()
        j = j[j.a >= min_ns].reset_index()
        j["e"] = (j.b / j.a - 1).abs()
        w = within[a].reindex(pd.MultiIndex.from_frame(j[key])).to_numpy()
        for P, g in j.groupby("programs"):
            rows.append({"pair": f"{a} / {b}", "kind": kind, "programs": int(P), "bursts": len(g),
                         "median_abs_ratio": g.e.median(), "p90_abs_ratio": g.e.quantile(0.9),
                         "within_repeats": float(np.nanmedian(w[g.index]))})
    return pd.DataFrame(rows)


TRAIN_PROGRAMS = "train_programs"   # under data/h200x1/: the seed-0 host trains again, per program with its SM
TRAIN_PROGRAMS_P = "train_programs_p"   # under data/h200x1/: seed-7 trains at 12 program counts (another process)
CONTENDED = 3.0                      # a burst is contended when its median program takes > 3x its unimpeded issue
FAVOURED = 1.2                       # a program is favoured when it drains >= 1.2x its burst's median program


def train_programs_data(machine: str = "h200x1", sub: str = TRAIN_PROGRAMS) -> tuple[pd.DataFrame, dict]:
    """A per-program train record (schema xstage.data.BURST_PROGRAM, ``xstage sweep trains --per-program``)."""
    return data.load(data.machine_dir(machine) / sub, data.BURST_PROGRAM)


def program_rates(pp: pd.DataFrame, link: str = "host") -> pd.DataFrame:
    """Every program's every contended burst (its grid's median program slowed > ``CONTENDED`` x the burst's
    unimpeded issue, b / r + o with the link's fitted r and o) with ``rel``: the median program's issue time over
    this program's (> 1: it got more of the drain than the median program) and ``rank`` (0 fastest, 1 slowest)."""
    from .model import load_params

    prm = load_params(data.machine_dir(LINK_MACHINES[link]), link)
    pp = pp[pp.target == LINK_TARGET[link]]
    if pp.empty:
        raise ValueError(f"no per-program rows for the {link} link (target {LINK_TARGET[link]!r})")
    key = ["train", "programs", "repeat", "burst"]
    unimpeded = pp.burst_bytes / prm.program_rate + prm.overhead_ns
    med = pp.groupby(key).issue_ns.transform("median")
    c = pp[med > CONTENDED * unimpeded].copy()
    c["rel"] = med[c.index] / c.issue_ns
    c["rank"] = (c.groupby(key).issue_ns.rank(method="average") - 1) / (c.programs - 1).clip(lower=1)
    return c


SMALL_BURST_KIB = (0, 2, 4, 8, 16, 32)                  # size bins of small_burst_contention, KiB per program
ACTIVE_BINS = (-0.01, 0.05, 0.2, 0.4, 0.6, 0.8, 1.0)     # share of the other programs inside a burst


def _active_share(start, end, weight, total) -> np.ndarray:
    """For each interval i: the weight of the OTHER intervals that hold its start (start_j <= start_i < end_j),
    over ``total``."""
    s, e, w = (np.asarray(x, np.float64) for x in (start, end, weight))
    inside = (s[None, :] <= s[:, None]) & (e[None, :] > s[:, None])
    np.fill_diagonal(inside, False)
    return (inside * w[None, :]).sum(axis=1) / total


def small_burst_contention(pp: pd.DataFrame, link: str = "host", min_programs: int = 66, prm=None,
                           read_fence=()) -> pd.DataFrame:
    """Small bursts (<= 32 KiB per program) of free-running trains by how busy the link is when they start: per
    program-burst of the per-program record ``pp`` (schema burst_program; grids of >= ``min_programs``) the share of
    the other programs inside a burst at its start (``active``), binned (:data:`ACTIVE_BINS`) against the burst's
    size (:data:`SMALL_BURST_KIB`): the median issue time (``measured_ns``), the share over 3 us (``slow``) and the
    count. With ``prm`` (a StageParams, e.g. ``model.load_params``) the same from the model's simulated programs of
    the same trains (``model_ns``, ``model_slow``; its weight groups stand for their programs). Session 17,
    measured: a small burst issues at the issue rate while few of the others are inside a burst and waits for about
    its share of the drain once most are; the full model agrees at the busy end and makes small bursts wait at
    5-60 % busy, where the measured ones mostly do not. ``read_fence``: the bursts the model simulates with the
    legacy kernel's read wait (``data.legacy_read_bursts`` of the record's sidecar; session 21)."""
    from .model import models_read_fence, simulate_stage

    pp = pp[(pp.target == LINK_TARGET[link]) & (pp.programs >= min_programs)]
    if pp.empty:
        raise ValueError(f"no per-program rows for the {link} link with >= {min_programs} programs")
    rows, model_rows = [], []
    for (tr, P, rep), g in pp.groupby(["train", "programs", "repeat"], sort=False):
        e = g.start_ns.to_numpy() + g.issue_ns.to_numpy()
        act = _active_share(g.start_ns.to_numpy(), e, np.ones(len(g)), float(P))
        small = g.burst_bytes.to_numpy() <= SMALL_BURST_KIB[-1] * KIB
        rows.append(pd.DataFrame({"kib": g.burst_bytes.to_numpy()[small] / KIB, "active": act[small],
                                  "ns": g.issue_ns.to_numpy()[small]}))
    if prm is not None:
        trains = pp.groupby(["train", "programs", "burst"], sort=False).agg(b=("burst_bytes", "first"),
                                                                           gap=("gap_ns", "first")).reset_index()
        for (tr, P), g in trains.groupby(["train", "programs"], sort=False):
            g = g.sort_values("burst")
            b, gap = g.b.to_numpy(np.float64), g.gap.to_numpy(np.float64)
            fence = np.isin(np.arange(len(b)), list(read_fence))[None] if models_read_fence(prm) else None
            st, en, m = simulate_stage(prm, [P], b[None], gap[None], [False], read_fence=fence)
            ok = np.isfinite(st[0, :, 0])
            s_, e_, w = st[0, ok].ravel(), en[0, ok].ravel(), np.repeat(m[0, ok], len(b))
            act = _active_share(s_, e_, w, float(P))
            kib = np.tile(b, ok.sum()) / KIB
            small = kib <= SMALL_BURST_KIB[-1]
            model_rows.append(pd.DataFrame({"kib": kib[small], "active": act[small], "ns": (e_ - s_)[small],
                                            "w": w[small]}))
    r = pd.concat(rows, ignore_index=True)
    bins = dict(size_kib=pd.cut(r.kib, SMALL_BURST_KIB), active=pd.cut(r.active, ACTIVE_BINS))
    out = (r.assign(**bins).groupby(["active", "size_kib"], observed=True)
           .agg(measured_ns=("ns", "median"), slow=("ns", lambda v: float((v > 3000).mean())), bursts=("ns", "size")))
    if model_rows:
        mr = pd.concat(model_rows, ignore_index=True)
        mr = mr.assign(size_kib=pd.cut(mr.kib, SMALL_BURST_KIB), active=pd.cut(mr.active, ACTIVE_BINS))

        def wmed(x):
            o = np.argsort(x.ns.to_numpy())
            c = np.cumsum(x.w.to_numpy()[o]) / x.w.sum()
            return float(x.ns.to_numpy()[o][np.searchsorted(c, 0.5)])
        gm = mr.groupby(["active", "size_kib"], observed=True)
        out = out.join(pd.DataFrame({"model_ns": gm.apply(wmed),
                                     "model_slow": gm.apply(lambda x: float((x.w * (x.ns > 3000)).sum() / x.w.sum()))}))
    return out.reset_index()


TRAIN_PROBE = "probe_trains"   # session 19 (S19-1): designed probe trains (remote_store.probe_family), per program


def _median_program(pp: pd.DataFrame) -> pd.Series:
    """A train record's median program per (train, programs, burst): the median over programs of each run, then the
    median over repeats. Per-program rows (schema burst_program) or burst_train rows (whose issue_ns is already each
    run's median program)."""
    key = ["train", "programs", "burst"]
    if "program" not in pp.columns:
        return pp.groupby(key).issue_ns.median()
    return pp.groupby(key + ["repeat"]).issue_ns.median().groupby(key).median()


def preload_ab(legacy: pd.DataFrame, legacy_meta: dict, preload: pd.DataFrame, link: str = "host",
               min_programs: int = 66, min_ns: float = 1000.0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """S20-2's A/B: the same trains recorded in one call with the legacy kernel (per-burst parameter reads,
    ``--no-preload``) and with the preload, both per program (schema burst_program). Per (train, programs, burst):
    the median program of each (median over repeats: ``legacy_ns``, ``preload_ns``) and ``ratio`` = legacy /
    preload. Per burst, over the grids of >= ``min_programs`` programs where either took >= ``min_ns``: the median
    ratio and the count (``legacy_read``: the bursts the legacy kernel read at, :func:`xstage.data.legacy_read_bursts`
    of the legacy record's sidecar ``legacy_meta``). The read wait predicts ratios > 1 at those bursts and ~1
    elsewhere (lab notebook, S20-2)."""
    def medians(pp, name):
        pp = pp[pp.target == LINK_TARGET[link]]
        if pp.empty:
            raise ValueError(f"the {name} record has no per-program rows for the {link} link")
        return _median_program(pp).rename(f"{name}_ns")

    rows = pd.concat([medians(legacy, "legacy"), medians(preload, "preload")], axis=1, join="inner").reset_index()
    if rows.empty:
        raise ValueError("the legacy and preload records share no (train, programs, burst)")
    if "burst_bytes" in preload.columns:   # for preload_ab_sizes
        sizes = preload[["train", "burst", "burst_bytes"]].drop_duplicates(["train", "burst"])
        rows = rows.merge(sizes, on=["train", "burst"], how="left")
    rows["ratio"] = rows.legacy_ns / rows.preload_ns
    rows["legacy_read"] = rows.burst.isin(data.legacy_read_bursts(legacy_meta, int(rows.burst.max()) + 1))
    sel = rows[(rows.programs >= min_programs) & ((rows.legacy_ns >= min_ns) | (rows.preload_ns >= min_ns))]
    per_burst = (sel.groupby("burst").agg(median_ratio=("ratio", "median"), rows=("ratio", "size"),
                                          legacy_read=("legacy_read", "first")).reset_index())
    return rows, per_burst


PRELOAD_AB_KIB = (0, 8, 16, 48, 128, np.inf)   # burst-size classes (KiB per program) of preload_ab_sizes


def preload_ab_sizes(rows: pd.DataFrame, min_ns: float = 1000.0, kib=PRELOAD_AB_KIB) -> pd.DataFrame:
    """:func:`preload_ab`'s rows by burst size and program count, the legacy-read bursts left out (what the read
    costs where the legacy kernel reads from L1): per (size class, programs) over the bursts either kernel took
    >= ``min_ns`` on, the median legacy / preload ratio, both medians (us) and the count. Session 22 (S20-2): small
    bursts pay it (0-8 KiB at P >= 66: 1.26-1.52), 8 KiB and larger do not (0.87-1.05)."""
    sel = rows[~rows.legacy_read & ((rows.legacy_ns >= min_ns) | (rows.preload_ns >= min_ns))]
    cls = pd.cut(sel.burst_bytes / 1024, list(kib), right=True)
    out = sel.groupby([cls, "programs"], observed=True).agg(
        median_ratio=("ratio", "median"), legacy_us=("legacy_ns", "median"), preload_us=("preload_ns", "median"),
        bursts=("ratio", "size")).reset_index().rename(columns={"burst_bytes": "kib"})
    out[["legacy_us", "preload_us"]] /= 1000
    out["kib"] = out.kib.astype(str)
    return out


def read_fence_probes(pp: pd.DataFrame, meta: dict, prm, link: str = "host", min_ns: float = 1000.0) -> pd.DataFrame:
    """The probe trains' read-wait bursts against the model with and without the read fence (session 21). Per probe
    train (lead, gap, programs) and burst of :func:`xstage.data.legacy_read_bursts` (the record's sidecar): the
    measured median program (median over repeats, ``measured_ns``) and the model's median program with the fence
    (``model_fence_ns``: ``predict_train(read_fence=...)``) and without it (``model_ns``), and their log ratios to
    the measurement; only bursts measured >= ``min_ns``. The probes are eleven identical 2 KiB bursts, so what sets
    bursts 4 and 8 apart is the read alone. ``prm``: StageParams (e.g. ``model.load_params``)."""
    from .model import predict_train

    pp = pp[pp.target == LINK_TARGET[link]]
    if pp.empty:
        raise ValueError(f"no per-program rows for the {link} link")
    n = int(pp.burst.max()) + 1
    fence = data.legacy_read_bursts(meta, n)
    if not fence:
        raise ValueError("this record has no legacy read bursts (made with the preload, or simulated)")
    med = _median_program(pp)
    rows = []
    for (tr, P), g in med.groupby(level=[0, 1], sort=False):
        one = pp[(pp.train == tr) & (pp.programs == P)]
        one = one[(one.repeat == one.repeat.min()) & (one.program == one.program.min())].sort_values("burst")
        b, gap = one.burst_bytes.to_numpy(np.float64), one.gap_ns.to_numpy(np.float64)
        with_f = predict_train(prm, int(P), b, gap, read_fence=fence)
        without = predict_train(prm, int(P), b, gap)
        meas = g.droplevel([0, 1]).reindex(range(len(b))).to_numpy()
        for k in fence:
            rows.append({"train": tr, "programs": int(P), "burst": k, "measured_ns": meas[k],
                         "model_fence_ns": with_f[k], "model_ns": without[k]})
    out = pd.DataFrame(rows)
    out = out[out.measured_ns >= min_ns].reset_index(drop=True)
    out["log_ratio_fence"] = np.log(out.model_fence_ns / out.measured_ns)
    out["log_ratio"] = np.log(out.model_ns / out.measured_ns)
    return out


LOAD_PROBE_BYTES = 16   # the model's stand-in for a load probe: a fenced 16-byte burst (one store's worth)


def load_probe_table(pp: pd.DataFrame, prm, link: str = "host") -> pd.DataFrame:
    """The load-after-store test (session 22; ``xstage sweep trains --per-program --load-probe 1|2``) against the
    read fence of the stage model. Per (train, programs, burst) of the per-program record ``pp``: the median
    program's issue time and load time (median over repeats: ``issue_ns``, ``load_ns``) and the model's wait for
    that load (``model_wait_ns``): the train with a fenced LOAD_PROBE_BYTES burst after every burst (gap 0 before it,
    the burst's gap after it), whose issue time less the model's overhead is how long the program's own stores
    held it. ``prm``: StageParams with a fence (:data:`xstage.model.FENCE_ARBITRATIONS`)."""
    from .model import FENCE_ARBITRATIONS, predict_train

    if prm.arbitration not in FENCE_ARBITRATIONS:
        raise ValueError(f"the load's wait needs a model that keeps each program's stores: arbitration one of "
                         f"{', '.join(FENCE_ARBITRATIONS)}, got {prm.arbitration!r}")
    pp = pp[pp.target == LINK_TARGET[link]]
    if pp.empty or pp.load_ns.isna().all():
        raise ValueError(f"no load-probe rows for the {link} link (a record made with --load-probe 1 or 2)")
    key = ["train", "programs", "burst"]
    runs = pp.groupby(key + ["repeat"]).agg(issue_ns=("issue_ns", "median"), load_ns=("load_ns", "median"))
    med = runs.groupby(key).median().reset_index()
    rows = []
    for (tr, P), g in med.groupby(["train", "programs"], sort=False):
        one = pp[(pp.train == tr) & (pp.programs == P)]
        one = one[(one.repeat == one.repeat.min()) & (one.program == one.program.min())].sort_values("burst")
        b, gap = one.burst_bytes.to_numpy(np.float64), one.gap_ns.to_numpy(np.float64)
        n = len(b)
        b2 = np.ravel(np.column_stack([b, np.full(n, float(LOAD_PROBE_BYTES))]))
        g2 = np.ravel(np.column_stack([np.zeros(n), gap]))
        t = predict_train(prm, int(P), b2, g2, read_fence=range(1, 2 * n, 2))
        g = g.sort_values("burst")
        rows.append(g.assign(model_issue_ns=t[0::2], model_wait_ns=np.maximum(t[1::2] - prm.overhead_ns, 0.0)))
    return pd.concat(rows, ignore_index=True)


def probe_summary(pp: pd.DataFrame, link: str = "host", prm=None) -> pd.DataFrame:
    """The probe trains (``remote_store.probe_family``: a lead burst of A KiB per program, a gap g, then 2 KiB probes
    3 us apart; or ``probe_size_family``: probes of S KiB) from their per-program record ``pp`` (schema
    burst_program): per (lead KiB, gap, probe KiB, programs), medians
    over repeats of the per-run statistics: the lead burst's median program and its ratio to the fastest program's
    (``lead_ns``, ``lead_spread``), the first probe's median / p10 / p90 program (``probe1_ns``, ``probe1_p10_ns``,
    ``probe1_p90_ns``), the share of programs whose first probe took over 1 us (``probe1_slow``), the probes' total
    for the median program (``probes_ns``), how the first probe's time follows the program's own lead time
    (``spearman``: over the programs of one run) and how bunched the first probes' ends are against their starts
    (``end_over_start_spread``: p10-p90 spread of the ends / of the starts; << 1: released together). With ``prm``
    (xstage.model StageParams) the model's median program for the lead and the first probe beside them
    (``model_lead_ns``, ``model_probe1_ns``)."""
    from scipy.stats import spearmanr

    pp = pp[pp.target == LINK_TARGET[link]]
    if pp.empty:
        raise ValueError(f"no per-program rows for the {link} link")
    if (pp.burst.max() < 1) or not pp.train.str.match(r"^(p[0-9.]+-g[0-9.]+|s[0-9.]+-p[0-9.]+)$").all():
        raise ValueError("probe_summary reads a probe family's record (trains named pA-gG or sS-pA with >= 2 "
                         "bursts)")
    rows = []
    for (tr, P, rep), g in pp.groupby(["train", "programs", "repeat"], sort=False):
        g = g.sort_values(["program", "burst"])
        lead = g[g.burst == 0].set_index("program")
        p1 = g[g.burst == 1].set_index("program")
        probes = g[g.burst >= 1].groupby("program").issue_ns.sum()
        e1 = p1.start_ns + p1.issue_ns
        s_spread = float(np.subtract(*np.percentile(p1.start_ns, [90, 10])))
        e_spread = float(np.subtract(*np.percentile(e1, [90, 10])))
        x, y = lead.issue_ns, p1.issue_ns.reindex(lead.index)
        rho = spearmanr(x, y).statistic if P > 2 and x.nunique() > 1 and y.nunique() > 1 else np.nan
        rows.append({"train": tr, "programs": int(P), "repeat": int(rep),
                     "lead_kib": float(lead.burst_bytes.iloc[0]) / KIB, "gap_us": float(lead.gap_ns.iloc[0]) / 1e3,
                     "probe_kib": float(p1.burst_bytes.iloc[0]) / KIB,
                     "lead_ns": float(lead.issue_ns.median()),
                     "lead_spread": float(lead.issue_ns.median() / max(lead.issue_ns.min(), 1e-9)),
                     "probe1_ns": float(p1.issue_ns.median()),
                     "probe1_p10_ns": float(np.percentile(p1.issue_ns, 10)),
                     "probe1_p90_ns": float(np.percentile(p1.issue_ns, 90)),
                     "probe1_slow": float((p1.issue_ns > 1000).mean()),
                     "probes_ns": float(probes.median()), "spearman": float(rho),
                     "end_over_start_spread": e_spread / s_spread if s_spread > 0 else np.nan})
    r = pd.DataFrame(rows)
    out = (r.groupby(["lead_kib", "gap_us", "probe_kib", "programs", "train"], as_index=False)
           .median(numeric_only=True).drop(columns="repeat"))
    if prm is not None:
        from .model import predict_train

        trains = pp.groupby(["train", "programs", "burst"]).agg(b=("burst_bytes", "first"),
                                                               gap=("gap_ns", "first")).reset_index()
        ml, m1 = [], []
        for row in out.itertuples():
            t = trains[(trains.train == row.train) & (trains.programs == row.programs)].sort_values("burst")
            pr = predict_train(prm, int(row.programs), t.b.to_numpy(np.float64), t.gap.to_numpy(np.float64))
            ml.append(float(pr[0]))
            m1.append(float(pr[1]))
        out = out.assign(model_lead_ns=ml, model_probe1_ns=m1)
    return out.sort_values(["programs", "lead_kib", "gap_us", "probe_kib"]).reset_index(drop=True)


def program_favour(pp: pd.DataFrame, link: str = "host") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Which programs the stage favours when it is full, from the per-program record: per (programs, SM) the
    median ``rel`` over its contended bursts (:func:`program_rates`), and per program count a summary: the
    quantiles of that per-SM favour, the share of SMs favoured (>= ``FAVOURED``), how the favour persists
    (Spearman of the per-SM favour between repeats, mean over pairs) and how one burst's order predicts the
    next contended burst's in the same run (Spearman of the programs' ranks, median over burst pairs)."""
    from scipy.stats import spearmanr

    c = program_rates(pp, link)
    per_sm = c.groupby(["programs", "smid"], as_index=False).agg(rel=("rel", "median"), bursts=("rel", "size"))
    rows = []
    for P, g in c.groupby("programs"):
        by_rep = g.groupby(["repeat", "smid"]).rel.median().unstack(0)
        reps = list(by_rep.columns)
        across = [spearmanr(by_rep[a], by_rep[b], nan_policy="omit").statistic
                  for i, a in enumerate(reps) for b in reps[i + 1:]]
        nxt = []
        for _, run in g.groupby(["train", "repeat"]):
            ranks = run.pivot_table(index="program", columns="burst", values="rank")
            cols = list(ranks.columns)
            nxt += [spearmanr(ranks[a], ranks[b], nan_policy="omit").statistic for a, b in zip(cols, cols[1:])]
        f = per_sm[per_sm.programs == P].rel
        q = f.quantile([0.1, 0.5, 0.9])
        rows.append({"programs": int(P), "contended_bursts": int(g.groupby(["train", "repeat", "burst"]).ngroups),
                     "sms": int(f.size), "favour_p10": q[0.1], "favour_median": q[0.5], "favour_p90": q[0.9],
                     "favour_max": f.max(), "favoured_share": float((f >= FAVOURED).mean()),
                     "persistence_across_repeats": float(np.nanmean(across)) if across else np.nan,
                     "next_burst_rank_spearman": float(np.nanmedian(nxt)) if nxt else np.nan})
    return per_sm, pd.DataFrame(rows)


TRAIN_GPC = "train_gpc"       # under data/h200x1/: seed-7 per-program trains, P = 16-66, the GPC map read in-process
GPC_MAP_MIN_CLUSTER = 4       # clusters of 2 pair a TPC's SMs only; from 4 up a cluster's CTAs share a GPC


def gpc_map(path) -> pd.DataFrame:
    """The SM -> GPC map of a ``scripts/gpc_map.cu`` record (JSON lines: the device, then one line per launch with
    every CTA's [block, cluster, rank, smid]). A thread-block cluster runs in one GPC, so SMs that ever ran CTAs of
    one cluster of >= :data:`GPC_MAP_MIN_CLUSTER` share a GPC (union over every launch). Returns per SM: ``gpc``
    (the smallest SM of its group; -1: the SM never ran in such a cluster, e.g. a TPC that only takes clusters
    of <= 2) and ``gpc_sms`` (the group's size; 1 for -1); ``attrs``: the device's uuid and SM count.
    A malformed record is a ValueError naming the file and line."""
    from pathlib import Path

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no GPC map record {path} (bash scripts/gpc_map.sh on a GPU writes one)")
    lines = path.read_text(encoding="utf-8").splitlines()
    try:
        head = json.loads(lines[0])
        S = int(head["sm_count"])
    except (IndexError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}:1: not a gpc_map.cu record (its first line names the device and sm_count): {e}")
    parent = list(range(S))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    launches = 0
    for i, line in enumerate(lines[1:], start=2):
        try:
            rec = json.loads(line)
            cs = int(rec["cluster_size"])
            if "error" in rec:
                continue                       # a cluster size the device refused (the record says why)
            clusters: dict[int, list[int]] = {}
            for b, c, r, sm in rec["blocks"]:
                if not 0 <= int(sm) < S:
                    raise ValueError(f"smid {sm} outside 0..{S - 1}")
                clusters.setdefault(int(c), []).append(int(sm))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{i}: malformed gpc_map line: {e}") from None
        launches += 1
        if cs >= GPC_MAP_MIN_CLUSTER:
            for sms in clusters.values():
                for sm in sms[1:]:
                    parent[find(sm)] = find(sms[0])
    if not launches:
        raise ValueError(f"{path}: no launches recorded")
    groups: dict[int, list[int]] = {}
    for sm in range(S):
        groups.setdefault(find(sm), []).append(sm)
    gpc = np.full(S, -1)
    size = np.ones(S, int)
    for sms in groups.values():
        if len(sms) > 1:
            gpc[sms], size[sms] = min(sms), len(sms)
    out = pd.DataFrame({"smid": np.arange(S), "gpc": gpc, "gpc_sms": size})
    out.attrs.update(uuid=head.get("uuid", ""), sm_count=S)
    return out


def favour_by_gpc(machine: str = "h200x1", sub: str = TRAIN_GPC, link: str = "host") -> tuple[pd.DataFrame, pd.DataFrame]:
    """The drain's share per SM against the GPC the SM is in, from a per-program record whose process also read
    the chip's GPC map (``scripts/trains_gpc.sh``: ``gpc_map_before.jsonl`` beside the trains). First bursts only
    (every program starts together into an empty stage), contended ones (:func:`program_rates`). Returns (per
    program count and SM: median ``rel`` -- the burst's median program's time over this program's --, its GPC
    and how many of the grid's programs run in that GPC; per program count and GPC: its programs and the median,
    min and max of its SMs' ``rel``). SMs outside every cluster-schedulable GPC (gpc -1) form one row."""
    folder = data.machine_dir(machine) / sub
    gm = gpc_map(folder / "gpc_map_before.jsonl").set_index("smid")
    pp, _ = train_programs_data(machine, sub)
    c = program_rates(pp, link)
    c = c[c.burst == 0]
    per_sm = c.groupby(["programs", "smid"], as_index=False).rel.median()
    per_sm["gpc"] = gm.gpc.reindex(per_sm.smid).to_numpy()
    used = pp[pp.target == LINK_TARGET[link]].drop_duplicates(["programs", "program"])[["programs", "smid"]]
    used = used.assign(gpc=gm.gpc.reindex(used.smid).to_numpy())
    in_gpc = used.groupby(["programs", "gpc"]).size().rename("programs_in_gpc").reset_index()
    per_sm = per_sm.merge(in_gpc, on=["programs", "gpc"], how="left")
    summary = (per_sm.groupby(["programs", "gpc"], as_index=False)
               .agg(programs_in_gpc=("programs_in_gpc", "first"), sms=("smid", "size"), rel_median=("rel", "median"),
                    rel_min=("rel", "min"), rel_max=("rel", "max"))
               .sort_values(["programs", "rel_median"]))
    return per_sm, summary.reset_index(drop=True)


def placement_share(pp: pd.DataFrame, link: str = "host", first: bool = False) -> pd.DataFrame:
    """How a program's placement sets its share of a full stage's drain, from a per-program record: every
    contended burst's programs (:func:`program_rates`) by how many programs share its SM (``on_sm``) and its TPC
    (``on_tpc``; TPC t = SMs 2t, 2t + 1). Per (programs, on_sm, on_tpc): program-bursts, the median ``rel``
    (> 1: it drains faster than its burst's median program) and ``weight``, the share arbitration="tpc"
    (xstage.model.placement_classes) gives such a program: 1 / (occupied SMs of its TPC x programs on its SM).
    ``first``: only each train's first burst (into an empty stage, every program starting together)."""
    c = program_rates(pp, link)
    if first:
        c = c[c.burst == 0]
    key = ["train", "programs", "repeat", "burst"]
    c = c.assign(tpc=c.smid // 2)
    c["on_sm"] = c.groupby(key + ["smid"]).program.transform("size")
    c["on_tpc"] = c.groupby(key + ["tpc"]).program.transform("size")
    occ = c.groupby(key + ["tpc"]).smid.transform("nunique")
    c["weight"] = 1.0 / (occ * c.on_sm)
    return (c.groupby(["programs", "on_sm", "on_tpc"], as_index=False)
            .agg(program_bursts=("rel", "size"), rel_median=("rel", "median"), weight=("weight", "median")))


FIRST_BURST_RECORDS = ("", "independent", TRAIN_PROGRAMS, TRAIN_PROGRAMS_P, "train_programs_new_p",
                       *TRAIN_PROCESSES)   # under data/h200x1/ ("": the fitted family itself)


def first_burst_capacity(link: str = "host", machine: str = "h200x1") -> pd.DataFrame:
    """The stage's capacity per program count as the first bursts of the trains show it: a burst into an empty
    stage whose median program takes > ``CONTENDED`` x its unimpeded issue held C = P b - D (t - b / r - o) when
    its median program finished (D, r, o: the link's fitted stage model). Per program count over every train
    record of ``machine`` (:data:`FIRST_BURST_RECORDS`): bursts, the median and quartiles of C (KiB), and the
    fitted model's C(P) beside it."""
    from .model import load_params

    prm = load_params(data.machine_dir(LINK_MACHINES[link]), link)
    parts = []
    for sub in FIRST_BURST_RECORDS:
        folder = data.machine_dir(machine) / sub
        if not data.paths(folder, data.BURST_TRAIN)[0].is_file():
            continue
        df, _ = data.load(folder, data.BURST_TRAIN)
        df = df[(df.target == LINK_TARGET[link]) & (df.burst == 0)]
        g = df.groupby(["train", "programs"], as_index=False).agg(b=("burst_bytes", "first"), t=("issue_ns", "median"))
        parts.append(g.assign(record=sub or "fitted family"))
    if not parts:
        raise ValueError(f"no train record of {machine} for the {link} link")
    f = pd.concat(parts, ignore_index=True)
    unimpeded = f.b / prm.program_rate + prm.overhead_ns
    f = f[f.t > CONTENDED * unimpeded].copy()
    f["capacity_kib"] = (f.programs * f.b - prm.drain_gbps * (f.t - unimpeded[f.index])) / KIB
    out = f.groupby("programs").capacity_kib.describe()[["count", "25%", "50%", "75%"]]
    out = out.rename(columns={"count": "bursts", "25%": "capacity_p25_kib", "50%": "capacity_kib",
                              "75%": "capacity_p75_kib"}).reset_index()
    out["bursts"] = out.bursts.astype(int)
    out["model_kib"] = prm.capacity_bytes(out.programs.to_numpy()) / KIB
    return out


CANDIDATE_RUNGS = ("tpc", "processes", "gpc", "gpc_dyn", "gpc_uneven", "gpc_drain", "slots_issuing", "capped",
                   "pool_share", "stage_clean", "gpc_drain_clean", "free_store")   # fits written beside the full model
# (free_store_f2, session 24, is written too but scored in the lab notebook only: one rung more here took notebook
# 02's stage_candidates cell past the 300 s a cell may take in tests/test_reproduce.py)
# (data/h200x1/stage_fit_host_<rung>.json.gz), not adopted; the "*_clean" rungs (session 23) fit the trains as the
# clean kernel recorded them (fit.RUNG_TRAINS), so their held-out trains are clean trains
# (a rung whose fit is not written is left out; gpc_drain's fit is written since session 16: 20 min on one core with
# its fast path, model._stage_units; stage_rescored scores an arbitration with another rung's parameters). Every
# fit here was made before the read fence (session 21) but gpc_drain's, rewritten with it; the scores on never-fitted
# records simulate the fence for every rung whose arbitration has it (model.FENCE_ARBITRATIONS)


def stage_candidates(link: str = "host", records=LEGACY_SCORED_RECORDS) -> pd.DataFrame:
    """The full model beside every candidate rung whose fit is written (:data:`CANDIDATE_RUNGS`): per rung, the
    held-out-by-train median |error| of its fit (trains, free-running, synchronised) and its median |error| on each
    never-fitted train record of ``records`` (:data:`LEGACY_SCORED_RECORDS` by default, or the clean re-records
    :data:`CLEAN_SCORED_RECORDS`; bursts >= 1 us). Minutes: every rung predicts every record."""
    from .fit import RUNG_TRAINS, full_rung, read_stage_fit, stage_fit_name
    from .model import fit_file, params_from_dict

    folder = data.machine_dir(LINK_MACHINES[link])
    rows = []
    for rung in dict.fromkeys((full_rung(link), "stage", *CANDIDATE_RUNGS)):
        if not fit_file(folder / stage_fit_name(link, rung)).is_file():
            continue
        f = read_stage_fit(folder, link, rung)
        row = {"rung": rung, "full": rung == full_rung(link), "arbitration": f["params"].get("arbitration", "pool"),
               "fitted_trains": RUNG_TRAINS.get(rung, "burst_train")}   # clean or legacy: the held-out trains too
        row.update({f"heldout_{k}": v["median_abs_error"] for k, v in f["heldout"].items()})
        sc = scores_by_programs(link, prm=params_from_dict(f["params"]), records=records)
        row.update({f"never_fitted {r}": e for r, e in sc[sc.programs == 0].set_index("record").median_abs_error.items()})
        rows.append(row)
    return pd.DataFrame(rows)


def stage_rescored(arbitration: str, link: str = "host", base_rung: str = "stage", min_ns: float = 1000.0
                   ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """An arbitration scored with another rung's parameters, not refitted (for one too slow to fit, e.g.
    "gpc_drain"): held out by train, each of ``base_rung``'s folds refitted as its fit did (fit.fold_params, minutes)
    predicts its held-out trains under ``arbitration``; never fitted, the written ``base_rung`` parameters under
    ``arbitration`` (:func:`scores_by_programs`). Returns (row: stage_candidates' columns, rung "<arbitration> @
    <base_rung>"; per program count: held-out median |error| per kind of record, bursts >= ``min_ns``)."""
    from dataclasses import replace

    from .fit import _long, error_summary, fold_params, predict_observations, read_stage_fit
    from .model import StageParams

    folder = data.machine_dir(LINK_MACHINES[link])
    obs, folds = fold_params(folder, link, base_rung)
    parts = []
    for k, f in enumerate(folds):
        o = obs.take(f["test"])
        parts.append(_long(o, predict_observations(o, replace(f["params"], arbitration=arbitration),
                                                   f["span_overhead_ns"])).assign(fold=k))
    h = pd.concat(parts, ignore_index=True)
    h["rel_error"] = h.predicted_ns / h.measured_ns - 1
    row = {"rung": f"{arbitration} @ {base_rung}", "arbitration": arbitration}
    row.update({f"heldout_{k}": v for k, v in error_summary(h, min_ns).median_abs_error.items()})
    prm = replace(StageParams(**read_stage_fit(folder, link, base_rung)["params"]), arbitration=arbitration)
    sc = scores_by_programs(link, min_ns=min_ns, prm=prm, records=LEGACY_SCORED_RECORDS)
    row.update({f"never_fitted {r}": e for r, e in sc[sc.programs == 0].set_index("record").median_abs_error.items()})
    big = h[h.measured_ns >= min_ns]
    per_p = big.assign(a=big.rel_error.abs()).groupby(["kind", "programs"]).a.median().unstack(0)
    return pd.DataFrame([row]), per_p.rename_axis(columns=None).reset_index()


from .fit import TRAIN_CLEAN  # noqa: E402  (one name for the clean record of the fitted trains)


def heldout_on_record(rung: str = "stage", link: str = "host", sub: str = TRAIN_CLEAN, folds=None,
                      min_ns: float = 1000.0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Held out by train, measured in another record of the fitted trains: each fold of the written ``rung`` fit
    (:func:`xstage.fit.fold_params`: refitted without its trains, minutes; or ``folds`` as it returns them, for a
    test) predicts its held-out trains as recorded in ``sub`` (e.g. :data:`TRAIN_CLEAN`, the same trains with the
    clean kernel, whose small bursts carry no read wait: lab notebook, session 22). Returns (per burst: kind,
    train, programs, burst, measured_ns, predicted_ns, rel_error, fold; per program count and pooled ("all"): the
    median |error| over bursts >= ``min_ns`` and their count)."""
    from .fit import _long, fold_params, observations, predict_observations

    folder = data.machine_dir(LINK_MACHINES[link])
    if folds is None:
        obs, folds = fold_params(folder, link, rung)
    else:
        obs = observations(folder, link)
    both = observations(folder, link, records=(sub,))   # the fitted records, then sub's trains (same names)
    extra = both.cfgs.index[len(obs.cfgs):]
    where = {(t, int(p)): i for i, t, p in zip(extra, both.cfgs.train[extra], both.cfgs.programs[extra])}
    parts = []
    for k, f in enumerate(folds):
        te = obs.cfgs.iloc[np.asarray(f["test"])]
        idx = [where[(t, int(p))] for kind, t, p in zip(te.kind, te.train, te.programs)
               if kind == "train" and (t, int(p)) in where]
        if not idx:
            continue
        o = both.take(np.asarray(idx))
        parts.append(_long(o, predict_observations(o, f["params"], f["span_overhead_ns"])).assign(fold=k))
    if not parts:
        raise ValueError(f"{sub} holds none of the fitted trains of link {link}")
    h = pd.concat(parts, ignore_index=True)
    h["rel_error"] = h.predicted_ns / h.measured_ns - 1
    big = h[h.measured_ns >= min_ns].assign(abs_error=lambda d: d.rel_error.abs())
    per = big.groupby("programs").abs_error.agg(median_abs_error="median", bursts="size").reset_index()
    per = pd.concat([per.astype({"programs": object}),
                     pd.DataFrame([{"programs": "all", "median_abs_error": big.abs_error.median(),
                                    "bursts": len(big)}])], ignore_index=True)
    return h, per


# ------------------------------------------------------------------------------- the README's derived tables
README_STAGE_START = "<!-- stage table: regenerated by `make readme`, never edited by hand -->"
README_STAGE_END = "<!-- /stage table -->"


BARRIER_FOLDERS = {"release": "barrier_release", "relaxed": "barrier_relaxed"}   # under data/h200x1/


def barrier_harness(link: str = "host", min_ns: float = 1000.0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The synchronised sweep with its grid barrier's arrival a release (as every recorded sweep) and relaxed,
    the same grid in one run (data/<machine>/barrier_{release,relaxed}/), each burst's span beside the stage
    model's prediction (xstage.model.load_params(link), unchanged: these records were never fitted;
    ``barrier_drains`` as the harness is). Returns (rows: per mode, configuration and burst: measured span,
    predicted, the median program's barrier time; summary: per mode and first / later bursts, the median and
    p90 |error| over bursts of at least ``min_ns``, the median span and the median barrier time)."""
    from .fit import Observations, predict_observations, tidy_for_fit
    from .model import load_params

    machine = LINK_MACHINES[link]
    prm = load_params(data.machine_dir(machine), link)
    span_o = _span_overhead(link)
    parts = []
    for mode, sub in BARRIER_FOLDERS.items():
        df, _ = data.load(data.machine_dir(machine) / sub, data.BURST_GAP)
        t = tidy_for_fit(df, LINK_TARGET[link], 16, "span_ns")
        bar = (df[df.target == LINK_TARGET[link]].groupby(["programs", "burst_bytes", "gap_ns", "burst"])
               .barrier_ns.median().rename("barrier_ns").reset_index())
        t = t.merge(bar, on=["programs", "burst_bytes", "gap_ns", "burst"], how="left")
        for _, g in t.groupby(["programs", "burst_bytes", "gap_ns"], sort=True):
            g = g.sort_values("burst")
            cfg = pd.DataFrame({"kind": ["sync"], "train": [""], "programs": [int(g.programs.iloc[0])],
                                "n_bursts": [len(g)], "sm_count": [prm.sm_count]})
            obs = Observations(cfg, g.burst_bytes.to_numpy(float)[None], g.gap_eff_ns.to_numpy(float)[None],
                               g.issue_ns.to_numpy(float)[None], {})
            pred = predict_observations(obs, prm, span_o, barrier_drains=mode == "release")[0]
            parts.append(g.assign(barrier=mode, predicted_ns=pred))
    rows = pd.concat(parts, ignore_index=True).rename(columns={"issue_ns": "measured_ns"})
    rows["rel_error"] = rows.predicted_ns / rows.measured_ns - 1
    scored = rows[rows.measured_ns >= min_ns].assign(abs_err=lambda x: x.rel_error.abs(),
                                                      which=lambda x: np.where(x.burst == 0, "first", "later"))
    summary = scored.groupby(["barrier", "which"]).agg(
        bursts=("abs_err", "size"), median_abs_error=("abs_err", "median"),
        p90_abs_error=("abs_err", lambda e: e.quantile(0.9))).reset_index()
    both = rows.assign(which=np.where(rows.burst == 0, "first", "later")).groupby(["barrier", "which"]).agg(
        median_span_us=("measured_ns", lambda x: x.median() / 1e3),
        median_barrier_us=("barrier_ns", lambda x: x.median() / 1e3)).reset_index()
    return rows, summary.merge(both, on=["barrier", "which"], how="left")


def _span_overhead(link: str) -> float:
    from .fit import read_stage_fit

    return float(read_stage_fit(data.machine_dir(LINK_MACHINES[link]), link)["span_overhead_ns"])


DRAIN_FOLDER = "drain_programs"   # under data/h200x1/: long bursts, each followed by its drain fence


def drain_by_programs(link: str = "host") -> pd.DataFrame:
    """The link's drain rate with 1 to 132 programs storing at once, from the record of long bursts each
    followed by a system-scope fence (data/<machine>/drain_programs/): per (programs, bytes per program), the
    bytes of a burst over the time from its start to the last program's stores performed (median over bursts
    and repeats; the slowest program's issue plus its drain). GB/s."""
    df, _ = data.load(data.machine_dir(LINK_MACHINES[link]) / DRAIN_FOLDER, data.BURST_GAP)
    df = df[(df.target == LINK_TARGET[link]) & df.drain.astype(bool)]
    if df.empty:
        raise ValueError(f"{DRAIN_FOLDER}: no drain-timed rows for the {link} link")
    g = df.assign(gbps=df.programs * df.burst_bytes / (df.issue_ns_max + df.drain_ns_max))
    return (g.groupby(["programs", "burst_bytes"]).gbps.median().unstack("burst_bytes")
            .rename(columns=lambda b: f"{b // KIB} KiB").rename_axis(columns=None).reset_index())


def readme_stage_markdown() -> str:
    """The README's table of the link measurements and the stage model, derived from the recorded data and the
    written fits (the same functions the notebooks use): peak bandwidth per link, the parameters with 95 %
    intervals, held-out errors per kind of record, and the onset measured / predicted."""
    from .fit import RUNG_TRAINS, full_rung

    fits = stage_fits()
    rows = ["| link (machine) | quantity | value | from |", "| --- | --- | --- | --- |"]
    for link, machine in LINK_MACHINES.items():
        target = LINK_TARGET[link]
        full = fits[(link, full_rung(link))]
        name = f"{'NVLink peer' if link == 'nvlink' else 'host link (PCIe)'} ({machine})"
        bw, _ = bandwidth_data("recorded", machine)
        best = bandwidth_summary(bw)
        sm = best[(best.target == target) & best.method.str.startswith("sm_")].gbps.max()
        ce = best[(best.target == target) & (best.method == CE_METHOD[target])].gbps.max()
        rows.append(f"| {name} | peak SM store / copy engine ({CE_METHOD[target]}), same run | "
                    f"{sm:.1f} / {ce:.1f} GB/s = **{sm / ce:.3f}** | `xstage bench bandwidth --out data/{machine}` |")
        p = stage_params(fits)
        p = p[p.link == link].set_index("parameter")
        fmt = {"issue_ns_per_kib": ("issue", "ns/KiB/program", ".3g"), "drain_gbps": ("drain D", "GB/s", ".4g"),
               "capacity_kib": ("C_max", "KiB", ".4g"), "capacity_per_program_kib": ("c_p", "KiB/program", ".3g"),
               "base_capacity_kib": ("C_0", "KiB", ".3g"),
               "spread": ("arbitration spread", "", ".3f"), "stalled_fraction": ("stall phi", "", ".3f"),
               "free_kib": ("free entries f", "KiB/program", ".3g"), "free_cap_kib": ("their bound F (fixed)",
                                                                                    "KiB/program", ".3g")}
        vals = "; ".join(f"{lab} {p.value[k]:{f}}{(' ' + u) if u else ''} "
                         f"({p.ci95_low[k]:{f}}-{p.ci95_high[k]:{f}})" if p.ci95_low[k] < p.ci95_high[k] else
                         f"{lab} {p.value[k]:{f}}{(' ' + u) if u else ''}"
                         for k, (lab, u, f) in fmt.items() if k in p.index)
        arb = full["params"].get("arbitration", "pool")
        trains = RUNG_TRAINS.get(full_rung(link))
        fitted = f"; its trains as the clean kernel recorded them, data/{machine}/{trains}/" if trains else ""
        rows.append(f"| {name} | stage model, rung {full_rung(link)} (95 % CI; the stage shared as {_ARB_LABEL[arb]}"
                    f"{fitted}) | {vals} | `xstage fit --data data/{machine} --link {link} --write` |")
        e = stage_errors({(link, full_rung(link)): full})
        errs = "; ".join(f"{_KIND_LABEL[r.kind]} {r.median_abs_error:.1%} (p90 {r.p90_abs_error:.0%})"
                         for r in e.itertuples())
        rows.append(f"| {name} | held-out (by train) median \\|error\\|, bursts >= 1 us | {errs} | notebook 02 |")
        on = onset_model_vs_measured(full)
        ons = ", ".join(f"P={int(r.programs)}: {r.measured_onset_kib:g} / {r.model_onset_kib:g}" for r in on.itertuples()
                        if r.programs >= 16)
        rows.append(f"| {name} | onset of backpressure, KiB per program, measured / model | {ons} | notebook 02 |")
        ind = data.machine_dir(machine) / "independent"
        if data.paths(ind, data.BURST_TRAIN)[0].is_file():
            _, sc = score_trains(ind, link)
            rows.append(f"| {name} | trains from outside the fitted family (data/{machine}/independent/, never "
                        f"fitted) | median \\|error\\| {sc.median_abs_error[0]:.1%} (p90 {sc.p90_abs_error[0]:.0%}; "
                        f"bursts > 320 KiB: {sc.median_abs_error_above_320kib[0]:.1%}) | notebook 02 |")
        newp = data.machine_dir(machine) / "train_programs_new_p"
        if link == "host" and data.paths(newp, data.BURST_TRAIN)[0].is_file():
            sc = scores_by_programs(link, machine, records=("train_programs_new_p",))
            per = ", ".join(f"P={r.programs}: {r.median_abs_error:.0%}" for r in sc.itertuples() if r.programs)
            allp = sc[sc.programs == 0].iloc[0]
            rows.append(f"| {name} | trains at program counts never recorded elsewhere (data/{machine}/"
                        f"train_programs_new_p/, never fitted) | median \\|error\\| {allp.median_abs_error:.1%} (p90 "
                        f"{allp.p90_abs_error:.0%}); {per} | notebook 02 |")
        clean = scores_by_programs(link, machine, records=CLEAN_SCORED_RECORDS) if link == "host" else None
        if clean is not None and len(clean):
            per = ", ".join(f"{r.record} {r.median_abs_error:.1%} (p90 {r.p90_abs_error:.0%})"
                            for r in clean[clean.programs == 0].itertuples())
            rows.append(f"| {name} | never-fitted train records made with the clean kernel (data/{machine}/<record>/: "
                        f"no parameter read inside a timed burst) | median \\|error\\|: {per} | notebook 02 |")
        if data.paths(data.machine_dir(machine) / TRAIN_PROGRAMS, data.BURST_PROGRAM)[0].is_file():
            _, fav = program_favour(train_programs_data(machine)[0], link)
            favs = ", ".join(f"P={r.programs}: {r.favoured_share:.0%} (up to {r.favour_max:.2f}x; persists "
                             f"{r.persistence_across_repeats:.2f}, next burst {r.next_burst_rank_spearman:.2f})"
                             for r in fav.itertuples())
            rows.append(f"| {name} | SMs the full stage favours (>= {FAVOURED:g}x the median program's drain; "
                        f"Spearman across repeats / to the next burst; data/{machine}/{TRAIN_PROGRAMS}/) | {favs} | "
                        f"notebook 02 |")
    return "\n".join([README_STAGE_START, *rows, README_STAGE_END])


_KIND_LABEL = {"sync": "synchronised", "free": "free-running regular", "train": "irregular trains"}
_ARB_LABEL = {"pool": "one pool", "slots": "per-program slots beside a shared C_0",
              "gpc_drain": "per-program slots beside a shared C_0, the drain shared equally per GPC holding stores"}


# ----------------------------------------------------------------- MegaMoE on one GPU: GEMMs and order cost
MEGAMOE_GEMM_SUB = "megamoe_gemm"     # data/<machine>/megamoe_gemm/: xstage.moe_gemm's studies


def megamoe_gemm_data(machine: str = "h200x1") -> tuple[pd.DataFrame, dict]:
    """The recorded GEMM ladder / order-cost study (schema ``megamoe_gemm``, xstage.moe_gemm) of ``machine``:
    rows and provenance; :class:`NoRecordedData` when it is not in data/."""
    folder = data.machine_dir(machine) / MEGAMOE_GEMM_SUB
    if not data.paths(folder, data.MEGAMOE_GEMM)[0].is_file():
        raise NoRecordedData(f"no recorded MegaMoE GEMM study for {machine} (data/{machine}/{MEGAMOE_GEMM_SUB}); "
                             f"run `python3 scripts/megamoe_gemm.py --out data/{machine}/{MEGAMOE_GEMM_SUB}`")
    df, meta = data.load(folder, data.MEGAMOE_GEMM)
    return df, {**meta, "source": "recorded"}


def _config(df: pd.DataFrame) -> pd.Series:
    return megamoe_config_names(df)


def megamoe_gemm_ladder(df: pd.DataFrame) -> pd.DataFrame:
    """The version ladder (study ``ladder``): per configuration, dtype and variant of our kernel its TFLOP/s and
    its ratio to each library call of the same rounds (``vs_grouped_mm``, ``vs_scaled_grouped_mm``: ours / the
    library's TFLOP/s, NaN where the library call was unavailable), rank 0's rows, the float32-reference error."""
    d = df[df.study == "ladder"].assign(config=lambda x: _config(x))
    lib = {m: d[d.method == m].set_index(["config", "dtype"]).tflops
           for m in ("torch._grouped_mm", "torch._scaled_grouped_mm")}
    ours = d[d.method == "ours"].copy()
    idx = pd.MultiIndex.from_frame(ours[["config", "dtype"]])
    for m, col in (("torch._grouped_mm", "vs_grouped_mm"), ("torch._scaled_grouped_mm", "vs_scaled_grouped_mm")):
        ref = lib[m][~lib[m].index.duplicated()].reindex(idx).to_numpy(dtype=float)
        ours[col] = ours.tflops.to_numpy() / ref
        ours[m.replace("torch._", "") + "_tflops"] = ref
    return ours[["config", "dtype", "rows", "variant", "tiles", "is_default", "tflops", "grouped_mm_tflops",
                 "vs_grouped_mm", "scaled_grouped_mm_tflops", "vs_scaled_grouped_mm", "rel_l2"]].reset_index(
        drop=True)


def megamoe_gemm_summary(ladder: pd.DataFrame, min_rows: int = 2048) -> pd.DataFrame:
    """Per dtype and variant over the ladder's configurations: geomean and minimum of ours / each library, the
    minimum over configurations with >= ``min_rows`` rows on the rank, and the geomean TFLOP/s."""
    out = []
    for (dt, v), g in ladder.groupby(["dtype", "variant"], sort=False):
        big = g[g.rows >= min_rows]
        row = dict(dtype=dt, variant=v, tiles="; ".join(dict.fromkeys(g.tiles)), configs=len(g),
                   geomean_tflops=geomean(g.tflops))
        for col in ("vs_grouped_mm", "vs_scaled_grouped_mm"):
            row[f"{col}_geomean"] = geomean(g[col])
            row[f"{col}_min"] = float(g[col].min())
            row[f"{col}_min_big"] = float(big[col].min()) if len(big) else float("nan")
        out.append(row)
    return pd.DataFrame(out)


def megamoe_order_table(df: pd.DataFrame) -> pd.DataFrame:
    """The order-cost study (study ``order``): per dtype, assignment and schedule the compute-only time over
    Expert-Wave's under the same assignment (geomean and worst over the configurations, > 1: slower), and
    Expert-Wave's own time over static Expert-Wave's (what the assignment does to it)."""
    d = df[df.study == "order"].assign(config=lambda x: _config(x))
    if d.empty:
        return pd.DataFrame(columns=["dtype", "assignment", "schedule", "configs", "over_ew_geomean",
                                     "over_ew_worst", "ew_over_static_ew_geomean"])
    t = d.pivot_table(index=["config", "dtype"], columns=["schedule", "assignment"], values="ms", aggfunc="first")
    out = []
    for dt in dict.fromkeys(d.dtype):
        td = t.xs(dt, level="dtype")
        for a in dict.fromkeys(d.assignment):
            for s in dict.fromkeys(d.schedule):
                if (s, a) not in td.columns:
                    continue
                r = (td[(s, a)] / td[("expert_wave", a)]).dropna()
                ew = (td[("expert_wave", a)] / td[("expert_wave", "static")]).dropna()
                out.append(dict(dtype=dt, assignment=a, schedule=s, configs=len(r), over_ew_geomean=geomean(r),
                                over_ew_worst=float(r.max()), ew_over_static_ew_geomean=geomean(ew)))
    return pd.DataFrame(out)


def megamoe_sweep_gemm_ratio(df: pd.DataFrame, min_rows: int = 2048) -> pd.DataFrame:
    """A MegaMoE sweep's own GEMM comparison (``grouped_mm_ms`` / ``compute_ms``: ours / torch._grouped_mm
    TFLOP/s, bf16 grouped_mm also for fp8 rows), per dtype over its configurations: geomean, minimum, and the
    minimum over configurations with >= ``min_rows`` rows on the rank."""
    ew = df[df.schedule == "expert_wave"]
    out = []
    for dt, g in ew.groupby("dtype", sort=False):
        r = g.grouped_mm_ms / g.compute_ms
        out.append(dict(dtype=dt, configs=len(g), geomean=geomean(r), min=float(r.min()),
                        min_big=float(r[g.rows >= min_rows].min())))
    return pd.DataFrame(out)


# ----------------------------------------------------- MegaMoE on one GPU, round 3: all 84, tiles v2, order v2
MEGAMOE_ROUND3_SUB = "megamoe_round3"   # data/<machine>/megamoe_round3/: xstage.moe_gemm studies gemm, controls
MEGAMOE_GEMM_GOALS = dict(geomean=0.95, min_big=0.9, min_rows=2048)    # issue 15: ours / the library
MEGAMOE_ORDER_GOALS = dict(geomean=1.02, worst=1.05)                   # issue 15: schedule / Expert-Wave


MEGAMOE_ROUND4_SUB = "megamoe_round4"   # data/<machine>/megamoe_round4/: controls, the tile swizzle beside swizzle0


def megamoe_round3_data(machine: str = "h200x1", sub: str = MEGAMOE_ROUND3_SUB) -> tuple[pd.DataFrame, dict]:
    """The recorded studies (``gemm``, ``controls``; schema ``megamoe_gemm``) of ``machine`` in ``sub`` (round 3,
    or :data:`MEGAMOE_ROUND4_SUB`): rows and provenance; :class:`NoRecordedData` when they are not in data/."""
    folder = data.machine_dir(machine) / sub
    if not data.paths(folder, data.MEGAMOE_GEMM)[0].is_file():
        name, study = {MEGAMOE_ROUND4_SUB: ("round-4", "controls"), MEGAMOE_ROUND5_SUB: ("round-5", "tiles"),
                       MEGAMOE_ROUND6_GEMM_SUB: ("round-6", "tiles6"),
                       MEGAMOE_ROUND7_CONTROLS_SUB: ("round-7", "controls7"),
                       MEGAMOE_ROUND8_GEMM_SUB: ("bf16 GEMM", "gemm8"),
                       MEGAMOE_ROUND8_CONTROLS_SUB: ("round-8", "controls8"),
                       MEGAMOE_ROUND10_GEMM_SUB: ("round-10", "gemm10"),
                       MEGAMOE_ROUND10_CONTROLS_SUB: ("round-10", "controls7"),
                       MEGAMOE_ROUND11_LAGS_SUB: ("round-11", "lags11"),
                       MEGAMOE_ROUND11_GEMM_SUB: ("fp8 GEMM", "gemm10"),
                       MEGAMOE_ROUND12_CONTROLS_SUB: ("round-12", "controls7"),
                       MEGAMOE_ROUND13_CONTROLS_SUB: ("compute-only controls", "controls7"),
                       MEGAMOE_ROUND13_REPEAT_CONTROLS_SUB: ("round-13 repeat", "controls7"),
                       }.get(sub, ("round-3", "gemm"))
        raise NoRecordedData(f"no recorded MegaMoE {name} study for {machine} (data/{machine}/{sub});"
                             f" run `python3 scripts/megamoe_gemm.py --study {study} --out data/{machine}/{sub}`")
    df, meta = data.load(folder, data.MEGAMOE_GEMM)
    return df, {**meta, "source": "recorded"}


def megamoe_round3_gemm(df: pd.DataFrame) -> pd.DataFrame:
    """Study ``gemm``, per configuration and dtype (table order): our Expert-Wave compute-only time with the
    default tiles (default assignment) and with tiles version 1 (static, as the earlier records ran), fp8's BM =
    64 alternative where BM = 128 is the default, and the library of the same rounds; ratios are the library's
    time / ours (= ours / the library's TFLOP/s; > 1: ours faster), NaN where a call was unavailable."""
    d = df[(df.study == "gemm") & (df.status == "ok")].assign(config=lambda x: _config(x))
    if d.empty:
        return pd.DataFrame(columns=["config", "shape", "dtype", "rows", "tiles", "ours_ms", "v1_ms",
                                     "grouped_mm_ms", "scaled_grouped_mm_ms", "vs_grouped_mm",
                                     "v1_vs_grouped_mm", "vs_scaled_grouped_mm", "v1_vs_scaled_grouped_mm",
                                     "bm64_s3_vs_default"])
    key = ["config", "dtype"]

    def col(mask):
        x = d[mask].drop_duplicates(key).set_index(key)
        return x

    ours = col((d.method == "ours") & (d.variant == "default"))
    out = ours[["shape", "rows", "tiles"]].copy()
    out["ours_ms"] = ours.ms
    for name, mask in (("v1_ms", (d.method == "ours") & (d.variant == "v1")),
                       ("bm64_s3_ms", (d.method == "ours") & (d.variant == "bm64_s3")),
                       ("grouped_mm_ms", d.method == "torch._grouped_mm"),
                       ("scaled_grouped_mm_ms", d.method == "torch._scaled_grouped_mm")):
        out[name] = col(mask).ms.reindex(out.index)
    out["vs_grouped_mm"] = out.grouped_mm_ms / out.ours_ms
    out["v1_vs_grouped_mm"] = out.grouped_mm_ms / out.v1_ms
    out["vs_scaled_grouped_mm"] = out.scaled_grouped_mm_ms / out.ours_ms
    out["v1_vs_scaled_grouped_mm"] = out.scaled_grouped_mm_ms / out.v1_ms
    out["bm64_s3_vs_default"] = out.ours_ms / out.bm64_s3_ms          # > 1: the BM = 64 alternative was faster
    out = out.reset_index()
    order = {c.name: i for i, c in enumerate(_moe_cases())}
    return out.assign(_o=out.config.map(order)).sort_values(["dtype", "_o"], kind="stable").drop(
        columns="_o").reset_index(drop=True)


def _moe_cases():
    from .moe_plan import CASES
    return CASES


def megamoe_round3_gemm_summary(g: pd.DataFrame, min_rows: int = MEGAMOE_GEMM_GOALS["min_rows"]) -> pd.DataFrame:
    """Per dtype and ratio of :func:`megamoe_round3_gemm`: configurations, geomean, minimum, the minimum over
    configurations with >= ``min_rows`` rows on the rank, and whether the issue's goals (geomean >= 0.95, every
    >= min_rows configuration >= 0.9) are met."""
    out = []
    for dt, gd in g.groupby("dtype", sort=False):
        for col in ("vs_grouped_mm", "v1_vs_grouped_mm", "vs_scaled_grouped_mm", "v1_vs_scaled_grouped_mm"):
            r = gd[col].dropna()
            if r.empty:
                continue
            big = r[gd.loc[r.index, "rows"] >= min_rows]
            gm, mb = geomean(r), float(big.min()) if len(big) else float("nan")
            out.append(dict(dtype=dt, ratio=col, configs=len(r), geomean=gm, min=float(r.min()),
                            min_big=mb, big_configs=len(big),
                            geomean_met=bool(gm >= MEGAMOE_GEMM_GOALS["geomean"]),
                            min_big_met=bool(mb >= MEGAMOE_GEMM_GOALS["min_big"]) if len(big) else False))
    return pd.DataFrame(out)


def megamoe_round3_controls(df: pd.DataFrame, study: str = "controls") -> pd.DataFrame:
    """Study ``controls`` (or round 7's ``controls7``: dynamic only, ``ew_over_static`` NaN), per configuration,
    dtype, assignment, schedule and order variant: the compute-only
    time over Expert-Wave's under the same assignment and in the same rounds (``over_ew``, > 1: slower),
    Expert-Wave's over static Expert-Wave's (``ew_over_static``), and from the launch with per-task timestamps
    (dynamic only) each tile kind's median time over Expert-Wave's (``l1_tile_rel``, ``l2_tile_rel``), the busy
    share of the programs (``task_busy``) and the share of Linear-2 tiles that waited (``task_waited``)."""
    d = df[df.study == study].assign(config=lambda x: _config(x))
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
    order = {c.name: i for i, c in enumerate(_moe_cases())}
    return out.assign(_o=out.config.map(order)).sort_values(["dtype", "_o"], kind="stable")[cols].reset_index(
        drop=True)


def megamoe_round3_controls_summary(per: pd.DataFrame) -> pd.DataFrame:
    """Per dtype, assignment, schedule and order variant over :func:`megamoe_round3_controls`: configurations,
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
                        goal_met=bool(gm <= MEGAMOE_ORDER_GOALS["geomean"] and worst <= MEGAMOE_ORDER_GOALS["worst"]),
                        ew_over_static_geomean=geomean(g.ew_over_static.dropna()),
                        l1_tile_rel=geomean(g.l1_tile_rel.dropna()) if g.l1_tile_rel.notna().any() else float("nan"),
                        l2_tile_rel=geomean(g.l2_tile_rel.dropna()) if g.l2_tile_rel.notna().any() else float("nan"),
                        task_busy=float(g.task_busy.median()), ew_task_busy=float(g.ew_task_busy.median()),
                        task_waited=float(g.task_waited.median())))
    return pd.DataFrame(out)


def megamoe_round3_coverage_line(df: pd.DataFrame) -> str:
    """'gemm: bf16 84 of 84, fp8 84 of 84 configurations; controls: ...': how many of the 84 configurations each
    round-3 study holds per dtype (they run in table order, none chosen or dropped)."""
    n = len(_moe_cases())
    parts = []
    for study in ("gemm", "controls"):
        d = df[df.study == study]
        per = [f"{dt} {len(g[['shape', 'tokens', 'routing']].drop_duplicates())} of {n}"
               for dt, g in d.groupby("dtype", sort=False)]
        parts.append(f"{study}: {', '.join(per) if per else 'none'} configurations")
    return "; ".join(parts)


# ------------------------------------------ MegaMoE on one GPU, round 5: tile variants beside the library, lists
MEGAMOE_ROUND5_SUB = "megamoe_round5"   # data/<machine>/megamoe_round5/: xstage.moe_gemm studies tiles, lists


def megamoe_round5_tiles(df: pd.DataFrame) -> pd.DataFrame:
    """Study ``tiles``, per configuration (table order): ``torch._grouped_mm``'s time / each of our variants'
    (the default and xstage.moe_gemm.TILES5_VARIANTS, same rounds; > 1: ours faster), one column per variant,
    with the configuration's shape and rows."""
    d = df[(df.study == "tiles") & (df.status == "ok")].assign(config=lambda x: _config(x))
    if d.empty:
        return pd.DataFrame(columns=["config", "shape", "dtype", "rows", "default"])
    key = ["config", "dtype"]
    lib = d[d.method == "torch._grouped_mm"].drop_duplicates(key).set_index(key).ms
    ours = d[d.method == "ours"].pivot_table(index=key, columns="variant", values="ms", aggfunc="first")
    out = ours.rdiv(lib.reindex(ours.index), axis=0)
    base = d[d.method == "ours"].drop_duplicates(key).set_index(key)[["shape", "rows"]]
    out = base.join(out).reset_index()
    order = {c.name: i for i, c in enumerate(_moe_cases())}
    out.columns.name = None
    return out.assign(_o=out.config.map(order)).sort_values(["dtype", "_o"], kind="stable").drop(
        columns="_o").reset_index(drop=True)


def megamoe_round5_tiles_summary(t: pd.DataFrame) -> pd.DataFrame:
    """Per dtype and variant of :func:`megamoe_round5_tiles` (every configuration the study holds: each has >=
    2048 rows on rank 0): configurations, geomean and minimum of ours / torch._grouped_mm, how many below the goal
    (0.9), the worst configuration; and the row ``best per shape``: per shape the variant with the highest
    geomean over that shape's configurations (chosen on these same rows: an in-sample rule, labelled so)."""
    variants = [c for c in t.columns if c not in ("config", "shape", "dtype", "rows")]
    out = []
    goal = MEGAMOE_GEMM_GOALS["min_big"]
    for dt, g in t.groupby("dtype", sort=False):
        for v in variants:
            r = g[v].dropna()
            if r.empty:
                continue
            out.append(dict(dtype=dt, variant=v, configs=len(r), geomean=geomean(r), min=float(r.min()),
                            below_goal=int((r < goal).sum()), worst_config=g.loc[r.idxmin(), "config"]))
        best = {sh: max(variants, key=lambda v: geomean(gs[v].dropna()) if gs[v].notna().any() else -1.0)
                for sh, gs in g.groupby("shape", sort=False)}
        r = pd.Series([row[best[row["shape"]]] for _, row in g.iterrows()], index=g.index).dropna()
        if len(r):
            out.append(dict(dtype=dt, variant="best per shape (in-sample): " + ", ".join(
                f"{sh} {v}" for sh, v in best.items()), configs=len(r), geomean=geomean(r), min=float(r.min()),
                below_goal=int((r < goal).sum()), worst_config=g.loc[r.idxmin(), "config"]))
    return pd.DataFrame(out)


def megamoe_round5_tiles_noise(t: pd.DataFrame, df: pd.DataFrame, variant: str = "swz16") -> pd.DataFrame:
    """Study tiles' noise floor and the tile order's effect: per configuration of :func:`megamoe_round5_tiles`
    whether ``variant`` (a tile-order variant: the default tiles with another swizzle) ran the very task list
    of the default (Expert-Wave, rank 0, rebuilt from the seeded routing: no expert has more row blocks than the
    default swizzle groups), and ``gain`` = its ours / grouped_mm over the default's. Over the identical lists the
    gain is timing noise of the same rounds; where the lists differ it is the tile order's effect plus that
    noise. Columns: config, shape, rows, same_list, max_row_blocks (rank 0's largest expert), gain."""
    from dataclasses import replace
    from .moe_plan import CASES, build_schedule, routing_of, tiles_of_row, TileGrid, TILE_SWIZZLE

    cases = {c.name: c for c in CASES}
    d = df[(df.study == "tiles") & (df.method == "ours")].assign(config=lambda x: _config(x))
    out = []
    for _, r in t.iterrows():
        c, sh = cases[r.config], cases[r.config].shape
        row = d[(d.config == r.config) & (d.variant == "default")].iloc[0]
        var = d[(d.config == r.config) & (d.variant == variant)].iloc[0]
        g0 = TileGrid.of(routing_of(c, 2)[2][0], sh.hidden, sh.intermediate, tiles_of_row(row), TILE_SWIZZLE)
        from .moe_plan import parse_schedule_param
        g1 = replace(g0, swizzle=parse_schedule_param(var.note)["swizzle"])
        same = bool(np.array_equal(build_schedule("expert_wave", g0, 132).tasks,
                                   build_schedule("expert_wave", g1, 132).tasks))
        out.append(dict(config=r.config, shape=r["shape"], rows=r.rows, same_list=same,
                        max_row_blocks=max(g0.row_blocks), gain=r[variant] / r["default"]))
    return pd.DataFrame(out)


def megamoe_round5_lists(df: pd.DataFrame) -> pd.DataFrame:
    """Study ``lists``, per configuration, dtype and list (xstage.moe_gemm.LISTS5; dynamic assignment, compute
    only, same rounds): the time over Expert-Wave's (``over_ew``), each tile kind's median time over Expert-Wave's
    (``l1_tile_rel``, ``l2_tile_rel``), the busy share of the programs and the share of Linear-2 tiles that
    waited, with the list's param (model_guided: its choice)."""
    d = df[df.study == "lists"].assign(config=lambda x: _config(x))
    cols = ["config", "dtype", "rows", "variant", "schedule", "param", "ms", "over_ew", "l1_tile_rel",
            "l2_tile_rel", "task_busy", "ew_task_busy", "task_waited"]
    if d.empty:
        return pd.DataFrame(columns=cols)
    key = ["config", "dtype"]
    ew = d[d.variant == "expert_wave"].drop_duplicates(key).set_index(key)
    base = ew.reindex(pd.MultiIndex.from_frame(d[key]))
    return _over_expert_wave(d, base, cols)


def megamoe_round5_lists_summary(per: pd.DataFrame) -> pd.DataFrame:
    """Per dtype and list of :func:`megamoe_round5_lists`: configurations, geomean and worst over Expert-Wave,
    the worst configuration, whether the issue's goal holds (geomean <= 1.02, worst <= 1.05), and the per-task
    evidence (geomean tile-time ratios, median busy share, median share of Linear-2 tiles that waited)."""
    out = []
    for (dt, v), g in per.groupby(["dtype", "variant"], sort=False):
        r = g.over_ew.dropna()
        if r.empty:
            continue
        gm, worst = geomean(r), float(r.max())
        out.append(dict(dtype=dt, variant=v, configs=len(r), over_ew_geomean=gm, over_ew_worst=worst,
                        worst_config=g.loc[r.idxmax(), "config"],
                        goal_met=bool(gm <= MEGAMOE_ORDER_GOALS["geomean"] and worst <= MEGAMOE_ORDER_GOALS["worst"]),
                        l1_tile_rel=geomean(g.l1_tile_rel.dropna()) if g.l1_tile_rel.notna().any() else float("nan"),
                        l2_tile_rel=geomean(g.l2_tile_rel.dropna()) if g.l2_tile_rel.notna().any() else float("nan"),
                        task_busy=float(g.task_busy.median()), task_waited=float(g.task_waited.median())))
    return pd.DataFrame(out)


# ---- MegaMoE round 6 (issue 15, item 2): the TMA main loops (xstage.moe_gemm study tiles6)
MEGAMOE_ROUND6_GEMM_SUB = "megamoe_round6_gemm"   # data/<machine>/megamoe_round6_gemm/: study tiles6


def megamoe_round6_tiles(df: pd.DataFrame) -> pd.DataFrame:
    """Study ``tiles6``, per configuration (table order): ``torch._grouped_mm``'s time / each of our variants' (the
    default pointer loops and xstage.moe_gemm.TILES6_VARIANTS, same rounds; > 1: ours faster), as
    :func:`megamoe_round5_tiles` computes it for study tiles."""
    return megamoe_round5_tiles(df[df.study == "tiles6"].assign(study="tiles"))


def megamoe_round6_tiles_summary(t: pd.DataFrame) -> pd.DataFrame:
    """Per variant of :func:`megamoe_round6_tiles`: geomean, minimum, how many below the goal (0.9), the worst
    configuration (:func:`megamoe_round5_tiles_summary`, whose "best per shape" row is in-sample)."""
    return megamoe_round5_tiles_summary(t)


# ---- MegaMoE round 7 (issue 15, items 3-5): tiles version 3 (bf16 through the TMA main loops) as the default; the
# compute-only controls (xstage.moe_gemm study controls7) and the host-link sweep (MEGAMOE_HOST_RECORDS[0]) re-run
MEGAMOE_ROUND7_CONTROLS_SUB = "megamoe_round7_controls"   # data/<machine>/megamoe_round7_controls/: controls7
MEGAMOE_ROUND7_HOST = "megamoe_round7_host"               # data/h200x1/megamoe_round7_host/: the host-link sweep
MEGAMOE_ROUND8_GEMM_SUB = "megamoe_gemm_bf16"             # data/h200x1/megamoe_gemm_bf16/: study gemm8 (bf16 vs torch._grouped_mm)
MEGAMOE_ROUND8_CONTROLS_SUB = "megamoe_round8_controls"     # data/h200x1/megamoe_round8_controls/: controls8
# ---- MegaMoE round 9 (issue 15, item 4): tiles version 4 (fp8 through TMA with one stage more) as the default; the
# host-link sweep re-recorded with it (fp8 first: only fp8's default changed), summarised as round 7's
MEGAMOE_ROUND9_HOST = "megamoe_round9_host"               # data/h200x1/megamoe_round9_host/: the host-link sweep
# ---- MegaMoE round 10 (issue 15, items 2-5): tiles version 5 (fp8's BM 128 from 96 rows per expert) and the dynamic
# wait model the event walk (model_guided's choices): study gemm10 (fp8, both row blocks, all 84), controls7 (both
# dtypes) and the host-link sweep re-recorded (scripts/megamoe_round10.sh)
MEGAMOE_ROUND10_GEMM_SUB = "megamoe_round10_gemm"           # data/h200x1/megamoe_round10_gemm/: study gemm10
MEGAMOE_ROUND10_CONTROLS_SUB = "megamoe_round10_controls"   # data/h200x1/megamoe_round10_controls/: controls7
MEGAMOE_ROUND10_HOST = "megamoe_round10_host"               # data/h200x1/megamoe_round10_host/: the host-link sweep
# ---- MegaMoE rounds 11-12 (issue 15, items 3-4; session 15): study lags11 (lag's lag, compute only) and gemm10 again
# (scripts/megamoe_round11.sh), then under the new defaults (tiles v6, lag version 2) controls7 and the host-link
# sweep (ROUND=megamoe_round12 scripts/megamoe_round10.sh), whose model errors are rescored per stall model
MEGAMOE_ROUND11_LAGS_SUB = "megamoe_round11_lags"           # data/h200x1/megamoe_round11_lags/: study lags11
MEGAMOE_ROUND11_GEMM_SUB = "megamoe_gemm_fp8"    # data/h200x1/megamoe_gemm_fp8/: gemm10 (fp8 vs torch._scaled_grouped_mm)
MEGAMOE_ROUND12_CONTROLS_SUB = "megamoe_round12_controls"   # data/h200x1/megamoe_round12_controls/: controls7
MEGAMOE_ROUND12_HOST = "megamoe_round12_host"               # data/h200x1/megamoe_round12_host/: the host-link sweep
# ---- MegaMoE round 13 (issue 15, items 3-4; session 16): order version 4 (lag's releases never split a swizzle
# group of row blocks), controls7 and the host-link sweep (ROUND=megamoe_round13 scripts/megamoe_round10.sh)
MEGAMOE_ROUND13_CONTROLS_SUB = "megamoe_controls"   # data/h200x1/megamoe_controls/: controls7
MEGAMOE_ROUND13_HOST = "megamoe_round13_host"               # data/h200x1/megamoe_round13_host/: the host-link sweep
# controls7 again under order version 4 in a new process (session 17, call S17-1: the repeat of session 16's S16-3,
# whose files were lost), and one pair (fp8 DeepSeek-V4-Pro T8192 uniform, lag 1.064 there) in five processes (S17-2)
MEGAMOE_ROUND13_REPEAT_CONTROLS_SUB = "megamoe_round13_repeat_controls"   # data/h200x1/<this>/: controls7
MEGAMOE_PAIR_PROCESSES_SUB = "megamoe_s17_pro8192"          # data/h200x1/<this>/p1 ... p5: controls7, one pair each
# ---- MegaMoE round 14 (issue 15; session 18, call S18-1): round 13's defaults, the host-link sweep with the schedules
# timed in rounds (one run of each per round: moe_sweep.TIMING "round_robin"), every timed run kept (runs.jsonl.gz)
MEGAMOE_ROUND14_HOST = "megamoe_pcie"               # data/h200x1/megamoe_pcie/: the host-link sweep
MEGAMOE_STALL_MODELS_SCORED = ("issuers", "round", "round_shared")


MEGAMOE_RUNS_FILES = ("runs.jsonl.gz", "runs.jsonl")     # every timed run of a sweep (moe_sweep.RUNS_ENV's lines)
MEGAMOE_RUN_KINDS = ("kernel_ms", "local_ms", "layer_ms")   # per run: the kernel alone, compute only, the layer


def megamoe_timed_runs(sub: str = MEGAMOE_ROUND14_HOST, machine: str = "h200x1") -> pd.DataFrame:
    """Every timed run of a MegaMoE sweep that printed them (``XSTAGE_MEGAMOE_RUNS=1``: one JSON line per
    configuration, dtype and schedule, kept as data/<machine>/<sub>/runs.jsonl[.gz]), long: config, dtype,
    schedule, run (0-based, the order timed; in a sweep timed in rounds run i of every schedule is round i) and
    the kernel-alone, compute-only and layer times. :class:`NoRecordedData` without the file; ValueError on a
    malformed one."""
    folder = data.machine_dir(machine) / sub
    path = next((folder / f for f in MEGAMOE_RUNS_FILES if (folder / f).is_file()), None)
    if path is None:
        raise NoRecordedData(f"no timed runs recorded in data/{machine}/{sub}/ ({' or '.join(MEGAMOE_RUNS_FILES)}); "
                             f"run the sweep with XSTAGE_MEGAMOE_RUNS=1 and keep its 'megamoe-runs' lines")
    raw = pd.read_json(path, lines=True)
    need = ["config", "dtype", "schedule", *MEGAMOE_RUN_KINDS]
    missing = [c for c in need if c not in raw.columns]
    if missing or raw.empty:
        raise ValueError(f"{path}: malformed timed runs (missing {', '.join(missing) or 'every line'})")
    out = []
    for r in raw.itertuples(index=False):
        cols = {k: np.asarray(getattr(r, k), np.float64) for k in MEGAMOE_RUN_KINDS}
        n = {len(v) for v in cols.values()}
        if len(n) != 1 or not all(np.isfinite(v).all() and (v > 0).all() for v in cols.values()):
            raise ValueError(f"{path}: {r.config} {r.dtype} {r.schedule}: runs of unequal length or not positive")
        out.append(pd.DataFrame({"config": r.config, "dtype": r.dtype, "schedule": r.schedule,
                                 "run": np.arange(n.pop()), **cols}))
    return pd.concat(out, ignore_index=True)


def megamoe_run_drift(runs: pd.DataFrame, quarter: float = 0.25) -> pd.DataFrame:
    """How a configuration's timed runs move while it is timed (:func:`megamoe_timed_runs`): per config, dtype and
    schedule the kernel-alone median (``ms``), its ``rise`` (median of the last ``quarter`` of the runs over the
    first quarter's, minus 1), and, beside Expert-Wave's runs of the same index (one round each in a sweep timed in
    rounds), the ratio of medians (``over_ew``), the median of the per-round ratios (``over_ew_rounds``) and their
    spread (``rounds_iqr``: interquartile range over the median). Session 17 (S17-3, timed in blocks) found every
    schedule's runs rising ~10 % through its block; timed in rounds that rise falls on every schedule alike."""
    rows = []
    for (cfg, dt), g in runs.groupby(["config", "dtype"], sort=False):
        k = {sch: x.sort_values("run").kernel_ms.to_numpy() for sch, x in g.groupby("schedule", sort=False)}
        if MEGAMOE_BASELINE not in k:
            raise ValueError(f"{cfg} {dt}: no {MEGAMOE_BASELINE} runs to compare with")
        ew = k[MEGAMOE_BASELINE]
        for sch, v in k.items():
            q = max(1, int(round(len(v) * quarter)))
            row = dict(config=cfg, dtype=dt, schedule=sch, runs=len(v), ms=float(np.median(v)),
                       rise=float(np.median(v[-q:]) / np.median(v[:q]) - 1))
            if sch != MEGAMOE_BASELINE and len(v) == len(ew):
                rr = v / ew
                q1, q3 = np.percentile(rr, [25, 75])
                row.update(over_ew=float(np.median(v) / np.median(ew)), over_ew_rounds=float(np.median(rr)),
                           rounds_iqr=float((q3 - q1) / np.median(rr)))
            rows.append(row)
    return pd.DataFrame(rows)


def megamoe_pair_processes(machine: str = "h200x1", sub: str = MEGAMOE_PAIR_PROCESSES_SUB) -> pd.DataFrame:
    """One configuration's controls7 recorded in several processes (data/<machine>/<sub>/p1, p2, ...; schema
    ``megamoe_gemm``): per process, dtype, configuration and schedule the median time (``ms``), the fastest timed run
    (``ms_min``) and each over Expert-Wave's of the same process (``over_ew``, ``over_ew_min``): how far one pair's
    ratio moves between processes. :class:`NoRecordedData` when no process folder is recorded."""
    root = data.machine_dir(machine) / sub
    folders = sorted((f for f in root.glob("p*") if data.paths(f, data.MEGAMOE_GEMM)[0].is_file()),
                     key=lambda f: int(f.name[1:]) if f.name[1:].isdigit() else 0) if root.is_dir() else []
    if not folders:
        raise NoRecordedData(f"no recorded MegaMoE pair in several processes for {machine} "
                             f"(data/{machine}/{sub}/p1 ...); "
                             f"run `python3 scripts/megamoe_gemm.py --study controls7 --cases <config> --out "
                             f"data/{machine}/{sub}/p<N>` once per process")
    out = []
    for f in folders:
        df, _ = data.load(f, data.MEGAMOE_GEMM)
        df = df[(df.method == "ours") & (df.status == "ok")]
        df = df.assign(config=megamoe_config_names(df))
        for (dt, cfg), g in df.groupby(["dtype", "config"], sort=False):
            ms = g.groupby("schedule").ms.median()
            mn = g.groupby("schedule").ms_min.min()
            if MEGAMOE_BASELINE not in ms:
                raise ValueError(f"{f}: {cfg} {dt} has no {MEGAMOE_BASELINE} row to compare with")
            for sch in ms.index:
                out.append(dict(process=f.name, dtype=dt, config=cfg, schedule=sch, ms=float(ms[sch]),
                                ms_min=float(mn[sch]), over_ew=float(ms[sch] / ms[MEGAMOE_BASELINE]),
                                over_ew_min=float(mn[sch] / mn[MEGAMOE_BASELINE])))
    return pd.DataFrame(out)


def megamoe_stall_rescore(record: str = MEGAMOE_ROUND12_HOST, stalls=MEGAMOE_STALL_MODELS_SCORED, prms=None
                          ) -> pd.DataFrame:
    """A recorded one-GPU host-link sweep (data/h200x1/<record>) rescored under each stall model
    (moe_round6.host_rescore: the record's wait model, and its stage parameters or each of ``prms``, {name:
    StageParams, a function returning one (called once the record is read), or None for the record's own}, default
    {"recorded": None}): per model, stall model, dtype and
    schedule the configurations, the share and count within +-10 % (MODEL_TOLERANCE), the median and worst |error|.
    A stall model None is the record's own (named in the table). :class:`NoRecordedData` without the record."""
    from .moe_plan import record_stall
    from .moe_round6 import host_rescore

    df, meta = megamoe_world_data("one-gpu", "host", record=record)
    out = []
    for name, prm in (prms or {"recorded": None}).items():
        prm = prm() if callable(prm) else prm
        for st in stalls:
            sp, summ = host_rescore(df, meta, stall=st, prm=prm)
            worst = sp.groupby(["dtype", "schedule"], sort=False).model_error.apply(lambda e: float(e.abs().max()))
            summ = summ.assign(model=name, stall=st or record_stall(meta), within=(summ.within_10pct * summ.configs).round().astype(int),
                               worst_abs_error=worst.reindex(pd.MultiIndex.from_frame(summ[["dtype", "schedule"]]))
                               .to_numpy())
            out.append(summ)
    cols = ["model", "stall", "dtype", "schedule", "configs", "within", "within_10pct", "median_abs_error",
            "worst_abs_error"]
    return pd.concat(out, ignore_index=True)[cols]


def megamoe_host_full_model(record: str = MEGAMOE_ROUND14_HOST) -> pd.DataFrame:
    """A recorded one-GPU host-link sweep re-predicted with the host link's full model now (xstage.model.load_params;
    rung free_store since session 24, fit.FULL_RUNG) beside the stage parameters the sweep recorded, both under the
    record's own stall and wait models (:func:`megamoe_stall_rescore`, ``model``: "recorded" / "full").
    The cost model reads the stage's capacities, stall and drain; free entries (f = 1.6 KiB per burst) are no part
    of it: a combine burst is a tile's rows, hundreds of KiB."""
    from .model import load_params

    full = lambda: load_params(data.machine_dir(LINK_MACHINES["host"]), "host")   # noqa: E731 (once the record is read)
    return megamoe_stall_rescore(record, (None,), {"recorded": None, "full": full})


def megamoe_pairs_line(df: pd.DataFrame, what: str = "host-link sweep") -> str:
    """How much of a sweep a record holds, in (configuration, dtype) pairs of the 84 x bf16 / fp8 (168) with
    every schedule: e.g. 'host-link sweep: 62 of 168 (configuration, dtype) pairs (bf16 0 of 84, fp8 62 of 84)'."""
    cov = megamoe_coverage(df)
    per = {r.dtype: (int(r.complete), int(r.expected)) for r in cov.itertuples(index=False)}
    n, total = sum(c for c, _ in per.values()), sum(e for _, e in per.values())
    return (f"{what}: {n} of {total} (configuration, dtype) pairs ("
            + ", ".join(f"{d} {c} of {e}" for d, (c, e) in per.items()) + ")")


def megamoe_round7_controls(df: pd.DataFrame) -> pd.DataFrame:
    """Study ``controls7``, per configuration, dtype and schedule (dynamic, the default tiles; table order): the
    compute-only time over Expert-Wave's in the same rounds and the per-task evidence, as
    :func:`megamoe_round3_controls` computes it for study controls."""
    return megamoe_round3_controls(df, study="controls7")


def megamoe_round7_controls_summary(per: pd.DataFrame) -> pd.DataFrame:
    """Per dtype and schedule of :func:`megamoe_round7_controls`: configurations, geomean and worst over
    Expert-Wave (the worst configuration), whether the goal holds (geomean <= 1.02, worst <= 1.05), how many
    configurations are over 1.05, and the per-task evidence (:func:`megamoe_round3_controls_summary`)."""
    s = megamoe_round3_controls_summary(per).drop(columns=["ew_over_static_geomean", "variant"])
    over = per[per.over_ew > MEGAMOE_ORDER_GOALS["worst"]].groupby(["dtype", "schedule"]).size()
    s.insert(s.columns.get_loc("goal_met") + 1, "over_worst",
             [int(over.get((d, c), 0)) for d, c in zip(s.dtype, s.schedule)])
    return s


def megamoe_round7_host_summary(df: pd.DataFrame, before: pd.DataFrame | None = None,
                                tolerance: float = MODEL_TOLERANCE) -> pd.DataFrame:
    """The host-link sweep of round 7 (``df``) per dtype and schedule over the configurations it holds:
    ``configs`` (of 84), measured speedup over Expert-Wave (geomean, max), the model's predicted speedup with the
    host link's fitted stage model as the sweep recorded it (geomean, max), how many within ``tolerance`` (10 %) of
    the measured one (``within``) and the fraction; with ``before`` (round 4's record, megamoe_host_v2) the same
    configurations' measured geomean there (``before_geomean``: the pointer loops, same link and model)."""
    sp = megamoe_speedups(df)
    sp = sp[sp.schedule != MEGAMOE_BASELINE].dropna(subset=["speedup"])
    sp = sp.assign(within=(sp.model_error.abs() <= tolerance))
    old = None
    if before is not None:
        old = megamoe_speedups(before).set_index(["config", "dtype", "schedule"]).speedup
    out = []
    for (dt, sch), g in sp.groupby(["dtype", "schedule"], sort=False):
        row = dict(dtype=dt, schedule=sch, configs=len(g), expected=len(megamoe_expected()),
                   geomean_speedup=geomean(g.speedup), max_speedup=float(g.speedup.max()),
                   max_config=g.loc[g.speedup.idxmax(), "config"], geomean_predicted=geomean(g.predicted_speedup),
                   max_predicted=float(g.predicted_speedup.max()), within=int(g.within.sum()),
                   within_tolerance=float(g.within.mean()))
        if old is not None:
            o = old.reindex(pd.MultiIndex.from_arrays([g.config, g.dtype, g.schedule]))
            row["before_geomean"] = geomean(o.to_numpy())
            row["before_configs"] = int(o.notna().sum())
        out.append(row)
    return pd.DataFrame(out)
