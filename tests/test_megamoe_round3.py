"""MegaMoE round 3 (issue 15, items 2, 3 and 5) on the CPU: the tiles a record ran with are data (schema megamoe
v3; older records read as tiles version 1, explicitly), the new default tiles, the schedules' order version 2
(chunks of row blocks), and the round-3 studies (``gemm``: all 84 configurations beside the library;
``controls``: every schedule x assignment, compute only, with per-task timings) end to end on the emulated
one-process world (Triton's interpreter)."""
import random
import time
import types

import numpy as np
import pytest
import torch

from xstage import data, env, studies
from xstage import moe_gemm as MG
from xstage import moe_plan as MP
from xstage.model import BurstGapParams
from xstage.ranks import EmulatedWorld

TILES = MP.TileConfig(16, 32, 32, 32, num_warps=4, num_stages=1)


# ------------------------------------------------------------------------------------------ tiles as data
def test_recorded_host_sweep_reads_as_tiles_version_1_and_its_grid_matches():
    """The one-H200 host record (schema megamoe v2) names only block_m: it reads as tiles version 1, and the task
    grid rebuilt from those tiles has exactly the recorded task count of every Expert-Wave row; the current
    default tiles (Linear-2 BN2 = 256 for bf16) would not."""
    df, meta = studies.megamoe_world_data("one-gpu", "host")
    assert meta["schema_version"] == 2
    for dt, (n1, n2, k, w, st) in data.MEGAMOE_FIRST_TILES.items():
        d = df[df.dtype == dt]
        assert len(d) and (d.block_n1 == n1).all() and (d.block_n2 == n2).all() and (d.block_k == k).all()
        assert (d.num_warps == w).all() and (d.num_stages == st).all()
    ew = df[df.schedule == "expert_wave"]
    cases = {c.name: c for c in MP.CASES}
    rng = random.Random()
    picked = rng.sample(range(len(ew)), 6)           # a fresh handful each run (the full check takes minutes)
    for i in picked:
        row = ew.iloc[i]
        c = cases[f"{row['shape']}_T{row.tokens}_{row.routing}"]
        lay = MP.routing_of(c, int(row.P))[2]
        s = c.shape
        t = MP.tiles_of_row(row)
        n = MP.TileGrid.of(lay[0], s.hidden, s.intermediate, t).all_tiles().shape[0]     # rank 0, the observed
        assert n == row.n_tasks, (c.name, row.dtype, n, row.n_tasks)
        if row.dtype == "bf16":
            t2 = MP.gpu_tiles("bf16", int(row.block_m))
            n2 = MP.TileGrid.of(lay[0], s.hidden, s.intermediate, t2).all_tiles().shape[0]
            assert n2 != row.n_tasks


def test_version_2_records_load_with_tiles_version_1_and_refuse_v3_rows(tmp_path):
    meta = {**env.provenance("test", {}), "schema": "megamoe", "schema_version": 2, "runs": []}
    cols = [c for c in data.MEGAMOE.columns if c not in data.MEGAMOE_TILE_COLUMNS and c != "tma"]
    dt = random.choice(["bf16", "fp8"])
    with open(tmp_path / "megamoe.csv", "w") as f:
        f.write(",".join(cols) + "\n")
        f.write(",".join(dt if c == "dtype" else "1" if data.MEGAMOE.columns[c] != "str" else "x" for c in cols)
                + "\n")
    data.write_json_atomic(tmp_path / "megamoe.json", meta)
    df, got = data.load(tmp_path, data.MEGAMOE)
    assert got["schema_version"] == 2 and list(df.columns)[:len(data.MEGAMOE.columns)] == list(data.MEGAMOE.columns)
    want = MP.TileConfig(1, *data.MEGAMOE_FIRST_TILES[dt])
    assert MP.tiles_of_row(df.iloc[0]) == want
    with pytest.raises(data.DataError, match="holds schema version 2; record version 4 elsewhere"):
        data.start_file(tmp_path, data.MEGAMOE, env.provenance("test", {}))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "megamoe.csv").write_text(",".join(cols) + "\n" + ",".join(
        "fp16" if c == "dtype" else "1" if data.MEGAMOE.columns[c] != "str" else "x" for c in cols) + "\n")
    data.write_json_atomic(bad / "megamoe.json", meta)
    with pytest.raises(data.DataError, match="no recorded tiles version 1"):
        data.load(bad, data.MEGAMOE)


