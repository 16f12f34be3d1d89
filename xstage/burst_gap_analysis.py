"""The burst-gap sweep and the peak bandwidth against the Burst-Gap fluid model: slowdown over the
backpressure-free expectation, the measured onset of backpressure, the SM-store / copy-engine ratio, the fluid
fit of the synchronised sweep; the README's headline rows and docs/burst_gap.md.

The functions take the rows a ``*_data`` function returns (xstage.burst_gap_sweep.burst_gap_data /
bandwidth_data, which may run a sweep) or read the current records (xstage.records); they never measure. A number
in a caption and the panel beside it come from one place.

Legend: P = issuing programs, b = bytes per program per burst, k = burst index in a train (0 = first).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pandas as pd

from . import data, records
from .fit import fit_burst_gap, fluid_summary
from .fluid import KIB, BurstGapParams, onset_burst_bytes

BURSTS = ("first", "later", "all")

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


# ------------------------------------------------------------------------- the README's rows and docs/burst_gap.md
DOCS_PAGE = "burst_gap.md"
NOTEBOOK = "01"
FLUID_RECORD = ("burst_gap", "h200x2", "nvlink")   # the synchronised sweep the fluid model is fitted on
_WHERE = {"nvlink": "NVLink, 2x H200", "host": "PCIe to host memory, one H200"}


def _rel(rec: records.Record) -> str:
    return f"data/{rec.machine}/{rec.folder}"


def _kib(x: float) -> str:
    return f"{x:.3g}" if np.isfinite(x) else "none (no backpressure in the grid)"


@lru_cache(maxsize=None)
def fluid_fit():
    """The fluid model fitted to the current synchronised sweep over NVLink (remote 16-byte stores; Gauss-Newton
    intervals, which notebook 02 replaces by a bootstrap; the parameters and the held-out error are the same)."""
    df, _ = data.load(records.folder(*FLUID_RECORD))
    return fit_burst_gap(df, "remote", 16, n_bootstrap=0, uncertainty="jacobian")


def bandwidth_ratios() -> pd.DataFrame:
    """Per link: the best SM store and the copy engine in the same run (GB/s) and their ratio."""
    rows = []
    for rec in records.records("bandwidth"):
        bw, _ = data.load(rec.path, data.BANDWIDTH)
        best = bandwidth_summary(bw)
        target = "remote" if rec.link == "nvlink" else rec.link
        sm = best[(best.target == target) & best.method.str.startswith("sm_")].gbps.max()
        ce = best[(best.target == target) & (best.method == CE_METHOD[target])].gbps.max()
        rows.append(dict(link=rec.link, machine=rec.machine, record=_rel(rec), sm_gbps=sm, ce_gbps=ce,
                         sm_over_ce=sm / ce))
    return pd.DataFrame(rows)


def headline() -> list[records.Headline]:
    """The burst-gap study's README rows: the fluid fit and the peak bandwidth per link (current records)."""
    res = fluid_fit()
    p = res.params
    rec = records.record(*FLUID_RECORD)
    bw = bandwidth_ratios().set_index("link")
    return [
        records.Headline(
            "a three-parameter Burst-Gap model: issue time, drain rate, outstanding capacity",
            f"fluid fit of the synchronised sweep: issue **{p.issue_ns_per_kib:.1f} ns/KiB** per program, drain "
            f"**{p.drain_gbps:.0f} GB/s**, capacity **{p.capacity_kib:.0f} KiB**; held-out median |error| "
            f"{res.heldout_median_abs_error:.1%}", _WHERE[rec.link], _rel(rec), "02"),
    ] + [records.Headline("", f"peak SM stores / copy engine, same run: **{r.sm_over_ce:.3f}** ({r.sm_gbps:.1f} / "
                              f"{r.ce_gbps:.1f} GB/s)", _WHERE[link], r.record, NOTEBOOK) for link, r in bw.iterrows()]


def docs_page() -> str:
    """docs/burst_gap.md: the fluid fit's parameters, the onset measured and predicted, the peak bandwidth."""
    res = fluid_fit()
    rec = records.record(*FLUID_RECORD)
    df, _ = data.load(rec.path)
    onset = onset_table(slowdown_table(df, "remote", 16, 0.0, "first"), res.params)
    summ = fluid_summary(res)
    bw = bandwidth_ratios()
    lines = ["# Burst-Gap: stores to a peer against backpressure", "",
             "Notebook 01 sweeps burst size x gap x programs; notebook 02 fits the fluid model (backpressure-free "
             "issue time, drain rate, outstanding capacity, plus the harness's per-burst overhead) to the span of "
             "every burst of the synchronised sweep, held out by configuration (5 folds).", "",
             f"## The fluid fit (`{_rel(rec)}`, remote 16-byte stores)", "",
             "| parameter | value | 95 % interval (Gauss-Newton) | unit |", "|---|---|---|---|"]
    for r in summ.itertuples():
        lines.append(f"| {r.parameter} | {r.value:.4g} | {r.ci95_low:.4g} - {r.ci95_high:.4g} | {r.unit} |"
                     if np.isfinite(r.ci95_low) else f"| {r.parameter} | {r.value:.3f} | | {r.unit} |")
    lines += ["", "## Onset of backpressure from an empty stage (KiB per program, gap 0)", "",
              "| programs | measured | fluid model |", "|---|---|---|"]
    lines += [f"| {int(r.programs)} | {_kib(r.measured_onset_kib)} | {_kib(r.model_onset_kib)} |"
              for r in onset.itertuples()]
    lines += ["", "## Peak bandwidth: SM stores against the copy engine, same run", "",
              "| link | record | best SM store (GB/s) | copy engine (GB/s) | ratio |", "|---|---|---|---|---|"]
    lines += [f"| {r.link} | `{r.record}` | {r.sm_gbps:.1f} | {r.ce_gbps:.1f} | {r.sm_over_ce:.3f} |"
              for r in bw.itertuples()]
    return "\n".join(lines) + "\n"
