"""MegaMoE round 4 (issue 15) on the CPU: order version 3, where a chunk of one row block is a chunk and not
order version 1 (version 2 wrote no param for it, so DeepSeek-V4-Pro fp8's mixing lists ran version 1), and the
records of earlier versions read as what they ran."""
import re
import random

import numpy as np
import pandas as pd
import pytest
import torch

from xstage import data
from xstage import moe as M
from xstage import moe_plan as MP
from xstage.ranks import EmulatedWorld

TILES = MP.TileConfig(16, 32, 32, 32, num_warps=4, num_stages=1)


def _l2_runs(tasks: np.ndarray) -> list[int]:
    """Lengths of the runs of consecutive Linear-2 tasks."""
    runs, cur = [], 0
    for k in tasks[:, 0].tolist() + [-1]:
        if k == MP.KIND_L2:
            cur += 1
        elif cur:
            runs.append(cur)
            cur = 0
    return runs


def test_a_chunk_of_one_row_block_is_not_order_version_1():
    """DeepSeek-V4-Pro fp8 on 132 programs: N2 = 56 Linear-2 column blocks, so the rule's chunk is one row block.
    Its default interleaved list names chunk=1 and keeps each row block's Linear-2 tiles together (runs of 56
    between the next wave's Linear-1 chunks), where order version 1 spreads them one by one; both rebuild from
    their param."""
    n = 132
    s = MP.SHAPES[1]
    assert s.name == "deepseek_v4_pro"
    c = random.choice([c for c in MP.CASES if c.shape == s and c.tokens >= 1024])
    lay = MP.routing_of(c, 2)[2][0]
    tiles = MP.gpu_tiles("fp8", 64)
    grid = MP.TileGrid.of(lay, s.hidden, s.intermediate, tiles)
    assert grid.n2 == 56 and MP.order_group(grid, n) == 1
    v3 = MP.build_schedule("interleaved", grid, n)
    v1 = MP.build_schedule("interleaved", grid, n, order=1)
    assert v3.param == "chunk=1" and v1.param == ""
    assert not np.array_equal(v3.tasks, v1.tasks), c.name
    assert max(_l2_runs(v1.tasks)[:-1]) < grid.n2 // 2          # single tiles (a wave's last L2 phase aside)
    assert set(_l2_runs(v3.tasks)[:-1]) == {grid.n2}             # every mixed run: one whole row block
    for tl_ in (v1, v3):
        assert np.array_equal(MP.schedule_of_param("interleaved", tl_.param, grid, n).tasks, tl_.tasks)
    lag = MP.build_schedule("lag", grid, n)
    assert lag.param == f"lag={n},group=1"
    assert np.array_equal(lag.tasks, MP.build_schedule("lag", grid, n, order=1).tasks)   # lag: the same list
    mg = MP.build_schedule("model_guided", grid, n, model=(MP.CostModel.from_tflops(
        MP.BurstGapParams.reference(), 500.0, n), grid.remote_rows_per_block(lay), s.hidden, s.intermediate, tiles))
    assert mg.param in ("expert_wave", "interleaved,chunk=1") or mg.param.endswith(",group=1"), mg.param


def _random_grid(rng, swizzle=0):
    rows = tuple(rng.choice([0, rng.randrange(1, 300)]) for _ in range(rng.randrange(2, 9)))
    return MP.TileGrid(rows if any(rows) else (5,) + rows[1:], rng.choice([16, 32, 64]), rng.randrange(1, 9),
                       rng.randrange(1, 7), swizzle)


