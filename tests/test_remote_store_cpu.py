"""The burst-gap kernel under Triton's CPU interpreter with emulated ranks: every destination holds exactly
the bytes its sender stored (poisoned first, fresh random seeds), for 2, 4 and 8 ranks; the compiled kernel
issues stores of the width asked for; bad parameters fail before any launch."""
import json
import os
import random
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from xstage import burst_gap_sweep as sweep
from xstage import cli
from xstage.ranks import EmulatedWorld
from xstage import data
from xstage.remote_store import (POISON, BurstGapPoint, BurstTrain, burst_gap_buffers, check_destination,
                                 check_train_destination, launch_burst_gap, payload_reference, train_family)

pytestmark = pytest.mark.interpreter


@pytest.mark.parametrize("world_size", [2, 4, 8])
@pytest.mark.parametrize("target", ["remote", "host", "local"])
@pytest.mark.parametrize("store_bytes", [4, 8, 16])
def test_destinations_bit_exact(world_size, target, store_bytes):
    programs, kib, bursts = random.choice([(1, 1, 3), (3, 2, 2), (5, 1, 2)])
    p = BurstGapPoint(target, programs, kib * 1024, 0, store_bytes, bursts, False, True)
    world = EmulatedWorld(world_size)
    dests = sweep.allocate(world, p.dst_elems, {target})
    sweep.check_point(world, dests, p, seed=random.randrange(2**31))


@pytest.mark.parametrize("target", ["host", "local"])
def test_one_rank_world_for_the_host_link(target):
    p = BurstGapPoint(target, 3, 2048, 0, 16, 2, False, True)
    world = EmulatedWorld(1)
    dests = sweep.allocate(world, p.dst_elems, {target})
    sweep.check_point(world, dests, p, seed=random.randrange(2**31))
    with pytest.raises(ValueError, match="target 'remote' needs world_size >= 2"):
        sweep.BurstGapGrid(targets=("remote",), world_size=1).validate()
    sweep.BurstGapGrid(targets=("host", "local"), world_size=1, burst_kib=(1,), gap_us=(0,)).validate()


@pytest.mark.parametrize("preload", [True, False])
@pytest.mark.parametrize("world_size,target", [(1, "host"), (1, "local"), (2, "remote"), (4, "remote")])
def test_train_destinations_bit_exact(world_size, target, preload):
    """Irregular train (sizes and gaps as data): every burst of every program lands bit for bit, whether the
    kernel reads the bursts' parameters before the first burst (preload, padded to a power of two) or at each."""
    seed = random.randrange(2**31)
    name, sizes, gaps = train_family(random.randrange(1000), 1, n_bursts=random.choice([3, 5]), kib=(2, 8))[0]
    tr = BurstTrain(name, target, random.choice([1, 3]), sizes, gaps)
    world = EmulatedWorld(world_size)
    dests = sweep.allocate(world, tr.dst_elems, {target})
    sweep.check_train(world, dests, tr, seed, preload=preload)


def test_check_train_destination_names_burst_program_element():
    tr = BurstTrain("t", "local", 3, (2048, 4096), (0, 0))
    dst = payload_reference(0, tr.dst_elems, 7).clone()
    check_train_destination(dst, tr, 7)
    dst[3 * 512 + 1024 + 9] ^= 1                          # burst 1, program 1, element 9
    with pytest.raises(AssertionError, match="first at burst 1, program 1, element 9"):
        check_train_destination(dst, tr, 7)


def test_train_family_is_seeded_and_in_range():
    a, b = train_family(3, 5), train_family(3, 5)
    assert a == b and a != train_family(4, 5)
    sizes = [s for _, ss, _ in a for s in ss]
    gaps = [g for _, _, gs in a for g in gs]
    assert min(sizes) >= 2048 and max(sizes) <= 320 * 1024 and all(s % 2048 == 0 for s in sizes)
    assert 0 in gaps and max(gaps) <= 100_000 and min(g for g in gaps if g) >= 500


