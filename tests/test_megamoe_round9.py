"""MegaMoE round 9 (issue 15, items 2 and 4) on the CPU: the fp8 block-scale loads folded into one helper per
Linear (used by the TMA and the pointer main loops alike; run under Triton's interpreter against torch indexing),
tiles version 4 (fp8 through TMA with one stage more, round 8's ``tma_s``) as the default while older versions and
records read what they ran, studies gemm8 / controls8 pinned to what they measured, the device script's stages;
on one GPU (marker ``gpu``) the new fp8 default bit-identical to version 3's pointer loops."""
import ast
import dataclasses
import inspect
import random
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from xstage import env
from xstage import moe_gemm as MG
from xstage import moe_plan as MP
from xstage.kernels import moe as K


# ------------------------------------------------------------------------------------- the fold (task 1)
@triton.jit
def _scales_probe(xs_ptr, w1s_ptr, hs_ptr, w2s_ptr, out1_ptr, out2_ptr, row0, row_end, Hd, I, expert,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Every (column block, K block) of one expert's row block: the helpers' scales, stored as [a_s | w scales]."""
    rows = row0 + tl.arange(0, BLOCK_M)
    row_ok = rows < row_end
    rows64 = rows.to(tl.int64)
    e64 = expert.to(tl.int64)
    m = tl.arange(0, BLOCK_M)
    i = 0
    for col_block in range(0, I // BLOCK_N):
        for k in range(0, Hd, BLOCK_K):
            a_s, g_s, u_s = K._linear1_scales(xs_ptr, w1s_ptr, e64, rows64, row_ok, col_block, k, Hd, I, BLOCK_N,
                                              BLOCK_K)
            base = out1_ptr + i * (BLOCK_M + 2)
            tl.store(base + m, a_s)
            tl.store(base + BLOCK_M, g_s)
            tl.store(base + BLOCK_M + 1, u_s)
            i += 1
    j = 0
    for col_block in range(0, Hd // BLOCK_N):
        for k in range(0, I, BLOCK_K):
            a_s, w_s = K._linear2_scales(hs_ptr, w2s_ptr, e64, rows64, row_ok, col_block, k, Hd, I, BLOCK_N,
                                         BLOCK_K)
            base = out2_ptr + j * (BLOCK_M + 1)
            tl.store(base + m, a_s)
            tl.store(base + BLOCK_M, w_s)
            j += 1


@pytest.mark.interpreter
def test_fp8_scale_helpers_load_the_blocks_the_layouts_name():
    """Under the interpreter (fp32 scales; the layouts of kernels/moe.py's docstring): for a row block that runs
    past its expert's end, every column block and K block, a_s is the rows' 1 x 128 scale (0 past the end), the
    gate / up / W2 block scales the 128 x 128 ones. Fresh random scales (never zeros)."""
    if not env.interpreted():
        pytest.skip("runs under Triton's interpreter")
    B = 16                                   # stands in for the 128 scale block (the helpers take it as BLOCK_N/K)
    El, R, Hd, I = 3, 40, 3 * B, 2 * B
    g = torch.Generator().manual_seed(random.randrange(2**31))
    xs = torch.rand(R, Hd // B, generator=g) + 0.5
    w1s = torch.rand(El, 2 * I // B, Hd // B, generator=g) + 0.5
    hs = torch.rand(R, I // B, generator=g) + 0.5
    w2s = torch.rand(El, Hd // B, I // B, generator=g) + 0.5
    e, row0, row_end, BM = 1, 24, 33, 16     # 9 rows left of the expert: 7 rows of the block read 0
    n1, n2 = (I // B) * (Hd // B), (Hd // B) * (I // B)
    out1 = torch.full((n1, BM + 2), float("nan"))
    out2 = torch.full((n2, BM + 1), float("nan"))
    _scales_probe[(1,)](xs, w1s, hs, w2s, out1, out2, row0, row_end, Hd, I, e, BLOCK_M=BM, BLOCK_N=B, BLOCK_K=B)
    rows = torch.arange(row0, row0 + BM)
    ok = rows < row_end
    i = 0
    for cb in range(I // B):
        for kb in range(Hd // B):
            want = torch.where(ok, xs[rows.clamp(max=R - 1), kb], torch.zeros(()))
            assert torch.equal(out1[i, :BM], want)
            assert out1[i, BM] == w1s[e, cb, kb] and out1[i, BM + 1] == w1s[e, I // B + cb, kb]
            i += 1
    j = 0
    for cb in range(Hd // B):
        for kb in range(I // B):
            want = torch.where(ok, hs[rows.clamp(max=R - 1), kb], torch.zeros(()))
            assert torch.equal(out2[j, :BM], want) and out2[j, BM] == w2s[e, cb, kb]
            j += 1


def _calls(fn) -> list[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn.fn if hasattr(fn, "fn") else fn)))
    return [n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", "")
            for n in ast.walk(tree) if isinstance(n, ast.Call)]


def test_both_main_loops_take_their_scales_from_the_one_helper():
    """The fold: each Linear's TMA and pointer main loops call its scale helper, and no loop loads a scale itself
    (the scale tensors appear in no tl.load outside the helpers)."""
    for fn, helper in ((K._linear1_acc_tma, "_linear1_scales"), (K._linear1_tile, "_linear1_scales"),
                       (K._linear2_acc_tma, "_linear2_scales"), (K._linear2_tile, "_linear2_scales")):
        assert _calls(fn).count(helper) == 1, fn
    src = Path(K.__file__).read_text()
    for name in ("xs_ptr + rows64", "hs_ptr + rows64", "s_base +", "w2s_ptr + e64"):
        loads = [ln for ln in src.splitlines() if "tl.load(" in ln and name in ln]
        assert len(loads) == (2 if name == "s_base +" else 1), (name, loads)


# ------------------------------------------------------------------------------- tiles version 4 (task 2)
def test_tiles_version_4_is_fp8_through_tma_with_one_stage_more(monkeypatch):
    """Version 4 (the default): fp8 = version 3's tiles through TMA with one stage more (round 8's tma_s, the
    tiles controls8 measured), bf16 = version 3's; versions 1-3 unchanged (what the records ran)."""
    monkeypatch.setattr(env, "interpreted", lambda: False)
    assert MP.TILES_VERSION == 6 and MP.TILES_VERSIONS == (1, 2, 3, 4, 5, 6)
    for bm, stages in ((64, 4), (128, 3)):
        v4, v3 = MP.gpu_tiles("fp8", bm, version=4), MP.gpu_tiles("fp8", bm, version=3)
        assert MP.gpu_tiles("fp8", bm, version=5) == v4  # version 5: version 4's tiles (only the BM rule moved)
        assert v4 == MG.gemm8_variants("fp8", v3)["tma_s"] == dataclasses.replace(v3, tma=True, num_stages=stages)
        assert not v3.tma and v3.num_stages == stages - 1
        v4.validate("fp8")
        assert MP.gpu_tiles("bf16", bm) == MP.gpu_tiles("bf16", bm, version=3)
    for rpe, bm in ((24.0, 64), (511.0, 64), (512.0, 128), (4096.0, 128)):     # version 4: version 3's BM rule
        assert MP.default_tiles("fp8", rpe, version=4).block_m == bm == MP.default_tiles("fp8", rpe,
                                                                                           version=3).block_m
        assert MP.default_tiles("fp8", rpe, version=4).tma
    with pytest.raises(ValueError, match="tiles version must be one of 1, 2, 3, 4, 5, 6, got 7"):
        MP.default_tiles("fp8", 64.0, version=7)


def test_round8_studies_keep_their_tiles_under_version_4(monkeypatch):
    """Studies gemm8 / controls8 answer round 8's question: their default is tiles version 3's (the sidecar says
    so), so gemm8 still times the pointer loops beside tma / tma_s and controls8 still the tma_s tiles (= version
    4's fp8 default); every other study runs and records the current version. The warm list covers both."""
    monkeypatch.setattr(env, "interpreted", lambda: False)
    assert MG.study_tiles_version("gemm8") == MG.study_tiles_version("controls8") == 3
    assert MG.study_tiles_version("gemm9") == 4
    assert MG.study_tiles_version("gemm10") == MG.study_tiles_version("lags11") == 5
    assert all(MG.study_tiles_version(s) == MP.TILES_VERSION == 6 for s in MG.STUDIES
               if s not in (*MG.ROUND8_STUDIES, "gemm9", "gemm10", "lags11"))
    warm = MG.warm_variants()
    for bm in (64, 128):
        v3 = MP.gpu_tiles("fp8", bm, version=3)
        assert ("fp8", v3, True, False) in warm and ("fp8", MP.gpu_tiles("fp8", bm), True, True) in warm
        assert all(("fp8", t, True, False) in warm for t in MG.gemm8_variants("fp8", v3).values())
    small = MG.warm_variants(["fp8", "bf16"], defaults_only=True)
    assert len(small) == 10 and all(not timed for *_, timed in small)
    assert {t for dt, t, *_ in small if dt == "fp8" and t.tma} == {MP.gpu_tiles("fp8", 64), MP.gpu_tiles("fp8", 128)}


@pytest.fixture
def tiny(monkeypatch, cpu_timing):
    import types

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: types.SimpleNamespace(multi_processor_count=2))
    shape = MP.MoEShape("tiny", 64, 32, 4, 2)
    return [MP.MoECase(shape, 12, "uniform", 1)]