def test_default_tiles_version_2_and_version_1(monkeypatch):
    monkeypatch.setattr(env, "interpreted", lambda: False)
    assert MP.default_tiles("bf16", 256.0) == MP.TileConfig(128, 128, 256, 64, 8, 4, tma=True)
    assert MP.default_tiles("bf16", 24.0) == MP.TileConfig(64, 128, 256, 64, 8, 4, tma=True)
    assert MP.default_tiles("fp8", 192.0, version=3) == MP.TileConfig(64, 128, 128, 128, 8, 3)
    assert MP.default_tiles("fp8", 1024.0, version=3) == MP.TileConfig(128, 128, 128, 128, 8, 2)
    assert MP.default_tiles("fp8", 192.0, version=4) == MP.TileConfig(64, 128, 128, 128, 8, 4, tma=True)
    assert MP.default_tiles("fp8", 192.0, version=5) == MP.TileConfig(128, 128, 128, 128, 8, 3, tma=True)
    assert MP.default_tiles("fp8", 1024.0, version=5) == MP.TileConfig(128, 128, 128, 128, 8, 3, tma=True)
    assert MP.default_tiles("fp8", 192.0) == MP.TileConfig(128, 128, 128, 128, 8, 4, tma=True)    # version 6
    assert MP.default_tiles("fp8", 24.0) == MP.TileConfig(64, 128, 128, 128, 8, 5, tma=True)
    assert MP.default_tiles("bf16", 256.0, version=2) == MP.TileConfig(128, 128, 256, 64, 8, 4)
    assert MP.default_tiles("bf16", 24.0, version=2) == MP.TileConfig(64, 128, 256, 64, 8, 4)
    assert MP.default_tiles("fp8", 1024.0, version=2) == MP.default_tiles("fp8", 1024.0, version=3)
    assert MP.default_tiles("bf16", 256.0, version=1) == MP.TileConfig(128, 128, 128, 64, 8, 3)
    assert MP.default_tiles("fp8", 1024.0, version=1) == MP.TileConfig(64, 128, 128, 128, 8, 2)
    for c in MP.CASES:                  # every configuration's default tiles pass the launchers' checks
        s = c.shape
        for dt in MP.DTYPES_GPU:
            t = MP.default_tiles(dt, c.tokens * 2 * s.topk / s.experts)
            MP.validate_problem(s.hidden, s.intermediate, s.experts, s.topk, c.tokens, 2, t, dt)
    for v in (0, 7):
        with pytest.raises(ValueError, match="tiles version must be one of 1, 2, 3, 4, 5, 6"):
            MP.gpu_tiles("bf16", 128, version=v)
    MP.TileConfig(64, 128, 128, 128, 8, 3, tma=True).validate("fp8")   # fp8 through TMA: accepted since round 8


# ------------------------------------------------------------------------------------------ order version 2
def _random_grid(rng):
    rows = tuple(rng.choice([0, rng.randrange(1, 300)]) for _ in range(rng.randrange(2, 9)))
    bm = rng.choice([16, 32, 64])
    return MP.TileGrid(rows if any(rows) else (5,) + rows[1:], bm, rng.randrange(1, 9), rng.randrange(1, 7))


