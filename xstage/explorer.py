"""The Burst-Gap model explorer (notebook 00): sliders over the model's parameters and a burst/gap workload;
the plotly figure (xstage.burst_gap_figures.model_explorer_figure) updates in place.

    from xstage.explorer import explorer
    explorer()                       # reference parameters
    explorer(fitted_params, programs=264, burst_kib=8)

Every slider has a ``description`` and a CSS class ``xstage-slider-<name>`` (``<name>`` as in
:data:`SLIDERS`), the figure ``xstage-explorer-figure``, the summary line ``xstage-explorer-summary`` and the
whole box ``xstage-explorer``, so a browser test can find them.
"""
from __future__ import annotations

import ipywidgets as W
import plotly.graph_objects as go

from .burst_gap_figures import explorer_data, explorer_title, model_explorer_figure
from .stage_figures import train_prediction_data, train_prediction_figure
from .fluid import BurstGapParams

# name -> (widget class, keyword arguments); values are set from the parameters / workload at build time
SLIDERS = {
    # model parameters
    "issue_ns_per_kib": (W.FloatLogSlider, dict(base=10, min=-1, max=3, step=0.0005, description="issue ns/KiB/prog",
                                                readout_format=".3g")),
    "drain_gbps": (W.FloatLogSlider, dict(base=10, min=1, max=4, step=0.0005, description="drain GB/s",
                                          readout_format=".4g")),
    "capacity_kib": (W.FloatLogSlider, dict(base=2, min=3, max=16, step=0.001, description="capacity KiB",
                                            readout_format=".4g")),
    "overhead_ns": (W.FloatSlider, dict(min=0, max=2000, step=5, description="overhead ns", readout_format=".0f")),
    # workload
    "programs": (W.IntSlider, dict(min=1, max=528, step=1, description="programs")),
    "burst_kib": (W.FloatLogSlider, dict(base=2, min=0, max=12, step=0.25, description="burst KiB/prog",
                                         readout_format=".4g")),
    "gap_us": (W.FloatSlider, dict(min=0, max=100, step=0.25, description="gap µs", readout_format=".2f")),
    "n_bursts": (W.IntSlider, dict(min=1, max=32, step=1, description="bursts")),
}
PARAMS = ("issue_ns_per_kib", "drain_gbps", "capacity_kib", "overhead_ns")
WORKLOAD = ("programs", "burst_kib", "gap_us", "n_bursts")


class Explorer(W.VBox):
    """The explorer box. ``sliders`` (name -> widget), ``figure`` (the FigureWidget), ``summary`` (HTML)."""

    def __init__(self, prm: BurstGapParams, programs: int, burst_kib: float, gap_us: float, n_bursts: int):
        values = {**prm.as_dict(), "programs": programs, "burst_kib": burst_kib, "gap_us": gap_us,
                  "n_bursts": n_bursts}
        style, layout = {"description_width": "130px"}, W.Layout(width="440px")
        self.sliders = {}
        for name, (cls, kw) in SLIDERS.items():
            w = cls(value=_clip(float(values[name]), cls, kw), continuous_update=True, style=style, layout=layout, **kw)
            w.add_class(f"xstage-slider-{name}")
            self.sliders[name] = w
        self.figure = go.FigureWidget(model_explorer_figure(prm, programs, burst_kib, gap_us, n_bursts))
        self.figure.add_class("xstage-explorer-figure")
        self.summary = W.HTML()
        self.summary.add_class("xstage-explorer-summary")
        controls = W.HBox([
            W.VBox([W.HTML("<b>model</b>")] + [self.sliders[n] for n in PARAMS]),
            W.VBox([W.HTML("<b>workload</b>")] + [self.sliders[n] for n in WORKLOAD])])
        super().__init__([controls, self.summary, self.figure])
        self.add_class("xstage-explorer")
        for w in self.sliders.values():
            w.observe(self.update, names="value")
        self.update()

    @property
    def params(self) -> BurstGapParams:
        return BurstGapParams(*(self.sliders[n].value for n in PARAMS))

    def workload(self) -> dict:
        return {n: self.sliders[n].value for n in WORKLOAD}

    def update(self, change=None) -> None:
        """Recompute the model for the sliders' values and update the figure's traces in place."""
        prm, wl = self.params, self.workload()
        d = explorer_data(prm, **wl)
        bars, free, q, cap = self.figure.data
        with self.figure.batch_update():
            bars.x, bars.y = d["burst"], d["T_us"]
            free.x, free.y = d["burst"], d["free_us"]
            q.x, q.y = d["t_us"], d["q_kib"]
            cap.x, cap.y = [0, d["t_us"][-1]], [d["capacity_kib"]] * 2
            self.figure.layout.title.text = (f"{explorer_title(prm, **wl)}<br><sup>{d['text']}</sup>")
        self.summary.value = f"<p style='max-width:900px'>{d['long_text']}</p>"