@pytest.mark.interpreter
def test_controls8_under_version_4_runs_version_3s_tma_s_and_says_version_3(tmp_path, tiny, monkeypatch):
    """run_megamoe_gemm end to end on the emulated world (the GPU check and the world stubbed, fp16 under the
    interpreter): controls8 asks default_tiles for version 3 and its sidecar says tiles version 3; controls7 asks
    for and records the current version (TILES_VERSION)."""
    from xstage import data, ranks, studies
    from xstage.model import BurstGapParams

    asked = []

    def tiles(dtype, rpe=None, version=MP.TILES_VERSION):
        asked.append(version)
        return MP.INTERPRETER_TILES
    monkeypatch.setattr(MG, "default_tiles", tiles)
    monkeypatch.setattr(MG, "cases_by_name", lambda names: tiny)
    monkeypatch.setattr(MG, "VARIANTS", {"fp16": {"default": {}}})
    monkeypatch.setattr(env, "require_gpus", lambda *a, **k: None)
    monkeypatch.setattr(ranks, "OneGPUWorld", lambda *a, **k: ranks.EmulatedWorld(2))
    monkeypatch.setattr(studies, "recorded_params", lambda *a, **k: BurstGapParams.reference())
    for study, want in (("controls8", 3), ("controls7", MP.TILES_VERSION)):
        asked.clear()
        MG.run_megamoe_gemm(tmp_path / study, study, ["tiny"], ["fp16"], None, "test", rounds=5)
        df, meta = data.load(tmp_path / study, data.MEGAMOE_GEMM)
        assert set(asked) == {want} and meta["params"]["tiles_version"] == want, (study, asked)
        assert set(df.study) == {study} and len(df) == len(MP.SCHEDULES)


