"""The fit recovers known Burst-Gap parameters from simulated, noisy sweeps; its inputs are checked."""
import numpy as np
import pytest

from xstage import burst_gap_sweep, data, fit, records
from xstage.fluid import BurstGapParams, simulate_sweep
from xstage.burst_gap_sweep import BurstGapGrid

GRID = BurstGapGrid(burst_kib=(1, 4, 16, 64, 256, 1024, 4096), gap_us=(0, 3, 30), programs=(4, 16, 66, 132, 264),
                    store_bytes=(16,), targets=("remote",), n_bursts=6, repeats=2)


@pytest.fixture(scope="module")
def truth_and_rows():
    truth = BurstGapParams(issue_ns_per_kib=float(np.random.default_rng(7).uniform(12, 30)), drain_gbps=300.0,
                           capacity_kib=1536.0, overhead_ns=80.0)
    return truth, simulate_sweep(GRID, truth, seed=3, noise=0.03, skew_ns=0.0)


@pytest.mark.parametrize("uncertainty", ["bootstrap", "jacobian"])
def test_fit_recovers_known_parameters(truth_and_rows, uncertainty):
    truth, rows = truth_and_rows
    res = fit.fit_burst_gap(rows, n_bootstrap=20, uncertainty=uncertainty, measure="span_ns")
    for name in ("issue_ns_per_kib", "drain_gbps", "capacity_kib"):
        got, want = getattr(res.params, name), getattr(truth, name)
        assert abs(got / want - 1) < 0.10, (name, got, want)
        assert res.ci_low[name] <= res.ci_high[name]
    assert res.heldout_median_abs_error < 0.10
    # held-out folds are whole configurations: no configuration is in two folds
    assert res.heldout.groupby(fit.CONFIG).fold.nunique().max() == 1


def test_fit_detects_a_wrong_model(truth_and_rows):
    """Times the model cannot produce (quadratic in size) leave a large held-out error: the check can fail."""
    _, rows = truth_and_rows
    warped = rows.assign(span_ns=rows.span_ns * (rows.burst_bytes / 1024.0) ** 0.5)
    res = fit.fit_burst_gap(warped, n_bootstrap=0, uncertainty="jacobian")
    assert res.heldout_median_abs_error > 0.10


def test_fit_on_recorded_h200x2_data_is_sane():
    df, meta = data.load(records.folder("burst_gap", "h200x2"))
    res = fit.fit_burst_gap(df, n_bootstrap=0, uncertainty="jacobian")
    p = res.params
    assert 50 < p.drain_gbps < 478          # below NV18's 478 GB/s per direction
    assert 10 < p.capacity_kib < 1e5
    assert np.isfinite(res.heldout_median_abs_error)


@pytest.mark.parametrize("kw,match", [({"target": "nowhere"}, "target"), ({"uncertainty": "guess"}, "uncertainty"),
                                       ({"k_folds": 1}, "k_folds"), ({"measure": "wall"}, "measure")])
def test_bad_fit_arguments(truth_and_rows, kw, match):
    _, rows = truth_and_rows
    with pytest.raises(ValueError, match=match):
        fit.fit_burst_gap(rows, **kw)


def test_too_few_configurations(truth_and_rows):
    _, rows = truth_and_rows
    few = rows[(rows.programs == 4) & (rows.gap_ns == 0) & (rows.burst_bytes <= 4096)]
    with pytest.raises(ValueError, match="too few"):
        fit.fit_burst_gap(few)


# ----------------------------------------------------------------------- self-test: intervals cover the truth
def _simulated_fit(seed, uncertainty="bootstrap"):
    from xstage import burst_gap_sweep

    grid = BurstGapGrid(**burst_gap_sweep.SIMULATED_GRID)
    truth = BurstGapParams.reference()          # what the simulated source documents
    rows = simulate_sweep(grid, truth, seed=seed)
    return truth, fit.fit_burst_gap(rows, n_bootstrap=60, uncertainty=uncertainty, seed=seed)


def test_intervals_cover_the_documented_simulated_parameters():
    """Seed 0 (the simulated source's): every interval covers its truth; over 4 seeds x 4 parameters the
    bootstrap's coverage is near its nominal 95 % (>= 14 of 16: a too-narrow interval fails this)."""
    covered = []
    for seed in range(4):
        truth, res = _simulated_fit(seed)
        cov = fit.coverage(res, truth)
        if seed == 0:
            assert cov.covers.all(), cov.to_string()
        assert (cov.rel_error.abs() < 0.03).all(), cov.to_string()
        covered += cov.covers.tolist()
    assert sum(covered) >= 14, f"{sum(covered)} of {len(covered)} intervals cover the truth"


def test_coverage_reports_a_miss_and_bad_truth():
    truth, res = _simulated_fit(0, "jacobian")
    wrong = BurstGapParams(truth.issue_ns_per_kib, truth.drain_gbps * 1.2, truth.capacity_kib, truth.overhead_ns)
    cov = fit.coverage(res, wrong)
    assert cov.set_index("parameter").covers.to_dict() == {"issue_ns_per_kib": True, "drain_gbps": False,
                                                           "capacity_kib": True, "overhead_ns": True}
    with pytest.raises(ValueError, match="truth lacks"):
        fit.coverage(res, {"drain_gbps": 1.0})


def test_event_simulation_of_the_synchronised_sweep_agrees_with_the_fluid_model():
    """The event engine (chunks, groups, FIFO stage, grid barrier) is an independent discretisation: it must
    agree with the closed-form fluid model the fit uses (median |difference| <= 3 % over the grid)."""
    grid = BurstGapGrid(burst_kib=(1, 16, 256, 4096), gap_us=(0, 10), programs=(4, 66, 264), store_bytes=(16,),
                        targets=("remote",), n_bursts=6, repeats=1)
    prm = BurstGapParams.reference()
    a = simulate_sweep(grid, prm, noise=0.0, engine="fluid")
    b = simulate_sweep(grid, prm, noise=0.0, engine="event", skew_ns=0.0)
    rel = (b.span_ns / a.span_ns - 1).abs()
    assert rel.median() <= 0.03, rel.describe()
    with pytest.raises(ValueError, match="engine must be"):
        simulate_sweep(grid, prm, engine="quantum")
