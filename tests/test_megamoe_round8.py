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
        d = MP.gpu_tiles("fp8", bm)
        assert not d.tma                                     # the default stays the pointer loops
        v = MG.gemm8_variants("fp8", d)
        assert set(v) == {"tma", "tma_s"} and v["tma"] == dataclasses.replace(d, tma=True)
        assert v["tma_s"].num_stages == d.num_stages + 1 and v["tma_s"].tma
        for t in v.values():
            t.validate("fp8")
            MP.validate_problem(4096, 2048, 8, 2, 128, 2, t, "fp8")
    assert MG.gemm8_variants("bf16", MP.gpu_tiles("bf16", 128)) == {}
    warm = MG.warm_variants()
    assert all((("fp8", t, True, False) in warm) for bm in (64, 128)
               for t in MG.gemm8_variants("fp8", MP.gpu_tiles("fp8", bm)).values())
    with pytest.raises(ValueError, match="fp8 needs block_n1"):      # the scale block still holds
        dataclasses.replace(MP.gpu_tiles("fp8", 64), block_k=64, tma=True).validate("fp8")
    assert "gemm8" in MG.STUDIES and "gemm8" in MG.ROUND3 and "gemm8" in MG.GEMM_STUDIES


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
