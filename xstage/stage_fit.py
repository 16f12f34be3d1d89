"""The stage model's fit per link: one parameter set of :class:`xstage.stage_params.StageParams` fitted to all of a
link's records in a machine folder (:func:`observations`: the synchronised burst-gap sweep, the free-running sweep
``free_running/``, the trains ``burst_train``; a drain measured directly, ``drain_programs/``, is fixed), one rung of
the ladder at a time (:data:`RUNGS`; each link's full model :data:`FULL_RUNG`), by least squares on the simulated
trains (:mod:`xstage.stage_sim`), with cluster-robust intervals and errors on trains held out of the fit.

The simulation is what makes a fit slow: with ``workers`` > 1 the Jacobian's columns, the program counts and the
held-out folds run at once on a forked process pool (:class:`_PoolEval`; the same fit). The fits are written as
data/<machine>/stage_fit_<link>*.json.gz (:func:`write_stage_fit`), what :func:`xstage.model.load_params` reads.
"""
from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from . import env
from .data import BURST_GAP, BURST_TRAIN, DataError, legacy_read_bursts, load, paths, write_json_atomic
from .fit import tidy_for_fit
from .model import fit_file, read_fit
from .stage_params import NO_LIMIT_KIB, StageParams
from .stage_sim import models_read_fence, simulate_stage, stage_measure


# ================================================================================ the stage model, per link
# One parameter set per link predicts both regimes: the synchronised sweep (the grid's span per burst, gap =
# the requested gap + the harness's measured barrier time) and free-running trains (the median program's issue
# time per burst), regular (data/<machine>/free_running/) and irregular (burst_train). Residuals are
# log(predicted / measured) per (configuration, burst), soft-L1; each kind of record weighs alike in total.
# Intervals: Gauss-Newton with a covariance robust to residuals correlated within a configuration (sandwich,
# clustered by configuration). Held out: k folds by TRAIN (an irregular train is held out at every program
# count it ran at; a regular configuration is its own train), never by repeat.
LINK_TARGETS = {"nvlink": "remote", "host": "host", "local": "local"}   # local: the control (xstage calibrate)
STAGE_PARAMS = ["issue_ns_per_kib", "drain_gbps", "capacity_kib", "capacity_per_program_kib",
                "base_capacity_kib", "spread", "stalled_fraction", "overhead_ns", "span_overhead_ns"]
STAGE_UNITS = {"issue_ns_per_kib": "ns/KiB/program", "drain_gbps": "GB/s", "capacity_kib": "KiB",
               "capacity_per_program_kib": "KiB/program", "base_capacity_kib": "KiB", "spread": "1", "stalled_fraction": "1", "overhead_ns": "ns",
               "span_overhead_ns": "ns", "free_kib": "KiB/program",
               "free_cap_kib": "KiB/program"}
# (low, high) of each parameter; log-spaced except the fractions (logit)
STAGE_BOUNDS = {"issue_ns_per_kib": (0.5, 500.0), "drain_gbps": (1.0, 5000.0), "capacity_kib": (16.0, 1e6),
                "capacity_per_program_kib": (0.5, 1e5), "base_capacity_kib": (1.0, 1e5), "spread": (1e-4, 0.999), "stalled_fraction": (0.01, 0.999),
                "overhead_ns": (1.0, 1e4),
                "span_overhead_ns": (1.0, 1e4), "free_kib": (0.01, 256.0)}
STAGE_FIT_FILE = "stage_fit_{link}.json"          # the full model; other rungs: stage_fit_{link}_{rung}.json
STAGE_FIT_VERSION = 1
# the ladder, one rung per idea it adds; what each rung frees (the rest fixed: c_p -> no limit, spread -> 0,
# stalled_fraction -> 1):
#   fluid        the paper's three parameters (constant capacity, equal shares) run per program
#   capacity(P)  the capacity grows with the issuing programs: C(P) = C_0 + c_p P up to C_max
#   shares       the drain shared unequally (weights uniform on [1 - spread, 1])
#   pool         the stall: a stage that filled holds phi C(P) until it has emptied (one pool)
#   stage        every program's own slots (C(P) - C_0) beside a shared part C_0: NVLink's full model
#   free_store   the drain shared equally per GPC holding stores, and the first f KiB of every burst entering the
#                stage at once (up to F beyond the program's slots), fitted on the trains as the clean kernel
#                recorded them: the host link's full model
RUNGS = {"fluid": ("issue_ns_per_kib", "drain_gbps", "capacity_kib", "overhead_ns", "span_overhead_ns"),
         "capacity(P)": ("issue_ns_per_kib", "drain_gbps", "capacity_kib", "capacity_per_program_kib",
                         "base_capacity_kib", "overhead_ns", "span_overhead_ns"),
         "shares": ("issue_ns_per_kib", "drain_gbps", "capacity_kib", "capacity_per_program_kib",
                    "base_capacity_kib", "spread", "overhead_ns", "span_overhead_ns"),
         "pool": tuple(STAGE_PARAMS),
         "stage": tuple(STAGE_PARAMS),
         "free_store": (*STAGE_PARAMS, "free_kib")}
