"""Sweeps under the launchers clusters use (torchrun, SLURM's srun) and under xstage's own ``mp.spawn``, on the CPU:
two CPU ranks (``XSTAGE_CPU_RANKS=1``: gloo, each rank's symmetric buffer in /dev/shm mapped by both) under Triton's
interpreter, running a small burst-gap sweep with remote stores (the sweep checks every remote destination bit for
bit before it times). The records of the three launches are equal, row for row and column for column: under the
interpreter the kernels read no clock (``DEVICE=False``: every timestamp is 0), so the timing columns are
deterministic too and no column is left out. Bad launcher environments are one clear line on every rank before
anything runs, and a rank that dies mid-sweep loses no finished row: the sweep resumes under another launcher."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from xstage import cli, data, env, ranks
from xstage.ranks import free_port

pytestmark = [pytest.mark.interpreter, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[1]
# 4 configurations x 2 ranks x 2 repeats x 2 bursts: remote stores between the 2 ranks, seconds under the interpreter
GRID = ["--targets", "remote", "--burst-kib", "1,2", "--gap-us", "0", "--programs", "1,2", "--store-bytes", "16",
        "--bursts", "2", "--repeats", "2"]
ROWS_PER_POINT = 2 * 2 * 2
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR",
               "MASTER_PORT",
               "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE")


def _environ(**extra) -> dict:
    """This environment without any launcher's variables, with CPU ranks, a short collective timeout."""
    base = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS and not k.startswith("SLURM")}
    return {**base, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1", env.CPU_RANKS: "1",
            ranks.RANK_TIMEOUT: "30", **extra}


def _sweep(out: Path, grid=GRID) -> list[str]:
    return ["sweep", "burst-gap", "--out", str(out), *grid]


def _run(argv: list[str], **extra) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=ROOT, env=_environ(**extra), capture_output=True, text=True, timeout=200)


def _plain(out: Path, grid=GRID) -> subprocess.CompletedProcess:
    return _run([sys.executable, "-m", "xstage", *_sweep(out, grid)])


def _torchrun(out: Path, grid=GRID) -> subprocess.CompletedProcess:
    return _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                 "-m", "xstage", *_sweep(out, grid)])


def _slurm(out: Path, argv=None, per_rank=None) -> list[tuple[int, str]]:
    """The sweep as 2 srun tasks would start it: the SLURM variables set by hand, rank 0's host from the node
    list. ``argv(rank)``: each task's command; ``per_rank(rank)``: extra variables of a task. (rc, stderr) each."""
    port = free_port()
    procs = []
    for r in range(2):
        slurm = dict(SLURM_PROCID=str(r), SLURM_LOCALID=str(r), SLURM_NTASKS="2", SLURM_STEP_ID="0",
                     SLURM_JOB_ID="4242", SLURM_NODELIST="localhost", MASTER_PORT=str(port),
                     **(per_rank(r) if per_rank else {}))
        cmd = argv(r) if argv else [sys.executable, "-m", "xstage", *_sweep(out)]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=_environ(**slurm), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    return [(p.wait(timeout=200), p.communicate()[1]) for p in procs]


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("xstage: error:")]


def _records(out: Path) -> pd.DataFrame:
    return data.read_rows(out / "burst_gap.csv", data.BURST_GAP)


def _launchers(out: Path) -> list[str]:
    meta = json.loads((out / "burst_gap.json").read_text())
    return [meta["launcher"]] + [run.get("launcher") for run in meta["runs"]]


@pytest.fixture(scope="module")
def spawned(tmp_path_factory) -> Path:
    """The sweep as xstage starts its own ranks (mp.spawn, gloo): its folder."""
    out = tmp_path_factory.mktemp("spawn")
    res = _plain(out)
    assert res.returncode == 0, res.stderr
    df = _records(out)
    assert len(df) == 4 * ROWS_PER_POINT and sorted(set(df["rank"])) == [0, 1] and _launchers(out) == ["xstage"]
    return out


@pytest.fixture(scope="module")
def reference(spawned) -> pd.DataFrame:
    return _records(spawned)


