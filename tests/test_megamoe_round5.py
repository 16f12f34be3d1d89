"""MegaMoE round 5 (issue 15, items 2 and 3) on the CPU: the studies ``tiles`` (tile variants beside the default
and torch._grouped_mm on the configurations with >= 2048 rows on rank 0) and ``lists`` (lag's row blocks released
one or eight at a time beside the default chunks), end to end on the emulated one-process world (Triton's
interpreter), and their summaries against direct computations; the shared stage helpers of the device scripts."""
import dataclasses
import random
import subprocess
import types

import numpy as np
import pandas as pd
import pytest
import torch

from xstage import data, env, studies
from xstage import moe_gemm as MG
from xstage import moe_plan as MP
from xstage.model import BurstGapParams
from xstage.numeric import geomean
from xstage.ranks import EmulatedWorld

TILES = MP.TileConfig(16, 32, 32, 32, num_warps=4, num_stages=1)


@pytest.fixture
def tiny(monkeypatch, cpu_timing):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: types.SimpleNamespace(multi_processor_count=2))
    monkeypatch.setattr(MG, "default_tiles", lambda *a, **k: TILES)
    # interpreter-sized variants: a narrower Linear-1 tile, a shallower K step, another tile order
    monkeypatch.setattr(MG, "TILES5_VARIANTS", {"bk16": (dict(block_k=16), None), "swz1": ({}, 1)})
    shape = MP.MoEShape("tiny", 64, 32, 4, 2)
    return [MP.MoECase(shape, 12, "uniform", 1), MP.MoECase(shape, 10, "hot", 2)]


def test_round5_studies_end_to_end(tmp_path, tiny):
    """Both round-5 studies through the launchers on the emulated world (~25 s on a CPU: 4 tile variants and 8
    task lists run, timed and timestamped under the interpreter; the only check of these paths before a GPU
    call): every variant checked against the float32 reference and timed beside torch._grouped_mm; every list
    bit-identical to Expert-Wave static, timed, timestamped; rows with provenance, resume; the summaries' ratios
    against the rows."""
    world = EmulatedWorld(2)
    meta = env.provenance("test", {"world": "one-gpu", "link": "emulated"})
    prm = BurstGapParams.reference().as_dict()
    MG.round3_job(world, tiny[:1], ["fp16"], str(tmp_path), meta, "tiles", prm, None, rounds=5)
    df, side = data.load(tmp_path, data.MEGAMOE_GEMM)
    assert side["csv_rows"] == len(df) == 1 + 2 + 1 and set(df.study) == {"tiles"}
    ours = df[df.method == "ours"]
    assert set(ours.variant) == {"default", "bk16", "swz1"}
    assert (ours.rel_l2 > 0).all() and (ours.rel_l2 < 0.05).all() and (ours.assignment == "dynamic").all()
    assert set(ours[ours.variant == "bk16"].block_k) == {16} and set(ours[ours.variant == "swz1"].block_k) == {32}
    assert all(MP.parse_schedule_param(p)["swizzle"] == 1 for p in ours[ours.variant == "swz1"].note)
    assert all(MP.parse_schedule_param(p)["swizzle"] == MP.TILE_SWIZZLE for p in ours[ours.variant == "default"].note)
    MG.round3_job(world, tiny[:1], ["fp16"], str(tmp_path), meta, "tiles", prm, None, rounds=5)  # resume: nothing
    assert len(data.load(tmp_path, data.MEGAMOE_GEMM)[0]) == len(df)
    t = studies.megamoe_round5_tiles(df)
    one = t.iloc[random.randrange(len(t))]
    d0 = df[df.routing == one.config.rsplit("_", 1)[1]]
    lib = d0[d0.method == "torch._grouped_mm"].ms.iloc[0]
    for v in ("default", "bk16"):
        assert one[v] == pytest.approx(lib / d0[(d0.method == "ours") & (d0.variant == v)].ms.iloc[0])
    sm = studies.megamoe_round5_tiles_summary(t)
    row = sm[sm.variant == "bk16"].iloc[0]
    assert row.configs == 1 and row["min"] == t.bk16.min()
    assert row.geomean == pytest.approx(geomean(t.bk16.to_numpy()))
    assert sm.variant.str.startswith("best per shape").sum() == 1

    MG.round3_job(world, tiny[1:], ["fp16"], str(tmp_path), meta, "lists", prm, None, rounds=5)
    df = data.load(tmp_path, data.MEGAMOE_GEMM)[0]
    ls = df[df.study == "lists"]
    assert len(ls) == len(MG.LISTS5) and set(ls.variant) == set(MG.LISTS5) and (ls.assignment == "dynamic").all()
    assert ls.task_span_us.notna().all() and (ls.ms > 0).all()
    assert set(ls[ls.is_default].variant) == {"expert_wave", "interleaved", "lag", "model_guided"}
    g1 = ls[ls.variant == "lag_g1"].note.iloc[0]
    assert MP.parse_schedule_param(g1)["group"] == 1 and MP.parse_schedule_param(
        ls[ls.variant == "lag_g8"].note.iloc[0])["group"] == 8
    per = studies.megamoe_round5_lists(df)
    ew_ms = ls[ls.variant == "expert_wave"].ms.iloc[0]
    lag = per[per.variant == "lag"].iloc[0]
    assert lag.over_ew == pytest.approx(ls[ls.variant == "lag"].ms.iloc[0] / ew_ms)
    s = studies.megamoe_round5_lists_summary(per)
    assert np.isclose(s[s.variant == "expert_wave"].over_ew_geomean.iloc[0], 1.0) and len(s) == len(MG.LISTS5)


