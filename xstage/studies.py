"""Data access and the small analyses the study notebooks share: where a notebook's numbers come from.

A notebook names a ``source`` and gets rows in the recorded schema plus their provenance, whatever the source:

  recorded   data/<machine>/ (committed measurements; ``variant="free_running"`` -> data/<machine>/free_running)
  gpu        a fresh sweep on this machine's GPUs (default grid, plus the drain runs), written to ``out``
  simulated  the Burst-Gap event simulation with reference parameters on a small grid (seconds on a CPU)
  auto       gpu when two GPUs are visible, else recorded (xstage.env.resolve_source)

``meta["source"]`` says which one was used. The analyses here (slowdown over the backpressure-free
expectation, measured onset, bandwidth ratio) are what figures and checks read, so a number in a caption and
the panel beside it come from one place.

Legend: P = issuing programs, b = bytes per program per burst, k = burst index in a train (0 = first).
"""
from __future__ import annotations

import datetime as _dt
import json
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from . import data, env
from .model import KIB, BurstGapParams

VARIANTS = ("sync", "free_running")
BURSTS = ("first", "later", "all")
PAPER_DIR = data.DATA_ROOT / "paper"

# The simulated source: small enough for a slow CPU (~2 s), wide enough for every panel (P=1 is the
# backpressure-free reference of the slowdown map).
SIMULATED_GRID = dict(burst_kib=(1, 4, 16, 64, 256, 1024, 4096), gap_us=(0, 10, 100), programs=(1, 4, 66, 264),
                      store_bytes=(16,), targets=("remote", "local"), n_bursts=8, repeats=2)
# The recorded drain runs (a second pass over the same folder): fence after every burst, two gaps, 16 B stores.
DRAIN_GRID = dict(drain=(True,), gap_us=(0, 10), store_bytes=(16,))


# ------------------------------------------------------------------------------------------------ checks
def _check_source(source: str) -> str:
    if source not in env.SOURCES:
        raise ValueError(f"source must be one of {', '.join(env.SOURCES)}, got {source!r}")
    return env.resolve_source(source)


def _check_machine(machine: str, schema: data.Schema = data.BURST_GAP) -> Path:
    have = data.recorded_machines(schema)
    if machine not in have:
        raise ValueError(f"machine {machine!r} has no recorded {schema.name} data under {data.DATA_ROOT}; "
                         f"recorded machines: {', '.join(have) or 'none'}")
    return data.machine_dir(machine)


def _check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")


def _default_out(machine: str) -> Path:
    """Where a gpu source records: inside a reproduce run <run>/data/<machine> (every notebook of the run
    shares one sweep, which resumes); else runs/sweeps/<UTC time>/<machine>."""
    from .report import run_dir

    run = run_dir()
    if run is not None:
        return run / "data" / machine
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return env.REPO_ROOT / "runs" / "sweeps" / stamp / machine


# ------------------------------------------------------------------------------------------------ sources
def burst_gap_data(source: str, machine: str = "h200x2", variant: str = "sync", out: str | Path | None = None,
                   grid=None) -> tuple[pd.DataFrame, dict]:
    """Burst-gap rows (schema xstage.data.BURST_GAP) and provenance for ``source``; see the module docstring.

    machine: the folder under data/ (recorded); gpu/simulated ignore it (a gpu sweep's default folder is named
             after this machine's GPUs, xstage.env.machine_name).
    variant: ``sync`` (grid barrier between bursts) or ``free_running`` (none: programs drift apart).
    out:     where a gpu sweep writes (default: see :func:`_default_out`); a folder already holding a sweep
             resumes it. Simulated data goes to a temporary folder unless ``out`` is given.
    grid:    a :class:`xstage.sweep.BurstGapGrid` replacing the default one (gpu/simulated).
    """
    _check_variant(variant)
    src = _check_source(source)
    if src == "recorded":
        folder = _check_machine(machine)
        if variant == "free_running":
            folder = folder / "free_running"
            if not data.paths(folder, data.BURST_GAP)[0].is_file():
                raise ValueError(f"machine {machine!r} has no recorded free-running data ({folder} is missing)")
        df, meta = data.load(folder)
        return df, {**meta, "source": "recorded"}

    from dataclasses import replace

    from .sweep import BurstGapGrid, run_burst_gap

    sync = variant == "sync"
    if src == "simulated":
        grid = replace(grid or BurstGapGrid(**SIMULATED_GRID), sync=sync)
        folder = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="xstage-sim-"))
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
    grid = replace(grid or BurstGapGrid(), sync=sync)
    command = f"xstage.studies.burst_gap_data('gpu', variant={variant!r})"
    run_burst_gap(grid, folder, source="gpu", command=command)
    if grid.drain == (False,):
        run_burst_gap(replace(grid, **DRAIN_GRID), folder, source="gpu", command=command + " [drain runs]")
    df, meta = data.load(folder)
    return df, {**meta, "source": "gpu"}