# how the stage is shared (xstage.model.StageParams.arbitration) per (rung, link); "pool" where not named
RUNG_ARBITRATION = {("stage", "host"): "slots", ("stage", "nvlink"): "slots", ("free_store", "host"): "gpc_drain"}
# the rung a rung starts from when fitted (its parameters read the same way); others start from "pool"
RUNG_START = {"free_store": "stage"}
TRAIN_CLEAN = "trains_clean"   # the fitted seed-0 trains recorded with the clean kernel (no read inside a burst)
RUNG_TRAINS = {"free_store": TRAIN_CLEAN}   # a rung's trains in place of the machine folder's own burst_train
# parameters a rung holds fixed beyond STAGE_PARAMS: free_store's bound F on what free entries may hold beyond a
# program's slots, from the clean probes (eleven 2 KiB probes issue freely after a contended lead: F >= 22 KiB)
RUNG_FIXED = {"free_store": {"free_cap_kib": 32.0}}
# the full model of each link: the fit written as stage_fit_<link>.json.gz, what xstage.model.load_params, the
# notebooks, the README and MegaMoE's cost model read; every other rung is written as stage_fit_<link>_<rung>.json.gz
FULL_RUNG = {"nvlink": "stage", "host": "free_store"}


def full_rung(link: str, rung: str | None = None) -> str:
    """``rung``, or where it is None the link's full model (:data:`FULL_RUNG`)."""
    return FULL_RUNG.get(link, "stage") if rung is None else rung


@dataclass
class Observations:
    """Every measured train of one link: configurations [N] and per-burst measurements [N, n] (NaN padded)."""

    cfgs: pd.DataFrame           # kind (sync / free / train), train (fold unit), programs, n_bursts, sm_count
    burst_bytes: np.ndarray      # [N, n] bytes per program (padding: one step, never measured)
    gap_ns: np.ndarray           # [N, n] gap after each burst (sync: + the harness's barrier time)
    measured: np.ndarray         # [N, n] ns: span (sync) or the median program's issue time (free, train)
    sources: dict                # record name -> file and sha256 (what the fit was made from)
    read_fence: np.ndarray | None = None   # [N, n] bool: bursts recorded with the legacy kernel's parameter read,
                                           # which waits behind the program's own stores (data.legacy_read_bursts)

    @property
    def sync(self) -> np.ndarray:
        return (self.cfgs.kind == "sync").to_numpy()

    def take(self, idx) -> "Observations":
        idx = np.asarray(idx)
        return Observations(self.cfgs.iloc[idx].reset_index(drop=True), self.burst_bytes[idx], self.gap_ns[idx],
                            self.measured[idx], self.sources,
                            None if self.read_fence is None else self.read_fence[idx])


# where a machine folder under data/ keeps the fitted records (a sweep's own output folder holds them at its root)
SWEEP_RECORD = "backpressure_sweep"   # the synchronised burst-gap sweep (schema burst_gap)
TRAIN_RECORD = "trains"               # the free-running trains (schema burst_train)


def record_dir(folder, name: str, schema):
    """``folder/name`` where it holds a ``schema`` record, else ``folder`` itself (a sweep's output folder)."""
    sub = Path(folder) / name
    return sub if paths(sub, schema)[0].is_file() else Path(folder)


def recorded_links(folder) -> list[str]:
    """The links a machine folder holds records of (nvlink: remote target; host: host target)."""
    try:
        df, _ = load(record_dir(folder, SWEEP_RECORD, BURST_GAP), BURST_GAP)
    except DataError as e:
        raise ValueError(f"{folder}: no burst-gap record to fit ({e})") from None
    have = [link for link, t in LINK_TARGETS.items() if (df.target == t).any()]
    if not have:
        raise ValueError(f"{folder}: the burst-gap record has no remote or host rows (targets: "
                         f"{sorted(set(df.target))})")
    return have


