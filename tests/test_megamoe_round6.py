"""MegaMoE round 6 (issue 15, items 3 and 4; session 8) on the CPU: the cost model's wait term in time
(``moe_plan.wait_walk``, wait model ``time``) on hand-checkable lists and on the recorded pairs where
model_guided's half-round lag cost; the combine's store pattern (``kernels/scatter_store.py``) bit for bit under
Triton's interpreter; the study ``lists6`` end to end on the emulated world."""
import types

import numpy as np
import pandas as pd
import pytest
import torch

from xstage import data
from xstage import moe_plan as MP
from xstage import scatter_store as SS
from xstage.model import BurstGapParams

L1, L2 = MP.KIND_L1, MP.KIND_L2
# c1 = 2 BM Hd 2 BN1 / F = 1 and c2 = 2 BM I BN2 / F = 0.5 with these tiles, Hd = I = 32 and F = 32768
HAND_TILES = MP.TileConfig(16, 16, 16, 16, num_warps=4, num_stages=1)
HAND_F = 32768.0


def _hand_list() -> MP.TaskList:
    """Two row blocks of one expert, two Linear-1 tiles each; each row block's Linear-2 tile right after them."""
    grid = MP.TileGrid((32,), 16, 2, 1)
    rows = [(L1, 0, 0, 0, 0), (L1, 0, 0, 1, 0), (L2, 0, 0, 0, 0), (L1, 0, 1, 0, 1), (L1, 0, 1, 1, 1),
            (L2, 0, 1, 0, 1)]
    tasks = np.array(rows, dtype=np.int32)
    MP.check_tasks(tasks, grid)
    return MP.TaskList("hand", "", tasks, grid, checked=True)


def _predict(tl_, n, assignment, wait):
    cost = MP.CostModel(BurstGapParams.reference(), HAND_F, n, assignment=assignment, wait=wait)
    return MP.predict_kernel_ns(tl_, np.zeros(tl_.grid.n_pool, dtype=np.int64), cost, 32, 32, HAND_TILES)


def test_wait_walk_hand_cases():
    """The event walk by hand (c1 = 1, c2 = 0.5). n = 3, dynamic: P0 / P1 run the two producers [0, 1]; P2 claims
    the first consumer at 0 and spins 1 (ends 1.5); P0 / P1 claim row block 1's producers at 1 (end 2); P2 claims
    the second consumer at 1.5 and spins 0.5 (ends 2.5). Makespan 2.5, P2's 1.0 of compute + 1.5 of spin. The
    positional model instead spins each consumer c1 (1 - 1/3) = 2/3 and predicts 2.333."""
    tl_ = _hand_list()
    work = np.where(tl_.tasks[:, 0] == L2, 0.5, 1.0)
    prog, spin = MP.wait_walk(tl_.tasks, work, 3, "dynamic")
    assert prog.tolist() == [0, 1, 2, 0, 1, 2]
    assert spin.tolist() == [0.0, 0.0, 1.0, 0.0, 0.0, 0.5]
    t = _predict(tl_, 3, "dynamic", "time")
    assert t["total_ns"] == pytest.approx(2.5) and t["wait_ns"] == pytest.approx(1.5)
    assert t["compute_ns"] == pytest.approx(1.0)
    p = _predict(tl_, 3, "dynamic", "positions")
    assert p["total_ns"] == pytest.approx(2 * (0.5 + 2 / 3))          # P2: both consumers, 2 x (c2 + 2/3)
    # n = 2: P0 and P1 producers [0, 1]; P0 claims the first consumer at 1, no spin (ends 1.5); P1 row block 1's
    # first producer [1, 2], P0 its second [1.5, 2.5]; P1 claims the second consumer at 2 and spins 0.5: 3.0
    prog, spin = MP.wait_walk(tl_.tasks, work, 2, "dynamic")
    assert prog.tolist() == [0, 1, 0, 1, 0, 1] and spin.tolist() == [0.0, 0.0, 0.0, 0.0, 0.0, 0.5]
    assert _predict(tl_, 2, "dynamic", "time")["total_ns"] == pytest.approx(3.0)
    # static, n = 2: task i on program i % 2; the same times here (P0: 0, 2, 4; P1: 1, 3, 5)
    prog, spin = MP.wait_walk(tl_.tasks, work, 2, "static")
    assert prog.tolist() == [0, 1, 0, 1, 0, 1] and spin.tolist() == [0.0, 0.0, 0.0, 0.0, 0.0, 0.5]
    # one program: nothing ever spins
    assert MP.wait_walk(tl_.tasks, work, 1, "dynamic")[1].tolist() == [0.0] * 6