def _assert_same_records(got: pd.DataFrame, want: pd.DataFrame) -> None:
    assert list(got.columns) == list(want.columns) == list(data.BURST_GAP.columns)   # every column compared
    pd.testing.assert_frame_equal(got, want, check_exact=True)


def test_torchrun_records_equal_mp_spawn(reference, tmp_path):
    res = _torchrun(tmp_path)
    assert res.returncode == 0, res.stderr
    _assert_same_records(_records(tmp_path), reference)
    assert _launchers(tmp_path) == ["torchrun"]


def test_slurm_environment_records_equal_mp_spawn(reference, tmp_path):
    for rc, err in _slurm(tmp_path):
        assert rc == 0, err
    _assert_same_records(_records(tmp_path), reference)
    assert _launchers(tmp_path) == ["slurm"]


def test_a_rank_that_dies_mid_sweep_loses_no_row_and_resumes_under_another_launcher(reference, tmp_path):
    """Rank 1 stops dead as it starts its 3rd configuration (SLURM-like world): rank 0 says so in one line, the
    2 configurations finished are recorded, and torchrun continues the same record to the mp.spawn run's."""
    driver = [sys.executable, str(ROOT / "tests" / "launch_dying_rank.py"), "3", *_sweep(tmp_path)]
    (rc0, err0), (rc1, err1) = _slurm(tmp_path, argv=lambda r: driver)
    assert rc1 == 17 and not _errors(err1)                 # died without a word
    assert rc0 == 2 and len(_errors(err0)) == 1, err0
    assert "rank 0 of 2 (slurm, host" in err0 and "a peer rank stopped" in err0 and "run the same command again" in err0
    _assert_same_records(_records(tmp_path), reference.iloc[:2 * ROWS_PER_POINT].reset_index(drop=True))
    res = _torchrun(tmp_path)
    assert res.returncode == 0, res.stderr
    _assert_same_records(_records(tmp_path), reference)
    assert _launchers(tmp_path) == ["slurm", "torchrun"]


@pytest.mark.slow      # the checks' lines are tested in this process below; here: every rank says the same
@pytest.mark.parametrize("case", ["plan", "hosts"])
def test_a_bad_world_is_one_line_on_every_rank_before_anything_runs(tmp_path, case):
    """Ranks that disagree on the plan (rank 1 given other burst sizes), or a world whose peer pointers would
    cross hosts (SLURM names each task's node): both ranks refuse in the same one line; no record is started."""
    if case == "plan":
        res = _slurm(tmp_path, argv=lambda r: [sys.executable, "-m", "xstage", *_sweep(
            tmp_path, [x if x != "1,2" or r == 0 else "1,4" for x in GRID])])
        want = "rank 1 runs another plan than rank 0"
    else:
        res = _slurm(tmp_path, per_rank=lambda r: {"SLURMD_NODENAME": f"gpu-node{r}"})
        want = "the world spans 2 hosts (rank 0 on gpu-node0; rank 1 on gpu-node1)"
    lines = [_errors(err) for _, err in res]
    assert [rc for rc, _ in res] == [2, 2] and all(len(x) == 1 for x in lines), res
    assert lines[0] == lines[1] and want in lines[0][0]
    assert not (tmp_path / "burst_gap.csv").exists()


@pytest.mark.slow      # the train study's collectives (per-program rows, the broadcast of recorded trains)
def test_train_study_under_torchrun_records_equal_mp_spawn(tmp_path):
    trains = ["sweep", "trains", "--targets", "remote", "--programs", "1,2", "--count", "2", "--bursts", "3",
              "--burst-kib-range", "2,8", "--repeats", "2", "--per-program"]
    plain = _run([sys.executable, "-m", "xstage", *trains, "--out", str(tmp_path / "plain")])
    launched = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
                     "xstage", *trains, "--out", str(tmp_path / "torchrun")])
    assert plain.returncode == 0 and launched.returncode == 0, plain.stderr + launched.stderr
    for schema in (data.BURST_TRAIN, data.BURST_PROGRAM):
        want, got = (data.read_rows(tmp_path / f / f"{schema.name}.csv", schema) for f in ("plain", "torchrun"))
        assert len(want) and sorted(set(want["rank"])) == [0, 1]
        pd.testing.assert_frame_equal(got, want, check_exact=True)


