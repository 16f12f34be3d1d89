"""``xstage calibrate``: a fixed, short measurement plan on this machine's GPU(s), then the link's full stage model
fitted to it and written as ``stage_fit_<link>.json.gz`` (what :func:`xstage.model.load_params` reads).

The plan (:class:`CalibrationPlan`, one place) is a subset of the recorded studies, chosen by what the full model's
fit is sensitive to (the Jacobian of the log-predictions on the host link's full records, data/h200x1; see the
plan's comments): synchronised points (the span's fixed cost, the issue rate), free-running points around the
onset (the capacities and the stall), seeded free-running trains at four program counts (the per-program slots,
the spread, the stall, the free entries) and the drain measured directly (fixed in the fit). Every sweep is the
project's own (:func:`xstage.burst_gap_sweep.run_burst_gap` / :func:`~xstage.burst_gap_sweep.run_trains`), into
sub-folders of ``--out`` named as :func:`xstage.stage_fit.observations` reads a machine folder, so a stopped run resumes
and each sweep checks its destinations bit for bit before timing. ``source="simulated"`` replaces the GPU by the
stage model with known parameters (``--params-from``): the CPU test that the plan recovers them.

Legend: P = issuing programs, b = KiB per program per burst, g = gap (us).
"""
from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from . import data, env
from .burst_gap_sweep import BurstGapGrid, TrainGrid, run_burst_gap, run_trains
from .fluid import KIB
from .model import LINKS
from .remote_store import BurstGapPoint, BurstTrain
from .stage_fit import (DRAIN_RECORD, LINK_TARGETS, RUNG_TRAINS, STAGE_UNITS, SWEEP_RECORD, Observations, StageFit,
                        _rung_params, default_workers, error_summary, fit_stage, full_rung, measured_drain,
                        observations, predict_observations, read_stage_fit, write_stage_fit)
from .stage_params import GPC_OF_SM, StageParams

TRAIN_SUB = "trains"            # the plan's trains (the fit's burst_train record: observations(..., trains=TRAIN_SUB))
FREE_SUB = "free_running"       # what observations() reads as the free-running record
REFERENCE = {"host": "h200x1", "nvlink": "h200x2"}   # the card whose fit starts a calibration (data/<machine>)
BURST_SCALE = {"host": 1, "nvlink": 4, "local": 16}  # the plan's burst sizes per link (NVLink ~7x, local ~60x faster)
WORLD = {"host": 1, "nvlink": 2, "local": 1}
SUMMARY = "calibration_summary.txt"


