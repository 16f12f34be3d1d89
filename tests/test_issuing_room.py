"""Arbitration "pool_share" (session 22, issue 11): "slots" whose shared part C_0 (phi C_0 once it filled) holds at
most C_0 / n^alpha of each issuing program's stores beyond its own slots, n the programs issuing now (alpha =
StageParams.pool_share_exponent, 0 <= alpha <= 1). Validated by StageParams and registered as a rung; alpha = 0 is
"slots" bit for bit; a program issuing alone is "slots" at any alpha; the stage never passes more than C(P) + D t;
at alpha = 1 with many programs issuing the cap binds (the predictions differ from "slots")."""
from dataclasses import replace

import numpy as np
import pytest

from xstage import fit, model, studies
from conftest import random_stage_params
from xstage.model import KIB, StageParams, predict_train, simulate_stage

RNG = np.random.default_rng(22)


def random_params(**kw) -> StageParams:
    return random_stage_params(RNG, **kw)


def random_trains(N, n=10):
    b = RNG.integers(1, 200, (N, n)) * 2048.0                      # 2-400 KiB per program
    g = RNG.choice([0, 500, 3000, 30_000, 100_000], (N, n)).astype(float)
    return b, g


def test_validated_by_stage_params_and_registered_as_a_rung():
    assert "pool_share" in model.ARBITRATIONS and "pool_share" in model.FENCE_ARBITRATIONS
    assert random_params().pool_share_exponent == 0.0   # the default: every other arbitration as before
    for bad in (-0.1, 1.01, np.nan, np.inf):
        with pytest.raises(ValueError, match="pool_share_exponent must be in"):
            random_params(arbitration="pool_share", pool_share_exponent=bad)
    with pytest.raises(ValueError, match="needs arbitration 'pool_share'"):
        random_params(arbitration="slots", pool_share_exponent=0.5)
    assert random_params(arbitration="pool_share", pool_share_exponent=1.0).pool_share_exponent == 1.0
    assert fit.RUNG_ARBITRATION[("pool_share", "host")] == "pool_share" == fit.RUNG_ARBITRATION[("pool_share", "nvlink")]
    assert fit.RUNG_START["pool_share"] == "stage"
    assert fit.RUNGS["pool_share"] == (*fit.RUNGS["stage"], "pool_share_exponent")
    assert fit._initial("pool_share", "host")["pool_share_exponent"] > 0
    assert "pool_share_exponent" not in fit._initial("stage", "host")   # other rungs keep the default 0
    lo, hi = fit.STAGE_BOUNDS["pool_share_exponent"]
    assert 0 < lo < hi < 1 and "pool_share_exponent" in fit.LOGIT
    assert "pool_share" in studies.CANDIDATE_RUNGS


@pytest.mark.parametrize("trial", range(3))
def test_alpha_zero_is_slots_exactly(trial):
    """alpha = 0: the pool's limit per issuer is the pool itself, so every burst is "slots"'s, bit for bit: random
    trains at P = 16-264, free-running (with and without the read fence) and synchronised."""
    prm = random_params()
    N = 12
    P = RNG.choice([16, 66, 132, 200, 264], N)
    b, g = random_trains(N)
    sync = RNG.random(N) < 0.3
    fence = np.zeros(b.shape, bool)
    fence[:, 4::4] = True
    for rf in (None, fence):
        want = simulate_stage(prm, P, b, g, sync, read_fence=rf)
        got = simulate_stage(replace(prm, arbitration="pool_share"), P, b, g, sync, read_fence=rf)
        for x, y in zip(want, got):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("trial", range(3))
def test_a_program_alone_is_slots_at_any_alpha(trial):
    """One program issuing: its limit is the whole pool (n = 1), so it fills the shared part first come and stalls
    as under "slots", whatever alpha (the limit's code path runs: alpha > 0)."""
    prm = random_params(drain_gbps=RNG.uniform(5.0, 20.0))   # below one program's rate: it backs up
    b = RNG.integers(100, 2000, 10) * 2048.0                  # 0.2-4 MiB: beyond its slots and C_0
    g = RNG.choice([0, 500, 3000, 30_000], 10).astype(float)
    alpha = RNG.uniform(0.05, 1.0)
    for sync in (False, True):
        want = predict_train(prm, 1, b, g, sync=sync)
        got = predict_train(replace(prm, arbitration="pool_share", pool_share_exponent=alpha), 1, b, g, sync=sync)
        np.testing.assert_allclose(got, want, rtol=1e-9)
    assert (want > 1.5 * (prm.overhead_ns + b * prm.issue_ns_per_kib / KIB)).any()   # it did contend


@pytest.mark.parametrize("alpha", [0.3, 1.0])
def test_the_stage_passes_no_more_than_its_capacity_plus_the_drain(alpha):
    """The total drain never exceeds D: by any time T, the bytes of the bursts the programs have finished are at
    most C(P) (own slots + shared part) + D T (free-running, every program from t = 0)."""
    prm = random_params(arbitration="pool_share", pool_share_exponent=alpha)
    N = 8
    P = RNG.choice([16, 66, 132, 264], N)
    b, g = random_trains(N, 12)
    start, end, m = simulate_stage(prm, P, b, g, np.zeros(N, bool))
    D = prm.drain_gbps
    for i in range(N):
        valid = m[i] > 0
        e = end[i][valid]                               # [groups, n]
        mi = m[i][valid]
        for T in np.unique(e):
            done = (e <= T * (1 + 1e-12)) * b[i][None, :]   # bytes per program of the bursts finished by T
            issued = (mi[:, None] * done).sum()
            assert issued <= prm.capacity_bytes(P[i]) * (1 + 1e-9) + D * T + 1.0, (i, T)


def test_the_cap_binds_when_many_issue():
    """At alpha = 1 the shared part is in equal parts among the issuers: on contended trains of many programs the
    predictions differ from "slots" (the limit binds), while P = 1 does not (above)."""
    prm = random_params(drain_gbps=40.0, base_capacity_kib=800.0, spread=0.6)
    N = 6
    P = np.full(N, 66)
    b, g = random_trains(N)
    s0, e0, m = simulate_stage(prm, P, b, g, np.zeros(N, bool))
    s1, e1, _ = simulate_stage(replace(prm, arbitration="pool_share", pool_share_exponent=1.0), P, b, g,
                               np.zeros(N, bool))
    d0, d1 = e0 - s0, e1 - s1
    assert np.nanmax(np.abs(d1 / d0 - 1)) > 0.05
    assert np.isfinite(d1[m > 0]).all()
