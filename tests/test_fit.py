"""The fit recovers known Burst-Gap parameters from simulated, noisy sweeps; its inputs are checked."""
import numpy as np
import pytest

from xstage import data, fit
from xstage.model import BurstGapParams, simulate_sweep
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
    df, meta = data.load(data.machine_dir("h200x2"))
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
