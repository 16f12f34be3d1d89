"""MegaMoE in a one-process world: every EP rank of the layer driven by one process, each rank with its own
buffers and task list, the ranks run one after another (``xstage.ranks.EmulatedWorld`` on the CPU,
``xstage.ranks.OneGPUWorld`` on one GPU, link ``local`` or ``host``): the same job and kernels as the real world.

CPU (Triton interpreter): the sweep's one-process flow end to end (checks, every timing of the observed rank,
rows, resume), the one-process unfused baseline against the fused layer, one rank's launches alone after a full
layer, bad inputs. GPU (marker ``gpu``, one GPU): the fused layer against the float32 reference on fresh random
inputs, combine buffers poisoned first, every schedule and assignment bit-identical, for link local and host
(the peers' combine buffers in pinned host memory); a planted missing dependency named.
"""
import random
import time
import types

import numpy as np
import pytest
import torch

from xstage import data, env
from xstage import megamoe_analysis as analysis
from xstage import moe as M
from xstage import moe_unfused as MU
from xstage import moe_plan as MP
from xstage import moe_sweep as MS
from xstage.model import BurstGapParams
from xstage.numeric import check_bit_identical, rel_l2
from xstage.ranks import EmulatedWorld

TILES = MP.TileConfig(16, 32, 32, 32, num_warps=4, num_stages=1)
PRM = BurstGapParams.reference()
# kernels on CPU tensors: Triton's interpreter (a machine without CUDA, or TRITON_INTERPRET=1); on a GPU machine
# without it these three fail to launch (seen on one H100), so they run where CI runs them
interpreter = pytest.mark.skipif(not env.interpreted(), reason="CPU tensors need Triton's interpreter")


def _problem(world, case, dtype="fp32", seed=0):
    return M.make_problem(world, MP.as_case(case, seed), dtype, TILES, weight_seed=seed)


