"""xstage.sm_sharing_analysis on built per-program records (exact and stretched gaps, known overlaps) and on one
recorded train set."""
import numpy as np
import pandas as pd
import pytest

from xstage import data, sm_sharing_analysis as sa


def _record(per_sm: int, stretch: float, seed: int) -> pd.DataFrame:
    """Two SMs of ``per_sm`` programs, 4 bursts each; every gap lasts ``stretch`` x its launched length."""
    rng = np.random.default_rng(seed)
    rows = []
    for prog in range(2 * per_sm):
        t = float(rng.uniform(0, 500))
        for b in range(4):
            issue, gap = float(rng.uniform(1e3, 5e3)), float(rng.uniform(6e3, 4e4))
            rows.append(dict(train="t", target="host", programs=2 * per_sm, store_bytes=16, n_bursts=4, rank=0,
                             repeat=0, program=prog, smid=prog % 2, burst=b, burst_bytes=8192, gap_ns=gap,
                             start_ns=t, issue_ns=issue))
            t += issue + gap * stretch
    return pd.DataFrame(rows)


@pytest.mark.parametrize("stretch", [1.0, 1.7])
def test_the_gap_ratio_is_the_built_stretch(stretch):
    r = sa.gap_stretch(_record(3, stretch, seed=int(stretch * 10)))
    assert list(r.per_sm) == [3] and r.gaps.iloc[0] == 6 * 3
    assert r["median"].iloc[0] == pytest.approx(stretch, rel=1e-9)
    assert r.p10.iloc[0] == pytest.approx(stretch, rel=1e-9) and r.p90.iloc[0] == pytest.approx(stretch, rel=1e-9)


def test_short_gaps_are_left_out_and_the_last_burst_has_none():
    pp = _record(1, 2.0, seed=3)
    pp.loc[pp.burst == 1, "gap_ns"] = 100.0
    r = sa.gap_stretch(pp)
    assert r.gaps.iloc[0] == 2 * 2      # bursts 0 and 2 of two programs: 1's gap is short, 3 has no next burst


def test_issuing_at_once_counts_the_overlaps():
    rows = []   # SM 0: programs 0 and 1 issue together over [0, 10 us); SM 1: program 2 alone, [0, 10 us)
    for prog, sm in ((0, 0), (1, 0), (2, 1)):
        rows.append(dict(train="t", target="host", programs=3, store_bytes=16, n_bursts=1, rank=0, repeat=0,
                         program=prog, smid=sm, burst=0, burst_bytes=8192, gap_ns=0.0, start_ns=0.0,
                         issue_ns=10_000.0))
    r = sa.issuing_at_once(pd.DataFrame(rows)).iloc[0]
    assert (r.total, r.per_busy_sm, r.most_on_one_sm) == (3, 1.5, 2)


def test_a_record_without_sms_is_refused():
    with pytest.raises(ValueError, match="missing"):
        sa.gap_stretch(_record(1, 1.0, seed=1).drop(columns="smid"))


def test_the_recorded_families_gaps_last_as_launched_only_where_a_program_has_its_sm_alone():
    pp, _ = data.load(data.machine_dir("h100x1_second") / "families", data.BURST_PROGRAM)
    r = sa.gap_stretch(pp[pp.programs <= 264]).set_index("programs")
    assert (r.loc[[16, 66, 132], "per_sm"] == 1).all() and (r.loc[[16, 66, 132], "median"] < 1.02).all()
    assert r.loc[264, "per_sm"] == 2 and r.loc[264, "median"] > 1.2


def test_the_bound_with_measured_gaps_is_exact_on_a_record_the_model_made():
    """A record whose median program is the model's own with every gap 1.6x as launched: with the measured gaps
    the model is exact, with the launched ones it is not."""
    from xstage.model import load_params, predict_train
    prm = load_params(data.machine_dir("h200x1"), "host")
    b, g = np.array([32768.0, 32768, 24576, 32768]), np.array([60000.0, 40000, 80000, 0])
    issue = predict_train(prm, 264, b, g * 1.6)
    rows = []
    for prog in range(264):
        t = 0.0
        for k in range(4):
            rows.append(dict(train="s0-00", target="host", programs=264, store_bytes=16, n_bursts=4, rank=0,
                             repeat=0, program=prog, smid=prog % 132, burst=k, burst_bytes=b[k], gap_ns=g[k],
                             start_ns=t, issue_ns=issue[k]))
            t += issue[k] + g[k] * 1.6
    pp = pd.DataFrame(rows)
    one = sa.measured_gap_bound(pp, prm)
    r = sa.measured_gap_bound(pd.concat([pp, pp.assign(train="s0-01")]), prm)   # two trains
    assert r["bursts"] == 2 * one["bursts"] > 0
    assert r["measured"]["median"] < 1e-9 and r["launched"]["median"] > 0.01
    with pytest.raises(ValueError, match="no trains of 66 programs"):
        sa.measured_gap_bound(pd.DataFrame(rows), prm, programs=66)
