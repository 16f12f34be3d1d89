"""Session 20: the train kernel's legacy per-burst parameter reads (xstage.data.legacy_read_bursts). Before the
fix each burst's size / offset / gap was read at the burst's top; at bursts 4, 8 (a new 32-byte sector of the int64
arrays) the read waited behind the program's outstanding stores inside the timed issue (lab notebook, S20-1). On
request (``drop_legacy_reads``) the fit and the never-fitted scores leave those bursts out of records made that way;
records made with the preload keep them. The written fits keep every burst (the refit without them was not adopted)."""
import numpy as np
import pytest

from xstage import data, fit, records, studies


def _meta(**grid):
    return {"params": {"source": "gpu", "grid": grid}}


@pytest.mark.parametrize("n,want", [(12, (4, 8)), (4, ()), (5, (4,)), (13, (4, 8, 12))])
def test_legacy_read_bursts_of_a_record_made_before_the_preload(n, want):
    assert data.legacy_read_bursts(_meta(), n) == want
    assert data.legacy_read_bursts(_meta(preload=False), n) == want


def test_no_legacy_read_bursts_with_the_preload_or_from_the_model():
    assert data.legacy_read_bursts(_meta(preload=True), 12) == ()
    assert data.legacy_read_bursts({"params": {"source": "simulated", "grid": {}}}, 12) == ()


def test_the_fit_leaves_the_legacy_read_bursts_of_the_recorded_trains_out():
    folder = data.machine_dir("h200x1")
    _, meta = data.load(records.folder("trains", "h200x1"), data.BURST_TRAIN)
    bad = data.legacy_read_bursts(meta, 12)
    assert bad == (4, 8)                                   # the fitted record predates the preload
    kept = fit.observations(folder, "host")
    obs = fit.observations(folder, "host", drop_legacy_reads=True)
    tr = (obs.cfgs.kind == "train").to_numpy()
    assert np.isfinite(kept.measured[tr][:, list(bad)]).mean() > 0.99   # by default every burst is fitted
    assert tr.any() and np.isnan(obs.measured[tr][:, list(bad)]).all()
    keep = [k for k in range(12) if k not in bad]
    assert np.isfinite(obs.measured[tr][:, keep]).mean() > 0.99   # every other burst still measured
    # the regular sweeps (another kernel, no reads in its loop) keep every burst they have (8 each)
    n = obs.cfgs.n_bursts.to_numpy()[~tr]
    have = np.arange(obs.measured.shape[1])[None, :] < n[:, None]
    assert np.isfinite(obs.measured[~tr][have]).mean() > 0.99


def test_scores_leave_the_legacy_read_bursts_out_but_predict_them_in_their_train():
    folder = data.machine_dir("h200x1") / "independent"
    assert studies.score_trains(folder)[0].burst.isin([4, 8]).any()                 # by default: scored
    rows, _ = studies.score_trains(folder, drop_legacy_reads=True)
    assert not rows.burst.isin([4, 8]).any() and rows.burst.isin([3, 5, 9]).any()
    # the prediction of burst 5 is the one from the whole train (bursts 4 and 8 simulated, not dropped)
    from xstage.model import load_params, predict_train

    df, _ = data.load(folder, data.BURST_TRAIN)
    t = studies.trains_summary(df[df.target == "host"])
    name, p = rows.iloc[0].train, int(rows.iloc[0].programs)
    g = t[(t.train == name) & (t.programs == p)].sort_values("burst")
    full = predict_train(load_params(data.machine_dir("h200x1"), "host"), p, g.burst_bytes.to_numpy(),
                         g.gap_ns.to_numpy(), read_fence=(4, 8))
    got = rows[(rows.train == name) & (rows.programs == p)].set_index("burst").predicted_ns
    assert np.allclose(got.to_numpy(), full[got.index.to_numpy()])


def test_the_cli_refuses_to_write_a_fit_without_the_legacy_read_bursts(capsys):
    from xstage.cli import main

    assert main(["fit", "--data", str(data.machine_dir("h200x1")), "--link", "host", "--drop-legacy-reads",
                 "--write"]) == 2
    assert "is an experiment" in capsys.readouterr().err