def _buffers(world, prob, dtype="fp32"):
    s = prob.case.shape
    return M.moe_buffers(world, max(prob.cap_rows, 1), prob.case.tokens, s.hidden, s.intermediate, s.topk,
                         s.experts // world.world_size, dtype, min_block_m=TILES.block_m)


# ------------------------------------------------------------------------------------------------ CPU
@interpreter
def test_one_process_sweep_end_to_end_on_the_emulated_world(tmp_path, monkeypatch, cpu_timing):
    """megamoe_job on EmulatedWorld(2) (one process, no collectives): every rank's layer checked (fused vs the
    one-process unfused baseline, schedules bit-identical on every rank), the observed rank's kernels, controls,
    layer, dispatch and unfused share timed, its rows written; resume appends nothing."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: types.SimpleNamespace(multi_processor_count=2))
    monkeypatch.setattr(MS, "default_tiles", lambda *a, **k: TILES)
    world = EmulatedWorld(2)
    shape = MP.MoEShape("tiny", 64, 64, 4, 2)
    cases = [MP.MoECase(shape, 24, "uniform", 1), MP.MoECase(shape, 16, "hot", 2)]
    meta = env.provenance("test", {"world": "one-gpu", "link": "emulated"})
    prm = PRM.as_dict()
    MS.megamoe_job(world, cases[1:], str(tmp_path), meta, ["fp16"], list(MP.SCHEDULES), 2, 1, prm, 0, None)
    df, _ = data.load(tmp_path, data.MEGAMOE)
    assert len(df) == 4 and (df.P == 2).all() and set(df.routing) == {"hot"}
    assert (df.kernel_ms > 0).all() and (df.layer_ms > 0).all() and (df.unfused_ms > 0).all()
    assert (df.compute_sched_ms > 0).all() and (df.dispatch_ms > 0).all() and (df.grouped_mm_ms > 0).all()
    # the observed rank's own rows and remote bytes (rank 0 of 2: half its rows come from rank 1)
    for c in cases[1:]:
        lay = MP.routing_of(c, 2)[2][0]
        got = df[(df.routing == c.routing)]
        assert (got.rows == lay.rows).all() and (got.remote_bytes == MP.remote_combine_bytes(
            lay.remote_rows, 64, 2)).all() and lay.remote_rows > 0
    MS.megamoe_job(world, cases, str(tmp_path), meta, ["fp16"], list(MP.SCHEDULES), 2, 1, prm, 0,
                   time.time() - 1)                  # past its deadline: nothing appended
    assert len(data.load(tmp_path, data.MEGAMOE)[0]) == 4
    MS.megamoe_job(world, cases[:1], str(tmp_path / "dynamic"), meta, ["fp16"], list(MP.SCHEDULES), 2, 1, prm, 0,
                   None, "dynamic")
    assert len(data.load(tmp_path / "dynamic", data.MEGAMOE)[0]) == 4
    summ = analysis.summary(df)
    assert (summ.configs == 1).all() and summ.geomean_speedup.notna().all()


@interpreter
def test_one_process_unfused_baseline_equals_the_fused_layer():
    """The one-process unfused layer (every all_to_all as copies between the ranks' tensors, uneven splits, a hot
    expert) computes every rank's output of the fused layer; its observed share alone returns the observed
    rank's output again."""
    P, seed = 3, random.randrange(2**20)
    world = EmulatedWorld(P)
    prob = _problem(world, (64, 64, 6, 3, 20, "hot"), seed=seed)
    bufs = _buffers(world, prob)
    tasks = {r: M.build_tasks(prob, "interleaved", 2, r) for r in range(P)}
    want = M.megamoe_layer(world, bufs, prob.inputs, tasks, TILES)
    run = MU.make_unfused_one_process(world, prob.inputs, {r: M.hi_weights(prob.inputs[r].weights)
                                                          for r in range(P)}, observed=1)
    got = run.full()
    for r in range(P):
        err = rel_l2(got[r], want[r])
        assert err < MP.UNFUSED_REL_L2["fp32"], f"rank {r} (seed {seed}): unfused vs fused {err}"
    assert rel_l2(run(), want[1]) < MP.UNFUSED_REL_L2["fp32"]
    assert run.gemm().shape == (prob.layouts[1].rows, 64)


@interpreter
def test_one_rank_alone_after_a_full_layer_keeps_every_bit():
    """The sweep times the observed rank's launches alone (ranks=[0]); its kernel reads only its own receive rows
    and counters and its barriers take every rank (signals before waits), so nothing waits on a rank that did not
    run and its combine rows (its own and those it stores into its peer) come out bit-identical."""
    P, seed = 2, random.randrange(2**20)
    world = EmulatedWorld(P)
    prob = _problem(world, (64, 64, 4, 2, 24, "zipf"), seed=seed)
    bufs = _buffers(world, prob)
    tasks = {r: M.build_tasks(prob, "lag", 2, r) for r in range(P)}
    M.megamoe_layer(world, bufs, prob.inputs, tasks, TILES)
    full = {r: bufs.combine_view(r).clone() for r in range(P)}
    M.poison_combine(world, bufs, prob.case.tokens)
    outs = M.megamoe_layer(world, bufs, prob.inputs, tasks, TILES, ranks=[0])
    assert list(outs) == [0]
    comb = {r: bufs.combine_view(r) for r in range(P)}
    # rank 0 wrote its own rows into every combine: exactly the rows whose expert lives on rank 0
    for r in range(P):
        mine = (prob.ids[r] // (prob.case.shape.experts // P) == 0).T              # [K, T]
        check_bit_identical(comb[r][mine], full[r][mine], f"rank {r}'s rows from rank 0")
        assert torch.isnan(comb[r][~mine]).all(), "rank 1 did not run: its rows stay poisoned"
    M.run_experts(world, bufs, prob.inputs, tasks, TILES, ranks=[1])          # the other rank's kernel completes it
    for r in range(P):
        check_bit_identical(comb[r], full[r], f"rank {r} after both ranks")


@pytest.mark.parametrize("call, match", [
    (lambda: MS.run_megamoe("/nonexistent/x", PRM, world="one-host"), r"world must be one of gpus, one-gpu"),
    (lambda: MS.run_megamoe("/nonexistent/x", PRM, world="one-gpu"), r"one-gpu world's link must be one of "
                                                                     r"local, host, got None"),
    (lambda: MS.run_megamoe("/nonexistent/x", PRM, world="one-gpu", link="nvlink"), r"must be one of local, host"),
    (lambda: MS.run_megamoe("/nonexistent/x", PRM, world="gpus", link="host"), r"gpus world's link must be one of "
                                                                               r"nvlink"),
    (lambda: MS.run_megamoe("/nonexistent/x", PRM, world="one-gpu", link="host", world_size=1),
     r"world_size must be >= 2"),
    (lambda: M.run_experts(EmulatedWorld(2), None, {}, {}, TILES, ranks=[2]), r"ranks must be a non-empty subset"),
    (lambda: M.dispatch(EmulatedWorld(2), None, {}, ranks=[]), r"ranks must be a non-empty subset"),
])
def test_bad_one_gpu_inputs_are_one_clear_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_a_folder_holds_one_world_and_link(tmp_path):
    data.start_file(tmp_path, data.MEGAMOE, env.provenance("test", {"assignment": "static", "world": "one-gpu",
                                                                     "link": "host"}))
    with pytest.raises(ValueError, match=r"holds a sweep of world one-gpu, link host; record the one-gpu / local"):
        MS.run_megamoe(tmp_path, PRM, world="one-gpu", link="local", assignment="static")
    with pytest.raises(ValueError, match=r"holds a sweep of world one-gpu, link host; record the gpus / nvlink"):
        MS.run_megamoe(tmp_path, PRM, assignment="static")
    with pytest.raises(ValueError, match=r"holds a static-assignment sweep; record the dynamic one"):
        MS.run_megamoe(tmp_path, PRM, world="one-gpu", link="host")   # the default assignment is dynamic now


@pytest.mark.parametrize("argv, match", [
    (["--world", "one-gpu"], r"^xstage: error: --world one-gpu needs --link local or --link host$"),
    (["--link", "host"], r"^xstage: error: --link is for --world one-gpu"),
    (["--world", "one-gpu", "--link", "pcie"], r"argument --link: invalid choice: 'pcie'"),
    (["--world", "two-gpus", "--link", "host"], r"argument --world: invalid choice: 'two-gpus'"),
    (["--world", "one-gpu", "--link", "host", "--ranks", "1"], r"world_size must be >= 2"),
])
def test_bad_one_gpu_cli_is_one_line_and_writes_nothing(tmp_path, capsys, argv, match):
    import re

    from xstage import cli

    out = tmp_path / "sweep"
    try:
        rc = cli.main(["sweep", "megamoe", "--out", str(out), *argv])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and re.search(match, err), err
    assert not out.exists()


# ------------------------------------------------------------------------------------------------ GPU
# small token counts of three shapes (as the 2-GPU test): few rows per expert, a hot expert, Zipf skew; and one
# with 512 rows per expert, so that both row-block classes of the default tiles run (bf16 and fp8 BM = 128)
GPU_CASES = ["mixtral_8x7b_T128_hot", "qwen3_235b_T256_zipf", "deepseek_v4_flash_T512_uniform",
             "mixtral_8x7b_T1024_uniform"]


@pytest.mark.gpu
@pytest.mark.parametrize("link", ["local", "host"])
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_fused_layer_against_reference_on_one_gpu(link, dtype):
    """OneGPUWorld(2): the whole fused layer of both ranks on one GPU against the float32 reference (fresh
    random inputs, combine buffers poisoned first), every schedule x assignment bit-identical on every rank, the
    one-process unfused baseline close; with link host the peer's combine buffer is pinned host memory. The
    default tiles (tiles version 4: both dtypes through the TMA main loops, fp8 with one stage more than version
    3's pointer loops), orders (order version 3) and tile swizzle, both row-block classes."""
    from xstage.ranks import OneGPUWorld

    tiles = [MP.default_tiles(dtype, c.tokens * 2 * c.shape.topk / c.shape.experts)
             for c in MP.cases_by_name(GPU_CASES)]
    assert {t.block_m for t in tiles} == {64, 128}, tiles
    assert all(t.tma for t in tiles), tiles

    world = OneGPUWorld(2, link=link)
    seed = random.randrange(2**30)
    res = M.check_job(world, MP.cases_by_name(GPU_CASES), seed, dtype, None, MP.SCHEDULES, None, M.MAX_POLLS,
                      None, MP.ASSIGNMENTS)
    print(f"one GPU, link {link}, {dtype}, seed {seed}: " + "; ".join(
        f"{r['case']} rank {r['rank']}: rel_l2 {r['rel_l2']:.3g} ({r['runs']} runs bit-identical)" for r in res))
    assert len(res) == 2 * len(GPU_CASES) and all(r["runs"] == len(MP.SCHEDULES) * len(MP.ASSIGNMENTS) for r in res)
    bufs = M.moe_buffers(world, 64, 16, 256, 256, 2, 2, dtype)
    assert bufs.combine.local(0).is_cuda and bufs.recv_x.local(1).is_cuda
    assert bufs.combine.local(1).is_cuda == (link == "local")
    assert link == "local" or bufs.combine.local(1).is_pinned()


@pytest.mark.gpu
def test_missing_dependency_times_out_with_report_on_one_gpu():
    from xstage.ranks import OneGPUWorld

    M.missing_dependency_job(OneGPUWorld(2, link="host"), rank=1, max_polls=100_000)


# a layer of DeepSeek-V4-Pro's hidden size (N2 = 56 fp8 column blocks: the rule's chunk is ONE row block, which
# order version 2 ran as version 1) with three waves per rank, so interleaved really mixes: 16 experts x 3072
PRO_LIKE = (7168, 3072, 16, 2, 1024, "uniform")


@pytest.mark.gpu
def test_chunk_of_one_row_block_and_swizzled_tiles_on_one_gpu():
    """fp8, link host: the default lists of a Pro-sized layer with BM 64 tiles (the other row block at its 256 rows
    per expert) name chunk=1 and the tile swizzle, differ from the single-tile lists, and the whole layer matches
    the float32 reference with every schedule x assignment bit-identical on both ranks (fresh seed, combine
    poisoned first); so does the same layer with the default tiles (BM 128: two expert waves)."""
    from xstage.ranks import OneGPUWorld

    world = OneGPUWorld(2, link="host")
    seed = random.randrange(2**30)
    case = MP.as_case(PRO_LIKE, seed)
    s = case.shape
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tiles = MP.gpu_tiles("fp8", 64)
    assert tiles.block_m == 64 and MP.default_tiles("fp8", case.tokens * 2 * s.topk / s.experts).block_m == 128
    lay = MP.routing_of(case, 2)[2][0]
    grid = MP.TileGrid.of(lay, s.hidden, s.intermediate, tiles, MP.TILE_SWIZZLE)
    assert grid.n2 == 56 and MP.order_group(grid, sms) == 1 and len(MP.expert_waves(grid, sms)) >= 3
    il = MP.build_schedule("interleaved", grid, sms)
    assert il.param == f"chunk=1,swizzle={MP.TILE_SWIZZLE}", il.param
    assert not np.array_equal(il.tasks, MP.build_schedule("interleaved", grid, sms, order=1).tasks)
    for label, t in (("BM 64", tiles), ("default (BM 128)", None)):
        res = M.check_job(world, [PRO_LIKE], seed, "fp8", t, MP.SCHEDULES, None, M.MAX_POLLS, None, MP.ASSIGNMENTS)
        print(f"one GPU, link host, fp8, Pro-sized layer, {label}, seed {seed}: " + "; ".join(
            f"rank {r['rank']}: rel_l2 {r['rel_l2']:.3g} ({r['runs']} runs bit-identical)" for r in res))
        assert len(res) == 2 and all(r["runs"] == len(MP.SCHEDULES) * len(MP.ASSIGNMENTS) for r in res)
