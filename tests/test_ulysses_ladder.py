"""The attention ladder (xstage.ulysses_ladder) on the CPU: variants checked against float32 and the fused
layer before timing, rows appended and resumed, bad input refused before anything runs."""
import random

import pandas as pd
import pytest
import torch

from xstage import data
from xstage.data import ATTENTION_LADDER
from xstage.ranks import EmulatedWorld
from xstage.ulysses import AttnConfig, UlyssesShape, attention_forward
from xstage.ulysses_ladder import attention_reference, check_variant, ladder_job, validate_ladder

CPU_VARIANTS = {64: (AttnConfig(64, 64, 4, 1), AttnConfig(32, 64, 4, 1, True, ws=True, persistent=True))}


@pytest.mark.parametrize("cfg", [AttnConfig(64, 64, 4, 1, ws=True), AttnConfig(32, 32, 4, 1, True, persistent=True),
                                 AttnConfig(64, 32, 4, 1, True, ws=True, persistent=True)])
@pytest.mark.parametrize("D", [64, 128])
def test_variants_match_float32_and_the_fused_layer(cfg, D):
    chk = check_variant(cfg, D, seed=random.randrange(2**30), world=EmulatedWorld(2))
    assert chk["fused_bit_exact"] and chk["rel_l2_vs_fp32"] < 1e-2


def test_persistent_and_specialised_launches_equal_the_plain_one_bit_for_bit():
    g = torch.Generator().manual_seed(random.randrange(2**30))
    q, k, v = (torch.randn(150, 3, 64, generator=g).half() for _ in range(3))
    base = attention_forward(q, k, v, config=AttnConfig(32, 32, 4, 1))
    for cfg in (AttnConfig(32, 32, 4, 1, ws=True), AttnConfig(32, 32, 4, 1, persistent=True),
                AttnConfig(32, 32, 4, 1, True, ws=True, persistent=True)):
        assert torch.equal(attention_forward(q, k, v, config=cfg), base), cfg.label
    ref = attention_reference(q, k, v)
    assert (base.float() - ref).norm() / ref.norm() < 1e-2


def test_a_wrong_kernel_fails_its_check(monkeypatch):
    """The check can fail: an attention that drops the last key block is caught before timing."""
    from xstage import ulysses_ladder as L

    real = L.attention_forward
    monkeypatch.setattr(L, "attention_forward", lambda q, k, v, config=None: real(q, k.flip(0), v, config=config))
    with pytest.raises(AssertionError, match="float32 reference"):
        check_variant(AttnConfig(64, 64, 4, 1), 64, seed=1, world=EmulatedWorld(2))


def test_ladder_job_records_checks_rows_and_resumes(tmp_path, cpu_timing, capsys):
    shapes = [UlyssesShape("tiny", 96, 2, 64)]
    meta = {k: "cpu" for k in data.REQUIRED_META if k not in ("schema", "schema_version")}
    ladder_job(tmp_path, meta, CPU_VARIANTS, shapes, repeats=2, warmup=0, seed=random.randrange(2**20))
    df, m = data.load(tmp_path, ATTENTION_LADDER)
    assert set(df.variant) == {c.label for c in CPU_VARIANTS[64]}
    assert set(df.method) == {"triton"} and len(df) == 4          # no cuDNN on the CPU: rows absent, not 0
    assert "no cuDNN rows" in capsys.readouterr().err
    assert set(m["checks"]["64"]) == set(df.variant) and all(c["fused_bit_exact"] for c in m["checks"]["64"].values())
    assert m["cudnn_absent"]["tiny"].startswith("no CUDA device")
    ladder_job(tmp_path, meta, CPU_VARIANTS, shapes, repeats=2, warmup=0, seed=0)     # resumes: nothing new
    assert len(data.load(tmp_path, ATTENTION_LADDER)[0]) == 4


