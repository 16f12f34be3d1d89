"""MegaMoE round 7 (issue 15, items 3-5) on the CPU: tiles version 3 (bf16 through the TMA main loops) as the
default, the tma column of the megamoe / megamoe_gemm schemas (older rows read what they ran; a malformed value a
clear error), study controls7 end to end on the emulated world with TMA tiles (Triton's interpreter) and its
summary, the host-link summary beside round 4's record, and the device script's stages."""
import dataclasses
import random
import types

import numpy as np
import pandas as pd
import pytest
import torch

from xstage import data, env, studies
from xstage import moe_gemm as MG
from xstage import moe_plan as MP
from xstage.model import BurstGapParams
from xstage.numeric import geomean
from xstage.ranks import EmulatedWorld

TMA = MG.tma_tiles(MP.INTERPRETER_TILES)


# ------------------------------------------------------------------------------------------ tiles version 3
def test_tiles_version_3_is_bf16_through_tma_and_versions_1_2_are_what_records_ran(monkeypatch):
    monkeypatch.setattr(env, "interpreted", lambda: False)
    for bm in (64, 128):       # (version 3 named: the default is version 4 since session 11, test_megamoe_round9)
        v3, v2 = MP.gpu_tiles("bf16", bm, version=3), MP.gpu_tiles("bf16", bm, version=2)
        assert MP.TILES_VERSION >= 3 and v3.tma and not v2.tma and v3 == dataclasses.replace(v2, tma=True)
        assert MP.gpu_tiles("fp8", bm, version=3) == MP.gpu_tiles("fp8", bm, version=2)
        assert not MP.gpu_tiles("fp8", bm, version=3).tma
        assert not MP.gpu_tiles("bf16", bm, version=1).tma
    assert MG.tma_tiles(v2) == v3 and MG.tma_tiles(v3) == v3
    assert not MP.default_tiles("fp8", 1024.0, version=3).tma and MP.default_tiles("bf16", 1024.0, version=3).tma
    # study tiles6's variants name their main loops: swz16 stays the pointer loops under version 3
    v = MG.tiles6_variants(MP.gpu_tiles("bf16", 128, version=3))
    assert not v["swz16"][0].tma and v["tma"][0].tma and v["tma"][0] == MP.gpu_tiles("bf16", 128, version=3)
    MP.validate_problem(4096, 2048, 8, 2, 128, 2, MG.tma_tiles(MP.gpu_tiles("fp8", 64)), "fp8")  # round 8: accepted


def test_recorded_rows_read_the_main_loops_they_ran():
    """megamoe_gemm v2 (round 6's tiles6): tma exactly on the rows whose tiles label names it; megamoe v3 (the
    host_v2 sweep): every row the pointer loops; tiles_of_row carries it."""
    df, meta = data.load("data/h200x1/megamoe_round6_gemm", data.MEGAMOE_GEMM)
    assert meta["schema_version"] == 2 and df.tma.dtype == bool
    ours = df[df.method == "ours"]
    assert set(ours[ours.tma].variant) == {"tma", "tma_s3", "tma_swz16"}
    assert set(ours[~ours.tma].variant) == {"default", "swz16"}
    assert (ours.tma == ours.tiles.str.endswith(" tma")).all()
    row = ours[ours.variant == "tma"].iloc[random.randrange((ours.variant == "tma").sum())]
    assert MP.tiles_of_row(row).tma and MG.tile_label(MP.tiles_of_row(row)) == row.tiles
    host, hm = data.load("data/h200x1/megamoe_host_v2", data.MEGAMOE)
    assert hm["schema_version"] == 3 and not host.tma.any() and hm["params"]["tiles_version"] == 2


def _megamoe_file(folder, tma_values):
    cols = list(data.MEGAMOE.columns)
    lines = [",".join(cols)]
    for i, t in enumerate(tma_values):
        lines.append(",".join(t if c == "tma" else "bf16" if c == "dtype" else f"s{i}" if c == "schedule" else
                              "1" if data.MEGAMOE.columns[c] != "str" else "x" for c in cols))
    (folder / "megamoe.csv").write_text("\n".join(lines) + "\n")
    meta = {**env.provenance("test", {}), "schema": "megamoe", "schema_version": data.MEGAMOE.version, "runs": []}
    data.write_json_atomic(folder / "megamoe.json", {**meta, **data.integrity((folder / "megamoe.csv").read_bytes())})


def test_tma_column_round_trips_and_a_malformed_value_is_a_clear_error(tmp_path):
    good = tmp_path / "good"
    good.mkdir()
    _megamoe_file(good, ["True", "False"])
    df, meta = data.load(good, data.MEGAMOE)
    assert meta["schema_version"] == 4 and list(df.tma) == [True, False]
    for bad in ("maybe", ""):
        d = tmp_path / f"bad{bad}"
        d.mkdir()
        _megamoe_file(d, ["True", bad])
        with pytest.raises(data.DataError, match=r"megamoe.csv has a malformed value: tma must be True or False"
                                                 r".*line 3"):
            data.load(d, data.MEGAMOE)
    with pytest.raises(data.DataError, match="holds schema version 3; record version 4 elsewhere"):
        data.start_file("data/h200x1/megamoe_host_v2", data.MEGAMOE, env.provenance("test", {}))


