"""Recorded measurements: tidy CSV (one row per measurement) + a JSON sidecar with provenance.

``data/<machine>/<study>.csv`` and ``data/<machine>/<study>.json``. The sidecar carries the machine, GPU name and
count, driver, torch/triton versions, git commit, date, the exact command and parameters, and the schema
version. Loading checks all of it; a missing or malformed file is a :class:`DataError` naming the file.

Sweeps append rows one configuration at a time with a single ``write`` on an ``O_APPEND`` file followed by
``fsync``, so an interrupted sweep leaves only whole configurations behind and a re-run resumes after them.
"""
from __future__ import annotations

import io
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .env import REPO_ROOT

DATA_ROOT = REPO_ROOT / "data"


class DataError(ValueError):
    """A recorded data file is missing, malformed, or of another schema."""


@dataclass(frozen=True)
class Schema:
    name: str
    version: int
    columns: dict[str, str]      # column -> pandas dtype
    key: tuple[str, ...]         # columns that identify one configuration (resume unit)


BURST_GAP = Schema(
    "burst_gap", 3,
    {"target": "str", "programs": "int64", "burst_bytes": "int64", "gap_ns": "int64", "store_bytes": "int64",
     "n_bursts": "int64", "drain": "bool", "sync": "bool", "rank": "int64", "repeat": "int64", "burst": "int64",
     "issue_ns": "float64", "issue_ns_max": "float64", "issue_ns_min": "float64", "span_ns": "float64",
     "drain_ns": "float64", "drain_ns_max": "float64", "gap_meas_ns": "float64", "barrier_ns": "float64",
     "idle_ns": "float64", "start_skew_ns": "float64"},
    ("target", "programs", "burst_bytes", "gap_ns", "store_bytes", "n_bursts", "drain", "sync"),
)
# Columns (per configuration, rank, repeat, burst; medians over programs unless named _max/_min):
#   issue_ns     sender-visible issue time of the burst (CTA barrier -> all warps issued)
#   span_ns      first program's issue start -> last program's issue end
#   drain_ns     issue end -> every thread's fence.acq_rel.sys returned (drain runs only)
#   gap_meas_ns  previous burst's release -> this burst's issue start (the requested gap, as run)
#   barrier_ns   the grid barrier after this burst (sync runs)
#   idle_ns      previous burst's issue end -> this burst's issue start: all store-free time (fence, barrier, gap)
# Older schema versions that load with a documented migration (the file itself is never rewritten):
#   burst_gap v1 had no grid barrier between bursts, so every v1 row is sync=False.
#   burst_gap v2 did not record barrier_ns / idle_ns (NaN).
#   megamoe v1 timed the compute-only control for expert_wave only (compute_ms); compute_sched_ms is NaN.
MIGRATIONS = {("burst_gap", 1): lambda df: df.assign(sync=False, barrier_ns=float("nan"), idle_ns=float("nan")),
              ("burst_gap", 2): lambda df: df.assign(barrier_ns=float("nan"), idle_ns=float("nan")),
              ("megamoe", 1): lambda df: df.assign(compute_sched_ms=float("nan"))}

BANDWIDTH = Schema(
    "bandwidth", 1,
    {"method": "str", "target": "str", "programs": "int64", "num_warps": "int64", "rows": "int64",
     "store_bytes": "int64", "bytes": "int64", "repeat": "int64", "ms": "float64", "gbps": "float64"},
    ("method", "target", "programs", "num_warps", "rows", "store_bytes", "bytes"),
)

SCHEMAS = {s.name: s for s in (BURST_GAP, BANDWIDTH)}
REQUIRED_META = ("schema", "schema_version", "machine", "gpu_name", "gpu_count", "driver", "torch", "triton",
                 "git_commit", "date_utc", "command", "params")


def paths(folder: Path | str, schema: Schema) -> tuple[Path, Path]:
    """The study's CSV (a sweep writes plain ``.csv``; recorded files may be committed gzip-compressed as
    ``.csv.gz``, which loading reads too) and its JSON sidecar."""
    folder = Path(folder)
    csv = folder / f"{schema.name}.csv"
    if not csv.exists() and csv.with_suffix(".csv.gz").exists():
        csv = csv.with_suffix(".csv.gz")
    return csv, folder / f"{schema.name}.json"


