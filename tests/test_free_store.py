"""The stage model's free entry (StageParams.free_kib / free_cap_kib, rung "free_store"): the first f KiB
of each burst of a program enter the stage at once, whatever the stage's state, while the program holds less than
its own slots + F. Measured on clean records: a 2 KiB burst issues in ~60 ns right after a contended lead.
What must hold: such a burst costs the overhead alone where the model without f waits microseconds; a train of small
bursts cannot issue more than the stage + F per program beyond what the drain has taken; f = 0 is the model
without it; the fast path equals the general loop; bad values are refused."""
from dataclasses import replace

import numpy as np
import pytest

from xstage import model, stage_sim
from xstage.fluid import KIB
from xstage.model import predict_train
from xstage.stage_params import StageParams
from xstage.stage_sim import simulate_stage


def _prm(arbitration="gpc_drain", **kw):
    return StageParams(issue_ns_per_kib=17.2, drain_gbps=51.2, capacity_kib=5900.0, capacity_per_program_kib=38.0,
                       spread=0.59, overhead_ns=11.5, stalled_fraction=0.68, base_capacity_kib=830.0, link="test",
                       arbitration=arbitration, **kw)


LEAD = np.array([128 * KIB] + [2 * KIB] * 11, float)
LEAD_GAPS = np.array([500.0] + [3000.0] * 11)


@pytest.mark.parametrize("arbitration", ["gpc_drain", "slots"])
@pytest.mark.parametrize("P", [132, 264])
def test_a_burst_within_f_after_a_contended_lead_costs_the_overhead_alone(arbitration, P):
    without = predict_train(_prm(arbitration), P, LEAD, LEAD_GAPS)
    with_f = predict_train(_prm(arbitration, free_kib=2.0, free_cap_kib=32.0), P, LEAD, LEAD_GAPS)
    assert without[0] > 100_000 and with_f[0] > 100_000                 # the lead is contended in both
    assert (without[1:4] > 1000).all()                                  # without f the probes wait microseconds
    np.testing.assert_allclose(with_f[1:], _prm().overhead_ns, rtol=1e-9)   # with f: the overhead only
    # a burst larger than f still waits for what is beyond f
    big = LEAD.copy()
    big[1:] = 8 * KIB
    assert predict_train(_prm(arbitration, free_kib=2.0, free_cap_kib=32.0), P, big, LEAD_GAPS)[1] > 1000


@pytest.mark.parametrize("fast", [True, False])
def test_small_bursts_back_to_back_cannot_beat_the_drain(monkeypatch, fast):
    """100 bursts of 2 KiB with no gap at P = 264: without the bound F every one would be free and the whole train
    would issue in 100 overheads. With it, the last program ends no earlier than the bytes the stage, its slots and
    the programs' F cannot hold, drained at D."""
    monkeypatch.setattr(stage_sim, "GPC_DRAIN_FAST", fast)
    prm = _prm(free_kib=2.0, free_cap_kib=32.0)
    P, n = 264, 100
    b, g = np.full(n, 2.0 * KIB), np.zeros(n)
    st, en, m = simulate_stage(prm, [P], b[None], g[None], [False])
    total = P * n * 2 * KIB
    held = prm.capacity_bytes(P) + P * prm.free_cap_kib * KIB
    assert np.nanmax(en[0, :, -1]) >= (total - held) / prm.drain_gbps
    assert np.nanmax(en[0, :, -1]) > 100 * n * prm.overhead_ns            # far from the unbounded 1.2 us


def test_f_zero_is_the_model_without_it():
    rng = np.random.default_rng(3)
    b = rng.choice([2, 4, 16, 64, 320], 12) * KIB * 1.0
    g = rng.uniform(0, 40_000, 12)
    for P in (16, 132):
        a = predict_train(_prm(), P, b, g)
        z = predict_train(_prm(free_kib=0.0, free_cap_kib=32.0), P, b, g)
        np.testing.assert_array_equal(a, z)
        assert not np.allclose(predict_train(_prm(free_kib=4.0, free_cap_kib=32.0), P, b, g), a)