# ------------------------------------------------------------------------------------------ study controls7
@pytest.fixture
def tiny(monkeypatch, cpu_timing):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: types.SimpleNamespace(multi_processor_count=2))
    monkeypatch.setattr(MG, "default_tiles", lambda *a, **k: TMA)          # the TMA main loops, as bf16's default
    shape = MP.MoEShape("tiny", 64, 32, 4, 2)
    return [MP.MoECase(shape, 12, "uniform", 1), MP.MoECase(shape, 8, "zipf", 2)]


@pytest.mark.interpreter
def test_controls7_end_to_end_with_tma_tiles(tmp_path, tiny):
    """controls7 through the launchers on the emulated world with TMA tiles: every schedule under dynamic, each
    list bit-identical to Expert-Wave static first, rows with tma, per-task timings, resume, the summary."""
    world = EmulatedWorld(2)
    meta = env.provenance("test", {"world": "one-gpu", "link": "emulated"})
    prm = BurstGapParams.reference().as_dict()
    MG.round3_job(world, tiny, ["fp16"], str(tmp_path), meta, "controls7", prm, None, rounds=5)
    df, side = data.load(tmp_path, data.MEGAMOE_GEMM)
    assert side["csv_rows"] == len(df) == 2 * len(MP.SCHEDULES) and set(df.study) == {"controls7"}
    assert set(df.schedule) == set(MP.SCHEDULES) and (df.assignment == "dynamic").all()
    assert df.tma.all() and set(df.tiles) == {MG.tile_label(TMA)} and (df.ms > 0).all()
    assert df.task_span_us.notna().all() and (df.variant == "default").all()
    assert all(MP.parse_schedule_param(p)["swizzle"] == MP.TILE_SWIZZLE for p in df.note.replace("-", ""))
    MG.round3_job(world, tiny, ["fp16"], str(tmp_path), meta, "controls7", prm, None, rounds=5)   # resume: nothing
    assert len(data.load(tmp_path, data.MEGAMOE_GEMM)[0]) == len(df)
    per = studies.megamoe_round7_controls(df)
    assert len(per) == len(df) and per.ew_over_static.isna().all()
    ew = per[per.schedule == "expert_wave"]
    assert np.allclose(ew.over_ew, 1.0)
    il = per[per.schedule == "interleaved"]
    d = df.set_index(["routing", "schedule"]).ms
    want = [d[(c.rsplit("_", 1)[1], "interleaved")] / d[(c.rsplit("_", 1)[1], "expert_wave")] for c in il.config]
    assert np.allclose(il.over_ew, want)
    sm = studies.megamoe_round7_controls_summary(per)
    row = sm[sm.schedule == "interleaved"].iloc[0]
    assert row.configs == 2 and row.over_ew_geomean == pytest.approx(geomean(il.over_ew))
    assert row.over_ew_worst == pytest.approx(il.over_ew.max())
    assert row.over_worst == int((il.over_ew > 1.05).sum())


def test_host_summary_counts_within_tolerance_beside_the_earlier_record():
    """megamoe_round7_host_summary on round 4's record against itself (the CPU has no round-7 sweep to read before
    the call): its speedups and the model's, the count within 10 %, and before_geomean equal to its own."""
    df, _ = studies.megamoe_world_data("one-gpu", "host", record="megamoe_host_v2")
    d = df[df["shape"] == random.choice(sorted(set(df["shape"])))]
    s = studies.megamoe_round7_host_summary(d, before=df)
    sp = studies.megamoe_speedups(d)
    for r in s.itertuples():
        g = sp[(sp.dtype == r.dtype) & (sp.schedule == r.schedule)].dropna(subset=["speedup"])
        assert r.configs == len(g) and r.geomean_speedup == pytest.approx(geomean(g.speedup))
        assert r.within == int((g.model_error.abs() <= 0.1).sum())
        assert r.before_geomean == pytest.approx(r.geomean_speedup) and r.before_configs == r.configs
    assert set(s.schedule) == set(MP.SCHEDULES) - {"expert_wave"}


def test_round7_script_runs_the_tests_the_controls_and_the_host_sweep_into_new_folders():
    text = open("scripts/megamoe_round7.sh").read()
    assert "megamoe_stages.sh" in text and "stage() {" not in text and "NCCL_NVLS_ENABLE=0" in text
    assert "--study controls7" in text and "megamoe_round7_controls" in text and "megamoe_round7_host" in text
    assert "tests/test_megamoe_gemm6.py" in text and "tests/test_moe_one_gpu.py" in text
    assert "--link host" in text and "data/h200x1/megamoe_round7_host/$f" in text      # resumed from the record
    recs = studies.MEGAMOE_HOST_RECORDS                                          # newest first: later rounds precede it
    assert studies.MEGAMOE_ROUND7_HOST in recs and recs.index(studies.MEGAMOE_ROUND7_HOST) < recs.index("megamoe_host_v2")


