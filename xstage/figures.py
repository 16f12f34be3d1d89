"""Plotly figure builders for the study notebooks: one function per panel, data in, ``go.Figure`` out.

Every builder takes tidy rows (xstage.data schemas), a :class:`xstage.fit.FitResult` or model parameters, and
returns a figure with a title, axis titles with units, and log axes where sizes span decades. Nothing here
reads files or fits: the notebook passes what :mod:`xstage.studies` and :mod:`xstage.fit` return, and hands
the figure to :func:`xstage.report.export_figure`.

Conventions: burst sizes are bytes per program (b); times in µs; colour = program count (P) or gap; solid =
remote stores to the peer, dashed = local-memory control; error bars = interquartile range over repeats,
ranks (and bursts where several are pooled).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import sample_colorscale
from plotly.subplots import make_subplots

from .model import KIB, BurstGapParams, burst_bytes_total, onset_burst_bytes, steady_slowdown, train
from .numeric import geomean
from .studies import (bandwidth_summary, measured_onset, paper_number, per_config, pick_bursts, select,
                      slowdown_table, sm_over_ce)

WIDTH, HEIGHT = 960, 540
_LAYOUT = dict(template="plotly_white", width=WIDTH, height=HEIGHT, font=dict(size=13),
               margin=dict(l=70, r=30, t=90, b=60))
_MEASURES = {"span_ns": "span (first start → last end)", "issue_ns": "per-program issue time"}
_BURSTS = {"first": "first burst of each train (empty stage)", "later": "bursts 2–8 of each train",
           "all": "all bursts"}
_DASH = {"remote": "solid", "host": "solid", "local": "dash"}
_TARGET_NAME = {"remote": "to the peer (NVLink)", "host": "to pinned host memory (PCIe)",
                "local": "local HBM (control)"}
_METHOD_NAME = {"sm_store": "SM stores (16 B)", "sm_tma_store": "SM TMA bulk stores", "ce_peer_copy": "copy engine",
                "ce_d2h_copy": "copy engine (D2H)"}


# ------------------------------------------------------------------------------------------------ helpers
def bytes_label(b: float) -> str:
    """1024 -> '1 KiB', 4194304 -> '4 MiB'."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= size:
            v = b / size
            return f"{v:.0f} {unit}" if float(v).is_integer() else f"{v:.3g} {unit}"
    return f"{b:.0f} B"


def _palette(n: int, scale: str = "Viridis") -> list[str]:
    return sample_colorscale(scale, list(np.linspace(0.0, 0.88, n))) if n > 1 else sample_colorscale(scale, [0.0])


def _colors(values, scale: str = "Viridis") -> dict:
    values = sorted(set(values))
    return dict(zip(values, _palette(len(values), scale)))


def _size_ticks(values) -> dict:
    """Log axis ticks at the powers of 4 (and the ends) of a burst-size range, labelled in KiB/MiB."""
    lo, hi = float(np.min(values)), float(np.max(values))
    ticks = [v for v in (2.0 ** np.arange(0, 40, 2)) if lo / 1.01 <= v <= hi * 1.01]
    ticks = sorted(set(ticks) | {lo, hi})
    return dict(type="log", tickvals=ticks, ticktext=[bytes_label(v) for v in ticks])


def _log_axis(values, **kw) -> dict:
    """A log axis over the finite positive ``values`` with readable ticks: powers of 10 over many decades,
    1-2-5 steps over a few, finer steps near one decade (plotly's own minor labels crowd); a linear axis when
    the values span less than ~a decade."""
    v = np.asarray(pd.Series(np.ravel(values)).dropna(), float)
    v = v[np.isfinite(v) & (v > 0)]
    if v.size == 0:
        return dict(type="log", **kw)
    lo, hi = v.min() / 1.15, v.max() * 1.15
    decades = np.log10(hi / lo)
    if decades < 0.8:  # less than a decade of data: a linear axis reads better
        return dict(type="linear", **kw)
    steps = (1,) if decades > 4 else (1, 2, 5) if decades > 1.2 else (1, 1.5, 2, 3, 5, 7)
    ticks = [m * 10.0 ** e for e in range(int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi))) + 1)
             for m in steps if lo <= m * 10.0 ** e <= hi]
    return dict(type="log", range=[np.log10(lo), np.log10(hi)], tickvals=ticks,
                ticktext=[f"{t:,.4g}" for t in ticks], **kw)


def _hline(fig: go.Figure, y: float, text: str, log: bool, row=None, col=None, position: str = "left") -> None:
    """A dotted horizontal reference line with a label (annotations on log axes take log10 coordinates,
    which ``add_hline``'s own label gets wrong)."""
    kw = dict(row=row, col=col) if row is not None else {}
    fig.add_hline(y=y, line=dict(color="#444", dash="dot", width=1.2), **kw)
    xref = "x domain" if row is None else f"x{'' if col in (None, 1) else col} domain"
    yref = "y" if row is None else f"y{'' if col in (None, 1) else col}"
    fig.add_annotation(x=0.01 if position == "left" else 0.99, xanchor=position, xref=xref, yref=yref,
                       y=np.log10(y) if log else y, yanchor="bottom", text=text, showarrow=False,
                       font=dict(size=11, color="#333"), bgcolor="rgba(255,255,255,0.75)")


def _gap_label(gap_ns: float) -> str:
    return f"{gap_ns / 1000:g} µs"


def _title(main: str, sub: str = "") -> dict:
    return dict(text=f"{main}<br><sup>{sub}</sup>" if sub else main, x=0.02, xanchor="left")


def _iqr(s: pd.DataFrame, scale: float = 1e-3) -> dict:
    return dict(type="data", symmetric=False, array=(s.q75 - s["median"]) * scale,
                arrayminus=(s["median"] - s.q25) * scale, thickness=1, width=2)


def _intersect(want, have, what: str) -> list:
    have = sorted(set(have))
    keep = [w for w in want if w in have]
    if not keep:
        raise ValueError(f"none of {what}={list(want)} is in the data; have {have}")
    return keep


def _trace_ys(fig: go.Figure, yaxis: str | None = None) -> np.ndarray:
    """All y values of the figure's traces (on one y axis, e.g. ``"y2"``), for :func:`_log_axis`."""
    ys = [np.asarray(t.y, dtype=float) for t in fig.data if t.y is not None
          and (yaxis is None or (t.yaxis or "y") == yaxis)]
    return np.concatenate(ys) if ys else np.array([])


def _targets(df: pd.DataFrame, target: str, control: bool) -> list[str]:
    targets = [target]
    other = "local" if target in ("remote", "host") else "remote"
    if control and other in set(df.target):
        targets.append(other)
    return targets


def empty_figure(title: str, message: str) -> go.Figure:
    """A figure with no traces and a centred note (a panel whose data this source does not have)."""
    fig = go.Figure(layout=_LAYOUT)
    fig.update_layout(title=_title(title), xaxis_visible=False, yaxis_visible=False)
    fig.add_annotation(text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font=dict(size=15, color="#666"))
    return fig


# ------------------------------------------------------------------------------------------- study 1: sweep
def _size_lines(df, target, store_bytes, burst, gap_us, measure, control, value):
    """Traces of ``value`` ('time' or 'gbps') vs burst size: one per (target, programs)."""
    traces = []
    colors = _colors(df.programs)
    for tgt in _targets(df, target, control):
        sel = pick_bursts(select(df, tgt, store_bytes, gap_us=gap_us), burst)
        tab = per_config(sel, measure)
        for p, s in tab.groupby("programs"):
            y = s["median"] * 1e-3 if value == "time" else s.gbps
            traces.append(go.Scatter(
                x=s.burst_bytes, y=y, mode="lines+markers", name=f"P={p}" + ("" if tgt == target else f" ({tgt})"),
                legendgroup=f"P{p}", line=dict(color=colors[p], dash=_DASH[tgt], width=2),
                marker=dict(size=5), error_y=_iqr(s) if value == "time" else None,
                customdata=np.stack([s.programs, s["median"], s.gbps], axis=-1),
                hovertemplate=(f"{tgt}, P=%{{customdata[0]}}<br>b=%{{x:,}} B<br>{measure}=%{{customdata[1]:,.0f}} ns"
                               "<br>P·b/t=%{customdata[2]:.1f} GB/s<extra></extra>")))
    return traces


def issue_vs_burst(df: pd.DataFrame, target: str = "remote", store_bytes: int = 16, burst: str | int = "first",
                   gap_us: float = 0.0, measure: str = "span_ns", control: bool = True) -> go.Figure:
    """Time of a burst vs burst size per program, one line per program count; local control dashed.

    Traces: one per (program count, target) — remote first, then local when ``control`` and present.
    """
    fig = go.Figure(_size_lines(df, target, store_bytes, burst, gap_us, measure, control, "time"), layout=_LAYOUT)
    fig.update_layout(
        title=_title(f"Burst {_MEASURES[measure]} vs burst size — {target} {store_bytes}-byte stores",
                     f"{_BURSTS.get(burst, f'burst {burst}')}, gap {gap_us:g} µs; solid: to the peer, dashed: local "
                     "control; bars: interquartile range"),
        xaxis=dict(title="burst size per program (b)", **_size_ticks(df.burst_bytes)),
        yaxis=_log_axis(_trace_ys(fig), title=f"{_MEASURES[measure]} (µs)"), legend_title_text="programs")
    return fig


