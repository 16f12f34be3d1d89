"""The 8-GPU prediction (xstage.scale_analysis, xstage.prediction_analysis): the vectorised pricing is the cost
model's formula, the sealed file holds what the committed code computes from the committed records, it names its
commit and it precedes every 8-GPU or 8-rank measurement; writing it is refused once one exists."""
from __future__ import annotations

import hashlib
import json
import subprocess

import numpy as np
import pandas as pd
import pytest

from xstage import data, env
from xstage import prediction_analysis as PA
from xstage import scale_analysis as S
from xstage.model import load_params
from xstage.moe_cost import CostModel, predict_kernel_ns
from xstage.moe_plan import CASES, TILE_SWIZZLE, TileGrid, build_schedule, gpu_default_tiles, routing_of
from xstage.numeric import geomean

CENTRAL = ("expert_wave_ms", "interleaved_ms", "speedup")


@pytest.fixture(scope="module")
def sealed():
    return PA.prediction_tables(), PA.read_prediction()[1]


@pytest.fixture(scope="module")
def same_inputs(sealed):
    """The reproduction tests need the inputs the prediction was made from: once one is re-recorded the sealed
    file stands as it is (it reproduces at its own commit), and they skip saying so."""
    meta = sealed[1]
    if meta["inputs"] != PA.input_hashes():
        pytest.skip(f"an input was re-recorded after the prediction: it reproduces at commit {meta['git_commit']}")


def _central_stage():
    return S.stage_draws(S.stage_param_draws(0), S.error_draws(0))


def test_priced_ns_is_the_cost_model():
    """Draw 0 of the vectorised round loop equals moe_cost.predict_kernel_ns (stall round_shared, dynamic claims),
    and the combine's bytes cost time (a list priced without them is faster)."""
    prm = load_params(data.machine_dir("h200x2"), "nvlink")
    case = next(c for c in CASES if c.name == "qwen3_235b_T512_zipf")
    s = case.shape
    lay = routing_of(case, S.WORLD)[2][5]
    for dtype, rate in (("bf16", 3.1), ("fp8", 0.9)):
        tiles = gpu_default_tiles(dtype, case.tokens * S.WORLD * s.topk / s.experts)
        grid = TileGrid.of(lay, s.hidden, s.intermediate, tiles, TILE_SWIZZLE)
        rr = grid.remote_rows_per_block(lay)
        for sch in S.SCHEDULES:
            tl = build_schedule(sch, grid, S.N_SMS)
            u = S.unit_terms(tl, rr, S.N_SMS, 2, s.hidden, s.intermediate, tiles)
            for stall in ("round_shared", "issuers"):
                ref = predict_kernel_ns(tl, rr, CostModel(prm, rate, S.N_SMS, 2, "dynamic", None, stall),
                                        s.hidden, s.intermediate, tiles)["total_ns"]
                assert S.priced_ns(u, rate, S.stage_draws([prm], [1.0]), stall)[0] == pytest.approx(ref, rel=1e-12)
            got = S.priced_ns(u, rate, S.stage_draws([prm], [1.0]))[0]
            none = S.priced_ns(S.unit_terms(tl, rr * 0, S.N_SMS, 2, s.hidden, s.intermediate, tiles), rate,
                               S.stage_draws([prm], [1.0]))[0]
            assert none < got


def test_the_sealed_file_is_a_prediction_made_before_any_scale_measurement(sealed):
    t, meta = sealed
    assert meta["measured"] is False and "prediction" in meta["note"] and meta["kind"] == S.KIND
    assert set(meta["inputs"]) == set(PA.input_hashes()), "the prediction's inputs are not the registered records"
    when = pd.Timestamp(meta["date_utc"])
    for rel in PA.scale_measurements():   # none yet; once one exists it must be dated after the prediction
        side = next((data.DATA_ROOT / rel).glob("*.json"))
        assert pd.Timestamp(json.loads(side.read_text())["date_utc"]) > when, f"{rel} predates the prediction"
    if env.git_commit():
        ok = subprocess.run(["git", "cat-file", "-e", f"{meta['git_commit']}^{{commit}}"], cwd=env.REPO_ROOT,
                            capture_output=True).returncode == 0
        assert ok, f"the sealed prediction names commit {meta['git_commit']}, which this checkout lacks"
        # the inputs it names were committed at its commit, with the sha256 it records
        for rel, sha in meta["inputs"].items():
            path = (data.DATA_ROOT / rel).relative_to(env.REPO_ROOT)
            side = path / next(p.name for p in (data.DATA_ROOT / rel).glob("*.json")) if (data.DATA_ROOT /
                                                                                           rel).is_dir() else None
            blob = subprocess.run(["git", "show", f"{meta['git_commit']}:{side or path}"], cwd=env.REPO_ROOT,
                                  capture_output=True).stdout
            assert blob, f"{rel} is not in the prediction's commit"
            assert (json.loads(blob)["csv_sha256"] if side else hashlib.sha256(blob).hexdigest()) == sha, rel