def test_chunked_orders_are_valid_and_recorded_and_rebuild_from_their_param():
    """Order version 3 on random grids: every tile once, no consumer before its producers (check_tasks), the
    chunk recorded in schedule_param (also a chunk of one row block) and the list rebuilt bit for bit from it;
    order 1 is version 1 (no chunk in the param); the Linear-2 tiles of interleaved's mixed segments come in runs
    of a whole chunk."""
    rng = random.Random()
    seed = rng.randrange(2**30)
    rng.seed(seed)
    for _ in range(25):
        grid = _random_grid(rng)
        n = rng.choice([2, 4, 8, 132])
        g = MP.order_group(grid, n)
        assert g == max(1, round(n / (2 * grid.n2)))
        for name in ("interleaved", "lag"):
            for group in (None, 1, rng.randrange(2, 6)):
                tl_ = MP.build_schedule(name, grid, n, group=group)
                MP.check_tasks(tl_.tasks, grid)
                want = g if group is None else group
                p = MP.parse_schedule_param(tl_.param)
                # order version 4 (ORDER_VERSION) changes lag's lists on swizzled grids only (``align=1``); these
                # grids are row-block-major, so every list is version 3's, and its param says 3
                order = MP.ORDER_VERSION if name == "lag" and grid.swizzle else 3
                assert p["group"] == want and p["order"] == order, (seed, tl_.param)
                again = MP.schedule_of_param(name, tl_.param, grid, n)
                assert np.array_equal(again.tasks, tl_.tasks), seed
        v1 = MP.build_schedule("interleaved", grid, n, order=1)
        assert v1.param == "" and np.array_equal(
            v1.tasks, np.array(MP.schedule_interleaved(grid, n), dtype=np.int32).reshape(-1, MP.TASK_FIELDS))
        assert MP.build_schedule("lag", grid, n, order=1).param == f"lag={MP.lag_of_rule(grid, n)}"
    # runs: a grid of many row blocks per expert, waves of one expert each
    grid = MP.TileGrid((512,) * 4, 64, 16, 8)
    il = MP.build_schedule("interleaved", grid, 32, group=2).tasks
    kinds = il[:, 0].tolist()
    runs, cur = [], 0
    for a, b in zip(kinds, kinds[1:] + [-1]):
        cur += 1
        if a != b:
            if a == MP.KIND_L2:
                runs.append(cur)
            cur = 0
    assert runs[:-1] and all(r == 2 * grid.n2 for r in runs[:-1])


def test_model_guided_choice_names_its_order_and_rebuilds():
    rng = random.Random()
    grid = MP.TileGrid((rng.randrange(100, 400),) * 6, 32, 4, 4)
    n = 8
    prm = BurstGapParams.reference()
    cost = MP.CostModel.from_tflops(prm, rng.uniform(50, 500), n)
    remote = np.full(grid.n_pool, rng.randrange(1, 32))
    mg = MP.build_schedule("model_guided", grid, n, model=(cost, remote, 64, 64, TILES))
    again = MP.schedule_of_param("model_guided", mg.param, grid, n)
    assert np.array_equal(again.tasks, mg.tasks), mg.param
    with pytest.raises(ValueError, match="names no candidate"):
        MP.schedule_of_param("model_guided", "chunk=2", grid, n)
    with pytest.raises(ValueError, match="unknown field"):
        MP.parse_schedule_param("lag=3,speed=2")
    assert MP.parse_schedule_param("lag=66") == {"choice": "lag", "lag": 66, "group": None, "order": 1,
                                                 "swizzle": 0, "align": False}
    assert MP.parse_schedule_param("interleaved,chunk=4") == {"choice": "interleaved", "lag": None, "group": 4,
                                                              "order": 3, "swizzle": 0, "align": False}
    assert MP.parse_schedule_param("lag=66,group=2,align=1,swizzle=8") == {
        "choice": "lag", "lag": 66, "group": 2, "order": 4, "swizzle": 8, "align": True}


# ------------------------------------------------------------------------------------------ round-3 studies
@pytest.fixture
def tiny(monkeypatch, cpu_timing):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: types.SimpleNamespace(multi_processor_count=2))
    monkeypatch.setattr(MG, "default_tiles", lambda *a, **k: TILES)
    monkeypatch.setattr(MG, "VARIANTS", {"fp16": {"default": {}}})
    shape = MP.MoEShape("tiny", 64, 32, 4, 2)         # small: every launch runs under Triton's interpreter
    return [MP.MoECase(shape, 12, "uniform", 1), MP.MoECase(shape, 8, "zipf", 2)]


