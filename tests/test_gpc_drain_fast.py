"""Arbitration "gpc_drain"'s fast path (xstage.model._stage_units: the groups of GPCs of equal population merged into
units, rows whose train has ended dropped, the transitions applied to the due elements only) against the general loop
of simulate_stage it replaces (stage_sim.GPC_DRAIN_FAST = False, kept as the reference): the same starts and ends to
rounding on random parameters and on the host link's recorded configurations."""
import numpy as np
import pytest

from xstage import data, model, stage_fit, stage_params, stage_sim
from xstage.stage_sim import stage_measure
from xstage.stage_params import StageParams
from xstage.stage_sim import simulate_stage

LAYOUT_P = [1, 2, 4, 8, 16, 24, 32, 48, 66, 80, 100, 120, 128, 132, 160, 198, 200, 264]   # every unit layout kind


def _both(monkeypatch, prm, P, b, g, sync, drains=True, fence=None):
    out = []
    for fast in (True, False):
        monkeypatch.setattr(stage_sim, "GPC_DRAIN_FAST", fast)
        out.append(simulate_stage(prm, P, b, g, sync, barrier_drains=drains, read_fence=fence))
    return out


def _assert_same(fast, ref, rtol=1e-9):
    (s1, e1, m1), (s2, e2, m2) = fast, ref
    assert s1.shape == s2.shape and np.array_equal(m1, m2)
    for x, y in ((s1, s2), (e1, e2)):
        assert np.array_equal(np.isnan(x), np.isnan(y))
        ok = np.isfinite(y)
        assert np.allclose(x[ok], y[ok], rtol=rtol, atol=0.0), np.max(np.abs(x[ok] / y[ok] - 1), initial=0.0)


@pytest.mark.parametrize("seed", range(4))
def test_the_fast_path_equals_the_general_loop_on_random_trains(monkeypatch, seed):
    rng = np.random.default_rng(seed)
    prm = StageParams(issue_ns_per_kib=rng.uniform(10, 30), drain_gbps=rng.uniform(30, 500),
                      capacity_kib=rng.uniform(500, 8000), capacity_per_program_kib=rng.uniform(5, 200),
                      spread=rng.uniform(0.0, 0.95), overhead_ns=float(rng.choice([0.0, rng.uniform(0, 300)])),
                      stalled_fraction=rng.uniform(0.1, 1.0), base_capacity_kib=rng.uniform(0, 2000), link="test",
                      arbitration="gpc_drain")
    N, n = 8, 8
    P = rng.choice(LAYOUT_P, N)
    b = (rng.integers(1, 160, (N, n)) * 2048).astype(float)
    b[:, 0] = np.maximum(4 * 2**20 * rng.uniform(0, 1, N), 1.0)        # first bursts up to beyond any stage
    g = rng.choice([0, 500, 3000, 30_000, 100_000], (N, n)).astype(float)
    sync = rng.uniform(size=N) < 0.5
    drains = rng.uniform(size=N) < 0.7                                   # release and relaxed barriers
    fence = rng.uniform(size=(N, n)) < 0.3 if seed % 2 else None        # read fences on odd seeds
    fast, ref = _both(monkeypatch, prm, P, b, g, sync, drains, fence)
    _assert_same(fast, ref)
    assert np.ptp(np.nan_to_num(fast[1][:, :, 0]), axis=1).max() > 0       # the programs did not all end alike
    if fence is not None:   # the fences delayed someone (else this case would test nothing of them)
        plain = simulate_stage(prm, P, b, g, sync, barrier_drains=drains)
        assert (np.nan_to_num(fast[1]) > np.nan_to_num(plain[1]) * (1 + 1e-6)).any()


def test_the_fast_path_equals_the_general_loop_on_the_host_records(monkeypatch):
    """Every 12th configuration of the host link's fit (sync, free-running and train records at P = 1-264), the written
    stage fit's parameters under gpc_drain, as stage_fit.predict_observations predicts them."""
    from dataclasses import replace

    folder = data.machine_dir("h200x1")
    obs = stage_fit.observations(folder, "host")
    obs = obs.take(np.arange(0, len(obs.cfgs), 12))
    f = stage_fit.read_stage_fit(folder, "host", "stage")
    prm = replace(StageParams(**f["params"]), arbitration="gpc_drain")
    pred = []
    for fast in (True, False):
        monkeypatch.setattr(stage_sim, "GPC_DRAIN_FAST", fast)
        pred.append(stage_fit.predict_observations(obs, prm, f["span_overhead_ns"]))
    assert set(obs.cfgs.programs) >= {1, 4, 16, 66, 132, 264} and set(obs.cfgs.kind) == {"sync", "free", "train"}
    assert np.array_equal(np.isnan(pred[0]), np.isnan(pred[1]))
    ok = np.isfinite(pred[1])
    assert np.allclose(pred[0][ok], pred[1][ok], rtol=1e-9, atol=0.0)


def test_units_merge_the_groups_of_gpcs_of_equal_population():
    """P = 66 (GPC populations 12, 8 x 5, 7 x 2): 12 + 8 + 7 = 27 units standing for 1 / 5 / 2 GPCs; P = 132 (16 x 6,
    18 x 2; 16 groups each) 32 units; every group maps to a unit of its own programs per group and spread level."""
    prm = StageParams(17.0, 51.0, 7000.0, 33.0, 0.6, 100.0, stalled_fraction=0.8, base_capacity_kib=800.0,
                      arbitration="gpc_drain")
    for P, units, mults in ((66, 27, {1: 12, 5: 8, 2: 7}), (132, 32, {6: 16, 2: 16}), (1, 1, {1: 1})):
        m, _, ws, gid = stage_params._gpc_groups(np.array([P]), prm.spread, stage_params.GPC_DRAIN_GROUPS, prm.sm_count)
        um, uws, mult, ucls, ncop, gmap = stage_sim._drain_units(m[0], ws[0], gid[0])
        assert len(um) == units and np.isclose((um * mult).sum(), P)
        assert {int(k): int(v) for k, v in zip(*np.unique(mult, return_counts=True))} == mults
        on = m[0] > 0
        assert np.all(gmap[on] >= 0) and np.all(gmap[~on] == -1)
        assert np.array_equal(um[gmap[on]], m[0, on]) and np.array_equal(uws[gmap[on]], ws[0, on])
        assert np.array_equal(np.bincount(gmap[on], minlength=units), mult.astype(int))
        assert np.array_equal(ncop[ucls], mult)


def test_a_finished_row_does_not_move_the_others(monkeypatch):
    """Rows are dropped from the loop once their trains have ended: a configuration's times do not depend on what
    else is simulated with it (bitwise, for configurations of the same unit count)."""
    rng = np.random.default_rng(7)
    prm = StageParams(17.0, 51.0, 7000.0, 33.0, 0.6, 100.0, stalled_fraction=0.8, base_capacity_kib=800.0,
                      arbitration="gpc_drain")
    P = np.array([132, 264, 132])
    b = (rng.integers(1, 160, (3, 6)) * 2048).astype(float)
    b[1] = 2048.0                                                        # a short train that ends first
    g = rng.choice([0, 3000, 30_000], (3, 6)).astype(float)
    s_all, e_all, _ = simulate_stage(prm, P, b, g, [False, False, True])
    for i in range(3):
        s_i, e_i, _ = simulate_stage(prm, P[i:i + 1], b[i:i + 1], g[i:i + 1], [[False, False, True][i]])
        assert np.array_equal(e_i[0], e_all[i], equal_nan=True) and np.array_equal(s_i[0], s_all[i], equal_nan=True)
