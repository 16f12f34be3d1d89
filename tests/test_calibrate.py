"""``xstage calibrate`` (xstage.calibrate) on the CPU: the plan picks recorded configurations, the simulated
calibration recovers the parameters it was made with, and bad input gets one clear line and loses nothing."""
from __future__ import annotations

import numpy as np
import pytest

from xstage import calibrate, cli, data, env, model, stage_fit

REF = data.DATA_ROOT / "h200x1"
# a small plan (seconds on a CPU): the same kinds of records as the default plan, fewer of each
SMALL = calibrate.with_plan(sync_programs=(4, 16), sync_burst_kib=(2, 256), sync_gap_us=(0,),
                            free_programs=(4, 16), free_burst_kib=(32, 128), free_gap_us=(0, 30), train_count=2,
                            train_programs=(16,), drain_programs=(16,), k_folds=2, max_nfev=1, fold_nfev=1, n_bursts=4,
                            repeats=2, polish=1)


def test_the_plan_is_a_subset_of_the_recorded_host_studies():
    obs = stage_fit.observations(REF, "host", trains=stage_fit.TRAIN_CLEAN)
    rows = calibrate.plan_rows(obs)
    plan = calibrate.CalibrationPlan()
    assert len(rows) == plan.configurations()   # every planned configuration was recorded, once
    kinds = obs.cfgs.kind.iloc[rows].value_counts().to_dict()
    assert kinds == {"sync": 24, "free": 60, "train": 48}
    # what the sweeps of the plan would run: the same configurations
    steps = {s: g for s, _, g in plan.sweeps("host")}
    assert len(steps["sync"].points(132)) == 24 and len(steps["free"].points(132)) == 60
    assert len(steps["trains"].trains()) == 48
    assert {t.name for t in steps["trains"].trains()} == set(obs.cfgs.train.iloc[rows][obs.cfgs.kind.iloc[rows]
                                                                                         == "train"])


def test_simulated_calibration_recovers_its_parameters(tmp_path):
    """The whole pipeline on the stage model with known parameters (data/h200x1's host fit): the written fit is
    what load_params reads, of the full model's rung, and its intervals cover the truth."""
    true = model.load_params(REF, "host")
    start = calibrate.reference_start(REF, "host")
    c = calibrate.run("host", tmp_path / "cal", source="simulated", params_from=REF, plan=SMALL,
                      start_from=calibrate.perturbed(start, 1.02), workers=1, progress=False)
    got = model.load_params(tmp_path / "cal", "host")
    assert got.arbitration == true.arbitration == "gpc_drain" and c.fit.rung == stage_fit.full_rung("host")
    free = [k for k in stage_fit.RUNGS[c.fit.rung] if k not in ("drain_gbps", "span_overhead_ns", "free_cap_kib")]
    covered = [c.fit.ci_low[k] <= getattr(true, k) <= c.fit.ci_high[k] for k in free]
    assert sum(covered) >= len(free) - 1, dict(zip(free, covered))
    assert abs(got.drain_gbps / true.drain_gbps - 1) < 0.05            # the drain measured, not fitted
    assert "onset of backpressure" in c.summary and (tmp_path / "cal" / calibrate.SUMMARY).is_file()


def test_the_polish_moves_where_the_cost_moves_in_steps():
    """Least squares stalls on a cost that is flat between steps (its differences are zero); the pattern search
    walks the steps down to the minimum and keeps the lower cost."""
    from scipy.optimize import least_squares

    def resid(x):   # flat between steps of 0.02, lowest at 0.3
        return np.array([np.round(x[0] / 0.02) * 0.02 - 0.3, 0.0])

    def solve(x, nfev):
        return least_squares(resid, x, diff_step=1e-3, max_nfev=nfev, bounds=([-1.0], [1.0]))

    sol = solve(np.array([0.041]), 20)
    assert abs(sol.x[0] - 0.041) < 0.01                # stalled on its step
    def resids(xs):
        return [resid(x) for x in xs]

    pol = stage_fit._polish(sol, [0], np.array([-1.0]), np.array([1.0]), 20, resids, solve)
    assert abs(pol.x[0] - 0.3) <= 0.011 and pol.cost < sol.cost
    same = stage_fit._polish(pol, [0], np.array([-1.0]), np.array([1.0]), 20, resids, solve)
    assert same is pol                                 # nothing lower nearby: the solution as it was


@pytest.mark.slow
def test_simulated_calibration_from_a_start_5_percent_away_recovers_the_truth(tmp_path):
    """The default plan on simulated data, started 5 % away: every parameter within 3 % of the truth (the
    overhead within 50 %). Least squares alone leaves the base capacity and the stall where they started (+5.6 /
    +5.8 %; the cost moves in steps there): the polish (stage_fit._polish) brings them in. (The
    Jacobian intervals do not carry the measured drain's own error, which the capacities then absorb: on this
    data they cover 7 of 10 parameters; the errors are below 1 %.)"""
    true = model.load_params(REF, "host")
    start = calibrate.perturbed(calibrate.reference_start(REF, "host"), 1.05)
    c = calibrate.run("host", tmp_path / "cal", source="simulated", params_from=REF, start_from=start, workers=2,
                      progress=False)
    free = [k for k in stage_fit.RUNGS[c.fit.rung] if k not in ("span_overhead_ns", "free_cap_kib")]
    err = {k: round(c.fit.values()[k] / getattr(true, k) - 1, 4) for k in free}
    # the harness overhead inside an issue time is weakly identified (the full records: 17-98 ns, 95 %)
    tol = {k: 0.5 if k == "overhead_ns" else 0.03 for k in free}
    assert all(abs(err[k]) < tol[k] for k in free), "; ".join(f"{k} {v:+.4f}" for k, v in err.items())


