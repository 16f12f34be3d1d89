"""MegaMoE round 14 (session 18, call S18-1): the one-GPU host-link sweep with the schedules timed in rounds
(moe_sweep.TIMING "round_robin"), replayed from data/: complete, its every timed run consistent with the record's
medians (studies.megamoe_timed_runs), the run drift study (studies.megamoe_run_drift), and the model rescored on the
observed rank alone (moe_plan.repredict(observed_rank=...)), which reproduces what the sweep itself predicted."""
import gzip
import json

import numpy as np
import pandas as pd
import pytest

from xstage import data, studies
from xstage import moe_plan as MP
from xstage.model import params_from_dict
from xstage.moe_round6 import host_rescore

ROOT = data.machine_dir("h200x1")
REC = studies.MEGAMOE_ROUND14_HOST


@pytest.fixture(scope="module")
def record():
    return studies.megamoe_world_data("one-gpu", "host", record=REC)


def test_round14_is_complete_and_timed_in_rounds(record):
    df, meta = record
    assert studies.MEGAMOE_HOST_RECORDS[0] == REC                       # the newest host record first
    p = meta["params"]
    assert p["timing"] == "round_robin" and p["observed_rank"] == 0 and p["world"] == "one-gpu"
    cov = studies.megamoe_coverage(df)
    assert (cov.complete == cov.expected).all() and int(cov.complete.sum()) == 168
    # every record before it was timed in blocks (no timing field)
    _, m13 = studies.megamoe_world_data("one-gpu", "host", record=studies.MEGAMOE_ROUND13_HOST)
    assert "timing" not in m13["params"]


def test_timed_runs_are_the_records_medians(record):
    """runs.jsonl.gz (the sweep's 'megamoe-runs' lines) against the CSV: the kernel's median and fastest, the
    compute-only and the layer medians of every (configuration, dtype, schedule) row."""
    df, _ = record
    runs = studies.megamoe_timed_runs(REC)
    assert len(runs) == 168 * 4 * 20 and (runs.groupby(["config", "dtype", "schedule"]).run.max() == 19).all()
    med = runs.groupby(["config", "dtype", "schedule"], sort=False).agg(
        k=("kernel_ms", "median"), kmin=("kernel_ms", "min"), loc=("local_ms", "median"), lay=("layer_ms", "median"))
    csv = df.assign(config=df["shape"] + "_T" + df.tokens.astype(str) + "_" + df.routing).set_index(
        ["config", "dtype", "schedule"])
    j = med.join(csv[["kernel_ms", "kernel_ms_min", "compute_sched_ms", "layer_ms"]], how="inner")
    assert len(j) == len(csv) == len(med)
    np.testing.assert_allclose(j.k, j.kernel_ms, rtol=1e-12)
    np.testing.assert_allclose(j.kmin, j.kernel_ms_min, rtol=1e-12)
    np.testing.assert_allclose(j["loc"], j.compute_sched_ms, rtol=1e-12)
    np.testing.assert_allclose(j.lay, j.layer_ms, rtol=1e-12)


def test_run_drift_by_hand():
    """Two schedules, 8 runs: Expert-Wave rising 10 % in its second half, lag 1.05 x it in every round."""
    ew = np.array([1.0, 1.0, 1.0, 1.0, 1.1, 1.1, 1.1, 1.1])
    runs = pd.concat([pd.DataFrame({"config": "c", "dtype": "bf16", "schedule": s, "run": np.arange(8),
                                    "kernel_ms": v, "local_ms": v, "layer_ms": v})
                      for s, v in (("expert_wave", ew), ("lag", 1.05 * ew))], ignore_index=True)
    d = studies.megamoe_run_drift(runs).set_index("schedule")
    assert d.rise["expert_wave"] == pytest.approx(0.1) and d.rise["lag"] == pytest.approx(0.1)
    assert d.over_ew_rounds["lag"] == pytest.approx(1.05) and d.rounds_iqr["lag"] == pytest.approx(0.0, abs=1e-12)
    assert np.isnan(d.over_ew["expert_wave"])
    with pytest.raises(ValueError, match="no expert_wave runs"):
        studies.megamoe_run_drift(runs[runs.schedule == "lag"])


def test_timed_runs_missing_and_malformed(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "DATA_ROOT", tmp_path)
    with pytest.raises(studies.NoRecordedData, match="XSTAGE_MEGAMOE_RUNS"):
        studies.megamoe_timed_runs(REC)
    d = tmp_path / "h200x1" / REC
    d.mkdir(parents=True)
    with gzip.open(d / "runs.jsonl.gz", "wt") as f:
        f.write(json.dumps({"config": "c", "dtype": "bf16", "schedule": "lag", "kernel_ms": [1.0, 2.0],
                            "local_ms": [1.0], "layer_ms": [1.0, 2.0]}) + "\n")
    with pytest.raises(ValueError, match="unequal length"):
        studies.megamoe_timed_runs(REC)
    with gzip.open(d / "runs.jsonl.gz", "wt") as f:
        f.write(json.dumps({"config": "c", "dtype": "bf16", "schedule": "lag", "kernel_ms": [1.0]}) + "\n")
    with pytest.raises(ValueError, match="missing local_ms, layer_ms"):
        studies.megamoe_timed_runs(REC)


def test_rescore_reproduces_the_sweeps_own_prediction(record):
    """The one-GPU sweep times and calibrates rank 0 alone; rescored on that rank under the record's own stall model
    the cost model gives the recorded predictions exactly (taking the slowest rank, as before session 18, moved
    Mixtral's hot configurations by up to 0.14)."""
    df, meta = record
    sp, _ = host_rescore(df, meta)
    rec = studies.megamoe_speedups(df)
    j = sp.merge(rec[["config", "dtype", "schedule", "predicted_speedup"]], on=["config", "dtype", "schedule"],
                 suffixes=("", "_rec"))
    assert len(j) == 504
    np.testing.assert_allclose(j.predicted_speedup, j.predicted_speedup_rec, rtol=1e-9)


def test_observed_rank_is_one_rank_of_the_slowest(record):
    """repredict over every rank takes the slowest; each rank alone is one term of that maximum."""
    df, meta = record
    prm = params_from_dict(meta["params"]["prm"])
    g = df[(df["shape"] == "mixtral_8x7b") & (df.tokens == 256) & (df.routing == "hot") & (df.dtype == "bf16")]
    args = (prm, 132, "dynamic", MP.record_wait(meta), MP.record_stall(meta))
    both = MP.repredict(g, *args).set_index("schedule").model_ms
    per = [MP.repredict(g, *args, observed_rank=r).set_index("schedule").model_ms for r in (0, 1)]
    np.testing.assert_allclose(both, np.maximum(per[0], per[1]), rtol=1e-12)
    assert (per[0] - per[1]).abs().max() > 1e-3 * both.max()             # hot routing: the ranks differ
    with pytest.raises(ValueError, match="observed_rank 2 is not a rank of a 2-rank world"):
        MP.repredict(g, *args, observed_rank=2)