def effective_bandwidth(df: pd.DataFrame, target: str = "remote", store_bytes: int = 16, burst: str | int = "first",
                        gap_us: float = 0.0, measure: str = "span_ns", control: bool = True,
                        reference: dict[str, float] | None = None) -> go.Figure:
    """Effective rate P * b / t (GB/s) vs burst size per program count; ``reference`` draws labelled
    horizontal lines (e.g. ``{"copy engine": 396}``). Traces as :func:`issue_vs_burst`."""
    fig = go.Figure(_size_lines(df, target, store_bytes, burst, gap_us, measure, control, "gbps"), layout=_LAYOUT)
    for name, gbps in (reference or {}).items():
        _hline(fig, gbps, f"{name}: {gbps:.0f} GB/s", log=True)
    fig.update_layout(
        title=_title(f"Effective bandwidth P·b / {_MEASURES[measure].split(' (')[0]} — {target} {store_bytes}-byte "
                     "stores", f"{_BURSTS.get(burst, f'burst {burst}')}, gap {gap_us:g} µs; solid: to the peer, "
                     "dashed: local control"),
        xaxis=dict(title="burst size per program (b)", **_size_ticks(df.burst_bytes)),
        yaxis=_log_axis(np.append(_trace_ys(fig), list((reference or {}).values())),
                        title="aggregate bytes per time (GB/s)"), legend_title_text="programs")
    return fig


def burst_train(df: pd.DataFrame, programs=(66, 132, 264), burst_bytes: int = 16 * KIB,
                gaps_us=(0, 1, 3, 10, 100), target: str = "remote", store_bytes: int = 16,
                measure: str = "span_ns") -> go.Figure:
    """Burst-by-burst time over a train for several gaps: does the stage recover between bursts?

    One column per program count; one row per variant present in ``df`` (synchronised, free-running: pass
    ``pd.concat([sync, free])`` for both). Traces: rows x columns x gaps (gaps/programs absent from the data
    are left out).
    """
    sel = select(df, target, store_bytes)
    sel = sel[sel.burst_bytes == burst_bytes]
    if sel.empty:
        raise ValueError(f"burst_bytes={burst_bytes} not in the data; have {sorted(set(df.burst_bytes))}")
    programs = _intersect([programs] if np.isscalar(programs) else list(programs), sel.programs, "programs")
    gaps = _intersect([int(round(g * 1000)) for g in gaps_us], sel.gap_ns, "gaps_us (ns)")
    variants = sorted(set(sel.sync), reverse=True)  # synchronised first
    names = {True: "with grid barrier", False: "free-running"}
    fig = make_subplots(rows=len(variants), cols=len(programs), shared_xaxes=True, horizontal_spacing=0.06,
                        vertical_spacing=0.12,
                        subplot_titles=[f"P={p}, {names[v]}" for v in variants for p in programs])
    colors = dict(zip(gaps, _palette(len(gaps), "Plasma")))
    for r, v in enumerate(variants, 1):
        for c, p in enumerate(programs, 1):
            part = sel[(sel.sync == v) & (sel.programs == p)]
            tab = per_config(part, measure, keys=("gap_ns", "burst"))
            tab = tab[tab.gap_ns.isin(gaps)]
            for g in gaps:
                s = tab[tab.gap_ns == g]
                fig.add_trace(go.Scatter(
                    x=s.burst + 1, y=s["median"] * 1e-3, mode="lines+markers", name=f"gap {_gap_label(g)}",
                    legendgroup=str(g), showlegend=(r == 1 and c == 1), line=dict(color=colors[g], width=2),
                    error_y=_iqr(s),
                    hovertemplate=f"gap {_gap_label(g)}<br>burst %{{x}}<br>%{{y:.3g}} µs<extra></extra>"),
                    row=r, col=c)
            fig.update_yaxes(**_log_axis(tab["median"] * 1e-3), row=r, col=c)
        fig.update_yaxes(title_text=f"{measure.replace('_ns', '')} (µs)", row=r, col=1)
    for c in range(1, len(programs) + 1):
        fig.update_xaxes(title_text="burst in the train", dtick=1, row=len(variants), col=c)
    fig.update_layout(**_LAYOUT)
    fig.update_layout(height=260 + 240 * len(variants), legend_title_text="gap between bursts",
                      title=_title(f"Recovery between bursts — {bytes_label(burst_bytes)} per program, {target} "
                                   f"{store_bytes}-byte stores",
                                   f"{_MEASURES[measure]} of each burst of a train (median, IQR bars)"))
    return fig


def backpressure_map(df: pd.DataFrame, target: str = "remote", store_bytes: int = 16, gap_us: float = 0.0,
                     params: BurstGapParams | None = None, measure: str = "span_ns",
                     threshold: float = 1.5) -> go.Figure:
    """Where backpressure begins: slowdown over the backpressure-free expectation
    (:func:`xstage.studies.slowdown_table`) over burst size x program count, for the first burst and for the
    later bursts of a train; measured onset (first size at or above ``threshold`` for good) as white marks on
    the boundary; the model's onset b* = C·I/(I−D)/P as a line when ``params`` is given.

    Traces: 2 heatmaps + 2 measured-onset markers (+ 2 model-onset lines with ``params``).
    """
    panels = [("first", "first burst (empty stage)"), ("later", "bursts 2–8 (median)")]
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=[t for _, t in panels])
    zmax = 1.0
    for c, (burst, _) in enumerate(panels, 1):
        slow = slowdown_table(df, target, store_bytes, gap_us, burst, measure)
        piv = slow.pivot(index="programs", columns="burst_bytes", values="slowdown")
        progs, sizes = list(piv.index), list(piv.columns)
        xs = np.log2(np.asarray(sizes, float) / KIB)
        ys = np.arange(len(progs))
        z = np.log10(np.clip(piv.to_numpy(), 1e-3, None))
        zmax = max(zmax, float(np.nanmax(z)))
        fig.add_trace(go.Heatmap(
            x=xs, y=ys, z=z, coloraxis="coloraxis", text=np.vectorize(lambda v: f"{v:.1f}")(piv.to_numpy()),
            texttemplate="%{text}", textfont=dict(size=10), customdata=np.broadcast_to(np.asarray(sizes), z.shape),
            hovertemplate="b=%{customdata:,} B<br>slowdown %{text}×<extra></extra>", name=burst), row=1, col=c)
        bx, by = _onset_staircase(measured_onset(slow, threshold), progs)
        fig.add_trace(go.Scatter(
            x=bx, y=by, mode="lines", line=dict(color="white", width=3), name=f"measured onset (≥{threshold:g}×)",
            legendgroup="meas", showlegend=(c == 1), hoverinfo="skip"), row=1, col=c)
        if params is not None:
            b_star = onset_burst_bytes(np.asarray(progs), params)
            xb = np.log2(b_star / KIB)
            keep = np.isfinite(xb) & (xb >= xs.min() - 0.5) & (xb <= xs.max() + 0.5)
            fig.add_trace(go.Scatter(
                x=xb[keep], y=ys[keep], mode="lines+markers", line=dict(color="#00d0ff", width=3),
                marker=dict(size=9, symbol="diamond"), name="model onset b* (empty stage)", legendgroup="model",
                showlegend=(c == 1), customdata=b_star[keep] / KIB,
                hovertemplate="model b* = %{customdata:.1f} KiB<extra></extra>"), row=1, col=c)
        fig.update_xaxes(tickvals=xs[::2], ticktext=[bytes_label(s) for s in sizes[::2]],
                         title_text="burst size per program (b)", range=[xs.min() - 0.5, xs.max() + 0.5], row=1, col=c)
    fig.update_yaxes(tickvals=ys, ticktext=[str(p) for p in progs], title_text="programs (P)", row=1, col=1)
    ticks = [t for t in (1, 1.5, 2, 3, 5, 10, 20, 50, 100, 200) if np.log10(t) <= zmax + 0.01]
    fig.update_layout(**_LAYOUT)
    fig.update_layout(
        coloraxis=dict(colorscale="Inferno", cmin=0, cmax=zmax, colorbar=dict(
            title="slowdown", tickvals=np.log10(ticks), ticktext=[f"{t:g}×" for t in ticks])),
        legend=dict(orientation="h", y=-0.2, x=0, bgcolor="#555", font=dict(color="white")), height=HEIGHT + 40,
        title=_title(f"Where backpressure begins — {target} {store_bytes}-byte stores, gap {gap_us:g} µs",
                     f"{_MEASURES[measure]} ÷ backpressure-free expectation (one program's time for the same b, plus "
                     "the many-program start cost at the smallest b)"))
    return fig


def _onset_staircase(onset: pd.Series, progs: list) -> tuple[list, list]:
    """The boundary between the last size below and the first size at/above the threshold, row by row, as one
    line on the heatmap's grid (x = log2(KiB) cell centres, y = row index); rows without an onset break it."""
    xs, ys, prev = [], [], False
    for i, p in enumerate(progs):
        b = onset.get(p, np.nan)
        if not np.isfinite(b):
            if prev:
                xs.append(None)
                ys.append(None)
            prev = False
            continue
        x = float(np.log2(b / KIB)) - 0.5
        xs += [x, x]
        ys += [i - 0.5, i + 0.5]
        prev = True
    return xs, ys


