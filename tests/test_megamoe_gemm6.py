"""MegaMoE round 6 (issue 15, item 2) on the CPU: the TMA main loops of the experts kernel (x, W1, W2 through tensor
descriptors; h pointer-loaded) under Triton's interpreter -- the fused layer against the float32 reference on fresh
random inputs, combine poisoned first, every schedule and assignment bit-identical, the same values as the pointer
loops; fp8 with TMA refused before any launch; the sm_90a compile (TMA copies, wgmma, no spills, shared memory);
study tiles6 end to end on the emulated world and its summary; the device script's stages."""
import dataclasses
import os
import random
import subprocess
import sys
import types

import pytest
import torch

from xstage import data, env, studies
from xstage import moe as M
from xstage import moe_gemm as MG
from xstage import moe_plan as MP
from xstage.model import BurstGapParams
from xstage.numeric import check_bit_identical, geomean, rel_l2
from xstage.ranks import EmulatedWorld

TILES = MP.INTERPRETER_TILES          # BM 16, BN1 32, BN2 32, BK 32
TMA = MG.tma_tiles(TILES)

# (P, (hidden, intermediate, experts, topk, tokens, routing), dtype): rows per expert not multiples of BM, so the
# x descriptor's zero fill past an expert's end is exercised (the pointer loops' mask)
CASES = [pytest.param(2, (64, 64, 4, 2, 40, "zipf"), "fp16", id="P2-zipf-fp16"),
         pytest.param(2, (96, 64, 4, 2, 36, "hot"), "fp32", id="P2-hot-fp32"),
         pytest.param(4, (64, 96, 8, 2, 24, "uniform"), "fp16", id="P4-uniform-fp16")]


@pytest.mark.interpreter
@pytest.mark.parametrize("P,case,dtype", CASES)
def test_tma_layer_matches_reference_and_schedules_are_bit_identical(P, case, dtype):
    """check_job with the TMA tiles: NaN-poisoned combine buffers checked whole against the float32 reference (<= 2x
    PyTorch's own error), every schedule x assignment bit-identical."""
    seed = random.randrange(2**30)
    res = M.check_job(EmulatedWorld(P), [case], seed=seed, dtype=dtype, tiles=TMA, n_sms=2,
                      assignments=MP.ASSIGNMENTS)
    assert [r["rank"] for r in res] == list(range(P)), seed
    assert all(r["runs"] == 4 * 2 for r in res), seed
    assert all(r["rel_l2"] <= 2 * r["rel_l2_torch"] + MP.REL_L2_FLOOR[dtype] for r in res), (seed, res)


