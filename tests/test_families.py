"""The never-fitted traffic families (xstage.traffic_families, xstage.families_sweep, xstage.families_analysis) on the
CPU: Triton's interpreter writes every destination bit for bit, the sweep records every program and resumes, and
the score is the model's error (zero on the model's own numbers, the error put in otherwise)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from xstage import data, env, families_analysis as fa, model
from xstage import stage_sim_programs as spp
from xstage.families_sweep import FamiliesGrid, families_job
from xstage.ranks import EmulatedWorld
from xstage.remote_store import POISON
from xstage.traffic_families import FAMILIES, FamilyTrain, check_family_destination, families, family_buffers, launch_family

REF = data.DATA_ROOT / "h200x1"


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_writes_its_destination_bit_for_bit(family):
    P = 16 if family == "waves" else 3
    trs = families(family, programs=(P,), count=1, sm_count=4, kib=(2, 8))
    assert trs and {t.family for t in trs} == {family}
    for tr in trs:
        seed = int(torch.randint(0, 2**30, ()))   # fresh every run
        buf = torch.full((tr.dst_elems,), POISON, dtype=torch.int32)
        launch_family(buf.data_ptr(), family_buffers(tr, "cpu"), tr, seed=seed)
        check_family_destination(buf, tr, seed)


def test_a_wrong_element_is_named_by_program_and_burst():
    tr = FamilyTrain("t", "per_program", "host", 2, ((2048, 4096), (2048, 2048)), (0, 0))
    buf = torch.full((tr.dst_elems,), POISON, dtype=torch.int32)
    launch_family(buf.data_ptr(), family_buffers(tr, "cpu"), tr, seed=9)
    check_family_destination(buf, tr, 9)
    buf[tr.bases()[0, 1] + 700] += 1
    with pytest.raises(AssertionError, match="program 0, burst 1, element 700"):
        check_family_destination(buf, tr, 9)


def test_bad_family_trains_fail_before_launch():
    with pytest.raises(ValueError, match="multiples of 8192 B"):
        FamilyTrain("t", "warps", "host", 1, ((2048,),), (0,), 16, 16).validate()
    with pytest.raises(ValueError, match="one entry per program"):
        FamilyTrain("t", "staggered", "host", 2, ((2048,), (2048,)), (0,), delay_ns=(5,)).validate()
    with pytest.raises(ValueError, match="unknown nope"):
        FamiliesGrid(families=("nope",)).validate()


def test_the_sweep_records_every_program_and_resumes(tmp_path):
    g = FamiliesGrid(families=("width", "staggered", "per_program"), programs=(2,), count=1, kib=(2, 8), repeats=2)
    families_job(EmulatedWorld(1), g, str(tmp_path), env.provenance("test", {}))
    csv = tmp_path / "burst_program.csv"
    rows = data.read_rows(csv, data.BURST_PROGRAM)
    trs = g.trains(4)
    assert len(rows) == sum(t.programs * t.n_bursts * 2 for t in trs)
    per = rows[rows.train.str.startswith("perprog")]
    assert per.groupby("program").burst_bytes.sum().is_monotonic_increasing   # every program its own sizes
    raw = csv.read_bytes()
    families_job(EmulatedWorld(1), g, str(tmp_path), env.provenance("test", {}))   # resumes: nothing new
    assert csv.read_bytes() == raw


def _rows_from_model(prm, trains, scale=1.0):
    """burst_program rows whose every program's issue time is the model's (groups as programs, p10-p90 kept)."""
    out = []
    for tr in trains:
        q = fa.predict_family(prm, tr)
        P, B = tr.programs, tr.n_bursts
        x = np.interp(np.linspace(0, 1, P), [0.0, 0.1, 0.5, 0.9, 1.0], [0, 1, 2, 3, 4])   # programs -> quantiles
        levels = np.vstack([q[0], q[0], q[1], q[2], q[2]])
        issue = np.stack([np.interp(x, [0, 1, 2, 3, 4], levels[:, k]) for k in range(B)], axis=1) * scale
        out.append(pd.DataFrame({"train": tr.name, "programs": P, "rank": 0, "repeat": 0,
                                 "program": np.repeat(np.arange(P), B), "burst": np.tile(np.arange(B), P),
                                 "burst_bytes": tr.sizes().ravel(), "gap_ns": np.tile(tr.gap_ns, P),
                                 "start_ns": 0.0, "issue_ns": issue.ravel()}))
    return pd.concat(out, ignore_index=True)


def test_the_score_is_the_models_error():
    prm = model.load_params(REF, "host")
    trains = families("width", programs=(16, 66), count=1)[:2]
    exact = fa.summary(fa.score(_rows_from_model(prm, trains), prm, trains))
    assert exact.iloc[-1].median_abs_error < 0.02 and exact.iloc[-1].bursts > 0
    slow = fa.summary(fa.score(_rows_from_model(prm, trains, scale=1.25), prm, trains))
    assert abs(slow.iloc[-1].signed_median - (1 / 1.25 - 1)) < 0.02   # the model 20 % fast on 25 % slower data
    assert set(slow.family) == {"width", "all"}


def test_family_names_map_back():
    assert [fa.family_of(n) for n in ("width4-s0-00", "warps16-s0-02", "waves2-s0-00", "perprog-s0-01",
                                      "staggered-s0-00")] == ["width", "warps", "waves", "per_program", "staggered"]


def test_every_family_is_scored_as_launched():
    """per_program and staggered trains are simulated program by program (their own sizes and delays): the model's
    own spread scores ~0; a record whose sizes are not the launched train's is refused."""
    prm = model.load_params(REF, "host")
    trains = [families(f, programs=(16,), count=1)[0] for f in ("per_program", "staggered")]
    exact = fa.summary(fa.score(_rows_from_model(prm, trains), prm, trains))
    assert exact.iloc[-1].median_abs_error < 0.02 and set(exact.family) == {"per_program", "staggered", "all"}
    wrong = _rows_from_model(prm, trains[:1]).assign(burst_bytes=lambda d: d.burst_bytes * 2)
    with pytest.raises(ValueError, match="not the launched train"):
        fa.score(wrong, prm, trains)
    with pytest.raises(ValueError, match="inputs must be one of"):
        fa.predict_family(prm, trains[0], inputs="median")


