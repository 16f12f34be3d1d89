"""The per-program stage model (xstage.model.simulate_stage / predict_train), its fit (xstage.stage_fit.fit_stage)
and its API (load_params): physical limits that must hold for any parameters, recovery of known parameters
from simulated irregular trains, and clear errors for bad input."""
import json
from dataclasses import replace

import numpy as np
import pytest

from xstage import data, model, stage_analysis, stage_fit, stage_params, stage_programs_analysis, stage_sim
from xstage import stage_sim_programs as spp
from xstage.fluid import KIB
from xstage.model import predict_train
from xstage.stage_params import StageParams
from xstage.stage_sim import simulate_stage, stage_measure

RNG = np.random.default_rng()


def random_params(**kw) -> StageParams:
    """Fresh random parameters in the range the links show (issue 10-30 ns/KiB, drain 30-500 GB/s, ...)."""
    d = dict(issue_ns_per_kib=RNG.uniform(10, 30), drain_gbps=RNG.uniform(30, 500),
             capacity_kib=RNG.uniform(500, 8000), capacity_per_program_kib=RNG.uniform(5, 200),
             spread=RNG.uniform(0.1, 0.95), overhead_ns=RNG.uniform(0, 300),
             stalled_fraction=RNG.uniform(0.1, 1.0), base_capacity_kib=RNG.uniform(0, 2000), sm_count=132,
             link="test")
    return StageParams(**{**d, **kw})


# grids whose programs all get equal shares under each arbitration with spread 0 (gpc_drain: every occupied GPC holds
# the same programs: the first 8, all in GPC 0; 128, 16 programs in each of the 8 GPCs)
EQUAL_SHARE_P = {"gpc_drain": [8, 128]}


def equal_share_p(arb, default=(16, 66, 132, 264)) -> int:
    return int(RNG.choice(EQUAL_SHARE_P.get(arb, list(default))))


def random_train(n=8):
    return (RNG.integers(1, 160, n) * 2048).astype(float), RNG.choice([0, 500, 3000, 30_000, 100_000], n).astype(float)


@pytest.mark.parametrize("arb", stage_params.ARBITRATIONS)
def test_equal_shares_and_a_synchronous_start_keep_every_program_identical(arb):
    prm = random_params(arbitration=arb, spread=0.0)
    b, g = random_train()
    start, end, _ = simulate_stage(prm, [{"gpc_drain": 128}.get(arb, 132)], b[None], g[None], [False])   # (EQUAL_SHARE_P)
    assert np.allclose(start[0], start[0, :1], rtol=1e-9, atol=1e-6)
    assert np.allclose(end[0], end[0, :1], rtol=1e-9, atol=1e-6)
    # unequal shares do drift apart (the same train, spread > 0): the measured regime. The first burst is made
    # larger than any stage (132 x 4 MiB), so it contends whatever the random parameters drew
    b = b.copy()
    b[0] = 4 * 2**20
    start, end, _ = simulate_stage(random_params(arbitration=arb, spread=0.8, drain_gbps=50.0), [132], b[None], g[None], [False])
    assert np.ptp(end[0, :, 0]) > 0


@pytest.mark.parametrize("arb", stage_params.ARBITRATIONS)
def test_a_program_alone_issues_at_its_own_rate(arb):
    prm = random_params(arbitration=arb, drain_gbps=500.0, issue_ns_per_kib=25.0)   # r = 41 GB/s < D: one program never stalls
    b, g = random_train()
    t = predict_train(prm, 1, b, g)
    assert np.allclose(t, prm.overhead_ns + b * prm.issue_ns_per_kib / KIB, rtol=1e-9)


@pytest.mark.parametrize("arb", stage_params.ARBITRATIONS)
def test_a_long_gap_makes_every_burst_cost_like_the_first(arb):
    """The stage recovers fully in a long gap: with the grid barrier (every burst starts together) and with equal
    shares, every burst costs what the first did. (Free-running with unequal shares, the programs stay staggered
    by the first burst and stop contending: later bursts are cheaper, as measured.)"""
    b = np.full(6, RNG.integers(8, 320) * 2048.0)
    P = equal_share_p(arb)   # (tpc, gpc: shares are equal only on some grids, EQUAL_SHARE_P)
    for prm, sync in ((random_params(arbitration=arb), True), (random_params(arbitration=arb, spread=0.0), False)):
        t = predict_train(prm, P, b, np.full(6, 1e9), sync=sync)
        assert np.allclose(t, t[0], rtol=1e-6), (sync, t)
    # (a first burst larger than any stage, 132 x 4 MiB, so that it contends whatever the random parameters drew)
    t = predict_train(random_params(arbitration=arb, spread=0.9, drain_gbps=40.0), 132, np.full(6, 4.0 * 2**20),
                      np.full(6, 1e9))
    assert t[-1] < t[0]


