"""Programs that share an SM, read off per-program records (schema xstage.data.BURST_PROGRAM: every program's SM,
burst starts and issue times): how long a program's compute gap really lasts (:func:`gap_stretch`) and how many of
an SM's programs issue at once (:func:`issuing_at_once`). The stage model takes every gap as launched and lets
every resident program issue; these two say where a record does not. :func:`measured_gap_bound` gives the model the
gaps as measured (an upper bound on what modelling the stretch can gain, not a prediction).

Nothing here is fitted and nothing launches: it reads records only.
``python -m xstage.sm_sharing_analysis <record folder> [...] [--fit <folder with stage_fit_host.json.gz>]`` prints
the tables (and, with --fit, the bound at P = 264 per family of the record).
"""
from __future__ import annotations

import sys

import numpy as np
import pandas as pd

from .data import BURST_PROGRAM, load
from .families_analysis import family_of, measured
from .model import load_params, predict_train

MIN_GAP_NS = 5000.0     # gaps shorter than this are left out of the ratio (timer and loop overheads)
RUN = ["train", "programs", "rank", "repeat"]


def _with_sm_load(pp: pd.DataFrame) -> pd.DataFrame:
    """pp with ``per_sm``: how many of the run's programs ran on the program's SM (in turn where the grid ran in
    waves)."""
    n = pp[pp.burst == 0].groupby(RUN + ["smid"]).program.nunique().rename("per_sm")
    return pp.merge(n.reset_index(), on=RUN + ["smid"], how="left")


def _measured_gap(x: pd.DataFrame) -> pd.Series:
    """The gap after each burst as measured: the program's next burst's issue start minus this burst's issue end
    (NaN after its last burst); ``x`` sorted by run, program and burst."""
    return x.groupby(RUN + ["program"]).start_ns.shift(-1) - x.start_ns - x.issue_ns


def gap_stretch(pp: pd.DataFrame, min_gap_ns: float = MIN_GAP_NS) -> pd.DataFrame:
    """Per program count and programs per SM: the measured gap after each burst (the next burst's issue start minus
    this burst's issue end) over the gap it was launched with (``gap_ns``), over gaps >= ``min_gap_ns``: median,
    p10, p90 and how many. 1.00: the gap lasted as launched."""
    need = {"smid", "program", "burst", "start_ns", "issue_ns", "gap_ns"}
    if missing := need - set(pp.columns):
        raise ValueError(f"gap_stretch needs per-program records (schema burst_program); missing {sorted(missing)}")
    x = _with_sm_load(pp).sort_values(RUN + ["program", "burst"])
    x = x.assign(ratio=_measured_gap(x) / x.gap_ns)
    x = x[(x.gap_ns >= min_gap_ns) & x.ratio.notna()]
    g = x.groupby(["programs", "per_sm"]).ratio
    return pd.DataFrame({"gaps": g.size(), "median": g.median(), "p10": g.quantile(0.1),
                         "p90": g.quantile(0.9)}).reset_index()


def issuing_at_once(pp: pd.DataFrame, samples: int = 200) -> pd.DataFrame:
    """Per program count: the programs issuing at once (a program issues from its burst's start to its end),
    sampled at ``samples`` instants over each run, median over the instants where any issues: in all, per SM that
    has one issuing, and the most on one SM."""
    rows = []
    for key, r in pp.groupby(RUN):
        s, e, sm = r.start_ns.to_numpy(), (r.start_ns + r.issue_ns).to_numpy(), r.smid.to_numpy()
        for t in np.linspace(s.min(), e.max(), samples, endpoint=False):
            on = (s <= t) & (e > t)
            if on.any():
                c = np.bincount(sm[on])
                rows.append(dict(programs=key[1], total=int(on.sum()), per_busy_sm=float(c[c > 0].mean()),
                                 most_on_one_sm=int(c.max())))
    if not rows:
        raise ValueError("issuing_at_once: the record has no bursts with an issue time")
    d = pd.DataFrame(rows)
    return d.groupby("programs").median().reset_index()


def measured_gap_bound(pp: pd.DataFrame, prm, programs: int = 264, min_ns: float = 1000.0) -> dict:
    """Free-running trains of ``programs`` alike programs starting together (families with per-program delays or
    sizes are left to the caller): the model's median program per burst (xstage.model.predict_train) with the gaps
    as launched and with every burst's median measured gap, against the measured median program
    (xstage.families_analysis.measured), bursts >= ``min_ns``: median |error|, p90 and signed median of each, and the bursts scored."""
    x = pp[pp.programs == programs].sort_values(RUN + ["program", "burst"])
    if x.empty:
        raise ValueError(f"measured_gap_bound: the record has no trains of {programs} programs")
    median_gap = x.assign(mgap=_measured_gap(x)).groupby(["train", "burst"]).mgap.median()
    err = {"launched": [], "measured": []}
    for train, t in measured(x).groupby("train"):
        t = t.sort_values("burst")
        b, g, meas = t.burst_bytes.to_numpy(), t.gap_ns.to_numpy(), t.p50_ns.to_numpy()
        mg = median_gap.loc[train].reindex(t.burst).fillna(t.set_index("burst").gap_ns).to_numpy()
        ok = meas >= min_ns
        for name, gaps in (("launched", g), ("measured", mg)):
            err[name] += list(predict_train(prm, programs, b, gaps)[ok] / meas[ok] - 1)
    out = {"bursts": len(err["launched"])}
    for name, e in err.items():
        e = np.asarray(e)
        out[name] = dict(median=float(np.median(np.abs(e))), p90=float(np.quantile(np.abs(e), 0.9)),
                         signed=float(np.median(e)))
    return out


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    fit = None
    if "--fit" in args:
        i = args.index("--fit")
        if i + 1 >= len(args):
            print("--fit needs a folder holding stage_fit_host.json.gz", file=sys.stderr)
            return 2
        fit = load_params(args[i + 1], "host")
        del args[i:i + 2]
    if not args:
        print("usage: python -m xstage.sm_sharing_analysis <record folder (burst_program)> [...] [--fit <folder>]",
              file=sys.stderr)
        return 2
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        for folder in args:
            pp, _ = load(folder, BURST_PROGRAM)
            print(f"{folder}\nthe gap as measured / as launched:\n{gap_stretch(pp).round(3).to_string(index=False)}")
            print(f"programs issuing at once:\n{issuing_at_once(pp).round(2).to_string(index=False)}")
            if fit is not None and (pp.programs == 264).any():
                for fam in ("width", "warps"):
                    part = pp[pp.train.map(family_of) == fam]
                    if (part.programs == 264).any():
                        r = measured_gap_bound(part, fit)
                        print(f"{fam}, P = 264, {r['bursts']} bursts, median / p90 / signed error: " + "; ".join(
                            f"gaps {k} {r[k]['median']:.1%} / {r[k]['p90']:.0%} / {r[k]['signed']:+.1%}"
                            for k in ("launched", "measured")))
            print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
