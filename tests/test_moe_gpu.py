"""On 2 GPUs (NVLink peers): the fused MegaMoE layer (dispatch push, persistent experts kernel whose Linear-2
epilogues store into the source ranks' combine buffers, barriers, top-k sum) on real configurations in bf16 and
fp8: combine buffers poisoned with NaN and checked whole against the float32 reference (fp8: its quantisation
emulated in float32), all four schedules bit-identical, the unfused NCCL + torch._grouped_mm baseline close to it;
a planted missing dependency ends in an error naming rank, expert and tile; the sweep writes and resumes.
Skipped without 2 GPUs."""
import random

import pytest

from xstage import data, sources
from xstage import megamoe_analysis as analysis
from xstage import moe as M
from xstage import moe_plan as MP
from xstage import moe_sweep as MS
from xstage.ranks import spawn

pytestmark = pytest.mark.multigpu

# small token counts of three shapes (all BM = 64 tiles): few rows per expert, a hot expert, Zipf skew
CASES = MP.cases_by_name(["mixtral_8x7b_T128_hot", "qwen3_235b_T256_zipf", "deepseek_v4_flash_T512_uniform"])


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_fused_layer_against_reference_on_two_gpus(dtype):
    # every schedule with the static and the dynamic (atomic ticket) task assignment: all bit-identical
    spawn(M.check_job, 2, CASES, random.randrange(2**30), dtype, None, MP.SCHEDULES, None, M.MAX_POLLS, None,
          MP.ASSIGNMENTS)


def test_missing_dependency_times_out_with_report_on_two_gpus():
    spawn(M.missing_dependency_job, 2, 1)   # rank 1 loses a Linear-1 tile: it must name itself, expert and tile


def test_sweep_writes_and_resumes(tmp_path):
    cases = [MP.as_case((1024, 512, 8, 2, 128, "uniform"), 1), MP.as_case((1024, 512, 8, 2, 256, "hot"), 2)]
    csv = MS.run_megamoe(tmp_path, sources.recorded_params, cases=cases, repeats=20, warmup=1)
    n1 = len(open(csv).readlines())
    assert n1 == 1 + len(cases) * len(MP.DTYPES_GPU) * len(MP.SCHEDULES)
    MS.run_megamoe(tmp_path, sources.recorded_params, cases=cases, repeats=20, warmup=1)   # all done: no rows
    assert len(open(csv).readlines()) == n1
    df, meta = data.load(tmp_path, data.MEGAMOE)
    assert meta["params"]["prm"]["drain_gbps"] > 0 and meta["gpu_count"] >= 2
    assert (df.kernel_ms > 0).all() and (df.layer_ms >= df.kernel_ms * 0.5).all() and (df.unfused_ms > 0).all()
    assert (df.remote_bytes > 0).all() and (df.compute_ms > 0).all() and (df.predicted_ms > 0).all()
    assert (df.grouped_mm_ms > 0).all() and (df.compute_sched_ms > 0).all()
    summ = analysis.summary(df)
    print(summ.to_string(index=False))
    assert set(summ.dtype) == {"bf16", "fp8"} and summ.geomean_speedup.notna().all()