def test_swizzled_tile_order_is_recorded_and_rebuilds():
    """Tile order inside an expert (TileGrid.swizzle = G): the same tiles, in groups of G row blocks with the column
    blocks outer (the row blocks that read one weight column block back to back); every schedule's param names
    it and rebuilds from it; a param without it (every record before round 4) rebuilds row-block-major."""
    rng = random.Random()
    seed = rng.randrange(2**30)
    rng.seed(seed)
    for _ in range(20):
        G = rng.randrange(1, 7)
        g0 = _random_grid(rng)
        g = MP.TileGrid(g0.expert_rows, g0.block_m, g0.n1, g0.n2, G)
        for kind, n in ((MP.KIND_L1, g.n1), (MP.KIND_L2, g.n2)):
            for e, R in enumerate(g.row_blocks):
                a, b = g0.tiles(kind, e), g.tiles(kind, e)
                assert sorted(a) == sorted(b) and len(b) == R * n, seed
                want = [(rb, cb) for s0 in range(0, R, G) for cb in range(n) for rb in range(s0, min(R, s0 + G))]
                assert [(t[2], t[3]) for t in b] == want, seed
                assert [(t[2], t[3]) for t in a] == [(rb, cb) for rb in range(R) for cb in range(n)]
        nn = rng.choice([2, 8, 132])
        for name in ("expert_wave", "interleaved", "lag"):
            for order in (1, None):
                tl_ = MP.build_schedule(name, g, nn, order=order)
                MP.check_tasks(tl_.tasks, g)
                assert MP.parse_schedule_param(tl_.param)["swizzle"] == G, (seed, tl_.param)
                assert np.array_equal(MP.schedule_of_param(name, tl_.param, g0, nn).tasks, tl_.tasks), seed
                old = MP.build_schedule(name, g0, nn, order=order)
                assert "swizzle" not in old.param
                assert np.array_equal(MP.schedule_of_param(name, old.param, g, nn).tasks, old.tasks), seed
    with pytest.raises(ValueError, match=r"swizzle must be >= 0"):
        MP.TileGrid.of(MP.routing_of(MP.CASES[0], 2)[2][0], 4096, 2048, MP.gpu_tiles("bf16", 128), swizzle=-1)
    with pytest.raises(ValueError, match=r"swizzle must be >= 1 row block"):
        MP.parse_schedule_param("chunk=2,swizzle=0")


def test_round3_record_reads_as_what_it_ran():
    """data/h200x1/megamoe_round3 (order version 2, row-block-major tiles): Pro fp8's mixing rows name no chunk
    (version 1 ran), the others name theirs (> 1); no row names a swizzle; each param parses to what ran."""
    df, meta = data.load("data/h200x1/megamoe_round3", data.MEGAMOE_GEMM)
    assert all(r["params"].get("order_version") == 2 for r in [meta, *meta.get("runs", [])] if "params" in r)
    c = df[(df.study == "controls") & (df.variant == "default") & df.schedule.isin(["interleaved", "lag"])]
    for (shape, dtype), g in c.groupby(["shape", "dtype"]):
        orders = {MP.parse_schedule_param(p)["order"] for p in g.note}
        assert {MP.parse_schedule_param(p)["swizzle"] for p in g.note} == {0}
        if (shape, dtype) == ("deepseek_v4_pro", "fp8"):
            assert orders == {1}, orders
        else:
            assert orders == {3} and all(MP.parse_schedule_param(p)["group"] > 1 for p in g.note)


@pytest.mark.parametrize("call, match", [
    (lambda g: MP.build_schedule("interleaved", g, 4, order=2), r"order must be one of 1, 3, 4, got 2"),
    (lambda g: MP.build_schedule("lag", g, 4, group=2, order=1), r"order version 1 has no chunks"),
    (lambda g: MP.build_schedule("interleaved", g, 4, group=0), r"group must be >= 1 row block"),
    (lambda g: MP.schedule_interleaved(g, 4, chunk=0), r"chunk must be >= 1 row block"),
    (lambda g: MP.parse_schedule_param("chunk=0"), r"chunk must be >= 1 row block"),
])
def test_bad_orders_are_one_clear_error(call, match):
    with pytest.raises(ValueError, match=match):
        call(MP.TileGrid((40, 0, 70), 16, 2, 3))