def test_probe_family_is_a_lead_burst_then_probes_for_every_lead_and_gap():
    from xstage.remote_store import PROBE_GAP_US, PROBE_LEAD_KIB, PROBE_SPACING_US, probe_family

    fam = probe_family()
    assert len(fam) == len(PROBE_LEAD_KIB) * len(PROBE_GAP_US) and len({n for n, _, _ in fam}) == len(fam)
    seen = set()
    for name, sizes, gaps in fam:
        assert len(sizes) == len(gaps) == 12 and all(s % 2048 == 0 for s in sizes)
        assert set(sizes[1:]) == {2048} and set(gaps[1:]) == {PROBE_SPACING_US * 1000}
        seen.add((sizes[0] // 1024, gaps[0] / 1000))
        assert name == f"p{sizes[0] // 1024}-g{gaps[0] / 1000:g}"
    assert seen == {(a, g) for a in PROBE_LEAD_KIB for g in PROBE_GAP_US}
    with pytest.raises(ValueError, match="at least one probe"):
        probe_family(n_bursts=1)


def test_train_grid_family_selects_the_trains_and_rejects_an_unknown_one(tmp_path):
    from xstage.remote_store import probe_family

    grid = sweep.TrainGrid(family="probe", programs=(2, 3), targets=("host",), repeats=1)
    grid.validate()
    assert [(t.name, t.burst_bytes, t.gap_ns) for t in grid.trains() if t.programs == 2] == probe_family()
    assert sweep.TrainGrid(count=2).trains()[0].name.startswith("s0-")      # the seeded family by default
    with pytest.raises(ValueError, match="family must be one of"):
        sweep.TrainGrid(family="probes").validate()


@pytest.mark.parametrize("bad,match", [
    (dict(burst_bytes=(2048, 1000), gap_ns=(0, 0)), "multiples of 2048"),
    (dict(burst_bytes=(2048,), gap_ns=(0, 0)), "same"),
    (dict(burst_bytes=(2048,), gap_ns=(-1,)), "gaps must be >= 0"),
    (dict(target="peer"), "target must be one of"),
    (dict(programs=0), "programs must be in"),
])
def test_bad_trains_fail_before_launch(bad, match):
    kw = dict(name="x", target="host", programs=2, burst_bytes=(2048,), gap_ns=(0,))
    with pytest.raises(ValueError, match=match):
        BurstTrain(**{**kw, **bad}).validate()


def test_train_sweep_rows_and_resume(tmp_path):
    from xstage import env

    grid = sweep.TrainGrid(count=2, n_bursts=2, programs=(2,), targets=("host",), repeats=1)
    world = EmulatedWorld(1)
    sweep.train_job(world, grid, str(tmp_path), env.provenance("test", {}))
    df = data.read_rows(tmp_path / "burst_train.csv", data.BURST_TRAIN)   # interpreter: timestamps are 0
    assert len(df) == 2 * 2 and set(df.train) == {t.name for t in grid.trains()}
    assert (df.burst_bytes == [b for t in grid.trains() for b in t.burst_bytes]).all()
    sweep.train_job(world, grid, str(tmp_path), env.provenance("test", {}))   # resumes: nothing new
    assert len(data.read_rows(tmp_path / "burst_train.csv", data.BURST_TRAIN)) == 4


def test_train_sweep_per_program_rows_summarise_to_the_train_rows_and_resume_without_a_launch(tmp_path,
                                                                                             monkeypatch):
    from xstage import env

    grid = sweep.TrainGrid(count=2, n_bursts=3, programs=(2, 3), targets=("host",), repeats=2, per_program=True)
    world = EmulatedWorld(1)
    sweep.train_job(world, grid, str(tmp_path), env.provenance("test", {}))
    pp = data.read_rows(tmp_path / "burst_program.csv", data.BURST_PROGRAM)
    tr = data.read_rows(tmp_path / "burst_train.csv", data.BURST_TRAIN)
    assert len(pp) == sum(t.programs * t.n_bursts for t in grid.trains()) * grid.repeats
    assert len(tr) == sum(t.n_bursts for t in grid.trains()) * grid.repeats
    assert (pp.smid == -1).all()                                   # the interpreter has no SM id
    for t in grid.trains():                                        # every program's every burst, once
        sel = pp[(pp.train == t.name) & (pp.programs == t.programs)]
        assert sorted(set(sel.program)) == list(range(t.programs))
        assert not sel.duplicated(["repeat", "program", "burst"]).any()
        assert (sel.sort_values(["repeat", "program", "burst"]).burst_bytes.to_numpy()
                == np.tile(t.burst_bytes, t.programs * grid.repeats)).all()
    # a train whose per-program rows exist but whose summary does not: summarised from the record, no launch
    rows = open(tmp_path / "burst_train.csv").read().splitlines()
    keep = [rows[0]] + [r for r in rows[1:] if not r.startswith(grid.trains()[-1].name + ",")]
    assert len(keep) < len(rows)
    open(tmp_path / "burst_train.csv", "w").write("\n".join(keep) + "\n")
    js = json.loads(open(tmp_path / "burst_train.json").read())
    js.update(data.integrity(open(tmp_path / "burst_train.csv", "rb").read()))
    open(tmp_path / "burst_train.json", "w").write(json.dumps(js))

    def no_launch(*a, **k):
        raise AssertionError("a recorded train was launched again")

    monkeypatch.setattr(sweep, "launch_train", no_launch)
    sweep.train_job(world, grid, str(tmp_path), env.provenance("test", {}))
    again = data.read_rows(tmp_path / "burst_train.csv", data.BURST_TRAIN)
    pd.testing.assert_frame_equal(again.sort_values(list(again.columns)).reset_index(drop=True),
                                  tr.sort_values(list(tr.columns)).reset_index(drop=True))
    assert len(data.read_rows(tmp_path / "burst_program.csv", data.BURST_PROGRAM)) == len(pp)


def test_per_program_summary_is_the_train_statistics():
    t = BurstTrain("x", "host", 5, (2048, 4096), (0, 100))
    rng = np.random.default_rng()
    t0 = rng.uniform(0, 1000, (5, 2)).round(1)
    issue = rng.uniform(10, 5000, (5, 2)).round(1)
    ts = np.stack([t0, t0 + issue], axis=-1)
    rows = sweep.program_rows(t, 0, 0, ts, np.arange(5) * 7)
    assert list(rows[rows.burst == 1].smid) == [0, 7, 14, 21, 28]
    got = sweep.rows_from_programs(t, rows)
    want = sweep.train_rows(t, 0, 0, sweep.summarize_train(ts))
    pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=1e-12)
    with pytest.raises(data.DataError, match="expected 10"):
        sweep.rows_from_programs(t, rows.iloc[1:])


def test_simulated_trains_have_no_programs_to_record(tmp_path):
    from xstage import model

    grid = sweep.TrainGrid(count=1, n_bursts=2, programs=(2,), targets=("host",), repeats=1, per_program=True)
    prm = model.StageParams(17.0, 51.0, 7000.0, 33.0, 0.5)
    with pytest.raises(ValueError, match="simulated source has none"):
        sweep.run_trains(grid, tmp_path, source="simulated", params=prm)


def test_payload_reference_matches_kernel_on_a_fresh_seed():
    p = BurstGapPoint("local", 2, 2048, 0, 16, 2, False)
    seed = random.randrange(2**31)
    dst = torch.full((p.dst_elems,), POISON, dtype=torch.int32)
    launch_burst_gap(dst.data_ptr(), burst_gap_buffers(p, "cpu"), p, seed)
    assert torch.equal(dst, payload_reference(0, p.dst_elems, seed))


def test_check_destination_catches_a_wrong_or_missing_element():
    p = BurstGapPoint("local", 3, 1024, 0, 16, 2, False)
    seed = 1234
    dst = payload_reference(0, p.dst_elems, seed).clone()
    check_destination(dst, p, seed)
    dst[p.burst_bytes // 4 * 4 + 5] ^= 1                   # burst 1, program 1, element 5
    with pytest.raises(AssertionError, match="first at burst 1, program 1, element 5"):
        check_destination(dst, p, seed)
    dst = payload_reference(0, p.dst_elems, seed).clone()
    dst[-1] = POISON
    with pytest.raises(AssertionError, match="1 still poisoned"):
        check_destination(dst, p, seed)
    with pytest.raises(AssertionError):
        check_destination(payload_reference(0, p.dst_elems, seed), p, seed + 1)   # another sender's payload


def test_measure_point_rows_under_the_interpreter():
    p = BurstGapPoint("remote", 2, 1024, 0, 16, 3, False)
    world = EmulatedWorld(2)
    df = sweep.measure_point(world, sweep.allocate(world, p.dst_elems, {"remote"}), p, repeats=2)
    assert len(df) == 2 * 2 * 3 and set(df["rank"]) == {0, 1}


PTX_CHECK = r"""
import re, triton
from triton.backends.compiler import GPUTarget
import xstage.kernels.remote_store as k
sig = {'dst_addr': 'i64', 'ts_ptr': '*i64', 'cal_ptr': '*i64', 'bar_ptr': '*i32', 'status_ptr': '*i64',
       'burst_elems': 'i32', 'gap_cycles': 'i64', 'seed': 'i32', 'max_polls': 'i32', 'N_BURSTS': 'constexpr',
       'V': 'constexpr', 'R': 'constexpr', 'DRAIN': 'constexpr', 'SYNC': 'constexpr', 'DEVICE': 'constexpr',
       'RELEASE': 'constexpr'}
for v in (1, 2, 4):
    src = triton.compiler.ASTSource(fn=k.burst_gap_store_kernel, signature=sig, constexprs=dict(
        N_BURSTS=2, V=v, R=128, DRAIN=True, SYNC=True, DEVICE=True, RELEASE=True))
    ptx = triton.compile(src, target=GPUTarget('cuda', 90, 32)).asm['ptx']
    print(v, sorted(set(re.findall(r'st\.global\.(?:v\d\.)?b32', ptx))), 'fence.acq_rel.sys' in ptx,
          '%clock64' in ptx, 'ld.global.gpu.acquire' in ptx)
for rel in (True, False):   # the grid barrier's arrival: a release (waits for this program's stores) or relaxed
    src = triton.compiler.ASTSource(fn=k.burst_gap_store_kernel, signature=sig, constexprs=dict(
        N_BURSTS=2, V=4, R=128, DRAIN=False, SYNC=True, DEVICE=True, RELEASE=rel))
    ptx = triton.compile(src, target=GPUTarget('cuda', 90, 32)).asm['ptx']
    print(rel, sorted(set(re.findall(r'red\.global\.gpu\.[a-z]+\.add', ptx))))
"""


def test_compiled_store_width_is_the_one_asked_for():
    """Compile for sm_90 on the CPU (no GPU needed) and read the PTX: 4, 8, 16-byte stores."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    out = subprocess.run([sys.executable, "-c", PTX_CHECK], env=env, capture_output=True, text=True, timeout=300)
    if out.returncode and "ptxas" in out.stderr.lower() and "not found" in out.stderr.lower():
        pytest.skip("Triton's CUDA backend is not usable here")
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert lines == ["1 ['st.global.b32'] True True True", "2 ['st.global.v2.b32'] True True True",
                     "4 ['st.global.v4.b32'] True True True", "True ['red.global.gpu.release.add']",
                     "False ['red.global.gpu.relaxed.add']"]


@pytest.mark.parametrize("field,value,match", [
    ("store_bytes", 12, "store_bytes must be one of"), ("burst_bytes", 3000, "power of two"),
    ("programs", 0, "programs must be in"), ("target", "peer", "target must be one of"),
    ("n_bursts", 0, "n_bursts"), ("gap_ns", -1, "gap_ns"), ("burst_bytes", 2, r"burst_bytes must be in"),
])
def test_bad_point_fails_before_launch(monkeypatch, field, value, match):
    import xstage.remote_store as rs

    launched = []
    monkeypatch.setattr(rs, "burst_gap_store_kernel", type("K", (), {"__getitem__": lambda s, g: launched.append})())
    kw = dict(target="local", programs=2, burst_bytes=1024, gap_ns=0, store_bytes=16, n_bursts=2, drain=False)
    p = BurstGapPoint(**(kw | {field: value}))
    with pytest.raises(ValueError, match=match):
        launch_burst_gap(0, burst_gap_buffers(BurstGapPoint(**kw), "cpu"), p, seed=0)
    assert not launched


@pytest.mark.parametrize("argv,match", [
    (["--store-bytes", "3"], "store_bytes must be one of"),
    (["--burst-kib", "3"], "power of two"),
    (["--repeats", "0"], "repeats must be >= 1"),
    (["--world-size", "1"], "target .remote. needs world_size >= 2"),
    (["--world-size", "0", "--targets", "host"], "world_size must be >= 1"),
    (["--targets", "remote,moon"], "target must be one of"),
    pytest.param([], "needs 2 CUDA GPU", marks=pytest.mark.skipif(
        torch.cuda.device_count() >= 2, reason="GPUs present: this would run a real sweep")),
])
def test_bad_sweep_parameters_exit_2_with_one_line(capsys, tmp_path, argv, match):
    assert cli.main(["sweep", "burst-gap", "--out", str(tmp_path)] + argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("xstage: error:") and len(err.strip().splitlines()) == 1
    assert __import__("re").search(match, err), err
    assert not any(tmp_path.iterdir())   # nothing written, nothing launched


def test_unparsable_sweep_argument(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        cli.main(["sweep", "burst-gap", "--out", str(tmp_path), "--burst-kib", "banana"])
    assert e.value.code == 2 and "expected comma-separated integers, got 'banana'" in capsys.readouterr().err


@pytest.mark.parametrize("argv,match", [
    (["--shapes", "nope"], r"unknown shape\(s\) \['nope'\]"),
    (["--world-size", "1"], "world_size must be >= 2"),
    (["--shapes", "seq_32k", "--world-size", "5"], r"heads \(24\) must be a positive multiple"),
    (["--repeats", "0"], "repeats must be >= 1"),
])
def test_bad_ulysses_sweep_parameters_exit_2(capsys, tmp_path, argv, match):
    assert cli.main(["sweep", "ulysses", "--out", str(tmp_path)] + argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and __import__("re").search(match, err), err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("argv,match", [
    (["--cases", "nope"], r"unknown case\(s\) \['nope'\]"),
    (["--dtypes", "fp16"], "dtypes must be a non-empty subset"),
    (["--repeats", "3"], "repeats must be >= 20"),
    (["--schedules", "fifo"], "schedules must be a subset"),
])
def test_bad_megamoe_sweep_parameters_exit_2(capsys, tmp_path, argv, match):
    assert cli.main(["sweep", "megamoe", "--out", str(tmp_path)] + argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and __import__("re").search(match, err), err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("load_probe", [1, 2])
def test_load_probe_trains_bit_exact_with_every_load_made(tmp_path, load_probe):
    """The load-after-store test's kernel under the interpreter: the destination bit-exact, every
    program's load after every burst made (sink = its word + 1), load_ns recorded (0 without timers) and NaN
    in a record without the probe; a poisoned sink or a skipped burst is caught, naming program and burst."""
    from xstage import env
    from xstage.remote_store import check_load_probe, launch_train, train_buffers

    grid = sweep.TrainGrid(count=2, n_bursts=3, programs=(3,), targets=("host",), repeats=1, per_program=True,
                           load_probe=load_probe)
    sweep.train_job(EmulatedWorld(1), grid, str(tmp_path / "p"), env.provenance("test", {}))
    pp = data.read_rows(tmp_path / "p" / "burst_program.csv", data.BURST_PROGRAM)
    assert len(pp) == 2 * 3 * 3 and (pp.load_ns == 0).all()
    plain = sweep.TrainGrid(count=1, n_bursts=2, programs=(2,), targets=("host",), repeats=1, per_program=True)
    sweep.train_job(EmulatedWorld(1), plain, str(tmp_path / "q"), env.provenance("test", {}))
    assert data.read_rows(tmp_path / "q" / "burst_program.csv", data.BURST_PROGRAM).load_ns.isna().all()
    tr = grid.trains()[0]
    bufs = train_buffers(tr, "cpu", load_probe)
    dst = torch.full((tr.dst_elems,), -1, dtype=torch.int32)
    bufs["sink"].fill_(-7)
    launch_train(dst.data_ptr(), bufs, tr, seed=5, load_probe=load_probe)
    check_train_destination(dst, tr, 5)
    check_load_probe(bufs, tr, load_probe)
    bufs["sink"].view(tr.programs, tr.n_bursts)[2, 1] = -7           # program 2 skipped its load after burst 1
    with pytest.raises(AssertionError, match="first program 2, burst 1"):
        check_load_probe(bufs, tr, load_probe)
    with pytest.raises(ValueError, match="another load probe"):
        launch_train(dst.data_ptr(), train_buffers(tr, "cpu", 0), tr, seed=5, load_probe=load_probe)
    with pytest.raises(ValueError, match="needs the preload"):
        launch_train(dst.data_ptr(), bufs, tr, seed=5, preload=False, load_probe=load_probe)


def test_load_probe_grid_rejects_what_it_cannot_record():
    with pytest.raises(ValueError, match="per program"):
        sweep.TrainGrid(load_probe=2).validate()
    with pytest.raises(ValueError, match="per program"):
        sweep.TrainGrid(load_probe=1, per_program=True, preload=False).validate()
    with pytest.raises(ValueError, match="load_probe must be"):
        sweep.TrainGrid(load_probe=3, per_program=True).validate()


def test_an_older_burst_program_record_loads_with_no_load_column():
    pp, meta = data.load(data.machine_dir("h200x1") / "trains_clean", data.BURST_PROGRAM)
    assert meta["schema_version"] == 1 and pp.load_ns.isna().all() and len(pp) > 0


def test_probe_size_family_is_a_lead_then_probes_of_one_size_per_train():
    from xstage.remote_store import PROBE_SIZE_KIB, PROBE_SIZE_LEAD_KIB, probe_size_family

    fam = probe_size_family()
    assert len(fam) == len(PROBE_SIZE_LEAD_KIB) * len(PROBE_SIZE_KIB) and len({n for n, _, _ in fam}) == len(fam)
    for name, sizes, gaps in fam:
        s, a = (float(x[1:]) for x in name.split("-"))
        assert sizes[0] == a * 1024 and set(sizes[1:]) == {s * 1024} and len(sizes) == len(gaps) == 12
        assert gaps[0] == 500 and set(gaps[1:]) == {3000}
    grid = sweep.TrainGrid(family="probe_size", programs=(4,), targets=("host",))
    assert [t.name for t in grid.trains()] == [n for n, _, _ in fam]
    with pytest.raises(ValueError, match="lead burst and at least one probe"):
        probe_size_family(n_bursts=1)