def observations(folder, link: str, store_bytes: int = 16, trains: str | None = None) -> Observations:
    """Observations of ``link`` from a machine folder: burst_gap (sync), free_running/burst_gap, burst_train.
    The train bursts of :func:`xstage.data.legacy_read_bursts` are marked in ``read_fence``: the fit simulates them
    with the legacy kernel's read wait (:func:`xstage.model.simulate_stage`'s ``read_fence``) where the arbitration
    has one (:func:`xstage.model.models_read_fence`). ``trains``: a subfolder whose
    burst_train record stands in for the folder's own (e.g. the same trains recorded with the clean kernel,
    :data:`RUNG_TRAINS`)."""
    if link not in LINK_TARGETS:
        raise ValueError(f"link must be one of {', '.join(LINK_TARGETS)}, got {link!r}")
    target = LINK_TARGETS[link]
    folder = Path(folder)
    if link not in recorded_links(folder):
        raise ValueError(f"{folder}: no {link} rows (target {target!r}) in its burst-gap record")
    parts, sources = [], {}
    sm = 132

    def train_medians(sel, meta):   # a train record's median over runs per burst
        return sel.groupby(["train", "programs", "burst"], as_index=False).agg(
            burst_bytes=("burst_bytes", "first"), gap_ns=("gap_ns", "first"), issue_ns=("issue_ns", "median"))

    def fences(sel, meta):   # the bursts with the legacy kernel's read (simulated even where left unmeasured)
        return legacy_read_bursts(meta, int(sel.burst.max()) + 1)

    def add(kind, name, t, meas_col, gap_col, fenced=()):
        for key, g in t.groupby(["train", "programs"], sort=False):
            g = g.sort_values("burst")
            parts.append((kind, key[0], int(key[1]), g.burst_bytes.to_numpy(float), g[gap_col].to_numpy(float),
                          g[meas_col].to_numpy(float), g.burst.isin(fenced).to_numpy()))

    sweep = record_dir(folder, SWEEP_RECORD, BURST_GAP)
    df, meta = load(sweep, BURST_GAP)
    sm = int(meta.get("sm_count", sm) or sm)
    sources["burst_gap"] = dict(file=str(paths(sweep, BURST_GAP)[0].relative_to(folder)),
                                sha256=meta.get("csv_sha256"))
    t = tidy_for_fit(df, target, store_bytes, "span_ns")
    t = t[t.sync.astype(bool)]
    t["train"] = "sync:" + t.programs.astype(str) + ":" + t.burst_bytes.astype(str) + ":" + t.gap_ns.astype(str)
    add("sync", "burst_gap", t, "issue_ns", "gap_eff_ns")
    fr = folder / "free_running"
    if paths(fr, BURST_GAP)[0].is_file():
        df, meta = load(fr, BURST_GAP)
        sources["free_running"] = dict(file="free_running/" + paths(fr, BURST_GAP)[0].name,
                                       sha256=meta.get("csv_sha256"))
        t = tidy_for_fit(df, target, store_bytes, "issue_ns")
        t = t[~t.sync.astype(bool)]
        t["train"] = "free:" + t.programs.astype(str) + ":" + t.burst_bytes.astype(str) + ":" + t.gap_ns.astype(str)
        add("free", "free_running", t, "issue_ns", "gap_ns")
    tr_dir = folder / trains if trains else record_dir(folder, TRAIN_RECORD, BURST_TRAIN)
    if trains and not paths(tr_dir, BURST_TRAIN)[0].is_file():
        raise ValueError(f"{tr_dir}: no burst_train record to fit in place of {folder.name}'s own")
    if paths(tr_dir, BURST_TRAIN)[0].is_file():
        df, meta = load(tr_dir, BURST_TRAIN)
        sel = df[(df.target == target) & (df.store_bytes == store_bytes)]
        if trains and sel.empty:
            raise ValueError(f"{tr_dir}: no {link} trains (target {target!r}) in its burst_train record")
        if len(sel):
            name = paths(tr_dir, BURST_TRAIN)[0].name
            sources["burst_train"] = dict(file=f"{trains}/{name}" if trains else str((tr_dir / name).relative_to(folder)),
                                          sha256=meta.get("csv_sha256"))
            add("train", "burst_train", train_medians(sel, meta), "issue_ns", "gap_ns", fences(sel, meta))
    n = max(len(p[3]) for p in parts)
    N = len(parts)
    b = np.full((N, n), 2048.0)
    g = np.zeros((N, n))
    m = np.full((N, n), np.nan)
    fence = np.zeros((N, n), bool)
    for i, (_, _, _, bb, gg, mm, ff) in enumerate(parts):
        b[i, :len(bb)], g[i, :len(gg)], m[i, :len(mm)], fence[i, :len(ff)] = bb, gg, mm, ff
    m = np.where(m > 0, m, np.nan)
    cfgs = pd.DataFrame({"kind": [p[0] for p in parts], "train": [p[1] for p in parts],
                         "programs": [p[2] for p in parts], "n_bursts": [len(p[3]) for p in parts]})
    cfgs["sm_count"] = sm
    return Observations(cfgs, b, g, m, sources, fence)


def _stage_params(x, free, fixed, sm_count, link) -> "StageParams":
    v = dict(fixed)
    for name, xi in zip(free, x):
        v[name] = float(1 / (1 + np.exp(-xi))) if name in LOGIT else float(np.exp(xi))
    span_o = v.pop("span_overhead_ns")
    prm = StageParams(**v, sm_count=sm_count, link=link)
    return prm, span_o


STAGE_FIT_MIN_NS = 300.0                 # bursts measured shorter than this are the harness (timer reads, CTA
                                         # barriers) more than the link: left out of the fit (the scores count >= 1 us)
STAGE_F_SCALE = 0.1                      # soft-L1 scale of the log residuals (errors beyond ~10 % count ~linearly)
LOGIT = ("spread", "stalled_fraction")   # fitted in logit space (fractions); the rest in log space


def _to_x(name, v):
    return np.log(v / (1 - v)) if name in LOGIT else np.log(v)