@pytest.mark.interpreter
def test_tma_and_pointer_loops_compute_the_same_layer():
    """The same problem through both main loops (fresh seed): every rank's combine within rounding of the other's
    (the interpreter's dot; on the GPU both are wgmma)."""
    seed = random.randrange(2**30)
    world = EmulatedWorld(2)
    prob = M.make_problem(world, MP.as_case((64, 96, 4, 2, 44, "zipf"), seed), "fp32", TILES, weight_seed=seed)
    s = prob.case.shape
    bufs = M.moe_buffers(world, max(prob.cap_rows, 1), prob.case.tokens, s.hidden, s.intermediate, s.topk,
                         s.experts // 2, "fp32")
    tasks = {r: M.build_tasks(prob, "interleaved", 2, r) for r in range(2)}
    out = {}
    for name, t in (("pointer", TILES), ("tma", TMA)):
        M.poison_combine(world, bufs, prob.case.tokens)
        M.megamoe_layer(world, bufs, prob.inputs, tasks, t)
        out[name] = {r: bufs.combine_view(r, prob.case.tokens).clone() for r in range(2)}
    for r in range(2):
        assert not out["tma"][r].isnan().any(), (seed, r)
        assert rel_l2(out["tma"][r], out["pointer"][r]) < 1e-6, (seed, r)


def test_each_tiles_launch_their_kernel(monkeypatch):
    """run_experts launches megamoe_tma_kernel for TMA tiles and megamoe_kernel (signature unchanged) otherwise."""
    from conftest import record_launches

    plain = record_launches(monkeypatch, [(M, "megamoe_kernel")])
    tma = record_launches(monkeypatch, [(M._device, "megamoe_tma_kernel")])
    world = EmulatedWorld(2)
    prob = M.make_problem(world, MP.as_case((64, 64, 4, 2, 16, "uniform"), 0), "fp16", TILES)
    s = prob.case.shape
    bufs = M.moe_buffers(world, max(prob.cap_rows, 1), 16, s.hidden, s.intermediate, s.topk, 2, "fp16")
    tasks = {r: M.build_tasks(prob, "expert_wave", 2, r) for r in range(2)}
    M.run_experts(world, bufs, prob.inputs, tasks, TMA, barrier=False, check=False)
    assert len(tma) == 2 and not plain
    M.run_experts(world, bufs, prob.inputs, tasks, TILES, barrier=False, check=False)
    assert len(tma) == 2 and len(plain) == 2


def test_fp8_with_tma_is_accepted_and_plain_tiles_launch_as_before():
    """tiles.tma with fp8: the TMA main loops (round 8); plain tiles ask for no TMA (the launch's keywords, hence
    the compiled kernel, unchanged); the TMA label names it."""
    assert M._tma_main_loops(TMA, fp8=True) is True
    assert M._tma_main_loops(TILES, fp8=True) is False and M._tma_main_loops(TILES, fp8=False) is False
    assert M._tma_main_loops(TMA, fp8=False) is True
    assert MG.tile_label(TMA) == MG.tile_label(TILES) + " tma"
    assert dataclasses.replace(TMA, num_stages=2).tma and MG.tma_tiles(TMA) == TMA


def test_tiles6_variants_and_warm_list(monkeypatch):
    """Study tiles6's variants of both row-block classes: TMA where named, the default's tiles otherwise; the
    device compile list holds every TMA variant (dynamic)."""
    monkeypatch.setattr(env, "interpreted", lambda: False)
    warm = {(t, dyn) for _, t, dyn, _ in MG.warm_variants(("bf16",))}
    for bm in (64, 128):
        d = MP.gpu_tiles("bf16", bm)
        v = MG.tiles6_variants(d)
        assert set(v) == set(MG.TILES6_VARIANTS)
        for name, (t, g) in v.items():
            change, swz, tma = MG.TILES6_VARIANTS[name]
            assert t.tma == tma and g == swz
            assert t.block_m == bm and t.num_stages == change.get("num_stages", d.num_stages)
            if tma:
                assert (t, True) in warm, (bm, name)


@pytest.mark.interpreter
def test_round6_study_end_to_end(tmp_path, monkeypatch, cpu_timing):
    """Study tiles6 through the launchers on the emulated world: every variant (TMA ones included) checked against
    the float32 reference and timed beside torch._grouped_mm; rows name their tiles, resume; the summary's ratios
    against the rows."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: types.SimpleNamespace(multi_processor_count=2))
    monkeypatch.setattr(MG, "default_tiles", lambda *a, **k: TILES)
    monkeypatch.setattr(MG, "TILES6_VARIANTS", {"tma": ({}, None, True), "tma_swz1": ({}, 1, True)})
    shape = MP.MoEShape("tiny", 64, 32, 4, 2)
    cases = [MP.MoECase(shape, 12, "uniform", 1)]
    world = EmulatedWorld(2)
    meta = env.provenance("test", {"world": "one-gpu", "link": "emulated"})
    prm = BurstGapParams.reference().as_dict()
    MG.round3_job(world, cases, ["fp16"], str(tmp_path), meta, "tiles6", prm, None, rounds=5)
    df, side = data.load(tmp_path, data.MEGAMOE_GEMM)
    assert side["csv_rows"] == len(df) == 3 + 1 and set(df.study) == {"tiles6"}
    ours = df[df.method == "ours"]
    assert set(ours.variant) == {"default", "tma", "tma_swz1"}
    assert (ours.rel_l2 > 0).all() and (ours.rel_l2 < 0.05).all()
    assert set(ours[ours.variant == "tma"].tiles) == {MG.tile_label(TMA)}
    assert set(ours[ours.variant == "default"].tiles) == {MG.tile_label(TILES)}
    assert all(MP.parse_schedule_param(p)["swizzle"] == 1 for p in ours[ours.variant == "tma_swz1"].note)
    MG.round3_job(world, cases, ["fp16"], str(tmp_path), meta, "tiles6", prm, None, rounds=5)   # resume: nothing
    assert len(data.load(tmp_path, data.MEGAMOE_GEMM)[0]) == len(df)
    t = studies.megamoe_round6_tiles(df)
    lib = df[df.method == "torch._grouped_mm"].ms.iloc[0]
    assert t.tma.iloc[0] == pytest.approx(lib / ours[ours.variant == "tma"].ms.iloc[0])
    sm = studies.megamoe_round6_tiles_summary(t)
    row = sm[sm.variant == "tma"].iloc[0]
    assert row.configs == 1 and row.geomean == pytest.approx(geomean(t.tma.to_numpy()))


PTX_CHECK = r"""
import re, subprocess, tempfile, triton
from triton.backends.compiler import GPUTarget
import xstage.kernels.moe as k
def ptxas_info(ptx):
    try:
        from triton.backends.nvidia.compiler import get_ptxas
        try:
            p = get_ptxas(90)
        except TypeError:
            p = get_ptxas()
        path = p.path if hasattr(p, 'path') else p[0]
        with tempfile.NamedTemporaryFile('w', suffix='.ptx', delete=False) as f:
            f.write(ptx)
        err = subprocess.run([path, '-arch=sm_90a', '-v', f.name, '-o', f.name + '.o'], capture_output=True,
                             text=True).stderr
        return int(re.search(r'Used (\d+) registers', err).group(1)), int(re.search(r'(\d+) bytes spill stores', err).group(1))
    except Exception:
        return -1, -1
for bm, stages in ((128, 4), (64, 4), (128, 3)):
    a = '*bf16'
    sig = {'x_ptr': a, 'xs_ptr': a, 'w1_ptr': a, 'w1s_ptr': a, 'w2_ptr': a, 'w2s_ptr': a, 'h_ptr': a,
           'hs_ptr': a, 'meta_ptr': '*i32', 'offs_ptr': '*i32', 'tasks_ptr': '*i32', 'counters_ptr': '*i32',
           'combine_table': '*i64', 'comb_ptr': '*bf16', 'status_ptr': '*i64', 'ts_ptr': '*i64',
           'ticket_ptr': '*i32', 'n_tasks': 'i32', 'rank': 'i32', 'T': 'i32', 'Hd': 'i32', 'I': 'i32',
           'expected': 'i32', 'max_polls': 'i32', 'ticket_base': 'i32',
           'BLOCK_M': 'constexpr', 'BLOCK_N1': 'constexpr', 'BLOCK_N2': 'constexpr', 'BLOCK_K': 'constexpr',
           'FP8': 'constexpr', 'TIMED': 'constexpr', 'DEVICE': 'constexpr', 'DYNAMIC': 'constexpr'}
    names = list(sig)
    div = [i for i, n in enumerate(names) if sig[n].startswith('*')] + [names.index('Hd'), names.index('I')]
    src = triton.compiler.ASTSource(fn=k.megamoe_tma_kernel, signature=sig, constexprs=dict(
        BLOCK_M=bm, BLOCK_N1=128, BLOCK_N2=256, BLOCK_K=64, FP8=False, TIMED=False, DEVICE=True, DYNAMIC=True),
        attrs={(i,): [['tt.divisibility', 16]] for i in div})
    c = triton.compile(src, target=GPUTarget('cuda', 90, 32), options=dict(num_warps=8, num_stages=stages))
    ptx = c.asm['ptx']
    regs, spill = ptxas_info(ptx)
    print(bm, stages, len(re.findall(r'cp\.async\.bulk\.tensor\.2d', ptx)),
          sorted(set(re.findall(r'wgmma\.mma_async[\w.]*', ptx))), 'regs', regs, 'spill', spill,
          'shared', c.metadata.shared)
"""


def test_tma_kernel_compiles_for_hopper_with_tma_copies_and_no_spills():
    """sm_90a compile on the CPU (TRITON_INTERPRET=0) of the TMA variant (dynamic, bf16 default tiles of both
    row-block classes, and 3 stages): 2D bulk tensor copies and bf16 wgmma in the PTX; no register spills (the
    pointer loops spill 8 B at BM = 128); shared memory within the H200's 227 KiB."""
    env_ = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    out = subprocess.run([sys.executable, "-c", PTX_CHECK], env=env_, capture_output=True, text=True, timeout=600)
    if out.returncode and "ptxas" in out.stderr.lower() and "not found" in out.stderr.lower():
        pytest.skip("Triton's CUDA backend is not usable here")
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    print(out.stdout)
    assert len(lines) == 3
    for line in lines:
        f = line.split()
        assert int(f[2]) > 0 and "f32.bf16.bf16" in line, line
        regs, spill, shared = int(f[f.index("regs") + 1]), int(f[f.index("spill") + 1]), int(f[-1])
        assert regs == -1 or (regs <= 255 and spill == 0), line
        assert shared <= 227 * 1024, line


def test_round6_script_sources_the_stage_helpers():
    """scripts/megamoe_round6_gemm.sh: time-bounded stages from scripts/megamoe_stages.sh, study tiles6 into the new
    folder, the GPU tests of the fused layer, the XSTAGE_GIT_COMMIT left to the caller."""
    text = open("scripts/megamoe_round6_gemm.sh").read()
    assert "megamoe_stages.sh" in text and "stage() {" not in text
    assert "--study tiles6" in text and "megamoe_round6_gemm" in text
    assert "tests/test_moe_one_gpu.py" in text and "NCCL_NVLS_ENABLE=0" in text


# ------------------------------------------------------------------------------------------------ GPU
# tests/test_moe_one_gpu.py's cases (both bf16 row-block classes: BM 64 and 128) and a Pro-sized layer (Hd 7168)
GPU_CASES = ["mixtral_8x7b_T128_hot", "qwen3_235b_T256_zipf", "deepseek_v4_flash_T512_uniform",
             "mixtral_8x7b_T1024_uniform"]
PRO_LIKE = (7168, 3072, 16, 2, 1024, "uniform")


@pytest.mark.gpu
@pytest.mark.parametrize("link", ["local", "host"])
def test_tma_layer_against_reference_on_one_gpu(link):
    """OneGPUWorld(2), bf16: the whole fused layer with the TMA main loops (each case's default tiles + tma) against
    the float32 reference on fresh random inputs, combine poisoned first, every schedule x assignment bit-identical
    on every rank; the same layer with the pointer loops within rounding of it (and whether it is bit-identical,
    printed)."""
    from xstage.ranks import OneGPUWorld

    world = OneGPUWorld(2, link=link)
    seed = random.randrange(2**30)
    cases = list(MP.cases_by_name(GPU_CASES)) + [MP.as_case(PRO_LIKE, seed)]
    bms = set()
    for i, c in enumerate(cases):
        d = MP.default_tiles("bf16", c.tokens * 2 * c.shape.topk / c.shape.experts)
        bms.add(d.block_m)
        res = M.check_job(world, [c], seed + i, "bf16", MG.tma_tiles(d), MP.SCHEDULES, None, M.MAX_POLLS, None,
                          MP.ASSIGNMENTS)
        assert len(res) == 2 and all(r["runs"] == len(MP.SCHEDULES) * len(MP.ASSIGNMENTS) for r in res)
        # the pointer loops on the same problem, Expert-Wave dynamic
        prob = M.make_problem(world, MP.as_case(c, seed + i), "bf16", d, weight_seed=seed + i)
        s = prob.case.shape
        bufs = M.moe_buffers(world, max(prob.cap_rows, 1), prob.case.tokens, s.hidden, s.intermediate, s.topk,
                             s.experts // 2, "bf16", min_block_m=d.block_m)
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        tasks = {r: M.build_tasks(prob, "expert_wave", sms, r) for r in range(2)}
        out = {}
        for name, t in (("pointer", dataclasses.replace(d, tma=False)), ("tma", MG.tma_tiles(d))):
            M.poison_combine(world, bufs, prob.case.tokens)
            M.megamoe_layer(world, bufs, prob.inputs, tasks, t, dynamic=True)
            torch.cuda.synchronize()
            out[name] = {r: bufs.combine_view(r, prob.case.tokens).clone() for r in range(2)}
        same = all(torch.equal(out["tma"][r].view(torch.int16), out["pointer"][r].view(torch.int16)) for r in range(2))
        err = max(rel_l2(out["tma"][r].float(), out["pointer"][r].float()) for r in range(2))
        errs = ", ".join(f"{r['rel_l2']:.3g}" for r in res)
        vs = "bit-identical" if same else f"rel_l2 {err:.3g}"
        print(f"one GPU, link {link}, bf16 TMA, {prob.case.name}, seed {seed + i}: rel_l2 {errs} "
              f"({res[0]['runs']} runs bit-identical); TMA vs pointer loops: {vs}")
        assert not any(out["tma"][r].isnan().any() for r in range(2))
        assert err < 1e-2
        del prob, bufs, out
        torch.cuda.empty_cache()
    assert bms == {64, 128}, bms