@dataclass(frozen=True)
class CalibrationPlan:
    """What ``xstage calibrate`` measures and how it fits (host-link sizes; other links scale the burst sizes by
    BURST_SCALE). Chosen on the host link's full records (data/h200x1: 396 synchronised and 396 free-running
    configurations, 96 trains) by the full model's Jacobian there: the free-running points at 8-128 KiB carry the
    capacities (32 KiB at P = 66 most of C_max and C_0) and, with gaps of 3 and 30 us, the stall; the trains at
    P = 16 the per-program slots and the stall, at P = 132 the free entries, at P = 264 the spread and the
    overhead; the synchronised points the span's fixed cost and the issue rate. 132 configurations of the 888 (plus
    3 drain points), whose Gauss-Newton standard errors at the full fit's optimum are 1.4-5.2x the full records'
    (2.6x for a uniform subsample of that size; free_kib 5.2x, capacity_kib 1.4x). Refitted on these recorded rows
    alone (:func:`plan_evidence`, data/h200x1) from the full fit, the plan's optimum stays there and its intervals
    cover every full-data value; from a start 15 % away, 20 steps bring 5 of the 9 fitted parameters within the
    plan's intervals of the full-data values (c_p, spread, stall and f end 5-16 % off): the warm start from a card
    of the same family matters.

    GPU time, estimated from the records' own runs (the lab notebook of those sessions): the synchronised host
    sweep ran 792 configurations x 6 runs in 18 s (~23 ms each), 384 trains x 6 runs in 7 s (~18 ms each); the
    plan's 87 burst-gap points and 48 trains x 4 runs take ~3 s of kernels, the rest is four processes' start, CUDA
    init and Triton compiles (~10-20 s each): about 1-1.5 minutes."""

    sync_programs: tuple[int, ...] = (1, 16, 66, 264)
    sync_burst_kib: tuple[int, ...] = (2, 32, 256)
    sync_gap_us: tuple[float, ...] = (0, 10)
    free_programs: tuple[int, ...] = (1, 16, 66, 132, 264)
    free_burst_kib: tuple[int, ...] = (8, 32, 64, 128)
    free_gap_us: tuple[float, ...] = (0, 3, 30)
    train_seed: int = 0                          # the fitted family's seed (its first train_count trains)
    train_count: int = 12
    train_programs: tuple[int, ...] = (16, 66, 132, 264)
    drain_programs: tuple[int, ...] = (16, 66, 132)
    drain_burst_kib: tuple[int, ...] = (1024,)
    n_bursts: int = 8
    repeats: int = 3
    k_folds: int = 4                             # held out by train
    max_nfev: int = 20                           # least-squares steps from the reference card's parameters
    fold_nfev: int = 5                           # ... of each held-out refit, from the optimum
    polish: int = 8                              # rounds of the pattern search after least squares (stage_fit._polish)

    def sweeps(self, link: str) -> list[tuple[str, str, object]]:
        """(step, sub-folder, grid) of every sweep of the plan on ``link``, in the order they run."""
        target = LINK_TARGETS[link]
        s, w = BURST_SCALE[link], WORLD[link]
        common = dict(store_bytes=(16,), targets=(target,), n_bursts=self.n_bursts, repeats=self.repeats,
                      world_size=w)
        return [
            ("sync", SWEEP_RECORD, BurstGapGrid(burst_kib=tuple(b * s for b in self.sync_burst_kib),
                                                gap_us=self.sync_gap_us, programs=self.sync_programs, **common)),
            ("free", FREE_SUB, BurstGapGrid(burst_kib=tuple(b * s for b in self.free_burst_kib),
                                            gap_us=self.free_gap_us, programs=self.free_programs, sync=False,
                                            **common)),
            ("drain", DRAIN_RECORD, BurstGapGrid(burst_kib=tuple(b * s for b in self.drain_burst_kib), gap_us=(0,),
                                                 programs=self.drain_programs, drain=(True,),
                                                 **{**common, "n_bursts": 3})),
            ("trains", TRAIN_SUB, TrainGrid(seed=self.train_seed, count=self.train_count, programs=self.train_programs,
                                            targets=(target,), repeats=self.repeats, world_size=w,
                                            kib=(2 * s, 320 * s))),
        ]

    def configurations(self) -> int:
        return (len(self.sync_programs) * len(self.sync_burst_kib) * len(self.sync_gap_us)
                + len(self.free_programs) * len(self.free_burst_kib) * len(self.free_gap_us)
                + self.train_count * len(self.train_programs))


def plan_rows(obs: Observations, plan: CalibrationPlan = CalibrationPlan()) -> np.ndarray:
    """The observations of a recorded folder (:func:`xstage.stage_fit.observations`, host link) that the plan measures:
    its synchronised and free-running points and its trains (by name). The evidence that the plan suffices: a fit
    on these rows alone against the fit on all of them (tests/test_calibrate.py)."""
    c = obs.cfgs
    kind = c.kind.to_numpy()
    parts = c.train.str.split(":", expand=True)
    point = kind != "train"
    b = np.where(point, pd.to_numeric(parts[2], errors="coerce") / KIB, np.nan)
    g = np.where(point, pd.to_numeric(parts[3], errors="coerce") / 1000, np.nan)
    P = c.programs.to_numpy()
    names = [f"s{plan.train_seed}-{i:02d}" for i in range(plan.train_count)]
    sel = (((kind == "sync") & np.isin(P, plan.sync_programs) & np.isin(b, plan.sync_burst_kib)
            & np.isin(g, plan.sync_gap_us))
           | ((kind == "free") & np.isin(P, plan.free_programs) & np.isin(b, plan.free_burst_kib)
              & np.isin(g, plan.free_gap_us))
           | ((kind == "train") & np.isin(P, plan.train_programs) & c.train.isin(names).to_numpy()))
    return np.flatnonzero(sel)


