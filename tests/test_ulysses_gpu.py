"""On 2 GPUs (NVLink peers), bf16 DiT shapes: the fused Ulysses layer equals our attention followed by NCCL's
all_to_all_single bit for bit (outputs poisoned with NaN first), including tiles that straddle two ranks and a
partial last key block, and stays within 2x PyTorch's own error of the float32 reference; a peer that never
signals ends the barrier with an error naming waiter and peer; the sweep writes and resumes. Skipped without
2 GPUs. On ONE GPU (``OneGPUWorld``, every rank in this process, link local or host: the peers' outputs in pinned
host memory): the same checks for every rank, P = 2 and 4, straddling tiles included, and the one-GPU sweep."""
import random

import pytest
import torch

from xstage import data, ulysses_analysis
from xstage import ulysses as U
from xstage import ulysses_sweep as US
from xstage.ranks import OneGPUWorld, spawn

CASES = [
    U.UlyssesShape("flux1_4608", 4_608, 24, 128),            # Sl = 2,304 = 18 x 128: no straddle, even keys
    U.UlyssesShape("cogvideox5b_17776", 17_776, 48, 64),     # Sl = 8,888: straddles (56 rows), 48-key tail
    U.UlyssesShape("wan21_14b_75600", 75_600, 40, 128),      # Sl = 37,800: straddles (40 rows), 16-key tail
]


@pytest.mark.multigpu
@pytest.mark.parametrize("config", [None, U.AttnConfig(128, 64, 4, 3, True)], ids=["default", "tma"])
def test_fused_bit_exact_and_close_on_two_gpus(config):
    spawn(U.check_job, 2, CASES, random.randrange(2**30), None, config)


@pytest.mark.multigpu
def test_missing_peer_times_out_with_report_on_two_gpus():
    spawn(U.barrier_timeout_job, 2, 1)   # rank 1 never signals: rank 0 must name itself and rank 1


@pytest.mark.multigpu
def test_sweep_writes_and_resumes(tmp_path):
    shapes = [U.UlyssesShape("tiny_d64", 4_096, 8, 64), U.UlyssesShape("tiny_d128_straddle", 4_200, 4, 128)]
    csv = US.run_ulysses(tmp_path, world_size=2, shapes=shapes, repeats=2, warmup=1, tune=False)
    n1 = len(open(csv).readlines())
    assert n1 == 1 + len(shapes) * len(U.METHODS) * 2
    US.run_ulysses(tmp_path, world_size=2, shapes=shapes, repeats=2, warmup=1, tune=False)  # all done: no rows
    assert len(open(csv).readlines()) == n1
    df, meta = data.load(tmp_path, data.ULYSSES)
    assert set(meta["configs"]) == {f"{s.name}/P2" for s in shapes}
    assert (df["end_to_end_ms"] > 0).all() and (df["sender_visible_ms"] > 0).all()
    fused = df[df.method == "fused"]
    assert (fused["sender_visible_ms"] <= fused["end_to_end_ms"] * 1.5).all()   # device span vs events
    sp = ulysses_analysis.ulysses_speedups(df)
    print(sp.to_string(index=False))
    assert set(sp["shape"]) == {s.name for s in shapes} and (sp.speedup > 0).all()


# ------------------------------------------------------------------------------------------------ one GPU
ONE_GPU_CASES = [
    U.UlyssesShape("cogvideox5b_17776", 17_776, 48, 64),     # P=2: Sl = 8,888 straddles, 48-key tail
    U.UlyssesShape("straddle_d128", 9_000, 8, 128),           # P=2: Sl = 4,500 (straddles 20 rows); P=4: 2,250
]


# the ladder's candidates (kernels/attention.py): two programs per SM, by a register cap or by one-warpgroup
# programs; a candidate becomes a tuner default only with these passing in the same GPU call as its timing
LEVER_CONFIGS = [U.AttnConfig(128, 64, 8, 2, True, maxnreg=128), U.AttnConfig(64, 64, 4, 3, True)]