def test_the_gpu_check_script_parses_and_compares_records(spawned, tmp_path, capsys):
    """scripts/launch_check.sh parses; scripts/launch_check.py finds equal layouts equal, a cut record not."""
    import importlib.util

    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / "launch_check.sh")]).returncode == 0
    spec = importlib.util.spec_from_file_location("launch_check", ROOT / "scripts" / "launch_check.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    assert check.main([str(spawned)] * 3) == 0
    assert "launched: the same configurations" in capsys.readouterr().out
    cut = tmp_path / "cut"
    cut.mkdir()
    lines = (spawned / "burst_gap.csv").read_text().splitlines(keepends=True)
    (cut / "burst_gap.csv").write_text("".join(lines[:-1]))
    assert check.main([str(spawned), str(spawned), str(cut)]) == 1
    assert "launched: NOT the same" in capsys.readouterr().out


# ---------------------------------------------------------------------------- the environment, in this process
TORCHRUN = dict(RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", MASTER_ADDR="node7", MASTER_PORT="29500")
SRUN = dict(SLURM_PROCID="5", SLURM_NTASKS="8", SLURM_LOCALID="1", SLURM_STEP_ID="0", SLURM_JOB_ID="123",
            SLURM_NODELIST="gpu[03-06,9]", SLURMD_NODENAME="gpu05")


@pytest.mark.parametrize("environ, want", [
    (TORCHRUN, ("torchrun", 3, 4, 1, "node7", 29500)),
    (SRUN, ("slurm", 5, 8, 1, "gpu03", 20000 + 123 * 10)),
    ({**SRUN, "MASTER_ADDR": "head", "MASTER_PORT": "4000"}, ("slurm", 5, 8, 1, "head", 4000)),
    ({**SRUN, "SLURM_STEP_NUM_TASKS": "6", "SLURM_STEP_NODELIST": "a1,b2"}, ("slurm", 5, 6, 1, "a1", 20000 + 1230)),
    ({**SRUN, **TORCHRUN}, ("torchrun", 3, 4, 1, "node7", 29500)),    # torchrun inside an srun step
])
def test_launcher_from_the_environment(environ, want):
    launch = env.launched(environ)
    assert (launch.launcher, launch.rank, launch.world_size, launch.local_rank, launch.master_addr,
            launch.master_port) == want
    assert launch.host == environ.get("SLURMD_NODENAME", launch.host)


@pytest.mark.parametrize("environ", [
    {},
    {"MASTER_ADDR": "node7", "MASTER_PORT": "29500"},                       # exported, nothing launched
    {k: v for k, v in SRUN.items() if k != "SLURM_STEP_ID"},               # a batch script's own environment
    {**SRUN, "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0"},   # srun -n 1: xstage starts them
])
def test_no_launcher(environ):
    assert env.launched(environ) is None


@pytest.mark.parametrize("environ, match", [
    ({"RANK": "1"}, r"RANK=1 set but WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT not: a launcher"),
    ({**TORCHRUN, "WORLD_SIZE": ""}, r"RANK=3, LOCAL_RANK=1, MASTER_ADDR=node7, MASTER_PORT=29500 set but WORLD_SIZE"),
    ({**TORCHRUN, "RANK": "4"}, r"torchrun: RANK=4 is outside the world of WORLD_SIZE=4"),
    ({**TORCHRUN, "WORLD_SIZE": "four"}, r"WORLD_SIZE='four' is not an integer"),
    ({**TORCHRUN, "LOCAL_RANK": "-1"}, r"LOCAL_RANK=-1 must be >= 0"),
    ({**TORCHRUN, "LOCAL_RANK": "4"}, r"LOCAL_RANK=4 is larger than RANK=3"),
    ({k: v for k, v in SRUN.items() if k != "SLURM_NTASKS"}, r"SLURM_PROCID=5 without SLURM_NTASKS"),
    ({**SRUN, "SLURM_PROCID": "8"}, r"slurm: SLURM_PROCID=8 is outside the world of SLURM_NTASKS=8"),
    ({k: v for k, v in SRUN.items() if k != "SLURM_NODELIST"}, r"without MASTER_ADDR or SLURM_NODELIST"),
])
def test_bad_launcher_environment_is_one_clear_error(environ, match):
    with pytest.raises(ValueError, match=match):
        env.launched(environ)
    assert env.launcher_name(environ) == "unknown"


@pytest.mark.parametrize("nodelist, first", [("gpu[03-06,9],login1", "gpu03"), ("a,b", "a"), ("node7", "node7"),
                                             ("rack[2-3]-n[10-11]", "rack2-n10"), ("10.0.0.5", "10.0.0.5")])
def test_first_host_of_a_node_list(nodelist, first):
    assert env.first_host(nodelist) == first


@pytest.fixture
def cpu_ranks(monkeypatch):
    for k in LAUNCH_VARS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv(env.CPU_RANKS, "1")
    return monkeypatch


@pytest.mark.parametrize("rank", [0, 3])
@pytest.mark.parametrize("environ, line", [
    ({"WORLD_SIZE": "4"}, "xstage: error: WORLD_SIZE=4 set but RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT not"),
    (dict(WORLD_SIZE="4", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="1"),
     "xstage: error: the burst-gap sweep (remote target) runs on 2 rank(s) (--world-size 2), but torchrun started 4 "),
], ids=["world-size-alone", "another-world-size"])
def test_the_command_line_refuses_a_bad_launch_on_every_rank(cpu_ranks, capsys, tmp_path, rank, environ, line):
    """What each rank prints (one line, exit code 2) before anything launches: no record is started."""
    for k, v in environ.items():
        cpu_ranks.setenv(k, v)
    if "LOCAL_RANK" in environ:
        cpu_ranks.setenv("RANK", str(rank))
    assert cli.main(_sweep(tmp_path / "out")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(line), err
    if "LOCAL_RANK" in environ:
        assert f"(this is rank {rank} of 4 (torchrun" in err[0] and "(torchrun --nproc-per-node 2), give " \
            "--world-size 4 or run it without a launcher" in err[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, what", [
    (["sweep", "burst-gap", *GRID, "--source", "simulated"],
     "the simulated burst-gap sweep (--source simulated) runs in one process"),
    (["sweep", "megamoe", "--world", "one-gpu", "--link", "host", "--cases", "mixtral_8x7b_T128_hot"],
     "the one-GPU MegaMoE sweep (--world one-gpu) runs in one process"),
    (["sweep", "ulysses", "--world", "one-gpu", "--link", "host", "--shapes", "flux1_4608"],
     "the one-GPU Ulysses sweep (--world one-gpu) runs in one process"),
])
def test_a_one_process_sweep_under_a_launcher_of_more_ranks_is_refused(cpu_ranks, capsys, tmp_path, argv, what):
    for k, v in dict(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="1").items():
        cpu_ranks.setenv(k, v)
    assert cli.main(argv + ["--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and what in err[0] and "each would write the same record" in err[0], err
    assert not (tmp_path / "out").exists()


def test_plan_digest_sees_the_plan_not_the_date():
    from xstage.burst_gap_sweep import BurstGapGrid, burst_gap_job

    meta = env.provenance("xstage sweep burst-gap", {"grid": {"burst_kib": [1]}})
    g = BurstGapGrid(burst_kib=(1, 2), targets=("remote",))
    d = ranks.plan_digest(burst_gap_job, 2, (g, "out", meta))
    assert d == ranks.plan_digest(burst_gap_job, 2, (g, "out", {**meta, "date_utc": "another second"}))
    for other in [(BurstGapGrid(burst_kib=(1, 4), targets=("remote",)), "out", meta), (g, "elsewhere", meta),
                  (g, "out", {**meta, "git_commit": "another commit"})]:
        assert ranks.plan_digest(burst_gap_job, 2, other) != d
    assert ranks.plan_digest(burst_gap_job, 4, (g, "out", meta)) != d


def test_world_checks_name_ranks_and_hosts():
    ranks.check_one_host(["a"] * 4)
    with pytest.raises(RuntimeError, match=r"spans 2 hosts \(ranks 0-2, 5 on a; ranks 3-4 on b\)"):
        ranks.check_one_host(["a", "a", "a", "b", "b", "a"])
    ranks.check_same_plan(["p"] * 3, ["x"] * 3)
    with pytest.raises(ValueError, match=r"ranks 1, 3 run another plan than rank 0 \(plan q, rank 0's p\).*"
                                         r"rank 0 ran `x0`, rank 1 `x1`"):
        ranks.check_same_plan(["p", "q", "p", "r"], ["x0", "x1", "x2", "x3"])


@pytest.mark.parametrize("environ, match", [
    ({**TORCHRUN, "GROUP_WORLD_SIZE": "2"}, r"rank 3 of 4 \(torchrun, host .*\): the world spans 2 nodes "
                                            r"\(GROUP_WORLD_SIZE\), but its ranks store .* do not cross hosts"),
    ({**TORCHRUN, "LOCAL_WORLD_SIZE": "2"}, r"the world spans 2 nodes \(LOCAL_WORLD_SIZE\)"),
    ({**SRUN, "SLURM_STEP_NUM_NODES": "4"}, r"rank 5 of 8 \(slurm, host gpu05\): the world spans 4 nodes "
                                            r"\(SLURM_STEP_NUM_NODES\)"),
    ({**TORCHRUN, "GROUP_WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "4"}, None),
    ({**SRUN, "SLURM_STEP_NUM_NODES": "1"}, None),
])
def test_a_world_the_launcher_spreads_over_nodes_is_refused_before_any_rendezvous(environ, match):
    launch = env.launched(environ)
    if match is None:
        ranks.check_one_node(launch)
    else:
        with pytest.raises(RuntimeError, match=match):
            ranks.check_one_node(launch)


def test_a_rank_whose_peers_never_come_says_so_in_time(cpu_ranks):
    """srun started 2 tasks, only rank 0 is here: the rendezvous times out (XSTAGE_RANK_TIMEOUT_S) in one line."""
    port = free_port()
    for k, v in dict(SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NTASKS="2", SLURM_STEP_ID="0",
                     SLURM_NODELIST="127.0.0.1", MASTER_PORT=str(port), **{ranks.RANK_TIMEOUT: "2"}).items():
        cpu_ranks.setenv(k, v)
    ran = []
    with pytest.raises(RuntimeError, match=rf"rank 0 of 2 \(slurm, host .*\): the ranks did not meet at "
                                           rf"127.0.0.1:{port} \(.*\): did all 2 start"):
        ranks.spawn(lambda world: ran.append(world), 2)
    assert not ran


def test_collective_failures_are_told_apart_from_the_jobs_own_errors():
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        with pytest.raises(Exception) as caught:
            dist.broadcast(torch.zeros(1), src=3)                 # no rank 3: raised inside torch.distributed
        assert ranks._collective_failed(caught.value)
        with pytest.raises(RuntimeError) as caught:
            ranks.check_one_host(["a", "b"])
        assert not ranks._collective_failed(caught.value)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("raw", ["soon", "0", "-3"])
def test_bad_rank_timeout(monkeypatch, raw):
    monkeypatch.setenv(ranks.RANK_TIMEOUT, raw)
    with pytest.raises(ValueError, match=f"XSTAGE_RANK_TIMEOUT_S='{raw}'"):
        ranks._timeout()


def test_shared_memory_world_maps_its_buffers_and_leaves_no_file(tmp_path):
    """One gloo rank: each buffer a shared file, the pointer table its address here, the file gone after."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        w = ranks.SharedMemoryWorld(tmp_path)
        a, b = w.symmetric_empty(64, torch.int32), w.symmetric_empty(8, torch.float32)
        assert a.ptrs == [a.local(0).data_ptr()] and b.ptrs == [b.local(0).data_ptr()] and a.ptrs != b.ptrs
        a.local(0).fill_(7)
        assert int(a.local(0).sum()) == 7 * 64 and not list(tmp_path.iterdir())
        assert w.link == "shared_memory" and not w.emulated and w.device(0).type == "cpu"
    finally:
        dist.destroy_process_group()