def test_wait_walk_random_against_direct_simulation():
    """A fresh random list with random tile times: the walk's makespan, spins and programs against a direct
    simulation (program by program, ties to the lowest), under both assignments; claim_walk is the same walk."""
    rng = np.random.default_rng()
    n = int(rng.integers(2, 7))
    rows = []
    for pool in range(int(rng.integers(3, 9))):
        rows += [[L1, 0, pool, c, pool] for c in range(int(rng.integers(1, 5)))]
        rows += [[L2, 0, pool, c, pool] for c in range(int(rng.integers(1, 4)))]
    tasks = np.array(rows)
    work = rng.uniform(0.1, 2.0, len(rows))
    for assignment in ("dynamic", "static"):
        free, ends, spins, progs = [0.0] * n, {}, [], []
        for i, (kind, _, _, _, pool) in enumerate(rows):
            p = min(range(n), key=lambda q: (free[q], q)) if assignment == "dynamic" else i % n
            t = free[p]
            s = max(0.0, ends.get(pool, 0.0) - t) if kind == L2 else 0.0
            free[p] = t + s + work[i]
            if kind == L1:
                ends[pool] = max(ends.get(pool, 0.0), free[p])
            spins.append(s)
            progs.append(p)
        prog, spin = MP.wait_walk(tasks, work, n, assignment)
        assert prog.tolist() == progs and spin == pytest.approx(spins)
        assert np.bincount(prog, weights=work + spin, minlength=n).max() == pytest.approx(max(free))
    t1, t2 = float(rng.uniform(0.5, 2)), float(rng.uniform(0.1, 1))
    span, share = MP.claim_walk(tasks, t1, t2, n)
    w = np.where(tasks[:, 0] == L2, t2, t1)
    prog, spin = MP.wait_walk(tasks, w, n, "dynamic")
    assert span == pytest.approx(np.bincount(prog, weights=w + spin, minlength=n).max())
    assert share == pytest.approx(np.mean(spin[tasks[:, 0] == L2] > 0))


def test_wait_model_choice_and_errors():
    """The wait model: a CostModel's own, else WAIT_DEFAULT of its assignment; unknown names are clear errors
    before any walk; the rate calibration scales every term (the time model's spins too)."""
    tl_ = _hand_list()
    for a in MP.ASSIGNMENTS:
        assert MP.wait_model_of(MP.CostModel(BurstGapParams.reference(), 1.0, 2, assignment=a)) == MP.WAIT_DEFAULT[a]
    with pytest.raises(ValueError, match="wait model"):
        _predict(tl_, 2, "dynamic", "rounds")
    with pytest.raises(ValueError, match="assignment"):
        _predict(tl_, 2, "greedy", "time")
    with pytest.raises(ValueError, match="assignment"):
        MP.wait_walk(tl_.tasks, np.ones(6), 2, "greedy")
    rate = MP.calibrate_rate(tl_, 32, 32, HAND_TILES, 3, 2.5e-6, "dynamic", "time")   # 2.5 ns = the walk at F
    assert rate == pytest.approx(HAND_F)


# The pairs of round 5's study lists where model_guided chose lag = n_sms / 2 and cost (bf16, measured time over
# Expert-Wave's in the same rounds, data/h200x1/megamoe_round5/): the time model must not choose lag 66 there.
HALF_LAG_PAIRS = ("qwen3_235b_T4096_hot", "qwen3_235b_T4096_uniform", "qwen3_235b_T2048_hot",
                  "qwen3_235b_T2048_uniform")