@pytest.mark.parametrize("arb", stage_params.ARBITRATIONS)
def test_a_release_barrier_drains_the_stage_and_a_relaxed_one_does_not(arb):
    """The recorded sweeps' grid barrier is a release: it returns once the stage has drained, so with no gap at
    all every synchronised burst costs what the first did. A relaxed barrier leaves the stage full: with no gap,
    a burst that overflows the stage makes the next ones slower than the first."""
    # (slots: with unequal slots the favoured programs' parts drain while the last one still issues, so
    # only equal parts leave the whole stage full at the barrier)
    prm = random_params(arbitration=arb, drain_gbps=RNG.uniform(30, 100), **({"spread": 0.0} if arb != "pool" else {}))
    P = equal_share_p(arb, (66, 132, 264))
    b = np.full(5, 4 * float(prm.capacity_bytes(P)) / P)     # every burst overflows the stage
    gap = np.zeros(5)
    rel = predict_train(prm, P, b, gap, sync=True)
    assert np.allclose(rel, rel[0], rtol=1e-6), rel
    lax = predict_train(prm, P, b, gap, sync=True, barrier="relaxed")
    assert np.isclose(lax[0], rel[0], rtol=1e-9) and np.all(lax[1:] > 1.01 * rel[0]), (rel, lax)
    # a gap long enough to drain the stage makes the two barriers agree again
    lax = predict_train(prm, P, b, np.full(5, 1e3 * float(prm.capacity_bytes(P)) / prm.drain_gbps), sync=True,
                        barrier="relaxed")
    assert np.allclose(lax, rel, rtol=1e-6)
    with pytest.raises(ValueError, match="barrier must be"):
        predict_train(prm, P, b, gap, sync=True, barrier="acquire")


@pytest.mark.parametrize("arb", stage_params.ARBITRATIONS)
def test_the_total_drain_never_exceeds_D(arb):
    """Bytes issued by time T never exceed what the stage holds plus D * T (for any finished burst). The candidate
    "slots_issuing" (not adopted) is held to C(P) + C_0: by design a program that starts a burst takes its equal
    share of the shared part C_0 while stores that idle programs put there still drain, so the stage can hold up
    to C_0 more than C(P) (its fluid limit: the idle programs' C_0 plus the issuing ones' C_0). Drawn parameters
    overshot C(P) in ~7 % of draws; none passed C(P) + C_0 in 3000."""
    prm = random_params(arbitration=arb)
    P = int(RNG.choice([16, 66, 132, 264]))
    b, g = random_train(10)
    start, end, m = simulate_stage(prm, [P], b[None], g[None], [False])
    done = [(end[0, j, k], m[0, j] * b[k]) for j in range(end.shape[1]) for k in range(len(b))
            if np.isfinite(end[0, j, k])]
    done.sort()
    t = np.array([x[0] for x in done])
    issued = np.cumsum([x[1] for x in done])
    extra = KIB * prm.base_capacity_kib if arb == "slots_issuing" else 0.0
    assert np.all(issued <= prm.capacity_bytes(P) + extra + prm.drain_gbps * t + 1e-6 * issued)


@pytest.mark.parametrize("arb", stage_params.ARBITRATIONS)
def test_sync_is_the_grids_span_and_free_running_is_faster_after_the_first_burst(arb):
    prm = random_params(arbitration=arb, spread=0.8, drain_gbps=60.0)
    b, g = np.full(8, 128 * KIB), np.full(8, 30_000.0)
    sync, free = predict_train(prm, 132, b, g, sync=True), predict_train(prm, 132, b, g)
    # (first burst: the same simulation; where it is drain-bound every program ends near the drain time and the
    # median program's issue time can exceed the grid's span by the per-burst overhead: 2 % tolerance)
    assert free[0] <= 1.02 * sync[0] and free[-1] < 0.8 * sync[-1]


def _simulated_observations(prm, n_trains=12, programs=(16, 132), noise=0.02, seed=0):
    rng = np.random.default_rng(seed)
    from xstage.remote_store import train_family

    fam = train_family(int(rng.integers(1000)), n_trains)
    rows = [(name, P, np.array(sz, float), np.array(gp, float)) for name, sz, gp in fam for P in programs]
    # plus synchronised regular trains (the sweep's role: they pin down capacity and drain)
    for P in programs:
        for kib in (8, 32, 128, 512):
            rows.append((f"sync:{P}:{kib}", P, np.full(12, kib * KIB), np.full(12, 10_000.0)))
    P = np.array([r[1] for r in rows])
    b = np.stack([r[2] for r in rows])
    g = np.stack([r[3] for r in rows])
    sync = np.array([r[0].startswith("sync") for r in rows])
    start, end, _ = simulate_stage(prm, P, b, g, sync)
    meas = stage_measure(start, end, sync) * rng.lognormal(0, noise, b.shape)
    cfgs = __import__("pandas").DataFrame({"kind": np.where(sync, "sync", "train"), "train": [r[0] for r in rows],
                                           "programs": P, "n_bursts": 12, "sm_count": 132})
    return stage_fit.Observations(cfgs, b, g, meas, {})


@pytest.mark.parametrize("rung", [pytest.param("pool", marks=pytest.mark.slow), pytest.param("stage", marks=pytest.mark.slow)])
def test_the_fit_recovers_known_parameters_from_simulated_irregular_trains(rung):
    """Each arbitration the host link's ladder fits (rung "pool": one pool; "stage": per-program slots). With slots
    the stall acts on the shared part only, so that part is made large enough to be seen (C_0 = 1 MB, as the host
    link's; with 300 KiB the fit trades phi against C_0: phi 0.19 for 0.4, docs/findings.md)."""
    arbitration = stage_fit.RUNG_ARBITRATION.get((rung, "host"), "pool")
    truth = StageParams(18.0, 80.0, 3000.0, 40.0, 0.7, 50.0, stalled_fraction=0.4, sm_count=132, link="test",
                        base_capacity_kib=1000.0 if arbitration == "slots" else 300.0, arbitration=arbitration)
    obs = _simulated_observations(truth)
    # the span's fixed cost equals the program overhead in simulated sync rows
    res = stage_fit.fit_stage(obs, "host", rung, k_folds=2, max_nfev=30)
    assert res.params.arbitration == truth.arbitration
    got = res.params
    for name in ("issue_ns_per_kib", "drain_gbps", "spread", "stalled_fraction"):
        assert getattr(got, name) == pytest.approx(getattr(truth, name), rel=0.15), name
    assert stage_fit.error_summary(res.heldout).median_abs_error.max() < 0.05


