"""MegaMoE's cost model on recorded rows: what the X-Stage can explain of a schedule's time (``order_cost``), the
current model re-predicting a record (``revised_model``, ``repredicted_speedups``), with each link's stage model
(``stage_model``) and, on the one-H200 host-link record, under each stall model and the host link's full model
(``stall_rescore``, ``host_full_model``). Computed from the records and xstage.moe_plan, never measured.
"""
from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np
import pandas as pd

from . import data
from .megamoe_analysis import BASELINE, KEYS, MODEL_TOLERANCE, speedups, world_data
from .model import BurstGapParams, load_params, params_from_dict
from .moe_plan import (CASES, OUT_DTYPES, CostModel, MoECase, TaskList, TileConfig, TileGrid, calibrate_rate,
                       predict_kernel_ns, record_stall, record_wait, routing_of, schedule_of_param, tiles_of_row)
from .numeric import geomean
from .sources import LINK_MACHINES
from .traffic import TRAFFIC_RANKS, PlayedWorld, TrafficWorld, egress

STALL_MODELS_SCORED = ("issuers", "round", "round_shared")   # the stall models the host record is rescored under


# -------------------------------------------------------- the cost model on recorded rows (rebuilt lists)
@functools.lru_cache(maxsize=4096)
def _recorded_task_list(case: MoECase, P: int, r: int, tiles: TileConfig, n_sms: int, schedule: str,
                        param: str) -> tuple[TaskList, np.ndarray]:
    """Rank ``r``'s task list of a recorded row (:func:`schedule_of_param` on the seeded routing's grid) and its
    remote rows per block. Independent of the stage parameters, so memoised: every re-prediction of the same
    record (another parameter set, another wait model) reuses the lists the first one built and checked."""
    s = case.shape
    layouts = _layouts_of(case, P)
    grid = TileGrid.of(layouts[r], s.hidden, s.intermediate, tiles)
    return schedule_of_param(schedule, param, grid, n_sms), grid.remote_rows_per_block(layouts[r])


@functools.lru_cache(maxsize=256)
def _layouts_of(case: MoECase, P: int) -> tuple:
    return tuple(routing_of(case, P)[2])


def repredict(df: pd.DataFrame, prm: BurstGapParams, n_sms: int, assignment: str = "static",
              wait: str | None = None, stall: str | None = None, recorded: str | None = None,
              observed_rank: int | None = None) -> pd.DataFrame:
    """The current ``predict_kernel_ns`` applied to recorded MegaMoE rows (a model, computed, never measured):
    per configuration and dtype, every rank's task list is rebuilt from the seeded routing (model_guided: the
    recorded choice), the per-program GEMM rate calibrated on the recorded compute-only time, and the prediction
    taken as the maximum over ranks. ``assignment``: predict as if the kernel had assigned tasks so (``dynamic``
    on static records: what a dynamic run should show, with the static compute-only calibration); ``recorded``: the
    assignment the rows' compute-only time was measured under, which the rate is calibrated with (None: ``assignment``,
    as the sweep calibrates). Returns the
    rows' keys + schedule with ``model_ms`` and ``model_speedup`` (expert_wave / schedule) and ``imbalance``
    (busiest program / mean, max over ranks). ``wait``: the wait model (None: WAIT_DEFAULT of ``assignment``);
    ``stall``: the stall model (None: STALL_DEFAULT). ``observed_rank``: the rows are that rank's times alone (a
    one-GPU record: its ranks run one after another and only the observed rank is timed, sidecar
    ``params.observed_rank``): its compute-only time calibrates that rank's rate and the prediction is that rank's,
    not the maximum over ranks."""
    cases = {(c.shape.name, c.tokens, c.routing): c for c in CASES}
    out = []
    keys = ["shape", "tokens", "routing", "P", "dtype"]
    for (name, tokens, routing, P, dtype), g in df.groupby(keys, sort=False):
        c = cases.get((name, tokens, routing))
        if c is None:
            raise ValueError(f"{name} T={tokens} {routing} is not one of the 84 configurations")
        s = c.shape
        rows = g.drop_duplicates("schedule").set_index("schedule")
        tiles = tiles_of_row(rows.iloc[0])     # the tiles the row ran with (the first kernels' rows: theirs)
        out_bytes = OUT_DTYPES[dtype].itemsize
        pred: dict[str, list] = {}
        if observed_rank is not None and not 0 <= int(observed_rank) < int(P):
            raise ValueError(f"observed_rank {observed_rank} is not a rank of a {int(P)}-rank world")
        for r in (range(int(P)) if observed_rank is None else (int(observed_rank),)):
            ew, remote = _recorded_task_list(c, int(P), r, tiles, n_sms, "expert_wave",
                                             str(rows.schedule_param.get("expert_wave", "")))
            rate = calibrate_rate(ew, s.hidden, s.intermediate, tiles, n_sms, float(rows.compute_ms.iloc[0]),
                                  recorded or assignment, wait)
            cost = CostModel(prm, rate, n_sms, out_bytes, assignment, wait, stall)
            for sched, row in rows.iterrows():
                par = str(row.schedule_param)
                if sched == "model_guided":   # the recorded choice of this rank ("a|b": rank 0's, rank 1's)
                    ch = par.split("|")
                    par = ch[r] if len(ch) == int(P) else ch[0]
                try:
                    tl_ = ew if sched == "expert_wave" else _recorded_task_list(c, int(P), r, tiles, n_sms,
                                                                                sched, par)[0]
                except ValueError as e:
                    raise ValueError(f"{name} T={tokens} {routing} {dtype}: {e}") from e
                p = predict_kernel_ns(tl_, remote, cost, s.hidden, s.intermediate, tiles)
                pred.setdefault(sched, []).append((p["total_ns"] / 1e6, p["imbalance"]))
        base = max(t for t, _ in pred["expert_wave"]) if "expert_wave" in pred else float("nan")
        for sched, v in pred.items():
            ms = max(t for t, _ in v)
            out.append(dict(zip(keys, (name, tokens, routing, P, dtype)), schedule=sched, model_ms=ms,
                            model_speedup=base / ms, imbalance=max(i for _, i in v)))
    return pd.DataFrame(out)