def test_the_grids_time_is_the_models_on_its_own_programs():
    """makespan: rows whose every program's starts and issue times are the model's (per_program: one row per
    program) score ~0, and 10 % longer grids -10 %."""
    prm = model.load_params(REF, "host")
    tr = families("per_program", programs=(16,), count=1)[0]
    t = spp.simulate_programs(prm, tr.sizes(), tr.gap_ns)
    P, B = t.start.shape
    rows = pd.DataFrame({"train": tr.name, "programs": tr.programs, "rank": 0, "repeat": 0,
                         "program": np.repeat(t.program, B), "burst": np.tile(np.arange(B), P),
                         "start_ns": t.start.ravel(), "issue_ns": t.issue.ravel()})
    exact = fa.makespan(rows, prm, [tr])
    assert exact.trains.tolist() == [1] and exact.median_abs_error.iloc[0] < 1e-9
    longer = fa.makespan(rows.assign(start_ns=rows.start_ns * 1.1, issue_ns=rows.issue_ns * 1.1), prm, [tr])
    assert abs(longer.signed_median.iloc[0] - (1 / 1.1 - 1)) < 1e-6


def test_the_compiled_registers_set_the_resident_programs(tmp_path):
    from types import SimpleNamespace

    from xstage.families_sweep import write_kernel_regs
    from xstage.traffic_families import kernel_key

    tr = families("waves", programs=(528,), count=1)[0]
    prm = model.load_params(REF, "host")
    assert fa.kernel_regs(tmp_path) == {}                      # no file: the assumed count
    assert fa.resident(tr, prm) == spp.resident_programs(tr.num_warps, prm.sm_count, fa.FAMILY_KERNEL_REGS)
    regs = int(np.random.default_rng().integers(65, 128))     # more than 64: one 16-warp program per SM
    write_kernel_regs(tmp_path, {kernel_key(tr): SimpleNamespace(n_regs=regs, n_spills=0,
                                                                  metadata=SimpleNamespace(shared=0))})
    write_kernel_regs(tmp_path, {"s4-w1": SimpleNamespace(n_regs=20, n_spills=0, metadata=None)})   # merged
    got = fa.kernel_regs(tmp_path)
    assert got == {kernel_key(tr): regs, "s4-w1": 20}
    assert fa.resident(tr, prm, got) == spp.resident_programs(tr.num_warps, prm.sm_count, regs) == prm.sm_count
    write_kernel_regs(tmp_path, {"s8-w2": None})               # the interpreter's launch: nothing written
    assert fa.kernel_regs(tmp_path) == got