@pytest.mark.parametrize("config", HALF_LAG_PAIRS)
def test_time_wait_model_does_not_choose_half_round_lag(config):
    """model_guided rebuilt for rank 0 from the recorded lists row (its tiles, the Expert-Wave row's measured
    compute-only time for the rate, the host link's stage model it chose with): with the positional wait term it
    reproduces the recorded choice (lag = 66); with the event walk it chooses another list, whose predicted time
    the walk puts below lag 66's."""
    from xstage import studies

    df, _ = data.load("data/h200x1/megamoe_round5", data.MEGAMOE_GEMM)
    g = df[(df.study == "lists") & (df.dtype == "bf16") &
           ((df["shape"] + "_T" + df.tokens.astype(str) + "_" + df.routing) == config)]
    rec = g[g.variant == "model_guided"].note.iloc[0]
    assert rec.startswith("lag=66,"), rec
    c = MP.cases_by_name([config])[0]
    s = c.shape
    tiles = MP.tiles_of_row(g.iloc[0])
    layout = MP.routing_of(c, 2)[2][0]
    grid = MP.TileGrid.of(layout, s.hidden, s.intermediate, tiles, MP.TILE_SWIZZLE)
    ew = MP.build_schedule("expert_wave", grid, 132)
    ms = float(g[g.variant == "expert_wave"].ms.iloc[0])
    prm = studies.recorded_params("h200x1")
    remote = grid.remote_rows_per_block(layout)
    got = {}
    for wait in ("positions", "time"):
        rate = MP.calibrate_rate(ew, s.hidden, s.intermediate, tiles, 132, ms, "dynamic", wait)
        cost = MP.CostModel(prm, rate, 132, 2, "dynamic", wait, stall="issuers")     # the record's stall model
        got[wait] = MP.build_schedule("model_guided", grid, 132, model=(cost, remote, s.hidden, s.intermediate,
                                                                        tiles), order=3)   # the record's order
    assert got["positions"].param == rec
    assert not got["time"].param.startswith("lag=66,"), got["time"].param


# ------------------------------------------------------------------------------ the combine's store pattern
@pytest.mark.parametrize("pattern", SS.PATTERNS)
def test_row_segments_bit_exact(pattern):
    """Every pattern writes the payload over the whole destination, bit for bit, from a poisoned buffer (fresh
    seed; 3 programs walk the tiles round-robin); the tiles cover each (row block, column block) once."""
    seed = int(torch.randint(0, 2**31 - 1, (1,)))
    rows, tiles, pitch = SS.plan(48, 256, 64, 16, pattern, seed)
    n = rows.numel() * pitch
    assert len({tuple(t) for t in tiles.tolist()}) == tiles.shape[0] == 3 * pitch // 16
    if pattern.startswith("scattered"):
        assert sorted(rows.tolist()) == list(range(48)) and rows.tolist() != list(range(48))
    else:
        assert rows.tolist() == list(range(48))
    dst = torch.full((n + 64,), SS.POISON, dtype=torch.int32)
    SS.launch_row_segments(dst, rows, tiles, pitch, 16, 64, pattern != "scattered4", programs=3, seed=seed)
    SS.check_destination(dst, n, seed, pattern)
    assert (dst[n:] == SS.POISON).all()                                   # nothing beyond the destination


def test_row_segments_check_can_fail_and_bad_input():
    """A tile left out leaves its segments poisoned: the check names them. Bad shapes raise before a launch."""
    seed = 3
    rows, tiles, pitch = SS.plan(32, 128, 32, 16, "scattered", seed)
    dst = torch.full((rows.numel() * pitch,), SS.POISON, dtype=torch.int32)
    SS.launch_row_segments(dst, rows, tiles[1:], pitch, 16, 32, programs=2, seed=seed)
    with pytest.raises(AssertionError, match="still poisoned"):
        SS.check_destination(dst, dst.numel(), seed, "one tile left out")
    with pytest.raises(ValueError, match="pattern"):
        SS.plan(32, 128, 32, 16, "strided")
    with pytest.raises(ValueError, match="multiple of seg_bytes"):
        SS.plan(32, 100, 32, 16, "segments")
    with pytest.raises(ValueError, match="block_m"):
        SS.plan(40, 128, 32, 16, "segments")
    with pytest.raises(ValueError, match="int32"):
        SS.launch_row_segments(dst[:10], rows, tiles, pitch, 16, 32)