def test_round3_studies_end_to_end(tmp_path, tiny):
    """Both round-3 studies through the launchers on the emulated world (~35 s on a CPU, the only check of the
    controls path before a GPU call: 14 task lists checked, timed and timestamped under the interpreter): rows with
    provenance, resume, the deadline, the summaries' ratios."""
    world = EmulatedWorld(2)
    meta = env.provenance("test", {"world": "one-gpu", "link": "emulated"})
    prm = BurstGapParams.reference().as_dict()
    MG.round3_job(world, tiny, ["fp16"], str(tmp_path), meta, "gemm", prm, None, rounds=5)
    df, side = data.load(tmp_path, data.MEGAMOE_GEMM)
    assert side["csv_rows"] == len(df) == 2 * 3 and set(df.study) == {"gemm"}
    ours = df[df.method == "ours"]
    assert set(ours.variant) == {"default", "v1"} and (ours.rel_l2 > 0).all() and (ours.rel_l2 < 0.05).all()
    assert set(zip(ours.variant, ours.assignment)) == {("default", "dynamic"), ("v1", "static")}
    assert (df.ms > 0).all() and (df.n_timed == 5).all() and df.task_l1_us.isna().all()
    MG.round3_job(world, tiny, ["fp16"], str(tmp_path), meta, "gemm", prm, None, rounds=5)   # resume: nothing
    assert len(data.load(tmp_path, data.MEGAMOE_GEMM)[0]) == 6
    MG.round3_job(world, tiny, ["fp16"], str(tmp_path), meta, "controls", prm, time.time() - 1, rounds=5)
    assert len(data.load(tmp_path, data.MEGAMOE_GEMM)[0]) == 6                        # past its deadline
    MG.round3_job(world, tiny[:1], ["fp16"], str(tmp_path), meta, "controls", prm, None, rounds=5)
    df = data.load(tmp_path, data.MEGAMOE_GEMM)[0]
    ctl = df[df.study == "controls"]
    assert len(ctl) == len(MP.SCHEDULES) * len(MP.ASSIGNMENTS) + 2 + len(MP.SCHEDULES)
    assert set(ctl.variant) == {"default", "order_v1", "swizzle0"} and (ctl.ms > 0).all()
    sw = ctl[ctl.variant == "swizzle0"]        # round 4: every schedule with the old tile order, dynamic
    assert set(sw.schedule) == set(MP.SCHEDULES) and (sw.assignment == "dynamic").all()
    assert all(MP.parse_schedule_param(p)["swizzle"] == 0 for p in sw.note)
    assert all(MP.parse_schedule_param(p)["swizzle"] == MP.TILE_SWIZZLE
               for p in ctl[ctl.variant == "default"].note.replace("-", ""))
    dyn = ctl[ctl.assignment == "dynamic"]
    assert dyn.task_span_us.notna().all() and ctl[ctl.assignment == "static"].task_span_us.isna().all()
    v1 = ctl[ctl.variant == "order_v1"]
    assert set(v1.schedule) == {"interleaved", "lag"} and (v1.assignment == "dynamic").all()
    tab = studies.megamoe_round3_controls(df)
    assert set(tab.assignment) == {"static", "dynamic"}
    ew = tab[(tab.schedule == "expert_wave") & (tab.variant == "default")]
    assert np.allclose(ew.over_ew, 1.0)
    g = studies.megamoe_round3_gemm(df)
    assert len(g) == 2 and g.vs_grouped_mm.notna().all() and g.v1_vs_grouped_mm.notna().all()
    one = g.iloc[0]
    d0 = df[(df.study == "gemm") & (df.routing == one.config.rsplit("_", 1)[1])]
    lib = d0[d0.method == "torch._grouped_mm"].ms.iloc[0]
    mine = d0[(d0.method == "ours") & (d0.variant == "default")].ms.iloc[0]
    assert one.vs_grouped_mm == pytest.approx(lib / mine)


def test_round3_pairs_run_in_table_order_shape_by_shape():
    pairs = MG._pairs(list(MP.CASES), ["bf16", "fp8"])
    assert len(pairs) == 168
    assert [p[1] for p in pairs[:28]] == ["bf16"] * 21 + ["fp8"] * 7
    assert [p[0].name for p in pairs[:21]] == [c.name for c in MP.CASES[:21]]
    assert pairs[21][0] == MP.CASES[0]