def order_cost(df: pd.DataFrame, drain_gbps: float) -> pd.DataFrame:
    """Can the X-Stage explain a schedule's kernel time difference from Expert-Wave? Per configuration, dtype and
    compared schedule (from :func:`speedups`):

      extra_ms        this schedule's kernel_ms - Expert-Wave's (positive: slower)
      drain_ms        the busiest rank's remote combine bytes / ``drain_gbps``: the time the stage needs to drain
                      the whole combine. Even with every remote store serialised behind the drain, a schedule
                      can gain or lose at most about this much through the X-Stage
      beyond_stage    |extra_ms| > drain_ms: the difference is something else (tile order, waits, caches)
      ew_comm_share   Expert-Wave's kernel_ms / compute_ms - 1: what its remote combine costs over the same
                      kernel with every store local (0: the combine is hidden already; nothing left to win)
      order_ms        this schedule's compute-only control - Expert-Wave's (``compute_sched_ms``; NaN in
                      records without it): the difference its tile order makes without any remote store
      comm_ms         kernel_ms - compute_sched_ms: what the remote combine costs this schedule (else NaN)

    ``drain_gbps``: the Burst-Gap drain rate the sweep predicted with (``meta['params']['prm']``)."""
    if not drain_gbps > 0:
        raise ValueError(f"drain_gbps must be > 0, got {drain_gbps}")
    sp = speedups(df)
    remote = df.groupby(KEYS).remote_bytes.max().rename("remote_bytes")
    t = sp[sp.schedule != BASELINE].join(remote, on=KEYS)
    ew = sp[sp.schedule == BASELINE].set_index(KEYS)
    t = t.join((ew.kernel_ms / ew.compute_ms - 1).rename("ew_comm_share"), on=KEYS)
    t["extra_ms"] = t.kernel_ms - t.expert_wave_ms
    t["drain_ms"] = t.remote_bytes / (drain_gbps * 1e9) * 1e3
    t["beyond_stage"] = t.extra_ms.abs() > t.drain_ms
    t = t.join(ew.compute_sched_ms.rename("ew_compute_sched_ms"), on=KEYS)
    t["order_ms"] = t.compute_sched_ms - t.ew_compute_sched_ms
    t["comm_ms"] = t.kernel_ms - t.compute_sched_ms
    return t[["config", "shape", "tokens", "routing", "P", "dtype", "schedule", "kernel_ms", "expert_wave_ms",
              "compute_ms", "remote_bytes", "extra_ms", "drain_ms", "beyond_stage", "ew_comm_share", "order_ms",
              "comm_ms"]].reset_index(drop=True)