def test_row_segment_cases_fixed():
    """The measured grid: the stream per footprint, and every pattern at the combine's segment and row block
    sizes; the summary divides by the stream of the same footprint."""
    cs = SS.cases()
    assert sum(c["pattern"] == "stream" for c in cs) == len(SS.FOOTPRINT_BYTES)
    assert {c["seg_bytes"] for c in cs if c["pattern"] != "stream"} == set(SS.SEGMENT_BYTES)
    df = pd.DataFrame([dict(method="sm_store", target="host", rows=128, store_bytes=16, bytes=100, gbps=50.0),
                       dict(method="row_scattered_p8192", target="host", rows=128, store_bytes=512, bytes=96,
                            gbps=30.0)])
    assert SS.summary(df).over_stream.tolist() == pytest.approx([1.0, 0.6])


# ------------------------------------------------------------------------------------- study lists6, end to end
def test_lists6_end_to_end(tmp_path, monkeypatch, cpu_timing):
    """Study lists6 through the launchers on the emulated world (Triton's interpreter, tiny tiles): every list
    bit-identical to Expert-Wave static, timestamped and timed; one row per list with its param; resumable; the
    summary's ratios against the rows."""
    from xstage import env
    from xstage import moe_round6 as R6
    from xstage.ranks import EmulatedWorld

    tiles = MP.TileConfig(16, 32, 32, 32, num_warps=4, num_stages=1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: types.SimpleNamespace(multi_processor_count=2))
    monkeypatch.setattr(R6, "default_tiles", lambda *a, **k: tiles)
    case = MP.MoECase(MP.MoEShape("tiny", 64, 32, 4, 2), 12, "hot", 2)
    world = EmulatedWorld(2)
    meta = env.provenance("test", {"world": "one-gpu", "link": "emulated"})
    prm = BurstGapParams.reference().as_dict()
    R6.job(world, [case], ["fp16"], str(tmp_path), meta, prm, None, rounds=5)
    df, side = data.load(tmp_path, data.MEGAMOE_GEMM)
    assert side["csv_rows"] == len(df) == len(R6.LISTS6) and set(df.variant) == set(R6.LISTS6)
    assert (df.study == R6.STUDY).all() and (df.assignment == "dynamic").all() and df.task_span_us.notna().all()
    mg = df[df.schedule == "model_guided"]
    assert len(mg) == 2 and all(MP.parse_schedule_param(p)["swizzle"] == MP.TILE_SWIZZLE for p in mg.note)
    R6.job(world, [case], ["fp16"], str(tmp_path), meta, prm, None, rounds=5)      # resume: nothing new
    assert len(data.load(tmp_path, data.MEGAMOE_GEMM)[0]) == len(df)
    per = R6.lists_table(df)
    ew = df[df.variant == "expert_wave"].ms.iloc[0]
    t = per[per.variant == "model_guided_time"].iloc[0]
    assert t.over_ew == pytest.approx(df[df.variant == "model_guided_time"].ms.iloc[0] / ew)
    assert t.same_list == (mg.note.iloc[0] == mg.note.iloc[1])
    sm = R6.lists_summary(per)
    assert sm.configs.tolist() == [1] and sm.changed.tolist() == [int(not t.same_list)]