def machine_dir(machine: str) -> Path:
    return DATA_ROOT / machine


def recorded_machines(schema: Schema = BURST_GAP) -> list[str]:
    """Machines under data/ that hold this study (``paper`` excluded)."""
    if not DATA_ROOT.is_dir():
        return []
    return sorted(p.name for p in DATA_ROOT.iterdir() if paths(p, schema)[0].is_file())


# ------------------------------------------------------------------------------------------------- write
def write_json_atomic(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.fchmod(fd, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def start_file(folder: Path | str, schema: Schema, meta: dict) -> Path:
    """Create (or continue) ``<schema>.csv`` with its sidecar; returns the CSV path.

    Continuing keeps the first run's provenance and appends this run's to ``meta['runs']``.
    """
    csv, side = paths(folder, schema)
    if csv.suffix == ".gz":
        raise DataError(f"{csv} is compressed: gunzip it to resume or extend that sweep, or record elsewhere")
    meta = {**meta, "schema": schema.name, "schema_version": schema.version}
    if csv.exists() and side.exists():
        old = read_meta(side, schema)
        if old["schema_version"] != schema.version:
            raise DataError(f"{csv} holds schema v{old['schema_version']}; record v{schema.version} elsewhere")
        old.setdefault("runs", []).append({k: meta[k] for k in ("git_commit", "date_utc", "command", "params")})
        meta = old
    elif csv.exists():
        raise DataError(f"{csv} exists without its provenance sidecar {side.name}; move it away first")
    else:
        meta["runs"] = []
        csv.parent.mkdir(parents=True, exist_ok=True)
        with open(csv, "w") as f:
            f.write(",".join(schema.columns) + "\n")
    write_json_atomic(side, meta)
    return csv


def append_rows(csv: Path, schema: Schema, df: pd.DataFrame) -> None:
    """Append whole rows in one write + fsync (one configuration at a time)."""
    missing = [c for c in schema.columns if c not in df.columns]
    if missing:
        raise DataError(f"rows for {csv} lack columns {missing}")
    buf = io.StringIO()
    df[list(schema.columns)].to_csv(buf, header=False, index=False)
    data = buf.getvalue().encode()
    fd = os.open(csv, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


# -------------------------------------------------------------------------------------------------- read
def read_meta(side: Path, schema: Schema) -> dict:
    if not side.is_file():
        raise DataError(f"missing provenance sidecar {side}")
    try:
        meta = json.loads(side.read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"{side} is not valid JSON: {e}") from e
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise DataError(f"{side} lacks provenance fields {missing}")
    if meta["schema"] == schema.name and (schema.name, meta["schema_version"]) in MIGRATIONS:
        return meta
    if meta["schema"] != schema.name or meta["schema_version"] != schema.version:
        raise DataError(f"{side} holds schema {meta['schema']!r} v{meta['schema_version']}, "
                        f"expected {schema.name!r} v{schema.version}")
    return meta


def read_rows(csv: Path, schema: Schema, version: int | None = None) -> pd.DataFrame:
    if not csv.is_file():
        raise DataError(f"missing data file {csv}")
    try:
        df = pd.read_csv(csv)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise DataError(f"{csv} is not a readable CSV: {e}") from e
    if version is not None and version != schema.version:
        df = MIGRATIONS[(schema.name, version)](df)
    missing = [c for c in schema.columns if c not in df.columns]
    if missing:
        raise DataError(f"{csv} lacks columns {missing} (schema {schema.name} v{schema.version})")
    df = df[list(schema.columns) + [c for c in df.columns if c not in schema.columns]]
    try:
        df = df.astype(schema.columns)
    except (ValueError, TypeError) as e:
        raise DataError(f"{csv} has a malformed value: {e}") from e
    return df


def load(folder: Path | str, schema: Schema = BURST_GAP) -> tuple[pd.DataFrame, dict]:
    """Rows and provenance of one recorded study; clear errors naming the file."""
    csv, side = paths(folder, schema)
    meta = read_meta(side, schema)
    return read_rows(csv, schema, meta["schema_version"]), meta


def done_keys(csv: Path, schema: Schema) -> set[tuple]:
    """Configurations already recorded in ``csv`` (for resuming)."""
    if not csv.is_file():
        return set()
    df = read_rows(csv, schema)
    return set(df[list(schema.key)].itertuples(index=False, name=None))
