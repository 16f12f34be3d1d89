"""The registry of studies and records (xstage/records.py) matches data/: one current record per study, machine
and link; every record there loads, sealed, with its schema; nothing under data/ is unregistered."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from xstage import data, records

ROOT = Path(__file__).resolve().parents[1]
# files under data/<machine>/ that are not a record folder: the stage fits (read by xstage.model.load_params)
# and the archive's index
LOOSE = {"archive/README.md"}


def test_one_current_record_per_study_machine_and_link():
    seen = {}
    for r in records.records():
        key = (r.study, r.machine, r.link)
        assert key not in seen, f"two current records for {key}: {seen[key]} and {r.folder}"
        seen[key] = r.folder
    assert all(r.study in records.STUDIES for r in records.RECORDS), "a record names an unknown study"
    assert all(r.link in records.LINKS for r in records.RECORDS)
    assert all(r.machine in records.MACHINES for r in records.RECORDS)


@pytest.mark.parametrize("rec", records.RECORDS, ids=lambda r: f"{r.machine}/{r.folder}")
def test_every_record_loads_sealed(rec):
    if rec.schema in data.JSONL_KINDS:
        lines, meta = data.load_jsonl(rec.path, rec.schema)
        assert lines and meta["command"]
    else:
        df, meta = data.load(rec.path, data.SCHEMAS[rec.schema])
        assert len(df) == meta["csv_rows"] > 0
    assert rec.command and rec.shows


def _record_dirs(machine_dir: Path) -> set[str]:
    """Folders (relative to data/<machine>/) that hold a record's JSON sidecar."""
    return {str(p.parent.relative_to(machine_dir)) for p in machine_dir.rglob("*.json")}


@pytest.mark.parametrize("machine", sorted(records.MACHINES))
def test_nothing_under_data_is_unregistered(machine):
    mdir = data.DATA_ROOT / machine
    registered = {str(r.path.relative_to(mdir)) for r in records.RECORDS if r.machine == machine}
    found = _record_dirs(mdir)
    assert found - registered == set(), f"data/{machine}: folders no record names: {sorted(found - registered)}"


@pytest.mark.parametrize("machine", sorted(records.MACHINES))
def test_archive_index_is_current(machine):
    index = data.DATA_ROOT / machine / records.ARCHIVE / "README.md"
    if not records.archived(machine):
        assert not index.exists(), f"{index} lists no archived record: remove it"
        return
    assert index.read_text() == records.archive_index(machine), f"{index} is stale: run `make readme`"


def test_a_changed_jsonl_record_is_caught(tmp_path):
    import shutil

    rec = records.record("gpc_map", "h200x1")
    shutil.copytree(rec.path, tmp_path / "m")
    lines, _ = data.load_jsonl(tmp_path / "m", "gpc_map")
    (tmp_path / "m" / "gpc_map.jsonl").write_text("\n".join(json.dumps(x) for x in lines[:-1]) + "\n")
    with pytest.raises(data.DataError, match="does not match its sidecar"):
        data.load_jsonl(tmp_path / "m", "gpc_map")


def test_lookup_errors_name_the_study():
    with pytest.raises(records.UnknownRecord, match="unknown study 'nope'"):
        records.record("nope")
