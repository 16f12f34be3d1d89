"""stage_programs_analysis.small_burst_contention: small bursts of free-running trains binned by the share of the other
programs inside a burst when they start, measured (per-program record) and from the stage model's simulated
programs. Hand-built records with known answers; bad input."""
import numpy as np
import pandas as pd
import pytest

from xstage import stage_programs_analysis
from xstage.fluid import KIB
from xstage.stage_params import StageParams


def test_active_share_by_hand():
    # intervals [0, 10), [5, 15), [12, 20): at 0 nobody else; at 5 the first; at 12 the second (the first ended at 10)
    a = stage_programs_analysis._active_share([0, 5, 12], [10, 15, 20], [1, 1, 1], 4.0)
    np.testing.assert_allclose(a, [0.0, 0.25, 0.25])
    # weights count as programs; an interval ending exactly at another's start does not hold it
    a = stage_programs_analysis._active_share([0, 10], [10, 20], [3, 1], 4.0)
    np.testing.assert_allclose(a, [0.0, 0.0])
    a = stage_programs_analysis._active_share([0, 9], [10, 20], [3, 1], 4.0)
    np.testing.assert_allclose(a, [0.0, 0.75])


def _record(P=66, busy=60):
    """One train of two bursts per program: ``busy`` programs start a 256 KiB burst at t = 0 that lasts 100 us; every
    program's second burst (2 KiB) starts at 50 us (the busy ones: after theirs ends, from 150 us), 1 us apart, and takes 100 ns
    if it starts while fewer than half the others are busy, else 5 us (a record with a known answer)."""
    rows = []
    for p in range(P):
        big = p < busy
        rows.append(dict(train="t", target="host", programs=P, repeat=0, program=p, burst=0,
                         burst_bytes=256 * KIB if big else 2 * KIB, gap_ns=0.0, start_ns=0.0 if big else 1e6 + 1e3 * p,
                         issue_ns=100e3 if big else 100.0))
        start = 150e3 + 1e3 * p if big else 50e3 + 1e3 * (p - busy)     # one after another within each kind
        rows.append(dict(train="t", target="host", programs=P, repeat=0, program=p, burst=1, burst_bytes=2 * KIB,
                         gap_ns=0.0, start_ns=start, issue_ns=5000.0 if (not big and busy / (P - 1) >= 0.5) else 100.0))
    return pd.DataFrame(rows)


def test_measured_bins_a_known_record():
    r = stage_programs_analysis.small_burst_contention(_record())
    two = r[r.size_kib.astype(str) == "(0, 2]"].set_index(r.active.astype(str)[r.size_kib.astype(str) == "(0, 2]"])
    # the idle programs' second bursts start while 60 of 65 others are busy: active 0.91, 5 us, all slow
    hi = two.loc["(0.8, 1.0]"]
    assert hi.bursts == 6 and hi.measured_ns == 5000.0 and hi.slow == 1.0
    # the busy programs' second bursts (and the idle programs' first, at 1 ms) start with nobody busy
    lo = two.loc["(-0.01, 0.05]"]
    assert lo.bursts == 60 + 6 and lo.measured_ns == 100.0 and lo.slow == 0.0
    assert "model_ns" not in r


def test_model_side_runs_on_the_same_trains():
    prm = StageParams(issue_ns_per_kib=16.0, drain_gbps=50.0, capacity_kib=8000.0, capacity_per_program_kib=30.0,
                      spread=0.6, stalled_fraction=0.8, base_capacity_kib=800.0, arbitration="slots")
    r = stage_programs_analysis.small_burst_contention(_record(), prm=prm)
    assert {"model_ns", "model_slow"} <= set(r.columns)
    assert np.isfinite(r.model_ns).any() and ((r.model_slow >= 0) & (r.model_slow <= 1)).all()


def test_bad_input():
    with pytest.raises(ValueError, match="no per-program rows"):
        stage_programs_analysis.small_burst_contention(_record(P=16, busy=10))          # below min_programs
    with pytest.raises(ValueError, match="no per-program rows"):
        stage_programs_analysis.small_burst_contention(_record().assign(target="local"))
