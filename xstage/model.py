"""The stage model's API: :func:`predict_train` (ns per burst of a train on a link) and :func:`load_params` (the
parameters fitted to a machine folder's records), the rows of a simulated train record, and the written fits.

The model itself: :mod:`xstage.fluid` (the paper's three-parameter Burst-Gap fluid model and its event simulation),
:mod:`xstage.stage_params` (one link's stage: capacity, drain, arbitration) and :mod:`xstage.stage_sim` (every
program followed through its train; :mod:`xstage.stage_sim_programs`: a grid as launched, every program its own
sizes and start, in waves). :mod:`xstage.validate` checks what a user passes, in the user's words.

Legend: P = issuing programs, b = bytes per program per burst, g = gap (ns), n = bursts per train.
"""
from __future__ import annotations

import gzip
import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from . import validate
from .data import BURST_TRAIN
# the fluid model is part of this API (what the MegaMoE plan and the sweeps call it by)
from .fluid import KIB, BurstGapParams, drain_time, issue_time, recover, train  # noqa: F401
from .stage_params import StageParams
from .stage_sim import simulate_stage, stage_measure


def predict_train(prm: StageParams, programs: int, burst_bytes, gap_ns, sync: bool = False,
                  barrier: str = "release", read_fence=()) -> np.ndarray:
    """ns per burst of a train that every one of ``programs`` programs runs (bytes per program per burst,
    ``gap_ns[k]`` = the compute gap after burst k, the last one unused).

    sync=False: the median program's issue time of each burst of a free-running train whose programs all
    start together. sync=True: the grid's span of each burst (first start -> last end) when a grid barrier
    starts every burst together, ``gap_ns[k]`` after the last program finished burst k (as the synchronised
    sweep, where the harness's barrier time belongs in the gap). ``barrier`` (sync only): "release" (the
    recorded sweeps: the barrier waits until the stage has drained, then the gap follows) or "relaxed" (the
    next burst starts ``gap_ns[k]`` after the last program finished, whatever the stage holds).
    ``read_fence`` (free-running only; default none): indices of the bursts whose start holds a read that waits
    behind the program's own outstanding stores, as the legacy train kernel's parameter reads did
    (:func:`xstage.data.legacy_read_bursts`); such a burst starts issuing once the program's stores have drained.
    A kernel that reads nothing between its bursts (every fused kernel's steady state, the train kernel's
    clean form) has none."""
    if not isinstance(prm, StageParams):
        raise ValueError(f"prm must be StageParams (xstage.model.load_params), got {type(prm).__name__}")
    if barrier not in ("release", "relaxed"):
        raise ValueError(f"barrier must be 'release' or 'relaxed', got {barrier!r}")
    P, b, g = validate.train(programs, burst_bytes, gap_ns)
    sync = validate.flag(sync, "sync")
    fence = None
    ks = np.asarray(list(read_fence), dtype=np.int64).ravel() if len(read_fence) else np.zeros(0, np.int64)
    if len(ks):
        if sync:
            raise ValueError("read_fence applies to free-running trains (sync=False)")
        if ks.min() < 0 or ks.max() >= len(b):
            raise ValueError(f"read_fence holds burst indices outside 0..{len(b) - 1}: {sorted(set(ks.tolist()))}")
        fence = np.zeros((1, len(b)), bool)
        fence[0, ks] = True
    _warn_outside_fit(prm, P)
    start, end, m = simulate_stage(prm, [P], b[None, :], g[None, :], [bool(sync)],
                                   barrier_drains=[barrier == "release"], read_fence=fence)
    return stage_measure(start, end, [bool(sync)], m)[0]


class OutsideFitWarning(UserWarning):
    """A prediction for a program count outside the range the parameters were fitted on (an extrapolation)."""


# parameters read by load_params -> (link, lowest, highest program count of the records they were fitted on)
_FITTED_PROGRAMS: dict[StageParams, tuple[str, int, int]] = {}


def fitted_programs(prm: StageParams) -> tuple[int, int] | None:
    """(lowest, highest) program count the fit behind ``prm`` saw, for parameters from :func:`load_params`."""
    hit = _FITTED_PROGRAMS.get(prm)
    return hit[1:] if hit else None


def _warn_outside_fit(prm: StageParams, programs: int) -> None:
    hit = _FITTED_PROGRAMS.get(prm)
    if hit and not hit[1] <= programs <= hit[2]:
        link, lo, hi = hit
        warnings.warn(f"programs {programs} is outside the program counts the {link} fit was made on ({lo}-{hi}): "
                      "the prediction extrapolates", OutsideFitWarning, stacklevel=3)


