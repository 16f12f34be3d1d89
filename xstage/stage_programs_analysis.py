"""The stage model against per-program records (schema burst_program): who a full stage favours (per SM, per GPC,
by placement), how a small burst's time depends on how busy the link is, the designed probe trains and the
legacy train kernel's read wait (the read fence), against the model's simulated programs.

Reads data/ and the model only (analysis layer); the records are named in xstage.records.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from . import data
from .model import load_params, predict_train
from .stage_fit import LINK_TARGETS as LINK_TARGET
from .stage_params import FENCE_ARBITRATIONS
from .stage_sim import models_read_fence, simulate_stage
from .fluid import KIB
from .sources import LINK_MACHINES

TRAIN_PROGRAMS = "train_programs"   # under data/h200x1/: the seed-0 host trains again, per program with its SM
TRAIN_PROGRAMS_P = "train_programs_p"   # under data/h200x1/: seed-7 trains at 12 program counts (another process)
CONTENDED = 3.0                      # a burst is contended when its median program takes > 3x its unimpeded issue
FAVOURED = 1.2                       # a program is favoured when it drains >= 1.2x its burst's median program


def train_programs_data(machine: str = "h200x1", sub: str = TRAIN_PROGRAMS) -> tuple[pd.DataFrame, dict]:
    """A per-program train record (schema xstage.data.BURST_PROGRAM, ``xstage sweep trains --per-program``)."""
    return data.load(data.machine_dir(machine) / sub, data.BURST_PROGRAM)


def program_rates(pp: pd.DataFrame, link: str = "host") -> pd.DataFrame:
    """Every program's every contended burst (its grid's median program slowed > ``CONTENDED`` x the burst's
    unimpeded issue, b / r + o with the link's fitted r and o) with ``rel``: the median program's issue time over
    this program's (> 1: it got more of the drain than the median program) and ``rank`` (0 fastest, 1 slowest)."""
    prm = load_params(data.machine_dir(LINK_MACHINES[link]), link)
    pp = pp[pp.target == LINK_TARGET[link]]
    if pp.empty:
        raise ValueError(f"no per-program rows for the {link} link (target {LINK_TARGET[link]!r})")
    key = ["train", "programs", "repeat", "burst"]
    unimpeded = pp.burst_bytes / prm.program_rate + prm.overhead_ns
    med = pp.groupby(key).issue_ns.transform("median")
    c = pp[med > CONTENDED * unimpeded].copy()
    c["rel"] = med[c.index] / c.issue_ns
    c["rank"] = (c.groupby(key).issue_ns.rank(method="average") - 1) / (c.programs - 1).clip(lower=1)
    return c


SMALL_BURST_KIB = (0, 2, 4, 8, 16, 32)                  # size bins of small_burst_contention, KiB per program
ACTIVE_BINS = (-0.01, 0.05, 0.2, 0.4, 0.6, 0.8, 1.0)     # share of the other programs inside a burst


def _active_share(start, end, weight, total) -> np.ndarray:
    """For each interval i: the weight of the OTHER intervals that hold its start (start_j <= start_i < end_j),
    over ``total``."""
    s, e, w = (np.asarray(x, np.float64) for x in (start, end, weight))
    inside = (s[None, :] <= s[:, None]) & (e[None, :] > s[:, None])
    np.fill_diagonal(inside, False)
    return (inside * w[None, :]).sum(axis=1) / total


