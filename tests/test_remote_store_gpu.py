"""On 2 GPUs (NVLink peers): destinations hold exactly the bytes sent, remote and local, every store width,
with and without the drain fence and the grid barrier; a barrier that can never complete times out with a
report instead of hanging; the sweep resumes. Skipped without 2 GPUs."""
import random

import pytest
import torch

from xstage import sweep
from xstage.ranks import spawn
from xstage.remote_store import BurstGapPoint, burst_gap_buffers, check_barrier_status, launch_burst_gap

pytestmark = pytest.mark.multigpu


def test_destinations_bit_exact_on_two_gpus():
    points = [BurstGapPoint(t, p, kib * 1024, gap, w, 4, d, s)
              for t in ("remote", "local") for (p, kib, gap, w, d, s) in
              [(1, 1, 0, 4, False, True), (7, 64, 1000, 8, True, False), (132, 1024, 0, 16, False, True),
               (264, 256, 2000, 16, True, True), (264, 1, 0, 16, False, False)]]
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


def test_sweep_resumes(tmp_path):
    grid = sweep.BurstGapGrid(burst_kib=(1, 64), gap_us=(0, 5), programs=(4,), store_bytes=(16,),
                              targets=("remote",), n_bursts=3, repeats=2)
    sweep.run_burst_gap(grid, tmp_path, source="gpu")
    n1 = len(open(tmp_path / "burst_gap.csv").readlines())
    sweep.run_burst_gap(grid, tmp_path, source="gpu")  # all done: nothing appended
    assert len(open(tmp_path / "burst_gap.csv").readlines()) == n1 == 1 + 4 * 2 * 2 * 3
