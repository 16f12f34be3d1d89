"""The GEMM / order-cost study of MegaMoE (xstage.moe_gemm) end to end on the CPU (Triton interpreter, emulated
one-process world): every variant checked against the float32 reference and bit-identical across schedules
before timing, rows with provenance, resume; a library call that fails is recorded unavailable (NaN, never 0)."""
import time
import types

import numpy as np
import pytest
import torch

from xstage import data, env, studies
from xstage import moe_gemm as MG
from xstage import moe_plan as MP
from xstage.model import BurstGapParams
from xstage.ranks import EmulatedWorld

TILES = MP.TileConfig(16, 32, 32, 32, num_warps=4, num_stages=1)


@pytest.fixture
def tiny(monkeypatch, cpu_timing):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: types.SimpleNamespace(multi_processor_count=2))
    monkeypatch.setattr(MG, "default_tiles", lambda *a, **k: TILES)
    monkeypatch.setattr(MG, "VARIANTS", {"fp16": {"default": {}, "bn2_64": dict(block_n2=64)}})
    monkeypatch.setattr(MG, "ROUNDS", 5)
    shape = MP.MoEShape("tiny", 128, 64, 4, 2)
    return [MP.MoECase(shape, 24, "uniform", 1), MP.MoECase(shape, 16, "zipf", 2)]


def test_ladder_and_order_studies_end_to_end(tmp_path, tiny):
    world = EmulatedWorld(2)
    meta = env.provenance("test", {"world": "one-gpu", "link": "emulated"})
    prm = BurstGapParams.reference().as_dict()
    MG.gemm_job(world, tiny, ["fp16"], str(tmp_path), meta, "ladder", prm, None, rounds=5)
    df, side = data.load(tmp_path, data.MEGAMOE_GEMM)
    assert side["csv_rows"] == len(df) == 2 * 3 and set(df.study) == {"ladder"}
    ours = df[df.method == "ours"]
    assert set(ours.variant) == {"default", "bn2_64"} and (ours.block_n2[ours.variant == "bn2_64"] == 64).all()
    assert (ours.rel_l2 > 0).all() and (ours.rel_l2 < 0.05).all() and (df.ms > 0).all() and (df.tflops > 0).all()
    assert (df.n_timed == 5).all() and (df.status == "ok").all() and set(df.method) == {"ours", "torch._grouped_mm"}
    assert (ours.is_default == (ours.variant == "default")).all()
    MG.gemm_job(world, tiny, ["fp16"], str(tmp_path), meta, "ladder", prm, None, rounds=5)   # resume: nothing new
    assert len(data.load(tmp_path, data.MEGAMOE_GEMM)[0]) == 6
    MG.gemm_job(world, tiny[:1], ["fp16"], str(tmp_path), meta, "order", prm, None, rounds=5)
    df = data.load(tmp_path, data.MEGAMOE_GEMM)[0]
    order = df[df.study == "order"]
    assert len(order) == len(MP.SCHEDULES) * len(MP.ASSIGNMENTS)
    assert set(zip(order.schedule, order.assignment)) == {(s, a) for s in MP.SCHEDULES for a in MP.ASSIGNMENTS}
    assert (order.ms > 0).all() and np.isfinite(order.rel_l2).all()
    MG.gemm_job(world, tiny, ["fp16"], str(tmp_path), meta, "order", prm, time.time() - 1, rounds=5)  # past deadline
    assert len(data.load(tmp_path, data.MEGAMOE_GEMM)[0]) == len(df)
    lad = studies.megamoe_gemm_ladder(df)
    assert len(lad) == 4 and lad.vs_grouped_mm.notna().all() and lad.vs_scaled_grouped_mm.isna().all()
    g = df[(df.study == "ladder") & (df.method == "torch._grouped_mm")].set_index("routing").tflops
    one = lad[(lad.variant == "default") & lad.config.str.endswith("zipf")].iloc[0]
    assert one.vs_grouped_mm == pytest.approx(one.tflops / g["zipf"])
    summ = studies.megamoe_gemm_summary(lad)
    assert set(summ.variant) == {"default", "bn2_64"} and (summ.configs == 2).all()
    tab = studies.megamoe_order_table(df)
    ew = tab[tab.schedule == "expert_wave"]
    assert len(tab) == 8 and (ew.over_ew_geomean == 1).all()
    assert ew[ew.assignment == "static"].ew_over_static_ew_geomean.iloc[0] == 1


def test_a_failing_library_call_is_recorded_unavailable_never_zero(tmp_path, tiny, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("no grouped GEMM here")
    monkeypatch.setattr(MG, "_unfused_gemms", broken)
    MG.gemm_job(EmulatedWorld(2), tiny[:1], ["fp16"], str(tmp_path), env.provenance("test", {}), "ladder",
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