@pytest.mark.gpu
@pytest.mark.parametrize("link", ["local", "host"])
@pytest.mark.parametrize("P", [2, 4])
@pytest.mark.parametrize("config", [None, U.AttnConfig(128, 64, 4, 3, True)] + LEVER_CONFIGS,
                         ids=["default", "tma"] + [c.label for c in LEVER_CONFIGS])
def test_fused_bit_exact_and_close_on_one_gpu(P, link, config):
    """Every rank's output poisoned, the fused layer == our attention + the all-to-all (by indexing and by
    copies) bit for bit, error <= 2x PyTorch's; with link=host the peers' outputs are pinned host memory."""
    world = OneGPUWorld(P, link)
    res = U.check_job(world, ONE_GPU_CASES, random.randrange(2**30), None, config)
    assert [r["rank"] for r in res] == [r for _ in ONE_GPU_CASES for r in range(P)]
    assert any(r["straddles"] for r in res)


@pytest.mark.gpu
@pytest.mark.parametrize("link", ["local", "host"])
def test_one_gpu_fused_outputs_live_where_peers_receive(link):
    """The fused outputs are destination buffers (commit 9b3934c): with link=host every peer's output (and its
    copies-baseline receive buffer) is pinned host memory, the observed rank's on the GPU; link=local all on it."""
    world = OneGPUWorld(3, link)
    bufs = U.ulysses_buffers(world, 768, 6, 64, torch.bfloat16)
    recv = U.receive_buffers(world, 768, 2, 64, torch.bfloat16)
    for r in range(3):
        host = link == "host" and r != world.observed
        for t in (bufs.out.local(r), recv.local(r)):
            assert (t.device.type == "cpu" and t.is_pinned()) if host else t.device.type == "cuda", (link, r)


@pytest.mark.gpu
def test_missing_peer_times_out_with_report_on_one_gpu():
    U.barrier_timeout_job(OneGPUWorld(3, "host"), silent_rank=1)


@pytest.mark.gpu
@pytest.mark.parametrize("link", ["local", "host"])
def test_one_gpu_sweep_writes_and_resumes(tmp_path, link):
    shapes = [U.UlyssesShape("tiny_d64", 4_096, 8, 64), U.UlyssesShape("tiny_d128_straddle", 4_200, 4, 128)]
    csv = US.run_ulysses(tmp_path, world_size=2, shapes=shapes, repeats=2, warmup=1, tune=False, world="one-gpu",
                         link=link)
    df, meta = data.load(tmp_path, data.ULYSSES)
    from xstage import fa4

    from xstage import ulysses_gluon

    methods = (U.METHODS + (fa4.METHODS if fa4.available()[0] else ())    # every method the sweep has (item 6)
               + (ulysses_gluon.SWEEP_METHODS if ulysses_gluon.available()[0] else ()))
    assert set(df.method) == set(methods) and len(df) == len(shapes) * len(methods) * 2
    assert meta["params"]["world"] == "one-gpu" and meta["params"]["link"] == link
    assert meta["params"]["fused_outputs"] == data.ULYSSES_FUSED_OUTPUTS      # where the fused outputs live
    assert set(meta["bursts"]) == set(meta["overlap_chunks"]) == {f"{s.name}/P2" for s in shapes}
    b = meta["bursts"]["tiny_d64/P2"]
    assert b["remote"]["programs"] > 0 and b["local"]["programs"] > 0 and b["concurrent_max"] >= 1
    assert (df["end_to_end_ms"] > 0).all() and (df["sender_visible_ms"] > 0).all()
    US.run_ulysses(tmp_path, world_size=2, shapes=shapes, repeats=2, warmup=1, tune=False, world="one-gpu",
                   link=link)
    assert len(open(csv).readlines()) == 1 + len(df)
