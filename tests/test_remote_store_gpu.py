"""On GPUs: destinations hold exactly the bytes sent — remote (2 GPUs, NVLink peers), host (pinned host memory
over PCIe, one GPU) and local — every store width, with and without the drain fence and the grid barrier, and
irregular free-running trains; a barrier that can never complete times out with a report instead of hanging;
the sweeps resume. Skipped without the GPUs each needs."""
import random

import numpy as np
import pytest
import torch

from xstage import burst_gap_sweep as sweep
from xstage import data
from xstage.ranks import spawn
from xstage.remote_store import (BurstGapPoint, BurstTrain, burst_gap_buffers, check_barrier_status,
                                 launch_burst_gap, train_family)

POINTS = [(1, 1, 0, 4, False, True), (7, 64, 1000, 8, True, False), (132, 1024, 0, 16, False, True),
          (264, 256, 2000, 16, True, True), (264, 1, 0, 16, False, False)]


@pytest.mark.gpu
def test_host_link_destinations_bit_exact_on_one_gpu():
    """Pinned host memory reached through its address from the kernel: every byte lands (poisoned first)."""
    points = [BurstGapPoint(t, p, kib * 1024, gap, w, 4, d, s) for t in ("host", "local")
              for (p, kib, gap, w, d, s) in POINTS]
    spawn(sweep.check_job, 1, points, random.randrange(2**30))


def _train_check_job(world, trains, seed):
    dests = sweep.allocate(world, max(t.dst_elems for t in trains), {t.target for t in trains})
    for i, tr in enumerate(trains):
        sweep.check_train(world, dests, tr, seed + i, preload=i % 2 == 0)   # both ways of reading the parameters


@pytest.mark.gpu
def test_irregular_trains_bit_exact_on_one_gpu():
    fam = train_family(random.randrange(1000), 3)
    trains = [BurstTrain(n, t, p, sz, gp) for t in ("host", "local") for p in (16, 264) for n, sz, gp in fam]
    spawn(_train_check_job, 1, trains, random.randrange(2**30))


@pytest.mark.gpu
def test_train_sweep_resumes_on_one_gpu(tmp_path):
    grid = sweep.TrainGrid(count=2, n_bursts=3, programs=(4,), targets=("host",), repeats=2)
    sweep.run_trains(grid, tmp_path, source="gpu")
    n1 = len(open(tmp_path / "burst_train.csv").readlines())
    sweep.run_trains(grid, tmp_path, source="gpu")
    assert len(open(tmp_path / "burst_train.csv").readlines()) == n1 == 1 + 2 * 2 * 3


@pytest.mark.gpu
def test_per_program_trains_record_each_program_and_its_sm(tmp_path):
    grid = sweep.TrainGrid(count=2, n_bursts=3, programs=(4, 132), targets=("host",), repeats=2, per_program=True)
    sweep.run_trains(grid, tmp_path, source="gpu")
    pp = data.read_rows(tmp_path / "burst_program.csv", data.BURST_PROGRAM)
    tr = data.read_rows(tmp_path / "burst_train.csv", data.BURST_TRAIN)
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    assert pp.smid.between(0, sm - 1).all() and (pp.issue_ns > 0).all()
    assert pp[pp.programs == 132].groupby(["train", "repeat"]).smid.nunique().min() > 66   # spread over the SMs
    for t in grid.trains():
        got = sweep.rows_from_programs(t, pp[(pp.train == t.name) & (pp.programs == t.programs)])
        want = tr[(tr.train == t.name) & (tr.programs == t.programs)].reset_index(drop=True)
        assert np.allclose(got.issue_ns, want.issue_ns) and np.allclose(got.issue_p90_ns, want.issue_p90_ns)


def _load_probe_check_job(world, trains, seed):
    dests = sweep.allocate(world, max(t.dst_elems for t in trains), {t.target for t in trains})
    for i, tr in enumerate(trains):
        sweep.check_train(world, dests, tr, seed + i, load_probe=1 + i % 2)   # destination and every sink word


@pytest.mark.gpu
def test_load_probe_trains_bit_exact_and_timed_on_one_gpu(tmp_path):
    """The load-after-store kernel on the GPU: destinations bit-exact and every load made (both kinds),
    then a per-program record whose every load_ns is finite and positive."""
    fam = train_family(random.randrange(1000), 2)
    trains = [BurstTrain(n, t, p, sz, gp) for t in ("host", "local") for p in (16, 264) for n, sz, gp in fam]
    spawn(_load_probe_check_job, 1, trains, random.randrange(2**30))
    grid = sweep.TrainGrid(count=2, n_bursts=4, programs=(132,), targets=("host",), repeats=1, per_program=True,
                           load_probe=2)
    sweep.run_trains(grid, tmp_path, source="gpu")
    pp = data.read_rows(tmp_path / "burst_program.csv", data.BURST_PROGRAM)
    assert len(pp) == 2 * 132 * 4 and (pp.load_ns > 0).all() and np.isfinite(pp.load_ns).all()


@pytest.mark.multigpu
def test_destinations_bit_exact_on_two_gpus():
    points = [BurstGapPoint(t, p, kib * 1024, gap, w, 4, d, s)
              for t in ("remote", "local") for (p, kib, gap, w, d, s) in POINTS]
    spawn(sweep.check_job, 2, points, random.randrange(2**30))


@pytest.mark.gpu
def test_grid_barrier_times_out_with_report():
    p = BurstGapPoint("local", 8, 4096, 0, 16, 3, False, True)
    dev = torch.device("cuda", 0)
    dst = torch.empty(p.dst_elems, dtype=torch.int32, device=dev)
    bufs = burst_gap_buffers(p, dev)
    launch_burst_gap(dst.data_ptr(), bufs, p, seed=1, max_polls=1000, planted_missing=1)
    torch.cuda.synchronize()
    with pytest.raises(RuntimeError, match=r"program \d+ timed out at the grid barrier after burst 0: saw 7 of 8"):
        check_barrier_status(bufs["status"], p, rank=0)


@pytest.mark.gpu
def test_relaxed_barrier_sweep_is_bit_exact_and_resumes_on_one_gpu(tmp_path):
    """The relaxed-arrival grid barrier (the falsification run of the barrier-drains reading): the sweep checks
    its destinations bit for bit (poisoned first) before timing, the barrier never times out, and it resumes."""
    grid = sweep.BurstGapGrid(burst_kib=(1, 64), gap_us=(0, 5), programs=(16, 264), store_bytes=(16,),
                              targets=("host",), n_bursts=3, repeats=2, world_size=1, release=False)
    sweep.run_burst_gap(grid, tmp_path, source="gpu")
    n1 = len(open(tmp_path / "burst_gap.csv").readlines())
    sweep.run_burst_gap(grid, tmp_path, source="gpu")
    assert len(open(tmp_path / "burst_gap.csv").readlines()) == n1 == 1 + 2 * 2 * 2 * 2 * 3


@pytest.mark.multigpu
def test_sweep_resumes(tmp_path):
    grid = sweep.BurstGapGrid(burst_kib=(1, 64), gap_us=(0, 5), programs=(4,), store_bytes=(16,),
                              targets=("remote",), n_bursts=3, repeats=2)
    sweep.run_burst_gap(grid, tmp_path, source="gpu")
    n1 = len(open(tmp_path / "burst_gap.csv").readlines())
    sweep.run_burst_gap(grid, tmp_path, source="gpu")  # all done: nothing appended
    assert len(open(tmp_path / "burst_gap.csv").readlines()) == n1 == 1 + 4 * 2 * 2 * 3
