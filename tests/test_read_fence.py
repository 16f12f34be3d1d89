"""The legacy train kernel's read wait as a mechanism of the stage model (``read_fence``). The legacy train kernel read
each burst's parameters at the burst's top; at bursts 4, 8 that read missed L1 and waited behind the program's
outstanding stores (``data.legacy_read_bursts``: records made without the preload). The model: such a burst starts
issuing, after its overhead, only once the program's own stores in the stage have drained
(``simulate_stage(read_fence=...)``, ``predict_train(read_fence=...)``); ``stage_fit.observations`` marks the bursts of
records made that way and the fit and the never-fitted scores simulate them so. ``predict_train`` without
``read_fence`` is the clean kernel."""
import dataclasses

import numpy as np
import pandas as pd
import pytest

from xstage import data, model, records, stage_fit, stage_programs_analysis

KIB = 1024


def _alone(**kw):
    # r = 1024 / 20 = 51.2 B/ns, D = 10 B/ns, a stage far larger than any burst here, equal shares
    v = dict(issue_ns_per_kib=20.0, drain_gbps=10.0, capacity_kib=1e6, capacity_per_program_kib=1e5, spread=0.0,
             overhead_ns=100.0, stalled_fraction=1.0, base_capacity_kib=0.0, arbitration="slots")
    v.update(kw)
    return model.StageParams(**v)


def test_a_fenced_burst_waits_for_the_program_own_stores_to_drain():
    prm = _alone()
    b0, b1, o, r, D = 64 * KIB, 8 * KIB, 100.0, 51.2, 10.0
    t0 = b0 / r                                   # burst 0's issue: 1280 ns
    q = b0 - D * t0 - D * o                       # its stores left once burst 1's overhead is over
    got = model.predict_train(prm, 1, [b0, b1], [0.0, 0.0], read_fence=[1])
    assert got == pytest.approx([o + t0, o + q / D + b1 / r], rel=1e-9)
    clean = model.predict_train(prm, 1, [b0, b1], [0.0, 0.0])
    assert clean == pytest.approx([o + t0, o + b1 / r], rel=1e-9)


def test_a_fence_after_a_drained_stage_costs_nothing():
    prm = _alone()
    b, g = [64 * KIB, 8 * KIB, 8 * KIB], [1e6, 1e6, 0.0]   # the gaps outlast every drain
    assert np.array_equal(model.predict_train(prm, 4, b, g, read_fence=[1, 2]), model.predict_train(prm, 4, b, g))


def test_an_all_false_fence_is_no_fence_and_sync_rows_never_fence():
    prm = model.load_params(data.machine_dir("h200x1"), "host")
    rng = np.random.default_rng(0)
    P = np.array([16, 66, 132, 264])
    b = rng.integers(1, 160, (4, 10)) * 2.0 * KIB
    g = rng.uniform(0, 50_000, (4, 10))
    base = model.simulate_stage(prm, P, b, g, [False, False, True, True])
    none = model.simulate_stage(prm, P, b, g, [False, False, True, True], read_fence=np.zeros((4, 10), bool))
    for x, y in zip(base, none):
        assert np.array_equal(x, y, equal_nan=True)
    f = np.zeros((4, 10), bool)
    f[:, [4, 8]] = True
    fenced = model.simulate_stage(prm, P, b, g, [False, False, True, True], read_fence=f)
    for x, y in zip(base, fenced):   # the sync rows (2, 3) are unchanged: the sweeps' kernel reads nothing
        assert np.array_equal(x[2:], y[2:], equal_nan=True)
    s0, e0, _ = base
    s1, e1, _ = fenced
    first = np.nanmin(s0[:2, :, 4], axis=1)[:, None, None]          # until the first program reaches a fence
    before = e0[:2, :, :4] <= first
    assert before.sum() > 20 and np.array_equal(e0[:2, :, :4][before], e1[:2, :, :4][before])
    # (to rounding: the same wait measured from another start time differs in its last bits)
    assert (np.nanmedian(e1[:2, :, 4] - s1[:2, :, 4]) >= np.nanmedian(e0[:2, :, 4] - s0[:2, :, 4]) * (1 - 1e-12))