def small_burst_contention(pp: pd.DataFrame, link: str = "host", min_programs: int = 66, prm=None,
                           read_fence=()) -> pd.DataFrame:
    """Small bursts (<= 32 KiB per program) of free-running trains by how busy the link is when they start: per
    program-burst of the per-program record ``pp`` (schema burst_program; grids of >= ``min_programs``) the share of
    the other programs inside a burst at its start (``active``), binned (:data:`ACTIVE_BINS`) against the burst's
    size (:data:`SMALL_BURST_KIB`): the median issue time (``measured_ns``), the share over 3 us (``slow``) and the
    count. With ``prm`` (a StageParams, e.g. ``model.load_params``) the same from the model's simulated programs of
    the same trains (``model_ns``, ``model_slow``; its weight groups stand for their programs). Measured: a small burst issues at the issue rate while few of the others are inside a burst and waits for about
    its share of the drain once most are; the full model agrees at the busy end and makes small bursts wait at
    5-60 % busy, where the measured ones mostly do not. ``read_fence``: the bursts the model simulates with the
    legacy kernel's read wait (``data.legacy_read_bursts`` of the record's sidecar)."""
    pp = pp[(pp.target == LINK_TARGET[link]) & (pp.programs >= min_programs)]
    if pp.empty:
        raise ValueError(f"no per-program rows for the {link} link with >= {min_programs} programs")
    rows, model_rows = [], []
    for (tr, P, rep), g in pp.groupby(["train", "programs", "repeat"], sort=False):
        e = g.start_ns.to_numpy() + g.issue_ns.to_numpy()
        act = _active_share(g.start_ns.to_numpy(), e, np.ones(len(g)), float(P))
        small = g.burst_bytes.to_numpy() <= SMALL_BURST_KIB[-1] * KIB
        rows.append(pd.DataFrame({"kib": g.burst_bytes.to_numpy()[small] / KIB, "active": act[small],
                                  "ns": g.issue_ns.to_numpy()[small]}))
    if prm is not None:
        trains = pp.groupby(["train", "programs", "burst"], sort=False).agg(b=("burst_bytes", "first"),
                                                                           gap=("gap_ns", "first")).reset_index()
        for (tr, P), g in trains.groupby(["train", "programs"], sort=False):
            g = g.sort_values("burst")
            b, gap = g.b.to_numpy(np.float64), g.gap.to_numpy(np.float64)
            fence = np.isin(np.arange(len(b)), list(read_fence))[None] if models_read_fence(prm) else None
            st, en, m = simulate_stage(prm, [P], b[None], gap[None], [False], read_fence=fence)
            ok = np.isfinite(st[0, :, 0])
            s_, e_, w = st[0, ok].ravel(), en[0, ok].ravel(), np.repeat(m[0, ok], len(b))
            act = _active_share(s_, e_, w, float(P))
            kib = np.tile(b, ok.sum()) / KIB
            small = kib <= SMALL_BURST_KIB[-1]
            model_rows.append(pd.DataFrame({"kib": kib[small], "active": act[small], "ns": (e_ - s_)[small],
                                            "w": w[small]}))
    r = pd.concat(rows, ignore_index=True)
    bins = dict(size_kib=pd.cut(r.kib, SMALL_BURST_KIB), active=pd.cut(r.active, ACTIVE_BINS))
    out = (r.assign(**bins).groupby(["active", "size_kib"], observed=True)
           .agg(measured_ns=("ns", "median"), slow=("ns", lambda v: float((v > 3000).mean())), bursts=("ns", "size")))
    if model_rows:
        mr = pd.concat(model_rows, ignore_index=True)
        mr = mr.assign(size_kib=pd.cut(mr.kib, SMALL_BURST_KIB), active=pd.cut(mr.active, ACTIVE_BINS))

        def wmed(x):
            o = np.argsort(x.ns.to_numpy())
            c = np.cumsum(x.w.to_numpy()[o]) / x.w.sum()
            return float(x.ns.to_numpy()[o][np.searchsorted(c, 0.5)])
        gm = mr.groupby(["active", "size_kib"], observed=True)
        out = out.join(pd.DataFrame({"model_ns": gm.apply(wmed),
                                     "model_slow": gm.apply(lambda x: float((x.w * (x.ns > 3000)).sum() / x.w.sum()))}))
    return out.reset_index()


TRAIN_PROBE = "probe_trains"   #: designed probe trains (remote_store.probe_family), per program


def _median_program(pp: pd.DataFrame) -> pd.Series:
    """A train record's median program per (train, programs, burst): the median over programs of each run, then the
    median over repeats. Per-program rows (schema burst_program) or burst_train rows (whose issue_ns is already each
    run's median program)."""
    key = ["train", "programs", "burst"]
    if "program" not in pp.columns:
        return pp.groupby(key).issue_ns.median()
    return pp.groupby(key + ["repeat"]).issue_ns.median().groupby(key).median()


