"""8-rank traffic on 2 GPUs (xstage.traffic, issue 13) under Triton's CPU interpreter: the traffic layer on 2
emulated GPUs against the emulated 8-rank MegaMoE layer, bit for bit (fresh random routing, tokens and weights;
combine buffers and every sink poisoned with NaN first): the real receive buffers of L_0 = 0 and L_1 = 4 equal the
8-rank layer's receive buffers of ranks 0 and 4, every combine row that owners 0 / 4 store lands at the 8-rank
layer's (source, slot, token) and every other row stays poisoned; the bytes that cross (7/8 of the combine) from
the layouts and from the buffers themselves; the check job (float32 reference, bit-identical schedules and
assignments) and the sweep's flow into its own schema; a planted wrong push or pointer is caught; bad inputs are
one clear error before any launch. Tiny cases: the whole file runs in well under a minute."""
import random
import types

import numpy as np
import pytest
import torch

import xstage.ranks
from xstage import data, env, records
from xstage import megamoe_analysis as analysis
from xstage import megamoe_model_analysis as model_analysis
from xstage import moe as M
from xstage import moe_plan as MP
from xstage import moe_sweep as MS
from xstage import traffic as TR
from xstage.model import BurstGapParams
from xstage.numeric import check_bit_identical
from xstage.ranks import EmulatedWorld
from conftest import record_launches

pytestmark = [pytest.mark.interpreter, pytest.mark.timeout(120)]

TILES = MP.INTERPRETER_TILES
PRM = BurstGapParams.reference()