def drain_vs_burst(df: pd.DataFrame, store_bytes: int = 16, gap_us: float = 0.0,
                   params: BurstGapParams | None = None) -> go.Figure:
    """Drain side: time from a burst's issue end until every thread's system-scope fence returns, vs burst
    size, one line per program count, remote solid / local dashed. ``params`` adds the model's time to empty
    a full stage (C / D). Traces: one per (target, programs); none (and a note) without drain runs."""
    title = "Drain side: fence after each burst"
    runs = df[df.drain.astype(bool) & (df.store_bytes == store_bytes)]
    if runs.empty:
        return empty_figure(title, f"no drain runs with {store_bytes}-byte stores in this data "
                                   "(recorded: 16-byte stores; the simulated source models issue times only)")
    colors = _colors(df.programs)
    fig = go.Figure(layout=_LAYOUT)
    for tgt in [t for t in ("remote", "host", "local") if t in set(runs.target)]:
        tab = per_config(select(df, tgt, store_bytes, drain=True, gap_us=gap_us), "drain_ns")
        for p, s in tab.groupby("programs"):
            fig.add_trace(go.Scatter(
                x=s.burst_bytes, y=s["median"] * 1e-3, mode="lines+markers", legendgroup=f"P{p}",
                name=f"P={p}" + ("" if tgt != "local" else " (local)"), error_y=_iqr(s),
                line=dict(color=colors[p], dash=_DASH[tgt], width=2), marker=dict(size=5),
                hovertemplate=f"{tgt}, P={p}<br>b=%{{x:,}} B<br>drain %{{y:.3g}} µs<extra></extra>"))
    ys = _trace_ys(fig)
    if params is not None:
        full = params.capacity_bytes / params.drain_gbps * 1e-3
        _hline(fig, full, f"model: a full stage empties in C/D = {full:.2f} µs (plus the round trip)", log=True,
               position="right")
        ys = np.append(ys, full)
    fig.update_layout(
        title=_title(f"{title} — {store_bytes}-byte stores, gap {gap_us:g} µs",
                     "issue end → every thread's fence.acq_rel.sys returned (median over bursts, IQR bars); "
                     "solid: to the peer, dashed: local"),
        xaxis=dict(title="burst size per program (b)", **_size_ticks(df.burst_bytes)),
        yaxis=_log_axis(ys, title="drain time (µs)"), legend_title_text="programs")
    return fig


def free_vs_sync(df_sync: pd.DataFrame, df_free: pd.DataFrame, configs=((132, 16 * KIB), (264, 16 * KIB),
                 (66, 32 * KIB)), target: str = "remote", store_bytes: int = 16) -> go.Figure:
    """The drift effect: later bursts (2–8) with and without the grid barrier between bursts, vs the gap.

    Left: median span of the later bursts; right: span ÷ per-program issue time (how far apart the programs'
    bursts are, relative to each program's own issue time: 1 = together). Traces: 2 panels x 2 variants x
    configurations present in both data sets.
    """
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=["span of bursts 2–8", "span ÷ per-program issue time"])
    both = [(p, b) for p, b in configs
            if ((df_sync.programs == p) & (df_sync.burst_bytes == b)).any()
            and ((df_free.programs == p) & (df_free.burst_bytes == b)).any()]
    if not both:
        raise ValueError(f"none of configs={list(configs)} (programs, burst_bytes) is in both data sets")
    colors = dict(zip(both, _palette(len(both), "Viridis")))
    gaps = sorted(set(df_sync.gap_ns) & set(df_free.gap_ns))
    for name, d, dash in (("with barrier", df_sync, "solid"), ("free-running", df_free, "dash")):
        sel = pick_bursts(select(d, target, store_bytes), "later")
        sel = sel[sel.gap_ns.isin(gaps)]
        for p, b in both:
            s = sel[(sel.programs == p) & (sel.burst_bytes == b)].groupby("gap_ns")[["span_ns", "issue_ns"]].median()
            label = f"P={p}, b={bytes_label(b)}, {name}"
            x = [_gap_label(g) for g in s.index]
            for c, y in ((1, s.span_ns * 1e-3), (2, s.span_ns / s.issue_ns)):
                fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=label, legendgroup=label,
                                         showlegend=(c == 1), line=dict(color=colors[(p, b)], dash=dash, width=2),
                                         hovertemplate=f"{label}<br>gap %{{x}}<br>%{{y:.3g}}<extra></extra>"),
                              row=1, col=c)
    fig.update_xaxes(title_text="gap between bursts", type="category")
    fig.update_yaxes(title_text="span (µs)", **_log_axis(_trace_ys(fig, "y")), row=1, col=1)
    fig.update_yaxes(title_text="span / issue (×)", **_log_axis(_trace_ys(fig, "y2")), row=1, col=2)
    fig.update_layout(**_LAYOUT)
    fig.update_layout(title=_title(f"Free-running vs synchronised bursts — {target} {store_bytes}-byte stores",
                                   "solid: grid barrier after every burst; dashed: none (programs drift apart)"),
                      legend=dict(font=dict(size=11)))
    return fig


def _bar_labels(s: pd.DataFrame) -> list[str]:
    """GB/s, and for SM methods to the peer their fraction of the copy engine."""
    ce = s[s.method == "ce_peer_copy"].gbps
    return [f"{v:,.0f}" + (f" ({v / ce.max():.2f}× CE)" if len(ce) and m != "ce_peer_copy" else "")
            for m, v in zip(s.method, s.gbps)]


def bandwidth_bars(df_bw: pd.DataFrame) -> go.Figure:
    """Best median GB/s per method on each link the record has (peer over NVLink, pinned host memory over PCIe)
    and to local memory; each link's copy engine as its reference line and the best SM / copy-engine ratio in
    the title. Traces: one bar trace per target."""
    from .studies import CE_METHOD

    best = bandwidth_summary(df_bw)
    targets = [t for t in ("remote", "host", "local") if t in set(best.target)]
    fig = make_subplots(rows=1, cols=len(targets), subplot_titles=[_TARGET_NAME[t] for t in targets],
                        horizontal_spacing=0.12)
    colors = {"sm_store": "#1f77b4", "sm_tma_store": "#2ca02c", "ce_peer_copy": "#7f7f7f", "ce_d2h_copy": "#7f7f7f"}
    for c, t in enumerate(targets, 1):
        s = best[best.target == t]
        fig.add_trace(go.Bar(
            x=[_METHOD_NAME.get(m, m) for m in s.method], y=s.gbps,
            marker_color=[colors.get(m, "#999") for m in s.method],
            text=_bar_labels(s), textposition="outside", name=_TARGET_NAME[t], showlegend=False,
            customdata=np.stack([s.programs, s.num_warps, s.bytes], axis=-1),
            hovertemplate="%{x}: %{y:.1f} GB/s<br>programs %{customdata[0]}, warps %{customdata[1]}, "
                          "%{customdata[2]:,} B<extra></extra>"), row=1, col=c)
        fig.update_yaxes(title_text="best median bandwidth (GB/s)", range=[0, s.gbps.max() * 1.18], row=1, col=c)
    sub = "median over repeats of the best variant (programs, warps, sizes) of each method; same run"
    ratios = []
    for c, t in enumerate(targets, 1):
        if t not in CE_METHOD:
            continue
        try:
            ratios.append(f"{'NVLink' if t == 'remote' else 'host link'} {sm_over_ce(df_bw, t):.3f}×")
        except ValueError:
            continue
        ce = best[(best.target == t) & (best.method == CE_METHOD[t])].gbps.max()
        _hline(fig, ce, f"copy engine {ce:.1f} GB/s", log=False, row=1, col=c, position="right")
    head = "Peak bandwidth" + (" — best SM store / copy engine: " + ", ".join(ratios) if ratios else "")
    fig.update_layout(**_LAYOUT)
    fig.update_layout(title=_title(head, sub))
    return fig


def _fit_label(res) -> str:
    return f"{res.target} {res.store_bytes}-byte stores"


def fit_parity(res) -> go.Figure:
    """Predicted vs measured burst time per (configuration, burst), log-log, coloured by program count, with
    y = x and ±25 % lines. Traces: one per program count + the two guide lines."""
    tab = res.table()
    colors = _colors(tab.programs)
    fig = go.Figure(layout=_LAYOUT)
    for p, s in tab.groupby("programs"):
        fig.add_trace(go.Scatter(
            x=s.measured_ns * 1e-3, y=s.predicted_ns * 1e-3, mode="markers", name=f"P={p}",
            marker=dict(color=colors[p], size=5, opacity=0.6),
            customdata=np.stack([s.burst_bytes, s.gap_ns / 1000, s.burst, s.rel_error * 100], axis=-1),
            hovertemplate="b=%{customdata[0]:,} B, gap %{customdata[1]:g} µs, burst %{customdata[2]}<br>"
                          "measured %{x:.3g} µs, predicted %{y:.3g} µs (%{customdata[3]:+.0f}%)<extra></extra>"))
    both = tab[["measured_ns", "predicted_ns"]].to_numpy() * 1e-3
    lo, hi = np.nanmin(both) / 1.5, np.nanmax(both) * 1.5
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", line=dict(color="#333", width=1),
                             name="y = x", hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=[lo, hi, None, lo, hi], y=[lo * 1.25, hi * 1.25, None, lo / 1.25, hi / 1.25],
                             mode="lines", line=dict(color="#999", width=1, dash="dot"), name="±25 %",
                             hoverinfo="skip"))
    insample = float(np.nanmedian(np.abs(tab.rel_error)))
    fig.update_layout(
        title=_title(f"Burst-Gap model: predicted vs measured — {_fit_label(res)}",
                     f"every (configuration, burst); median |error| {insample:.1%} in sample, "
                     f"{res.heldout_median_abs_error:.1%} held out"),
        xaxis=_log_axis([lo * 1.15, hi / 1.15], title="measured burst span (µs)", constrain="domain"),
        yaxis=_log_axis([lo * 1.15, hi / 1.15], title="predicted burst time (µs)", scaleanchor="x",
                        constrain="domain"),
        legend_title_text="programs", width=WIDTH, height=HEIGHT + 160)
    return fig


