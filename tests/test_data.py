"""Recorded data: provenance is complete, malformed files give clear errors naming the file, sweeps append
whole configurations and resume."""
import gzip
import json
import shutil

import pandas as pd
import pytest

from xstage import burst_gap_sweep as sweep
from xstage import data, records
from xstage.model import BurstGapParams


@pytest.mark.parametrize("study,schema", [("burst_gap", data.BURST_GAP), ("free_running", data.BURST_GAP),
                                          ("bandwidth", data.BANDWIDTH)])
def test_recorded_data_loads_with_provenance(study, schema):
    df, meta = data.load(records.folder(study, "h200x2"), schema)
    assert len(df) > 100 and list(df.columns)[: len(schema.columns)] == list(schema.columns)
    assert meta["gpu_name"] == "NVIDIA H200" and meta["gpu_count"] == 2
    for k in data.REQUIRED_META:
        assert meta[k] not in (None, "", "unknown"), k


def test_recorded_burst_gap_grid_meets_the_issue():
    df, meta = data.load(records.folder("burst_gap", "h200x2"))
    issue = df[~df.drain]
    assert sorted(issue.burst_bytes.unique()) == [2**i * 1024 for i in range(13)]       # 1 KiB .. 4 MiB
    assert issue.gap_ns.nunique() >= 6 and issue.gap_ns.min() == 0 and issue.gap_ns.max() >= 100_000
    progs = sorted(issue.programs.unique())
    assert len(progs) >= 6 and progs[0] == 1 and progs[-1] == 2 * meta["sm_count"]
    assert issue.n_bursts.min() >= 8 and issue.repeat.nunique() >= 5
    assert set(issue.target) == {"remote", "local"}
    assert df.drain.any()


@pytest.fixture
def recorded_copy(tmp_path):
    dst = tmp_path / "m"
    dst.mkdir()
    csv, side = data.paths(records.folder("bandwidth", "h200x2"), data.BANDWIDTH)
    shutil.copy(csv, dst)
    shutil.copy(side, dst)
    return dst


def test_missing_files_are_named(recorded_copy):
    (recorded_copy / "bandwidth.csv").unlink()
    with pytest.raises(data.DataError, match="missing data file .*bandwidth.csv"):
        data.load(recorded_copy, data.BANDWIDTH)
    with pytest.raises(data.DataError, match="missing provenance sidecar .*burst_gap.json"):
        data.load(recorded_copy, data.BURST_GAP)


@pytest.mark.parametrize("breakage,match", [
    (lambda m: m.pop("driver"), r"lacks provenance fields \['driver'\]"),
    (lambda m: m.update(schema_version=99), "schema 'bandwidth' version 99"),
    (lambda m: m.update(schema="burst_gap"), "schema 'burst_gap'"),
])
def test_malformed_sidecar(recorded_copy, breakage, match):
    side = recorded_copy / "bandwidth.json"
    meta = json.loads(side.read_text())
    breakage(meta)
    side.write_text(json.dumps(meta))
    with pytest.raises(data.DataError, match=match):
        data.load(recorded_copy, data.BANDWIDTH)


def test_sidecar_not_json(recorded_copy):
    (recorded_copy / "bandwidth.json").write_text("{machine: h200")
    with pytest.raises(data.DataError, match="bandwidth.json is not valid JSON"):
        data.load(recorded_copy, data.BANDWIDTH)


@pytest.mark.parametrize("edit,match", [
    (lambda df: df.drop(columns=["gbps"]), r"lacks columns \['gbps'\]"),
    (lambda df: df.assign(programs="many"), "malformed value"),
])
def test_malformed_csv(recorded_copy, edit, match):
    csv = recorded_copy / "bandwidth.csv"
    edit(pd.read_csv(csv)).to_csv(csv, index=False)
    with pytest.raises(data.DataError, match=f"bandwidth.csv.*{match}|{match}"):
        data.load(recorded_copy, data.BANDWIDTH)


def test_gzip_csv_loads_and_refuses_to_resume(recorded_copy):
    csv = recorded_copy / "bandwidth.csv"
    with open(csv, "rb") as f, gzip.open(str(csv) + ".gz", "wb") as g:
        g.write(f.read())
    plain, _ = data.load(recorded_copy, data.BANDWIDTH)
    csv.unlink()
    packed, meta = data.load(recorded_copy, data.BANDWIDTH)
    pd.testing.assert_frame_equal(plain, packed)
    with pytest.raises(data.DataError, match="compressed"):
        data.start_file(recorded_copy, data.BANDWIDTH, meta)


def test_simulated_sweep_appends_whole_configurations_and_resumes(tmp_path):
    grid = sweep.BurstGapGrid(burst_kib=(4, 64), gap_us=(0, 10), programs=(4, 66), store_bytes=(16,),
                              targets=("remote",), n_bursts=4, repeats=2)
    csv = sweep.run_burst_gap(grid, tmp_path, source="simulated", params=BurstGapParams.reference())
    first = pd.read_csv(csv)
    assert len(first) == 2 * 2 * 2 * 2 * 4
    # an interrupted sweep: drop the last configuration's rows, run again -> only it is added back
    keep = first.iloc[: -2 * 4]
    keep.to_csv(csv, index=False)
    sweep.run_burst_gap(grid, tmp_path, source="simulated", params=BurstGapParams.reference())
    again = pd.read_csv(csv)
    assert len(again) == len(first)
    assert again[list(data.BURST_GAP.key)].drop_duplicates().shape[0] == 8
    meta = json.loads((tmp_path / "burst_gap.json").read_text())
    assert meta["machine"] == "simulated" and len(meta["runs"]) == 1