@pytest.mark.parametrize("variants, shapes, repeats, match", [
    (CPU_VARIANTS, [UlyssesShape("x", 96, 2, 128)], 2, "head dim 128, for which no variant"),
    (CPU_VARIANTS, [UlyssesShape("x", 96, 2, 96)], 2, "head dim must be one of"),
    (CPU_VARIANTS, [UlyssesShape("x", 96, 2, 64)], 0, "repeats must be >= 1"),
    ({64: (AttnConfig(64, 48, 4, 1),)}, [UlyssesShape("x", 96, 2, 64)], 2, "power of two"),
    ({64: (AttnConfig(64, 64, 4, 1),) * 2}, [UlyssesShape("x", 96, 2, 64)], 2, "variants repeat"),
])
def test_bad_ladder_input_one_line_before_anything(variants, shapes, repeats, match):
    with pytest.raises(ValueError, match=match):
        validate_ladder(variants, shapes, repeats, 0)


def test_run_attention_ladder_needs_a_gpu_after_validating(tmp_path):
    from xstage.ulysses_ladder import run_attention_ladder

    with pytest.raises(ValueError, match="repeats"):
        run_attention_ladder(tmp_path, repeats=0)
    with pytest.raises(RuntimeError, match="needs 1 CUDA GPU"):
        run_attention_ladder(tmp_path)
    assert not list(tmp_path.iterdir())


def test_a_failing_variant_is_recorded_and_never_timed(tmp_path, cpu_timing, monkeypatch):
    from xstage import studies
    from xstage import ulysses_ladder as L

    real, bad = L.check_variant, CPU_VARIANTS[64][1].label

    def check(cfg, D, seed, world=None):
        if cfg.label == bad:
            raise RuntimeError("PassManager::run failed")
        return real(cfg, D, seed, world)

    monkeypatch.setattr(L, "check_variant", check)
    meta = {k: "cpu" for k in data.REQUIRED_META if k not in ("schema", "schema_version")}
    ladder_job(tmp_path, meta, CPU_VARIANTS, [UlyssesShape("tiny", 96, 2, 64)], 2, 0, seed=3)
    df, m = data.load(tmp_path, ATTENTION_LADDER)
    assert set(df.variant) == {CPU_VARIANTS[64][0].label}
    assert m["failed"] == {"64": {bad: "RuntimeError: PassManager::run failed"}}
    t = studies.attention_ladder_table(df, m)
    assert t[t.variant == bad].failed.iloc[0].startswith("RuntimeError") and t[t.variant == bad].D.iloc[0] == 64


def test_ladder_table_ratios_are_same_round_medians():
    from xstage import studies

    rng = random.Random()
    rows = []
    for v in ("base", "other"):
        for meth in ("triton", "cudnn"):
            for i in range(5):
                rows.append(dict(variant=v, shape="s", S=1024, H=2, D=128, method=meth, repeat=i,
                                 ms=rng.uniform(1, 2), tflops=1.0))
    df = pd.DataFrame(rows)
    t = studies.attention_ladder_table(df).set_index("variant")
    med = df.groupby(["variant", "method"]).ms.median()
    for v in ("base", "other"):
        assert t.loc[v, "ours_over_cudnn"] == pytest.approx(med[v, "cudnn"] / med[v, "triton"])
        assert t.loc[v, "ours_tflops"] == pytest.approx(4 * 1024**2 * 2 * 128 / med[v, "triton"] / 1e9)
    assert t.loc["base", "vs_base"] == 1.0
    assert t.loc["other", "vs_base"] == pytest.approx(med["base", "triton"] / med["other", "triton"])


def test_recorded_ladder_loads_and_plots():
    from xstage import figures, studies

    try:
        df, m = studies.attention_ladder_data("h200x1")
    except ValueError:
        pytest.skip("no recorded attention ladder")
    t = studies.attention_ladder_table(df, m)
    assert t.ours_over_cudnn.notna().any() and len(figures.attention_ladder(t).data) == t["shape"].nunique()