def test_bad_fences_are_refused():
    prm = model.load_params(data.machine_dir("h200x1"), "host")
    with pytest.raises(ValueError, match="outside"):
        model.predict_train(prm, 16, [2048] * 4, [0] * 4, read_fence=[4])
    with pytest.raises(ValueError, match="free-running"):
        model.predict_train(prm, 16, [2048] * 4, [0] * 4, sync=True, read_fence=[1])
    with pytest.raises(ValueError, match="shape"):
        model.simulate_stage(prm, [16], np.ones((1, 4)), np.zeros((1, 4)), [False], read_fence=np.ones((1, 3), bool))
    with pytest.raises(ValueError, match="own stores"):
        model.predict_train(dataclasses.replace(prm, arbitration="pool"), 16, [2048] * 6, [0] * 6, read_fence=[4])


def test_the_observations_mark_the_legacy_bursts_of_the_train_records_only():
    obs = stage_fit.observations(data.machine_dir("h200x1"), "host")
    tr = (obs.cfgs.kind == "train").to_numpy()
    assert obs.read_fence[tr][:, [4, 8]].all()                          # the fitted record predates the preload
    assert obs.read_fence[tr].sum() == 2 * tr.sum()
    assert not obs.read_fence[~tr].any()                                 # the regular sweeps' kernel reads nothing
    sub = obs.take(np.flatnonzero(tr)[:3])
    assert sub.read_fence.shape == (3, obs.measured.shape[1]) and sub.read_fence[:, 4].all()


def test_the_fence_predicts_the_never_fitted_probes_4_and_8():
    """a run's probe trains (never fitted): eleven identical 2 KiB probes, of which only 4 and 8 wait (up to 49 us).
    Without the fence the model gives them the other probes' 0.14 us; with it, the median program within a factor
    of ~1.5 (median |ln(model / measured)| over the configurations where the probe took >= 1 us)."""
    from xstage import stage_programs_analysis

    prm = model.load_params(data.machine_dir("h200x1"), "host")
    pp, meta = data.load(data.machine_dir("h200x1") / stage_programs_analysis.TRAIN_PROBE, data.BURST_PROGRAM)
    t = stage_programs_analysis.read_fence_probes(pp, meta, prm)
    assert len(t) >= 40 and set(t.burst) == {4, 8}
    assert t.log_ratio_fence.abs().median() < 0.5 and t.log_ratio.abs().median() > 2.0
    # a record made with the preload has nothing to check
    with pytest.raises(ValueError, match="no legacy read"):
        stage_programs_analysis.read_fence_probes(pp, {"params": {"source": "gpu", "grid": {"preload": True}}}, prm)


LEGACY = {"params": {"source": "gpu", "grid": {}}}   # a sidecar of a record made before the preload


def _pp(rng, scale_at=None, factor=1.0):
    rows = []
    for P in (16, 132):
        for rep in range(3):
            for prog in range(4):
                for k in range(12):
                    v = float(rng.uniform(2000, 4000)) * (factor if scale_at and k in scale_at else 1.0)
                    rows.append(dict(train="s0-00", target="host", programs=P, repeat=rep, program=prog, burst=k,
                                     burst_bytes=2 ** (k % 6 + 1) * KIB, issue_ns=v))
    return pd.DataFrame(rows)


def test_preload_ab_finds_a_wait_at_the_read_bursts_only():
    """a run's analysis on hand-built records: the legacy record is the preload one with bursts 4 and 8 made 1.5x
    slower; the A/B says 1.5 there and 1 elsewhere. Shuffling which bursts are slowed moves the finding with them."""
    from xstage import stage_programs_analysis

    rng = np.random.default_rng(1)
    pre = _pp(rng)
    leg = pre.copy()
    leg.loc[leg.burst.isin([4, 8]), "issue_ns"] *= 1.5
    rows, per = stage_programs_analysis.preload_ab(leg, LEGACY, pre, min_programs=66)
    per = per.set_index("burst")
    assert per.loc[[4, 8], "median_ratio"].tolist() == pytest.approx([1.5, 1.5])
    assert per.drop(index=[4, 8]).median_ratio.tolist() == pytest.approx([1.0] * 10)
    assert per.loc[[4, 8], "legacy_read"].all() and not per.drop(index=[4, 8]).legacy_read.any()
    assert set(rows.programs) == {16, 132} and (per.rows == 1).all()   # per burst: the P = 132 grid only
    made_with_preload = {"params": {"source": "gpu", "grid": {"preload": True}}}   # the flags follow the sidecar
    assert not stage_programs_analysis.preload_ab(leg, made_with_preload, pre)[1].legacy_read.any()
    leg2 = pre.copy()
    leg2.loc[leg2.burst.isin([3, 5]), "issue_ns"] *= 1.5
    per2 = stage_programs_analysis.preload_ab(leg2, LEGACY, pre)[1].set_index("burst")
    assert per2.loc[[4, 8], "median_ratio"].tolist() == pytest.approx([1.0, 1.0])
    with pytest.raises(ValueError, match="share no"):
        stage_programs_analysis.preload_ab(leg.assign(train="other"), LEGACY, pre)


