"""Where a study's rows come from: the ``source`` a notebook names, resolved and checked in one place.

  recorded   the study's current record, data/<machine>/<folder> (xstage.records)
  gpu        a fresh sweep on this machine's GPUs, written to ``out`` (the sweep is the caller's callback:
             this module never imports a sweep)
  simulated  the study's simulation, where it has one
  auto       gpu when GPUs are visible, else recorded
"""
from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path

import pandas as pd

from . import data, env, records
from .fit import fit_burst_gap
from .model import BurstGapParams, load_params
from .report import run_dir

VARIANTS = ("sync", "free_running")
PAPER_DIR = data.DATA_ROOT / "paper"
# The machine whose records hold each link's stage model (data/<machine>/stage_fit_<link>.json.gz).
LINK_MACHINES = {"nvlink": "h200x2", "host": "h200x1"}


class NoRecordedData(data.DataError):
    """A study's recorded data for this machine (or this selection of it) does not exist yet: a notebook says
    so in one line and skips its figures instead of failing."""


def check_source(source: str, simulated: bool = True) -> str:
    """simulated: whether the study has a simulated source (a missing-GPU error suggests it only then)."""
    if source not in env.SOURCES:
        raise ValueError(f"source must be one of {', '.join(env.SOURCES)}, got {source!r}")
    return env.resolve_source(source, simulated=simulated)


def check_machine(machine: str, schema: data.Schema = data.BURST_GAP) -> Path:
    have = data.recorded_machines(schema)
    if machine not in have:
        raise ValueError(f"machine {machine!r} has no recorded {schema.name} data under {data.DATA_ROOT}; "
                         f"recorded machines: {', '.join(have) or 'none'}")
    return data.machine_dir(machine)


def recorded(study: str, machine: str) -> Path:
    """The current record of ``study`` on ``machine`` (xstage.records), with a clear line where none is."""
    found = records.records(study, machine)
    if len(found) != 1:
        have = sorted({r.machine for r in records.records(study)})
        raise ValueError(f"machine {machine!r} has no recorded {study} data under {data.DATA_ROOT}; "
                         f"recorded machines: {', '.join(have) or 'none'}")
    return found[0].path


def check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")


def default_out(machine: str) -> Path:
    """Where a gpu source records: inside a reproduce run <run>/data/<machine> (every notebook of the run
    shares one sweep, which resumes); else runs/sweeps/<UTC time>/<machine>."""
    run = run_dir()
    if run is not None:
        return run / "data" / machine
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return env.REPO_ROOT / "runs" / "sweeps" / stamp / machine


def source_data(source: str, schema: data.Schema, study: str, recorded_folder, run_gpu, out=None,
                 gpu_folder=lambda folder: folder, no_simulated: str | None = None
                 ) -> tuple[pd.DataFrame, dict, Path]:
    """The source skeleton every study without a simulated source shares: (rows, provenance with ``source``,
    the folder read).

    recorded: ``recorded_folder()`` (it raises when the machine has no record); gpu: ``run_gpu(folder)`` into
    ``gpu_folder(out or default_out(this machine))``, then the folder is read. ``source`` is resolved once
    here (auto -> gpu or recorded, xstage.env.resolve_source); simulated is an error (``no_simulated`` says it,
    else one naming ``study``)."""
    src = check_source(source, simulated=False)
    if src == "simulated":
        raise ValueError(no_simulated or f"{study} has no simulated source; use recorded or gpu")
    if src == "recorded":
        folder = recorded_folder()
    else:
        folder = gpu_folder(Path(out) if out is not None else default_out(env.machine_name()))
        run_gpu(folder)
    df, meta = data.load(folder, schema)
    return df, {**meta, "source": src}, folder


def paper_numbers() -> tuple[pd.DataFrame, dict]:
    """The paper's headline numbers (data/paper/headline.csv: study, metric, value, unit, hardware) and their
    sidecar (where they are quoted from, what each means)."""
    csv, side = PAPER_DIR / "headline.csv", PAPER_DIR / "headline.json"
    for p in (csv, side):
        if not p.is_file():
            raise data.DataError(f"missing {p}")
    df = pd.read_csv(csv)
    missing = [c for c in ("study", "metric", "value", "unit", "hardware") if c not in df.columns]
    if missing:
        raise data.DataError(f"{csv} lacks columns {missing}")
    return df, json.loads(side.read_text())


def paper_number(study: str, metric: str) -> float:
    """One headline number, e.g. ``paper_number("megamoe", "geomean_speedup")`` -> 1.18."""
    df, _ = paper_numbers()
    hit = df[(df.study == study) & (df.metric == metric)]
    if hit.empty:
        known = ", ".join(f"{s}/{m}" for s, m in zip(df.study, df.metric))
        raise ValueError(f"no paper number {study}/{metric}; known: {known}")
    return float(hit.value.iloc[0])


def default_params(df: pd.DataFrame | None = None, target: str = "remote", store_bytes: int = 16) -> BurstGapParams:
    """Model parameters fitted to ``df`` (fast: Jacobian intervals, no bootstrap), or the reference values when
    there is no data or the fit fails."""
    if df is None:
        return BurstGapParams.reference()
    try:
        p = fit_burst_gap(df, target=target, store_bytes=store_bytes, n_bootstrap=0, uncertainty="jacobian",
                          k_folds=2).params
        return BurstGapParams(*(float(v) for v in p.as_dict().values()))
    except ValueError:
        return BurstGapParams.reference()


def recorded_params(machine: str = "h200x2"):
    """What the MegaMoE sweep predicts with (``xstage.moe_sweep.run_megamoe``'s ``prm``): the stage model of
    the machine's link when its fit is in data/ (``stage_fit_<link>.json``), else the fluid parameters fitted to
    its burst-gap sweep, else the reference values."""
    for link, m in LINK_MACHINES.items():
        if m == machine:
            try:
                return load_params(data.machine_dir(machine), link)
            except ValueError:
                break
    try:
        df, _ = data.load(recorded("burst_gap", machine), data.BURST_GAP)
    except (data.DataError, ValueError):
        return BurstGapParams.reference()
    return default_params(df)


def caption_provenance(meta: dict) -> dict:
    """A data set's provenance for a figure caption (xstage.report.export_figure): the sidecar without the
    per-rank clock calibration."""
    return {k: v for k, v in meta.items() if k != "clock"}