# ------------------------------------------------------------------------ the sweep's writes (task 3)
def test_a_signal_during_the_append_lands_after_rows_and_sidecar(tmp_path, tiny, monkeypatch):
    """The one-process sweep (emulated world, interpreter): SIGINT sent while a configuration's rows are being
    appended (as `timeout --signal=INT` may) is held until the rows and the sidecar are both written; the sweep
    then stops with KeyboardInterrupt, the record loads (rows and sha256 agree) with that configuration, and a
    re-run resumes with the next one."""
    import os
    import signal

    from xstage import data
    from xstage import moe_sweep as MS
    from xstage.model import BurstGapParams
    from xstage.ranks import EmulatedWorld

    monkeypatch.setattr(MS, "default_tiles", lambda *a, **k: MP.INTERPRETER_TILES)
    real = data.append_rows
    calls = []

    def append(csv, schema, df):
        calls.append(len(df))
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)       # arrives mid-append
            import time
            time.sleep(0.2)                           # (a handler would have run by now if it were not held)
        real(csv, schema, df)
    monkeypatch.setattr(MS.data, "append_rows", append)
    cases = tiny + [MP.MoECase(tiny[0].shape, 16, "hot", 2)]
    meta = env.provenance("test", {"world": "one-gpu", "link": "emulated"})
    prm = BurstGapParams.reference().as_dict()
    args = (str(tmp_path), meta, ["fp16"], list(MP.SCHEDULES), 2, 1, prm, 0, None)
    with pytest.raises(KeyboardInterrupt):
        MS.megamoe_job(EmulatedWorld(2), cases, *args)
    df, side = data.load(tmp_path, data.MEGAMOE)
    assert calls == [len(MP.SCHEDULES)] and len(df) == side["csv_rows"] == len(MP.SCHEDULES)
    assert set(df.tokens) == {12}
    MS.megamoe_job(EmulatedWorld(2), cases, *args)                     # resumes: the second configuration
    df, side = data.load(tmp_path, data.MEGAMOE)
    assert len(df) == side["csv_rows"] == 2 * len(MP.SCHEDULES) and set(df.tokens) == {12, 16}


def test_signals_held_is_a_no_op_off_the_main_thread():
    import threading

    from xstage import moe_sweep as MS

    seen = []

    def body():
        with MS.signals_held():
            seen.append(1)
    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen == [1]


# ------------------------------------------------------------------------------------------------ GPU
# tests/test_moe_one_gpu.py's cases (both fp8 row-block classes: BM 64 and 128) and a Pro-sized layer (Hd 7168)
GPU_CASES = ["mixtral_8x7b_T128_hot", "qwen3_235b_T256_zipf", "deepseek_v4_flash_T512_uniform",
             "mixtral_8x7b_T1024_uniform"]