def fit_residuals(res) -> go.Figure:
    """Relative error (predicted / measured − 1) vs burst size, one marker trace per program count (spread
    sideways so the counts do not overlap); median |error| per size as a line. Traces: programs + 1."""
    tab = res.table()
    progs = sorted(set(tab.programs))
    colors = _colors(progs)
    fig = go.Figure(layout=_LAYOUT)
    for i, p in enumerate(progs):
        s = tab[tab.programs == p]
        shift = 2.0 ** (0.5 * (i - (len(progs) - 1) / 2) / len(progs))
        fig.add_trace(go.Scatter(
            x=s.burst_bytes * shift, y=s.rel_error * 100, mode="markers", name=f"P={p}",
            marker=dict(color=colors[p], size=4, opacity=0.55),
            customdata=np.stack([s.burst_bytes, s.gap_ns / 1000, s.burst], axis=-1),
            hovertemplate="P=" + str(p) + ", b=%{customdata[0]:,} B, gap %{customdata[1]:g} µs, "
                          "burst %{customdata[2]}<br>error %{y:+.1f}%<extra></extra>"))
    med = tab.assign(abs_err=tab.rel_error.abs() * 100).groupby("burst_bytes").abs_err.median()
    fig.add_trace(go.Scatter(x=med.index, y=med.to_numpy(), mode="lines+markers", name="median |error|",
                             line=dict(color="black", width=2), marker=dict(symbol="square", size=6)))
    fig.add_hline(y=0, line=dict(color="#666", width=1))
    fig.update_layout(
        title=_title(f"Residuals of the Burst-Gap fit — {_fit_label(res)}",
                     "relative error of each (configuration, burst); black: median |error| per burst size"),
        xaxis=dict(title="burst size per program (b)", **_size_ticks(tab.burst_bytes)),
        yaxis=dict(title="predicted / measured − 1 (%)"), legend_title_text="programs")
    return fig


def heldout_error(res) -> go.Figure:
    """Error on held-out configurations: |relative error| per fold (box), the overall median as a line.
    Traces: one box per fold."""
    ho = res.heldout.assign(abs_pct=lambda d: d.rel_error.abs() * 100)
    fig = go.Figure(layout=_LAYOUT)
    colors = _palette(ho.fold.nunique(), "Viridis")
    for (f, s), col in zip(ho.groupby("fold"), colors):
        fig.add_trace(go.Box(y=s.abs_pct, name=f"fold {f + 1}", marker_color=col, boxpoints="outliers",
                             marker=dict(size=3, opacity=0.5),
                             hovertemplate=f"fold {f + 1}<br>|error| %{{y:.1f}}%<extra></extra>"))
    med = res.heldout_median_abs_error * 100
    _hline(fig, med, f"median over all held-out bursts: {med:.1f}%", log=True, position="right")
    fig.update_layout(
        title=_title(f"Error on held-out configurations — {_fit_label(res)}",
                     f"{ho.fold.nunique()}-fold by configuration (all bursts and repeats of a configuration on one "
                     "side); box: quartiles, whiskers: 1.5 IQR"),
        yaxis=_log_axis(np.percentile(ho.abs_pct[ho.abs_pct > 0], [1, 100]), title="|predicted / measured − 1| (%)"),
        xaxis_title="held-out fold",
        showlegend=False)
    return fig


def params_table_figure(res) -> go.Figure:
    """The fitted parameters, their 95 % intervals and units, and the held-out error, as a table figure."""
    from .fit import fluid_summary

    t = fluid_summary(res)
    fmt = lambda v: "" if pd.isna(v) else f"{v:.4g}"  # noqa: E731
    cells = [t.parameter, [fmt(v) for v in t.value],
             ["" if pd.isna(lo) else f"{lo:.4g} – {hi:.4g}" for lo, hi in zip(t.ci95_low, t.ci95_high)], t.unit]
    fig = go.Figure(go.Table(header=dict(values=["parameter", "value", "95 % interval", "unit"],
                                         fill_color="#e8e8e8", align="left", font=dict(size=14)),
                             cells=dict(values=cells, align="left", height=28, font=dict(size=13))),
                    layout=_LAYOUT)
    fig.update_layout(height=330, title=_title(f"Fitted Burst-Gap parameters — {_fit_label(res)}",
                                               f"intervals: {res.uncertainty}"))
    return fig


# ---------------------------------------------------------------------------------------- study 5: explorer
def train_timeline(prm: BurstGapParams, programs: int, burst_bytes: float, gap_ns: float, n_bursts: int):
    """Outstanding bytes q(t) over a train, as the corner points of the model's piecewise-linear fluid
    trajectory (xstage.model.issue_time / recover), then the drain to empty after the last burst.

    Returns (t_ns, q_bytes, burst_start_ns, burst_end_ns).
    """
    I, D, C, o = float(prm.issue_rate(programs)), prm.drain_gbps, prm.capacity_bytes, prm.overhead_ns
    B = float(burst_bytes_total(programs, burst_bytes))
    t, q = 0.0, 0.0
    ts, qs, starts, ends = [0.0], [0.0], [], []

    def to(dt, q_new):
        nonlocal t, q
        t, q = t + dt, q_new
        ts.append(t)
        qs.append(q)

    def drain_for(dt, rate):  # q falls at ``rate`` for dt, stopping at 0
        if q > 0 and rate * dt > q:
            to(q / rate, 0.0)
            dt -= ts[-1] - ts[-2]
        if dt > 0:
            to(dt, max(q - rate * dt, 0.0))

    for k in range(n_bursts):
        starts.append(t)
        drain_for(o, D)                                   # the fixed overhead: nothing issued, the stage drains
        if I > D:
            t_fill = (C - q) / (I - D)
            if B <= I * t_fill:
                to(B / I, q + (I - D) * B / I)
            else:
                to(t_fill, C)
                to((B - I * t_fill) / D, C)
        else:
            drain_for(B / I, D - I)
        ends.append(t)
        if k + 1 < n_bursts:
            drain_for(gap_ns, D)
    if q > 0:
        to(q / D, 0.0)
    return np.array(ts), np.array(qs), np.array(starts), np.array(ends)


def explorer_data(prm: BurstGapParams, programs: int, burst_kib: float, gap_us: float, n_bursts: int) -> dict:
    """Everything the explorer figure shows for one setting: per-burst times, the free time, q(t), text."""
    b, g = burst_kib * KIB, gap_us * 1000
    T, _ = train(b, programs, g, n_bursts, prm)
    free = prm.overhead_ns + b * prm.issue_ns_per_kib / KIB
    t, q, _, _ = train_timeline(prm, programs, b, g, n_bursts)
    I = float(prm.issue_rate(programs))
    b_star = float(onset_burst_bytes(programs, prm))
    onset = f"{b_star / KIB:.3g} KiB per program" if np.isfinite(b_star) else "never (I ≤ D)"
    slow = float(steady_slowdown(b, programs, g, prm))
    onset_short = f"{b_star / KIB:.3g} KiB/program" if np.isfinite(b_star) else "never (I ≤ D)"
    text = (f"issue rate I = {I:.0f} GB/s vs drain D = {prm.drain_gbps:.0f} GB/s · onset b* = {onset_short} · "
            f"long-train slowdown {slow:.2f}×")
    long = (f"{programs} programs issue at I = {I:.0f} GB/s against a drain rate of D = {prm.drain_gbps:.0f} GB/s: "
            f"a burst into an empty stage starts to stall at b* = {onset}. In a long train of {bytes_label(b)} "
            f"bursts with {gap_us:g} µs gaps each burst takes {slow:.2f}× its backpressure-free time; "
            f"this train takes {T.sum() * 1e-3:.3g} µs of issue in all.")
    return dict(burst=np.arange(1, n_bursts + 1), T_us=T * 1e-3, free_us=np.full(n_bursts, free * 1e-3),
                t_us=t * 1e-3, q_kib=q / KIB, capacity_kib=prm.capacity_kib, text=text, long_text=long, slowdown=slow,
                onset_bytes=b_star)


def model_explorer_figure(prm: BurstGapParams, programs: int = 132, burst_kib: float = 32.0, gap_us: float = 1.0,
                          n_bursts: int = 8) -> go.Figure:
    """The model over one train: per-burst issue time (bars) against the backpressure-free time (dashed), and
    the outstanding bytes q(t) with the capacity C. Traces, in this order (the explorer updates them in
    place): bars, free line, q(t), capacity line."""
    d = explorer_data(prm, programs, burst_kib, gap_us, n_bursts)
    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.16,
                        subplot_titles=["issue time of each burst", "outstanding bytes in the stage"])
    fig.add_trace(go.Bar(x=d["burst"], y=d["T_us"], name="predicted issue time", marker_color="#1f77b4",
                         hovertemplate="burst %{x}: %{y:.3g} µs<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=d["burst"], y=d["free_us"], mode="lines", name="backpressure-free",
                             line=dict(color="#d62728", dash="dash", width=2), hoverinfo="skip"), row=1, col=1)
    fig.add_trace(go.Scatter(x=d["t_us"], y=d["q_kib"], mode="lines", name="outstanding q(t)",
                             line=dict(color="#2ca02c", width=2), fill="tozeroy",
                             hovertemplate="t=%{x:.3g} µs<br>q=%{y:.0f} KiB<extra></extra>"), row=2, col=1)
    fig.add_trace(go.Scatter(x=[0, d["t_us"][-1]], y=[d["capacity_kib"]] * 2, mode="lines", name="capacity C",
                             line=dict(color="black", dash="dot", width=1.5), hoverinfo="skip"), row=2, col=1)
    fig.update_xaxes(title_text="burst in the train", dtick=1, row=1, col=1)
    fig.update_yaxes(title_text="issue time (µs)", rangemode="tozero", row=1, col=1)
    fig.update_xaxes(title_text="time since the train started (µs)", row=2, col=1)
    fig.update_yaxes(title_text="outstanding (KiB)", rangemode="tozero", row=2, col=1)
    fig.update_layout(**_LAYOUT)
    fig.update_layout(height=HEIGHT + 140, legend=dict(orientation="h", y=-0.12, x=0), margin=dict(t=110),
                      title=_title(explorer_title(prm, programs, burst_kib, gap_us, n_bursts), d["text"]))
    return fig