def test_scale_measurements_finds_eight_gpus_and_eight_ranks(tmp_path):
    """8 GPUs, 8-rank traffic on 2 GPUs, a world of 8 ranks: each counts; 2 GPUs, the paper and the prediction
    itself do not."""
    def side(rel, meta):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(json.dumps(meta))
    side("h200x8/megamoe/megamoe.json", {"gpu_count": 8, "params": {}})
    side("h200x2/traffic8/megamoe_traffic.json", {"schema": "megamoe_traffic", "gpu_count": 2})
    side("h200x1/ulysses_p8/ulysses.json", {"gpu_count": 1, "params": {"world_size": 8}})
    side("h200x2/megamoe/megamoe.json", {"gpu_count": 2, "params": {"world_size": 2}})
    side("paper/headline.json", {"gpu_count": 8})
    side("h200x8/prediction/scale_prediction.json", {"gpu_count": 8})
    assert PA.scale_measurements(tmp_path) == ["h200x1/ulysses_p8", "h200x2/traffic8", "h200x8/megamoe"]


def test_writing_is_refused_after_a_measurement_and_over_a_sealed_file(monkeypatch, tmp_path):
    monkeypatch.setattr(PA, "scale_measurements", lambda root=None: ["h200x8/megamoe"])
    with pytest.raises(ValueError, match="would not precede it"):
        PA.write_prediction(tmp_path)
    monkeypatch.setattr(PA, "scale_measurements", lambda root=None: [])
    (tmp_path / f"{S.KIND}.jsonl").write_text("{}\n")
    with pytest.raises(ValueError, match="sealed already"):
        PA.write_prediction(tmp_path)
    assert (tmp_path / f"{S.KIND}.jsonl").read_text() == "{}\n"
    assert PA.main(["--write"]) == 2       # the registered one is sealed: the CLI says so in one line


def test_the_summaries_are_those_of_the_lines(sealed):
    t, meta = sealed
    s, mm, u = t["summary"], t["megamoe_config"], t["ulysses_shape"]
    for dtype, g in mm.groupby("dtype"):
        assert len(g) == 84
        row = s[(s.study == "megamoe") & (s.dtype == dtype)].set_index("metric")
        assert row.central["geomean_speedup"] == pytest.approx(geomean(g.speedup), rel=1e-9)
        assert row.central["max_speedup"] == pytest.approx(g.speedup.max(), rel=1e-9)
    assert s[s.study == "ulysses"].central.max() == pytest.approx(u.speedup.max(), rel=1e-9)
    assert (s.p5 <= s.p95).all() and (u.H % S.WORLD == 0).all()
    assert set(s.paper) == {1.18, 1.62, 1.43, 1.42}


def test_the_sealed_file_reproduces_from_the_code_and_records(sealed, same_inputs):
    """A few configurations' central values and every Ulysses shape's, recomputed (the slow test: all of it)."""
    t, _ = sealed
    mm = t["megamoe_config"].set_index(["config", "dtype"])
    rec = S.compute_records()
    st = _central_stage()
    for name, dtype in (("qwen3_235b_T256_uniform", "bf16"), ("deepseek_v4_flash_T512_hot", "fp8")):
        case = next(c for c in CASES if c.name == name)
        row = rec[(rec["shape"] == case.shape.name) & (rec.tokens == case.tokens) & (rec.routing == case.routing)
                  & (rec.dtype == dtype)].iloc[0]
        got = S.megamoe_config(case, dtype, row, st, np.ones(1))
        for k in CENTRAL:
            assert got[k] == pytest.approx(mm.loc[(name, dtype), k], rel=1e-9), (name, dtype, k)
    per, _ = S.ulysses_prediction(n_draws=2)
    want = t["ulysses_shape"].set_index("shape")
    for r in per.itertuples():
        for k in ("attention_ms", "alltoall_ms", "fused_extra_ms", "speedup"):
            assert getattr(r, k) == pytest.approx(want.loc[r.shape, k], rel=1e-9), (r.shape, k)


@pytest.mark.slow
def test_the_whole_sealed_file_reproduces(sealed, same_inputs):
    _, meta = sealed
    lines, _ = PA.read_prediction()
    again = PA.prediction_lines(meta["params"]["n_draws"], meta["params"]["seed"])
    assert len(again) == len(lines)
    for a, b in zip(again, lines):
        assert a.keys() == b.keys()
        for k, v in a.items():
            assert v == (pytest.approx(b[k], rel=1e-9) if isinstance(v, float) else b[k]), (a.get("config"), k)


def test_two_nodes_are_labelled_public_numbers():
    """The two-node figures take the NIC's public numbers (not fitted): the drain is the DeepEP measurement, and a
    shallower send queue is never faster."""
    st = S.nic_stage(1.0)
    assert st.drain_gbps[0] == S.NIC["measured_gbps"] < S.NIC["line_gbps"]
    d = S.two_node_megamoe(configs=["qwen3_235b_T1024_uniform"])
    assert d.expert_wave_ms_q1.iloc[0] >= d.expert_wave_ms_q16.iloc[0] - 1e-12
    assert d.expert_wave_ms_q16.iloc[0] >= d.compute_ms.iloc[0]