def test_tiles5_cases_are_the_goal_domain_in_table_order():
    """Study tiles' configurations: exactly those of the table with >= 2048 rows on rank 0 (a fresh sample checked
    against the routing directly), in table order; the device compile list holds every bf16 variant."""
    names = MG.tiles5_cases()
    pos = [[c.name for c in MP.CASES].index(n) for n in names]
    assert pos == sorted(pos) and 40 <= len(names) <= 70
    for c in random.sample(list(MP.CASES), 5):
        rows = MP.routing_of(c, 2)[2][0].rows
        assert (c.name in names) == (rows >= MG.TILES5_MIN_ROWS), (c.name, rows)
    assert set(MG.LISTS5_CASES) <= {c.name for c in MP.CASES}



def test_warm_list_holds_every_round5_tile_variant(monkeypatch):
    """The device call compiles every bf16 tile variant of study tiles (both row-block classes, dynamic) in the
    background before the study launches it."""
    monkeypatch.setattr(env, "interpreted", lambda: False)
    warm = {(t, dyn) for _, t, dyn, _ in MG.warm_variants(("bf16",))}
    for bm in (64, 128):
        for ch, _ in MG.TILES5_VARIANTS.values():
            if ch:
                assert (dataclasses.replace(MP.gpu_tiles("bf16", bm), **ch), True) in warm, (bm, ch)


def test_stage_helpers_are_one_sourced_file(tmp_path):
    """scripts/megamoe_stages.sh: stage echoes rc and the log's last STAGE_TAIL lines, a stage over its limit
    ends with 124; both round scripts source it (no copy of stage() left in them)."""
    script = tmp_path / "t.sh"
    script.write_text(f"set -u\nOUT={tmp_path}; LIMIT=50; mkdir -p $OUT/logs\nSTAGE_TAIL=2\n"
                      f". scripts/megamoe_stages.sh\nstage a 5 bash -c 'echo x; echo y; echo z; exit 3'\n"
                      f"stage b 1 sleep 5\necho left $(left) min $(minutes '30')\n")
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60).stdout
    assert "rc=3" in out and "| y\n   | z" in out and "| x" not in out and "rc=124" in out
    assert "min 0.5" in out
    for f in ("scripts/megamoe_round3.sh", "scripts/megamoe_round4.sh", "scripts/megamoe_round5.sh"):
        text = open(f).read()
        assert "megamoe_stages.sh" in text and "stage() {" not in text, f


def test_claim_walk_places_claims_in_time():
    """moe_plan.claim_walk (the event model of dynamic claims): hand cases, then a fresh random list against a
    direct simulation that advances time program by program."""
    L1, L2 = MP.KIND_L1, MP.KIND_L2
    two_l1_then_l2 = np.array([[L1, 0, 0, 0, 0], [L1, 0, 0, 1, 0], [L2, 0, 0, 0, 0]])
    assert MP.claim_walk(two_l1_then_l2, 1.0, 0.5, 2) == (1.5, 0.0)     # the L2 is claimed when a producer ends
    assert MP.claim_walk(two_l1_then_l2, 1.0, 0.5, 3) == (1.5, 1.0)     # a third program claims it at 0: spins
    rng = np.random.default_rng()
    n, t1, t2 = int(rng.integers(2, 6)), float(rng.uniform(0.5, 2)), float(rng.uniform(0.1, 1))
    rows = []
    for pool in range(int(rng.integers(3, 8))):
        rows += [[L1, 0, pool, c, pool] for c in range(int(rng.integers(1, 4)))]
        rows += [[L2, 0, pool, c, pool] for c in range(int(rng.integers(1, 4)))]
    tasks = np.array(rows)
    free, ends, span, waits = [0.0] * n, {}, 0.0, []
    for kind, _, _, _, pool in rows:
        p = min(range(n), key=lambda q: (free[q], q))
        t = free[p]
        if kind == L1:
            free[p] = t + t1
            ends[pool] = max(ends.get(pool, 0.0), free[p])
        else:
            waits.append(ends[pool] > t)
            free[p] = max(t, ends[pool]) + t2
        span = max(span, free[p])
    got = MP.claim_walk(tasks, t1, t2, n)
    assert got[0] == pytest.approx(span) and got[1] == pytest.approx(np.mean(waits))