def order_cost_line(cost: pd.DataFrame) -> str:
    """One sentence from :func:`order_cost`, computed (per dtype)."""
    parts = []
    for d, g in cost.groupby("dtype", sort=False):
        ew = g.drop_duplicates("config").ew_comm_share
        parts.append(f"{d}: Expert-Wave's remote combine costs {ew.median():+.1%} over its compute-only control "
                     f"(median; {ew.min():+.1%} .. {ew.max():+.1%}); the schedules' time differences exceed the "
                     f"whole combine's drain time in {int(g.beyond_stage.sum())} of {len(g)} cases (median "
                     f"{g.extra_ms.median():+.3f} ms against a median drain of {g.drain_ms.median():.3f} ms)"
                     + (f"; the compute-only controls put {g.order_ms.median():+.3f} ms of it on the tile order and "
                        f"{g.comm_ms.median():+.3f} ms on the remote combine (medians)"
                        if g.order_ms.notna().any() else ""))
    return "; ".join(parts)


def revised_model(df: pd.DataFrame, meta: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The current model (``xstage.moe_plan.predict_kernel_ns``: the busiest program) applied to the
    recorded rows with the Burst-Gap parameters and SM count the sweep ran with (``meta``). Returns (rows with
    ``predicted_speedup`` replaced by the revised model's, so the parity figure can show it; a table per dtype and
    schedule: measured and both models' geomean speedups, the fraction within ±10 %, the median |error| and the
    correlation with the measured speedups)."""
    recorded = meta.get("params", {}).get("prm")       # the parameters the sweep predicted with, if it kept them
    prm = params_from_dict(recorded) if recorded else BurstGapParams.reference()
    n_sms = int(meta.get("sm_count") or 132)
    rp = repredict(df, prm, n_sms, meta.get("params", {}).get("assignment", "static"), record_wait(meta),
                   record_stall(meta))
    keys = KEYS + ["schedule"]
    revised = df.drop(columns=["predicted_speedup"]).merge(
        rp[keys + ["model_speedup"]].rename(columns={"model_speedup": "predicted_speedup"}), on=keys, how="left")
    old, new = speedups(df), speedups(revised)
    old, new = (x[x.schedule != BASELINE] for x in (old, new))

    def stats(t: pd.DataFrame, tag: str) -> pd.DataFrame:
        g = t.groupby(["dtype", "schedule"], sort=False)
        return pd.DataFrame({
            f"{tag}_geomean": g.predicted_speedup.apply(geomean),
            f"{tag}_within_10pct": g.model_error.apply(lambda e: float((e.abs() <= MODEL_TOLERANCE).mean())),
            f"{tag}_median_abs_error": g.model_error.apply(lambda e: float(e.abs().median())),
            f"{tag}_corr": g.apply(lambda x: float(np.corrcoef(x.speedup, x.predicted_speedup)[0, 1])
                                   if len(x) > 2 else float("nan")),
        })
    measured = old.groupby(["dtype", "schedule"], sort=False).speedup.apply(geomean).rename("measured_geomean")
    table = pd.concat([measured, stats(old, "recorded_model"), stats(new, "revised_model")], axis=1).reset_index()
    return revised, table


def repredicted_speedups(df: pd.DataFrame, meta: dict, prm, wait: str | None = None,
                         stall: str | None = None) -> pd.DataFrame:
    """A recorded MegaMoE sweep's speedups over Expert-Wave (:func:`speedups`, the baseline's rows
    dropped) with ``predicted_speedup`` re-predicted by the cost model (``repredict``) from stage
    parameters ``prm``, wait model ``wait`` (None: the record's own, moe_plan.record_wait) and stall model
    ``stall`` (None: the record's own, moe_plan.record_stall), for the record's SM count and task assignment, and
    for its observed rank where it timed one (a one-GPU record, sidecar ``params.observed_rank``)."""
    p = meta.get("params", {})
    rp = repredict(df, prm, int(meta.get("sm_count") or 132), p.get("assignment", "static"),
                   wait or record_wait(meta), stall or record_stall(meta), observed_rank=p.get("observed_rank"))
    keys = KEYS + ["schedule"]
    t = df.drop(columns=["predicted_speedup"]).merge(
        rp[keys + ["model_speedup"]].rename(columns={"model_speedup": "predicted_speedup"}), on=keys, how="left")
    sp = speedups(t)
    return sp[sp.schedule != BASELINE]


def stage_model(df: pd.DataFrame, meta: dict, link: str = "nvlink") -> pd.DataFrame:
    """The MegaMoE cost model with the stage model of ``link`` (its fit in data/, xstage.model.load_params:
    the capacity the round's issuing programs see, the stall, the drain) on the recorded rows: per dtype and
    schedule, measured and predicted geomean speedups, the fraction within +-10 % and the median |error|."""
    sp = repredicted_speedups(df, meta, load_params(data.machine_dir(LINK_MACHINES[link]), link))
    g = sp.groupby(["dtype", "schedule"], sort=False)
    return pd.DataFrame({
        "measured_geomean": g.speedup.apply(geomean), "stage_model_geomean": g.predicted_speedup.apply(geomean),
        "stage_model_within_10pct": g.model_error.apply(lambda e: float((e.abs() <= MODEL_TOLERANCE).mean())),
        "stage_model_median_abs_error": g.model_error.apply(lambda e: float(e.abs().median())),
    }).reset_index()


def host_rescore(df: pd.DataFrame, meta: dict, drain_gbps: float | None = None, wait: str | None = None,
                 stall: str | None = None, prm=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The cost model (``repredict``) on a recorded host-link sweep (schema ``megamoe``) with the stage
    parameters it recorded (its sidecar's ``prm``; or ``prm``, e.g. the host link's full model now,
    ``xstage.model.load_params``), the drain rate replaced by ``drain_gbps`` when given (the
    combine's measured rate), wait model ``wait`` and stall model ``stall`` (None: the record's own,
    moe_plan.record_wait / record_stall). Returns (per configuration and schedule: measured and
    predicted speedup over Expert-Wave and the model's error; per dtype and schedule: configurations, the share
    within +-10 % (MODEL_TOLERANCE), the median |error|, over- and under-predictions beyond it)."""
    p = meta.get("params", {})
    if prm is None:
        if "prm" not in p:
            raise ValueError("the record's sidecar holds no prm (the parameters the sweep predicted with)")
        prm = params_from_dict(p["prm"])
    if drain_gbps is not None:
        if not (np.isfinite(drain_gbps) and drain_gbps > 0):
            raise ValueError(f"drain_gbps must be positive, got {drain_gbps}")
        prm = replace(prm, drain_gbps=float(drain_gbps))
    sp = repredicted_speedups(df, meta, prm, wait, stall)
    g = sp.groupby(["dtype", "schedule"], sort=False)
    summ = pd.DataFrame({
        "configs": g.size(),
        "within_10pct": g.model_error.apply(lambda e: float((e.abs() <= MODEL_TOLERANCE).mean())),
        "median_abs_error": g.model_error.apply(lambda e: float(e.abs().median())),
        "over_predicted": g.model_error.apply(lambda e: int((e > MODEL_TOLERANCE).sum())),
        "under_predicted": g.model_error.apply(lambda e: int((e < -MODEL_TOLERANCE).sum())),
    }).reset_index()
    return sp[["config", "dtype", "schedule", "speedup", "predicted_speedup", "model_error"]], summ


def stall_rescore(stalls=STALL_MODELS_SCORED, prms=None) -> pd.DataFrame:
    """The one-H200 host-link record (``records.record("megamoe", "h200x1", "host")``) rescored under each stall
    model (:func:`host_rescore`: the record's wait model, and its stage parameters or each of ``prms``, {name:
    StageParams, a function returning one (called once the record is read), or None for the record's own}, default
    {"recorded": None}): per model, stall model, dtype and
    schedule the configurations, the share and count within +-10 % (MODEL_TOLERANCE), the median and worst |error|.
    A stall model None is the record's own (named in the table). :class:`NoRecordedData` without the record."""
    df, meta = world_data("one-gpu", "host")
    out = []
    for name, prm in (prms or {"recorded": None}).items():
        prm = prm() if callable(prm) else prm
        for st in stalls:
            sp, summ = host_rescore(df, meta, stall=st, prm=prm)
            worst = sp.groupby(["dtype", "schedule"], sort=False).model_error.apply(lambda e: float(e.abs().max()))
            summ = summ.assign(model=name, stall=st or record_stall(meta), within=(summ.within_10pct * summ.configs).round().astype(int),
                               worst_abs_error=worst.reindex(pd.MultiIndex.from_frame(summ[["dtype", "schedule"]]))
                               .to_numpy())
            out.append(summ)
    cols = ["model", "stall", "dtype", "schedule", "configs", "within", "within_10pct", "median_abs_error",
            "worst_abs_error"]
    return pd.concat(out, ignore_index=True)[cols]


def host_full_model() -> pd.DataFrame:
    """The one-H200 host-link record re-predicted with the host link's full model (xstage.model.load_params;
    stage_fit.FULL_RUNG) beside the stage parameters the sweep recorded, both under the
    record's own stall and wait models (:func:`stall_rescore`, ``model``: "recorded" / "full").
    The cost model reads the stage's capacities, stall and drain; free entries (f = 1.6 KiB per burst) are no part
    of it: a combine burst is a tile's rows, hundreds of KiB."""
    full = lambda: load_params(data.machine_dir(LINK_MACHINES["host"]), "host")   # noqa: E731 (once the record is read)
    return stall_rescore((None,), {"recorded": None, "full": full})


# ------------------------------------------------------------- 8-rank traffic on 2 GPUs (xstage.traffic)
def predicted_speedups(df, meta: dict, traffic_ranks: int = TRAFFIC_RANKS, link: str = "nvlink",
                       assignment: str = "dynamic"):
    """What the MegaMoE cost model (``repredict``, the stage model of ``link`` fitted in data/)
    predicts for each schedule over Expert-Wave on recorded 2-rank rows ``df`` (schema megamoe; ``meta`` its
    sidecar), once as recorded (P = 2) and once with each GPU's layer and egress those of a rank of a
    ``traffic_ranks``-rank layer (P = traffic_ranks layouts; the per-program GEMM rate calibrated on the recorded
    compute-only control, so the same rate per FLOP; the max over all logical ranks, of which a traffic run plays
    two). A model, computed, never measured. Returns per configuration, dtype and schedule: ``measured_p2``
    (recorded speedup), ``model_p2``, ``model_traffic``."""


    prm = load_params(data.machine_dir(LINK_MACHINES[link]), link)
    n_sms = int(meta.get("sm_count") or 132)
    keys = ["shape", "tokens", "routing", "dtype", "schedule"]
    base = df.set_index(["shape", "tokens", "routing", "dtype"])
    ew = base[base.schedule == "expert_wave"].kernel_ms
    meas = df.assign(measured_p2=ew.reindex(pd.MultiIndex.from_frame(df[["shape", "tokens", "routing", "dtype"]]))
                     .to_numpy() / df.kernel_ms.to_numpy())[keys + ["measured_p2"]]
    wait, stall = record_wait(meta), record_stall(meta)
    had = meta.get("params", {}).get("assignment", "static")     # the calibration's: the record's own
    p2 = repredict(df, prm, n_sms, assignment, wait, stall, had).rename(columns={"model_speedup": "model_p2"})
    t8 = repredict(df.assign(P=traffic_ranks), prm, n_sms, assignment, wait, stall, had).rename(
        columns={"model_speedup": "model_traffic"})
    return meas.merge(p2[keys + ["model_p2"]], on=keys).merge(t8[keys + ["model_traffic"]], on=keys)


def drain_bound(df, traffic_ranks: int = TRAFFIC_RANKS, link: str = "nvlink"):
    """Per configuration and dtype of recorded 2-rank MegaMoE rows ``df``: the remote combine bytes of the busiest
    GPU as recorded (P = 2, ``remote_bytes``) and with 8-rank traffic (ranks L_0 / L_1 of the ``traffic_ranks``-rank
    layouts, :func:`xstage.traffic.egress`), the time the fitted drain rate D of ``link`` needs for each (``drain_ms_*``: a
    lower bound on the combine's link time, computed) and the recorded compute-only control ``compute_ms``
    (Expert-Wave with every store local, measured at P = 2)."""


    D = load_params(data.machine_dir(LINK_MACHINES[link]), link).drain_gbps          # bytes / ns
    cases = {(c.shape.name, c.tokens, c.routing): c for c in CASES}
    tw = TrafficWorld(PlayedWorld(), traffic_ranks)
    out = []
    ew = df[df.schedule == "expert_wave"]
    for row in ew.itertuples(index=False):
        c = cases[(row.shape, row.tokens, row.routing)]
        _, _, lays = routing_of(c, traffic_ranks)
        eg = egress(tw, lays, c.shape.hidden, OUT_DTYPES[row.dtype].itemsize)
        t8 = max(e["combine_remote"] for e in eg.values())
        out.append(dict(shape=row.shape, tokens=row.tokens, routing=row.routing, dtype=row.dtype,
                        remote_bytes_p2=int(row.remote_bytes), remote_bytes_traffic=t8,
                        drain_ms_p2=row.remote_bytes / D / 1e6, drain_ms_traffic=t8 / D / 1e6,
                        compute_ms=float(row.compute_ms)))
    return pd.DataFrame(out)
