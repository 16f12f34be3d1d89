"""The stage model scored on the never-fitted traffic families (xstage.traffic_families; records of
``xstage sweep families``): per train and burst the measured median program and its spread over programs (p10,
p90) against the model's (xstage.model.load_params: the parameters of a calibration or of a card's full records).
Nothing here is fitted.

How a family meets the model, which knows one train shared by all programs that start together:
- width, warps: the train as is (the model has no store width or block size: the score says whether it needs one);
- staggered: the grid as if every program started together (the model has no start offsets);
- waves: the programs that start with the launch (its resident wave, counted in the record: burst 0 starting
  within 1 us of the first program) as the grid;
- per_program: every program the median program's sizes.
Scores: |predicted / measured - 1| over bursts whose measured median is >= 1 us, median and p90, by family and P.
"""
from __future__ import annotations

import sys

import numpy as np
import pandas as pd

from .data import BURST_PROGRAM, load
from .model import load_params
from .stage_params import StageParams
from .stage_sim import simulate_stage

MIN_NS = 1000.0
RESIDENT_NS = 1000.0   # a program whose first burst starts within this of the first program's was resident at launch


def family_of(name: str) -> str:
    """The family of a recorded train name (its tag before the seed: "width4-s0-00" -> "width")."""
    tag = name.split("-")[0].rstrip("0123456789")
    return {"perprog": "per_program"}.get(tag, tag)


def measured(pp: pd.DataFrame) -> pd.DataFrame:
    """Per (train, programs, burst): the median over runs of the programs' p10 / p50 / p90 issue time, the median
    program's size, the gap, and the programs resident at launch (``grid``)."""
    g = pp.groupby(["train", "programs", "rank", "repeat", "burst"])
    q = g.issue_ns.quantile([0.1, 0.5, 0.9]).unstack()
    q.columns = ["p10_ns", "p50_ns", "p90_ns"]
    q["burst_bytes"] = g.burst_bytes.median()
    q["gap_ns"] = g.gap_ns.first()
    first = pp[pp.burst == 0].groupby(["train", "programs", "rank", "repeat"]).start_ns
    grid = first.apply(lambda s: int((s - s.min() <= RESIDENT_NS).sum())).rename("grid")
    q = q.reset_index().merge(grid.reset_index(), on=["train", "programs", "rank", "repeat"])
    out = q.groupby(["train", "programs", "burst"], as_index=False).agg(
        p10_ns=("p10_ns", "median"), p50_ns=("p50_ns", "median"), p90_ns=("p90_ns", "median"),
        burst_bytes=("burst_bytes", "median"), gap_ns=("gap_ns", "first"), grid=("grid", "median"))
    out["family"] = out.train.map(family_of)
    return out


def predicted_spread(prm: StageParams, programs: int, burst_bytes, gap_ns) -> np.ndarray:
    """[3, n]: the model's p10 / p50 / p90 over programs of each burst's issue time (free-running, every program
    starting together), weighted by the programs each simulated group holds."""
    start, end, m = simulate_stage(prm, [int(programs)], np.asarray([burst_bytes], np.float64),
                                   np.asarray([gap_ns], np.float64), [False])
    x, w = (end - start)[0], m[0]
    out = np.full((3, x.shape[1]), np.nan)
    for k in range(x.shape[1]):
        ok = (w > 0) & np.isfinite(x[:, k])
        v, ww = x[ok, k], w[ok]
        o = np.argsort(v, kind="stable")
        c = (np.cumsum(ww[o]) - 0.5 * ww[o]) / ww.sum()
        out[:, k] = np.interp([0.1, 0.5, 0.9], c, v[o])
    return out


def score(pp: pd.DataFrame, prm: StageParams) -> pd.DataFrame:
    """Per (train, programs, burst): measured and predicted p10 / p50 / p90 over programs and the relative errors."""
    m = measured(pp)
    parts = []
    for (train, P), g in m.groupby(["train", "programs"], sort=False):
        g = g.sort_values("burst")
        fam = family_of(train)
        grid = int(g.grid.iloc[0]) if fam == "waves" else int(P)
        pred = predicted_spread(prm, max(grid, 1), g.burst_bytes.to_numpy(), g.gap_ns.to_numpy())
        g = g.assign(model_programs=grid, pred_p10_ns=pred[0], pred_p50_ns=pred[1], pred_p90_ns=pred[2])
        parts.append(g)
    out = pd.concat(parts, ignore_index=True)
    for q in ("p10", "p50", "p90"):
        out[f"{q}_rel_error"] = out[f"pred_{q}_ns"] / out[f"{q}_ns"] - 1
    return out


def summary(scored: pd.DataFrame, min_ns: float = MIN_NS) -> pd.DataFrame:
    """Median and p90 |relative error| of the median program (and of the programs' p10 / p90) over bursts whose
    measured median is >= ``min_ns``, by family and P, then every family and P together ("all")."""
    t = scored[scored.p50_ns >= min_ns]
    rows = []
    for key, g in [*t.groupby(["family", "programs"]), *((("all", "all"), t),)]:
        a = g.p50_rel_error.abs()
        rows.append(dict(family=key[0], programs=key[1], bursts=len(g), median_abs_error=a.median(),
                         p90_abs_error=a.quantile(0.9), signed_median=g.p50_rel_error.median(),
                         p10_median_abs_error=g.p10_rel_error.abs().median(),
                         p90_median_abs_error=g.p90_rel_error.abs().median()))
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    """``python -m xstage.families_analysis FAMILIES_DIR PARAMS_DIR [LINK]``: the summary of the model whose fit
    PARAMS_DIR holds (e.g. a calibration folder) on the families recorded in FAMILIES_DIR."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3):
        print("usage: python -m xstage.families_analysis FAMILIES_DIR PARAMS_DIR [LINK]", file=sys.stderr)
        return 2
    pp, _ = load(args[0], BURST_PROGRAM)
    prm = load_params(args[1], args[2] if len(args) == 3 else "host")
    print(summary(score(pp, prm)).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