def simulated_train_rows(trains, prm: StageParams, repeats: int, noise: float = 0.03, seed: int = 0) -> pd.DataFrame:
    """Rows in the recorded ``burst_train`` schema for ``trains`` (xstage.remote_store.BurstTrain), from the
    stage model plus lognormal timing noise per (repeat, burst). Statistics are over the weight groups."""
    rng = np.random.default_rng(seed)
    out = []
    for tr in trains:
        start, end, _ = simulate_stage(prm, [tr.programs], np.asarray([tr.burst_bytes], np.float64),
                                       np.asarray([tr.gap_ns], np.float64), [False])
        s, e = start[0], end[0]
        keep = np.isfinite(s[:, 0])
        s, e = s[keep], e[keep]
        issue = e - s
        for rep in range(repeats):
            k = rng.lognormal(0.0, noise, size=tr.n_bursts)
            q = np.percentile(issue, [10, 25, 75, 90], axis=0) * k
            out.append(pd.DataFrame({
                "train": tr.name, "target": tr.target, "programs": tr.programs, "store_bytes": tr.store_bytes,
                "n_bursts": tr.n_bursts, "rank": 0, "repeat": rep, "burst": np.arange(tr.n_bursts),
                "burst_bytes": np.asarray(tr.burst_bytes), "gap_ns": np.asarray(tr.gap_ns),
                "issue_ns": np.median(issue, axis=0) * k, "issue_p10_ns": q[0], "issue_p25_ns": q[1],
                "issue_p75_ns": q[2], "issue_p90_ns": q[3], "issue_min_ns": issue.min(axis=0) * k,
                "issue_max_ns": issue.max(axis=0) * k, "start_ns": np.median(s, axis=0),
                "start_skew_ns": np.ptp(s, axis=0), "end_skew_ns": np.ptp(e, axis=0),
                "span_ns": (e.max(axis=0) - s.min(axis=0)) * k}))
    return pd.concat(out, ignore_index=True)[list(BURST_TRAIN.columns)]


# ------------------------------------------------------------------------------------------ fitted parameters
LINKS = ("nvlink", "host", "local")   # local: this GPU's own memory (a calibration of the control)


def params_from_dict(d: dict) -> "BurstGapParams | StageParams":
    """Either kind of parameters from their ``as_dict()`` (what sweeps record in their sidecars)."""
    return StageParams(**d) if "capacity_per_program_kib" in d else BurstGapParams(**d)


def load_params(data_dir, link: str) -> StageParams:
    """The stage-model parameters fitted to ``data_dir``'s record of ``link`` ("nvlink": stores to a peer GPU;
    "host": pinned host memory over PCIe), as ``xstage fit --data DIR --link LINK --write`` wrote them
    (``stage_fit_<link>.json``). Pure JSON: no torch needed. ValueError for an unknown link, a folder without a
    fit for that link, or a fit made from other versions of the folder's records (refit then)."""
    if link not in LINKS:
        raise ValueError(f"link must be one of {', '.join(LINKS)}, got {link!r}")
    folder = Path(data_dir)
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder")
    obj = read_fit(folder / f"stage_fit_{link}.json", link)
    prm = StageParams(**obj["params"])
    programs = (obj.get("table") or {}).get("programs") or []
    if programs:
        _FITTED_PROGRAMS[prm] = (link, int(min(programs)), int(max(programs)))
    return prm


def fit_file(path):
    """The file of a written fit named ``path`` (``stage_fit_<link>[_<rung>].json``): the file itself, or, where only
    that exists, its gzip-compressed form ``<name>.json.gz`` (how ``xstage fit --write`` writes them: their
    per-burst tables are ~1 MB of JSON each)."""
    path = Path(path)
    gz = path.with_name(path.name + ".gz")
    return gz if not path.is_file() and gz.is_file() else path


def read_fit(path, link: str) -> dict:
    """A written stage fit (JSON, or JSON gzip-compressed: :func:`fit_file`), checked: the right link, parameters
    that validate, fitted to the records as they are now (the sha256 of each source CSV against its sidecar)."""
    path = fit_file(path)
    folder = path.parent
    if not path.is_file():
        have = sorted(p.name for p in folder.glob("stage_fit_*.json*"))
        raise ValueError(f"{folder} has no fit for link {link!r} ({path.name} missing; has: "
                         f"{', '.join(have) or 'none'}); fit it: xstage fit --data {folder} --link {link} --write")
    try:
        raw = path.read_bytes()
        obj = json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)
        StageParams(**obj["params"])
    except (json.JSONDecodeError, KeyError, TypeError, OSError, EOFError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not a stage fit: {e}") from None
    if obj.get("link") != link:
        raise ValueError(f"{path} holds link {obj.get('link')!r}, not {link!r}")
    for src in obj.get("sources", {}).values():
        side = folder / Path(src["file"]).parent / (Path(src["file"]).name.split(".")[0] + ".json")
        if src.get("sha256") and side.is_file() and json.loads(side.read_text()).get("csv_sha256") != src["sha256"]:
            raise ValueError(f"{path} was fitted to another version of {src['file']}: refit "
                             f"(xstage fit --data {folder} --link {link} --write)")
    return obj
