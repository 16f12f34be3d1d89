"""Figures of the burst-gap sweep, the fluid fit and the model explorer (notebooks 00, 01, 02): one function per
panel, rows or fits in, ``go.Figure`` out (conventions: xstage.figures).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .burst_gap_analysis import (CE_METHOD, bandwidth_summary, measured_onset, per_config, pick_bursts, select,
                                 slowdown_table, sm_over_ce)
from .figures import (_BURSTS, bytes_label, _colors, _DASH, empty_figure, _gap_label, HEIGHT, _hline, _intersect,
                      _iqr, _LAYOUT, _log_axis, _MEASURES, _METHOD_NAME, _palette, _size_ticks, _TARGET_NAME,
                      _targets, _title, _trace_ys, WIDTH)
from .fit import fluid_summary
from .fluid import KIB, BurstGapParams, burst_bytes_total, onset_burst_bytes, steady_slowdown, train

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
    (:func:`xstage.burst_gap_analysis.slowdown_table`) over burst size x program count, for the first burst and for the
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
