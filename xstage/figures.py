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


    return fig
