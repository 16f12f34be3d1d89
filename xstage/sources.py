"""Where a study's rows come from: the ``source`` a notebook names, resolved and checked in one place.

  recorded   the study's current record, data/<machine>/<folder> (xstage.records)
  gpu        a fresh sweep on this machine's GPUs, written to ``out`` (the sweep is the caller's callback:
             this module never imports a sweep)
  simulated  the study's simulation, where it has one
  auto       gpu when GPUs are visible, else recorded
"""
from __future__ import annotations

import datetime as _dt
from pathlib import Path

import pandas as pd

from . import data, env, records
from .report import run_dir

VARIANTS = ("sync", "free_running")

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