def predict_observations(obs: Observations, prm, span_overhead_ns: float, barrier_drains=True) -> np.ndarray:
    """Predicted [N, n] for every observation (the span's fixed cost added to sync rows); ``barrier_drains``
    as :func:`xstage.model.simulate_stage` takes it (False: the relaxed-barrier harness)."""
    fence = obs.read_fence if models_read_fence(prm) else None
    start, end, m = simulate_stage(prm, obs.cfgs.programs.to_numpy(), obs.burst_bytes, obs.gap_ns, obs.sync,
                                   barrier_drains=barrier_drains, read_fence=fence)
    pred = stage_measure(start, end, obs.sync, m)
    return np.where(obs.sync[:, None], pred - prm.overhead_ns + span_overhead_ns, pred)


def _weights(obs: Observations) -> np.ndarray:
    """Per-observation weight: every kind of record weighs alike in total (sqrt for least squares)."""
    counts = obs.cfgs.kind.value_counts()
    return np.sqrt((1.0 / obs.cfgs.kind.map(counts)).to_numpy() * len(counts) ** -1 * len(obs.cfgs))


# ---------------------------------------------------------------- parallel evaluation of the fit (workers > 1)
# What makes a stage fit slow is the simulation: one prediction of every observation of the host link's records
# takes ~4 s on one core (arbitration gpc_drain: up to 128 groups per grid), and every Jacobian of the ~10 free
# parameters costs one prediction per parameter. With ``workers`` > 1 the fit evaluates the Jacobian's columns and
# the observations' program counts (chunks) at once on a process pool; the folds of the held-out refits run side by
# side on the same pool. The result is the same fit (the same forward differences as least_squares' own).
_POOL_STATE: dict = {}


def _pool_init(obs, free, fixed, link):
    _POOL_STATE.update(obs=obs, free=free, fixed=fixed, link=link, sm=int(obs.cfgs.sm_count.iloc[0]))


def _pool_predict(x, rows):
    """Worker: predictions [len(rows), n] of the pool's observations ``rows`` at transformed parameters x."""
    st = _POOL_STATE
    prm, so = _stage_params(x, st["free"], st["fixed"], st["sm"], st["link"])
    return predict_observations(st["obs"].take(rows), prm, so)


