"""MegaMoE round 8 (issue 15, items 1-3) on the CPU: fp8 through the TMA main loops accepted by the tiles' check
(compiled for sm_90a), study gemm8's variants, its end-to-end run on the emulated world under Triton's interpreter
(the other main loops bit-identical to the default before timing, a planted difference a clear error), and the
device script's stages."""
import dataclasses
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from xstage import data, env
from xstage import moe_gemm as MG
from xstage import moe_plan as MP
from xstage.model import BurstGapParams
from xstage.ranks import EmulatedWorld

TILES = MP.INTERPRETER_TILES
TMA = MG.tma_tiles(TILES)


def test_fp8_through_tma_is_accepted_and_gemm8_times_it_beside_the_default(monkeypatch):
    monkeypatch.setattr(env, "interpreted", lambda: False)
    for bm in (64, 128):
        d = MP.gpu_tiles("fp8", bm, version=3)
        assert not d.tma                      # round 8's default: the pointer loops (version 4's is tma_s, round 9)
        v = MG.gemm8_variants("fp8", d)
        assert set(v) == {"tma", "tma_s"} and v["tma"] == dataclasses.replace(d, tma=True)
        assert v["tma_s"].num_stages == d.num_stages + 1 and v["tma_s"].tma
        for t in v.values():
            t.validate("fp8")
            MP.validate_problem(4096, 2048, 8, 2, 128, 2, t, "fp8")
    assert MG.gemm8_variants("bf16", MP.gpu_tiles("bf16", 128)) == {}
    warm = MG.warm_variants()
    assert all((("fp8", t, True, False) in warm) for bm in (64, 128)
               for t in MG.gemm8_variants("fp8", MP.gpu_tiles("fp8", bm, version=3)).values())
    with pytest.raises(ValueError, match="fp8 needs block_n1"):      # the scale block still holds
        dataclasses.replace(MP.gpu_tiles("fp8", 64), block_k=64, tma=True).validate("fp8")
    assert "gemm8" in MG.STUDIES and "gemm8" in MG.ROUND3 and "gemm8" in MG.GEMM_STUDIES
    assert "controls8" in MG.STUDIES and "controls8" in MG.ROUND3 and "controls8" not in MG.GEMM_STUDIES


@pytest.fixture
def tiny(monkeypatch, cpu_timing):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: types.SimpleNamespace(multi_processor_count=2))
    monkeypatch.setattr(MG, "default_tiles", lambda *a, **k: TILES)        # the pointer loops, as fp8's default
    shape = MP.MoEShape("tiny", 64, 32, 4, 2)
    return [MP.MoECase(shape, 12, "uniform", 1)]


@pytest.mark.interpreter
def test_gemm8_end_to_end_checks_the_other_main_loops_bit_identical_first(tmp_path, tiny, monkeypatch):
    """gemm8 through the launchers (fp16 under the interpreter, whose fp8 does not run: the variant the GPU times
    for fp8 is stood in by the TMA main loops here): rows default / tma / torch._grouped_mm, the same rel. L2 (the
    same bits), resume; a variant that sums in another order (BK 16) is refused before any timing."""
    monkeypatch.setattr(MG, "gemm8_variants", lambda dt, d: {"tma": MG.tma_tiles(d)})
    world = EmulatedWorld(2)
    meta = env.provenance("test", {"world": "one-gpu", "link": "emulated"})
    prm = BurstGapParams.reference().as_dict()
    MG.round3_job(world, tiny, ["fp16"], str(tmp_path), meta, "gemm8", prm, None, rounds=5)
    df, side = data.load(tmp_path, data.MEGAMOE_GEMM)
    assert side["csv_rows"] == len(df) == 3 and set(df.study) == {"gemm8"}
    assert list(df.method) == ["ours", "ours", "torch._grouped_mm"] and list(df.variant[:2]) == ["default", "tma"]
    ours = df[df.method == "ours"]
    assert list(ours.tma) == [False, True] and ours.rel_l2.iloc[0] == ours.rel_l2.iloc[1] > 0
    assert (df.ms > 0).all() and (df.n_timed == 5).all() and (ours.assignment == "dynamic").all()
    MG.round3_job(world, tiny, ["fp16"], str(tmp_path), meta, "gemm8", prm, None, rounds=5)   # resume: nothing
    assert len(data.load(tmp_path, data.MEGAMOE_GEMM)[0]) == 3
    monkeypatch.setattr(MG, "gemm8_variants", lambda dt, d: {"bk16": dataclasses.replace(d, block_k=16)})
    with pytest.raises(AssertionError, match=r"vs .* elements differ"):
        MG.round3_job(world, tiny, ["fp16"], str(tmp_path / "b"), meta, "gemm8", prm, None, rounds=5)
    b = tmp_path / "b" / "megamoe_gemm.csv"
    assert not b.exists() or len(b.read_text().splitlines()) <= 1              # no row appended