def test_the_cli_predicts_with_a_read_fence_and_refuses_a_bad_one(capsys):
    from xstage.cli import main

    args = ["predict", "--data", str(data.machine_dir("h200x1")), "--link", "host", "--programs", "132",
            "--burst-kib", "8,2,2,2,2,2", "--gap-us", "0.5,3,3,3,3,3"]
    assert main(args) == 0
    clean = [float(x) for x in capsys.readouterr().out.splitlines()[-1].split()]
    assert main(args + ["--read-fence", "4"]) == 0
    fenced = [float(x) for x in capsys.readouterr().out.splitlines()[-1].split()]
    prm = model.load_params(data.machine_dir("h200x1"), "host")
    want = model.predict_train(prm, 132, [8 * KIB] + [2 * KIB] * 5, [500.0] + [3000.0] * 5, read_fence=[4])
    assert fenced == pytest.approx(want, abs=0.06) and fenced[4] > 10 * clean[4]
    assert fenced[:4] == clean[:4]
    assert main(args + ["--read-fence", "6"]) == 2
    assert "outside 0..5" in capsys.readouterr().err


def test_preload_ab_sizes_and_burst_train_rows():
    """The size table of the A/B: a wait put on the small bursts alone (outside the read bursts) shows in the
    small class only; the same A/B from burst_train rows (each run's median program) gives the same ratios."""
    from xstage import stage_programs_analysis

    rng = np.random.default_rng(2)
    pre = _pp(rng)
    small = pre.burst_bytes <= 8 * KIB
    assert small.any() and (~small).any()
    leg = pre.copy()
    leg.loc[small & ~leg.burst.isin([4, 8]), "issue_ns"] *= 1.4
    rows, _ = stage_programs_analysis.preload_ab(leg, LEGACY, pre, min_programs=16)
    by = stage_programs_analysis.preload_ab_sizes(rows, min_ns=0.0).set_index("kib")
    assert by.loc["(0.0, 8.0]", "median_ratio"].tolist() == pytest.approx([1.4] * 2)
    assert by.drop(index="(0.0, 8.0]").median_ratio.tolist() == pytest.approx([1.0] * (len(by) - 2))

    def as_train(pp):   # burst_train rows: one per (run, burst), issue_ns each run's median program
        return (pp.groupby(["train", "target", "programs", "repeat", "burst"], as_index=False)
                .agg(burst_bytes=("burst_bytes", "first"), issue_ns=("issue_ns", "median")))
    rows2, per2 = stage_programs_analysis.preload_ab(as_train(leg), LEGACY, as_train(pre), min_programs=16)
    assert rows2.ratio.to_numpy() == pytest.approx(rows.ratio.to_numpy())


