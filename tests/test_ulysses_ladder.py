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
    from xstage import attention_analysis
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
    t = attention_analysis.attention_ladder_table(df, m)
    assert t[t.variant == bad].failed.iloc[0].startswith("RuntimeError") and t[t.variant == bad].D.iloc[0] == 64


def test_ladder_table_ratios_are_same_round_medians():
    from xstage import attention_analysis

    rng = random.Random()
    rows = []
    for v in ("base", "other"):
        for meth in ("triton", "cudnn"):
            for i in range(5):
                rows.append(dict(variant=v, shape="s", S=1024, H=2, D=128, method=meth, repeat=i,
                                 ms=rng.uniform(1, 2), tflops=1.0))
    df = pd.DataFrame(rows)
    t = attention_analysis.attention_ladder_table(df).set_index("variant")
    med = df.groupby(["variant", "method"]).ms.median()
    for v in ("base", "other"):
        assert t.loc[v, "ours_over_cudnn"] == pytest.approx(med[v, "cudnn"] / med[v, "triton"])
        assert t.loc[v, "ours_tflops"] == pytest.approx(4 * 1024**2 * 2 * 128 / med[v, "triton"] / 1e9)
    assert t.loc["base", "vs_base"] == 1.0
    assert t.loc["other", "vs_base"] == pytest.approx(med["base", "triton"] / med["other", "triton"])


def test_recorded_ladder_loads_and_plots():
    from xstage import attention_analysis, attention_figures

    try:
        df, m = attention_analysis.attention_ladder_data("h200x1")
    except ValueError:
        pytest.skip("no recorded attention ladder")
    t = attention_analysis.attention_ladder_table(df, m)
    assert t.ours_over_cudnn.notna().any() and len(attention_figures.attention_ladder(t).data) == t["shape"].nunique()


# ------------------------------------------------------------------------------ the levers beside FA4
LEVER_VARIANTS = {64: (AttnConfig(64, 64, 4, 1), AttnConfig(32, 64, 4, 1, True, pipe=True, scale_q=True)),
                   128: (AttnConfig(64, 32, 4, 1, maxnreg=128),
                         AttnConfig(32, 32, 4, 1, True, persistent=True, per_sm=2, pipe=True))}


@pytest.mark.parametrize("cfg", [AttnConfig(64, 32, 4, 1, pipe=True), AttnConfig(32, 32, 4, 1, True, scale_q=True),
                                 AttnConfig(32, 32, 4, 1, True, persistent=True, per_sm=2, pipe=True, maxnreg=128)])
def test_lever_levers_match_float32_and_the_fused_layer(cfg):
    """The pipelined key loop, the scale folded into q, a capped register count and two persistent programs per
    SM: each within float32's tolerance and the fused layer bit for bit its attention + the all-to-all."""
    chk = check_variant(cfg, 64, seed=random.randrange(2**30), world=EmulatedWorld(2))
    assert chk["fused_bit_exact"] and chk["rel_l2_vs_fp32"] < 1e-2


def test_pipelined_key_loop_keeps_the_bits():
    """Same arithmetic per key block in the same order: the pipelined loop gives the plain loop's bits (a partial
    last key block, and S below one key block, included)."""
    g = torch.Generator().manual_seed(random.randrange(2**30))
    for S in (150, 20):
        q, k, v = (torch.randn(S, 2, 64, generator=g).half() for _ in range(3))
        base = attention_forward(q, k, v, config=AttnConfig(32, 32, 4, 1))
        assert torch.equal(attention_forward(q, k, v, config=AttnConfig(32, 32, 4, 1, pipe=True)), base)
        sq = attention_forward(q, k, v, config=AttnConfig(32, 32, 4, 1, scale_q=True))
        ref = attention_reference(q, k, v)
        assert (sq.float() - ref).norm() / ref.norm() < 1e-2


@pytest.mark.parametrize("kw, match", [(dict(maxnreg=8), "maxnreg"), (dict(per_sm=2), "per_sm"),
                                       (dict(persistent=True, per_sm=9), "per_sm")])
