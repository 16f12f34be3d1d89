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



    def run(folder: Path) -> None:
        import torch



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


def score_trains(folder, link: str = "host", min_ns: float = 1000.0, prm=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A link's fitted stage model (xstage.model.load_params, unchanged; or ``prm``, e.g. another rung's fit)
    against trains recorded apart from its fit (``folder``'s burst_train record): per (train, programs, burst)
    measured median program and prediction, and the median / p90 |error| over bursts >= ``min_ns``.
    The bursts of :func:`xstage.data.legacy_read_bursts` (the legacy kernel's read, which waits behind the
    program's stores) are predicted with that wait (``predict_train(read_fence=...)``) where the arbitration
    models it."""
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