def explorer_title(prm: BurstGapParams, programs: int, burst_kib: float, gap_us: float, n_bursts: int) -> str:
    return (f"Burst-Gap model: {n_bursts} bursts of {programs} × {bytes_label(burst_kib * KIB)}, gaps {gap_us:g} µs "
            f"(issue {prm.issue_ns_per_kib:.3g} ns/KiB, D {prm.drain_gbps:.0f} GB/s, C {prm.capacity_kib:.0f} KiB)")



# ------------------------------------------------------------------------------------------ study 3: MegaMoE
# x of the per-configuration strips: one group per model shape (table order), a slot per tokens-per-rank inside
# it, the three routings side by side in a slot (colour); panels: rows = schedules, columns = dtypes.
_MOE_ROUTING_COLOR = {"uniform": "#1f77b4", "zipf": "#ff7f0e", "hot": "#d62728"}
_MOE_SCHEDULE_STYLE = {"expert_wave": ("Expert-Wave", "#7f7f7f"), "interleaved": ("interleaved", "#d62728"),
                       "lag": ("lag", "#2ca02c"), "model_guided": ("model-guided", "#9467bd")}
_MOE_DTYPE_SYMBOL = {"bf16": "circle", "fp8": "diamond"}
_MOE_SHAPE_LABEL = {"deepseek_v4_flash": "DeepSeek-V4 Flash", "deepseek_v4_pro": "DeepSeek-V4 Pro",
                    "qwen3_235b": "Qwen3-235B", "mixtral_8x7b": "Mixtral 8x7B"}
_PAPER_COLOR = "#8c564b"


def _ordered(values, order) -> list:
    """``values`` (a set) in the order of ``order``, then the rest sorted."""
    values = set(values)
    return [v for v in order if v in values] + sorted(values - set(order), key=str)


def _tokens_label(t: int) -> str:
    """1024 -> '1K', 384 -> '384'."""
    return f"{t // 1024}K" if t % 1024 == 0 else str(t)


def _moe_schedule_name(s: str) -> str:
    return _MOE_SCHEDULE_STYLE.get(s, (s, "#333"))[0]


def _megamoe_axis(sp: pd.DataFrame) -> tuple[pd.Series, dict, list[float]]:
    """x per row of :func:`xstage.studies.megamoe_speedups`, the x-axis layout (ticks at the token slots, the
    shape's name under its middle slot) and the separators between shape groups."""
    from .moe_plan import ROUTINGS, SHAPES, TOKENS_PER_RANK

    shapes = _ordered(sp["shape"], [s.name for s in SHAPES])
    tokens = sorted(set(TOKENS_PER_RANK) | set(int(t) for t in sp.tokens))   # every slot, measured or not
    routings = _ordered(sp.routing, ROUTINGS)
    width = len(tokens) + 1
    off = dict(zip(routings, np.linspace(-0.24, 0.24, len(routings)) if len(routings) > 1 else [0.0]))
    x = (sp["shape"].map({s: i for i, s in enumerate(shapes)}) * width
         + sp.tokens.map({t: j for j, t in enumerate(tokens)}) + sp.routing.map(off))
    mid = len(tokens) // 2
    labelled = {0, mid, len(tokens) - 1}         # first, middle, last slot: seven labels would collide
    vals, text = [], []
    for i, s in enumerate(shapes):
        for j, t in enumerate(tokens):
            vals.append(i * width + j)
            text.append((_tokens_label(t) if j in labelled else "")
                        + (f"<br><b>{_MOE_SHAPE_LABEL.get(s, s)}</b>" if j == mid else ""))
    axis = dict(tickvals=vals, ticktext=text, tickangle=0, tickfont=dict(size=10), ticks="outside", ticklen=3,
                range=[-0.7, (len(shapes) - 1) * width + len(tokens) - 0.3], showgrid=False)
    return x, axis, [(i + 1) * width - 1 for i in range(len(shapes) - 1)]


def _axis_suffix(r: int, c: int, ncols: int) -> str:
    n = (r - 1) * ncols + c
    return "" if n == 1 else str(n)


def _grid_line(fig: go.Figure, y: float, text: str | None, r: int, c: int, ncols: int, color: str = "#444",
               dash: str = "dot", position: str = "right", above: bool = True) -> None:
    """A horizontal reference line in panel (r, c) of a grid, labelled when ``text``."""
    fig.add_hline(y=y, line=dict(color=color, dash=dash, width=1.3), row=r, col=c, exclude_empty_subplots=False)
    if text:
        sfx = _axis_suffix(r, c, ncols)
        fig.add_annotation(x=0.01 if position == "left" else 0.99, xanchor=position, xref=f"x{sfx} domain",
                           yref=f"y{sfx}", y=y, yanchor="bottom" if above else "top", text=text, showarrow=False,
                           font=dict(size=10, color=color), bgcolor="rgba(255,255,255,0.8)")


def _panel_note(fig: go.Figure, text: str, r: int, c: int, ncols: int) -> None:
    """A boxed note in the top-left corner of panel (r, c)."""
    sfx = _axis_suffix(r, c, ncols)
    fig.add_annotation(x=0.01, y=0.98, xref=f"x{sfx} domain", yref=f"y{sfx} domain", xanchor="left", yanchor="top",
                       text=text, showarrow=False, align="left", font=dict(size=11, color="#111"),
                       bgcolor="rgba(255,255,255,0.85)", bordercolor="#bbb", borderwidth=1)


def _megamoe_hover(what: str, fmt: str = ".3f", unit: str = "×") -> str:
    return ("%{customdata[0]}<br>%{customdata[1]}<br>" + what + " %{y:" + fmt + "}" + unit + "<extra></extra>")


def _megamoe_strip(sp: pd.DataFrame, value: str, schedules: list[str], what: str, detail) -> tuple[go.Figure, list]:
    """Per-configuration strips of ``value``: rows = ``schedules``, columns = dtypes, colour = routing.
    ``detail(rows) -> list[str]`` is the second hover line of each point. Returns the figure and the dtypes."""
    from .moe_plan import DTYPES_GPU, ROUTINGS

    dtypes = _ordered(sp.dtype, DTYPES_GPU)
    n_r, n_c = len(schedules), len(dtypes)
    row_px, gap_px = 230, 60
    plot_px = n_r * row_px + (n_r - 1) * gap_px
    fig = make_subplots(rows=n_r, cols=n_c, shared_xaxes=True, shared_yaxes=True, horizontal_spacing=0.03,
                        vertical_spacing=gap_px / plot_px if n_r > 1 else 0.0,
                        subplot_titles=[f"{_moe_schedule_name(s)} · {d}" for s in schedules for d in dtypes])
    x, axis, seps = _megamoe_axis(sp)
    shown = set()
    for r, s in enumerate(schedules, 1):
        for c, d in enumerate(dtypes, 1):
            g = sp[(sp.schedule == s) & (sp.dtype == d)]
            for routing in _ordered(g.routing, ROUTINGS):
                h = g[g.routing == routing]
                fig.add_trace(go.Scatter(
                    x=x[h.index], y=h[value], mode="markers", name=f"routing: {routing}", legendgroup=routing,
                    showlegend=routing not in shown, marker=dict(color=_MOE_ROUTING_COLOR.get(routing, "#333"),
                                                                  size=7, line=dict(color="white", width=0.5)),
                    customdata=np.stack([h.config, detail(h)], axis=-1), hovertemplate=_megamoe_hover(what)),
                    row=r, col=c)
                shown.add(routing)
    for sep in seps:
        fig.add_vline(x=sep, line=dict(color="#ddd", width=1), row="all", col="all", exclude_empty_subplots=False)
    fig.update_xaxes(**axis)
    fig.update_xaxes(title_text="tokens per rank (×2 per slot), by model shape", title_font=dict(size=12),
                     row=n_r)
    fig.update_layout(**_LAYOUT)
    fig.update_layout(height=plot_px + 275, width=max(WIDTH, 560 * n_c), margin=dict(t=145, b=130),
                      legend=dict(orientation="h", yanchor="top", y=-75 / plot_px, x=0))
    return fig, dtypes


def _strip_yrange(values, refs, pad: float = 0.06) -> list[float]:
    v = np.asarray(pd.Series(np.concatenate([np.ravel(values), np.ravel(refs)])).dropna(), float)
    lo, hi = float(v.min()), float(v.max())
    p = max(pad * (hi - lo), 0.02)
    return [lo - p, hi + 2.5 * p]


def _stats_text(v: pd.Series, which=("geomean", "max")) -> str:
    """'geomean 1.12× · max 1.40×' over the finite values of ``v``, with their count."""
    v = v.dropna()
    if v.empty:
        return "no values"
    part = {"geomean": f"geomean <b>{geomean(v):.2f}×</b>", "max": f"max <b>{v.max():.2f}×</b>",
            "min": f"min {v.min():.2f}×"}
    return " · ".join(part[w] for w in which) + f" ({len(v)} configs)"


