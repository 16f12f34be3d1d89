"""On 2 GPUs (NVLink peers): destinations hold exactly the bytes sent, remote and local, every store width,
with and without the drain fence; the sweep resumes. Skipped without 2 GPUs."""
import random

import pytest

from xstage import sweep
from xstage.ranks import spawn
from xstage.remote_store import BurstGapPoint

pytestmark = pytest.mark.multigpu


def test_destinations_bit_exact_on_two_gpus():
    points = [BurstGapPoint(t, p, kib * 1024, gap, w, 4, d)
              for t in ("remote", "local") for (p, kib, gap, w, d) in
              [(1, 1, 0, 4, False), (7, 64, 1000, 8, True), (132, 1024, 0, 16, False), (264, 256, 2000, 16, True)]]
    spawn(sweep.check_job, 2, points, random.randrange(2**30))


def test_sweep_resumes(tmp_path):
    grid = sweep.BurstGapGrid(burst_kib=(1, 64), gap_us=(0, 5), programs=(4,), store_bytes=(16,),
                              targets=("remote",), n_bursts=3, repeats=2)
    sweep.run_burst_gap(grid, tmp_path, source="gpu")
    n1 = len(open(tmp_path / "burst_gap.csv").readlines())
    sweep.run_burst_gap(grid, tmp_path, source="gpu")  # all done: nothing appended
    assert len(open(tmp_path / "burst_gap.csv").readlines()) == n1 == 1 + 4 * 2 * 2 * 3