def test_chunk_of_one_runs_bit_identical_to_expert_wave_on_the_emulated_world():
    """Interleaved with a chunk of one row block, order version 1 and Expert-Wave through the kernel (Triton's
    interpreter, 2 emulated ranks, fresh routing): combine buffers poisoned first, every rank bit-identical."""
    seed = random.randrange(2**20)
    world = EmulatedWorld(2)
    prob = M.make_problem(world, MP.as_case((64, 64, 4, 2, 24, "zipf"), seed), "fp32", TILES, weight_seed=seed)
    s = prob.case.shape
    bufs = M.moe_buffers(world, max(prob.cap_rows, 1), prob.case.tokens, s.hidden, s.intermediate, s.topk,
                         s.experts // 2, "fp32", min_block_m=TILES.block_m)
    outs = {}
    for name, kw in (("expert_wave", {}), ("interleaved", dict(group=1)), ("interleaved", dict(order=1))):
        tasks = {r: M.build_tasks(prob, name, 2, r, **kw) for r in range(2)}
        M.poison_combine(world, bufs, prob.case.tokens)
        M.megamoe_layer(world, bufs, prob.inputs, tasks, TILES)
        p = MP.parse_schedule_param(tasks[0].param)
        assert p["swizzle"] == MP.TILE_SWIZZLE, tasks[0].param
        outs[(name, p["order"], p["group"])] = {r: bufs.combine_view(r, prob.case.tokens).clone() for r in range(2)}
    (k0, want), *rest = outs.items()
    assert ("interleaved", 3, 1) in outs and ("interleaved", 1, None) in outs
    for k, got in rest:
        for r in range(2):
            assert not torch.isnan(got[r]).any()
            assert torch.equal(got[r], want[r]), (seed, k, r)


def test_l2_traffic_model_against_direct_counts():
    """moe_plan.l2_traffic on a random grid: with a cache that holds everything every operand block is read once
    (x and weight blocks; the intermediate is written before it is read); with no cache every read misses; and on
    a DeepSeek-V4-Pro fp8 grid (rank 0, T8192 uniform) the swizzled mixing lists model fewer DRAM bytes than
    the row-block-major ones, which model more than Expert-Wave's (the round-4 evidence)."""
    rng = random.Random()
    g = _random_grid(rng)
    hidden, inter, act = 64 * rng.randrange(1, 5), 64 * rng.randrange(1, 5), rng.choice([1, 2])
    tiles = MP.TileConfig(g.block_m, 16, 16, 32)
    grid = MP.TileGrid(g.expert_rows, g.block_m, inter // 16, hidden // 16)
    tl_ = MP.build_schedule(rng.choice(["expert_wave", "interleaved", "lag"]), grid, rng.choice([2, 8]))
    t = tl_.tasks
    l1 = t[t[:, 0] == MP.KIND_L1]
    l2 = t[t[:, 0] == MP.KIND_L2]
    xs, w1 = {(e, rb) for _, e, rb, _, _ in l1.tolist()}, {(e, cb) for _, e, _, cb, _ in l1.tolist()}
    w2 = {(e, cb) for _, e, _, cb, _ in l2.tolist()}
    bx, bw1, bh, bw2 = (g.block_m * hidden * act, hidden * 32 * act, g.block_m * inter * act, inter * 16 * act)
    big = MP.l2_traffic(tl_, hidden, inter, tiles, act, cache_bytes=1e18)
    assert big["bytes"] == len(xs) * bx + len(w1) * bw1 + len(w2) * bw2
    assert big["weights"] == len(w1) * bw1 + len(w2) * bw2
    none = MP.l2_traffic(tl_, hidden, inter, tiles, act, cache_bytes=0)
    assert none["bytes"] == len(l1) * (bx + bw1) + len(l2) * (bh + bw2)
    c = next(c for c in MP.CASES if c.name == "deepseek_v4_pro_T8192_uniform")
    s = c.shape
    ft = MP.gpu_tiles("fp8", 64)
    lay = MP.routing_of(c, 2)[2][0]
    rb = MP.TileGrid.of(lay, s.hidden, s.intermediate, ft)
    sw = MP.TileGrid.of(lay, s.hidden, s.intermediate, ft, MP.TILE_SWIZZLE)
    cost = {(k, sch): MP.l2_traffic(MP.build_schedule(sch, gr, 132), s.hidden, s.intermediate, ft, 1)["bytes"]
            for k, gr in (("rb", rb), ("sw", sw)) for sch in ("expert_wave", "interleaved")}
    assert cost[("rb", "interleaved")] > 2 * cost[("rb", "expert_wave")]
    assert cost[("sw", "interleaved")] < 1.1 * cost[("rb", "expert_wave")]


# ------------------------------------------------------------------ the host-link record with round 4's defaults
def test_recorded_host_v2_names_its_defaults_and_rebuilds():
    """data/h200x1/megamoe_host_v2: the sidecar names order version 3 and the tile swizzle, every row's param
    names the swizzle and parses, a fresh sample of rows rebuilds rank 0's task list with the recorded task count,
    the label names world, link, record and defaults; the links table's numbers are the rows' own."""
    from xstage import studies
    from xstage.numeric import geomean

    df, meta = studies.megamoe_world_data("one-gpu", "host", record="megamoe_host_v2")
    p = meta["params"]
    assert (p["assignment"], p["tiles_version"], p["order_version"], p["tile_swizzle"]) == ("dynamic", 2, 3, 8)
    assert "combine over PCIe" in meta["label"] and "dynamic assignment, tiles v2, order v3, tile swizzle 8" in \
        meta["label"]
    n = df.groupby("dtype")[["shape", "tokens", "routing"]].apply(lambda g: len(g.drop_duplicates()))
    assert n["bf16"] == 84 and n["fp8"] >= 83
    parsed = [MP.parse_schedule_param(x) for x in df.schedule_param.astype(str)]
    assert all(q["swizzle"] == 8 for q in parsed)
    cases = {c.name: c for c in MP.CASES}
    rng = random.Random()
    for i in rng.sample(range(len(df)), 4):
        row = df.iloc[i]
        c = cases[f"{row['shape']}_T{row.tokens}_{row.routing}"]
        grid = MP.TileGrid.of(MP.routing_of(c, 2)[2][0], c.shape.hidden, c.shape.intermediate, MP.tiles_of_row(row))
        par = str(row.schedule_param).split("|")[0]
        tl_ = MP.schedule_of_param(row.schedule, par, grid, 132)
        assert tl_.n_tasks == row.n_tasks and grid.swizzle == 0      # (the row's param carries the swizzle)
    assert studies.MEGAMOE_HOST_RECORDS[-2:] == ("megamoe_host_v2", "megamoe_host")     # newest first, the oldest last
    with pytest.raises(ValueError, match="record must be one of " + re.escape(", ".join(studies.MEGAMOE_HOST_RECORDS))):
        studies.megamoe_world_data("one-gpu", "host", record="megamoe_round3")
    t = studies.megamoe_links_table({meta["label"]: (df, meta)}).set_index(["dtype", "schedule"])
    d = rng.choice(["bf16", "fp8"])
    s = rng.choice(["interleaved", "lag", "model_guided"])
    h = df[df.dtype == d].assign(k=lambda x: x["shape"] + x.tokens.astype(str) + x.routing)
    ew, x = h[h.schedule == "expert_wave"].set_index("k"), h[h.schedule == s].set_index("k")
    sp = ew.kernel_ms / x.kernel_ms
    assert t.loc[(d, s), "geomean_speedup"] == pytest.approx(geomean(sp.dropna()))
    assert t.loc[(d, s), "max_speedup"] == pytest.approx(sp.max())
    assert t.loc[(d, s), "within_tolerance"] == pytest.approx(
        float((abs(x.predicted_speedup / sp - 1) <= 0.1).mean()))


def test_timing_noise_against_a_direct_computation():
    from xstage import studies

    rng = np.random.default_rng()
    rows = []
    for i in range(6):
        ew = rng.uniform(1, 2)
        rows.append(dict(shape="s", tokens=i, routing="uniform", P=2, dtype="bf16", schedule="expert_wave",
                         schedule_param="swizzle=8", kernel_ms=ew, compute_sched_ms=ew * rng.uniform(0.9, 1.1),
                         compute_ms=ew * rng.uniform(0.9, 1.1)))
        choice = "expert_wave,swizzle=8" if i % 2 else "lag=132,group=2,swizzle=8"
        rows.append(dict(rows[-1], schedule="model_guided", schedule_param=choice,
                         kernel_ms=ew * rng.uniform(0.8, 1.2), compute_sched_ms=ew * rng.uniform(0.8, 1.2)))
    df = pd.DataFrame(rows)
    got = studies.megamoe_timing_noise(df).iloc[0]
    e = df[df.schedule == "expert_wave"].set_index("tokens")
    m = df[(df.schedule == "model_guided") & df.schedule_param.str.startswith("expert_wave")].set_index("tokens")
    assert got.same_list == 3
    assert got.kernel_max == pytest.approx((m.kernel_ms / e.kernel_ms.reindex(m.index)).max())
    assert got.control_min == pytest.approx((m.compute_sched_ms / e.compute_sched_ms.reindex(m.index)).min())
    assert got.ew_control_max == pytest.approx((e.compute_sched_ms / e.compute_ms).max())