# ------------------------------------------------------------------------------------------ the recorded round 7
R7_COMMIT = "6d5a5298795802cfa70d9cff9eda677416d9ba17"      # call M9-1
L91_COMMIT = "aad97d82936a711c0aeaafcd2fe6c528ed7eb506"     # call L9-1: the host sweep resumed
M101_COMMIT = "dc3a4a3860625625514543d67cb7071c08b07b24"   # call M10-1 (session 10): the last 22 pairs


def _config(d):
    return d["shape"] + "_T" + d.tokens.astype(str) + "_" + d.routing


def test_recorded_controls7_every_configuration_and_the_summary_from_the_rows():
    """data/h200x1/megamoe_round7_controls (call M9-1): all 84 configurations x bf16 / fp8 x every schedule, dynamic,
    the default tiles of version 3 (bf16 rows TMA, fp8 rows the pointer loops); a random schedule's geomean and
    worst recomputed from the raw rows; the goal's geomean met everywhere, and the pairs over 5 % exactly those the
    lab draft names."""
    df, meta = data.load("data/h200x1/megamoe_round7_controls", data.MEGAMOE_GEMM)
    assert meta["git_commit"] == R7_COMMIT and meta["params"]["tiles_version"] == 3
    assert set(df.study) == {"controls7"} and (df.assignment == "dynamic").all()
    for dt, g in df.groupby("dtype"):
        assert g.groupby(_config(g)).schedule.apply(frozenset).eq(frozenset(MP.SCHEDULES)).all()
        assert set(_config(g)) == {c.name for c in MP.CASES}
        assert (g.tma == (dt == "bf16")).all() and (g.tiles.str.endswith(" tma") == (dt == "bf16")).all()
    per = studies.megamoe_round7_controls(df)
    sm = studies.megamoe_round7_controls_summary(per).set_index(["dtype", "schedule"])
    dt, sch = random.choice(["bf16", "fp8"]), random.choice(["interleaved", "lag", "model_guided"])
    g = df[df.dtype == dt].assign(config=lambda x: _config(x)).set_index(["config", "schedule"]).ms
    r = np.array([g[(c.name, sch)] / g[(c.name, "expert_wave")] for c in MP.CASES])
    assert sm.loc[(dt, sch), "configs"] == 84 and sm.loc[(dt, sch), "over_ew_geomean"] == pytest.approx(geomean(r))
    assert sm.loc[(dt, sch), "over_ew_worst"] == pytest.approx(r.max())
    assert (sm.over_ew_geomean <= studies.MEGAMOE_ORDER_GOALS["geomean"]).all()
    over = per[per.over_ew > 1.05]
    assert set(zip(over.config, over.dtype, over.schedule)) == {
        ("deepseek_v4_pro_T2048_uniform", "bf16", "model_guided"), ("deepseek_v4_pro_T8192_hot", "bf16", "lag"),
        ("qwen3_235b_T4096_hot", "bf16", "model_guided"), ("qwen3_235b_T8192_zipf", "fp8", "interleaved"),
        ("mixtral_8x7b_T256_hot", "fp8", "lag")}


def test_recorded_host7_is_a_prefix_of_the_sweep_order_and_its_summary_from_the_rows():
    """data/h200x1/megamoe_round7_host (call M9-1, time-bounded): tiles version 3 (bf16 rows TMA), the pairs it holds
    are the first of the sweep's fixed order (none chosen or dropped), every schedule per pair; the model's count
    within 10 % and the geomean speedup recomputed from the raw rows."""
    df, meta = data.load("data/h200x1/megamoe_round7_host", data.MEGAMOE)
    assert meta["git_commit"] == R7_COMMIT and meta["params"]["tiles_version"] == 3
    assert (df.tma == (df.dtype == "bf16")).all()
    have = set(zip(_config(df), df.dtype))
    order = [(c.name, d) for c, d in MG._pairs(list(MP.CASES), ["bf16", "fp8"])]
    assert have == set(order[:len(have)]) and len(have) == 72 + 74 + 22 == 168   # M9-1, L9-1, M10-1 (resumed)
    assert [r["git_commit"] for r in meta["runs"]] == [L91_COMMIT, M101_COMMIT]
    assert df.groupby([_config(df), df.dtype]).schedule.nunique().eq(len(MP.SCHEDULES)).all()
    s = studies.megamoe_round7_host_summary(df).set_index(["dtype", "schedule"])
    dt, sch = random.choice(["bf16", "fp8"]), random.choice(["interleaved", "lag", "model_guided"])
    d = df[df.dtype == dt].assign(config=lambda x: _config(x)).set_index(["config", "schedule"])
    cs = sorted({c for c, _ in d.index})
    sp = np.array([d.kernel_ms[(c, "expert_wave")] / d.kernel_ms[(c, sch)] for c in cs])
    err = np.array([d.predicted_speedup[(c, sch)] for c in cs]) / sp - 1
    assert s.loc[(dt, sch), "configs"] == len(cs) and s.loc[(dt, sch), "geomean_speedup"] == pytest.approx(geomean(sp))
    assert s.loc[(dt, sch), "within"] == int((np.abs(err) <= 0.1).sum())