def megamoe_speedup(df: pd.DataFrame, schedules=None, paper: dict[str, float] | None = None,
                    where: str | None = None) -> go.Figure:
    """Kernel speedup of each schedule over Expert-Wave (:func:`xstage.studies.megamoe_speedups`) for every
    configuration: one panel per (schedule, dtype), x = shape groups x tokens per rank, colour = routing;
    each panel's geomean (dashed, and in its corner with the maximum) and 1 = Expert-Wave.

    schedules: the rows (default: every schedule but expert_wave in the data).
    paper:     reference lines {label: speedup}, dotted; None = the paper's 1.18x geomean and 1.62x maximum
               (data/paper/headline.csv); {} = none.
    where:     the record's world and link for the title (:func:`xstage.studies.megamoe_world_label`).
    Traces: one per (panel, routing present)."""
    from .moe_plan import SCHEDULES
    from .studies import MEGAMOE_BASELINE, megamoe_speedups

    if paper is None:
        paper = {"paper geomean": paper_number("megamoe", "geomean_speedup"),
                 "paper max": paper_number("megamoe", "max_speedup")}
    sp = megamoe_speedups(df)
    have = [s for s in _ordered(sp.schedule, SCHEDULES) if s != MEGAMOE_BASELINE]
    schedules = _intersect(have if schedules is None else [s for s in schedules if s != MEGAMOE_BASELINE],
                           have, "schedules")
    sp = sp[sp.schedule.isin(schedules)]
    detail = lambda h: [f"kernel {k:.3f} ms vs Expert-Wave {e:.3f} ms; model {p:.2f}×"  # noqa: E731
                        for k, e, p in zip(h.kernel_ms, h.expert_wave_ms, h.predicted_speedup)]
    fig, dtypes = _megamoe_strip(sp, "speedup", schedules, "speedup over Expert-Wave", detail)
    n_c = len(dtypes)
    for r, s in enumerate(schedules, 1):
        for c, d in enumerate(dtypes, 1):
            v = sp[(sp.schedule == s) & (sp.dtype == d)].speedup.dropna()
            _grid_line(fig, 1.0, "= Expert-Wave" if c == n_c else None, r, c, n_c, color="#555", dash="solid",
                       above=False)
            if len(v):
                _grid_line(fig, geomean(v), None, r, c, n_c, color="#222", dash="dash")
            for i, (label, y) in enumerate(paper.items()):
                _grid_line(fig, y, f"{label} {y:.2f}×" if c == n_c else None, r, c, n_c, color=_PAPER_COLOR,
                           dash="dot")
            _panel_note(fig, _stats_text(v), r, c, n_c)
    fig.update_yaxes(range=_strip_yrange(sp.speedup, list(paper.values()) + [1.0]))
    for r in range(1, len(schedules) + 1):
        fig.update_yaxes(title_text="speedup (×)", row=r, col=1)
    paper_text = " and ".join(f"{k.removeprefix('paper ')} {v:.2f}×" for k, v in paper.items())
    fig.update_layout(title=_title(
        "MegaMoE: kernel speedup of each schedule over Expert-Wave, per configuration" + (f"<br>{where}" if where else ""),
        "Expert-Wave kernel time ÷ the schedule's (median over repeats, max over ranks); colour: routing<br>"
        "dashed: the panel's geomean" + (f"; dotted: the paper's {paper_text} (8 GPUs)" if paper else "")))
    return fig


def megamoe_model_parity(df: pd.DataFrame, schedules=None, tolerance: float | None = None,
                         title: str | None = None) -> go.Figure:
    """The Burst-Gap model's predicted speedup over Expert-Wave against the measured one, every configuration,
    colour = schedule, symbol = dtype; y = x and a ±``tolerance`` band (default
    xstage.studies.MODEL_TOLERANCE, 10 %: |predicted − measured| ≤ tolerance × measured); the fraction inside
    per schedule and dtype in the legend; ``title`` replaces the main title (e.g. for a revised model's
    predictions put in ``predicted_speedup``). Traces: the band (2), y = x, then one per (schedule, dtype)."""
    from .moe_plan import DTYPES_GPU, SCHEDULES
    from .studies import MEGAMOE_BASELINE, MODEL_TOLERANCE, megamoe_speedups

    tol = MODEL_TOLERANCE if tolerance is None else tolerance
    sp = megamoe_speedups(df)
    have = [s for s in _ordered(sp.schedule, SCHEDULES) if s != MEGAMOE_BASELINE]
    schedules = _intersect(have if schedules is None else [s for s in schedules if s != MEGAMOE_BASELINE],
                           have, "schedules")
    sp = sp[sp.schedule.isin(schedules)].dropna(subset=["speedup", "predicted_speedup"])
    if sp.empty:
        return empty_figure("MegaMoE: predicted vs measured speedup", "no configuration has both speedups")
    both = np.r_[sp.speedup, sp.predicted_speedup]
    lo, hi = float(both.min()), float(both.max())
    pad = 0.05 * (hi - lo) + 0.02
    lo, hi = lo - pad, hi + pad
    fig = go.Figure(layout=_LAYOUT)
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo * (1 - tol), hi * (1 - tol)], mode="lines", hoverinfo="skip",
                             line=dict(width=0), showlegend=False))
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo * (1 + tol), hi * (1 + tol)], mode="lines", hoverinfo="skip",
                             line=dict(width=0), fill="tonexty", fillcolor="rgba(120,120,120,0.15)",
                             name=f"±{tol:.0%} of measured"))
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", line=dict(color="#333", width=1),
                             name="y = x", hoverinfo="skip"))
    for s in schedules:
        for d in _ordered(sp.dtype, DTYPES_GPU):
            g = sp[(sp.schedule == s) & (sp.dtype == d)]
            if g.empty:
                continue
            inside = float((g.model_error.abs() <= tol).mean())
            fig.add_trace(go.Scatter(
                x=g.speedup, y=g.predicted_speedup, mode="markers",
                name=f"{_moe_schedule_name(s)} · {d}: {inside:.0%} within ±{tol:.0%}",
                marker=dict(color=_MOE_SCHEDULE_STYLE.get(s, ("", "#333"))[1], size=8, opacity=0.75,
                            symbol=_MOE_DTYPE_SYMBOL.get(d, "circle"), line=dict(color="white", width=0.5)),
                customdata=np.stack([g.config, g.model_error * 100], axis=-1),
                hovertemplate="%{customdata[0]}<br>measured %{x:.3f}×, predicted %{y:.3f}× "
                              "(%{customdata[1]:+.1f}%)<extra></extra>"))
    overall = float((sp.model_error.abs() <= tol).mean())
    fig.update_layout(
        title=_title(title or "MegaMoE: the Burst-Gap model's predicted speedup against the measured one",
                     f"speedup over Expert-Wave per configuration; {overall:.0%} of {len(sp)} points within "
                     f"±{tol:.0%} (goal: all)"),
        xaxis=dict(title="measured speedup over Expert-Wave (×)", range=[lo, hi], constrain="domain"),
        yaxis=dict(title="predicted speedup (×)", range=[lo, hi], scaleanchor="x", constrain="domain"),
        legend=dict(font=dict(size=11), traceorder="normal"), width=WIDTH + 120, height=HEIGHT + 120)
    return fig


def megamoe_order_cost(cost: pd.DataFrame) -> go.Figure:
    """Each compared schedule's kernel time minus Expert-Wave's (y, ms) against the time the X-Stage needs to drain
    that configuration's whole remote combine (x, ms, log), from :func:`xstage.studies.megamoe_order_cost`. The
    grey wedge |y| <= x is what burst shaping could explain at most; points outside it differ for another reason.
    Columns: dtypes; colour: schedule. Traces: per dtype the wedge (2) + one per schedule."""
    from .moe_plan import DTYPES_GPU, SCHEDULES

    if cost.empty:
        return empty_figure("MegaMoE: schedule time differences against the stage's drain time", "no rows")
    dtypes = _ordered(cost.dtype, DTYPES_GPU)
    n_c = len(dtypes)
    fig = make_subplots(rows=1, cols=n_c, shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=[f"{d}" for d in dtypes])
    xs = cost.drain_ms[cost.drain_ms > 0]
    lo, hi = float(xs.min()) / 1.5, float(xs.max()) * 1.5
    wx = np.geomspace(lo, hi, 50)
    for c, d in enumerate(dtypes, 1):
        fig.add_trace(go.Scatter(x=wx, y=-wx, mode="lines", line=dict(width=0), hoverinfo="skip", showlegend=False),
                      row=1, col=c)
        fig.add_trace(go.Scatter(x=wx, y=wx, mode="lines", line=dict(width=0.5, color="#999"), fill="tonexty",
                                 fillcolor="rgba(120,120,120,0.18)", hoverinfo="skip", showlegend=c == 1,
                                 name="|difference| ≤ drain time of the whole combine"), row=1, col=c)
        g = cost[cost.dtype == d]
        for s in _ordered(g.schedule, SCHEDULES):
            h = g[g.schedule == s]
            beyond = float(h.beyond_stage.mean())
            fig.add_trace(go.Scatter(
                x=h.drain_ms, y=h.extra_ms, mode="markers", legendgroup=s, showlegend=c == 1,
                name=_moe_schedule_name(s),
                marker=dict(color=_MOE_SCHEDULE_STYLE.get(s, ("", "#333"))[1], size=7, opacity=0.75),
                customdata=np.stack([h.config, [f"{beyond:.0%} of {_moe_schedule_name(s)} outside the wedge"] * len(h)],
                                    axis=-1),
                hovertemplate="%{customdata[0]}<br>drain %{x:.3f} ms, difference %{y:+.3f} ms<br>%{customdata[1]}"
                              "<extra></extra>"), row=1, col=c)
        _panel_note(fig, f"outside the wedge: {int(g.beyond_stage.sum())} of {len(g)}", 1, c, n_c)
    fig.update_xaxes(type="log", title_text="time to drain the whole remote combine at the fitted drain rate (ms)",
                     title_font=dict(size=12))
    fig.update_yaxes(title_text="kernel time − Expert-Wave's (ms)", row=1, col=1)
    fig.update_layout(**_LAYOUT)
    fig.update_layout(height=HEIGHT + 40, width=max(WIDTH, 560 * n_c), margin=dict(t=120, b=120),
                      legend=dict(orientation="h", yanchor="top", y=-0.2, x=0),
                      title=_title("MegaMoE: are the schedules' time differences the X-Stage?",
                                   "each point: one configuration and schedule; the wedge bounds what shaping the "
                                   "remote-store bursts could add or save"))
    return fig