def test_bad_lever_config_is_one_error(kw, match):
    with pytest.raises(ValueError, match=match):
        AttnConfig(64, 64, 4, 1, **kw).validate()


def test_labels_name_every_lever_and_studies_reads_them():
    from dataclasses import asdict

    from xstage.attention_analysis import _ladder_labels

    cfgs = [AttnConfig(128, 64, 8, 2, True, persistent=True, per_sm=2, maxnreg=128),
            AttnConfig(128, 128, 8, 3, True, persistent=True, scale_q=True), AttnConfig(128, 64, 8, 3, True, pipe=True)]
    assert [c.label for c in cfgs] == ["128x64w8s2-tma-pers2-r128", "128x128w8s3-tma-pers-sq", "128x64w8s3-tma-pipe"]
    assert _ladder_labels([asdict(c) for c in cfgs]) == [c.label for c in cfgs]


def test_beside_fa4_job_checks_each_shape_and_records_fa4_absent(tmp_path, cpu_timing, capsys):
    """On the CPU FA4 cannot run: one line, no fa4 rows (never 0), the reason in the sidecar; every timed shape's
    methods were compared with float32 on sampled rows first (``shape_checks``); both head dims' base rungs run
    before either's levers."""
    shapes = [UlyssesShape("tiny", 96, 2, 64), UlyssesShape("t128", 80, 2, 128)]
    meta = {k: "cpu" for k in data.REQUIRED_META if k not in ("schema", "schema_version")}
    ladder_job(tmp_path, meta, LEVER_VARIANTS, shapes, 2, 0, random.randrange(2**20), fa=True, launches=2)
    df, m = data.load(tmp_path, ATTENTION_LADDER)
    assert set(df.method) == {"triton"} and len(df) == 8
    assert "no FA4 rows" in capsys.readouterr().err and m["fa4_absent"].startswith("FA4 needs a CUDA GPU")
    for D, cfgs in LEVER_VARIANTS.items():
        for c in cfgs:
            chk = m["shape_checks"][str(D)][c.label]
            assert set(chk) == {s.name for s in shapes if s.D == D}
            assert all(e["triton"] < 1e-2 and e["rows"] >= 2 for e in chk.values())
    first = list(dict.fromkeys(df.variant))
    assert first[:2] == [LEVER_VARIANTS[128][0].label, LEVER_VARIANTS[64][0].label]


def test_a_wrong_kernel_on_a_timed_shape_is_never_timed(tmp_path, cpu_timing, monkeypatch):
    """check_shape can fail: an attention that pairs keys with the wrong values on the timed shape (after its
    variant's own check passed) is recorded in ``failed_shapes`` and has no rows."""
    from xstage import ulysses_ladder as L

    real = L.attention_forward
    monkeypatch.setattr(L, "check_variant", lambda cfg, D, seed, world=None: {"fused_bit_exact": True})
    monkeypatch.setattr(L, "attention_forward",
                        lambda q, k, v, config=None: real(q, k.flip(0).contiguous(), v, config=config))
    meta = {k: "cpu" for k in data.REQUIRED_META if k not in ("schema", "schema_version")}
    ladder_job(tmp_path, meta, {64: (AttnConfig(64, 64, 4, 1),)}, [UlyssesShape("tiny", 96, 2, 64)], 2, 0, 5,
               fa=True)
    m = data.read_meta(tmp_path / "attention_ladder.json", ATTENTION_LADDER)
    assert "float32 reference" in m["failed_shapes"]["64"]["64x64w4s1"]["tiny"]
    assert not (tmp_path / "attention_ladder.csv").exists() or data.load(tmp_path, ATTENTION_LADDER)[0].empty


