"""Study gemm9 (issue 15, round 9 in session 13): fp8's default tiles (version 4) beside the other row block's
tiles, one stage more and 4 warps, against torch._scaled_grouped_mm on the >= 2048-row configurations. CPU: the
variants and their compile budget, the study's cases; end to end on the emulated world under Triton's interpreter
(rows per variant, whether each is bit-identical to the default recorded in its note, resume)."""
import dataclasses

import pytest

from xstage import data, env
from xstage import moe_gemm as MG
from xstage import moe_plan as MP
from xstage.model import BurstGapParams
from xstage.ranks import EmulatedWorld


def test_gemm9_variants_are_fixed_and_valid_for_both_row_blocks(monkeypatch):
    monkeypatch.setattr(env, "interpreted", lambda: False)
    for bm, other in ((64, 128), (128, 64)):
        d = MP.gpu_tiles("fp8", bm, version=4)                  # gemm9's tiles version, whatever the default
        assert d == MP.default_tiles("fp8", 1024.0 if bm == 128 else 32.0, version=4) and d.tma
        v = MG.gemm9_variants("fp8", d)
        assert set(v) == set(MG.GEMM9_NAMES) - {"default"}
        assert v["bm_alt"] == MP.gpu_tiles("fp8", other, version=4)
        assert v["s_plus"] == dataclasses.replace(d, num_stages=d.num_stages + 1)
        assert v["w4"] == dataclasses.replace(d, num_warps=4)
        for t in v.values():
            t.validate("fp8")
            MP.validate_problem(4096, 2048, 8, 2, 128, 2, t, "fp8")
    assert MG.gemm9_variants("bf16", MP.gpu_tiles("bf16", 128)) == {}
    warm = MG.warm_variants()
    assert all(("fp8", t, True, False) in warm for bm in (64, 128)
               for t in MG.gemm9_variants("fp8", MP.gpu_tiles("fp8", bm, version=4)).values())
    assert "gemm9" in MG.STUDIES and "gemm9" in MG.GEMM_STUDIES and MG.study_tiles_version("gemm9") == 4
    cases = MG.tiles5_cases()
    assert len(cases) == 56 and "deepseek_v4_flash_T2048_hot" in cases and "deepseek_v4_pro_T4096_hot" in cases


@pytest.mark.interpreter
def test_gemm9_end_to_end_records_each_variant_and_whether_it_is_bit_identical(tmp_path, tiny_gemm_case, monkeypatch):
    """gemm9 through the launchers (fp16 under the interpreter, whose fp8 does not run: two stand-in variants, one
    the default's bits (another stage count), one summing in another order (BK 16)): rows default / each variant /
    torch._grouped_mm, the note says which variant matched the default's bits, the ratios read them; resume."""
    monkeypatch.setattr(MG, "gemm9_variants", lambda dt, d: {
        "s_plus": dataclasses.replace(d, num_stages=d.num_stages + 1), "w4": dataclasses.replace(d, block_k=16)})
    world = EmulatedWorld(2)
    meta = env.provenance("test", {"world": "one-gpu", "link": "emulated"})
    prm = BurstGapParams.reference().as_dict()
    MG.round3_job(world, tiny_gemm_case, ["fp16"], str(tmp_path), meta, "gemm9", prm, None, rounds=5)
    df, side = data.load(tmp_path, data.MEGAMOE_GEMM)
    assert side["csv_rows"] == len(df) == 4 and set(df.study) == {"gemm9"}
    assert list(df.method) == ["ours"] * 3 + ["torch._grouped_mm"]
    ours = df[df.method == "ours"].set_index("variant")
    assert list(ours.index) == ["default", "s_plus", "w4"]
    assert ours.note["s_plus"] == "bit_identical=1" and ours.note["w4"] == "bit_identical=0"
    assert ours.rel_l2["s_plus"] == ours.rel_l2["default"] != ours.rel_l2["w4"]
    assert (df.ms > 0).all() and (df.n_timed == 5).all()
    g = MG.gemm8_ratios(df, study="gemm9", names=MG.GEMM9_NAMES)
    assert len(g) == 1 and g.s_plus_vs_grouped_mm.iloc[0] == pytest.approx(g.grouped_mm_ms.iloc[0] / ours.ms["s_plus"])
    assert g.bm_alt_ms.isna().all()                                  # not run: NaN, never 0
    MG.round3_job(world, tiny_gemm_case, ["fp16"], str(tmp_path), meta, "gemm9", prm, None, rounds=5)   # resume: nothing
    assert len(data.load(tmp_path, data.MEGAMOE_GEMM)[0]) == 4
