"""xstage.validate: one line in the user's words for every bad value, before anything is simulated."""
import numpy as np
import pytest

from xstage import validate
from xstage.model import load_params, predict_train
from xstage.data import machine_dir

OK = dict(programs_=132, burst_kib=32.0, gap_us=1.0, n_bursts=8, train_programs=132,
          train_burst_kib=[64, 8], train_gap_us=[10, 0])


@pytest.mark.parametrize("bad,match", [
    (dict(programs_=-5), "programs must be a whole number of programs >= 1, got -5"),
    (dict(n_bursts=0), "n_bursts must be a whole number .* got 0"),
    (dict(burst_kib=-2.0), r"burst_kib must be sizes > 0 KiB, got \[-2\]"),
    (dict(gap_us=float("nan")), r"gap_us must be gaps >= 0 us .*\[nan\]"),
    (dict(train_burst_kib=64.0), "train_burst_kib must be a list of sizes in KiB .* single value 64.0"),
    (dict(train_gap_us=[10]), "train_gap_us must hold one gap per burst: 2 bursts, 1 gaps"),
    (dict(train_programs=2.5), "train_programs must be a whole number"),
])
def test_the_explorer_workload_names_the_bad_parameter(bad, match):
    with pytest.raises(ValueError, match=match):
        validate.explorer_workload(**{**OK, **bad})
    validate.explorer_workload(**OK)   # the defaults pass


def test_units_and_flags():
    rng = np.random.default_rng()
    kib = rng.uniform(1, 512, 5)
    assert np.allclose(validate.sizes(kib, "burst_kib"), kib * 1024)
    us = rng.uniform(0, 100, 5)
    assert np.allclose(validate.gaps(us, "gap_us", 5), us * 1e3)
    assert validate.flag(np.bool_(True), "sync") is True
    for bad in ("no", 1, None):
        with pytest.raises(ValueError, match="sync must be True or False"):
            validate.flag(bad, "sync")


def test_predict_train_refuses_sync_no_and_a_scalar_train():
    prm = load_params(machine_dir("h200x2"), "nvlink")
    with pytest.raises(ValueError, match="sync must be True or False, got 'no'"):
        predict_train(prm, 16, [4096.0], [0.0], sync="no")
    with pytest.raises(ValueError, match="single value"):
        predict_train(prm, 16, 4096.0, [0.0])