def test_sample_rows_are_distinct_sorted_and_hold_the_last():
    from xstage.ulysses_ladder import sample_rows

    g = torch.Generator().manual_seed(random.randrange(2**30))
    for S, n in ((1000, 256), (5, 256), (1, 3)):
        r = sample_rows(S, n, g)
        assert len(r) == min(S, n) and int(r[-1]) == S - 1 and len(set(r.tolist())) == len(r)
        assert torch.equal(r, r.sort().values)


def test_run_attention_vs_fa4_validates_then_needs_a_gpu(tmp_path):
    from xstage.ulysses_ladder import run_attention_vs_fa4

    with pytest.raises(ValueError, match="launches"):
        run_attention_vs_fa4(tmp_path, launches=0)
    with pytest.raises(RuntimeError, match="needs 1 CUDA GPU"):
        run_attention_vs_fa4(tmp_path)
    assert not list(tmp_path.iterdir())


def test_beside_fa4_summary_is_same_round_medians_and_flags_the_goal():
    from xstage import attention_analysis

    rng = random.Random()
    rows = []
    for S in (4096, 8192):
        for v in ("base", "other"):
            for meth in ("triton", "cudnn", "fa4"):
                for i in range(5):
                    rows.append(dict(variant=v, shape=f"s{S}", S=S, H=2, D=128, method=meth, repeat=i,
                                     ms=rng.uniform(1, 2), tflops=1.0))
    df = pd.DataFrame(rows)
    t = attention_analysis.attention_ladder_table(df)
    med = df.groupby(["shape", "variant", "method"]).ms.median()
    s = attention_analysis.attention_vs_fa4_summary(t).set_index("shape")
    for S in (4096, 8192):
        sh = f"s{S}"
        best = min(("base", "other"), key=lambda v: med[sh, v, "triton"])
        assert s.loc[sh, "best_variant"] == best and s.loc[sh, "base_variant"] == "base"
        assert s.loc[sh, "best_over_fa"] == pytest.approx(med[sh, best, "fa4"] / med[sh, best, "triton"])
        assert s.loc[sh, "base_over_fa"] == pytest.approx(med[sh, "base", "fa4"] / med[sh, "base", "triton"])
        assert s.loc[sh, "met"] == (s.loc[sh, "best_over_fa"] >= attention_analysis.ATTENTION_LADDER_GOAL)
    assert list(s.goal_applies) == [False, True]
    assert attention_analysis.attention_vs_fa4_summary(attention_analysis.attention_ladder_table(df[df.method != "fa4"])).empty


@pytest.mark.parametrize("record", ["attention_vs_fa4", "attention_triton_vs_fa4"])
def test_recorded_beside_fa4_loads_and_plots(record):
    from xstage import attention_analysis, attention_figures

    df, m = attention_analysis.attention_ladder_data("h200x1", record=record)
    t = attention_analysis.attention_ladder_table(df, m)
    s = attention_analysis.attention_vs_fa4_summary(t)
    assert len(s) == t["shape"].nunique() and (s.fa_tflops > 0).all() and set(s.D) <= {64, 128}
    assert len(attention_figures.attention_vs_fa4(s).data) == 2
    assert len(attention_figures.attention_ladder(t, against="fa").data) == t["shape"].nunique()
    with pytest.raises(ValueError, match="record must be one of"):
        attention_analysis.attention_ladder_data("h200x1", record="nope")


def test_beside_fa4_goal_row_is_the_smallest_ratio_at_8k_and_up():
    from xstage import attention_analysis

    s = pd.DataFrame(dict(goal_applies=[False, True, True], best_over_fa=[0.5, random.uniform(0.9, 1.0), 0.97]))
    g = attention_analysis.attention_vs_fa4_goals(s, "w")
    assert g.ours.iloc[0] == pytest.approx(min(s.best_over_fa[1:])) and "(w)" in g.quantity.iloc[0]
    assert g.met.iloc[0] == (g.ours.iloc[0] >= attention_analysis.ATTENTION_LADDER_GOAL)
    assert attention_analysis.attention_vs_fa4_goals(s[:1]).met.iloc[0] is None