# ------------------------------------------------------------------------------------------- bad input, first
def check_out(out) -> Path:
    """--out must be a folder this process can write (created when absent); one line otherwise."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is an existing file, not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".xstage-write-check"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ValueError(f"--out {out} is not writable: {e.strerror or e}") from None
    return out


def check_machine(link: str, source: str) -> int:
    """The GPUs the link needs (before any kernel runs); returns the SM count the fit will use."""
    if link not in LINKS:
        raise ValueError(f"--link must be one of {', '.join(LINKS)}, got {link!r}")
    if source == "simulated":
        return len(GPC_OF_SM)
    if source != "gpu":
        raise ValueError(f"--source must be gpu or simulated, got {source!r}")
    have, need = env.gpu_count(), WORLD[link]
    if have < need:
        what = "no CUDA GPU is visible" if have == 0 else f"{have} GPU is visible"
        peers = " (a peer GPU over NVLink)" if link == "nvlink" else ""
        raise RuntimeError(f"calibrate --link {link} needs {need} GPU{'s' if need > 1 else ''}{peers}; {what}. "
                           f"Without a GPU: --source simulated --params-from data/{REFERENCE.get(link, 'h200x1')}")
    import torch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if full_rung(link) == "free_store" and sms != len(GPC_OF_SM):
        raise RuntimeError(f"calibrate --link {link} fits the GPC drain, which needs the measured GPC map of a "
                           f"{len(GPC_OF_SM)}-SM chip; this GPU has {sms} SMs")
    return sms


def reference_start(folder, link: str) -> dict | None:
    """Starting values from another card's written full model (data/<REFERENCE[link]>), or None without one."""
    if folder is None or not Path(folder).is_dir():
        return None
    try:
        f = read_stage_fit(folder, link)
    except ValueError:
        return None
    start = {k: float(v) for k, v in f["params"].items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    start.pop("sm_count", None)
    start["span_overhead_ns"] = float(f["span_overhead_ns"])
    return start


def truth(params_from, link: str) -> tuple[StageParams, float]:
    """(parameters, span overhead) of the written full model the simulated source runs."""
    if params_from is None:
        raise ValueError("--source simulated needs --params-from DIR (a folder with a stage fit of the link)")
    f = read_stage_fit(params_from, link)
    return StageParams(**f["params"]), float(f["span_overhead_ns"])


# ---------------------------------------------------------------------------------------- the simulated source
def _simulated_points(points, target_prm: StageParams, span_o: float, repeats: int, rng, noise: float):
    """burst_gap rows of ``points`` (one frame per point) from the stage model as the fit predicts them."""
    kind = np.array(["sync" if p.sync else "free" for p in points])
    cfgs = pd.DataFrame({"kind": kind, "train": [str(i) for i in range(len(points))],
                         "programs": [p.programs for p in points], "n_bursts": [p.n_bursts for p in points],
                         "sm_count": target_prm.sm_count})
    n = max(p.n_bursts for p in points)
    b = np.array([[p.burst_bytes] * n for p in points], np.float64)
    g = np.array([[p.gap_ns] * n for p in points], np.float64)
    obs = Observations(cfgs, b, g, np.ones_like(b), {})
    pred = predict_observations(obs, target_prm, span_o)
    frames = []
    for p, t in zip(points, pred):
        reps = []
        for rep in range(repeats):
            k = rng.lognormal(0.0, noise, size=p.n_bursts)
            T = t[:p.n_bursts] * k
            drain = np.zeros(p.n_bursts)
            if p.drain:   # the burst's bytes leave at D: issue + drain = P b / D
                drain = np.maximum(p.programs * p.burst_bytes / target_prm.drain_gbps * k - T, 0.0)
            reps.append(pd.DataFrame({**asdict(p), "rank": 0, "repeat": rep, "burst": np.arange(p.n_bursts),
                                      "issue_ns": T, "issue_ns_max": T, "issue_ns_min": T, "span_ns": T,
                                      "drain_ns": drain, "drain_ns_max": drain, "gap_meas_ns": float(p.gap_ns),
                                      "barrier_ns": 0.0, "idle_ns": float(p.gap_ns), "start_skew_ns": 0.0}))
        frames.append(pd.concat(reps, ignore_index=True)[list(data.BURST_GAP.columns)])
    return frames


def _simulated_trains(trains: list[BurstTrain], target_prm: StageParams, repeats: int, rng, noise: float):
    """burst_train rows of ``trains`` (one frame per train) from the stage model as the fit predicts them."""
    cfgs = pd.DataFrame({"kind": "train", "train": [t.name for t in trains],
                         "programs": [t.programs for t in trains], "n_bursts": [t.n_bursts for t in trains],
                         "sm_count": target_prm.sm_count})
    n = max(t.n_bursts for t in trains)
    b = np.full((len(trains), n), 2048.0)
    g = np.zeros((len(trains), n))
    for i, t in enumerate(trains):
        b[i, :t.n_bursts], g[i, :t.n_bursts] = t.burst_bytes, t.gap_ns
    pred = predict_observations(Observations(cfgs, b, g, np.ones_like(b), {}), target_prm, 0.0)
    frames = []
    for tr, t in zip(trains, pred):
        reps = []
        for rep in range(repeats):
            T = t[:tr.n_bursts] * rng.lognormal(0.0, noise, size=tr.n_bursts)
            reps.append(pd.DataFrame({
                "train": tr.name, "target": tr.target, "programs": tr.programs, "store_bytes": tr.store_bytes,
                "n_bursts": tr.n_bursts, "rank": 0, "repeat": rep, "burst": np.arange(tr.n_bursts),
                "burst_bytes": np.asarray(tr.burst_bytes), "gap_ns": np.asarray(tr.gap_ns), "issue_ns": T,
                "issue_p10_ns": T, "issue_p25_ns": T, "issue_p75_ns": T, "issue_p90_ns": T, "issue_min_ns": T,
                "issue_max_ns": T, "start_ns": 0.0, "start_skew_ns": 0.0, "end_skew_ns": 0.0, "span_ns": T}))
        frames.append(pd.concat(reps, ignore_index=True)[list(data.BURST_TRAIN.columns)])
    return frames


def run_simulated(grid, folder: Path, prm: StageParams, span_o: float, command: str, seed: int,
                  noise: float = 0.03) -> Path:
    """One sweep of the plan on the stage model (rows appended per configuration: a stop resumes as on a GPU)."""
    schema = data.BURST_TRAIN if isinstance(grid, TrainGrid) else data.BURST_GAP
    meta = env.provenance(command, {"grid": asdict(grid), "source": "simulated", "model": prm.as_dict(),
                                    "span_overhead_ns": span_o})
    meta.update(machine="simulated", sm_count=prm.sm_count)
    csv = data.start_file(folder, schema, meta)
    done = data.done_keys(csv, schema)
    rng = np.random.default_rng(seed)
    if schema is data.BURST_TRAIN:
        items = [t for t in grid.trains() if t.key() not in done]
        frames = _simulated_trains(items, prm, grid.repeats, rng, noise) if items else []
    else:
        items = [p for p in grid.points(prm.sm_count) if p.key() not in done]
        frames = _simulated_points(items, prm, span_o, grid.repeats, rng, noise) if items else []
    for f in frames:
        data.append_rows(csv, schema, f)
    return csv


# ------------------------------------------------------------------------------------------------ the command
@dataclass
class Calibration:
    fit: StageFit
    path: str            # the written fit
    summary: str         # the one-page summary (also written as calibration_summary.txt)
    measure_s: float     # wall time of the sweeps
    fit_s: float         # wall time of the fit


def run(link: str, out, source: str = "gpu", params_from=None, plan: CalibrationPlan = CalibrationPlan(),
        start_from="auto", workers: int | None = None, command: str = "", seed: int = 0,
        progress: bool = True) -> Calibration:
    """Measure the plan (or simulate it), fit ``link``'s full model, write ``stage_fit_<link>.json.gz`` and the
    summary into ``out``. ``start_from``: a folder whose written fit of the link starts the fit ("auto":
    data/<REFERENCE[link]>; a dict: the starting values; None, or a folder without that fit: the link's read-off
    values with the coarse prescan); ``workers``: fit processes (None: this machine's CPUs)."""
    check_machine(link, source)
    out = check_out(out)
    if source == "simulated":
        prm_true, span_true = truth(params_from, link)
    workers = default_workers() if workers is None else int(workers)
    steps = plan.sweeps(link)
    bar = tqdm(total=len(steps) + 1 + plan.k_folds, desc=f"calibrate {link}", file=sys.stderr, disable=not progress)
    t0 = time.perf_counter()
    for i, (step, sub, grid) in enumerate(steps):
        bar.set_postfix_str(step)
        if source == "simulated":
            run_simulated(grid, out / sub, prm_true, span_true, command, seed + i)
        elif isinstance(grid, TrainGrid):
            run_trains(grid, out / sub, source="gpu", command=command)
        else:
            run_burst_gap(grid, out / sub, source="gpu", command=command)
        bar.update()
    measure_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    bar.set_postfix_str("fit")
    res = fit_recorded(out, link, start_from, plan, workers, progress=lambda label: bar.update())
    fit_s = time.perf_counter() - t1
    bar.close()
    res.folder = str(out)
    path = write_stage_fit(res, out, command=command)
    text = summary(res, measure_s, fit_s, workers, source)
    tmp = out / (SUMMARY + ".tmp")
    tmp.write_text(text)
    tmp.replace(out / SUMMARY)
    return Calibration(res, path, text, measure_s, fit_s)


def fit_recorded(folder, link: str = "host", start_from="auto", plan: CalibrationPlan = CalibrationPlan(),
                 workers: int | None = None, progress=None) -> StageFit:
    """The calibration's fit of the plan's records in ``folder`` (what :func:`run` fits after measuring; also a
    recorded calibration fitted again, e.g. from another start): the link's full model, the measured drain fixed,
    started from ``start_from`` (as in :func:`run`), held out by train. Writes nothing."""
    workers = default_workers() if workers is None else int(workers)
    obs = observations(folder, link, trains=TRAIN_SUB)
    d = measured_drain(folder, link)
    measured = {}
    if d is not None:
        measured["drain_gbps"] = (d["drain_gbps"], d["low"], d["high"])
        obs.sources[DRAIN_RECORD] = d["source"]
    if isinstance(start_from, dict):   # starting values given (tests: a perturbed truth)
        start, ref = dict(start_from), None
    else:
        ref = (data.DATA_ROOT / REFERENCE[link] if link in REFERENCE else None) if start_from == "auto" else start_from
        start = reference_start(ref, link)
    if start and ref is not None:
        obs.sources["start"] = dict(file=str(Path(ref) / f"stage_fit_{link}.json.gz"))
    return fit_stage(obs, link, None, k_folds=plan.k_folds, max_nfev=plan.max_nfev if start else 40,
                     measured=measured, start=start, workers=workers, prescan=start is None, progress=progress,
                     fold_nfev=plan.fold_nfev, polish=plan.polish)


def onsets(res: StageFit, slowdown: float = 1.5) -> pd.DataFrame:
    """Onset of backpressure per P: the smallest burst (KiB per program) whose first synchronised burst takes at
    least ``slowdown`` x its unimpeded time (the span's fixed cost + b / r), measured (the plan's synchronised and
    free-running first bursts at gap 0) and predicted by the fit on a fine grid (powers of 2, 1 KiB - 4 MiB)."""
    prm, so = res.params, res.span_overhead_ns
    t = res.table
    first = t[(t.burst == 0) & t.kind.isin(["sync", "free"])]
    rows = []
    kib = 2.0 ** np.arange(0, 13)
    for P in sorted(first.programs.unique()):
        cfgs = pd.DataFrame({"kind": "sync", "train": "onset", "programs": int(P), "n_bursts": 1,
                             "sm_count": prm.sm_count}, index=range(len(kib)))
        obs = Observations(cfgs, kib[:, None] * KIB, np.zeros((len(kib), 1)), np.ones((len(kib), 1)), {})
        pred = predict_observations(obs, prm, so)[:, 0]
        free_t = so + kib * KIB / prm.program_rate
        hit = kib[pred >= slowdown * free_t]
        m = first[first.programs == P]
        mk = m.burst_bytes / KIB
        unimp = np.where(m.kind == "sync", so, prm.overhead_ns) + m.burst_bytes / prm.program_rate
        mhit = mk[m.measured_ns.to_numpy() >= slowdown * unimp]
        rows.append(dict(programs=int(P), onset_kib_model=float(hit.min()) if len(hit) else np.nan,
                         onset_kib_measured=float(mhit.min()) if len(mhit) else np.nan))
    return pd.DataFrame(rows)


def summary(res: StageFit, measure_s: float, fit_s: float, workers: int, source: str) -> str:
    """The one page: parameters with intervals, held-out error by kind and by P, onset per P, the wall times."""
    v = res.values()
    lines = [f"xstage calibrate: link {res.link}, full model (rung {res.rung}, arbitration {res.params.arbitration}), "
             f"source {source}", f"measure {measure_s:.1f} s, fit {fit_s:.1f} s on {workers} processes", "",
             f"{'parameter':<26} {'value':>11} {'ci95 low':>11} {'ci95 high':>11}  unit"]
    for k in _rung_params(res.rung):
        lines.append(f"{k:<26} {v[k]:>11.4g} {res.ci_low.get(k, np.nan):>11.4g} {res.ci_high.get(k, np.nan):>11.4g}"
                     f"  {STAGE_UNITS[k]}")
    lines += ["", "held out by train (bursts >= 1 us): |predicted / measured - 1|",
              f"{'kind':<8} {'P':>5} {'median':>8} {'p90':>8} {'bursts':>7}"]
    ho = res.heldout[res.heldout.measured_ns >= 1000.0]
    for kind, g in error_summary(res.heldout).iterrows():
        lines.append(f"{kind:<8} {'all':>5} {g.median_abs_error:>8.1%} {g.p90_abs_error:>8.1%} {int(g.bursts):>7}")
    for (kind, P), g in ho.assign(a=ho.rel_error.abs()).groupby(["kind", "programs"]).a:
        lines.append(f"{kind:<8} {P:>5} {g.median():>8.1%} {g.quantile(0.9):>8.1%} {len(g):>7}")
    lines += ["", "onset of backpressure (first burst >= 1.5 x unimpeded), KiB per program",
              f"{'P':>5} {'model':>8} {'measured':>9}"]
    for _, r in onsets(res).iterrows():
        lines.append(f"{int(r.programs):>5} {r.onset_kib_model:>8g} {r.onset_kib_measured:>9g}")
    return "\n".join(lines) + "\n"


def perturbed(start: dict, factor: float = 1.15) -> dict:
    """``start`` with every fitted value moved by ``factor`` (up and down in turn; fractions in logit space): a
    start away from the optimum (the plan's evidence and tests)."""
    out = {}
    for i, (k, v) in enumerate(sorted(start.items())):
        f = factor if i % 2 == 0 else 1 / factor
        out[k] = float(1 / (1 + (1 / v - 1) / f)) if k in ("spread", "stalled_fraction") else float(v * f)
    return out


def plan_evidence(folder, link: str = "host", plan: CalibrationPlan = CalibrationPlan(), workers: int = 1,
                  factor: float = 1.15) -> pd.DataFrame:
    """The evidence that the plan carries what the full model needs, from a folder's full records: the full model
    refitted on the plan's observations alone (:func:`plan_rows`; the folder's measured drain fixed), started
    ``factor`` away from the folder's written fit, against that fit (made on every record) and its interval."""
    obs = observations(folder, link, trains=RUNG_TRAINS.get(full_rung(link)))
    ref = read_stage_fit(folder, link)
    d = measured_drain(folder, link)
    measured = {"drain_gbps": (d["drain_gbps"], d["low"], d["high"])} if d else {}
    start = perturbed(reference_start(folder, link), factor)
    start = {k: v for k, v in start.items() if k in _rung_params(full_rung(link))}
    res = fit_stage(obs.take(plan_rows(obs, plan)), link, None, k_folds=plan.k_folds, max_nfev=plan.max_nfev,
                    measured=measured, start=start, workers=workers, prescan=False, fold_nfev=plan.fold_nfev,
                    polish=plan.polish)
    v = res.values()
    full = {**ref["params"], "span_overhead_ns": ref["span_overhead_ns"]}
    rows = []
    for k in _rung_params(res.rung):
        lo, hi = ref["ci95_low"].get(k, np.nan), ref["ci95_high"].get(k, np.nan)
        rows.append(dict(parameter=k, full=float(full[k]), full_low=lo, full_high=hi, plan=v[k],
                         plan_low=res.ci_low[k], plan_high=res.ci_high[k], start=start.get(k, np.nan),
                         plan_covers_full=bool(res.ci_low[k] <= full[k] <= res.ci_high[k]),
                         rel_diff=v[k] / float(full[k]) - 1))
    return pd.DataFrame(rows)


def with_plan(**changes) -> CalibrationPlan:
    """The default plan with some fields changed (tests: a smaller plan)."""
    return replace(CalibrationPlan(), **changes)


def cards(folders: dict[str, Path | str], link: str = "host") -> pd.DataFrame:
    """The written full models of several cards side by side: per parameter (rows) and card (``folders``: label ->
    folder holding ``stage_fit_<link>.json.gz``) the value and its 95 % interval, "value (low-high)"."""
    cols = {}
    for label, folder in folders.items():
        f = read_stage_fit(folder, link)
        lo, hi = f.get("ci95_low", {}), f.get("ci95_high", {})
        vals = {**f["params"], "span_overhead_ns": f["span_overhead_ns"]}
        cols[label] = {k: (f"{v:.4g} ({lo[k]:.4g}-{hi[k]:.4g})" if k in lo and k in hi else f"{v:.4g}")
                       for k, v in vals.items() if k in STAGE_UNITS or k == "span_overhead_ns"}
    t = pd.DataFrame(cols)
    t.insert(0, "unit", [STAGE_UNITS.get(k, "ns") for k in t.index])
    return t.rename_axis("parameter")