def test_row_segment_measurement_on_the_interpreter(monkeypatch, cpu_timing):
    """The measurement end to end on small sizes (the CPU, Triton's interpreter): every case checked bit for bit
    and timed; rows in schema bandwidth; a bad target is a clear error before any launch."""
    monkeypatch.setattr(SS, "FOOTPRINT_BYTES", (64 << 10,))
    monkeypatch.setattr(SS, "PITCH_BYTES", (2048,))
    monkeypatch.setattr(SS, "BLOCK_M", (16,))
    monkeypatch.setattr(SS, "SEGMENT_BYTES", (256,))
    df = SS.measure("local", programs=4, reps=2, device="cpu")
    assert set(df.method) == {"sm_store", "row_contiguous_p256", "row_segments_p2048", "row_scattered_p2048",
                              "row_scattered4_p2048"}
    assert (df.gbps > 0).all() and list(df.columns) == list(data.BANDWIDTH.columns)
    assert set(df[df.method == "row_scattered_p2048"]["bytes"]) == {64 << 10}
    with pytest.raises(ValueError, match="target"):
        SS.measure("remote", device="cpu")


def test_lists6_cases_fixed():
    """Study lists6's configurations: names of the table, in table order, per dtype."""
    from xstage import moe_round6 as R6

    order = [c.name for c in MP.CASES]
    for d, names in R6.LISTS6_CASES.items():
        pos = [order.index(n) for n in names]
        assert pos == sorted(pos) and len(set(names)) == len(names), d


def test_host_rescore_on_a_recorded_configuration():
    """The host-link record re-scored (one small configuration of data/h200x1/megamoe_host_v2, both dtypes): the
    recorded drain given explicitly is the record's own parameters; a much slower drain moves the predictions;
    bad drains are clear errors."""
    from xstage import moe_round6 as R6

    df, meta = data.load("data/h200x1/megamoe_host_v2", data.MEGAMOE)
    one = df[(df["shape"] == "deepseek_v4_flash") & (df.tokens == 128) & (df.routing == "uniform")]
    per0, s0 = R6.host_rescore(one, meta)
    per1, _ = R6.host_rescore(one, meta, meta["params"]["prm"]["drain_gbps"])
    assert per0.predicted_speedup.tolist() == pytest.approx(per1.predicted_speedup.tolist())
    per2, _ = R6.host_rescore(one, meta, 5.0)
    assert not np.allclose(per2.predicted_speedup, per0.predicted_speedup)
    assert set(s0.configs) == {1} and len(s0) == 2 * 3
    assert ((per0.model_error - (per0.predicted_speedup - per0.speedup) / per0.speedup).abs() < 1e-12).all()
    for bad in (0.0, float("nan")):
        with pytest.raises(ValueError, match="drain_gbps"):
            R6.host_rescore(one, meta, bad)


def test_over_84_takes_lists6_rows_where_measured():
    """model_guided over the 84 from the A/B and lists6: lists6's rows replace the A/B's where measured."""
    from xstage import moe_round6 as R6

    ctl = pd.DataFrame(dict(config=["a", "b", "c"], dtype="bf16", schedule="model_guided", assignment="dynamic",
                            variant="default", over_ew=[1.0, 1.08, 0.98]))
    l6 = pd.DataFrame(dict(config=["b", "b"], dtype="bf16", variant=["model_guided", "model_guided_time"],
                           over_ew=[1.09, 1.0]))
    t = R6.over_84(ctl, l6).set_index("source")
    assert t.loc["recorded", "worst"] == 1.08 and t.loc["positions", "worst"] == 1.09
    assert t.loc["time", "worst"] == 1.0 and t.loc["time", "worst_config"] in ("a", "b")
    assert t.loc["time", "from_lists6"] == 1
    assert t.loc["time", "geomean"] == pytest.approx((1.0 * 1.0 * 0.98) ** (1 / 3))


def test_summary_beside_and_background_names():
    """The beside summary divides by the same stores alone; an unknown background is a clear error."""
    df = pd.DataFrame(dict(method=["sm_store+alone", "sm_store+copy", "row_scattered_p8192+alone",
                                   "row_scattered_p8192+copy"], target="host", gbps=[50.0, 40.0, 48.0, 36.0]))
    s = SS.summary_beside(df)
    assert s.over_alone.tolist() == pytest.approx([1.0, 0.8, 1.0, 0.75])
    with pytest.raises(ValueError, match="beside"):
        SS._background("fft", "cpu")
    assert SS._background("alone", "cpu")() is None