def _layers(case, dtype, seed, schedule):
    """(8-rank world, its problem and buffers; traffic world, its problem and buffers), both layers run once with
    every combine (and every sink) poisoned first."""
    c = MP.as_case(case, seed)
    s = c.shape
    out = []
    for world in (EmulatedWorld(8), TR.TrafficWorld(EmulatedWorld(2), 8)):
        prob = M.make_problem(world, c, dtype, TILES, weight_seed=seed)
        bufs = M.moe_buffers(world, prob.cap_rows, c.tokens, s.hidden, s.intermediate, s.topk, s.experts // 8, dtype)
        if isinstance(world, TR.TrafficWorld):
            TR.poison(world, bufs)
        else:
            M.poison_combine(world, bufs, c.tokens)
        tasks = {r: M.build_tasks(prob, schedule, 2, r) for r in world.local_ranks}
        M.megamoe_layer(world, bufs, prob.inputs, tasks, TILES)
        out += [world, prob, bufs]
    return out


def _compare(w8, p8, b8, tw, pt, bt):
    """The issue's validation: receive buffers bit for bit, every landed row bit for bit, every other row NaN."""
    K, T, Hd = p8.case.shape.topk, p8.case.tokens, p8.case.shape.hidden
    for r in tw.local_ranks:
        n = p8.layouts[r].rows
        assert pt.layouts[r].rows == n
        check_bit_identical(bt.x_view(r)[:n], b8.x_view(r)[:n], f"receive rows of rank {r}")
        check_bit_identical(bt.meta_view(r)[:n], b8.meta_view(r)[:n], f"receive meta of rank {r}")
    landed = 0
    for g in range(2):
        for j in range(8):
            comb = tw.slot(bt.combine, g, j)[: K * T * Hd].view(K, T, Hd)
            m = TR.landing(tw, pt, g, j)
            check_bit_identical(comb[m], b8.combine_view(j)[m], f"GPU {g} slot {j}: landed rows")
            assert torch.isnan(comb[~m]).all(), f"GPU {g} slot {j}: a row no played owner stores is not NaN"
            assert not torch.isnan(comb[m]).any()
            landed += int(m.sum())
    # every row that owners 0 and 4 compute lands exactly once
    assert landed == p8.layouts[0].rows + p8.layouts[4].rows


# (hidden, intermediate, experts, topk, tokens, routing): tokens and rows are not tile multiples
UNIFORM = (64, 64, 16, 2, 24, "uniform")


@pytest.fixture(scope="module")
def uniform():
    """One pair of layers (8-rank, traffic) shared by the tests that read them (the 8-rank layer is the slow part
    under the interpreter); the test that plants errors in it runs last."""
    seed = random.randrange(2**30)
    return seed, _layers(UNIFORM, "fp16", seed, "interleaved")


def test_traffic_layer_lands_every_row_where_the_8_rank_layer_puts_it(uniform):
    seed, layers = uniform
    _compare(*layers)


def test_traffic_layer_zipf_fp32():
    seed = random.randrange(2**30)
    _compare(*_layers((64, 128, 16, 3, 20, "zipf"), "fp32", seed, "expert_wave"))


def test_remote_share_is_seven_eighths(uniform):
    """From the layouts: every combine row of rank L_g's owner from another source crosses to the peer, the
    traffic world's combine egress is the 8-rank layer's of the same rank exactly, and the dispatch egress (rows
    into the peer from the 7 sources other than the peer) is the 8-rank layer's on average; both ~7/8 of the
    bytes with uniform routing. From the buffers: the rows that landed in the peer's memory are those counts."""
    seed = random.randrange(2**30)
    c = MP.as_case((256, 256, 64, 4, 512, "uniform"), seed)
    tw = TR.TrafficWorld(EmulatedWorld(2))
    _, _, layouts = MP.routing_of(c, 8)
    eg = TR.egress(tw, layouts, 256)
    for g, me in enumerate(tw.played):
        lay = layouts[me]
        assert eg[g]["combine_remote"] == MP.remote_combine_bytes(lay.remote_rows, 256)   # the 8-rank rank's own
        assert eg[g]["combine_remote"] + eg[g]["combine_local"] == lay.rows * 256 * 2
        assert abs(eg[g]["combine_remote_share"] - 7 / 8) < 0.03, (seed, eg)
        assert abs(eg[g]["dispatch_remote_share"] - 7 / 8) < 0.03, (seed, eg)
        sent8 = MP.dispatch_bytes(lay.remote_items, 256)                  # what rank me sends at 8 ranks
        assert abs(eg[g]["dispatch_remote"] / sent8 - 1) < 0.1, (seed, eg)
    # from the buffers of a layer that ran: rows in the peer's memory written by this GPU's owner
    _, (w8, p8, b8, tw, pt, bt) = uniform
    K, T, Hd = 2, 24, 64
    for g, me in enumerate(tw.played):
        peer = tw.played[1 - g]
        crossed = 0
        for j in range(8):
            comb = tw.slot(bt.combine, 1 - g, j)[: K * T * Hd].view(K, T, Hd)
            written = ~torch.isnan(comb).any(2)                            # [K, T]
            owner = pt.layouts[j].dest[:, 0].view(T, K).T                  # [K, T] owner of each row
            crossed += int((written & (owner == me)).sum())
            if j != peer:
                assert not (written & (owner != me)).any()                  # sinks: only this GPU's owner
        assert crossed == pt.layouts[me].remote_rows
        pk = pt.inputs[me].pushes
        assert pk.remote_items == pt.layouts[peer].remote_rows and pk.local_items == sum(pt.layouts[me].own_rows)


def test_check_job_reference_schedules_and_assignments():
    """The traffic check job: landed rows within 2x PyTorch's error of the float32 reference, every schedule and
    both assignments bit-identical, per GPU what it pushed."""
    seed = random.randrange(2**30)
    res = TR.check_job(TR.TrafficWorld(EmulatedWorld(2)), [(64, 64, 16, 2, 24, "hot")], seed, "fp16", TILES,
                       schedules=("expert_wave", "lag"), n_sms=2, assignments=MP.ASSIGNMENTS)
    assert [r["rank"] for r in res] == [0, 4] and all(r["runs"] == 4 for r in res), seed
    assert all(r["pushed_remote"] > 0 and r["traffic_ranks"] == 8 and r["gpus"] == 2 for r in res)
    assert sum(r["pushed_remote"] + r["pushed_local"] for r in res) == sum(r["rows"] for r in res)


def test_a_wrong_push_or_pointer_is_caught(uniform):
    """The comparison can fail: one pushed item's row moved, or GPU 0's combine pointer of a sink aimed at its own
    memory (its stores no longer cross), each ends in an error."""
    seed, (w8, p8, b8, tw, pt, bt) = uniform
    pk = pt.inputs[0].pushes
    it = pk.items.clone()
    remote = torch.nonzero(it[:, 3] == 4).flatten()
    a, b = int(remote[0]), int(remote[1])
    pk.items[a, 4], pk.items[b, 4] = it[b, 4], it[a, 4]               # two rows swap places in rank 4's buffer
    TR.poison(tw, bt)
    tasks = {r: M.build_tasks(pt, "interleaved", 2, r) for r in tw.local_ranks}
    M.megamoe_layer(tw, bt, pt.inputs, tasks, TILES)
    with pytest.raises(AssertionError, match="receive rows of rank 4|receive meta of rank 4"):
        _compare(w8, p8, b8, tw, pt, bt)
    pk.items.copy_(it)
    j = 2                                                              # a logical rank no GPU plays
    own = tw.slot(bt.combine, 0, j).data_ptr()
    bt.tables[0]["combine"][j] = own                                   # GPU 0's stores for source 2 stay local
    TR.poison(tw, bt)
    M.megamoe_layer(tw, bt, pt.inputs, tasks, TILES)
    with pytest.raises(AssertionError, match=r"GPU 0 \(rank 0\) slot 2: \d+ row\(s\) written that no played owner"):
        TR.check_landing(tw, pt, bt, "planted")


def test_labels_say_traffic_never_gpus():
    tw = TR.TrafficWorld(EmulatedWorld(2))
    assert TR.label() == tw.label == "8-rank traffic on 2 GPUs"
    assert M.world_label(tw) == " (8-rank traffic on 2 GPUs)" and "8 GPUs" not in M.world_label(tw)
    assert tw.world_size == 8 and tw.local_ranks == [0, 4] and tw.emulated and tw.link == "emulated"


def test_barrier_runs_over_the_gpus_and_names_a_silent_one():
    tw = TR.TrafficWorld(EmulatedWorld(2))
    bufs = M.moe_buffers(tw, 16, 8, 64, 64, 2, 2, "fp16")
    M.moe_barrier(tw, bufs, "test")                                    # 8 logical ranks, 2 signal: no wait
    with pytest.raises(RuntimeError, match=r"8-rank traffic on 2 GPUs.*rank 0 timed out waiting for rank 1"):
        M.moe_barrier(tw, bufs, "test", max_polls=20, silent_ranks=[4])


def test_gather_over_gpus_keeps_one_entry_per_gpu():
    class Dist:
        def get_world_size(self):
            return 2

        def all_gather_object(self, out, obj):
            out[:] = [obj, obj + 1]

    lst = [None] * 8
    TR._GatherOverGPUs(Dist()).all_gather_object(lst, 10)
    assert lst == [10, 11]


# -------------------------------------------------------------------------------------------- bad inputs
@pytest.fixture
def no_launch(monkeypatch):
    launched = record_launches(monkeypatch, [(M, "megamoe_kernel"), (M, "dispatch_push_kernel"),
                                             (TR, "dispatch_push_kernel"), (xstage.ranks, "epoch_barrier_kernel")])
    yield launched
    assert not launched, "a kernel was launched although the inputs were bad"


def _layer_without_pushes():
    tw = TR.TrafficWorld(EmulatedWorld(2))
    prob = M.make_problem(tw, MP.as_case((64, 64, 16, 2, 16, "uniform"), 0), "fp16", TILES)
    prob.inputs[4].pushes = None
    bufs = M.moe_buffers(tw, prob.cap_rows, 16, 64, 64, 2, 2, "fp16")
    M.dispatch(tw, bufs, prob.inputs)


@pytest.mark.parametrize("call,match", [
    (lambda: TR.TrafficWorld(EmulatedWorld(3)), r"8-rank traffic needs a 2-rank world .* got 3 ranks"),
    (lambda: TR.TrafficWorld(EmulatedWorld(2), 7), r"multiple of the world size \(2\) larger than it, got 7"),
    (lambda: TR.TrafficWorld(EmulatedWorld(2), 2), r"larger than it, got 2"),
    (lambda: TR.TrafficWorld(TR.TrafficWorld(EmulatedWorld(2))), r"not another one"),
    (lambda: TR.check_job(TR.TrafficWorld(EmulatedWorld(2)), [(64, 64, 12, 2, 16, "uniform")], 0, "fp16", TILES),
     r"experts \(12\) must be a positive multiple of the traffic ranks \(8\)"),
    (lambda: TR.check_job(EmulatedWorld(2), [(64, 64, 16, 2, 16, "uniform")], 0), r"needs a TrafficWorld"),
    (lambda: M.check_job(TR.TrafficWorld(EmulatedWorld(2)), [(64, 64, 16, 2, 16, "uniform")], 0),
     r"cannot check this world \(8-rank traffic on 2 GPUs\): use xstage.traffic.check_job"),
    (lambda: TR.TrafficWorld(EmulatedWorld(2)).gpu_of(3), r"logical rank 3 is played by no GPU"),
    (_layer_without_pushes, r"rank 4: no source pushes"),
    (lambda: MS.run_megamoe("/nonexistent/traffic8", PRM, world="one-gpu", link="host", traffic_ranks=8),
     r"traffic ranks are for the gpus world"),
    (lambda: MS.run_megamoe("/nonexistent/traffic8", PRM, world_size=4, traffic_ranks=8),
     r"needs a 2-rank world .* got 4 ranks"),
    (lambda: MS.run_megamoe("/nonexistent/traffic5", PRM, traffic_ranks=5), r"multiple of the world size"),
    (lambda: MS.run_megamoe("/nonexistent/traffic16", PRM, traffic_ranks=16,
                            cases=MP.cases_by_name(["mixtral_8x7b_T128_hot"])),
     r"experts \(8\) must be a positive multiple of the traffic ranks \(16\)"),
    (lambda: MS.run_megamoe("/nonexistent/h200x2", PRM, traffic_ranks=8), r"in a folder of its own named traffic8"),
])
def test_bad_inputs_fail_before_any_launch(no_launch, call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_sweep_refuses_mixed_folders_and_needs_two_gpus(tmp_path):
    folder = tmp_path / "traffic8"
    data.start_file(folder, data.MEGAMOE, env.provenance("test", {}))
    with pytest.raises(ValueError, match="holds a megamoe sweep; record the megamoe_traffic one in another folder"):
        MS.run_megamoe(folder, PRM, traffic_ranks=8)
    if torch.cuda.device_count() < 2:
        with pytest.raises(RuntimeError, match="needs 2 CUDA GPU"):
            MS.run_megamoe(tmp_path / "x" / "traffic8", PRM, traffic_ranks=8,
                           cases=MP.cases_by_name(["mixtral_8x7b_T128_hot"]))
        assert not (tmp_path / "x").exists()


# ------------------------------------------------------------------------------------------ the sweep's flow
def test_sweep_job_flow_records_traffic_rows(tmp_path, monkeypatch, cpu_timing):
    """megamoe_job on the traffic world (emulated GPUs, one process: the flow, not GPU times): the traffic check
    (landing, reference, bit-identical schedules), every timing, rows into megamoe_traffic.csv with traffic_ranks 8
    and gpus 2, unfused_ms not measured (NaN), resume."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: types.SimpleNamespace(multi_processor_count=2))
    monkeypatch.setattr(MS, "default_tiles", lambda *a, **k: TILES)
    tw = TR.TrafficWorld(EmulatedWorld(2))
    shape = MP.MoEShape("tiny", 64, 64, 16, 2)
    cases = [MP.MoECase(shape, 16, "uniform", random.randrange(2**20))]
    meta = env.provenance("test", {"traffic_ranks": 8, "gpus": 2})
    scheds = ["expert_wave", "interleaved"]
    MS.megamoe_job(tw, cases, str(tmp_path), meta, ["fp16"], scheds, 2, 1, PRM.as_dict(), 3, None, "dynamic")
    df, side = data.load(tmp_path, data.MEGAMOE_TRAFFIC)
    assert list(df.schedule) == scheds and (df.traffic_ranks == 8).all() and (df.gpus == 2).all()
    assert (df.P == 8).all() and df.unfused_ms.isna().all() and (df.kernel_ms > 0).all()
    assert (df.remote_bytes > 0).all() and (df.predicted_ms > 0).all() and side["params"]["traffic_ranks"] == 8
    assert not (tmp_path / "megamoe.csv").exists()
    summ = analysis.summary(df)                # what notebook 03 would show of a record (no record yet)
    assert list(summ.schedule) == scheds and summ.geomean_speedup.notna().all() and summ.fused_geomean.isna().all()
    MS.megamoe_job(tw, cases, str(tmp_path), meta, ["fp16"], scheds, 2, 1, PRM.as_dict(), 3, None, "dynamic")
    assert len(data.load(tmp_path, data.MEGAMOE_TRAFFIC)[0]) == 2          # resumed: nothing new


# ------------------------------------------------------------------------------------------ sm_90 compile
PUSH_COMPILE = r"""
import triton
from triton.backends.compiler import GPUTarget
import xstage.kernels.moe as k
for fp8 in (False, True):
    # the dispatch kernel with an item list (ITEMS, xstage.traffic.push): xs_ptr, dest_ptr and wbits_ptr are the
    # sources' scale table, the items and the sources' row table
    sig = {'x_ptr': '*u8' if fp8 else '*i16', 'xs_ptr': '*i64', 'dest_ptr': '*i32', 'wbits_ptr': '*i64',
           'x_table': '*i64', 'xs_table': '*i64', 'meta_table': '*i64', 'rank': 'i32', 'n_items': 'i32', 'K': 'i32',
           'Hd': 'i32', 'BLOCK_R': 'constexpr', 'BLOCK_H': 'constexpr', 'SCALE_COLS': 'constexpr',
           'FP8': 'constexpr', 'ITEMS': 'constexpr'}
    src = triton.compiler.ASTSource(fn=k.dispatch_push_kernel, signature=sig, constexprs=dict(
        BLOCK_R=16, BLOCK_H=512, SCALE_COLS=64, FP8=fp8, ITEMS=True), attrs={(i,): [['tt.divisibility', 16]]
                                                                             for i in (0, 1, 2, 3, 4, 5, 6, 10)})
    c = triton.compile(src, target=GPUTarget('cuda', 90, 32), options=dict(num_warps=4))
    print('push', 'fp8' if fp8 else 'bf16', 'vec4' if 'st.global.v4.b32' in c.asm['ptx'] else 'no-vec4')
"""


def test_push_kernel_compiles_for_hopper_with_16_byte_stores():
    """sm_90 compile on the CPU (TRITON_INTERPRET=0): the traffic push (the dispatch kernel with ITEMS) stores rows
    16 bytes wide, as the plain dispatch does (tests/test_moe_cpu.py), for bf16 and fp8 rows."""
    import os
    import subprocess
    import sys

    env_ = {**os.environ, "TRITON_INTERPRET": "0"}
    out = subprocess.run([sys.executable, "-c", PUSH_COMPILE], env=env_, capture_output=True, text=True, timeout=300)
    if out.returncode and "ptxas" in out.stderr.lower() and "not found" in out.stderr.lower():
        pytest.skip("Triton's CUDA backend is not usable here")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[:2] == ["push bf16 vec4", "push fp8 vec4"], out.stdout


# ------------------------------------------------------------------------------------------- 2 GPUs (multigpu)
# small token counts of three shapes (Mixtral: one expert per rank at EP = 8) and one larger configuration
GPU_CASES = ["mixtral_8x7b_T128_hot", "qwen3_235b_T256_zipf", "deepseek_v4_flash_T512_uniform",
             "deepseek_v4_pro_T2048_zipf"]


@pytest.mark.multigpu
@pytest.mark.timeout(900)   # compiles of every tile configuration, 4 cases x 8 checked runs
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_traffic_layer_against_reference_on_two_gpus(dtype):
    """On 2 GPUs (TorchSymmWorld): every landed row within tolerance of the float32 reference, every other row
    still NaN, all schedules x both assignments bit-identical, rows crossing NVLink from both GPUs."""
    from xstage.ranks import spawn

    spawn(TR.gpu_check_job, 2, 8, MP.cases_by_name(GPU_CASES), random.randrange(2**30), dtype, MP.SCHEDULES,
          MP.ASSIGNMENTS)


@pytest.mark.multigpu
@pytest.mark.timeout(900)
def test_traffic_sweep_writes_and_resumes_on_two_gpus(tmp_path):
    folder = tmp_path / "traffic8"
    cases = MP.cases_by_name(["qwen3_235b_T256_zipf"])
    MS.run_megamoe(folder, PRM, cases=cases, dtypes=("bf16",), traffic_ranks=8)
    df, meta = data.load(folder, data.MEGAMOE_TRAFFIC)
    assert len(df) == 4 and (df.traffic_ranks == 8).all() and (df.gpus == 2).all() and (df.P == 8).all()
    assert (df.kernel_ms > 0).all() and df.unfused_ms.isna().all() and meta["params"]["traffic_ranks"] == 8
    MS.run_megamoe(folder, PRM, cases=cases, dtypes=("bf16",), traffic_ranks=8)
    assert len(data.load(folder, data.MEGAMOE_TRAFFIC)[0]) == 4


def test_predictions_from_the_recorded_two_gpu_rows():
    """traffic.drain_bound / predicted_speedups on one recorded configuration of data/h200x2: the remote combine
    grows to ~7/8 of the rows (from ~1/2), the drain takes less than the compute, Expert-Wave's predicted speedup
    is 1, every schedule has both predictions."""
    df, meta = data.load(records.folder("megamoe", "h200x2", "nvlink"), data.MEGAMOE)
    one = df[(df["shape"] == "qwen3_235b") & (df.tokens == 256) & (df.routing == "uniform")]
    d = model_analysis.drain_bound(one)
    assert len(d) == 2 and (abs(d.remote_bytes_traffic / d.remote_bytes_p2 - 1.75) < 0.2).all(), d
    assert ((d.drain_ms_traffic > d.drain_ms_p2) & (d.drain_ms_traffic < d.compute_ms)).all(), d
    p = model_analysis.predicted_speedups(one[one.dtype == "bf16"], meta)
    assert len(p) == 4 and p[["model_p2", "model_traffic"]].notna().all().all()
    assert (p[p.schedule == "expert_wave"][["measured_p2", "model_p2", "model_traffic"]] == 1).all().all()
