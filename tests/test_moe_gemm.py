"""The compute-only studies of MegaMoE (xstage.moe_gemm: library, controls) end to end on the CPU (Triton interpreter, emulated
one-process world): every variant checked against the float32 reference and bit-identical across schedules
before timing, rows with provenance, resume; a library call that fails is recorded unavailable (NaN, never 0)."""
import time
import types

import numpy as np
import pytest
import torch

from xstage import data, env
from xstage import megamoe_analysis as analysis
from xstage import moe_gemm as MG
from xstage import moe_plan as MP
from xstage.model import BurstGapParams
from xstage.ranks import EmulatedWorld

TILES = MP.TileConfig(16, 32, 32, 32, num_warps=4, num_stages=1)


@pytest.fixture
def tiny(monkeypatch, cpu_timing):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: types.SimpleNamespace(multi_processor_count=2))
    monkeypatch.setattr(MG, "default_tiles", lambda *a, **k: TILES)
    shape = MP.MoEShape("tiny", 128, 64, 4, 2)
    return [MP.MoECase(shape, 24, "uniform", 1), MP.MoECase(shape, 16, "zipf", 2)]


def test_library_study_end_to_end(tmp_path, tiny):
    """Study library on the emulated one-process world: rows checked against the float32 reference, timed,
    resumed; the analysis' ratios recomputed from the rows."""
    world = EmulatedWorld(2)
    meta = env.provenance("test", {"world": "one-gpu", "link": "emulated"})
    prm = BurstGapParams.reference().as_dict()
    MG.study_job(world, tiny[:1], ["fp16"], str(tmp_path), meta, "library", prm, None, rounds=5)
    df, side = data.load(tmp_path, data.MEGAMOE_GEMM)
    assert side["csv_rows"] == len(df) == 2 and set(df.study) == {"library"}
    ours = df[df.method == "ours"]
    assert set(ours.variant) == {"default"} and ours.is_default.all()
    assert (ours.rel_l2 > 0).all() and (ours.rel_l2 < 0.05).all() and (df.ms > 0).all() and (df.tflops > 0).all()
    assert (df.n_timed == 5).all() and (df.status == "ok").all() and set(df.method) == {"ours", "torch._grouped_mm"}
    MG.study_job(world, tiny[:1], ["fp16"], str(tmp_path), meta, "library", prm, None, rounds=5)   # resume
    assert len(data.load(tmp_path, data.MEGAMOE_GEMM)[0]) == 2
    lib = analysis.library_ratios(df)
    g = df[df.method == "torch._grouped_mm"].set_index("routing").ms
    o = df[df.method == "ours"].set_index("routing").ms
    one = lib.iloc[0]
    assert one.default_vs_grouped_mm == pytest.approx(g["uniform"] / o["uniform"])


@pytest.mark.slow
def test_controls_study_end_to_end(tmp_path, tiny):
    """Every schedule's compute-only time, checked bit-identical first, timed; the analysis' ratios from the rows."""
    world = EmulatedWorld(2)
    meta = env.provenance("test", {"world": "one-gpu", "link": "emulated"})
    prm = BurstGapParams.reference().as_dict()
    MG.study_job(world, tiny[:1], ["fp16"], str(tmp_path / "c"), meta, "controls", prm, None, rounds=5)
    c = data.load(tmp_path / "c", data.MEGAMOE_GEMM)[0]
    assert list(c.schedule) == list(MP.SCHEDULES) and set(c.study) == {"controls"} and (c.ms > 0).all()
    per = analysis.controls(c)
    ew = float(c[c.schedule == "expert_wave"].ms.iloc[0])
    for r in per.itertuples():
        assert r.over_ew == pytest.approx(float(c[c.schedule == r.schedule].ms.iloc[0]) / ew)
    MG.study_job(world, tiny, ["fp16"], str(tmp_path / "c"), meta, "controls", prm, time.time() - 1, rounds=5)
    assert len(data.load(tmp_path / "c", data.MEGAMOE_GEMM)[0]) == len(c)    # past the deadline: nothing new


def test_a_failing_library_call_is_recorded_unavailable_never_zero(tmp_path, tiny, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("no grouped GEMM here")
    monkeypatch.setattr(MG, "_unfused_gemms", broken)
    MG.study_job(EmulatedWorld(2), tiny[:1], ["fp16"], str(tmp_path), env.provenance("test", {}), "library",
                 BurstGapParams.reference().as_dict(), None, rounds=5)
    df = data.load(tmp_path, data.MEGAMOE_GEMM)[0]
    lib = df[df.method == "torch._grouped_mm"]
    assert len(lib) == 1 and lib.status.iloc[0] == "unavailable" and "no grouped GEMM" in lib.note.iloc[0]
    assert lib.ms.isna().all() and lib.tflops.isna().all()


def test_rowwise_fp8_and_bad_inputs():
    t = torch.randn(3, 5, 256)
    q, s = MG._rowwise_fp8(t)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (3, 5)
    back = q.float() * s[..., None]
    assert float((back - t).norm() / t.norm()) < 0.05
    for kw, match in ((dict(study="x"), "study must be one of"), (dict(rounds=2), "rounds must be >= 5"),
                      (dict(cases=["nope"]), "unknown case"), (dict(dtypes=["fp4"]), "dtypes must be"),
                      (dict(max_minutes=0), "max_minutes must be > 0")):
        with pytest.raises(ValueError, match=match):
            MG.run_megamoe_gemm("/nonexistent", **kw)
