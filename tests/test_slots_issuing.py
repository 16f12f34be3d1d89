"""Arbitration "slots_issuing" (session 18, issue 11): "slots" whose shared part C_0 is split equally among the
programs issuing now instead of being one first-come pool. Validated by StageParams; the same as "slots" where every
program issues alike (one program; equal shares started together, free-running or synchronised); a small burst that
a program starts after a gap while few others are still inside their burst issues at once, where under "slots" it
waits behind the stores the busy programs keep in the full shared part; at the busy end it waits as under "slots"."""
from dataclasses import replace

import numpy as np
import pytest

from xstage import fit, model, studies
from conftest import random_stage_params
from xstage.model import KIB, StageParams, predict_train, simulate_stage

RNG = np.random.default_rng(18)


def params(**kw) -> StageParams:
    base = dict(issue_ns_per_kib=17.0, drain_gbps=51.0, capacity_kib=7400.0, capacity_per_program_kib=33.6,
                spread=0.6, stalled_fraction=0.8, base_capacity_kib=800.0, overhead_ns=100.0,
                arbitration="slots_issuing")
    base.update(kw)
    return StageParams(**base)


def random_params(**kw) -> StageParams:
    return random_stage_params(RNG, **kw)


def test_validated_by_stage_params_and_registered_as_a_rung():
    assert "slots_issuing" in model.ARBITRATIONS
    assert params().arbitration == "slots_issuing"
    with pytest.raises(ValueError, match="arbitration must be one of"):
        params(arbitration="slots_issue")
    assert fit.RUNG_ARBITRATION[("slots_issuing", "host")] == "slots_issuing"
    assert fit.RUNG_ARBITRATION[("slots_issuing", "nvlink")] == "slots_issuing"
    assert fit.RUNG_START["slots_issuing"] == "stage" and fit.RUNGS["slots_issuing"] == fit.RUNGS["stage"]
    assert "slots_issuing" in studies.CANDIDATE_RUNGS


@pytest.mark.parametrize("trial", range(4))
def test_one_program_is_slots(trial):
    """One program holds the whole shared part whenever it issues, as under "slots" (its own slots, then C_0 first
    come, phi C_0 once it filled): every burst alike to 1e-9, free-running and synchronised."""
    prm = random_params(drain_gbps=RNG.uniform(5.0, 20.0))   # below one program's rate (34-200 B/ns): it backs up
    b = RNG.integers(100, 2000, 10) * 2048.0   # 0.2-4 MiB: beyond its slots and C_0
    g = RNG.choice([0, 500, 3000, 30_000], 10).astype(float)
    for sync in (False, True):
        want = predict_train(prm, 1, b, g, sync=sync)
        got = predict_train(replace(prm, arbitration="slots_issuing"), 1, b, g, sync=sync)
        np.testing.assert_allclose(got, want, rtol=1e-9)
    # the bursts did contend (one program beyond its slots and C_0): the limit is not the trivial one
    assert (want > 1.5 * (prm.overhead_ns + b * prm.issue_ns_per_kib / KIB)).any()


@pytest.mark.parametrize("P", [16, 66, 132, 264])
def test_equal_programs_started_together_are_slots(P):
    """Equal shares (spread 0) and a common start: every program issues, fills its slots and stops at the same
    moments, so an equal split of C_0 among the issuers is what the first-come pool gives each: "slots" to 1e-9
    (free-running and with the grid barrier)."""
    prm = random_params(spread=0.0)
    b = (RNG.integers(1, 200, 8) * 2048.0)[None]
    g = RNG.choice([0, 500, 3000, 30_000], 8).astype(float)[None]
    for sync in (False, True):
        s0, e0, _ = simulate_stage(prm, [P], b, g, [sync])
        s1, e1, _ = simulate_stage(replace(prm, arbitration="slots_issuing"), [P], b, g, [sync])
        ok = np.isfinite(e0)
        np.testing.assert_allclose(e1[ok], e0[ok], rtol=1e-9, atol=1e-6)
        np.testing.assert_allclose(s1[ok], s0[ok], rtol=1e-9, atol=1e-6)


def _small_after_big(arbitration):
    """P = 132 (8 weight groups, spread 0.6): a 512 KiB burst, a 20 us gap, a 16 KiB burst. The favoured groups
    finish the big burst first, so their small bursts start while most others are still in theirs and the later
    groups' while fewer and fewer are. Returns the small burst's issue time per group and the share of the other
    groups inside their big burst when it starts."""
    b = np.array([[512 * KIB, 16 * KIB]])
    g = np.array([[20_000.0, 0.0]])
    st, en, _ = simulate_stage(params(arbitration=arbitration), [132], b, g, [False])
    s, e = st[0], en[0]
    busy = np.array([((s[:, 0] <= s[j, 1]) & (e[:, 0] > s[j, 1])).sum() / 7 for j in range(8)])
    return e[:, 1] - s[:, 1], busy


def test_a_small_burst_started_while_few_others_issue_is_not_held_back():
    t_slots, busy = _small_after_big("slots")
    t_new, busy_new = _small_after_big("slots_issuing")
    unimpeded = 100.0 + 16 * 17.0
    few = (busy > 0) & (busy <= 0.3)
    assert few.sum() >= 2, busy
    # under "slots" these wait behind the busy programs' stores in the full shared part (> 3x unimpeded); under
    # "slots_issuing" they get C_0 / (programs issuing) at once and issue unimpeded
    assert (t_slots[few] > 3 * unimpeded).all(), t_slots
    np.testing.assert_allclose(t_new[few], unimpeded, rtol=1e-9)
    # at the busy end (every other program inside its big burst) it waits as under "slots"
    end = busy >= 0.99
    assert end.any() and (t_new[end] >= 0.95 * t_slots[end]).all() and (t_new[end] > 10 * unimpeded).all()