def megamoe_fused_over_unfused(df: pd.DataFrame, schedules=None, goal: float | None = None) -> go.Figure:
    """The fused layer's speedup over the unfused baseline (NCCL all_to_all + torch._grouped_mm layer):
    unfused_ms / layer_ms per configuration, one panel per (schedule, dtype) as :func:`megamoe_speedup`; the
    goal ``goal`` (default xstage.studies.FUSED_OVER_UNFUSED_GOAL, 1.3× geomean) dotted, each panel's geomean
    dashed and in its corner with the minimum. schedules: default every schedule in the data (Expert-Wave
    too: the fused layer with the baseline schedule). Traces: one per (panel, routing present)."""
    from .moe_plan import SCHEDULES
    from .studies import FUSED_OVER_UNFUSED_GOAL, megamoe_speedups

    goal = FUSED_OVER_UNFUSED_GOAL if goal is None else goal
    sp = megamoe_speedups(df)
    have = _ordered(sp.schedule, SCHEDULES)
    schedules = _intersect(have if schedules is None else list(schedules), have, "schedules")
    sp = sp[sp.schedule.isin(schedules)]
    detail = lambda h: [f"layer {a:.3f} ms vs unfused {b:.3f} ms" for a, b in zip(h.layer_ms, h.unfused_ms)]  # noqa: E731
    fig, dtypes = _megamoe_strip(sp, "fused_speedup", schedules, "unfused ÷ fused", detail)
    n_c = len(dtypes)
    for r, s in enumerate(schedules, 1):
        for c, d in enumerate(dtypes, 1):
            v = sp[(sp.schedule == s) & (sp.dtype == d)].fused_speedup.dropna()
            _grid_line(fig, 1.0, "= unfused" if c == n_c else None, r, c, n_c, color="#555", dash="solid",
                       above=False)
            _grid_line(fig, goal, f"goal: geomean ≥ {goal:g}×" if c == n_c else None, r, c, n_c)
            if len(v):
                _grid_line(fig, geomean(v), None, r, c, n_c, color="#222", dash="dash")
            _panel_note(fig, _stats_text(v, ("geomean", "min")), r, c, n_c)
    fig.update_yaxes(range=_strip_yrange(sp.fused_speedup, [1.0, goal]))
    for r in range(1, len(schedules) + 1):
        fig.update_yaxes(title_text="speedup (×)", row=r, col=1)
    fig.update_layout(title=_title(
        "MegaMoE: the fused layer against the unfused baseline, per configuration",
        "unfused (NCCL all_to_all, torch._grouped_mm experts, all_to_all back) ÷ fused layer (dispatch, kernel,"
        "<br>barriers, top-k sum); medians over repeats, max over ranks; colour: routing; dashed: the panel's "
        "geomean"))
    return fig


def megamoe_gemm(df: pd.DataFrame, goal: float | None = None) -> go.Figure:
    """GEMM phases: our kernel with every combine store local (compute only, the Expert-Wave schedule) against
    torch._grouped_mm (Linear-1, SwiGLU, Linear-2 on the same rows, bf16 weights), per configuration. Top row:
    TFLOP/s of each (GEMM FLOPs of the busiest rank's rows ÷ time); bottom row: ours ÷ torch._grouped_mm
    (= grouped_mm_ms / compute_ms) with the goal ``goal`` (default xstage.studies.GEMM_OVER_GROUPED_MM_GOAL,
    0.7). Columns: dtypes. Without grouped_mm_ms in the data (absent or all NaN) only the top row, ours alone,
    and the subtitle says so. Traces: per dtype 1-2 (top) + 1 (bottom, where it has ratios)."""
    from .moe_plan import DTYPES_GPU
    from .studies import GEMM_OVER_GROUPED_MM_GOAL, megamoe_speedups

    goal = GEMM_OVER_GROUPED_MM_GOAL if goal is None else goal
    sp = megamoe_speedups(df).drop_duplicates(["config", "P", "dtype"])   # compute-only times: one per config
    dtypes = _ordered(sp.dtype, DTYPES_GPU)
    n_c = len(dtypes)
    has_gm = bool(sp.gemm_efficiency.notna().any())
    n_r = 2 if has_gm else 1
    titles = [f"TFLOP/s · {d}" for d in dtypes] + ([f"ours ÷ torch._grouped_mm · {d}" for d in dtypes] if has_gm
                                                   else [])
    fig = make_subplots(rows=n_r, cols=n_c, shared_xaxes=True, shared_yaxes=True, horizontal_spacing=0.03,
                        vertical_spacing=0.14, row_heights=[0.55, 0.45] if has_gm else None, subplot_titles=titles)
    x, axis, seps = _megamoe_axis(sp)
    for c, d in enumerate(dtypes, 1):
        g = sp[sp.dtype == d]
        for col, name, color, symbol in (("compute_tflops", "our kernel, compute only", "#d62728", "circle"),
                                         ("grouped_mm_tflops", "torch._grouped_mm (bf16)", "#1f77b4",
                                          "circle-open")):
            if col == "grouped_mm_tflops" and not g[col].notna().any():
                continue
            fig.add_trace(go.Scatter(
                x=x[g.index], y=g[col], mode="markers", name=name, legendgroup=col, showlegend=c == 1,
                marker=dict(color=color, size=7, symbol=symbol, line=dict(color=color, width=1.5)),
                customdata=np.stack([g.config, [f"{r:,.0f} rows on the busiest rank" for r in g.rows]], axis=-1),
                hovertemplate=_megamoe_hover(name, ".0f", " TFLOP/s")), row=1, col=c)
        if not has_gm:
            continue
        h = g.dropna(subset=["gemm_efficiency"])
        fig.add_trace(go.Scatter(
            x=x[h.index], y=h.gemm_efficiency, mode="markers", name="ours ÷ torch._grouped_mm",
            legendgroup="ratio", showlegend=c == 1, marker=dict(color="#9467bd", size=7),
            customdata=np.stack([h.config, [f"compute {a:.3f} ms, grouped_mm {b:.3f} ms" for a, b in
                                            zip(h.compute_ms, h.grouped_mm_ms)]], axis=-1).reshape(len(h), 2),
            hovertemplate=_megamoe_hover("ours ÷ grouped_mm")), row=2, col=c)
        _panel_note(fig, _stats_text(h.gemm_efficiency, ("geomean", "min", "max")) if len(h) else
                    "torch._grouped_mm not recorded for this dtype", 2, c, n_c)
        _grid_line(fig, goal, f"goal ≥ {goal:g}" if c == n_c else None, 2, c, n_c)
        _grid_line(fig, 1.0, "= torch._grouped_mm" if c == n_c else None, 2, c, n_c, color="#1f77b4",
                   dash="solid", above=False)
    for sep in seps:
        fig.add_vline(x=sep, line=dict(color="#ddd", width=1), row="all", col="all", exclude_empty_subplots=False)
    fig.update_xaxes(**axis)
    fig.update_xaxes(title_text="tokens per rank (×2 per slot), by model shape", title_font=dict(size=12),
                     row=n_r)
    fig.update_yaxes(**_log_axis(np.r_[sp.compute_tflops, sp.grouped_mm_tflops]), row=1)
    fig.update_yaxes(title_text="TFLOP/s", row=1, col=1)
    if has_gm:
        fig.update_yaxes(title_text="ratio (×)", range=_strip_yrange(sp.gemm_efficiency, [goal, 1.0]), row=2, col=1)
    fig.update_layout(**_LAYOUT)
    fig.update_layout(
        height=(HEIGHT + 320) if has_gm else HEIGHT + 80, width=max(WIDTH, 560 * n_c), margin=dict(t=145, b=130),
        legend=dict(orientation="h", yanchor="top", y=-0.12 if has_gm else -0.2, x=0),
        title=_title("MegaMoE: GEMM phases of our kernel against torch._grouped_mm",
                     "compute only (every combine store local, Expert-Wave) vs torch._grouped_mm Linear-1 + SwiGLU "
                     "+ Linear-2<br>on the busiest rank's rows (bf16 weights); medians over repeats" +
                     ("" if has_gm else "; <b>torch._grouped_mm not recorded in this data</b>")))
    return fig


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
    """The synchronised sweep's two harnesses (``studies.barrier_harness`` rows): per configuration (programs,
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
    relative to its burst's median program (xstage.studies.program_favour), one trace per program count.
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
    from .fit import full_rung

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
    from .model import predict_train

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


def megamoe_gemm_ladder_figure(ladder: pd.DataFrame, title: str = "") -> go.Figure:
    """The GEMM version ladder (xstage.studies.megamoe_gemm_ladder): per configuration (x) and dtype (column),
    TFLOP/s of each tile variant of our kernel (bars, compute only, Expert-Wave) and of the library calls of the
    same rounds (markers: torch._grouped_mm; for fp8 also torch._scaled_grouped_mm). Traces: per dtype one per
    variant + one per library with data."""
    dtypes = list(dict.fromkeys(ladder.dtype))
    fig = make_subplots(rows=1, cols=len(dtypes), shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=[f"TFLOP/s · {d}" for d in dtypes])
    for c, d in enumerate(dtypes, 1):
        g = ladder[ladder.dtype == d]
        for v, h in g.groupby("variant", sort=False):
            fig.add_trace(go.Bar(x=h.config, y=h.tflops, name=f"ours: {v}", legendgroup=f"{d}:{v}",
                                 customdata=np.stack([h.tiles, h.rows], axis=-1),
                                 hovertemplate="%{x}<br>" + f"ours {v} " + "(%{customdata[0]}, %{customdata[1]} rows)"
                                 "<br>%{y:.0f} TFLOP/s<extra></extra>"), row=1, col=c)
        first = g.drop_duplicates("config")
        for col, name, sym in (("grouped_mm_tflops", "torch._grouped_mm", "diamond"),
                               ("scaled_grouped_mm_tflops", "torch._scaled_grouped_mm", "star")):
            if first[col].notna().any():
                fig.add_trace(go.Scatter(x=first.config, y=first[col], mode="markers", name=name,
                                         legendgroup=f"{d}:{name}", marker=dict(size=12, symbol=sym, color="black"),
                                         hovertemplate="%{x}<br>" + name + " %{y:.0f} TFLOP/s<extra></extra>"),
                              row=1, col=c)
    fig.update_layout(barmode="group", title=title or "MegaMoE GEMM phases: tile variants against the library",
                      height=460, legend=dict(orientation="h", y=-0.35))
    return fig


def megamoe_round3_gemm_figure(g: pd.DataFrame, title: str = "") -> go.Figure:
    """Round 3's GEMM study (xstage.studies.megamoe_round3_gemm): per dtype (column) and configuration (x, table
    order), ours / the library of the same rounds (bf16: torch._grouped_mm; fp8: torch._scaled_grouped_mm) with
    the default tiles (filled: >= 2048 rows on the rank, open: fewer) and with tiles version 1 (grey), and the
    issue's goal lines (0.95 geomean, 0.9 on every configuration with >= 2048 rows). Traces: per dtype 3."""
    from .studies import MEGAMOE_GEMM_GOALS

    dtypes = list(dict.fromkeys(g.dtype))
    lib = {"bf16": ("vs_grouped_mm", "v1_vs_grouped_mm", "torch._grouped_mm"),
           "fp8": ("vs_scaled_grouped_mm", "v1_vs_scaled_grouped_mm", "torch._scaled_grouped_mm")}
    fig = make_subplots(rows=1, cols=len(dtypes), shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=[f"{d}: ours / {lib.get(d, lib['bf16'])[2]}" for d in dtypes])
    big = MEGAMOE_GEMM_GOALS["min_rows"]
    for c, d in enumerate(dtypes, 1):
        h = g[g.dtype == d]
        col, v1col, name = lib.get(d, lib["bf16"])
        fig.add_trace(go.Scatter(x=h.config, y=h[v1col], mode="markers", name=f"{d}: tiles version 1",
                                 marker=dict(size=6, color="lightgrey"),
                                 hovertemplate="%{x}<br>tiles v1 / " + name + " %{y:.3f}<extra></extra>"), row=1, col=c)
        for is_big, sym in ((True, "circle"), (False, "circle-open")):
            k = h[(h.rows >= big) == is_big]
            fig.add_trace(go.Scatter(x=k.config, y=k[col], mode="markers",
                                     name=f"{d}: default tiles ({'>=' if is_big else '<'} {big} rows)",
                                     marker=dict(size=8, symbol=sym, color="#1f77b4"),
                                     customdata=np.stack([k.tiles, k.rows], axis=-1),
                                     hovertemplate="%{x} (%{customdata[1]} rows, %{customdata[0]})<br>ours / " + name
                                     + " %{y:.3f}<extra></extra>"), row=1, col=c)
        for y, dash, txt in ((MEGAMOE_GEMM_GOALS["geomean"], "dash", "goal: geomean >= 0.95"),
                             (MEGAMOE_GEMM_GOALS["min_big"], "dot", f"goal: >= 0.9 at >= {big} rows")):
            fig.add_hline(y=y, line_dash=dash, line_color="grey", annotation_text=txt, row=1, col=c)
        fig.update_xaxes(showticklabels=False, title_text="configuration (shape, tokens, routing)", row=1, col=c)
    fig.update_layout(title=title or "MegaMoE GEMM phases against the library, 84 configurations", height=480,
                      legend=dict(orientation="h", y=-0.2))
    return fig