PRO_LIKE = (7168, 3072, 16, 2, 1024, "uniform")


@pytest.mark.gpu
def test_fp8_default_is_bit_identical_to_version_3s_pointer_loops_on_one_gpu():
    """OneGPUWorld(2), link host, fp8, fresh random inputs: the whole fused layer (Expert-Wave, dynamic and static)
    with tiles version 4 (through TMA, one stage more) and with version 3's pointer loops, combine poisoned before
    each, bit-identical on every rank and every element written. (tests/test_moe_one_gpu.py checks version 4
    against the float32 reference with every schedule x assignment.)"""
    from xstage import moe as M
    from xstage.ranks import OneGPUWorld

    world = OneGPUWorld(2, link="host")
    seed = random.randrange(2**30)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cases = list(MP.cases_by_name(GPU_CASES)) + [MP.as_case(PRO_LIKE, seed)]
    bms = set()
    for i, c in enumerate(cases):
        rpe = c.tokens * 2 * c.shape.topk / c.shape.experts
        v4, v3 = MP.default_tiles("fp8", rpe, version=4), MP.default_tiles("fp8", rpe, version=3)
        assert v4.tma and not v3.tma and v4.num_stages == v3.num_stages + 1
        bms.add(v4.block_m)
        prob = M.make_problem(world, MP.as_case(c, seed + i), "fp8", v4, weight_seed=seed + i)
        s = prob.case.shape
        bufs = M.moe_buffers(world, max(prob.cap_rows, 1), prob.case.tokens, s.hidden, s.intermediate, s.topk,
                             s.experts // 2, "fp8", min_block_m=v4.block_m)
        tasks = {r: M.build_tasks(prob, "expert_wave", sms, r) for r in range(2)}
        out = {}
        for name, t, dyn in (("v3", v3, True), ("v4", v4, True), ("v4 static", v4, False)):
            M.poison_combine(world, bufs, prob.case.tokens)
            M.megamoe_layer(world, bufs, prob.inputs, tasks, t, dynamic=dyn)
            torch.cuda.synchronize()
            out[name] = {r: bufs.combine_view(r, prob.case.tokens).to(world.device(r)).clone() for r in range(2)}
        for r in range(2):
            assert not out["v4"][r].isnan().any(), (prob.case.name, r)
            for name in ("v4", "v4 static"):
                assert torch.equal(out[name][r].view(torch.int16), out["v3"][r].view(torch.int16)), \
                    (prob.case.name, r, name)
        print(f"one GPU, link host, fp8, {prob.case.name}, seed {seed + i}: tiles v4 ({v4.block_m} x s"
              f"{v4.num_stages} tma) bit-identical to v3 (pointer loops, s{v3.num_stages}) on both ranks")
        del prob, bufs, out
        torch.cuda.empty_cache()
    assert bms == {64, 128}, bms


def test_round9_script_runs_the_gpu_tests_then_a_new_host_sweep_fp8_first():
    s = Path("scripts/megamoe_round9.sh").read_text()
    assert "megamoe_stages.sh" in s and "stage() {" not in s and "NCCL_NVLS_ENABLE=0" in s
    assert s.index("stage install") < s.index("stage tests") < s.index("stage host")
    assert "tests/test_megamoe_round9.py" in s and "tests/test_moe_one_gpu.py" in s and "-m gpu" in s
    assert "--link host" in s and "--world one-gpu" in s and "DTYPES=${3:-fp8}" in s and "--max-minutes" in s
    assert "megamoe_round9_host" in s and "cp data/h200x1/megamoe_round9_host/$f" in s   # new record, resumable
    assert "megamoe_round7_host" not in s.split("megamoe_round7_host_summary")[0]         # never appends round 7's
    assert "XSTAGE_GIT_COMMIT" in s and "--warm --defaults" in s
    out = subprocess.run(["bash", "-n", "scripts/megamoe_round9.sh"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


# ------------------------------------------------------------------------------------------ the recorded round 9
M111_COMMIT = "273dece9a3f81e4e994236f3fcba46192969e6e8"   # call M11-1 (session 11)


def _config(d):
    return d["shape"] + "_T" + d.tokens.astype(str) + "_" + d.routing


def test_recorded_host9_is_complete_and_its_summary_from_the_rows(monkeypatch):
    """data/h200x1/megamoe_round9_host (call M11-1: fp8's first 68 pairs; session 12's call S12-1 resumed it with
    fp8's last 16 and bf16's 84): tiles version 4 (every row through TMA; fp8 BM 64 with 4 stages or BM 128 with 3,
    bf16 version 3's tiles), all 168 (configuration, dtype) pairs of the fixed order (none chosen or dropped), every
    schedule per pair; a random schedule's geomean speedup and count within 10 % recomputed from the raw rows per
    dtype, beside round 7's record on the same configurations; the figures the lab notebook gives."""
    from xstage import data, studies
    from xstage.numeric import geomean

    df, meta = data.load("data/h200x1/megamoe_round9_host", data.MEGAMOE)
    p = meta["params"]
    assert meta["git_commit"] == M111_COMMIT and [r["git_commit"][:7] for r in meta["runs"]] == ["75b2d2f"]
    assert meta["runs"][0]["params"]["dtypes"] == ["fp8", "bf16"]
    assert (p["tiles_version"], p["world"], p["link"], p["assignment"]) == (4, "one-gpu", "host", "dynamic")
    assert df.tma.all()
    assert set(zip(df[df.dtype == "fp8"].block_m, df[df.dtype == "fp8"].num_stages)) == {(64, 4), (128, 3)}
    with monkeypatch.context() as m:                  # every row ran version 4's default tiles for its case
        m.setattr(env, "interpreted", lambda: False)
        for r in df.drop_duplicates(["shape", "tokens", "routing", "dtype"]).itertuples():
            c = MP.cases_by_name([f"{r.shape}_T{r.tokens}_{r.routing}"])[0]
            assert MP.tiles_of_row(r) == MP.default_tiles(r.dtype, c.tokens * 2 * c.shape.topk / c.shape.experts,
                                                          version=4)
    order = [c.name for c in MP.CASES]
    for dt in ("bf16", "fp8"):
        assert list(dict.fromkeys(_config(df[df.dtype == dt]))) == order
    assert df.groupby([_config(df), df.dtype]).schedule.nunique().eq(len(MP.SCHEDULES)).all()
    assert studies.megamoe_pairs_line(df) == "host-link sweep: 168 of 168 (configuration, dtype) pairs (bf16 84 " \
                                            "of 84, fp8 84 of 84)"
    h7, _ = data.load("data/h200x1/megamoe_round7_host", data.MEGAMOE)
    s = studies.megamoe_round7_host_summary(df, before=h7).set_index(["dtype", "schedule"])
    sch = random.choice(["interleaved", "lag", "model_guided"])
    for dt in ("bf16", "fp8"):
        d = df[df.dtype == dt].assign(config=lambda x: _config(x)).set_index(["config", "schedule"])
        sp = np.array([d.kernel_ms[(c, "expert_wave")] / d.kernel_ms[(c, sch)] for c in order])
        err = np.array([d.predicted_speedup[(c, sch)] for c in order]) / sp - 1
        assert s.loc[(dt, sch), "configs"] == 84 and s.loc[(dt, sch), "geomean_speedup"] == pytest.approx(
            geomean(sp))
        assert s.loc[(dt, sch), "within"] == int((np.abs(err) <= 0.1).sum())
        b = h7[h7.dtype == dt].assign(config=lambda x: _config(x)).set_index(["config", "schedule"])
        before = np.array([b.kernel_ms[(c, "expert_wave")] / b.kernel_ms[(c, sch)] for c in order])
        assert s.loc[(dt, sch), "before_geomean"] == pytest.approx(geomean(before))
    got = {(dt, k): tuple(round(float(s.loc[(dt, k), c]), 3) for c in ("geomean_speedup", "max_speedup",
                                                                         "before_geomean"))
           for dt in ("bf16", "fp8") for k in ("interleaved", "lag", "model_guided")}
    assert got == {("bf16", "interleaved"): (1.014, 1.115, 1.014), ("bf16", "lag"): (1.007, 1.113, 1.007),
                   ("bf16", "model_guided"): (1.013, 1.121, 1.018), ("fp8", "interleaved"): (1.056, 1.294, 1.053),
                   ("fp8", "lag"): (1.020, 1.126, 1.014), ("fp8", "model_guided"): (1.026, 1.160, 1.025)}
    assert [int(s.loc[(dt, k), "within"]) for dt in ("bf16", "fp8") for k in ("interleaved", "lag",
                                                                                "model_guided")] == [69, 65, 67, 70, 70, 71]
    for dt, want in (("bf16", 1.129), ("fp8", 1.127)):   # Expert-Wave / its compute-only control
        ew = df[(df.schedule == "expert_wave") & (df.dtype == dt)]
        assert round(geomean(ew.kernel_ms / ew.compute_ms), 3) == want