@pytest.mark.parametrize("args,match", [
    (dict(programs=0), "programs must be a whole number of programs >= 1, got 0"),
    (dict(programs=-5), "programs must be a whole number of programs >= 1, got -5"),
    (dict(programs=2.5), "programs must be a whole number"),
    (dict(programs=True), "programs must be a whole number"),
    (dict(burst_bytes=[4096, 4096], gap_ns=[0]), "one gap per burst: 2 bursts, 1 gaps"),
    (dict(burst_bytes=[], gap_ns=[]), "empty: a train needs at least one burst"),
    (dict(burst_bytes=4096), "list of sizes in bytes .* single value 4096"),
    (dict(burst_bytes=[-4096], gap_ns=[0]), r"burst_bytes must be sizes > 0 bytes, got \[-4096\]"),
    (dict(burst_bytes=[0], gap_ns=[0]), "burst_bytes must be sizes > 0"),
    (dict(gap_ns=[-1.0]), r"gap_ns must be gaps >= 0 ns .*\[-1\]"),
    (dict(gap_ns=[float("nan")]), r"gap_ns must be gaps >= 0 ns .*\[nan\]"),
    (dict(burst_bytes=[float("inf")]), "burst_bytes must be sizes > 0"),
    (dict(sync="no"), "sync must be True or False, got 'no'"),
])
def test_predict_train_rejects_bad_input(args, match):
    kw = dict(programs=4, burst_bytes=[4096], gap_ns=[0.0])
    with pytest.raises(ValueError, match=match):
        predict_train(random_params(), **{**kw, **args})


def test_predict_train_needs_stage_params():
    with pytest.raises(ValueError, match="prm must be StageParams"):
        predict_train(model.BurstGapParams.reference(), 4, [4096], [0])


@pytest.mark.parametrize("bad,match", [
    (dict(spread=1.0), "spread must be in"), (dict(drain_gbps=0.0), "drain_gbps must be positive"),
    (dict(stalled_fraction=0.0), "stalled_fraction must be in"), (dict(overhead_ns=-1.0), "overhead_ns"),
    (dict(sm_count=0), "sm_count"), (dict(base_capacity_kib=-1.0), "base_capacity_kib"),
])
def test_bad_parameters(bad, match):
    with pytest.raises(ValueError, match=match):
        random_params(**bad)


def test_load_params_errors(tmp_path):
    with pytest.raises(ValueError, match="link must be one of"):
        model.load_params(tmp_path, "pcie")
    with pytest.raises(ValueError, match="has no fit for link 'host'"):
        model.load_params(tmp_path, "host")
    with pytest.raises(ValueError, match="is not a folder"):
        model.load_params(tmp_path / "nope", "host")
    (tmp_path / "stage_fit_host.json").write_text("{")
    with pytest.raises(ValueError, match="not a stage fit"):
        model.load_params(tmp_path, "host")
    prm = random_params(link="host")
    (tmp_path / "stage_fit_host.json").write_text(json.dumps({"link": "nvlink", "params": prm.as_dict()}))
    with pytest.raises(ValueError, match="holds link 'nvlink'"):
        model.load_params(tmp_path, "host")
    (tmp_path / "stage_fit_host.json").write_text(json.dumps({"link": "host", "params": prm.as_dict()}))
    assert model.load_params(tmp_path, "host") == prm


def test_work_is_bounded():
    with pytest.raises(ValueError, match="work bound"):
        simulate_stage(random_params(), np.full(400_000, 132), np.full((400_000, 16), 4096.0),
                       np.zeros((400_000, 16)), np.zeros(400_000, bool))


def test_train_explorer_updates_and_refuses_bad_lists():
    from xstage.explorer import train_explorer

    ex = train_explorer({"host": random_params(link="host"), "nvlink": random_params(link="nvlink")}, "host", 66,
                        [64, 8], [10, 0])
    before = list(ex.figure.data[0].y)
    ex.bursts.value, ex.gaps.value = "64, 8, 320", "10, 0, 50"
    assert len(ex.figure.data[0].y) == 3 and list(ex.figure.data[0].y[:2]) != [] and "not updated" not in ex.summary.value
    ex.link.value = "nvlink"
    assert list(ex.figure.data[0].y) != before
    ex.gaps.value = "1, 2"
    assert "as many gaps as bursts" in ex.summary.value
    ex.gaps.value = "1, x, 3"
    assert "not updated" in ex.summary.value
    with pytest.raises(ValueError, match="link must be one of"):
        train_explorer({"host": random_params()}, "pcie")


def test_recorded_fits_load_and_predict():
    """The committed fits of both links load (their records unchanged since), predict, and say where the
    onset is by the same rule as the measurement."""
    from xstage import sources, stage_analysis

    fits = stage_analysis.stage_fits()
    for link in ("nvlink", "host"):
        prm = model.load_params(data.machine_dir(sources.LINK_MACHINES[link]), link)
        t = predict_train(prm, 132, [64 * KIB, 8 * KIB], [10_000, 0])
        assert t.shape == (2,) and np.all(t > 0)
        on = stage_analysis.onset_model_vs_measured(fits[(link, "stage")])
        assert set(on.columns) >= {"measured_onset_kib", "model_onset_kib", "ratio"} and len(on) >= 4
    err = stage_analysis.stage_errors(fits)
    assert set(err.kind) >= {"sync", "free", "train"} and (err.median_abs_error >= 0).all()


