"""Figures of the stage model per link (notebook 02): the ladder, held-out parity, trains, the barrier harness and
the favoured programs; one function per panel (conventions: xstage.figures).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import sample_colorscale
from plotly.subplots import make_subplots

from .figures import (_colors, _hline, _intersect, _LAYOUT, _TARGET_NAME, _title)
from .fluid import KIB
from .model import predict_train
from .stage_fit import full_rung

# ------------------------------------------------------------------------------- the stage model, per link
_KIND_NAME = {"sync": "synchronised sweep (span)", "free": "free-running, regular (median program)",
              "train": "free-running, irregular trains (median program)"}
_KIND_COLOR = {"sync": "#1f77b4", "free": "#ff7f0e", "train": "#2ca02c"}
_LINK_NAME = {"nvlink": "NVLink peer (h200x2)", "host": "host link, PCIe (h200x1)"}


def train_bursts(summary: pd.DataFrame, trains, programs, target: str = "host", heldout: pd.DataFrame | None = None
                 ) -> go.Figure:
    """Irregular free-running trains, one panel per train: the median program's issue time of every burst (line)
    with the p10-p90 band over programs (error bars), one colour per program count; dashed: the stage model's
    held-out prediction (``heldout``: a fit's held-out table). Traces: per (train, programs) measured, then model."""
    s = summary[summary.target == target]
    trains = _intersect(trains, sorted(set(s.train)), "train")
    programs = _intersect(programs, sorted(set(s.programs)), "programs")
    fig = make_subplots(rows=1, cols=len(trains), subplot_titles=list(trains), horizontal_spacing=0.06)
    col = _colors(programs)
    for c, name in enumerate(trains, 1):
        for p in programs:
            g = s[(s.train == name) & (s.programs == p)].sort_values("burst")
            fig.add_trace(go.Scatter(
                x=g.burst, y=g.issue_ns / 1e3, mode="lines+markers", line=dict(color=col[p]), name=f"P = {p}",
                legendgroup=str(p), showlegend=c == 1,
                error_y=dict(type="data", symmetric=False, array=(g.issue_p90_ns - g.issue_ns) / 1e3,
                             arrayminus=(g.issue_ns - g.issue_p10_ns) / 1e3, thickness=1, width=2),
                customdata=np.stack([g.burst_bytes / KIB, g.gap_ns / 1e3], axis=-1),
                hovertemplate="burst %{x}: %{customdata[0]:.0f} KiB, gap after %{customdata[1]:.1f} us<br>"
                              "median program %{y:.2f} us<extra></extra>"), row=1, col=c)
            if heldout is not None:
                h = heldout[(heldout.kind == "train") & (heldout.train == name) & (heldout.programs == p)]
                h = h.sort_values("burst")
                fig.add_trace(go.Scatter(x=h.burst, y=h.predicted_ns / 1e3, mode="lines",
                                         line=dict(color=col[p], dash="dash"), name=f"model, P = {p}",
                                         legendgroup=str(p), showlegend=False,
                                         hovertemplate="model (held out): %{y:.2f} us<extra></extra>"),
                              row=1, col=c)
        fig.update_xaxes(title_text="burst", row=1, col=c)
        fig.update_yaxes(type="log", row=1, col=c, title_text="issue time (us)" if c == 1 else None)
    fig.update_layout(**_LAYOUT)
    fig.update_layout(title=_title(f"Irregular free-running trains, {_TARGET_NAME.get(target, target)}",
                                   "median program per burst, p10-p90 over programs; dashed: stage model, "
                                   "train held out of its fit"))
    return fig


def barrier_harness(rows: pd.DataFrame, configs=((66, 32), (66, 64), (264, 16)), gap_ns: int = 0,
                    target: str = "host") -> go.Figure:
    """The synchronised sweep's two harnesses (``stage_analysis.barrier_harness`` rows): per configuration (programs,
    KiB per program) one panel, each burst's span with the barrier's arrival a release (as recorded) and relaxed,
    measured (markers) and the stage model's prediction (dashed), at ``gap_ns``. Traces: per (panel, barrier)
    measured, then model."""
    have = set(zip(rows.programs, rows.burst_bytes // KIB))
    configs = [c for c in configs if tuple(c) in have]
    if not configs:
        raise ValueError(f"none of the configurations is recorded; recorded: {sorted(have)}")
    fig = make_subplots(rows=1, cols=len(configs), horizontal_spacing=0.07,
                        subplot_titles=[f"P = {p} x {k} KiB" for p, k in configs])
    col = {"release": "#1f77b4", "relaxed": "#d62728"}
    for c, (p, k) in enumerate(configs, 1):
        for mode in ("release", "relaxed"):
            g = rows[(rows.programs == p) & (rows.burst_bytes == k * KIB) & (rows.gap_ns == gap_ns)
                     & (rows.barrier == mode)].sort_values("burst")
            fig.add_trace(go.Scatter(x=g.burst, y=g.measured_ns / 1e3, mode="markers", marker=dict(color=col[mode]),
                                     name=f"{mode} barrier, measured", legendgroup=mode, showlegend=c == 1,
                                     customdata=g.barrier_ns / 1e3,
                                     hovertemplate="burst %{x}: span %{y:.2f} us, barrier %{customdata:.1f} us"
                                                   "<extra></extra>"), row=1, col=c)
            fig.add_trace(go.Scatter(x=g.burst, y=g.predicted_ns / 1e3, mode="lines",
                                     line=dict(color=col[mode], dash="dash"), name=f"{mode} barrier, model",
                                     legendgroup=mode, showlegend=c == 1,
                                     hovertemplate="model: %{y:.2f} us<extra></extra>"), row=1, col=c)
        fig.update_xaxes(title_text="burst", row=1, col=c)
        fig.update_yaxes(type="log", row=1, col=c, title_text="span (us)" if c == 1 else None)
    fig.update_layout(**_LAYOUT)
    fig.update_layout(title=_title(f"The grid barrier drains the stage: synchronised bursts {_TARGET_NAME.get(target, target)}, "
                                   "one H200",
                                   f"gap {gap_ns / 1e3:g} us; release (as every recorded sweep) vs relaxed arrival; "
                                   "dashed: stage model (never fitted to these records)"))
    return fig


def program_favour(per_sm: pd.DataFrame, favoured: float = 1.2, link: str = "host") -> go.Figure:
    """Which SMs the full stage favours: per SM, the median over its contended bursts of the drain it got
    relative to its burst's median program (xstage.stage_programs_analysis.program_favour), one trace per program count.
    The SMs a grid runs on are fixed by its size (P = 16: SMs 0-14 even and 124-131; 66: the even SMs)."""
    fig = go.Figure()
    cols = sample_colorscale("Viridis", np.linspace(0.05, 0.85, max(per_sm.programs.nunique(), 2)))
    for c, (P, g) in zip(cols, per_sm.groupby("programs")):
        fig.add_trace(go.Scatter(x=g.smid, y=g.rel, mode="markers", name=f"P = {P}", marker=dict(size=7, color=c),
                                 customdata=g.bursts, hovertemplate="SM %{x}: %{y:.2f}x the median program "
                                 "(%{customdata} contended bursts)<extra>" + f"P = {P}</extra>"))
    fig.add_hline(y=1.0, line=dict(color="#444", dash="dot"))
    fig.add_hline(y=favoured, line=dict(color="#b22", dash="dash"),
                  annotation_text=f"favoured (>= {favoured:g}x)", annotation_position="top left")
    fig.update_xaxes(title_text="SM (%smid)")
    fig.update_yaxes(title_text="drain relative to the burst's median program")
    fig.update_layout(**_LAYOUT)
    fig.update_layout(title=_title(f"Who the full stage favours, {_LINK_NAME[link]}, one GPU",
                                   "free-running trains (data/h200x1/train_programs), per SM: median over its "
                                   "contended bursts"))
    return fig


def stage_parity(fits: dict) -> go.Figure:
    """Held-out prediction vs measurement for every (observation, burst) of each link's full stage model, one
    panel per link, coloured by kind of record. Traces: per (link, kind)."""
    links = [l for l in ("nvlink", "host") if (l, full_rung(l)) in fits]
    fig = make_subplots(rows=1, cols=len(links), subplot_titles=[_LINK_NAME[l] for l in links],
                        horizontal_spacing=0.1)
    shown = set()
    for c, link in enumerate(links, 1):
        t = fits[(link, full_rung(link))]["heldout_table"]
        for kind in ("sync", "free", "train"):
            g = t[t.kind == kind]
            if g.empty:
                continue
            fig.add_trace(go.Scattergl(x=g.measured_ns / 1e3, y=g.predicted_ns / 1e3, mode="markers",
                                       marker=dict(size=4, color=_KIND_COLOR[kind], opacity=0.5),
                                       name=_KIND_NAME[kind], legendgroup=kind, showlegend=kind not in shown,
                                       customdata=np.stack([g.programs, g.burst_bytes / KIB], axis=-1),
                                       hovertemplate="P %{customdata[0]}, %{customdata[1]:.0f} KiB: measured "
                                                     "%{x:.2f} us, predicted %{y:.2f} us<extra></extra>"),
                          row=1, col=c)
            shown.add(kind)
        lo, hi = t.measured_ns.min() / 1e3, t.measured_ns.max() / 1e3
        fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", line=dict(color="#444", dash="dot"),
                                 showlegend=False, hoverinfo="skip"), row=1, col=c)
        fig.update_xaxes(type="log", title_text="measured (us)", row=1, col=c)
        fig.update_yaxes(type="log", title_text="predicted, held out (us)" if c == 1 else None, row=1, col=c)
    fig.update_layout(**_LAYOUT)
    fig.update_layout(title=_title("Stage model, predicted vs measured on held-out trains",
                                   "each train predicted by a fit that did not see it (k folds by train)"))
    return fig


def stage_ladder(errors: pd.DataFrame, goal: float = 0.10) -> go.Figure:
    """The version ladder: held-out median |error| of each rung, per kind of record (bars) and link (panels);
    the goal as a dotted line. Traces: per (link, kind)."""
    links = [l for l in ("nvlink", "host") if l in set(errors.link)]
    fig = make_subplots(rows=1, cols=len(links), subplot_titles=[_LINK_NAME[l] for l in links],
                        horizontal_spacing=0.1)
    shown = set()   # each kind in the legend once, wherever it first appears
    for c, link in enumerate(links, 1):
        e = errors[errors.link == link]
        for kind in ("sync", "free", "train"):
            g = e[e.kind == kind]
            if g.empty:
                continue
            fig.add_trace(go.Bar(x=g.rung.astype(str), y=g.median_abs_error * 100, name=_KIND_NAME[kind],
                                 marker_color=_KIND_COLOR[kind], legendgroup=kind, showlegend=kind not in shown,
                                 text=[f"{v:.0%}" for v in g.median_abs_error], textposition="outside",
                                 customdata=g.p90_abs_error * 100,
                                 hovertemplate="%{x}: median %{y:.1f} %, p90 %{customdata:.0f} %<extra></extra>"),
                          row=1, col=c)
            shown.add(kind)
        _hline(fig, goal * 100, f"goal {goal:.0%}", log=False, row=1, col=c, position="right")
        fig.update_yaxes(title_text="held-out median |error| (%)" if c == 1 else None, row=1, col=c)
    fig.update_layout(**_LAYOUT)
    fig.update_layout(barmode="group", title=_title(
        "The model's ladder: where each rung fails",
        "fluid (the paper's 3 parameters) -> capacity(P) -> unequal shares -> stall (one pool) -> stage "
        "(per-program slots); bursts >= 1 us"))
    return fig


def train_prediction_data(prm, programs: int, burst_kib, gap_us) -> dict:
    """The stage model on one train: the median program (free-running), the grid's span (synchronised) and a
    lone program's unimpeded issue time, per burst (us)."""
    b = np.asarray(burst_kib, float) * KIB
    g = np.asarray(gap_us, float) * 1e3
    free = predict_train(prm, programs, b, g) / 1e3
    sync = predict_train(prm, programs, b, g, sync=True) / 1e3
    alone = (prm.overhead_ns + b * prm.issue_ns_per_kib / KIB) / 1e3
    return {"burst": np.arange(len(b)), "free_us": free, "sync_us": sync, "alone_us": alone}


def train_prediction_figure(prm, programs: int, burst_kib, gap_us, link: str = "") -> go.Figure:
    """Bars: the stage model's median program per burst of a free-running train; line: the same train with a
    grid barrier (span); dotted: one program alone. Traces: free, sync, alone (the explorer updates them)."""
    d = train_prediction_data(prm, programs, burst_kib, gap_us)
    hover = [f"{b:g} KiB, then {g:g} us" for b, g in zip(burst_kib, gap_us)]
    fig = go.Figure(layout=_LAYOUT)
    fig.add_trace(go.Bar(x=d["burst"], y=d["free_us"], name="free-running: median program", marker_color="#2ca02c",
                         hovertext=hover, hovertemplate="burst %{x} (%{hovertext}): %{y:.3g} us<extra></extra>"))
    fig.add_trace(go.Scatter(x=d["burst"], y=d["sync_us"], mode="lines+markers", name="with a grid barrier: span",
                             line=dict(color="#1f77b4")))
    fig.add_trace(go.Scatter(x=d["burst"], y=d["alone_us"], mode="lines", name="one program alone",
                             line=dict(color="#444", dash="dot")))
    fig.update_yaxes(type="log", title_text="issue time (us)")
    fig.update_xaxes(title_text="burst")
    fig.update_layout(title=_title(f"Stage model ({_LINK_NAME.get(link, link)}), {programs} programs",
                                   "sizes per program and the gap after each burst as given"))
    return fig