def test_round8_script_resumes_the_host_sweep_then_runs_gemm8_into_a_new_folder():
    s = Path("scripts/megamoe_round8.sh").read_text()
    assert s.index("stage install") < s.index("stage host") < s.index("stage gemm8")
    assert "cp data/h200x1/megamoe_round7_host/$f" in s and "--study gemm8" in s and "megamoe_round8_gemm" in s
    assert "--link host" in s and "XSTAGE_GIT_COMMIT" in s
    out = subprocess.run(["bash", "-n", "scripts/megamoe_round8.sh"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


M101_COMMIT = "dc3a4a3860625625514543d67cb7071c08b07b24"   # call M10-1 (session 10)


def test_recorded_gemm8_every_configuration_and_the_ratios_from_the_rows():
    """data/h200x1/megamoe_gemm_bf16 (call M10-1): all 84 configurations x bf16 / fp8, bf16 the TMA default,
    fp8 the pointer loops with its TMA variants (bit-identical, checked before timing: the rel. L2 of the same
    bits), the library of the same rounds; the summary recomputed from the raw rows, and the figures the draft
    gives (bf16 1.181 / 0.882 / 0.952, fp8 default 0.961 / 0.737, tma_s 1.153 / 0.883)."""
    df, meta = data.load("data/h200x1/megamoe_gemm_bf16", data.MEGAMOE_GEMM)
    assert meta["git_commit"] == M101_COMMIT and meta["params"]["tiles_version"] == 3 and not meta.get("runs")
    assert set(df.study) == {"gemm8"} and (df.status == "ok").all() and len(df) == 84 * 2 + 84 * 5
    ours = df[df.method == "ours"]
    assert (ours.tma == ((ours.dtype == "bf16") | (ours.variant != "default"))).all()
    key = ["shape", "tokens", "routing"]
    f = ours[ours.dtype == "fp8"].pivot_table(index=key, columns="variant", values="rel_l2")
    assert len(f) == 84 and (f.tma == f.default).all() and (f.tma_s == f.default).all()   # the same bits
    g = MG.gemm8_ratios(df)
    assert len(g) == 168 and g.default_vs_grouped_mm.notna().all()
    s = MG.gemm8_summary(g).set_index(["dtype", "variant"])
    fp8 = g[g.dtype == "fp8"]
    want = fp8.scaled_grouped_mm_ms / fp8.tma_s_ms
    assert s.loc[("fp8", "tma_s"), "geomean"] == pytest.approx(float(np.exp(np.log(want).mean())))
    assert s.loc[("fp8", "tma_s"), "min_big"] == pytest.approx(float(want[fp8.rows >= 2048].min()))
    got = {k: tuple(round(float(s.loc[k, c]), 3) for c in ("geomean", "min", "min_big")) for k in s.index}
    assert got[("bf16", "default")] == (1.181, 0.882, 0.952)
    assert got[("fp8", "default")] == (0.961, 0.737, 0.737)
    assert got[("fp8", "tma_s")] == (1.153, 0.883, 0.883)
    assert s.loc[("bf16", "default"), "big_configs"] == 56 == s.loc[("fp8", "tma_s"), "big_configs"]


def test_recorded_controls8_fp8_through_tma_every_configuration_and_the_summary():
    """data/h200x1/megamoe_round8_controls (call M10-2): fp8 through TMA with one stage more, every schedule of all
    84 configurations (dynamic), each list bit-identical to Expert-Wave static first; the summary from the rows."""
    from xstage import studies
    from xstage.numeric import geomean

    df, meta = data.load("data/h200x1/megamoe_round8_controls", data.MEGAMOE_GEMM)
    assert meta["git_commit"] == "cab4d3e9b40b20e546c1d32f2bc25b243ab0d623" and set(df.study) == {"controls8"}
    assert len(df) == 84 * len(MP.SCHEDULES) and df.tma.all() and set(df.dtype) == {"fp8"}
    assert set(df.num_stages) == {3, 4} and (df.assignment == "dynamic").all() and df.task_span_us.notna().all()
    per = studies.megamoe_round3_controls(df, study="controls8")
    s = studies.megamoe_round3_controls_summary(per).set_index("schedule")
    il = per[per.schedule == "interleaved"]
    assert s.loc["interleaved", "over_ew_geomean"] == pytest.approx(geomean(il.over_ew))
    got = {k: (round(float(s.loc[k, "over_ew_geomean"]), 3), round(float(s.loc[k, "over_ew_worst"]), 3))
           for k in ("interleaved", "lag", "model_guided")}
    assert got == {"interleaved": (0.990, 1.038), "lag": (0.988, 1.084), "model_guided": (0.989, 1.126)}
    assert int((per.over_ew > 1.05).sum()) == 4
