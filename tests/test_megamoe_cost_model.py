"""The MegaMoE cost model (xstage.moe_cost): its stall models ``issuers`` (the 2x H200 record's) and
``round_shared`` (the default: the stage drains only in time the kernel is charged, and the combine sees the
stage's shared part phi C_0), on small synthetic task lists, and the one-H200 host-link record re-predicted."""
import numpy as np
import pytest

from xstage import data
from xstage import moe_plan as MP
from xstage.model import BurstGapParams, issue_time
from xstage import megamoe_analysis, megamoe_model_analysis
from xstage import moe_cost as MC

TILES = MP.TileConfig(64, 32, 32, 32, 4, 1)
HIDDEN, INTER = 256, 128                          # N2 = 8, N1 = 4 column blocks
# a link far slower than the programs' compute: every list is link-bound
SLOW = BurstGapParams(issue_ns_per_kib=10.0, drain_gbps=2.0, capacity_kib=16.0)


def _case(experts: int, n: int, name: str, **kw):
    grid = MP.TileGrid((64,) * experts, 64, INTER // TILES.block_n1, HIDDEN // TILES.block_n2)
    tl = MP.build_schedule(name, grid, n, **kw)
    remote = np.full(grid.n_pool, 64, dtype=np.int64)       # every row of every row block goes to the peer
    return tl, remote


RATE = 1000.0                                     # FLOP/ns per program: compute ~0.1 of bytes / D


def _predict(tl, remote, n, stall, prm=SLOW, assignment="static"):
    cost = MP.CostModel(prm, RATE, n, 2, assignment, "positions", stall)
    return MP.predict_kernel_ns(tl, remote, cost, HIDDEN, INTER, TILES)


def _bytes(tl, remote):
    is2 = tl.tasks[:, 0] == MP.KIND_L2
    return float((remote[tl.tasks[is2, 4]] * TILES.block_n2 * 2).sum())


def test_default_is_round_shared_and_records_name_theirs():
    assert MC.STALL_DEFAULT == "round_shared" and MC.STALL_UNNAMED == "issuers"
    assert MC.stall_model_of(MC.CostModel(SLOW, 1.0, 8)) == "round_shared"
    assert MC.stall_model_of(MC.CostModel(SLOW, 1.0, 8, stall="issuers")) == "issuers"
    _, meta = data.load("data/h200x2/megamoe", data.MEGAMOE)     # the first kernels: no stall_default
    assert "stall_default" not in meta["params"]
    assert MC.record_stall(meta) == "issuers" and MC.record_stall({}) == "issuers"
    _, meta = data.load("data/h200x1/megamoe_pcie", data.MEGAMOE)
    assert MC.record_stall(meta) == "round_shared"
    with pytest.raises(ValueError):
        MP.record_stall({"params": {"stall_default": "fifo"}})
    with pytest.raises(ValueError):
        _predict(*_case(4, 8, "expert_wave"), 8, "fifo")


def test_issuers_is_the_formula_before_the_models_were_named():
    """``issuers``: b T / m and issue_time's stage after."""
    for B, b, m, q in ((4096.0, 3, 8, 0.0), (65536.0, 8, 8, 8000.0), (1e6, 1, 8, 16384.0)):
        T, q_end = issue_time(B / b, b, q, SLOW)
        assert MC._stall_issuers(B, b, m, q, SLOW) == (b * float(T) / m, float(q_end))










def test_round_shared_sees_only_the_shared_stage():
    from xstage.model import StageParams
    st = StageParams(issue_ns_per_kib=17.0, drain_gbps=51.0, capacity_kib=7000.0, capacity_per_program_kib=33.0,
                     spread=0.5, stalled_fraction=0.8, base_capacity_kib=800.0, arbitration="slots")
    assert MP.stall_stage(st, 66, "issuers") == st.fluid(66)
    assert MP.stall_stage(st, 66, "round_shared").capacity_kib == pytest.approx(800.0 * 0.8)
    assert MP.stall_stage(SLOW, 4, "round_shared") == SLOW        # fluid parameters: as they are (no overhead)
    with pytest.raises(ValueError):
        MP.stall_stage(StageParams(17.0, 51.0, 7000.0, 33.0, 0.5), 8, "round_shared")
    # Expert-Wave's list on a slow stage whose Linear-1 phases drain it: a smaller stage absorbs less of each burst
    slow = StageParams(issue_ns_per_kib=10.0, drain_gbps=2.0, capacity_kib=64.0, capacity_per_program_kib=16.0,
                       spread=0.5, stalled_fraction=0.8, base_capacity_kib=8.0, arbitration="slots")
    tl, remote = _case(16, 8, "expert_wave")
    t = {s: MP.predict_kernel_ns(tl, remote, MP.CostModel(slow, 100.0, 8, 2, "static", "positions", s), HIDDEN,
                                 INTER, TILES)["total_ns"] for s in ("issuers", "round_shared")}
    assert t["round_shared"] > 1.1 * t["issuers"]


@pytest.mark.slow
def test_the_host_record_repredicted_with_the_full_model():
    """The one-H200 host-link record re-predicted by the cost model with the parameters it recorded reproduces its
    recorded predictions, and with the host link's full model stays within 10 % on most speedups."""
    t = megamoe_model_analysis.host_full_model().set_index(["model", "dtype", "schedule"])
    df, _ = megamoe_analysis.world_data("one-gpu", "host")
    rec = megamoe_analysis.host_summary(df).set_index(["dtype", "schedule"])
    for (dt, sch), r in rec.iterrows():
        assert t.loc[("recorded", dt, sch), "within"] == r.within
    assert (t.xs("full").within_10pct >= 0.9).all()