def megamoe_round3_controls_figure(per: pd.DataFrame, title: str = "") -> go.Figure:
    """Round 3's controls (xstage.studies.megamoe_round3_controls): per assignment (row) and dtype (column), each
    schedule's compute-only time / Expert-Wave's (same assignment, same rounds) per configuration (x, table
    order), order version 2 (filled) and version 1 (open, dynamic only), with the issue's goal lines (1.02
    geomean, 1.05 worst). Traces: one per (assignment, dtype, schedule, variant) with data."""
    from .studies import MEGAMOE_ORDER_GOALS

    dtypes = list(dict.fromkeys(per.dtype))
    assigns = [a for a in ("static", "dynamic") if a in set(per.assignment)]
    fig = make_subplots(rows=len(assigns), cols=len(dtypes), shared_yaxes=True, shared_xaxes=True,
                        vertical_spacing=0.1, horizontal_spacing=0.04,
                        subplot_titles=[f"{a} assignment · {d}" for a in assigns for d in dtypes])
    colours = {"interleaved": "#1f77b4", "lag": "#ff7f0e", "model_guided": "#2ca02c"}
    for r, a in enumerate(assigns, 1):
        for c, d in enumerate(dtypes, 1):
            h = per[(per.assignment == a) & (per.dtype == d) & (per.schedule != "expert_wave")]
            for (s, v), k in h.groupby(["schedule", "variant"], sort=False):
                fig.add_trace(go.Scatter(
                    x=k.config, y=k.over_ew, mode="markers", name=f"{s} (order {'v1' if v == 'order_v1' else 'v2'})",
                    legendgroup=f"{s}:{v}", showlegend=(r, c) == (len(assigns), 1),
                    marker=dict(size=7, color=colours.get(s, "black"),
                                symbol="circle-open" if v == "order_v1" else "circle"),
                    hovertemplate="%{x}<br>" + f"{s} {v} {a}: " + "%{y:.3f} of Expert-Wave<extra></extra>"),
                    row=r, col=c)
            for y, dash in ((MEGAMOE_ORDER_GOALS["geomean"], "dash"), (MEGAMOE_ORDER_GOALS["worst"], "dot")):
                fig.add_hline(y=y, line_dash=dash, line_color="grey", row=r, col=c)
            fig.add_hline(y=1.0, line_color="black", line_width=1, row=r, col=c)
            fig.update_xaxes(showticklabels=False, row=r, col=c)
    fig.update_layout(title=title or "MegaMoE: each schedule's compute-only time / Expert-Wave's", height=640,
                      legend=dict(orientation="h", y=-0.08))
    return fig


def megamoe_links_figure(table: pd.DataFrame, title: str = "") -> go.Figure:
    """Records side by side (:func:`xstage.studies.megamoe_links_table`): per dtype (column) and schedule (x), each
    record's geomean kernel speedup over Expert-Wave (bar; its label, which names world, link and defaults, in the
    legend), its maximum (marker) and the model's geomean (open diamond); dotted: 1 (Expert-Wave). Traces: per
    record and dtype 3."""
    t = table[table.schedule != "expert_wave"]
    dtypes = list(dict.fromkeys(t.dtype))
    recs = list(dict.fromkeys(t.record))
    if t.empty:
        raise ValueError("the table has no schedule other than expert_wave")
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b"]
    fig = make_subplots(rows=1, cols=len(dtypes), shared_yaxes=True, horizontal_spacing=0.05,
                        subplot_titles=[f"{d}: schedule / Expert-Wave kernel time" for d in dtypes])
    for c, d in enumerate(dtypes, 1):
        for i, rec in enumerate(recs):
            h = t[(t.dtype == d) & (t.record == rec)]
            col = colors[i % len(colors)]
            n = f"{int(h.configs.min())}-{int(h.configs.max())}" if h.configs.nunique() > 1 else str(int(h.configs.iloc[0]))
            fig.add_trace(go.Bar(x=h.schedule, y=h.geomean_speedup, name=rec, legendgroup=rec, showlegend=c == 1,
                                 marker_color=col, offsetgroup=str(i), text=[f"{v:.2f}" for v in h.geomean_speedup],
                                 hovertemplate=f"{rec}<br>%{{x}}: geomean %{{y:.3f}} over {n} configurations"
                                 "<extra></extra>"), row=1, col=c)
            fig.add_trace(go.Scatter(x=h.schedule, y=h.max_speedup, mode="markers", name="max", legendgroup=rec,
                                     showlegend=False, marker=dict(symbol="line-ew-open", size=14, color=col),
                                     offsetgroup=str(i), hovertemplate="max %{y:.3f}<extra></extra>"), row=1, col=c)
            fig.add_trace(go.Scatter(x=h.schedule, y=h.geomean_predicted, mode="markers", name="model geomean",
                                     legendgroup=rec, showlegend=False, offsetgroup=str(i),
                                     marker=dict(symbol="diamond-open", size=10, color=col),
                                     hovertemplate="model geomean %{y:.3f}<extra></extra>"), row=1, col=c)
        fig.add_hline(y=1.0, line_dash="dot", line_color="grey", row=1, col=c)
    fig.update_layout(barmode="group", scattermode="group", height=520, legend=dict(orientation="h", y=-0.25),
                      title=title or "MegaMoE: each record's geomean (bar), max (dash) and model geomean (diamond)")
    return fig
