"""The stage model against its records, per link: the written fits of every rung of the ladder, their held-out
errors, onsets, scores on trains never fitted, the record floor, the first bursts' capacity, the synchronised
sweep's barrier and the drain measured directly; the README's headline rows and docs/stage.md.

Every function reads data/ (xstage.records, xstage.sources) and the model (xstage.model, xstage.fit,
xstage.stage_fit); none runs a sweep or refits: the fits are the files ``xstage fit --write`` wrote
(data/<machine>/stage_fit_<link>*.json.gz).

Legend: P = issuing programs, b = bytes per program per burst, k = burst index in a train (0 = first).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from . import data, records
from .burst_gap_analysis import measured_onset, slowdown_table
from .fit import tidy_for_fit
from .fluid import KIB
from .model import load_params, predict_train
from .stage_fit import (LINK_TARGETS as LINK_TARGET, Observations, RUNG_FIXED, RUNG_TRAINS, STAGE_UNITS, _rung_params,
                        error_summary, full_rung, predict_observations, read_stage_fit, stage_fit_name)
from .stage_sim import models_read_fence
from .sources import LINK_MACHINES, check_source as _check_source, recorded as _recorded
from .stage_programs_analysis import CONTENDED, TRAIN_PROGRAMS, TRAIN_PROGRAMS_P

DOCS_PAGE = "stage.md"
NOTEBOOK = "02"
# the ladder (stage_fit.RUNGS), in order; each link's full model is stage_fit.FULL_RUNG's (NVLink: stage; the host
# link: free_store)
RUNG_ORDER = ("fluid", "capacity(P)", "shares", "pool", "stage", "free_store")


def train_data(source: str = "recorded", machine: str = "h200x1") -> tuple[pd.DataFrame, dict]:
    """Irregular free-running trains (schema xstage.data.BURST_TRAIN). recorded only: a gpu run records with
    ``xstage sweep trains`` (seconds), which the notebooks do not start themselves."""
    src = _check_source(source)
    if src != "recorded":
        raise ValueError("train data is replayed from data/ (record it with `xstage sweep trains --out DIR`)")
    df, meta = data.load(_recorded("trains", machine), data.BURST_TRAIN)
    return df, {**meta, "source": "recorded"}


def stage_fits(links=("nvlink", "host"), rungs=RUNG_ORDER) -> dict:
    """The written fits (data/<machine>/stage_fit_<link>[_<rung>].json) of every link and rung that exists:
    {(link, rung): fit dict with its tables}. A missing rung is left out; a missing full fit (stage_fit.FULL_RUNG) is an
    error."""
    out = {}
    for link in links:
        for rung in rungs:
            try:
                out[(link, rung)] = read_stage_fit(data.machine_dir(LINK_MACHINES[link]), link, rung)
            except ValueError:
                if rung == full_rung(link):
                    raise
    return out


def stage_errors(fits: dict, min_ns: float = 1000.0) -> pd.DataFrame:
    """Held-out (by train) median and p90 |error| per link, rung and kind of record (bursts >= ``min_ns``)."""
    rows = []
    for (link, rung), f in fits.items():
        e = error_summary(f["heldout_table"], min_ns).reset_index()
        rows.append(e.assign(link=link, rung=rung))
    t = pd.concat(rows, ignore_index=True)
    t["rung"] = pd.Categorical(t.rung, RUNG_ORDER, ordered=True)
    return t.sort_values(["link", "rung", "kind"]).reset_index(drop=True)[
        ["link", "rung", "kind", "median_abs_error", "p90_abs_error", "bursts"]]


def stage_params(fits: dict) -> pd.DataFrame:
    """The full model's parameters per link (stage_fit.FULL_RUNG) with their 95 % intervals: the stage parameters, then
    the rung's own (host: free entries f, fitted, and their bound F, fixed: equal ends)."""
    rows = []
    for (link, rung), f in fits.items():
        if rung != full_rung(link):
            continue
        vals = {**f["params"], "span_overhead_ns": f["span_overhead_ns"]}
        for k in (*_rung_params(rung), *RUNG_FIXED.get(rung, {})):
            rows.append(dict(link=link, parameter=k, value=vals[k], ci95_low=f["ci95_low"][k],
                             ci95_high=f["ci95_high"][k], unit=STAGE_UNITS[k]))
    return pd.DataFrame(rows)


