"""Arbitration "capped" (session 18, issue 11): one stage of C(P) (phi C(P) once it filled, until it empties) that
every program may fill up to its own cap c_p; the caps overcommit the stage at large P, so a program starting a
burst while few others issue takes up to c_p at once, and once most issue the stage is full and even a small burst
waits for its weight's share of what drains. The stores of programs no longer issuing drain first (they are the
oldest: model.CAPPED_OLDEST_FIRST). Checked by hand-derivable limits and against the bound every stage obeys."""
from dataclasses import replace

import numpy as np
import pytest

from xstage import fit, model, studies
from xstage.model import KIB, StageParams, predict_train, simulate_stage

RNG = np.random.default_rng(1818)


def params(**kw) -> StageParams:
    base = dict(issue_ns_per_kib=17.0, drain_gbps=51.0, capacity_kib=7400.0, capacity_per_program_kib=33.6,
                spread=0.0, stalled_fraction=1.0, base_capacity_kib=800.0, overhead_ns=100.0, arbitration="capped")
    base.update(kw)
    return StageParams(**base)


def test_validated_and_registered_as_a_rung():
    assert "capped" in model.ARBITRATIONS and params().arbitration == "capped"
    with pytest.raises(ValueError, match="arbitration must be one of"):
        params(arbitration="caped")
    assert fit.RUNG_ARBITRATION[("capped", "host")] == "capped" == fit.RUNG_ARBITRATION[("capped", "nvlink")]
    assert fit.RUNG_START["capped"] == "stage" and fit.RUNGS["capped"] == fit.RUNGS["stage"]
    assert "capped" in studies.CANDIDATE_RUNGS


@pytest.mark.parametrize("P", [1, 16, 132])
def test_bursts_within_cap_and_stage_issue_unimpeded(P):
    """P programs, one burst each of at most c_p with P b <= C(P): every program issues at r (o + b / r)."""
    prm = params()
    b = min(prm.capacity_per_program_kib * KIB, 0.9 * float(prm.capacity_bytes(P)) / P) * 0.99
    st, en, m = simulate_stage(prm, [P], np.array([[b]]), np.array([[0.0]]), [False])
    ok = np.isfinite(st[0, :, 0])
    np.testing.assert_allclose((en - st)[0, ok, 0], prm.overhead_ns + b / prm.program_rate, rtol=1e-9)


@pytest.mark.parametrize("trial", range(3))
def test_one_program_is_capped_by_its_own_drain(trial):
    """One program, a burst far beyond its cap: it fills c_p at r - D, then issues at D (the cap binds before the
    stage when c_p < C(1)): issue time = c_p / (r - D) + (b - c_p r / (r - D)) / D, exactly."""
    D = RNG.uniform(5.0, 30.0)
    prm = params(drain_gbps=D, capacity_per_program_kib=RNG.uniform(10, 60), overhead_ns=0.0)
    r, cp = prm.program_rate, prm.capacity_per_program_kib * KIB
    assert cp < float(prm.capacity_bytes(1))
    b = 4 * 1024 * KIB
    t_fill = cp / (r - D)
    want = t_fill + (b - r * t_fill) / D
    got = predict_train(prm, 1, [b], [0.0])
    np.testing.assert_allclose(got, [want], rtol=1e-9)


def test_the_drain_bounds_a_long_grid():
    """Many programs, long bursts back to back: the last store leaves the issuers no earlier than
    (total - C(P)) / D after the start, and the stage keeps the link busy (within 3 % of that bound)."""
    prm = params(stalled_fraction=1.0)
    P, b, n = 132, 256 * KIB, 6
    st, en, m = simulate_stage(prm, [P], np.full((1, n), b), np.zeros((1, n)), [False])
    last = np.nanmax(en)
    bound = (P * b * n - float(prm.capacity_bytes(P))) / prm.drain_gbps
    assert last >= bound * (1 - 1e-9)
    assert last <= bound * 1.03


def test_small_burst_waits_only_when_the_caps_overcommit_the_stage():
    """P programs burst 24 KiB (below their cap) then 2 KiB back to back. At P = 20 the caps fit in C(P): the 2 KiB
    burst issues at r (o + b / r); at P = 132 they overcommit it, the stage is full and the 2 KiB burst waits (> 10x
    unimpeded)."""
    prm = params(capacity_kib=3000.0, base_capacity_kib=200.0)
    free = prm.overhead_ns + 2 * KIB / prm.program_rate
    for P, expect_wait in ((20, False), (132, True)):
        st, en, m = simulate_stage(prm, [P], np.array([[24 * KIB, 2 * KIB]]), np.zeros((1, 2)), [False])
        ok = np.isfinite(st[0, :, 1])
        t2 = np.median((en - st)[0, ok, 1])
        over = P * prm.capacity_per_program_kib * KIB > float(prm.capacity_bytes(P))
        assert over == expect_wait
        if expect_wait:
            assert t2 > 10 * free
        else:
            np.testing.assert_allclose(t2, free, rtol=1e-6)


def test_oldest_first_frees_an_idle_programs_cap(monkeypatch):
    """Spread programs: the heavy-weight groups finish their first burst first; with the stores of programs no
    longer issuing drained first, their second small burst after a gap finds their cap empty more often: the
    median second burst is faster than with every holder sharing the drain, and some groups issue it unimpeded
    that otherwise wait."""
    prm = params(spread=0.8)
    b = np.array([[48 * KIB, 16 * KIB]] * 3)
    g = np.array([[5000.0, 0.0], [20000.0, 0.0], [50000.0, 0.0]])
    out = {}
    for flag in (True, False):
        monkeypatch.setattr(model, "CAPPED_OLDEST_FIRST", flag)
        st, en, m = simulate_stage(prm, [132] * 3, b, g, [False] * 3)
        out[flag] = (en - st)[:, :, 1]
    ok = np.isfinite(out[True])
    free = prm.overhead_ns + 16 * KIB / prm.program_rate
    assert np.median(out[True][ok]) < np.median(out[False][ok])
    assert ((out[True][ok] <= free * (1 + 1e-6)) & (out[False][ok] > 2 * free)).any()