def test_no_gpu_is_one_line_before_anything_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(env, "gpu_count", lambda: 0)
    assert cli.main(["calibrate", "--link", "host", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs 1 GPU" in err[0] and "--source simulated --params-from" in err[0]
    assert not (tmp_path / "x").exists()


def test_one_gpu_for_nvlink_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(env, "gpu_count", lambda: 1)
    with pytest.raises(RuntimeError, match=r"--link nvlink needs 2 GPUs \(a peer GPU over NVLink\); 1 GPU is visible"):
        calibrate.run("nvlink", tmp_path / "x", source="gpu")
    assert not (tmp_path / "x").exists()


def test_an_unwritable_out_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="is not writable"):
        calibrate.check_out(tmp_path / "file" / "sub")
    assert cli.main(["calibrate", "--source", "simulated", "--params-from", str(REF),
                     "--out", str(tmp_path / "file" / "sub")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--out {tmp_path / 'file' / 'sub'} is not writable" in err[0]
    with pytest.raises(SystemExit):   # an existing file: the option's own check
        cli.main(["calibrate", "--source", "simulated", "--out", str(tmp_path / "file")])
    assert "is an existing file, not a folder" in capsys.readouterr().err


def test_simulated_without_params_is_one_line(tmp_path):
    with pytest.raises(ValueError, match="--params-from"):
        calibrate.run("host", tmp_path / "x", source="simulated")


def test_a_stopped_calibration_resumes_and_keeps_its_finished_rows(tmp_path, monkeypatch):
    out = tmp_path / "cal"
    real = calibrate.run_simulated

    def stop_at_trains(grid, folder, *a, **k):
        if folder.name == calibrate.TRAIN_SUB:
            raise KeyboardInterrupt
        return real(grid, folder, *a, **k)

    monkeypatch.setattr(calibrate, "run_simulated", stop_at_trains)
    with pytest.raises(KeyboardInterrupt):
        calibrate.run("host", out, source="simulated", params_from=REF, plan=SMALL, start_from=REF, workers=1,
                      progress=False)
    done = {p.relative_to(out): p.read_bytes() for p in out.rglob("*.csv")}
    assert len(done) == 3 and not (out / calibrate.TRAIN_SUB).exists()   # sync, free, drain: finished
    monkeypatch.setattr(calibrate, "run_simulated", real)
    c = calibrate.run("host", out, source="simulated", params_from=REF, plan=SMALL, start_from=REF, workers=1,
                      progress=False)
    for rel, raw in done.items():   # the finished rows stay as they were
        assert (out / rel).read_bytes() == raw
    assert (out / calibrate.TRAIN_SUB / "burst_train.csv").is_file()
    assert np.isfinite(c.fit.heldout.rel_error).all()


def test_a_parallel_fit_is_the_serial_fit():
    obs = stage_fit.observations(REF, "host", trains=stage_fit.TRAIN_CLEAN)
    rows = calibrate.plan_rows(obs, SMALL)
    start = calibrate.reference_start(REF, "host")
    start = {k: v for k, v in calibrate.perturbed(start, 1.05).items() if k in stage_fit.RUNGS["free_store"]}
    kw = dict(k_folds=2, max_nfev=1, fold_nfev=1, start=start, prescan=False, polish=1)
    a = stage_fit.fit_stage(obs.take(rows), "host", None, workers=1, **kw)
    b = stage_fit.fit_stage(obs.take(rows), "host", None, workers=2, **kw)
    for k, v in a.values().items():
        assert np.isclose(v, b.values()[k], rtol=1e-6), k


def test_cards_puts_each_written_fit_beside_the_others(tmp_path):
    import gzip
    import json

    from xstage import records

    folders = {m: records.record("calibration", m, "host").path.parent
               for m in (r.machine for r in records.records("calibration"))}
    assert len(folders) == 5
    t = calibrate.cards({"h200x1": REF, **folders})
    assert list(t.columns) == ["unit", "h200x1", *folders]
    for label, folder in folders.items():   # every cell is the written value and its interval, from the file
        f = stage_fit.read_stage_fit(folder, "host")
        for k in ("drain_gbps", "capacity_kib", "stalled_fraction"):
            v, lo, hi = f["params"][k], f["ci95_low"][k], f["ci95_high"][k]
            assert t.loc[k, label] == f"{v:.4g} ({lo:.4g}-{hi:.4g})" and lo <= v <= hi
    # a changed value in a copy of a fit shows in its column
    src = folders["h100x1"] / "stage_fit_host.json.gz"
    obj = json.loads(gzip.decompress(src.read_bytes()))
    d = float(np.random.default_rng().uniform(10, 20))
    obj["params"]["drain_gbps"] = d
    (tmp_path / "stage_fit_host.json.gz").write_bytes(gzip.compress(json.dumps(obj).encode()))
    assert calibrate.cards({"edited": tmp_path}).loc["drain_gbps", "edited"].startswith(f"{d:.4g} (")
