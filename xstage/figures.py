"""Plotly figure builders for the study notebooks: one function per panel, data in, ``go.Figure`` out.

Every builder takes tidy rows (xstage.data schemas), a :class:`xstage.fit.FitResult` or model parameters, and
returns a figure with a title, axis titles with units, and log axes where sizes span decades. Nothing here
reads files or fits: the notebook passes what the analysis modules and :mod:`xstage.fit` return, and hands
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

from .numeric import geomean
from .studies import (ATTENTION_OVER_CUDNN_GOAL, FUSED_OVER_ATTENTION_GOAL, paper_number, ulysses_family,
                      ulysses_medians, ulysses_ratios, ulysses_speedups)

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


# ---------------------------------------------------------------------------------- study 4: Ulysses attention
# One colour per method (and per speedup line); the fused layer's end-to-end time is the fused colour, dashed.
_ULYSSES_STYLE = {
    "fused_sv": ("fused: epilogue stores each tile to its owner (sender-visible)", "#d62728", "solid"),
    "fused_e2e": ("fused (end to end: output complete on every rank)", "#d62728", "dash"),
    "serial_triton": ("serial: our attention, then the all-to-all", "#7f7f7f", "solid"),
    "serial_cudnn": ("serial with cuDNN SDPA, then the all-to-all", "#1f77b4", "solid"),
    "overlapped": ("overlapped: head chunks, all-to-all on a side stream", "#2ca02c", "solid"),
    "attention_only": ("our attention alone (no communication)", "#9467bd", "solid"),
    "sdpa_only": ("cuDNN SDPA alone (no communication)", "#17becf", "solid"),
}
_ULYSSES_RATIO_STYLE = {
    "fused_sv": ("fused, sender-visible", "#d62728", "solid"),
    "fused_e2e": ("fused, end to end", "#d62728", "dash"),
    "serial": ("serial: attention, then the all-to-all", "#7f7f7f", "solid"),
}


def _seq_label(S: int) -> str:
    """16384 -> '16K'; 17776 -> '17,776'."""
    return f"{S // 1024}K" if S % 1024 == 0 else f"{S:,}"


def _seq_axis(values, **kw) -> dict:
    """A log axis over sequence lengths, ticked at the powers of two in range (labelled 4K, 8K, ...), or at the
    values themselves when fewer than two powers fall inside."""
    v = np.asarray(sorted(set(int(x) for x in values)), float)
    lo, hi = v.min(), v.max()
    ticks = [2.0 ** e for e in range(0, 40) if lo / 1.01 <= 2.0 ** e <= hi * 1.01]
    if len(ticks) < 2:
        ticks = list(v)
    pad = max(np.log10(hi / lo) * 0.06, 0.06)
    return dict(type="log", range=[np.log10(lo) - pad, np.log10(hi) + pad], tickvals=ticks,
                ticktext=[_seq_label(int(t)) for t in ticks], **kw)


def _ref_line(fig: go.Figure, y: float, text: str, col: int = 1, color: str = "#444", dash: str = "dot",
              position: str = "left", above: bool = True) -> None:
    """A labelled horizontal reference line in panel ``col`` of a one-row figure (linear y)."""
    fig.add_hline(y=y, line=dict(color=color, dash=dash, width=1.4), row=1, col=col)
    sfx = "" if col == 1 else str(col)
    fig.add_annotation(x=0.01 if position == "left" else 0.99, xanchor=position, xref=f"x{sfx} domain",
                       yref=f"y{sfx}", y=y, yanchor="bottom" if above else "top", text=text, showarrow=False,
                       font=dict(size=11, color=color), bgcolor="rgba(255,255,255,0.8)")


def _ulysses_panels(ranks) -> tuple[go.Figure, list[int]]:
    """One panel per rank count (side by side), shared y."""
    ranks = sorted(int(p) for p in set(ranks))
    fig = make_subplots(rows=1, cols=len(ranks), shared_yaxes=True, horizontal_spacing=0.05,
                        subplot_titles=[f"P = {p} ranks" for p in ranks] if len(ranks) > 1 else None)
    return fig, ranks


def _ulysses_groups(s: pd.DataFrame):
    """(label suffix, rows, mode, in legend) per group of one line: the sequence sweep joined by lines, one
    group per (H, D); DiT shapes as unjoined diamonds (their heads differ), in the legend only without a sweep."""
    seq = s[s.family == "sequence sweep"]
    hd = sorted(set(zip(seq.H, seq.D)))
    for h, d in hd:
        g = seq[(seq.H == h) & (seq.D == d)].sort_values("S")
        yield ("" if len(hd) == 1 else f" ({h}×{d})"), g, "lines+markers", True
    dit = s[s.family != "sequence sweep"].sort_values("S")
    if len(dit):
        yield " (DiT shapes)", dit, "markers", not hd


def _ulysses_subtitle_shapes(df: pd.DataFrame) -> str:
    """'<world and link>; lines: S sweep at 24×128 heads×dim; diamonds: DiT shapes' for what the data holds (the
    world and link from ``df.attrs["world"]``, set by :func:`xstage.studies.ulysses_data`)."""
    fam = df["shape"].map(ulysses_family)
    parts = [df.attrs["world"]] if df.attrs.get("world") else []
    seq = df[fam == "sequence sweep"]
    if len(seq):
        hd = ", ".join(f"{h}×{d}" for h, d in sorted(set(zip(seq.H, seq.D))))
        parts.append(f"lines: S sweep at {hd} heads×dim")
    if (fam != "sequence sweep").any():
        parts.append("diamonds: DiT shapes")
    return "; ".join(parts)


def _ulysses_hover(what: str) -> str:
    return (f"%{{customdata[0]}}<br>S=%{{x:,}}, %{{customdata[1]}}, P=%{{customdata[2]}}<br>{what} "
            "%{y:.3f}×<extra></extra>")


def _ulysses_customdata(g: pd.DataFrame) -> np.ndarray:
    return np.stack([g["shape"], [f"{h}×{d}" for h, d in zip(g.H, g.D)], g.P], axis=-1)


def _ulysses_scatter(g: pd.DataFrame, y, mode: str, name: str, group: str, legend: bool, style: tuple,
                     **kw) -> go.Scatter:
    """One group's points vs S: ``style`` = (colour, dash, bold); dashed lines get open markers, DiT shapes
    (``mode="markers"``) diamonds."""
    color, dash, bold = style
    symbol = ("diamond" if mode == "markers" else "circle") + ("-open" if dash == "dash" else "")
    return go.Scatter(x=g.S, y=y, mode=mode, name=name, legendgroup=group, showlegend=legend,
                      line=dict(color=color, dash=dash, width=2.5 if bold else 2),
                      marker=dict(size=11 if mode == "markers" else 7, color=color, symbol=symbol,
                                  line=dict(color=color, width=2)),
                      customdata=_ulysses_customdata(g), **kw)


def ulysses_speedup(df: pd.DataFrame, paper: dict[str, float] | None = None) -> go.Figure:
    """Speedup over serial execution (our attention, then NCCL all-to-all) vs sequence length: the fused
    layer's sender-visible and end-to-end speedups, the stream-overlapped pipeline and the cuDNN serial
    baseline (:func:`xstage.studies.ulysses_speedups`), one panel per rank count, log S axis.

    paper: reference lines {label: speedup} drawn dashed; None = the paper's headline numbers
           (data/paper/headline.csv: max sender-visible speedup of FA3 and FA4 on 8 GPUs); {} = none.
    Traces: per speedup line present x panel x group (S sweep per heads×dim joined by lines, DiT shapes as
    diamonds); error bars: quartile ratios over repeats.
    """
    if paper is None:
        paper = {"paper FA3 (8 GPUs)": paper_number("ulysses", "fa3_max_sender_visible_speedup"),
                 "paper FA4 (8 GPUs)": paper_number("ulysses", "fa4_max_sender_visible_speedup")}
    sp = ulysses_speedups(df)
    fig, ranks = _ulysses_panels(sp.P)
    for c, p in enumerate(ranks, 1):
        for line in [k for k in ("fused_sv", "fused_e2e", "overlapped", "serial_cudnn") if k in set(sp.line)]:
            name, color, dash = _ULYSSES_STYLE[line]
            s = sp[(sp.line == line) & (sp.P == p)]
            for suffix, g, mode, legend in _ulysses_groups(s):
                fig.add_trace(_ulysses_scatter(
                    g, g.speedup, mode, name + suffix, line, legend and c == 1, (color, dash, line == "fused_sv"),
                    error_y=dict(type="data", symmetric=False, array=g.high - g.speedup,
                                 arrayminus=g.speedup - g.low, thickness=1, width=3),
                    hovertemplate=_ulysses_hover(name)), row=1, col=c)
        _ref_line(fig, 1.0, "1 = serial (our attention, then the all-to-all)", col=c, color="#555", dash="solid",
                  position="left", above=False)
        for i, (label, v) in enumerate(paper.items()):
            _ref_line(fig, v, f"{label}: {v:.2f}×", col=c, color="#8c564b", dash="dash",
                      position="left" if i % 2 == 0 else "right", above=(i % 2 == 0))
        fig.update_xaxes(title_text="sequence length S (tokens)", **_seq_axis(sp.S), row=1, col=c)
    ys = np.concatenate([sp.low, sp.high, list(paper.values()), [1.0]])
    lo, hi = float(np.nanmin(ys)), float(np.nanmax(ys))
    pad = 0.06 * (hi - lo)
    fig.update_yaxes(title_text="speedup over serial (×)", range=[lo - pad, hi + pad], row=1, col=1)
    fig.update_layout(**_LAYOUT)
    fig.update_layout(
        height=HEIGHT + 80, legend=dict(orientation="h", y=-0.18, x=0, font=dict(size=12)),
        title=_title("Ulysses attention: speedup over serial vs sequence length",
                     f"median serial time ÷ median time (bars: quartile ratios over repeats); "
                     f"{_ulysses_subtitle_shapes(df)}"))
    return fig


def ulysses_fused_over_attention(df: pd.DataFrame, goal: float | None = None) -> go.Figure:
    """The fused layer's time over our attention alone vs sequence length (sender-visible and end to end),
    beside serial (attention, then NCCL all-to-all) over attention alone; the goal ``goal`` (default
    xstage.studies.FUSED_OVER_ATTENTION_GOAL, 1.05) as a dotted line. Traces: per ratio x panel x group, as
    :func:`ulysses_speedup`."""
    goal = FUSED_OVER_ATTENTION_GOAL if goal is None else goal
    r = ulysses_ratios(df)
    fig, ranks = _ulysses_panels(r.P)
    for c, p in enumerate(ranks, 1):
        for key, (name, color, dash) in _ULYSSES_RATIO_STYLE.items():
            s = r[(r.P == p) & r[key].notna()].assign(value=lambda d, k=key: d[k])
            for suffix, g, mode, legend in _ulysses_groups(s):
                fig.add_trace(_ulysses_scatter(
                    g, g.value, mode, name + suffix, key, legend and c == 1, (color, dash, key == "fused_sv"),
                    hovertemplate=_ulysses_hover(f"{name} ÷ attention alone")), row=1, col=c)
        _ref_line(fig, 1.0, "= our attention alone", col=c, color="#9467bd", dash="solid", position="right",
                  above=False)
        _ref_line(fig, goal, f"goal: fused ≤ {goal:g}× attention alone", col=c, color="#444", dash="dot")
        fig.update_xaxes(title_text="sequence length S (tokens)", **_seq_axis(r.S), row=1, col=c)
    ys = np.append(_trace_ys(fig), [1.0, goal])
    lo, hi = float(np.nanmin(ys)), float(np.nanmax(ys))
    pad = max(0.08 * (hi - lo), 0.005)
    fig.update_yaxes(title_text="time ÷ our attention alone (×)", range=[lo - pad, hi + pad], row=1, col=1)
    fig.update_layout(**_LAYOUT)
    fig.update_layout(
        legend=dict(orientation="h", y=-0.16, x=0),
        title=_title("Ulysses attention: the fused layer against attention alone",
                     f"median times, same shape and ranks; {_ulysses_subtitle_shapes(df)}"))
    return fig


def _ulysses_shape_labels(t: pd.DataFrame, sep: str = " · ") -> list[str]:
    """Shape labels: 'S = 16K · 24×128' (sweep) or 'flux1_4608 · S = 4,608 · 24×128' (DiT), with the rank count
    when it varies; ``sep`` joins the parts (``<br>`` for two-line panel titles puts the DiT name on its own)."""
    many_p = t.P.nunique() > 1
    out = []
    for name, S, H, D, P in zip(t["shape"], t.S, t.H, t.D, t.P):
        tail = f"S = {_seq_label(S)} · {H}×{D}" + (f" · P={P}" if many_p else "")
        out.append(tail if ulysses_family(name) == "sequence sweep" else f"{name}{sep}{tail}")
    return out


def _ulysses_order(t: pd.DataFrame) -> pd.DataFrame:
    """Shapes in reading order: per rank count, the DiT table, then the sequence sweep, each by S."""
    return (t.assign(_seq=t.family == "sequence sweep").sort_values(["P", "_seq", "S", "H", "D"])
            .drop(columns="_seq").reset_index(drop=True))


def ulysses_tflops(df: pd.DataFrame, goal: float | None = None) -> go.Figure:
    """Left: our attention's and cuDNN SDPA's TFLOP/s per shape (attention FLOPs per rank ÷ median time, no
    communication); right: their ratio, with the goal ``goal`` (default
    xstage.studies.ATTENTION_OVER_CUDNN_GOAL, 0.9). Horizontal bars, one row per shape (any number of shapes).
    Traces: 2 bar traces + the ratio bars."""
    goal = ATTENTION_OVER_CUDNN_GOAL if goal is None else goal
    r = _ulysses_order(ulysses_ratios(df))
    labels = _ulysses_shape_labels(r)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.6, 0.4], horizontal_spacing=0.04, shared_yaxes=True,
                        subplot_titles=["TFLOP/s per GPU", "our attention ÷ cuDNN SDPA"])
    for key, col in (("attention_only", "attention_tflops"), ("sdpa_only", "sdpa_tflops")):
        name, color, _ = _ULYSSES_STYLE[key]
        fig.add_trace(go.Bar(y=labels, x=r[col], orientation="h", name=name.split(" (")[0], marker_color=color,
                             text=[f"{v:.0f}" for v in r[col]], textposition="outside", textfont=dict(size=11),
                             hovertemplate="%{y}<br>%{x:.0f} TFLOP/s<extra>" + name + "</extra>"), row=1, col=1)
    fig.add_trace(go.Bar(y=labels, x=r.attention_over_sdpa, orientation="h", name="ours ÷ cuDNN", showlegend=False,
                         marker_color="#9467bd", text=[f"{v:.2f}×" for v in r.attention_over_sdpa],
                         textposition="inside", insidetextanchor="end", textfont=dict(size=11, color="white"),
                         hovertemplate="%{y}<br>ours ÷ cuDNN = %{x:.3f}×<extra></extra>"), row=1, col=2)
    fig.update_annotations(yshift=16)          # the subplot titles, above the reference lines' labels
    for x, text, color, dash in ((goal, f"goal {goal:g}×", "#444", "dot"), (1.0, "= cuDNN", "#17becf", "solid")):
        fig.add_vline(x=x, line=dict(color=color, dash=dash, width=1.4), row=1, col=2)
        fig.add_annotation(x=x, xref="x2", y=1.0, yref="y2 domain", yanchor="bottom", text=text, showarrow=False,
                           font=dict(size=11, color=color), xanchor="right" if x < 1 else "left")
    top = np.nanmax(np.r_[r.attention_tflops, r.sdpa_tflops])
    fig.update_xaxes(title_text="TFLOP/s (attention FLOPs per rank ÷ median time)", range=[0, top * 1.15], row=1,
                     col=1)
    fig.update_xaxes(title_text="ratio (×)", range=[0, max(1.25, np.nanmax(r.attention_over_sdpa) * 1.15)], row=1,
                     col=2)
    fig.update_yaxes(autorange="reversed", ticksuffix="  ", row=1, col=1)
    height = max(HEIGHT - 60, 250 + 44 * len(r))
    fig.update_layout(**_LAYOUT)
    fig.update_layout(barmode="group", height=height, margin=dict(l=220, t=130, b=110),
                      legend=dict(orientation="h", yanchor="top", y=-70 / (height - 240), x=0),
                      title=_title("Our FlashAttention forward against cuDNN SDPA",
                                   "bf16, non-causal, one rank's heads over the full sequence; median over repeats"
                                   + (f"; {df.attrs['world']}" if df.attrs.get("world") else "")))
    return fig


def ulysses_fa(df: pd.DataFrame) -> go.Figure:
    """One record with FA4's methods (``xstage.studies.ulysses_fa_data``): left, TFLOP/s per shape of our
    attention, cuDNN SDPA and FA4 alone, timed in the same rounds; right, the fused FA layer over FA alone
    (sender-visible: events around the kernel; end to end: up to the barrier's end) and FA then the all-to-all over
    FA alone. The title names the world and link (``df.attrs["world"]``). Traces: 3 bar traces + 3 ratio traces."""
    from .studies import ulysses_fa_table

    t = _ulysses_order(ulysses_fa_table(df))
    labels = _ulysses_shape_labels(t)
    kern = bool(t.fa_kernel.notna().any())   # FA's kernel launched as the fused one is: the ratios divide by it
    fig = make_subplots(rows=1, cols=2, column_widths=[0.55, 0.45], horizontal_spacing=0.04, shared_yaxes=True,
                        subplot_titles=["TFLOP/s per GPU (no communication)",
                                        "time ÷ FA4's kernel alone" if kern else "time ÷ FA4 alone"])
    bars = [("ours", "ours (Triton)", "#9467bd"), ("cudnn", "cuDNN SDPA", "#17becf"),
            ("fa", "FA4 (CuTe DSL, Hopper) via flash_attn_func", "#ff7f0e")]
    if kern:
        bars.append(("fa_kernel", "FA4's kernel, launched directly", "#8c564b"))
    for col, name, color in bars:
        if t[col].isna().all():
            continue
        fig.add_trace(go.Bar(y=labels, x=t[col], orientation="h", name=name, marker_color=color,
                             text=[f"{v:.0f}" for v in t[col]], textposition="outside", textfont=dict(size=11),
                             hovertemplate="%{y}<br>%{x:.0f} TFLOP/s<extra>" + name + "</extra>"), row=1, col=1)
    k = "_k" if kern else ""
    for col, name, color in ((f"fa_fused_sv{k}", "FA fused, sender-visible", "#d62728"),
                             (f"fa_fused_e2e{k}", "FA fused, end to end", "#ff9896"),
                             ("fa_serial", "FA, then the all-to-all (÷ FA4 via flash_attn_func)", "#7f7f7f")):
        fig.add_trace(go.Bar(y=labels, x=t[col], orientation="h", name=name, marker_color=color,
                             text=[f"{v:.2f}×" for v in t[col]], textposition="outside", textfont=dict(size=11),
                             hovertemplate="%{y}<br>%{x:.3f}×<extra>" + name + "</extra>"), row=1, col=2)
    fig.add_vline(x=1.0, line=dict(color="#ff7f0e", width=1.4), row=1, col=2)
    top = np.nanmax(np.r_[t.ours, t.cudnn, t.fa, t.fa_kernel])
    fig.update_xaxes(title_text="TFLOP/s (attention FLOPs per rank ÷ median time)", range=[0, top * 1.18], row=1,
                     col=1)
    hi = np.nanmax(np.r_[t[f"fa_fused_sv{k}"], t[f"fa_fused_e2e{k}"], t.fa_serial, [1.0]])
    fig.update_xaxes(title_text="ratio (×)", range=[0, hi * 1.2], row=1, col=2)
    fig.update_yaxes(autorange="reversed", ticksuffix="  ", row=1, col=1)
    height = max(HEIGHT - 60, 260 + 66 * len(t))
    fig.update_layout(**_LAYOUT)
    fig.update_layout(barmode="group", height=height, margin=dict(l=220, t=130, b=110),
                      legend=dict(orientation="h", yanchor="top", y=-70 / (height - 240), x=0),
                      title=_title("FA-class attention (FA4) beside cuDNN" + (" and ours" if t.ours.notna().any() else "")
                                   + "; the all-to-all fused into FA4",
                                   "bf16, non-causal; medians over repeats, every method round-robin in the same run"
                                   + (f"; {df.attrs['world']}" if df.attrs.get("world") else "")))
    return fig


def ulysses_times(df: pd.DataFrame, cols: int = 4) -> go.Figure:
    """Median time per method, one panel per shape (its own linear y axis from 0, so bars compare within a
    shape; the fused layer twice: sender-visible and end to end), interquartile bars over repeats; panels in
    rows of ``cols``. Traces: one bar trace per (shape, method present) (+1 per shape for fused end to end)."""
    med = ulysses_medians(df)
    keys = ["shape", "S", "H", "D", "P"]
    order = _ulysses_order(med.drop_duplicates(keys)[keys + ["family"]])
    labels = _ulysses_shape_labels(order, sep="<br>")
    n = len(order)
    ncol = max(1, min(cols, n))
    nrow = -(-n // ncol)
    row_px, gap_px = 230, 75                    # plot height of a row of panels, room for two-line titles
    plot_px = nrow * row_px + (nrow - 1) * gap_px
    fig = make_subplots(rows=nrow, cols=ncol, horizontal_spacing=0.05 if ncol > 2 else 0.08,
                        vertical_spacing=gap_px / plot_px if nrow > 1 else 0.0, subplot_titles=labels)
    fig.update_annotations(font=dict(size=12))
    bars = [("fused_sv", "fused", "sv"), ("fused_e2e", "fused", "e2e")] + [
        (m, m, "e2e") for m in ("serial_triton", "serial_cudnn", "overlapped", "attention_only", "sdpa_only")]
    bars = [b for b in bars if b[1] in set(med.method)]
    few = n * len(bars) <= 28
    for i, key_vals in enumerate(order[keys].itertuples(index=False)):
        r, c = i // ncol + 1, i % ncol + 1
        s = med[(med[keys] == pd.Series(key_vals._asdict())).all(axis=1)].set_index("method")
        for j, (key, method, t) in enumerate(bars):
            if method not in s.index:
                continue
            name, color, dash = _ULYSSES_STYLE[key]
            v = s.loc[method]
            fig.add_trace(go.Bar(
                x=[j], y=[v[f"{t}_median"]], name=name, legendgroup=key, showlegend=(i == 0), marker_color=color,
                marker_pattern_shape="/" if dash == "dash" else "", width=0.8,
                text=[f"{v[f'{t}_median']:.3g}"] if few else None, textposition="outside", textfont=dict(size=10),
                error_y=dict(type="data", symmetric=False, array=[v[f"{t}_q75"] - v[f"{t}_median"]],
                             arrayminus=[v[f"{t}_median"] - v[f"{t}_q25"]], thickness=1, width=2),
                hovertemplate=f"{key_vals.shape}<br>%{{y:.3f}} ms<extra>{name}</extra>"), row=r, col=c)
        top = float(np.nanmax(s[["sv_q75", "e2e_q75"]].to_numpy()))
        fig.update_yaxes(range=[0, top * (1.15 if few else 1.05)], row=r, col=c)
    fig.update_xaxes(showticklabels=False, range=[-0.6, len(bars) - 0.4])
    for r in range(1, nrow + 1):
        fig.update_yaxes(title_text="median time (ms)", row=r, col=1)
    fig.update_layout(**_LAYOUT)
    fig.update_layout(
        height=plot_px + 140 + 150, margin=dict(t=140, b=150),
        legend=dict(orientation="h", yanchor="top", y=-12 / plot_px, x=0),
        title=_title("Ulysses attention: time per layer by method",
                     (f"{df.attrs['world']}; " if df.attrs.get("world") else "")
                     + "median over repeats, max over ranks (bars: interquartile range); a baseline's time is end "
                     "to end; each panel has its own scale"))
    return fig


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


# ------------------------------------------------------------------------------ study 4: the attention ladder
def attention_ladder(table: pd.DataFrame, world: str = "one GPU (H200), no communication",
                     against: str = "cudnn") -> go.Figure:
    """Our attention's TFLOP/s over cuDNN SDPA's (``against`` "cudnn") or FA4's CuTe Hopper forward's ("fa"),
    timed round-robin in the same rounds, per launch variant (:func:`xstage.studies.attention_ladder_table`), one
    bar group per shape, horizontal; dotted: the issue's goal (xstage.studies.ATTENTION_LADDER_GOAL, of the
    FA-class kernel; against cuDNN, cuDNN stands in); solid: = the other kernel. Variants that failed before
    timing have no bar. Traces: one bar trace per shape."""
    from .studies import ATTENTION_LADDER_GOAL

    if against not in ("cudnn", "fa"):
        raise ValueError(f"against must be 'cudnn' or 'fa', got {against!r}")
    col, who = ("ours_over_cudnn", "cuDNN SDPA") if against == "cudnn" else ("ours_over_fa", "FA4 (CuTe Hopper)")
    t = table.dropna(subset=[col])
    fig = go.Figure()
    shapes = list(dict.fromkeys(t["shape"]))
    colors = sample_colorscale("Viridis", [i / max(1, len(shapes) - 1) * 0.85 for i in range(len(shapes))])
    for shape, color in zip(shapes, colors):
        g = t[t["shape"] == shape]
        label = f"{shape}: {int(g.S.iloc[0]):,} × {int(g.H.iloc[0])} × {int(g.D.iloc[0])}"
        fig.add_trace(go.Bar(y=[f"D={int(d)} · {v}" for d, v in zip(g.D, g.variant)], x=g[col],
                             orientation="h", name=label, marker_color=color,
                             text=[f"{r:.2f}× ({o:.0f} TF/s)" for r, o in zip(g[col], g.ours_tflops)],
                             textposition="outside", textfont=dict(size=10),
                             hovertemplate="%{y}<br>ours ÷ " + who + " = %{x:.3f}×<extra>" + label + "</extra>"))
    for x, text, color, dash in ((ATTENTION_LADDER_GOAL, f"goal {ATTENTION_LADDER_GOAL:g}×", "#444", "dot"),
                                 (1.0, "= " + who.split(" (")[0], "#17becf", "solid")):
        fig.add_vline(x=x, line=dict(color=color, dash=dash, width=1.4))
        fig.add_annotation(x=x, y=1.0, yref="paper", yanchor="bottom", text=text, showarrow=False,
                           font=dict(size=11, color=color), xanchor="right" if x < 1 else "left")
    n = len(set(zip(t.D, t.variant)))
    height = max(HEIGHT, 200 + 22 * len(t))
    fig.update_layout(**_LAYOUT)
    fig.update_layout(barmode="group", height=height, margin=dict(l=260, t=120, b=80),
                      xaxis=dict(title=f"our TFLOP/s ÷ {who}'s (same rounds)", range=[0, 1.3]),
                      yaxis=dict(autorange="reversed"), legend=dict(orientation="h", y=-0.08, x=0),
                      title=_title(f"The attention speed ladder: {n} launch variants of our kernel",
                                   f"bf16, non-causal, medians; {world}"))
    return fig


def attention_vs_fa4(summary: pd.DataFrame, world: str = "one GPU (H200), no communication") -> go.Figure:
    """Per shape (:func:`xstage.studies.attention_vs_fa4_summary`): our attention's TFLOP/s over FA4's CuTe Hopper
    forward's, same rounds, for the base rung and the fastest variant on that shape (bars, labelled with the
    variant and TFLOP/s); dotted: the goal (xstage.studies.ATTENTION_LADDER_GOAL); solid: = FA4. Shapes below
    S = 8K (where the goal does not apply) are marked so. Traces: base, fastest."""
    from .studies import ATTENTION_LADDER_GOAL

    x = [f"{sh}<br>{S:,}×{H}×{D}" + ("" if ok else " (S < 8K)")
         for sh, S, H, D, ok in zip(summary["shape"], summary.S, summary.H, summary.D, summary.goal_applies)]
    fig = go.Figure()
    for key, name, color in (("base", "base rung", "#9aa5b1"), ("best", "fastest variant", "#1f77b4")):
        fig.add_trace(go.Bar(x=x, y=summary[f"{key}_over_fa"], name=name, marker_color=color,
                             text=[f"{r:.2f}×<br>{v}<br>{o:.0f} TF/s" for r, v, o in
                                   zip(summary[f"{key}_over_fa"], summary[f"{key}_variant"], summary[f"{key}_tflops"])],
                             textposition="outside", textfont=dict(size=9),
                             hovertemplate="%{x}<br>ours ÷ FA4 = %{y:.3f}×<extra>" + name + "</extra>"))
    for y, text, color, dash in ((ATTENTION_LADDER_GOAL, f"goal {ATTENTION_LADDER_GOAL:g}×", "#444", "dot"),
                                 (1.0, "= FA4", "#17becf", "solid")):
        fig.add_hline(y=y, line=dict(color=color, dash=dash, width=1.4), annotation_text=text,
                      annotation_position="top left", annotation_font=dict(size=11, color=color))
    fig.update_layout(**_LAYOUT)
    fig.update_layout(barmode="group", height=HEIGHT + 120, margin=dict(t=120, b=120),
                      yaxis=dict(title="our TFLOP/s ÷ FA4's (same rounds)", range=[0, 1.25]),
                      legend=dict(orientation="h", y=-0.25, x=0),
                      title=_title("Our Triton attention beside FA4's CuTe Hopper forward, per shape [S, H, D]",
                                   f"bf16, non-causal, medians timed round-robin in one run; {world}"))
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
