"""Plotly figures of the Ulysses study (notebook 04): speedup over serial vs sequence length, the fused layer over
attention alone, TFLOP/s beside cuDNN, FA4's one-GPU records and every method's time. Data in (the ``ulysses``
schema, ``df.attrs["world"]`` naming the world and link), ``go.Figure`` out; the numbers come from
:mod:`xstage.ulysses_analysis`.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .figures import HEIGHT, _LAYOUT, _title, _trace_ys
from .sources import paper_number
from .ulysses_analysis import (ATTENTION_OVER_CUDNN_GOAL, FUSED_OVER_ATTENTION_GOAL, ulysses_fa_table, ulysses_family,
                               ulysses_medians, ulysses_ratios, ulysses_speedups)

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
    world and link from ``df.attrs["world"]``, set by :func:`xstage.ulysses_analysis.ulysses_data`)."""
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
    baseline (:func:`xstage.ulysses_analysis.ulysses_speedups`), one panel per rank count, log S axis.

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
    xstage.ulysses_analysis.FUSED_OVER_ATTENTION_GOAL, 1.05) as a dotted line. Traces: per ratio x panel x group, as
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
    xstage.ulysses_analysis.ATTENTION_OVER_CUDNN_GOAL, 0.9). Horizontal bars, one row per shape (any number of shapes).
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
    """One record with FA4's methods (``xstage.ulysses_analysis.ulysses_fa_data``): left, TFLOP/s per shape of our
    attention, cuDNN SDPA and FA4 alone, timed in the same rounds; right, the fused FA layer over FA alone
    (sender-visible: events around the kernel; end to end: up to the barrier's end) and FA then the all-to-all over
    FA alone. The title names the world and link (``df.attrs["world"]``). Traces: 3 bar traces + 3 ratio traces."""
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