def _sync_as_rows(t: pd.DataFrame, col: str, target: str) -> pd.DataFrame:
    """A fit table's synchronised rows in the burst-gap schema's shape (span_ns = ``col``)."""
    s = t[t.kind == "sync"].copy()
    parts = s.train.str.split(":", expand=True)
    return pd.DataFrame({"target": target, "store_bytes": 16, "drain": False, "programs": s.programs.to_numpy(),
                         "burst_bytes": parts[2].astype(int).to_numpy(), "gap_ns": parts[3].astype(int).to_numpy(),
                         "burst": s.burst.to_numpy(), "span_ns": s[col].to_numpy()})


def onset_model_vs_measured(fit_obj: dict, threshold: float = 1.5, gap_us: float = 0.0) -> pd.DataFrame:
    """Onset of backpressure per program count, measured and predicted by the same rule on the same grid
    (:func:`measured_onset` over :func:`slowdown_table` of the first bursts): the prediction is each held-out
    configuration's (its fold fitted without it). KiB per program; ``ratio`` = model / measured."""
    t = fit_obj["heldout_table"]
    target = LINK_TARGET[fit_obj["link"]]
    out = {}
    for name, col in (("measured_onset_kib", "measured_ns"), ("model_onset_kib", "predicted_ns")):
        rows = _sync_as_rows(t, col, target)
        out[name] = measured_onset(slowdown_table(rows, target, 16, gap_us, "first"), threshold) / KIB
    res = pd.DataFrame(out).rename_axis("programs").reset_index()
    res["ratio"] = res.model_onset_kib / res.measured_onset_kib
    res.insert(0, "link", fit_obj["link"])
    return res


def trains_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per (target, train, programs, burst): median over repeats of the median / p10 / p90 program and the
    start skew, with the burst's size and the gap after it."""
    return (df.groupby(["target", "train", "programs", "burst"], as_index=False)
            .agg(burst_bytes=("burst_bytes", "first"), gap_ns=("gap_ns", "first"), issue_ns=("issue_ns", "median"),
                 issue_p10_ns=("issue_p10_ns", "median"), issue_p90_ns=("issue_p90_ns", "median"),
                 start_skew_ns=("start_skew_ns", "median")))


