"""The Burst-Gap model's limits, and its event simulation against the fluid model."""
import numpy as np
import pytest

from xstage.fluid import (KIB, BurstGapParams, issue_time, onset_burst_bytes, recover, simulate_train,
                          steady_slowdown, sustained_rate, train)


def random_params(rng) -> BurstGapParams:
    return BurstGapParams(issue_ns_per_kib=rng.uniform(5, 40), drain_gbps=rng.uniform(100, 800),
                          capacity_kib=rng.uniform(256, 8192), overhead_ns=rng.uniform(0, 300))


@pytest.mark.parametrize("seed", range(5))
def test_burst_below_capacity_costs_only_issue_time(seed):
    rng = np.random.default_rng(seed)
    prm = random_params(rng)
    programs = rng.integers(1, 300, size=50)
    onset = onset_burst_bytes(programs, prm)
    b = np.where(np.isfinite(onset), onset * rng.uniform(0.01, 0.99, size=50), rng.uniform(1, 1e7, size=50))
    T, _ = issue_time(b, programs, 0.0, prm)
    np.testing.assert_allclose(T, prm.overhead_ns + b * prm.issue_ns_per_kib / KIB, rtol=1e-12)
    # ... and a burst above the onset stalls
    stalled = np.isfinite(onset)
    T2, q2 = issue_time(onset[stalled] * 1.5, programs[stalled], 0.0, prm)
    assert np.all(T2 > prm.overhead_ns + onset[stalled] * 1.5 * prm.issue_ns_per_kib / KIB)
    np.testing.assert_allclose(q2, prm.capacity_bytes)


@pytest.mark.parametrize("seed", range(5))
def test_long_gap_recovers_fully(seed):
    rng = np.random.default_rng(seed)
    prm = random_params(rng)
    P, b = 264, 4 * prm.capacity_bytes / 264  # each burst 4x the capacity: the stage is full after it
    long_gap = 2 * prm.capacity_bytes / prm.drain_gbps
    T, q = train(b, P, long_gap, 6, prm)
    np.testing.assert_allclose(q, prm.capacity_bytes)
    np.testing.assert_allclose(T, T[0], rtol=1e-12)           # every burst starts from an empty stage
    T_short, _ = train(b, P, 0.1 * long_gap, 6, prm)
    assert np.all(T_short[1:] > T[1:])                         # a short gap does not recover
    np.testing.assert_allclose(recover(prm.capacity_bytes, long_gap, prm), 0.0)


@pytest.mark.parametrize("seed", range(5))
def test_sustained_injection_converges_to_drain_rate(seed):
    rng = np.random.default_rng(seed)
    prm = random_params(rng)
    P = np.array([64, 132, 264])
    P = P[prm.issue_rate(P) > prm.drain_gbps]
    rate = sustained_rate(64 * KIB, P, prm, n_bursts=400)
    np.testing.assert_allclose(rate, prm.drain_gbps, rtol=1e-9)


def test_no_backpressure_when_issue_is_slower_than_drain():
    prm = BurstGapParams(issue_ns_per_kib=20.0, drain_gbps=400.0, capacity_kib=1024)
    P = 4  # 4 * 51.2 B/ns = 205 B/ns < 400
    assert np.isinf(onset_burst_bytes(P, prm))
    np.testing.assert_allclose(steady_slowdown(64 << 20, P, 0.0, prm), 1.0)


def test_outstanding_bytes_never_exceed_capacity_and_issue_time_grows_with_them():
    prm = BurstGapParams.reference()
    q0 = np.linspace(0, prm.capacity_bytes, 50)
    T, q = issue_time(256 * KIB, 132, q0, prm)
    assert np.all(np.diff(T) >= -1e-9) and np.all(q <= prm.capacity_bytes + 1e-6)


@pytest.mark.parametrize("P,b,gap", [(132, 64 * KIB, 0.0), (264, 16 * KIB, 2000.0), (16, 1 << 20, 10_000.0),
                                     (4, 8 * KIB, 0.0)])
def test_event_simulation_matches_fluid_model(P, b, gap):
    prm = BurstGapParams.reference()
    fluid, _ = train(b, P, gap, 8, prm)
    sim = np.median(simulate_train(b, P, gap, 8, prm, groups=8, chunks=256), axis=0)
    np.testing.assert_allclose(sim[0], fluid[0], rtol=0.03)           # from an empty stage: the same
    np.testing.assert_allclose(np.median(sim), np.median(fluid), rtol=0.15)  # later: discrete chunks, end effects


@pytest.mark.parametrize("field,value", [("issue_ns_per_kib", 0.0), ("drain_gbps", -1.0),
                                         ("capacity_kib", float("nan")), ("overhead_ns", -5.0)])
def test_bad_parameters_are_rejected(field, value):
    kw = BurstGapParams.reference().as_dict() | {field: value}
    with pytest.raises(ValueError, match=field):
        BurstGapParams(**kw)