@pytest.mark.parametrize("seed", range(3))
def test_the_fast_path_equals_the_general_loop_with_free_entries(monkeypatch, seed):
    rng = np.random.default_rng(seed)
    f = float(rng.uniform(0.5, 8))
    prm = _prm(free_kib=f, free_cap_kib=f * float(rng.uniform(1, 20)))
    P = rng.choice([16, 66, 132, 264], 6)
    b = (rng.integers(1, 80, (6, 10)) * 1024).astype(float)
    g = rng.choice([0, 500, 3000, 30_000], (6, 10)).astype(float)
    sync = rng.uniform(size=6) < 0.3
    out = []
    for fast in (True, False):
        monkeypatch.setattr(stage_sim, "GPC_DRAIN_FAST", fast)
        out.append(simulate_stage(prm, P, b, g, sync))
    (s1, e1, _), (s2, e2, _) = out
    ok = np.isfinite(e2)
    assert np.array_equal(ok, np.isfinite(e1))
    np.testing.assert_allclose(e1[ok], e2[ok], rtol=1e-9)


def test_bad_free_entries_are_refused():
    with pytest.raises(ValueError, match="free_kib must be >= 0"):
        _prm(free_kib=-1.0, free_cap_kib=32.0)
    with pytest.raises(ValueError, match="free_cap_kib must be finite and >= free_kib"):
        _prm(free_kib=4.0, free_cap_kib=2.0)
    with pytest.raises(ValueError, match="needs every program's own stores"):
        _prm("pool", free_kib=2.0, free_cap_kib=32.0)
    assert replace(_prm(), free_kib=2.0, free_cap_kib=2.0).free_kib == 2.0


def _random_free(rng, arbitration="gpc_drain", **kw):
    """Random parameters with free entries (the form of the host link's full model, rung free_store)."""
    f = rng.uniform(0.5, 4.0)
    d = dict(issue_ns_per_kib=rng.uniform(5, 60), drain_gbps=rng.uniform(20, 400), capacity_kib=rng.uniform(500, 20000),
             capacity_per_program_kib=rng.uniform(2, 60), spread=rng.uniform(0.1, 0.9), overhead_ns=rng.uniform(0, 300),
             stalled_fraction=rng.uniform(0.1, 1.0), base_capacity_kib=rng.uniform(0, 2000), link="test",
             arbitration=arbitration, free_kib=f, free_cap_kib=rng.uniform(f, 64.0))
    return StageParams(**{**d, **kw})


@pytest.mark.parametrize("seed", range(4))
def test_the_full_models_laws_hold_with_free_entries(seed):
    """The laws the issue asks of the model, for the full model's form (per-GPC drain, own slots, free entries): equal
    shares and a synchronous start keep every program identical; a program alone issues at its rate beyond its free
    f; a long gap makes every burst cost like the first; the bytes issued by T never exceed what the stage and the
    programs' free bounds hold plus D * T."""
    rng = np.random.default_rng(100 + seed)
    b = (rng.integers(1, 160, 8) * 2048).astype(float)
    g = rng.choice([0, 500, 3000, 30_000, 100_000], 8).astype(float)
    prm = _random_free(rng, spread=0.0)
    start, end, _ = simulate_stage(prm, [128], b[None], g[None], [False])      # 16 programs in each of the 8 GPCs
    assert np.allclose(start[0], start[0, :1], rtol=1e-9, atol=1e-6)
    assert np.allclose(end[0], end[0, :1], rtol=1e-9, atol=1e-6)
    alone = _random_free(rng, drain_gbps=500.0, issue_ns_per_kib=25.0)         # r = 41 GB/s < D: never stalls
    want = alone.overhead_ns + np.maximum(b - KIB * alone.free_kib, 0) * alone.issue_ns_per_kib / KIB
    np.testing.assert_allclose(predict_train(alone, 1, b, g), want, rtol=1e-9)
    same = np.full(6, rng.integers(8, 320) * 2048.0)
    for p, sync in ((_random_free(rng), True), (_random_free(rng, spread=0.0), False)):
        t = predict_train(p, 128, same, np.full(6, 1e9), sync=sync)
        assert np.allclose(t, t[0], rtol=1e-6), (sync, t)
    p = _random_free(rng)
    P = int(rng.choice([16, 66, 132, 264]))
    start, end, m = simulate_stage(p, [P], b[None], g[None], [False])
    done = sorted((end[0, j, k], m[0, j] * b[k]) for j in range(end.shape[1]) for k in range(len(b))
                  if np.isfinite(end[0, j, k]))
    t = np.array([x[0] for x in done])
    issued = np.cumsum([x[1] for x in done])
    held = p.capacity_bytes(P) + P * KIB * p.free_cap_kib
    assert np.all(issued <= held + p.drain_gbps * t + 1e-6 * issued)