def preload_ab(legacy: pd.DataFrame, legacy_meta: dict, preload: pd.DataFrame, link: str = "host",
               min_programs: int = 66, min_ns: float = 1000.0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The A/B: the same trains recorded in one call with the legacy kernel (per-burst parameter reads,
    ``--no-preload``) and with the preload, both per program (schema burst_program). Per (train, programs, burst):
    the median program of each (median over repeats: ``legacy_ns``, ``preload_ns``) and ``ratio`` = legacy /
    preload. Per burst, over the grids of >= ``min_programs`` programs where either took >= ``min_ns``: the median
    ratio and the count (``legacy_read``: the bursts the legacy kernel read at, :func:`xstage.data.legacy_read_bursts`
    of the legacy record's sidecar ``legacy_meta``). The read wait predicts ratios > 1 at those bursts and ~1
    elsewhere (docs/findings.md)."""
    def medians(pp, name):
        pp = pp[pp.target == LINK_TARGET[link]]
        if pp.empty:
            raise ValueError(f"the {name} record has no per-program rows for the {link} link")
        return _median_program(pp).rename(f"{name}_ns")

    rows = pd.concat([medians(legacy, "legacy"), medians(preload, "preload")], axis=1, join="inner").reset_index()
    if rows.empty:
        raise ValueError("the legacy and preload records share no (train, programs, burst)")
    if "burst_bytes" in preload.columns:   # for preload_ab_sizes
        sizes = preload[["train", "burst", "burst_bytes"]].drop_duplicates(["train", "burst"])
        rows = rows.merge(sizes, on=["train", "burst"], how="left")
    rows["ratio"] = rows.legacy_ns / rows.preload_ns
    rows["legacy_read"] = rows.burst.isin(data.legacy_read_bursts(legacy_meta, int(rows.burst.max()) + 1))
    sel = rows[(rows.programs >= min_programs) & ((rows.legacy_ns >= min_ns) | (rows.preload_ns >= min_ns))]
    per_burst = (sel.groupby("burst").agg(median_ratio=("ratio", "median"), rows=("ratio", "size"),
                                          legacy_read=("legacy_read", "first")).reset_index())
    return rows, per_burst


PRELOAD_AB_KIB = (0, 8, 16, 48, 128, np.inf)   # burst-size classes (KiB per program) of preload_ab_sizes


def preload_ab_sizes(rows: pd.DataFrame, min_ns: float = 1000.0, kib=PRELOAD_AB_KIB) -> pd.DataFrame:
    """:func:`preload_ab`'s rows by burst size and program count, the legacy-read bursts left out (what the read
    costs where the legacy kernel reads from L1): per (size class, programs) over the bursts either kernel took
    >= ``min_ns`` on, the median legacy / preload ratio, both medians (us) and the count. Small
    bursts pay it (0-8 KiB at P >= 66: 1.26-1.52), 8 KiB and larger do not (0.87-1.05)."""
    sel = rows[~rows.legacy_read & ((rows.legacy_ns >= min_ns) | (rows.preload_ns >= min_ns))]
    cls = pd.cut(sel.burst_bytes / 1024, list(kib), right=True)
    out = sel.groupby([cls, "programs"], observed=True).agg(
        median_ratio=("ratio", "median"), legacy_us=("legacy_ns", "median"), preload_us=("preload_ns", "median"),
        bursts=("ratio", "size")).reset_index().rename(columns={"burst_bytes": "kib"})
    out[["legacy_us", "preload_us"]] /= 1000
    out["kib"] = out.kib.astype(str)
    return out


def read_fence_probes(pp: pd.DataFrame, meta: dict, prm, link: str = "host", min_ns: float = 1000.0) -> pd.DataFrame:
    """The probe trains' read-wait bursts against the model with and without the read fence. Per probe
    train (lead, gap, programs) and burst of :func:`xstage.data.legacy_read_bursts` (the record's sidecar): the
    measured median program (median over repeats, ``measured_ns``) and the model's median program with the fence
    (``model_fence_ns``: ``predict_train(read_fence=...)``) and without it (``model_ns``), and their log ratios to
    the measurement; only bursts measured >= ``min_ns``. The probes are eleven identical 2 KiB bursts, so what sets
    bursts 4 and 8 apart is the read alone. ``prm``: StageParams (e.g. ``model.load_params``)."""
    pp = pp[pp.target == LINK_TARGET[link]]
    if pp.empty:
        raise ValueError(f"no per-program rows for the {link} link")
    n = int(pp.burst.max()) + 1
    fence = data.legacy_read_bursts(meta, n)
    if not fence:
        raise ValueError("this record has no legacy read bursts (made with the preload, or simulated)")
    med = _median_program(pp)
    rows = []
    for (tr, P), g in med.groupby(level=[0, 1], sort=False):
        one = pp[(pp.train == tr) & (pp.programs == P)]
        one = one[(one.repeat == one.repeat.min()) & (one.program == one.program.min())].sort_values("burst")
        b, gap = one.burst_bytes.to_numpy(np.float64), one.gap_ns.to_numpy(np.float64)
        with_f = predict_train(prm, int(P), b, gap, read_fence=fence)
        without = predict_train(prm, int(P), b, gap)
        meas = g.droplevel([0, 1]).reindex(range(len(b))).to_numpy()
        for k in fence:
            rows.append({"train": tr, "programs": int(P), "burst": k, "measured_ns": meas[k],
                         "model_fence_ns": with_f[k], "model_ns": without[k]})
    out = pd.DataFrame(rows)
    out = out[out.measured_ns >= min_ns].reset_index(drop=True)
    out["log_ratio_fence"] = np.log(out.model_fence_ns / out.measured_ns)
    out["log_ratio"] = np.log(out.model_ns / out.measured_ns)
    return out


LOAD_PROBE_BYTES = 16   # the model's stand-in for a load probe: a fenced 16-byte burst (one store's worth)


def load_probe_table(pp: pd.DataFrame, prm, link: str = "host") -> pd.DataFrame:
    """The load-after-store test (``xstage sweep trains --per-program --load-probe 1|2``) against the
    read fence of the stage model. Per (train, programs, burst) of the per-program record ``pp``: the median
    program's issue time and load time (median over repeats: ``issue_ns``, ``load_ns``) and the model's wait for
    that load (``model_wait_ns``): the train with a fenced LOAD_PROBE_BYTES burst after every burst (gap 0 before it,
    the burst's gap after it), whose issue time less the model's overhead is how long the program's own stores
    held it. ``prm``: StageParams with a fence (:data:`xstage.model.FENCE_ARBITRATIONS`)."""
    if prm.arbitration not in FENCE_ARBITRATIONS:
        raise ValueError(f"the load's wait needs a model that keeps each program's stores: arbitration one of "
                         f"{', '.join(FENCE_ARBITRATIONS)}, got {prm.arbitration!r}")
    pp = pp[pp.target == LINK_TARGET[link]]
    if pp.empty or pp.load_ns.isna().all():
        raise ValueError(f"no load-probe rows for the {link} link (a record made with --load-probe 1 or 2)")
    key = ["train", "programs", "burst"]
    runs = pp.groupby(key + ["repeat"]).agg(issue_ns=("issue_ns", "median"), load_ns=("load_ns", "median"))
    med = runs.groupby(key).median().reset_index()
    rows = []
    for (tr, P), g in med.groupby(["train", "programs"], sort=False):
        one = pp[(pp.train == tr) & (pp.programs == P)]
        one = one[(one.repeat == one.repeat.min()) & (one.program == one.program.min())].sort_values("burst")
        b, gap = one.burst_bytes.to_numpy(np.float64), one.gap_ns.to_numpy(np.float64)
        n = len(b)
        b2 = np.ravel(np.column_stack([b, np.full(n, float(LOAD_PROBE_BYTES))]))
        g2 = np.ravel(np.column_stack([np.zeros(n), gap]))
        t = predict_train(prm, int(P), b2, g2, read_fence=range(1, 2 * n, 2))
        g = g.sort_values("burst")
        rows.append(g.assign(model_issue_ns=t[0::2], model_wait_ns=np.maximum(t[1::2] - prm.overhead_ns, 0.0)))
    return pd.concat(rows, ignore_index=True)


def probe_summary(pp: pd.DataFrame, link: str = "host", prm=None) -> pd.DataFrame:
    """The probe trains (``remote_store.probe_family``: a lead burst of A KiB per program, a gap g, then 2 KiB probes
    3 us apart; or ``probe_size_family``: probes of S KiB) from their per-program record ``pp`` (schema
    burst_program): per (lead KiB, gap, probe KiB, programs), medians
    over repeats of the per-run statistics: the lead burst's median program and its ratio to the fastest program's
    (``lead_ns``, ``lead_spread``), the first probe's median / p10 / p90 program (``probe1_ns``, ``probe1_p10_ns``,
    ``probe1_p90_ns``), the share of programs whose first probe took over 1 us (``probe1_slow``), the probes' total
    for the median program (``probes_ns``), how the first probe's time follows the program's own lead time
    (``spearman``: over the programs of one run) and how bunched the first probes' ends are against their starts
    (``end_over_start_spread``: p10-p90 spread of the ends / of the starts; << 1: released together). With ``prm``
    (xstage.model StageParams) the model's median program for the lead and the first probe beside them
    (``model_lead_ns``, ``model_probe1_ns``)."""
    from scipy.stats import spearmanr

    pp = pp[pp.target == LINK_TARGET[link]]
    if pp.empty:
        raise ValueError(f"no per-program rows for the {link} link")
    if (pp.burst.max() < 1) or not pp.train.str.match(r"^(p[0-9.]+-g[0-9.]+|s[0-9.]+-p[0-9.]+)$").all():
        raise ValueError("probe_summary reads a probe family's record (trains named pA-gG or sS-pA with >= 2 "
                         "bursts)")
    rows = []
    for (tr, P, rep), g in pp.groupby(["train", "programs", "repeat"], sort=False):
        g = g.sort_values(["program", "burst"])
        lead = g[g.burst == 0].set_index("program")
        p1 = g[g.burst == 1].set_index("program")
        probes = g[g.burst >= 1].groupby("program").issue_ns.sum()
        e1 = p1.start_ns + p1.issue_ns
        s_spread = float(np.subtract(*np.percentile(p1.start_ns, [90, 10])))
        e_spread = float(np.subtract(*np.percentile(e1, [90, 10])))
        x, y = lead.issue_ns, p1.issue_ns.reindex(lead.index)
        rho = spearmanr(x, y).statistic if P > 2 and x.nunique() > 1 and y.nunique() > 1 else np.nan
        rows.append({"train": tr, "programs": int(P), "repeat": int(rep),
                     "lead_kib": float(lead.burst_bytes.iloc[0]) / KIB, "gap_us": float(lead.gap_ns.iloc[0]) / 1e3,
                     "probe_kib": float(p1.burst_bytes.iloc[0]) / KIB,
                     "lead_ns": float(lead.issue_ns.median()),
                     "lead_spread": float(lead.issue_ns.median() / max(lead.issue_ns.min(), 1e-9)),
                     "probe1_ns": float(p1.issue_ns.median()),
                     "probe1_p10_ns": float(np.percentile(p1.issue_ns, 10)),
                     "probe1_p90_ns": float(np.percentile(p1.issue_ns, 90)),
                     "probe1_slow": float((p1.issue_ns > 1000).mean()),
                     "probes_ns": float(probes.median()), "spearman": float(rho),
                     "end_over_start_spread": e_spread / s_spread if s_spread > 0 else np.nan})
    r = pd.DataFrame(rows)
    out = (r.groupby(["lead_kib", "gap_us", "probe_kib", "programs", "train"], as_index=False)
           .median(numeric_only=True).drop(columns="repeat"))
    if prm is not None:
        trains = pp.groupby(["train", "programs", "burst"]).agg(b=("burst_bytes", "first"),
                                                               gap=("gap_ns", "first")).reset_index()
        ml, m1 = [], []
        for row in out.itertuples():
            t = trains[(trains.train == row.train) & (trains.programs == row.programs)].sort_values("burst")
            pr = predict_train(prm, int(row.programs), t.b.to_numpy(np.float64), t.gap.to_numpy(np.float64))
            ml.append(float(pr[0]))
            m1.append(float(pr[1]))
        out = out.assign(model_lead_ns=ml, model_probe1_ns=m1)
    return out.sort_values(["programs", "lead_kib", "gap_us", "probe_kib"]).reset_index(drop=True)


def program_favour(pp: pd.DataFrame, link: str = "host") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Which programs the stage favours when it is full, from the per-program record: per (programs, SM) the
    median ``rel`` over its contended bursts (:func:`program_rates`), and per program count a summary: the
    quantiles of that per-SM favour, the share of SMs favoured (>= ``FAVOURED``), how the favour persists
    (Spearman of the per-SM favour between repeats, mean over pairs) and how one burst's order predicts the
    next contended burst's in the same run (Spearman of the programs' ranks, median over burst pairs)."""
    from scipy.stats import spearmanr

    c = program_rates(pp, link)
    per_sm = c.groupby(["programs", "smid"], as_index=False).agg(rel=("rel", "median"), bursts=("rel", "size"))
    rows = []
    for P, g in c.groupby("programs"):
        by_rep = g.groupby(["repeat", "smid"]).rel.median().unstack(0)
        reps = list(by_rep.columns)
        across = [spearmanr(by_rep[a], by_rep[b], nan_policy="omit").statistic
                  for i, a in enumerate(reps) for b in reps[i + 1:]]
        nxt = []
        for _, run in g.groupby(["train", "repeat"]):
            ranks = run.pivot_table(index="program", columns="burst", values="rank")
            cols = list(ranks.columns)
            nxt += [spearmanr(ranks[a], ranks[b], nan_policy="omit").statistic for a, b in zip(cols, cols[1:])]
        f = per_sm[per_sm.programs == P].rel
        q = f.quantile([0.1, 0.5, 0.9])
        rows.append({"programs": int(P), "contended_bursts": int(g.groupby(["train", "repeat", "burst"]).ngroups),
                     "sms": int(f.size), "favour_p10": q[0.1], "favour_median": q[0.5], "favour_p90": q[0.9],
                     "favour_max": f.max(), "favoured_share": float((f >= FAVOURED).mean()),
                     "persistence_across_repeats": float(np.nanmean(across)) if across else np.nan,
                     "next_burst_rank_spearman": float(np.nanmedian(nxt)) if nxt else np.nan})
    return per_sm, pd.DataFrame(rows)


TRAIN_GPC = "train_gpc"       # under data/h200x1/: seed-7 per-program trains, P = 16-66, the GPC map read in-process
GPC_MAP_MIN_CLUSTER = 4       # clusters of 2 pair a TPC's SMs only; from 4 up a cluster's CTAs share a GPC


def gpc_map(path) -> pd.DataFrame:
    """The SM -> GPC map of a ``scripts/gpc_map.cu`` record (JSON lines: the device, then one line per launch with
    every CTA's [block, cluster, rank, smid]). A thread-block cluster runs in one GPC, so SMs that ever ran CTAs of
    one cluster of >= :data:`GPC_MAP_MIN_CLUSTER` share a GPC (union over every launch). Returns per SM: ``gpc``
    (the smallest SM of its group; -1: the SM never ran in such a cluster, e.g. a TPC that only takes clusters
    of <= 2) and ``gpc_sms`` (the group's size; 1 for -1); ``attrs``: the device's uuid and SM count.
    A malformed record is a ValueError naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no GPC map record {path} (bash scripts/gpc_map.sh on a GPU writes one)")
    lines = path.read_text(encoding="utf-8").splitlines()
    try:
        head = json.loads(lines[0])
        S = int(head["sm_count"])
    except (IndexError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}:1: not a gpc_map.cu record (its first line names the device and sm_count): {e}")
    parent = list(range(S))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    launches = 0
    for i, line in enumerate(lines[1:], start=2):
        try:
            rec = json.loads(line)
            cs = int(rec["cluster_size"])
            if "error" in rec:
                continue                       # a cluster size the device refused (the record says why)
            clusters: dict[int, list[int]] = {}
            for b, c, r, sm in rec["blocks"]:
                if not 0 <= int(sm) < S:
                    raise ValueError(f"smid {sm} outside 0..{S - 1}")
                clusters.setdefault(int(c), []).append(int(sm))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{i}: malformed gpc_map line: {e}") from None
        launches += 1
        if cs >= GPC_MAP_MIN_CLUSTER:
            for sms in clusters.values():
                for sm in sms[1:]:
                    parent[find(sm)] = find(sms[0])
    if not launches:
        raise ValueError(f"{path}: no launches recorded")
    groups: dict[int, list[int]] = {}
    for sm in range(S):
        groups.setdefault(find(sm), []).append(sm)
    gpc = np.full(S, -1)
    size = np.ones(S, int)
    for sms in groups.values():
        if len(sms) > 1:
            gpc[sms], size[sms] = min(sms), len(sms)
    out = pd.DataFrame({"smid": np.arange(S), "gpc": gpc, "gpc_sms": size})
    out.attrs.update(uuid=head.get("uuid", ""), sm_count=S)
    return out


def favour_by_gpc(machine: str = "h200x1", sub: str = TRAIN_GPC, link: str = "host") -> tuple[pd.DataFrame, pd.DataFrame]:
    """The drain's share per SM against the GPC the SM is in, from a per-program record whose process also read
    the chip's GPC map (``scripts/trains_gpc.sh``: ``gpc_map_before.jsonl`` beside the trains). First bursts only
    (every program starts together into an empty stage), contended ones (:func:`program_rates`). Returns (per
    program count and SM: median ``rel`` -- the burst's median program's time over this program's --, its GPC
    and how many of the grid's programs run in that GPC; per program count and GPC: its programs and the median,
    min and max of its SMs' ``rel``). SMs outside every cluster-schedulable GPC (gpc -1) form one row."""
    folder = data.machine_dir(machine) / sub
    gm = gpc_map(folder / "gpc_map_before.jsonl").set_index("smid")
    pp, _ = train_programs_data(machine, sub)
    c = program_rates(pp, link)
    c = c[c.burst == 0]
    per_sm = c.groupby(["programs", "smid"], as_index=False).rel.median()
    per_sm["gpc"] = gm.gpc.reindex(per_sm.smid).to_numpy()
    used = pp[pp.target == LINK_TARGET[link]].drop_duplicates(["programs", "program"])[["programs", "smid"]]
    used = used.assign(gpc=gm.gpc.reindex(used.smid).to_numpy())
    in_gpc = used.groupby(["programs", "gpc"]).size().rename("programs_in_gpc").reset_index()
    per_sm = per_sm.merge(in_gpc, on=["programs", "gpc"], how="left")
    summary = (per_sm.groupby(["programs", "gpc"], as_index=False)
               .agg(programs_in_gpc=("programs_in_gpc", "first"), sms=("smid", "size"), rel_median=("rel", "median"),
                    rel_min=("rel", "min"), rel_max=("rel", "max"))
               .sort_values(["programs", "rel_median"]))
    return per_sm, summary.reset_index(drop=True)


def placement_share(pp: pd.DataFrame, link: str = "host", first: bool = False) -> pd.DataFrame:
    """How a program's placement sets its share of a full stage's drain, from a per-program record: every
    contended burst's programs (:func:`program_rates`) by how many programs share its SM (``on_sm``) and its TPC
    (``on_tpc``; TPC t = SMs 2t, 2t + 1). Per (programs, on_sm, on_tpc): program-bursts, the median ``rel``
    (> 1: it drains faster than its burst's median program) and ``weight``, the share arbitration="tpc"
    (xstage.model.placement_classes) gives such a program: 1 / (occupied SMs of its TPC x programs on its SM).
    ``first``: only each train's first burst (into an empty stage, every program starting together)."""
    c = program_rates(pp, link)
    if first:
        c = c[c.burst == 0]
    key = ["train", "programs", "repeat", "burst"]
    c = c.assign(tpc=c.smid // 2)
    c["on_sm"] = c.groupby(key + ["smid"]).program.transform("size")
    c["on_tpc"] = c.groupby(key + ["tpc"]).program.transform("size")
    occ = c.groupby(key + ["tpc"]).smid.transform("nunique")
    c["weight"] = 1.0 / (occ * c.on_sm)
    return (c.groupby(["programs", "on_sm", "on_tpc"], as_index=False)
            .agg(program_bursts=("rel", "size"), rel_median=("rel", "median"), weight=("weight", "median")))