def test_measured_drain_from_the_fenced_record(tmp_path):
    """The host link's drain measured directly (long bursts, each fenced): one value per program count, the
    median of them fixed in the fit with their range as its interval; no record, no measured drain."""
    from xstage.data import machine_dir

    d = stage_fit.measured_drain(machine_dir("h200x1"), "host")
    assert d is not None and d["low"] <= d["drain_gbps"] <= d["high"] and len(d["programs"]) >= 4
    assert 20 < d["drain_gbps"] < 80   # PCIe Gen5 x16: the copy engine's D2H copy runs at ~55 GB/s
    assert stage_fit.measured_drain(tmp_path, "host") is None
    assert stage_fit.measured_drain(machine_dir("h200x2"), "nvlink") is None


def test_own_slots_let_the_favoured_programs_pass_a_full_stage():
    """Just past the onset (the grid's burst 5-15 % over C(P)), per-program slots let the favoured programs through
    much earlier than the rest (the recorded host first bursts: p10 unimpeded, a tail 10-40x slower), where one
    pool slows every program alike (its weights only share the drain). Random parameters, spread >= 0.3; with the
    host link's rung stage (the slots arbitration, its full model through) the favoured programs finish
    unimpeded. (The full model since, free_store, slows its fastest program 2.4x there: docs/findings.md.)"""
    prm = random_params(spread=RNG.uniform(0.3, 0.9), drain_gbps=RNG.uniform(30, 100))
    P = int(RNG.choice([66, 132]))
    b = RNG.uniform(1.05, 1.15) * float(prm.capacity_bytes(P)) / P
    unimpeded = prm.overhead_ns + b / prm.program_rate
    got = {}
    for arb in stage_params.ARBITRATIONS:
        start, end, _ = simulate_stage(replace(prm, arbitration=arb), [P], np.array([[b]]), np.zeros((1, 1)),
                                       [False])
        got[arb] = (end - start)[0, :, 0] / unimpeded
    spread = {arb: t.max() / t.min() for arb, t in got.items()}
    assert got["slots"].min() < got["pool"].min() and spread["slots"] > spread["pool"], got
    assert got["pool"].min() > 1.5 and spread["pool"] < 1.5, got   # one pool: every program waits, alike
    from xstage.data import machine_dir

    host = stage_fit.read_stage_fit(machine_dir("h200x1"), "host", "stage")["params"]
    prm = StageParams(**host)
    assert prm.arbitration == stage_fit.RUNG_ARBITRATION[("stage", "host")] == "slots"
    b = 1.05 * float(prm.capacity_bytes(132)) / 132
    start, end, _ = simulate_stage(prm, [132], np.array([[b]]), np.zeros((1, 1)), [False])
    t = (end - start)[0, :, 0] / (prm.overhead_ns + b / prm.program_rate)
    assert t.min() < 1.0 + 1e-6 and t.max() > 5, t


