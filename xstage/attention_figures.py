"""Plotly figures of our attention beside FA4 and cuDNN SDPA (notebook 04): every launch variant's TFLOP/s ratio
and the per-shape fastest variant against the goal. Tables in (:mod:`xstage.attention_analysis`), ``go.Figure``
out.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.colors import sample_colorscale

from .attention_analysis import ATTENTION_LADDER_GOAL
from .figures import HEIGHT, _LAYOUT, _title

# ------------------------------------------------------------------------------ study 4: the attention ladder
def attention_ladder(table: pd.DataFrame, world: str = "one GPU (H200), no communication",
                     against: str = "cudnn") -> go.Figure:
    """Our attention's TFLOP/s over cuDNN SDPA's (``against`` "cudnn") or FA4's CuTe Hopper forward's ("fa"),
    timed round-robin in the same rounds, per launch variant (:func:`xstage.attention_analysis.attention_ladder_table`), one
    bar group per shape, horizontal; dotted: the issue's goal (xstage.attention_analysis.ATTENTION_LADDER_GOAL, of the
    FA-class kernel; against cuDNN, cuDNN stands in); solid: = the other kernel. Variants that failed before
    timing have no bar. Traces: one bar trace per shape."""
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
    """Per shape (:func:`xstage.attention_analysis.attention_vs_fa4_summary`): our attention's TFLOP/s over FA4's CuTe Hopper
    forward's, same rounds, for the base rung and the fastest variant on that shape (bars, labelled with the
    variant and TFLOP/s); dotted: the goal (xstage.attention_analysis.ATTENTION_LADDER_GOAL); solid: = FA4. Shapes below
    S = 8K (where the goal does not apply) are marked so. Traces: base, fastest."""
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
                      title=_title("Our attention beside FA4's CuTe Hopper forward, per shape [S, H, D]",
                                   f"bf16, non-causal, medians timed round-robin in one run; {world}"))
    return fig