def test_load_probe_table_waits_for_the_programs_own_stores():
    """The model's wait for a load after each burst: none after a small burst on an idle link, the program's own
    drain after a large one at P = 132 (longer after the larger burst), the measured medians carried through;
    a record without load times is refused."""
    from xstage import stage_programs_analysis

    prm = model.load_params(data.machine_dir("h200x1"), "host")
    sizes, gaps = [2 * KIB, 128 * KIB, 32 * KIB], [50_000, 500, 0]
    rows = [dict(train="x", target="host", programs=P, repeat=rep, program=q, burst=k, burst_bytes=sizes[k],
                 gap_ns=gaps[k], issue_ns=1000.0 + k + rep, load_ns=200.0 + 10 * k + q)
            for P in (1, 132) for rep in range(2) for q in range(3) for k in range(3)]
    t = stage_programs_analysis.load_probe_table(pd.DataFrame(rows), prm).set_index(["programs", "burst"])
    assert t.loc[(1, 0), "model_wait_ns"] < 50                    # alone, 2 KiB drains within the load's issue
    share = prm.drain_gbps / 132                                      # one of 132 programs' share of D (bytes/ns)
    assert 0.5 < t.loc[(132, 0), "model_wait_ns"] / (2 * KIB / share) < 2
    assert t.loc[(132, 1), "model_wait_ns"] > 10_000 > t.loc[(1, 1), "model_wait_ns"]
    assert t.loc[(132, 1), "model_wait_ns"] > t.loc[(132, 2), "model_wait_ns"]
    assert t.loc[(132, 2), "load_ns"] == 221.0 and t.loc[(132, 2), "issue_ns"] == 1002.5
    with pytest.raises(ValueError, match="no load-probe rows"):
        stage_programs_analysis.load_probe_table(pd.DataFrame(rows).assign(load_ns=np.nan), prm)


def test_free_store_fits_the_clean_record_of_the_trains_and_refuses_a_missing_one(tmp_path):
    """Rung free_store (stage_fit.RUNG_TRAINS): the trains come from the clean kernel's record (no burst fenced: its
    kernel reads nothing between bursts), the regular sweeps are the folder's own; a subfolder without a
    burst_train record, or without the link's trains, is a clear error."""
    H = data.machine_dir("h200x1")
    sub = stage_fit.RUNG_TRAINS["free_store"]
    clean = stage_fit.observations(H, "host", trains=sub)
    own = stage_fit.observations(H, "host")
    tr = (clean.cfgs.kind == "train").to_numpy()
    rec, _ = data.load(H / sub, data.BURST_TRAIN)
    host = rec[rec.target == "host"]
    assert tr.sum() == host.groupby(["train", "programs"]).ngroups
    assert set(clean.cfgs.train[tr]) == set(host.train)
    assert not clean.read_fence.any()
    assert clean.sources["burst_train"]["file"].startswith(sub + "/")
    reg = ~tr
    assert (clean.cfgs[reg].reset_index(drop=True)).equals(own.cfgs[(own.cfgs.kind != "train").to_numpy()]
                                                            .reset_index(drop=True))
    med = host.groupby(["train", "programs", "burst"]).issue_ns.median()
    i = int(np.flatnonzero(tr)[0])
    t, p = clean.cfgs.train[i], int(clean.cfgs.programs[i])
    np.testing.assert_allclose(clean.measured[i, :clean.cfgs.n_bursts[i]], med.loc[(t, p)].to_numpy())
    with pytest.raises(ValueError, match="no burst_train record"):
        stage_fit.observations(H, "host", trains="no_such_record")
    local, meta = data.load(records.folder("trains", "h200x1"), data.BURST_TRAIN)   # a record of the local target only
    csv = data.start_file(tmp_path, data.BURST_TRAIN, {k: v for k, v in meta.items()
                                                            if k not in ("runs", "csv_rows", "csv_sha256")})
    data.append_rows(csv, data.BURST_TRAIN, local[local.target == "local"].head(24))
    with pytest.raises(ValueError, match="no host trains"):
        stage_fit.observations(H, "host", trains=str(tmp_path))


def _legacy_meta(**grid):
    return {"params": {"source": "gpu", "grid": grid}}


@pytest.mark.parametrize("n,want", [(12, (4, 8)), (4, ()), (5, (4,)), (13, (4, 8, 12))])
def test_legacy_read_bursts_of_a_record_made_before_the_preload(n, want):
    assert data.legacy_read_bursts(_legacy_meta(), n) == want
    assert data.legacy_read_bursts(_legacy_meta(preload=False), n) == want


def test_no_legacy_read_bursts_with_the_preload_or_from_the_model():
    assert data.legacy_read_bursts(_legacy_meta(preload=True), 12) == ()
    assert data.legacy_read_bursts({"params": {"source": "simulated", "grid": {}}}, 12) == ()