def _program_rows(favoured_sms, persistent: bool, seed: int, programs: int = 16, bursts: int = 6, repeats: int = 3):
    """Per-program rows (schema burst_program) of contended bursts: every burst's issue times are drawn afresh,
    and the programs on ``favoured_sms`` take half as long (persistent) or a random half do (not)."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    rows = []
    sms = np.arange(programs) * 2
    for rep in range(repeats):
        for b in range(bursts):
            base = rng.uniform(180e3, 220e3, programs)            # 64 KiB per program, ~50x its unimpeded issue
            fav = np.isin(sms, favoured_sms) if persistent else rng.permutation(np.isin(sms, favoured_sms))
            issue = np.where(fav, base / 2, base)
            rows.append(pd.DataFrame({"train": "t", "target": "host", "programs": programs, "store_bytes": 16,
                                      "n_bursts": bursts, "rank": 0, "repeat": rep, "program": np.arange(programs),
                                      "smid": sms, "burst": b, "burst_bytes": 64 * KIB, "gap_ns": 0,
                                      "start_ns": 0.0, "issue_ns": issue}))
    return pd.concat(rows, ignore_index=True)


def test_program_favour_finds_the_favoured_sms_and_whether_they_stay_so():
    """A quarter of 64 SMs favoured in every burst: their within-group order is random, so the per-SM favour's
    Spearman between repeats is the between-group share of the rank variance, 192 / 341.25 = 0.56 (sd ~0.04 over
    draws); favoured afresh in every burst it is 0 (sd ~0.05). (With 16 SMs, sd ~0.07, a bar of 0.5 failed 17 %
    of draws.) 96 shuffled bursts: an SM favoured in half of them, the only way its median favour passes 1.5, has
    odds ~1e-8."""
    from xstage import stage_analysis, stage_programs_analysis

    fav = list(np.random.default_rng().choice(np.arange(64) * 2, 16, replace=False))
    per_sm, summ = stage_programs_analysis.program_favour(_program_rows(fav, True, seed=int(RNG.integers(1 << 31)), programs=64))
    got = per_sm.sort_values("rel", ascending=False).smid.head(len(fav))
    assert sorted(got) == sorted(fav)
    assert summ.favoured_share.iloc[0] == 0.25 and summ.persistence_across_repeats.iloc[0] > 0.3
    assert summ.next_burst_rank_spearman.iloc[0] > 0.3
    _, shuffled = stage_programs_analysis.program_favour(_program_rows(fav, False, seed=int(RNG.integers(1 << 31)), programs=64,
                                                       bursts=24, repeats=4))
    assert abs(shuffled.persistence_across_repeats.iloc[0]) < 0.3
    assert abs(shuffled.next_burst_rank_spearman.iloc[0]) < 0.3
    assert shuffled.favour_max.iloc[0] < 1.5           # nobody is favoured in every burst


@pytest.mark.parametrize("sub", ["train_programs", "train_programs_p"])
def test_program_favour_of_the_recorded_trains(sub):
    from xstage import stage_analysis, stage_programs_analysis

    pp, meta = stage_programs_analysis.train_programs_data(sub=sub)
    assert meta["params"]["grid"]["per_program"] and pp.smid.between(0, meta["sm_count"] - 1).all()
    per_sm, summ = stage_programs_analysis.program_favour(pp)
    grid = set(meta["params"]["grid"]["programs"])   # a lone program never shares the drain: no contended burst
    assert set(summ.programs) <= grid and {p for p in grid if p >= 16} <= set(summ.programs)
    assert (summ.sms == np.minimum(summ.programs, meta["sm_count"])).all()
    assert np.isfinite(summ.drop(columns="programs").to_numpy(float)).all()


def test_record_floor_measures_what_a_second_record_reproduces(tmp_path, monkeypatch):
    """Two records of the same trains: identical ones agree exactly, one whose every issue time is 1.25x gives
    0.25 at every program count; on the recorded data, processes in one call agree closer at 16 programs than
    records from two calls (S8-1 against S7-1)."""
    import shutil

    import pandas as pd

    from xstage import data, stage_analysis, stage_programs_analysis

    rec = stage_analysis.record_floor()
    by = rec.groupby(["kind", "programs"]).median_abs_ratio.median()
    assert by[("processes, one call", 16)] < by[("records, two calls", 16)]
    assert (rec.within_repeats < rec.median_abs_ratio + 0.05).all()

    src = data.machine_dir("h200x1") / stage_analysis.TRAIN_PROCESSES[0]
    root = tmp_path / "h200x1"
    for i, factor in enumerate((1.0, 1.0, 1.25)):
        dst = root / stage_analysis.TRAIN_PROCESSES[i]
        dst.mkdir(parents=True)
        df, meta = data.load(src, data.BURST_TRAIN)
        for c in [c for c in df.columns if c.startswith("issue") and c.endswith("_ns")]:
            df[c] = df[c] * factor
        df.to_csv(dst / "burst_train.csv", index=False)
        shutil.copy(data.paths(src, data.BURST_TRAIN)[1], dst / "burst_train.json")
        data.seal(dst, data.BURST_TRAIN)
    monkeypatch.setattr(data, "DATA_ROOT", tmp_path)
    f = stage_analysis.record_floor().set_index(["pair", "programs"]).median_abs_ratio
    same = f.loc["S8-1 process 0 / S8-1 process 1"]
    scaled = f.loc["S8-1 process 0 / S8-1 process 2"]
    assert (same == 0).all() and np.allclose(scaled, 0.25) and len(scaled) == 3


def test_scores_by_programs_of_one_record_sum_over_program_counts():
    """The current record of trains at new program counts, scored per program count and over all (programs = 0):
    the all-row's burst count is the sum of its program counts'."""
    from xstage import stage_analysis

    s = stage_analysis.scores_by_programs("host", records=("train_programs_new_p_clean",))
    assert set(s.record) == {"train_programs_new_p_clean"} and (s.programs > 0).sum() >= 4
    assert s[s.programs == 0].bursts.iloc[0] == s[s.programs > 0].bursts.sum()
    assert (s.median_abs_error >= 0).all() and (s.p90_abs_error >= s.median_abs_error).all()


@pytest.mark.slow
def test_scores_by_programs_covers_every_never_fitted_record():
    """Every never-fitted train record scores per program count and over all (programs = 0); the all-row's
    burst count is the sum of its program counts'."""
    from xstage import stage_analysis, stage_programs_analysis

    s = stage_analysis.scores_by_programs("host")
    present = {r for r in stage_analysis.SCORED_TRAIN_RECORDS
               if data.paths(data.machine_dir("h200x1") / r, data.BURST_TRAIN)[0].is_file()}
    assert set(stage_analysis.SCORED_TRAIN_RECORDS[:4]) <= present == set(s.record)
    for rec, g in s.groupby("record"):
        assert g[g.programs == 0].bursts.iloc[0] == g[g.programs > 0].bursts.sum()
        assert (g.median_abs_error >= 0).all() and (g.p90_abs_error >= g.median_abs_error).all()