def _clip(v: float, cls, kw: dict) -> float:
    """Keep a starting value inside the slider's range (a log slider's min/max are exponents)."""
    if cls is W.FloatLogSlider:
        lo, hi = kw["base"] ** kw["min"], kw["base"] ** kw["max"]
    else:
        lo, hi = kw["min"], kw["max"]
    return min(max(v, lo), hi)


def explorer(prm: BurstGapParams | None = None, programs: int = 132, burst_kib: float = 32.0, gap_us: float = 1.0,
             n_bursts: int = 8) -> Explorer:
    """Sliders + live figure. ``prm`` defaults to :meth:`BurstGapParams.reference`; notebook 00 passes the
    parameters fitted to recorded data (xstage.sources.default_params)."""
    return Explorer(prm or BurstGapParams.reference(), programs, burst_kib, gap_us, n_bursts)


def _numbers(text: str) -> list[float]:
    vals = [float(x) for x in text.replace(" ", "").split(",") if x]
    if not vals or any(v < 0 for v in vals):
        raise ValueError("a comma-separated list of numbers >= 0")
    return vals


class TrainExplorer(W.VBox):
    """The stage model on an editable train: a link selector (its fitted parameters), the program count, the
    burst sizes (KiB per program) and the gaps after them (us) as editable lists. CSS classes
    ``xstage-train-<link|programs|bursts|gaps|figure|summary>``."""

    def __init__(self, params_by_link: dict, link: str, programs: int, burst_kib, gap_us):
        if link not in params_by_link:
            raise ValueError(f"link must be one of {', '.join(params_by_link)}, got {link!r}")
        self.params_by_link = params_by_link
        self.link = W.Dropdown(options=list(params_by_link), value=link, description="link")
        self.programs = W.IntSlider(value=programs, min=1, max=528, description="programs")
        self.bursts = W.Text(value=", ".join(f"{x:g}" for x in burst_kib), description="KiB/burst",
                             layout=W.Layout(width="600px"))
        self.gaps = W.Text(value=", ".join(f"{x:g}" for x in gap_us), description="gap after (µs)",
                           layout=W.Layout(width="600px"))
        self.summary = W.HTML()
        self.figure = go.FigureWidget(train_prediction_figure(params_by_link[link], programs, burst_kib, gap_us, link))
        for name, w in (("link", self.link), ("programs", self.programs), ("bursts", self.bursts),
                        ("gaps", self.gaps), ("figure", self.figure), ("summary", self.summary)):
            w.add_class(f"xstage-train-{name}")
        super().__init__([W.HBox([self.link, self.programs]), self.bursts, self.gaps, self.summary, self.figure])
        for w in (self.link, self.programs, self.bursts, self.gaps):
            w.observe(self.update, names="value")
        self.update()

    def update(self, change=None) -> None:
        try:
            b, g = _numbers(self.bursts.value), _numbers(self.gaps.value)
            if len(b) != len(g):
                raise ValueError(f"as many gaps as bursts ({len(b)} bursts, {len(g)} gaps)")
            d = train_prediction_data(self.params_by_link[self.link.value], self.programs.value, b, g)
        except ValueError as e:
            self.summary.value = f"<p style='color:#b00'>not updated: {e}</p>"
            return
        free, sync, alone = self.figure.data
        with self.figure.batch_update():
            free.x, free.y = d["burst"], d["free_us"]
            sync.x, sync.y = d["burst"], d["sync_us"]
            alone.x, alone.y = d["burst"], d["alone_us"]
        self.summary.value = (f"<p>{self.link.value}: free-running total {d['free_us'].sum():.3g} us of issue per "
                              f"program (median), {d['sync_us'].sum():.3g} us of spans with a grid barrier</p>")


def train_explorer(params_by_link: dict, link: str = "host", programs: int = 132, burst_kib=(64, 8, 320, 16),
                   gap_us=(10, 0, 50, 0)) -> TrainExplorer:
    """Link selector + editable train + live figure (notebook 00); ``params_by_link``: link -> StageParams."""
    return TrainExplorer(params_by_link, link, programs, list(burst_kib), list(gap_us))