def score_trains(folder, link: str = "host", min_ns: float = 1000.0, prm=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A link's fitted stage model (xstage.model.load_params, unchanged; or ``prm``, e.g. another rung's fit)
    against trains recorded apart from its fit (``folder``'s burst_train record): per (train, programs, burst)
    measured median program and prediction, and the median / p90 |error| over bursts >= ``min_ns``.
    The bursts of :func:`xstage.data.legacy_read_bursts` (the legacy kernel's read, which waits behind the
    program's stores) are predicted with that wait (``predict_train(read_fence=...)``) where the arbitration
    models it."""
    if prm is None:
        prm = load_params(data.machine_dir(LINK_MACHINES[link]), link)
    df, meta = data.load(folder, data.BURST_TRAIN)
    t = trains_summary(df[df.target == LINK_TARGET[link]])
    parts = []
    for (name, p), g in t.groupby(["train", "programs"], sort=False):
        g = g.sort_values("burst")
        fence = data.legacy_read_bursts(meta, len(g)) if models_read_fence(prm) else ()
        parts.append(g.assign(predicted_ns=predict_train(prm, int(p), g.burst_bytes.to_numpy(),
                                                         g.gap_ns.to_numpy(), read_fence=fence)))
    rows = pd.concat(parts, ignore_index=True).rename(columns={"issue_ns": "measured_ns"})
    rows["rel_error"] = rows.predicted_ns / rows.measured_ns - 1
    big = rows[rows.measured_ns >= min_ns]
    a = big.rel_error.abs()
    summary = pd.DataFrame({"median_abs_error": [a.median()], "p90_abs_error": [a.quantile(0.9)],
                            "bursts": [len(big)], "median_abs_error_above_320kib":
                            [big[big.burst_bytes > 320 * KIB].rel_error.abs().median()]})
    return rows, summary


TRAIN_SMALL = "trains_small_bursts"   # bursts 2-48 KiB, gaps 0.5-50 us, P 66-200, per program, recorded
                                  # after the full model and every candidate rung were written
# the held-out families re-recorded with the clean kernel (stage trains-clean of scripts/device_session.sh, a run:
# the same seeds, sizes, gaps and program counts, and seed 22, never recorded before), scored where recorded
CLEAN_SCORED_RECORDS = ("independent_clean", "train_programs_p_clean", "train_programs_new_p_clean",
                        "train_small_clean", "train_seed22_clean")
LEGACY_SCORED_RECORDS = ("independent", "train_programs_p", "train_programs_new_p", TRAIN_SMALL)   # legacy kernel
SCORED_TRAIN_RECORDS = (*LEGACY_SCORED_RECORDS, *CLEAN_SCORED_RECORDS)   # never fitted (those present)


def scores_by_programs(link: str = "host", machine: str = "h200x1", min_ns: float = 1000.0, prm=None,
                       records=SCORED_TRAIN_RECORDS) -> pd.DataFrame:
    """The fitted model on every never-fitted train record of ``machine`` (:data:`SCORED_TRAIN_RECORDS`), per
    record and program count: bursts >= ``min_ns``, median / p90 |error| and the median signed error (> 0: the
    model is too slow), plus each record's row over all its program counts (programs = 0)."""
    rows = []
    for sub in records:
        folder = data.machine_dir(machine) / sub
        if not data.paths(folder, data.BURST_TRAIN)[0].is_file():
            continue
        r, _ = score_trains(folder, link, min_ns, prm)
        r = r[r.measured_ns >= min_ns]
        for P, g in [*r.groupby("programs"), (0, r)]:
            e = g.rel_error
            rows.append({"record": sub, "programs": int(P), "bursts": len(g), "median_abs_error": e.abs().median(),
                         "p90_abs_error": e.abs().quantile(0.9), "median_error": e.median()})
    return pd.DataFrame(rows)


TRAIN_PROCESSES = ("train_processes_p0", "train_processes_p1", "train_processes_p2")   # S8-1: one chip, 3 processes


def record_floor(machine: str = "h200x1", min_ns: float = 1000.0) -> pd.DataFrame:
    """What a second record of the same trains reproduces, per program count: median |ratio - 1| of the median
    program's issue time (median over repeats) between two records of the same (train, programs, burst), bursts
    >= ``min_ns`` in the first. Pairs: processes on one chip (S8-1, :data:`TRAIN_PROCESSES`), and records made
    in other calls, on another chip or the same (the fitted seed-0 family, S7-1's re-record, S8-1's first process). The
    floor under any model's error on a record it was not fitted on; ``within`` is the repeats' own spread."""
    root = data.machine_dir(machine)
    recs = {"fitted family": root, "S7-1": root / TRAIN_PROGRAMS}
    recs.update({f"S8-1 process {i}": root / sub for i, sub in enumerate(TRAIN_PROCESSES)})
    key = ["train", "programs", "burst"]
    med, within = {}, {}
    for name, folder in recs.items():
        if not data.paths(folder, data.BURST_TRAIN)[0].is_file():
            continue
        df, _ = data.load(folder, data.BURST_TRAIN)
        df = df[df.target == "host"]
        med[name] = df.groupby(key).issue_ns.median()
        within[name] = df.groupby(key).issue_ns.agg(lambda x: (x / x.median() - 1).abs().median())
    pairs = [("S8-1 process 0", "S8-1 process 1", "processes, one call"),
             ("S8-1 process 0", "S8-1 process 2", "processes, one call"),
             ("S8-1 process 1", "S8-1 process 2", "processes, one call"),
             ("fitted family", "S8-1 process 0", "records, two calls"),
             ("fitted family", "S7-1", "records, two calls"),
             ("S7-1", "S8-1 process 0", "records, two calls")]
    rows = []
    for a, b, kind in pairs:
        if a not in med or b not in med:
            continue
        j = pd.concat([med[a].rename("a"), med[b].rename("b")], axis=1).dropna()
        j = j[j.a >= min_ns].reset_index()
        j["e"] = (j.b / j.a - 1).abs()
        w = within[a].reindex(pd.MultiIndex.from_frame(j[key])).to_numpy()
        for P, g in j.groupby("programs"):
            rows.append({"pair": f"{a} / {b}", "kind": kind, "programs": int(P), "bursts": len(g),
                         "median_abs_ratio": g.e.median(), "p90_abs_ratio": g.e.quantile(0.9),
                         "within_repeats": float(np.nanmedian(w[g.index]))})
    return pd.DataFrame(rows)


FIRST_BURST_RECORDS = ("", "independent", TRAIN_PROGRAMS, TRAIN_PROGRAMS_P, "train_programs_new_p",
                       *TRAIN_PROCESSES)   # under data/h200x1/ ("": the fitted family itself)


def first_burst_capacity(link: str = "host", machine: str = "h200x1") -> pd.DataFrame:
    """The stage's capacity per program count as the first bursts of the trains show it: a burst into an empty
    stage whose median program takes > ``CONTENDED`` x its unimpeded issue held C = P b - D (t - b / r - o) when
    its median program finished (D, r, o: the link's fitted stage model). Per program count over every train
    record of ``machine`` (:data:`FIRST_BURST_RECORDS`): bursts, the median and quartiles of C (KiB), and the
    fitted model's C(P) beside it."""
    prm = load_params(data.machine_dir(LINK_MACHINES[link]), link)
    parts = []
    for sub in FIRST_BURST_RECORDS:
        folder = data.machine_dir(machine) / sub
        if not data.paths(folder, data.BURST_TRAIN)[0].is_file():
            continue
        df, _ = data.load(folder, data.BURST_TRAIN)
        df = df[(df.target == LINK_TARGET[link]) & (df.burst == 0)]
        g = df.groupby(["train", "programs"], as_index=False).agg(b=("burst_bytes", "first"), t=("issue_ns", "median"))
        parts.append(g.assign(record=sub or "fitted family"))
    if not parts:
        raise ValueError(f"no train record of {machine} for the {link} link")
    f = pd.concat(parts, ignore_index=True)
    unimpeded = f.b / prm.program_rate + prm.overhead_ns
    f = f[f.t > CONTENDED * unimpeded].copy()
    f["capacity_kib"] = (f.programs * f.b - prm.drain_gbps * (f.t - unimpeded[f.index])) / KIB
    out = f.groupby("programs").capacity_kib.describe()[["count", "25%", "50%", "75%"]]
    out = out.rename(columns={"count": "bursts", "25%": "capacity_p25_kib", "50%": "capacity_kib",
                              "75%": "capacity_p75_kib"}).reset_index()
    out["bursts"] = out.bursts.astype(int)
    out["model_kib"] = prm.capacity_bytes(out.programs.to_numpy()) / KIB
    return out


# ------------------------------------------------------------------------ the harness and the drain measured directly


BARRIER_FOLDERS = {"release": "barrier_release", "relaxed": "barrier_relaxed"}   # under data/h200x1/


def barrier_harness(link: str = "host", min_ns: float = 1000.0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The synchronised sweep with its grid barrier's arrival a release (as every recorded sweep) and relaxed,
    the same grid in one run (data/<machine>/barrier_{release,relaxed}/), each burst's span beside the stage
    model's prediction (xstage.model.load_params(link), unchanged: these records were never fitted;
    ``barrier_drains`` as the harness is). Returns (rows: per mode, configuration and burst: measured span,
    predicted, the median program's barrier time; summary: per mode and first / later bursts, the median and
    p90 |error| over bursts of at least ``min_ns``, the median span and the median barrier time)."""
    machine = LINK_MACHINES[link]
    prm = load_params(data.machine_dir(machine), link)
    span_o = _span_overhead(link)
    parts = []
    for mode, sub in BARRIER_FOLDERS.items():
        df, _ = data.load(data.machine_dir(machine) / sub, data.BURST_GAP)
        t = tidy_for_fit(df, LINK_TARGET[link], 16, "span_ns")
        bar = (df[df.target == LINK_TARGET[link]].groupby(["programs", "burst_bytes", "gap_ns", "burst"])
               .barrier_ns.median().rename("barrier_ns").reset_index())
        t = t.merge(bar, on=["programs", "burst_bytes", "gap_ns", "burst"], how="left")
        for _, g in t.groupby(["programs", "burst_bytes", "gap_ns"], sort=True):
            g = g.sort_values("burst")
            cfg = pd.DataFrame({"kind": ["sync"], "train": [""], "programs": [int(g.programs.iloc[0])],
                                "n_bursts": [len(g)], "sm_count": [prm.sm_count]})
            obs = Observations(cfg, g.burst_bytes.to_numpy(float)[None], g.gap_eff_ns.to_numpy(float)[None],
                               g.issue_ns.to_numpy(float)[None], {})
            pred = predict_observations(obs, prm, span_o, barrier_drains=mode == "release")[0]
            parts.append(g.assign(barrier=mode, predicted_ns=pred))
    rows = pd.concat(parts, ignore_index=True).rename(columns={"issue_ns": "measured_ns"})
    rows["rel_error"] = rows.predicted_ns / rows.measured_ns - 1
    scored = rows[rows.measured_ns >= min_ns].assign(abs_err=lambda x: x.rel_error.abs(),
                                                      which=lambda x: np.where(x.burst == 0, "first", "later"))
    summary = scored.groupby(["barrier", "which"]).agg(
        bursts=("abs_err", "size"), median_abs_error=("abs_err", "median"),
        p90_abs_error=("abs_err", lambda e: e.quantile(0.9))).reset_index()
    both = rows.assign(which=np.where(rows.burst == 0, "first", "later")).groupby(["barrier", "which"]).agg(
        median_span_us=("measured_ns", lambda x: x.median() / 1e3),
        median_barrier_us=("barrier_ns", lambda x: x.median() / 1e3)).reset_index()
    return rows, summary.merge(both, on=["barrier", "which"], how="left")


def _span_overhead(link: str) -> float:
    return float(read_stage_fit(data.machine_dir(LINK_MACHINES[link]), link)["span_overhead_ns"])


DRAIN_FOLDER = "drain_programs"   # under data/h200x1/: long bursts, each followed by its drain fence


def drain_by_programs(link: str = "host") -> pd.DataFrame:
    """The link's drain rate with 1 to 132 programs storing at once, from the record of long bursts each
    followed by a system-scope fence (data/<machine>/drain_programs/): per (programs, bytes per program), the
    bytes of a burst over the time from its start to the last program's stores performed (median over bursts
    and repeats; the slowest program's issue plus its drain). GB/s."""
    df, _ = data.load(data.machine_dir(LINK_MACHINES[link]) / DRAIN_FOLDER, data.BURST_GAP)
    df = df[(df.target == LINK_TARGET[link]) & df.drain.astype(bool)]
    if df.empty:
        raise ValueError(f"{DRAIN_FOLDER}: no drain-timed rows for the {link} link")
    g = df.assign(gbps=df.programs * df.burst_bytes / (df.issue_ns_max + df.drain_ns_max))
    return (g.groupby(["programs", "burst_bytes"]).gbps.median().unstack("burst_bytes")
            .rename(columns=lambda b: f"{b // KIB} KiB").rename_axis(columns=None).reset_index())


# ------------------------------------------------------------------------------ the README's rows and docs/stage.md
def _link_name(link: str) -> str:
    return f"{'NVLink peer' if link == 'nvlink' else 'host link (PCIe)'} ({LINK_MACHINES[link]})"


def _full_errors(fits: dict, link: str) -> str:
    e = stage_errors({(link, full_rung(link)): fits[(link, full_rung(link))]})
    return ", ".join(f"{_KIND_LABEL[r.kind]} **{r.median_abs_error:.1%}**" for r in
                     e.sort_values("kind", key=lambda k: k.map({"train": 0, "free": 1, "sync": 2})).itertuples())


def headline() -> list[records.Headline]:
    """The stage model's README rows: each link's full model held out by train (the written fits)."""
    fits = stage_fits(rungs=tuple(dict.fromkeys(full_rung(link) for link in LINK_MACHINES)))
    rows = []
    for link, machine in LINK_MACHINES.items():
        rows.append(records.Headline(
            "" if rows else "the model predicts a burst's issue overhead, the recovery between bursts and the onset of "
            "backpressure",
            f"stage model (rung {full_rung(link)}), held-out median |error| by train, bursts >= 1 us: "
            + _full_errors(fits, link),
            "NVLink, 2x H200" if link == "nvlink" else "PCIe to host memory, one H200",
            f"data/{machine}/{stage_fit_file(link)}", NOTEBOOK))
    return rows


def stage_fit_file(link: str) -> str:
    """The file of the link's full model under data/<machine>/ (as ``xstage fit --write`` writes it)."""
    return stage_fit_name(link) + ".gz"


def docs_page() -> str:
    """docs/stage.md: per link, the full model's parameters with 95 % intervals, every rung of the ladder held out
    by train, and the onset measured / predicted (the written fits; notebook 02 has the never-fitted records)."""
    fits = stage_fits()
    par = stage_params(fits)
    err = stage_errors(fits)
    lines = ["# The stage model per link", "",
             "Every program is followed through its own train: it issues while the link's stage has room; the stage "
             "holds C(P) (a part present whatever the grid, C_0, and every program's own slots, up to C_max), drains "
             "at D shared by weight, and once filled keeps a part phi until it has emptied. The ladder "
             "(`xstage.stage_fit.RUNGS`), one rung per idea: " + ", ".join(f"`{r}`" for r in RUNG_ORDER) + ". "
             "Errors are medians of |error| on trains held out of the fit (5 folds by train), bursts >= 1 us.", ""]
    for link, machine in LINK_MACHINES.items():
        rung = full_rung(link)
        arb = fits[(link, rung)]["params"].get("arbitration", "pool")
        trains = RUNG_TRAINS.get(rung)
        lines += [f"## {_link_name(link)}", "",
                  f"Full model: rung `{rung}` (`data/{machine}/{stage_fit_file(link)}`; the stage shared as "
                  f"{_ARB_LABEL[arb]}" + (f"; its trains as the clean kernel recorded them, `data/{machine}/{trains}/`"
                                          if trains else "") + f"). `xstage fit --data data/{machine} --link {link} "
                  "--write` refits it.", "",
                  "| parameter | value | 95 % interval | unit |", "|---|---|---|---|"]
        for r in par[par.link == link].itertuples():
            ci = f"{r.ci95_low:.4g} - {r.ci95_high:.4g}" if r.ci95_low < r.ci95_high else "fixed"
            lines.append(f"| {r.parameter} | {r.value:.4g} | {ci} | {r.unit} |")
        lines += ["", "Held out by train, per rung (median |error|, p90 in brackets):", "",
                  "| rung | " + " | ".join(_KIND_LABEL[k] for k in ("train", "free", "sync")) + " |",
                  "|---|---|---|---|"]
        e = err[err.link == link]
        for rung_ in RUNG_ORDER:
            g = e[e.rung.astype(str) == rung_].set_index("kind")
            if g.empty:
                continue
            cells = [f"{g.median_abs_error[k]:.1%} ({g.p90_abs_error[k]:.0%})" if k in g.index else "-"
                     for k in ("train", "free", "sync")]
            lines.append(f"| {rung_}{' (full)' if rung_ == rung else ''} | " + " | ".join(cells) + " |")
        on = onset_model_vs_measured(fits[(link, rung)])
        lines += ["", "Onset of backpressure from an empty stage, KiB per program, measured / model: " + ", ".join(
            f"P={int(r.programs)}: {r.measured_onset_kib:g} / {r.model_onset_kib:g}" for r in on.itertuples()
            if r.programs >= 16), ""]
    return "\n".join(lines)


_KIND_LABEL = {"sync": "synchronised", "free": "free-running regular", "train": "irregular trains"}
_ARB_LABEL = {"pool": "one pool", "slots": "per-program slots beside a shared C_0",
              "gpc_drain": "per-program slots beside a shared C_0, the drain shared equally per GPC holding stores"}
