"""The MegaMoE study's figures (notebook 03): each schedule's kernel speedup over Expert-Wave per configuration,
the model's predicted speedup against the measured one, the order cost against the combine's drain time, the fused
layer over the unfused baseline and the GEMM phases against torch._grouped_mm. Each reads rows of a record
(schema ``megamoe``) through xstage.megamoe_analysis; every title names the card, world and link.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .figures import _LAYOUT, HEIGHT, WIDTH, _intersect, _log_axis, _title, empty_figure
from .megamoe_analysis import (BASELINE, FUSED_OVER_UNFUSED_GOAL, GEMM_OVER_GROUPED_MM_GOAL, MODEL_TOLERANCE,
                               speedups)
from .moe_plan import DTYPES_GPU, ROUTINGS, SCHEDULES, SHAPES, TOKENS_PER_RANK
from .numeric import geomean
from .sources import paper_number


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
    """x per row of :func:`xstage.megamoe_analysis.speedups`, the x-axis layout (ticks at the token slots, the
    shape's name under its middle slot) and the separators between shape groups."""
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
    fig.update_layout(height=plot_px + 305, width=max(WIDTH, 560 * n_c), margin=dict(t=165, b=130),
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


def speedup_figure(df: pd.DataFrame, schedules=None, paper: dict[str, float] | None = None,
                    where: str | None = None) -> go.Figure:
    """Kernel speedup of each schedule over Expert-Wave (:func:`xstage.megamoe_analysis.speedups`) for every
    configuration: one panel per (schedule, dtype), x = shape groups x tokens per rank, colour = routing;
    each panel's geomean (dashed, and in its corner with the maximum) and 1 = Expert-Wave.

    schedules: the rows (default: every schedule but expert_wave in the data).
    paper:     reference lines {label: speedup}, dotted; None = the paper's 1.18x geomean and 1.62x maximum
               (data/paper/headline.csv); {} = none.
    where:     the record's world and link for the title (:func:`xstage.megamoe_analysis.world_label`).
    Traces: one per (panel, routing present)."""
    if paper is None:
        paper = {"paper geomean": paper_number("megamoe", "geomean_speedup"),
                 "paper max": paper_number("megamoe", "max_speedup")}
    sp = speedups(df)
    have = [s for s in _ordered(sp.schedule, SCHEDULES) if s != BASELINE]
    schedules = _intersect(have if schedules is None else [s for s in schedules if s != BASELINE],
                           have, "schedules")
    sp = sp[sp.schedule.isin(schedules)]
    detail = lambda h: [f"kernel {k:.3f} ms vs Expert-Wave {e:.3f} ms; model {p:.2f}×"  # noqa: E731
                        for k, e, p in zip(h.kernel_ms, h.expert_wave_ms, h.predicted_speedup)]
    fig, dtypes = _megamoe_strip(sp, "speedup", schedules, "speedup over Expert-Wave", detail)
    _speedup_panels(fig, sp, "speedup", schedules, dtypes, "= Expert-Wave",
                    [(y, f"{label} {y:.2f}×", dict(color=_PAPER_COLOR, dash="dot")) for label, y in paper.items()])
    paper_text = " and ".join(f"{k.removeprefix('paper ')} {v:.2f}×" for k, v in paper.items())
    fig.update_layout(title=_title(
        "MegaMoE: kernel speedup of each schedule over Expert-Wave, per configuration",
        (f"<b>{where.replace('; ', '</b><br>')}<br>" if where else "")
        + "Expert-Wave kernel time ÷ the schedule's (median over repeats, max over ranks); colour: routing<br>"
        "dashed: the panel's geomean" + (f"; dotted: the paper's {paper_text} (8 GPUs)" if paper else "")))
    fig.update_layout(title=dict(yref="container", y=0.985, yanchor="top", pad=dict(t=8)))   # the subtitle's lines above the panels
    return fig


def model_parity_figure(df: pd.DataFrame, schedules=None, tolerance: float | None = None,
                         title: str | None = None) -> go.Figure:
    """The Burst-Gap model's predicted speedup over Expert-Wave against the measured one, every configuration,
    colour = schedule, symbol = dtype; y = x and a ±``tolerance`` band (default
    xstage.megamoe_analysis.MODEL_TOLERANCE, 10 %: |predicted − measured| ≤ tolerance × measured); the fraction inside
    per schedule and dtype in the legend; ``title`` replaces the main title (e.g. for a revised model's
    predictions put in ``predicted_speedup``). Traces: the band (2), y = x, then one per (schedule, dtype)."""
    tol = MODEL_TOLERANCE if tolerance is None else tolerance
    sp = speedups(df)
    have = [s for s in _ordered(sp.schedule, SCHEDULES) if s != BASELINE]
    schedules = _intersect(have if schedules is None else [s for s in schedules if s != BASELINE],
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
    lines = (title or "").count("<br>")                    # a title of several lines: room above the plot
    if lines > 1:
        fig.update_layout(margin=dict(t=_LAYOUT["margin"]["t"] + 26 * (lines - 1)), height=HEIGHT + 120 + 26 * lines)
    return fig


def order_cost_figure(cost: pd.DataFrame) -> go.Figure:
    """Each compared schedule's kernel time minus Expert-Wave's (y, ms) against the time the X-Stage needs to drain
    that configuration's whole remote combine (x, ms, log), from :func:`xstage.megamoe_model_analysis.order_cost`. The
    grey wedge |y| <= x is what burst shaping could explain at most; points outside it differ for another reason.
    Columns: dtypes; colour: schedule. Traces: per dtype the wedge (2) + one per schedule."""
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


def _speedup_panels(fig: go.Figure, sp: pd.DataFrame, col: str, schedules, dtypes, unity: str, refs,
                    stats=None) -> None:
    """Each (schedule, dtype) panel of a speedup strip: the line at 1 (``unity``), the reference lines ``refs``
    [(y, label, style)] (labelled in the last column), the panel's geomean dashed and its statistics in the corner;
    the y range over the data and every line, each row's y title."""
    n_c = len(dtypes)
    for r, s in enumerate(schedules, 1):
        for c, d in enumerate(dtypes, 1):
            v = sp[(sp.schedule == s) & (sp.dtype == d)][col].dropna()
            _grid_line(fig, 1.0, unity if c == n_c else None, r, c, n_c, color="#555", dash="solid", above=False)
            for y, label, style in refs:
                _grid_line(fig, y, label if c == n_c else None, r, c, n_c, **style)
            if len(v):
                _grid_line(fig, geomean(v), None, r, c, n_c, color="#222", dash="dash")
            _panel_note(fig, _stats_text(v, stats) if stats else _stats_text(v), r, c, n_c)
    fig.update_yaxes(range=_strip_yrange(sp[col], [y for y, _, _ in refs] + [1.0]))
    for r in range(1, len(schedules) + 1):
        fig.update_yaxes(title_text="speedup (×)", row=r, col=1)


def fused_figure(df: pd.DataFrame, schedules=None, goal: float | None = None) -> go.Figure:
    """The fused layer's speedup over the unfused baseline (NCCL all_to_all + torch._grouped_mm layer):
    unfused_ms / layer_ms per configuration, one panel per (schedule, dtype) as :func:`megamoe_speedup`; the
    goal ``goal`` (default xstage.megamoe_analysis.FUSED_OVER_UNFUSED_GOAL, 1.3× geomean) dotted, each panel's geomean
    dashed and in its corner with the minimum. schedules: default every schedule in the data (Expert-Wave
    too: the fused layer with the baseline schedule). Traces: one per (panel, routing present)."""
    goal = FUSED_OVER_UNFUSED_GOAL if goal is None else goal
    sp = speedups(df)
    have = _ordered(sp.schedule, SCHEDULES)
    schedules = _intersect(have if schedules is None else list(schedules), have, "schedules")
    sp = sp[sp.schedule.isin(schedules)]
    detail = lambda h: [f"layer {a:.3f} ms vs unfused {b:.3f} ms" for a, b in zip(h.layer_ms, h.unfused_ms)]  # noqa: E731
    fig, dtypes = _megamoe_strip(sp, "fused_speedup", schedules, "unfused ÷ fused", detail)
    _speedup_panels(fig, sp, "fused_speedup", schedules, dtypes, "= unfused",
                    [(goal, f"goal: geomean ≥ {goal:g}×", {})], stats=("geomean", "min"))
    fig.update_layout(title=_title(
        "MegaMoE: the fused layer against the unfused baseline, per configuration",
        "unfused (NCCL all_to_all, torch._grouped_mm experts, all_to_all back) ÷ fused layer (dispatch, kernel,"
        "<br>barriers, top-k sum); medians over repeats, max over ranks; colour: routing; dashed: the panel's "
        "geomean"))
    return fig


def gemm_figure(df: pd.DataFrame, goal: float | None = None) -> go.Figure:
    """GEMM phases: our kernel with every combine store local (compute only, the Expert-Wave schedule) against
    torch._grouped_mm (Linear-1, SwiGLU, Linear-2 on the same rows, bf16 weights), per configuration. Top row:
    TFLOP/s of each (GEMM FLOPs of the busiest rank's rows ÷ time); bottom row: ours ÷ torch._grouped_mm
    (= grouped_mm_ms / compute_ms) with the goal ``goal`` (default xstage.megamoe_analysis.GEMM_OVER_GROUPED_MM_GOAL,
    0.7). Columns: dtypes. Without grouped_mm_ms in the data (absent or all NaN) only the top row, ours alone,
    and the subtitle says so. Traces: per dtype 1-2 (top) + 1 (bottom, where it has ratios)."""
    goal = GEMM_OVER_GROUPED_MM_GOAL if goal is None else goal
    sp = speedups(df).drop_duplicates(["config", "P", "dtype"])   # compute-only times: one per config
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