class _PoolEval:
    """Predictions of a subset ``rows`` of the pool's observations at many parameter points at once: one task per
    (point, program count, piece of at most CHUNK configurations) on ``pool`` (a ProcessPoolExecutor started with
    :func:`_pool_init`)."""

    CHUNK = 16

    def __init__(self, pool, obs_all: "Observations", rows):
        self.pool, self.rows = pool, np.asarray(rows)
        P = obs_all.cfgs.programs.to_numpy()[self.rows]
        # positions within rows: per program count (one simulation batch), split into pieces of at most CHUNK
        self.chunks = [c for p in np.unique(P) for c in np.array_split(np.flatnonzero(P == p),
                                                                      -(-int((P == p).sum()) // self.CHUNK))]
        self.n = obs_all.measured.shape[1]

    def predict(self, xs) -> list[np.ndarray]:
        futs = [[self.pool.submit(_pool_predict, x, self.rows[c]) for c in self.chunks] for x in xs]
        out = []
        for fs in futs:
            pred = np.empty((len(self.rows), self.n))
            for c, f in zip(self.chunks, fs):
                pred[c] = f.result()
            out.append(pred)
        return out


def default_workers() -> int:
    """Processes a fit may use: the CPUs this process may run on (at least 1)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:   # not Linux
        return max(os.cpu_count() or 1, 1)


def _stage_solve(obs, x0, free, fixed, link, max_nfev=40, prescan: bool = False, ev: _PoolEval | None = None,
                 polish: int = 0):
    with np.errstate(invalid="ignore"):
        mask = np.isfinite(obs.measured) & (obs.measured >= STAGE_FIT_MIN_NS)
    w = np.broadcast_to(_weights(obs)[:, None], obs.measured.shape)[mask]
    lo = np.array([_to_x(k, STAGE_BOUNDS[k][0]) for k in free])
    hi = np.array([_to_x(k, STAGE_BOUNDS[k][1]) for k in free])
    sm = int(obs.cfgs.sm_count.iloc[0])
    logm = np.log(obs.measured)

    def from_pred(pred):
        return w * (np.log(np.maximum(pred, 1e-3)) - logm)[mask]

    last = {}   # the last residuals (least squares asks for the Jacobian where it has just evaluated them)

    def resid(x):
        if ev is not None:
            r = from_pred(ev.predict([x])[0])
        else:
            prm, so = _stage_params(x, free, fixed, sm, link)
            r = from_pred(predict_observations(obs, prm, so))
        last.update(x=np.array(x, copy=True), r=r)
        return r

    def resids(xs):   # residuals at many points: at once on the pool, else one after another
        return [from_pred(p) for p in ev.predict(xs)] if ev is not None else [resid(x) for x in xs]

    def jac(x):   # forward differences, steps 1e-3 * max(1, |x|) (turned back at the bounds), all points at once
        # (scipy's "2-point" with diff_step steps 1e-3 * |x|: 2.5e-5 for a spread near 0.5, where the cost is flat)
        h = 1e-3 * np.where(x >= 0, 1.0, -1.0) * np.maximum(1.0, np.abs(x))
        h = np.where((x + h > hi) | (x + h < lo), -h, h)
        pts = [x + np.eye(len(x))[i] * h[i] for i in range(len(x))]
        f0 = last["r"] if "x" in last and np.array_equal(last["x"], x) else resid(x)
        dx = np.array([pts[i][i] - x[i] for i in range(len(x))])
        return np.stack([(fi - f0) / dx[i] for i, fi in enumerate(resids(pts))], axis=1)

    x0 = np.clip(x0, lo + 1e-6, hi - 1e-6)
    # prescan: the arbitration spread and the stall move the cost in steps (which program queues behind which),
    # where a gradient step stalls: start from the best point of a coarse grid over them (the rest as given)
    scan = [i for i, k in enumerate(free) if k in PRESCAN] if prescan else []
    if scan:
        grid = [x0]
        for vals in itertools.product(*(PRESCAN[free[i]] for i in scan)):
            x = x0.copy()
            x[scan] = [_to_x(free[i], v) for i, v in zip(scan, vals)]
            grid.append(x)
        costs = [_soft_l1(r) for r in resids(grid)]
        x0 = grid[int(np.argmin(costs))]
    def solve(x_start, nfev):
        return least_squares(resid, x_start, jac=jac, loss="soft_l1", f_scale=STAGE_F_SCALE, method="trf",
                             x_scale=1.0, max_nfev=nfev, bounds=(lo, hi))

    sol = solve(x0, max_nfev)
    idx = [i for i, k in enumerate(free) if k in POLISH] if polish else []
    if idx:
        sol = _polish(sol, idx, lo, hi, polish, resids, solve)
    return sol, mask


def _soft_l1(r) -> float:
    """The cost least_squares minimises with loss="soft_l1" and f_scale STAGE_F_SCALE."""
    z = (np.asarray(r) / STAGE_F_SCALE) ** 2
    return float(0.5 * STAGE_F_SCALE ** 2 * (2 * (np.sqrt(1 + z) - 1)).sum())


def _polish(sol, idx, lo, hi, rounds, resids, solve):
    """A pattern search over the parameters where the cost moves in steps (:data:`POLISH`), from least squares'
    optimum: each round tries every such parameter POLISH_STEPS up and down (transformed coordinates, all points at
    once on the pool) and moves to the best point that lowers the cost; then least squares again (POLISH_NFEV
    steps) from there. The result is the lower-cost of the two solutions. ``resids(points)``: the residuals at
    each point; ``solve(x, nfev)``: least squares from x."""
    x, c = sol.x.copy(), _soft_l1(sol.fun)
    moved = False
    for _ in range(int(rounds)):
        pts = []
        for i in idx:
            for h in POLISH_STEPS:
                for sgn in (1.0, -1.0):
                    y = x.copy()
                    y[i] = np.clip(y[i] + sgn * h, lo[i] + 1e-6, hi[i] - 1e-6)
                    pts.append(y)
        cs = [_soft_l1(r) for r in resids(pts)]
        j = int(np.argmin(cs))
        if cs[j] >= c:
            break
        x, c, moved = pts[j], cs[j], True
    if not moved:
        return sol
    again = solve(x, POLISH_NFEV)
    return again if again.cost <= sol.cost else sol


# the parameters whose cost moves in steps (which program queues behind which), where least squares' gradient steps
# stall (a simulated calibration started 5 % away: base capacity and stall stay +5.6 / +5.8 % off; the truth's cost
# is a third of that end point's): the polish's pattern search over them (:func:`_polish`)
POLISH = ("base_capacity_kib", "stalled_fraction", "spread", "overhead_ns")
POLISH_STEPS = (0.01, 0.03, 0.06)   # in the transformed coordinates (log or logit): about 1, 3 and 6 %
POLISH_NFEV = 8


PRESCAN = {"spread": (0.3, 0.5, 0.7, 0.85), "stalled_fraction": (0.3, 0.55, 0.8)}   # the coarse start grid


def _rung_params(rung: str) -> list[str]:
    """STAGE_PARAMS and the rung's own parameters beyond them (RUNGS; "free_store": free_kib)."""
    return [*STAGE_PARAMS, *(k for k in RUNGS.get(rung, ()) if k not in STAGE_PARAMS)]


@dataclass
class StageFit:
    link: str
    rung: str
    params: "StageParams"
    span_overhead_ns: float
    ci_low: dict
    ci_high: dict
    table: pd.DataFrame = field(repr=False)       # per (observation, burst): measured, predicted (in-sample)
    heldout: pd.DataFrame = field(repr=False)     # the same, each train predicted by a fit without it
    sources: dict = field(default_factory=dict)
    folder: str = ""

    def values(self) -> dict:
        return {**{k: getattr(self.params, k) for k in _rung_params(self.rung) if k != "span_overhead_ns"},
                "span_overhead_ns": self.span_overhead_ns}


def _long(obs: Observations, pred: np.ndarray) -> pd.DataFrame:
    n = obs.measured.shape[1]
    rows = obs.cfgs.loc[obs.cfgs.index.repeat(n)].reset_index(drop=True)
    rows["burst"] = np.tile(np.arange(n), len(obs.cfgs))
    rows["burst_bytes"] = obs.burst_bytes.ravel()
    rows["gap_ns"] = obs.gap_ns.ravel()
    rows["measured_ns"] = obs.measured.ravel()
    rows["predicted_ns"] = pred.ravel()
    rows = rows.dropna(subset=["measured_ns"]).reset_index(drop=True)
    rows["rel_error"] = rows.predicted_ns / rows.measured_ns - 1
    return rows


def _initial(rung: str, link: str) -> dict:
    """Starting values, rounded from each link's records (the same for every fit of that link)."""
    if link == "host":   # read off the host record (docs/findings.md): D 53 GB/s, 1-2.5 MB absorbed
        d = dict(issue_ns_per_kib=18.0, drain_gbps=53.0, capacity_kib=2500.0, capacity_per_program_kib=30.0,
                 base_capacity_kib=1000.0, spread=0.5, stalled_fraction=0.4, overhead_ns=24.0, span_overhead_ns=230.0)
    else:
        d = dict(issue_ns_per_kib=18.0, drain_gbps=360.0, capacity_kib=14000.0, capacity_per_program_kib=17.0,
                 base_capacity_kib=160.0, spread=0.6, stalled_fraction=0.7, overhead_ns=27.0, span_overhead_ns=235.0)
    if rung not in ("shares", "pool", "stage"):
        d["spread"] = 0.0
    if rung not in ("pool", "stage"):
        d["stalled_fraction"] = 1.0
    if rung == "free_store":
        d["free_kib"] = 2.0   # the clean probes: a 2 KiB burst (one 16-byte store per thread) issues freely
    if rung == "fluid":
        d["capacity_per_program_kib"] = NO_LIMIT_KIB
        d["capacity_kib"] = 1000.0
        d["base_capacity_kib"] = 0.0
    return d


def measured_drain(folder, link: str) -> dict | None:
    """The link's drain rate measured directly, when ``folder`` holds the record of long bursts each followed by
    a system-scope fence (``drain_programs/``, ``xstage sweep burst-gap --drain``): per program count, the bytes
    of the largest bursts over the time until the last program's stores are performed (median over bursts and
    repeats); D = the median over program counts, its interval the range over them. None without the record.
    A measured D is not fitted (the fit otherwise trades it against the stall and the capacity)."""
    sub = Path(folder) / DRAIN_RECORD
    if not paths(sub, BURST_GAP)[0].is_file():
        return None
    df, meta = load(sub, BURST_GAP)
    df = df[(df.target == LINK_TARGETS[link]) & df.drain.astype(bool)]
    if df.empty:
        return None
    df = df[df.burst_bytes == df.burst_bytes.max()]
    per_p = (df.programs * df.burst_bytes / (df.issue_ns_max + df.drain_ns_max)).groupby(df.programs).median()
    return {"drain_gbps": float(per_p.median()), "low": float(per_p.min()), "high": float(per_p.max()),
            "programs": [int(p) for p in per_p.index],
            "source": dict(file=f"{DRAIN_RECORD}/{paths(sub, BURST_GAP)[0].name}", sha256=meta.get("csv_sha256"))}


DRAIN_RECORD = "drain_programs"


def fit_stage(obs: Observations, link: str, rung: str | None = None, k_folds: int = 5, seed: int = 0,
              max_nfev: int = 40, measured: dict | None = None, start: dict | None = None, workers: int = 1,
              prescan: bool = True, progress=None, fold_nfev: int | None = None, polish: int = 0) -> StageFit:
    """Fit one rung of the ladder to a link's observations; intervals and held-out-by-train errors.
    ``measured``: {parameter: (value, low, high)} measured directly (e.g. :func:`measured_drain`): fixed, with
    that interval. ``start``: starting values (e.g. the rung below's fit) instead of the link's read-off ones.
    ``rung`` None: the link's full model (:data:`FULL_RUNG`). ``workers`` > 1: the simulations on that many
    processes (the Jacobian's columns, the program counts and the folds at once; the same fit). ``prescan``: also
    start from the best point of a coarse grid over spread and stall, the lower final cost winning (False: the
    given start alone, for a start that is already near, e.g. another card's fit). ``progress``: called with a
    short label after each step (the fit, each fold). ``fold_nfev``: least-squares steps of each held-out refit
    from the optimum (None: max(max_nfev // 3, min(10, max_nfev))). ``polish``: rounds of the pattern search over
    :data:`POLISH` after least squares (:func:`_polish`; 0: none), on the fit (each held-out refit starts from its
    optimum: least squares alone)."""
    rung = full_rung(link, rung)
    if rung not in RUNGS:
        raise ValueError(f"rung must be one of {', '.join(RUNGS)}, got {rung!r}")
    if int(workers) < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    measured = measured or {}
    free = [k for k in RUNGS[rung] if k not in measured]
    init = {**_initial(rung, link), **(start or {}), **RUNG_FIXED.get(rung, {}),
            **{k: v[0] for k, v in measured.items()}}
    fixed = {k: v for k, v in init.items() if k not in free}
    fixed["arbitration"] = RUNG_ARBITRATION.get((rung, link), "pool")
    x0 = np.array([_to_x(k, init[k]) for k in free])
    step = progress or (lambda label: None)
    pool = None
    if int(workers) > 1:   # forked workers (the observations and the rung at start), all started here, before threads
        pool = ProcessPoolExecutor(int(workers), mp_context=multiprocessing.get_context("fork"),
                                   initializer=_pool_init, initargs=(obs, free, fixed, link))
        list(pool.map(time.sleep, [0.02] * int(workers)))
    try:
        def solve(rows, x_start, nfev, scan=False, rounds=0):
            o = obs if rows is None else obs.take(rows)
            ev = None if pool is None else _PoolEval(pool, obs, np.arange(len(obs.cfgs)) if rows is None else rows)
            return _stage_solve(o, x_start, free, fixed, link, nfev, prescan=scan, ev=ev, polish=rounds)

        second = prescan and any(k in PRESCAN for k in free)   # a second start from the coarse grid
        with ThreadPoolExecutor(2 if pool is not None else 1) as th:
            runs = [th.submit(solve, None, x0, max_nfev, False, polish)] + (
                [th.submit(solve, None, x0, max_nfev, True, polish)] if second else [])
            sols = [r.result() for r in runs]
        sol, mask = min(sols, key=lambda s: s[0].cost)   # the lower final cost wins (the first on a tie)
        step("fit")
        sm = int(obs.cfgs.sm_count.iloc[0])
        prm, so = _stage_params(sol.x, free, fixed, sm, link)
        lo, hi = _intervals(obs, sol, mask, free, fixed, measured)
        table = _long(obs, predict_observations(obs, prm, so))
        # held out by train: folds over train names (sync / free configurations are their own trains)
        names = obs.cfgs.train.unique()
        fold_of = dict(zip(names, np.random.default_rng(seed).permutation(len(names)) % k_folds))
        fold = obs.cfgs.train.map(fold_of).to_numpy()

        def held_out(f):
            tr, te = np.flatnonzero(fold != f), np.flatnonzero(fold == f)
            if not len(te):
                return None
            s_f, _ = solve(tr, sol.x, fold_nfev or max(max_nfev // 3, min(10, max_nfev)))
            p_f, so_f = _stage_params(s_f.x, free, fixed, sm, link)
            o_te = obs.take(te)
            part = _long(o_te, predict_observations(o_te, p_f, so_f))
            part["fold"] = f
            step(f"fold {f + 1}/{k_folds}")
            return part

        with ThreadPoolExecutor(k_folds if pool is not None else 1) as th:
            parts = [p for p in th.map(held_out, range(k_folds)) if p is not None]
    finally:
        if pool is not None:
            pool.shutdown()
    heldout = pd.concat(parts, ignore_index=True)
    return StageFit(link, rung, prm, so, lo, hi, table, heldout, obs.sources)


def _intervals(obs, sol, mask, free, fixed, measured) -> tuple[dict, dict]:
    """95 % intervals: cluster-robust (by configuration) Gauss-Newton covariance of the transformed parameters at
    the optimum; fixed parameters their value, measured ones their measured range."""
    J = sol.jac
    r = sol.fun
    cluster = np.broadcast_to(np.arange(len(obs.cfgs))[:, None], obs.measured.shape)[mask]
    bread = np.linalg.pinv(J.T @ J)
    meat = np.zeros_like(bread)
    for c in np.unique(cluster):
        s = (J[cluster == c] * r[cluster == c][:, None]).sum(axis=0)
        meat += np.outer(s, s)
    se = np.sqrt(np.maximum(np.diag(bread @ meat @ bread), 0.0))
    lo, hi = {}, {}
    for name, xi, s in zip(free, sol.x, se):
        a, b = _to_x(name, STAGE_BOUNDS[name][0]), _to_x(name, STAGE_BOUNDS[name][1])
        f = (lambda z: 1 / (1 + np.exp(-z))) if name in LOGIT else np.exp
        lo[name], hi[name] = float(f(max(xi - 1.96 * s, a))), float(f(min(xi + 1.96 * s, b)))
    for name in fixed:
        if name != "arbitration":
            lo[name] = hi[name] = float(fixed[name])
    for name, (_, low, high) in measured.items():
        lo[name], hi[name] = float(low), float(high)
    return lo, hi


def fit_link(folder, link: str, rung: str | None = None, k_folds: int = 5) -> StageFit:
    """Fit a rung (None: the link's full model, :data:`FULL_RUNG`) to a machine folder's records of ``link``; a
    drain measured directly there is fixed."""
    rung = full_rung(link, rung)
    obs = observations(folder, link, trains=RUNG_TRAINS.get(rung))
    d = measured_drain(folder, link)
    measured = {}
    if d is not None:
        measured["drain_gbps"] = (d["drain_gbps"], d["low"], d["high"])
        obs.sources["drain_programs"] = d["source"]
    start = None
    if RUNG_ARBITRATION.get((rung, link), "pool") != "pool":
        # the slots model has the pool's parameters, read differently: it starts from the pool rung's fit (its
        # cost moves in steps; from the read-off values it stalls in a worse minimum: docs/findings.md)
        below = fit_file(Path(folder) / stage_fit_name(link, RUNG_START.get(rung, "pool")))
        if below.is_file():
            f = read_stage_fit(folder, link, RUNG_START.get(rung, "pool"))
            start = {k: float(f["params"][k]) for k in RUNGS[rung] if k in f["params"]}
            start["span_overhead_ns"] = float(f["span_overhead_ns"])
            obs.sources["start"] = dict(file=below.name)
    res = fit_stage(obs, link, rung, k_folds, measured=measured, start=start)
    res.folder = str(folder)
    return res


def error_summary(t: pd.DataFrame, min_ns: float = 1000.0) -> pd.DataFrame:
    """Median and p90 |relative error| per kind of record (bursts of at least ``min_ns`` measured)."""
    t = t[t.measured_ns >= min_ns]
    g = t.assign(abs_err=t.rel_error.abs()).groupby("kind")["abs_err"]
    return pd.DataFrame({"median_abs_error": g.median(), "p90_abs_error": g.quantile(0.9), "bursts": g.size()})


def stage_summary(res: StageFit) -> pd.DataFrame:
    """Parameters with 95 % intervals, then the held-out errors per kind of record."""
    v = res.values()
    rows = [dict(parameter=k, value=v[k], ci95_low=res.ci_low[k], ci95_high=res.ci_high[k], unit=STAGE_UNITS[k])
            for k in _rung_params(res.rung)]
    for kind, r in error_summary(res.heldout).iterrows():
        rows.append(dict(parameter=f"heldout_{kind}_median_abs_error", value=r.median_abs_error,
                         ci95_low=np.nan, ci95_high=r.p90_abs_error, unit="fraction (ci95_high: p90)"))
    return pd.DataFrame(rows)


def stage_fit_name(link: str, rung: str | None = None) -> str:
    """The file of ``rung``'s fit of ``link``: stage_fit_<link>.json for the link's full model (:data:`FULL_RUNG`;
    ``rung`` None), stage_fit_<link>_<rung>.json for every other rung."""
    rung = full_rung(link, rung)
    return (STAGE_FIT_FILE.format(link=link) if rung == full_rung(link)
            else f"stage_fit_{link}_{rung.replace('(P)', '_p')}.json")


def read_stage_fit(folder, link: str, rung: str | None = None) -> dict:
    """A written fit (:func:`write_stage_fit`; ``rung`` None: the link's full model) with its tables as DataFrames;
    ValueError when absent, stale, or of another rung than its name says."""
    obj = read_fit(Path(folder) / stage_fit_name(link, rung), link)
    if obj.get("kind") != "stage_fit" or obj.get("version") != STAGE_FIT_VERSION:
        raise ValueError(f"{folder}/{stage_fit_name(link, rung)} is not a v{STAGE_FIT_VERSION} stage fit")
    if obj.get("rung", "stage") != full_rung(link, rung):
        raise ValueError(f"{folder}/{stage_fit_name(link, rung)} holds rung {obj.get('rung')!r}, not "
                         f"{full_rung(link, rung)!r}: refit (xstage fit --data {folder} --link {link} --rung "
                         f"{full_rung(link, rung)} --write)")
    obj["table"] = pd.DataFrame(obj["table"])
    obj["heldout_table"] = pd.DataFrame(obj["heldout_table"])
    for t in (obj["table"], obj["heldout_table"]):
        t["rel_error"] = t.predicted_ns / t.measured_ns - 1
    return obj


def write_stage_fit(res: StageFit, folder, command: str = "") -> str:
    """The fit as data/<machine>/stage_fit_<link>.json: parameters, intervals, held-out errors, and what it
    was fitted from (file names and sha256), which :func:`xstage.model.load_params` checks."""
    plain = Path(folder) / stage_fit_name(res.link, res.rung)
    path = plain.with_name(plain.name + ".gz")   # the per-burst tables: ~1 MB as JSON, ~10x less compressed
    err = error_summary(res.heldout)
    cols = ["kind", "train", "programs", "burst", "burst_bytes", "gap_ns", "measured_ns", "predicted_ns"]
    obj = {"kind": "stage_fit", "version": STAGE_FIT_VERSION, "link": res.link, "rung": res.rung,
           "params": res.params.as_dict(), "span_overhead_ns": res.span_overhead_ns,
           "ci95_low": res.ci_low, "ci95_high": res.ci_high, "sources": res.sources,
           "heldout": json.loads(err.to_json(orient="index")),
           "table": res.table[cols].round(1).to_dict(orient="list"),
           "heldout_table": res.heldout[cols + ["fold"]].round(1).to_dict(orient="list"),
           "provenance": {k: v for k, v in env.provenance(command, {}).items()
                          if k in ("git_commit", "date_utc", "command", "python", "torch")}}
    write_json_atomic(path, obj, indent=None)   # the tables make it large: compact
    plain.unlink(missing_ok=True)                # read_fit would prefer a stale uncompressed file
    return str(path)