def test_dispatch_order():
    """The dispatch order measured on the host link's per-program records: the last 4 TPCs first (even SMs, then
    odd), then one SM of every other TPC, then their other SMs; every SM once per pass."""
    order = stage_params.dispatch_order(132)
    assert sorted(order) == list(range(132))
    assert list(order[:10]) == [124, 126, 128, 130, 125, 127, 129, 131, 0, 2]
    assert list(order[8 + 62:8 + 64]) == [1, 3]
    pp, _ = stage_programs_analysis.train_programs_data(sub="train_programs_p")
    first = pp[(pp.burst == 0) & (pp.repeat == 0)].drop_duplicates(["programs", "program"]).sort_values("program")
    for P in (8, 16, 66, 132):   # the recorded grids: the first 8 and the TPC occupancy as dispatch_order says
        sm = first[first.programs == P].smid.to_numpy()
        assert sorted(sm[:8]) == list(range(124, 132))
        occ = np.bincount(sm // 2, minlength=66)
        want = np.bincount(order[np.arange(P) % 132] // 2, minlength=66)
        assert sorted(occ) == sorted(want), P


def test_gpc_map():
    """The model's GPC map is the recorded one (data/h200x1/gpc_map: SMs that share a cluster of >= 4 share a GPC;
    the SMs outside every such cluster in GPC 0)."""
    from xstage import data, stage_analysis, stage_programs_analysis

    rec = stage_programs_analysis.gpc_map(data.machine_dir("h200x1") / "gpc_map" / "gpc_map.jsonl")
    clustered = rec[rec.gpc >= 0]
    for _, g in clustered.groupby("gpc"):                       # one recorded group is one model GPC
        assert len(set(stage_params.GPC_OF_SM[g.smid])) == 1
    assert clustered.groupby(stage_params.GPC_OF_SM[clustered.smid]).gpc.nunique().max() == 1   # and no two groups merge
    outside = rec.smid[rec.gpc < 0].to_numpy()                  # TPCs 60-65: the head's four in GPC 0, 60-61 not
    assert sorted(outside) == list(range(120, 132))
    assert (stage_params.GPC_OF_SM[124:132] == 0).all() and (stage_params.GPC_OF_SM[120:124] != 0).all()
    assert np.bincount(stage_params.GPC_OF_SM[::2]).max() <= 9       # TPCs per GPC: at most 9 on a Hopper GPC
    with pytest.raises(ValueError, match="needs the measured GPC map"):
        random_params(arbitration="gpc_drain", sm_count=114)


def test_gpc_shares_let_the_lone_programs_of_a_gpc_finish_first():
    """P = 16 under the drain shared per GPC (spread 0): the 7 programs alone in their GPC finish a contended burst
    before the 9 of GPC 0, as measured (stage_programs_analysis.favour_by_gpc); equal slots shares keep all 16 together."""
    b = np.full((1, 1), 4.0 * 2**20)             # 16 x 4 MiB: contends whatever the random parameters drew
    for arb, apart in (("gpc_drain", True), ("slots", False)):
        _, end, m = simulate_stage(random_params(arbitration=arb, spread=0.0, drain_gbps=40.0), [16], b,
                                   np.zeros((1, 1)), [False])
        t = end[0, m[0] > 0, 0]
        assert (np.ptp(t) > 0.2 * t.max()) == apart, (arb, t)


def test_first_burst_capacity_and_placement_share_of_the_recorded_trains():
    """The recorded first bursts: the capacity they show per program count (fitted D, r, o) and the share a
    program gets by its placement. Both read the recorded files; both can fail if the records or the model's
    placement rule change."""
    from xstage import stage_analysis, stage_programs_analysis

    cap = stage_analysis.first_burst_capacity()
    assert {16, 66, 132}.issubset(set(cap.programs))
    row = cap.set_index("programs")
    assert (row.loc[[16, 66, 132], "bursts"] >= 20).all()
    # the capacity grows with the programs (16 -> 66 -> 132) and the model's C(P) is given beside it
    assert row.capacity_kib[16] < row.capacity_kib[66] < row.capacity_kib[132]
    assert np.allclose(row.model_kib, model.load_params(data.machine_dir("h200x1"), "host")
                       .capacity_bytes(row.index.to_numpy()) / KIB)
    pp, _ = stage_programs_analysis.train_programs_data(sub="train_programs_p")
    sh = stage_programs_analysis.placement_share(pp, first=True).set_index(["programs", "on_sm", "on_tpc"])
    # first bursts: a program sharing its TPC drains slower than one alone on its TPC (P = 16 .. 66)
    for P in (16, 32, 48, 66):
        assert sh.rel_median[(P, 1, 2)] < sh.rel_median[(P, 1, 1)], P
    assert sh.weight[(16, 1, 2)] == 0.5 and sh.weight[(16, 1, 1)] == 1.0


def test_the_free_running_measure_is_the_median_program_over_groups_of_unequal_size():
    """stage_measure with ``m`` (programs per group): the median over programs, as np.median of the groups' times
    repeated by their programs; equal groups keep the median over groups (every arbitration's fits unchanged)."""
    rng = np.random.default_rng()
    for _ in range(50):
        G, n = int(rng.integers(1, 9)), int(rng.integers(1, 5))
        m = rng.integers(1, 20, G).astype(float)
        x = rng.uniform(1, 1e4, (G, n))
        start = np.zeros((1, G, n))
        got = stage_measure(start, x[None], [False], m[None])[0]
        want = [np.median(np.repeat(x[:, k], m.astype(int))) for k in range(n)]
        assert np.allclose(got, want, rtol=1e-12), (m, x)
    x = rng.uniform(1, 1e4, (4, 3))
    assert np.array_equal(stage_measure(np.zeros((1, 4, 3)), x[None], [False], np.full((1, 4), 5.0))[0],
                          np.median(x, axis=0))


def _gpc_populations(P):
    order = stage_params.dispatch_order(132)
    return np.bincount(stage_params.GPC_OF_SM[order[np.arange(P) % 132]], minlength=stage_params.N_GPC)


def test_gpc_drain_groups_and_its_batches():
    """gpc_drain simulates a grid as every occupied GPC min(its programs, GPC_DRAIN_GROUPS // occupied GPCs) groups
    (one per program up to 16 per GPC), configurations of equal group counts in one batch: the batches give what one
    simulation of all GPC_DRAIN_GROUPS groups gives (the same spread levels), and fewer groups than a grid needs are
    refused."""
    assert [stage_params.gpc_drain_groups(P) for P in (1, 8, 16, 66, 132, 264)] == [1, 8, 16, 66, 128, 128]
    assert list(_gpc_populations(66)) == [12, 8, 8, 8, 8, 8, 7, 7]
    prm = random_params(arbitration="gpc_drain", spread=RNG.uniform(0.3, 0.9), drain_gbps=RNG.uniform(30, 100))
    P = np.array([1, 16, 66, 132, 66])
    b = np.stack([random_train(6)[0] for _ in P])
    b[:, 0] = 4 * 2**20                               # contends whatever the random parameters drew
    g = np.stack([random_train(6)[1] for _ in P])
    sync = np.array([False, False, False, True, True])
    s1, e1, m1 = simulate_stage(prm, P, b, g, sync)                                  # batched
    s2, e2, m2 = simulate_stage(prm, P, b, g, sync, groups=stage_params.GPC_DRAIN_GROUPS)    # all groups at once
    assert m1.shape == m2.shape == (5, stage_params.GPC_DRAIN_GROUPS) and np.array_equal(m1, m2)
    assert np.allclose(m1.sum(axis=1), P)
    assert np.array_equal(np.isnan(e1), np.isnan(e2))
    assert np.allclose(e1, e2, rtol=1e-9, equal_nan=True) and np.allclose(s1, s2, rtol=1e-9, equal_nan=True)
    with pytest.raises(ValueError, match="as up to 66 groups; got groups=32"):
        simulate_stage(prm, [66], b[:1], g[:1], [False], groups=32)
    with pytest.raises(ValueError, match="needs the measured GPC map"):
        random_params(arbitration="gpc_drain", sm_count=114)


def test_gpc_drain_own_slots_do_not_depend_on_the_gpc():
    """A hand computation. P = 66, spread 0, no shared part (C_0 = 0) and C_max >> c_p P: C(66) = 66 c_p, every
    program's own slots c_p. One burst of 0.8 c_p each enters every program's own slots unimpeded (issue time
    b / r) under gpc_drain, whatever the GPC it runs in."""
    c_p = 64.0
    prm = StageParams(issue_ns_per_kib=20.0, drain_gbps=40.0, capacity_kib=1e7, capacity_per_program_kib=c_p,
                      spread=0.0, overhead_ns=0.0, stalled_fraction=1.0, base_capacity_kib=0.0, link="test",
                      arbitration="gpc_drain")
    b = np.array([[0.8 * c_p * KIB]])
    _, end, m = simulate_stage(prm, [66], b, np.zeros((1, 1)), [False])
    t = end[0, m[0] > 0, 0]
    assert np.allclose(t, 0.8 * c_p * prm.issue_ns_per_kib, rtol=1e-6), t


def test_gpc_drain_shares_the_drain_per_gpc_holding_stores():
    """A hand computation. P = 66 (GPC 0: 12 programs, GPCs 1-5: 8, GPCs 6-7: 7), spread 0, a stage of a few bytes
    (every program drains at its share from the start), one burst of b each, r >> D. While all 8 GPCs hold stores
    each gets D / 8: GPCs 6-7's programs finish at 56 b / D; GPCs 1-5's then share D / 6 per GPC and finish at
    62 b / D; GPC 0's last at 66 b / D (every byte at D). Equal shares per program (slots, spread 0): all at 66 b / D."""
    D, b = 40.0, 256.0 * KIB
    prm = StageParams(issue_ns_per_kib=2.0, drain_gbps=D, capacity_kib=0.01, capacity_per_program_kib=0.001,
                      spread=0.0, overhead_ns=0.0, stalled_fraction=1.0, base_capacity_kib=0.0, link="test",
                      arbitration="gpc_drain")
    _, end, m = simulate_stage(prm, [66], np.array([[b]]), np.zeros((1, 1)), [False])
    e = end[0, :66, 0]
    assert list(m[0, :66]) == [1.0] * 66 and not np.any(m[0, 66:])
    assert np.allclose(e[52:], 56 * b / D, rtol=1e-3), e[52:]
    assert np.allclose(e[12:52], 62 * b / D, rtol=1e-3), e[12:52]
    assert np.allclose(e[:12], 66 * b / D, rtol=1e-3), e[:12]
    _, end_s, m_s = simulate_stage(replace(prm, arbitration="slots"), [66], np.array([[b]]), np.zeros((1, 1)), [False])
    assert np.allclose(end_s[0, m_s[0] > 0, 0], 66 * b / D, rtol=1e-3)


def test_the_fit_recovers_known_parameters_under_free_store():
    """Rung "free_store" (arbitration gpc_drain through its fast path, stage_sim._stage_units) fitted to simulated irregular trains at P = 4 / 32 (all in
    GPC 0; GPC 0 11 programs, the other GPCs 3) and synchronised regular ones: the arbitration's own parameters (issue
    time, spread, stall) come back. The stage's sizes, drain and overheads are given as measured (fixed) and the fit
    starts off the truth, to keep it under a minute (~30 s; at P = 16 / 132 and the overheads free, 100 s)."""
    truth = StageParams(18.0, 80.0, 3000.0, 40.0, 0.7, 50.0, stalled_fraction=0.4, sm_count=132, link="test",
                        base_capacity_kib=1000.0, arbitration="gpc_drain", free_kib=2.0, free_cap_kib=32.0)
    obs = _simulated_observations(truth, n_trains=4, programs=(4, 32))
    measured = {k: (getattr(truth, k),) * 3 for k in ("drain_gbps", "capacity_kib", "capacity_per_program_kib",
                                                        "base_capacity_kib", "overhead_ns", "free_kib")}
    measured["span_overhead_ns"] = (truth.overhead_ns,) * 3   # simulated sync rows: the span's fixed cost is o
    start = dict(issue_ns_per_kib=15.0, spread=0.5, stalled_fraction=0.6)
    res = stage_fit.fit_stage(obs, "host", "free_store", k_folds=2, max_nfev=10, measured=measured, start=start)
    assert res.params.arbitration == "gpc_drain"
    for name in ("issue_ns_per_kib", "spread", "stalled_fraction"):
        assert getattr(res.params, name) == pytest.approx(getattr(truth, name), rel=0.15), name
    assert stage_fit.error_summary(res.heldout).median_abs_error.max() < 0.05




# ------------------------------------------------------------------ a grid as launched (xstage.stage_sim_programs)
def _launch_params():
    return random_params(arbitration="gpc_drain", free_kib=RNG.uniform(0, 2), free_cap_kib=32.0)


def test_per_program_inputs_leave_the_old_inputs_unchanged():
    """Alike programs that start together are predict_train's grid bit for bit; the per-unit sizes, gaps and delays
    of the units' loop, given every unit the shared train and no delay, give the shared train's result bit for bit."""
    prm = _launch_params()
    b, g = random_train()
    P = int(RNG.choice([16, 66, 132, 264]))
    times = spp.simulate_programs(prm, np.tile(b, (P, 1)), g)
    s, e, m = simulate_stage(prm, [P], b[None], g[None], [False])
    np.testing.assert_array_equal(stage_measure(s, e, [False], m)[0], predict_train(prm, P, b, g))
    np.testing.assert_array_equal(times.issue, (e - s)[0][m[0] > 0])
    R = 66
    gpc = stage_params.GPC_OF_SM[stage_params.dispatch_order()[:R]]
    occ = list(dict.fromkeys(gpc.tolist()))
    lay = (np.ones(R), 1 - prm.spread * RNG.uniform(0, 1, R), np.ones(R), np.array([occ.index(c) for c in gpc]),
           np.ones(len(occ)), np.arange(R))
    args = (prm, np.array([float(R)]))
    rest = (np.zeros(1, bool), np.zeros(1, bool), [lay], R, R)
    shared = stage_sim._stage_units_run(*args, b[None], g[None], *rest)
    own = stage_sim._stage_units_run(*args, np.tile(b, (1, R, 1)), np.tile(g, (1, R, 1)), *rest, None, np.zeros((1, R)))
    np.testing.assert_array_equal(shared[0], own[0])
    np.testing.assert_array_equal(shared[1], own[1])


def test_a_two_size_grids_small_programs_finish_before_the_large():
    prm = _launch_params()
    b, g = random_train()
    P = 66
    scale = np.where(np.arange(P) % 2 == 0, 0.25, 2.0)
    t = spp.simulate_programs(prm, b[None] * scale[:, None], g)
    small, large = t.program % 2 == 0, t.program % 2 == 1
    assert small.sum() == large.sum() == P // 2 and sorted(t.program) == list(range(P))
    assert t.end[small, -1].max() < t.end[large, -1].min()
    assert (np.median(t.issue[small], axis=0) < np.median(t.issue[large], axis=0)).all()


def test_a_delayed_programs_first_burst_sees_the_stage_the_others_filled():
    prm = _launch_params()
    P, big = 132, 256 * KIB
    b = np.full((P, 1), big)
    small = max(64.0, 4 * prm.capacity_per_program_kib) * KIB   # beyond its own slots (a random c_p reaches 200 KiB)
    b[-1] = small
    first = prm.capacity_bytes(P) / prm.drain_gbps   # the others are still draining their burst then
    late = spp.simulate_programs(prm, b, [0.0], np.r_[np.zeros(P - 1), 0.2 * first])
    alone = spp.simulate_programs(prm, b, [0.0], np.r_[np.zeros(P - 1), 1e4 * first + 1e7])
    x_late, x_alone = late.issue[late.program == P - 1, 0], alone.issue[alone.program == P - 1, 0]
    assert late.start[late.program == P - 1, 0] == pytest.approx(0.2 * first)
    assert x_alone == pytest.approx(prm.overhead_ns + small / prm.program_rate, rel=0.05)   # an empty stage
    assert x_late > 3 * x_alone


@pytest.mark.parametrize("alike", [True, False])
def test_the_grids_time_grows_with_its_waves(alike):
    prm = _launch_params()
    b, g = random_train(4)
    R = 132
    ends = []
    for waves in (1, 2, 3):
        P = waves * R
        sizes = np.tile(b, (P, 1)) * (1.0 if alike else (1 + 0.5 * (np.arange(P) % 3 == 0))[:, None])
        t = spp.simulate_programs(prm, sizes, g, resident=R)
        assert t.weight.sum() == pytest.approx(P)
        if not alike:
            assert sorted(t.program) == list(range(P))
            later = t.program >= R   # a program of a later wave starts after the place's last one ended + gap
            assert (t.start[later, 0] >= g[-1] - 1e-6).all()
        ends.append(np.nanmax(t.end))
    assert ends[0] < ends[1] < ends[2]
    assert ends[2] > 2.5 * ends[0] * (0.9 if alike else 0.8)


def test_resident_programs_and_bad_launches():
    assert spp.resident_programs(4) == 132 * 16 and spp.resident_programs(16) == 132 * 4
    assert spp.resident_programs(16, regs_per_thread=64) == 264 and spp.resident_programs(16, 132, 65) == 132
    prm = _launch_params()
    for kw, match in [(dict(burst_bytes=np.ones((4, 3)), gap_ns=np.ones(2)), "burst_bytes must be"),
                      (dict(burst_bytes=np.ones((4, 2)), gap_ns=np.ones(2), delay_ns=np.ones(3)), "one entry per"),
                      (dict(burst_bytes=-np.ones((4, 2)), gap_ns=np.ones(2)), ">= 0"),
                      (dict(burst_bytes=np.ones((4, 2)), gap_ns=np.ones(2), resident=0), "resident must be")]:
        with pytest.raises(ValueError, match=match):
            spp.simulate_programs(prm, **kw)
    with pytest.raises(ValueError, match="num_warps"):
        spp.resident_programs(0)
    with pytest.raises(ValueError, match="gpc_drain"):
        spp.simulate_programs(replace(prm, arbitration="slots"), np.ones((4, 2)) * KIB, np.ones(2), np.ones(4))