def bandwidth_data(machine: str = "h200x2", source: str = "recorded",
                   out: str | Path | None = None) -> tuple[pd.DataFrame, dict]:
    """Peak-bandwidth rows (schema xstage.data.BANDWIDTH): SM stores (remote, local) and the copy engine.

    source: recorded (data/<machine>/bandwidth.csv), gpu (run the benchmark into ``out``), or auto. There is
    no simulated bandwidth benchmark: pass ``recorded`` to show a machine's measurements beside simulated data.
    """
    src = _check_source(source)
    if src == "simulated":
        raise ValueError("source 'simulated' has no bandwidth benchmark; use 'recorded' (or 'gpu')")
    if src == "recorded":
        df, meta = data.load(_check_machine(machine, data.BANDWIDTH), data.BANDWIDTH)
        return df, {**meta, "source": "recorded"}
    from .sweep import run_bandwidth

    folder = Path(out) if out is not None else _default_out(env.machine_name())
    if not data.paths(folder, data.BANDWIDTH)[0].is_file():
        run_bandwidth(folder, command="xstage.studies.bandwidth_data('gpu')")
    df, meta = data.load(folder, data.BANDWIDTH)
    return df, {**meta, "source": "gpu"}


def paper_numbers() -> tuple[pd.DataFrame, dict]:
    """The paper's headline numbers (data/paper/headline.csv: study, metric, value, unit, hardware) and their
    sidecar (where they are quoted from, what each means)."""
    csv, side = PAPER_DIR / "headline.csv", PAPER_DIR / "headline.json"
    for p in (csv, side):
        if not p.is_file():
            raise data.DataError(f"missing {p}")
    df = pd.read_csv(csv)
    missing = [c for c in ("study", "metric", "value", "unit", "hardware") if c not in df.columns]
    if missing:
        raise data.DataError(f"{csv} lacks columns {missing}")
    return df, json.loads(side.read_text())


def paper_number(study: str, metric: str) -> float:
    """One headline number, e.g. ``paper_number("megamoe", "geomean_speedup")`` -> 1.18."""
    df, _ = paper_numbers()
    hit = df[(df.study == study) & (df.metric == metric)]
    if hit.empty:
        known = ", ".join(f"{s}/{m}" for s, m in zip(df.study, df.metric))
        raise ValueError(f"no paper number {study}/{metric}; known: {known}")
    return float(hit.value.iloc[0])


def default_params(df: pd.DataFrame | None = None, target: str = "remote", store_bytes: int = 16) -> BurstGapParams:
    """Model parameters fitted to ``df`` (fast: Jacobian intervals, no bootstrap), or the reference values when
    there is no data or the fit fails."""
    if df is None:
        return BurstGapParams.reference()
    from .fit import fit_burst_gap

    try:
        p = fit_burst_gap(df, target=target, store_bytes=store_bytes, n_bootstrap=0, uncertainty="jacobian",
                          k_folds=2).params
        return BurstGapParams(*(float(v) for v in p.as_dict().values()))
    except ValueError:
        return BurstGapParams.reference()


def provenance(meta: dict) -> dict:
    """A data set's provenance for a figure caption (xstage.report.export_figure): the sidecar without the
    per-rank clock calibration."""
    return {k: v for k, v in meta.items() if k != "clock"}


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


def sm_over_ce(df_bw: pd.DataFrame) -> float:
    """Best median SM remote-store GB/s (any SM method) over the copy engine's best median GB/s, same run."""
    best = bandwidth_summary(df_bw)
    remote = best[best.target == "remote"]
    ce = remote[remote.method == "ce_peer_copy"].gbps
    sm = remote[remote.method != "ce_peer_copy"].gbps
    if ce.empty or sm.empty:
        raise ValueError("bandwidth data needs remote rows of the copy engine and of an SM method")
    return float(sm.max() / ce.max())
