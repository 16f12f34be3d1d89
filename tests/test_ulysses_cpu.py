"""Fused Ulysses attention under Triton's CPU interpreter with emulated ranks: the fused layer equals our attention
followed by the all-to-all (torch indexing) bit for bit, outputs poisoned with NaN first, for 2 and 4 ranks,
head dims 64 and 128, tiles that straddle two ranks and a partial last key block; both within 2x PyTorch's own
error of the float32 reference; the end-of-layer barrier completes, and a peer that never signals gives an error
naming waiter and peer; bad inputs fail before any launch; the kernel compiles for sm_90 with wgmma and 16-byte
peer stores."""
import os
import random
import subprocess
import sys

import pytest

import xstage.ranks
from xstage.ranks import free_port
import torch

from xstage import data, ulysses_analysis
from xstage import ulysses as U
from xstage import ulysses_sweep as US
from xstage.numeric import check_bit_identical
from xstage.ranks import EmulatedWorld
from conftest import record_launches

pytestmark = pytest.mark.interpreter


def _inputs(S, H, D, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(S, H, D, generator=g).to(dtype) for _ in range(3)]


# (P, S, H, D, BLOCK_M, BLOCK_N): Sl = S / P; "straddle" = Sl % BLOCK_M != 0, "tail" = S % BLOCK_N != 0
CASES = [
    pytest.param(2, 256, 4, 64, 64, 64, torch.float16, id="P2-D64-even"),
    pytest.param(2, 256, 4, 128, 32, 32, torch.float16, id="P2-D128-even"),
    pytest.param(2, 320, 4, 64, 64, 64, torch.float16, id="P2-D64-straddle"),        # Sl = 160
    pytest.param(2, 360, 2, 128, 64, 64, torch.float16, id="P2-D128-straddle-tail"),  # Sl = 180, 40-key tail
    pytest.param(4, 384, 4, 128, 64, 32, torch.float16, id="P4-D128-straddle"),       # Sl = 96
    pytest.param(4, 360, 4, 64, 32, 64, torch.float32, id="P4-D64-straddle-tail-fp32"),  # Sl = 90
    pytest.param(8, 360, 8, 64, 32, 32, torch.float16, id="P8-D64-straddle-tail", marks=pytest.mark.slow),        # Sl = 45 (issue 4)
    pytest.param(2, 360, 2, 128, 64, 64, torch.float16, True, id="P2-D128-straddle-tail-tma"),
    pytest.param(4, 360, 4, 64, 32, 32, torch.float32, True, id="P4-D64-straddle-tail-fp32-tma",
                 marks=pytest.mark.slow),   # the P2 TMA case and the P4 pointer case cover its paths
]


@pytest.mark.parametrize("P,S,H,D,bm,bn,dtype,tma", [c if len(c.values) == 8 else
                                                     pytest.param(*c.values, False, id=c.id, marks=c.marks) for c in CASES])
def test_fused_bit_exact_and_within_2x_torch(P, S, H, D, bm, bn, dtype, tma):
    """check_job: NaN-poisoned outputs, fused == attention + all-to-all bit for bit, error <= 2x PyTorch's
    (K/V through pointers, or through tensor descriptors: TMA)."""
    res = U.check_job(EmulatedWorld(P), [(S, H, D)], seed=random.randrange(2**30), dtype=dtype,
                      config=U.AttnConfig(bm, bn, 4, 1, tma))
    assert [r["rank"] for r in res] == list(range(P))
    assert all(r["straddles"] == bool(S // P % bm) for r in res)
    assert all(r["rel_l2"] <= 2 * r["rel_l2_torch"] + U.REL_L2_FLOOR[dtype] for r in res)


def test_fused_matches_reference_ulysses_and_layout_helpers():
    """The public pieces one by one: shard_heads (pre all-to-all), the fused layer, post_all_to_all of our
    attention, and reference_ulysses (float32) agree; pre/post all-to-all invert each other."""
    P, S, H, D = 2, 320, 4, 64
    cfg = U.AttnConfig(64, 64, 4, 1)
    q_all, k_all, v_all = _inputs(S, H, D, seed=3)
    world = EmulatedWorld(P)
    q, k, v = (U.shard_heads(x, P) for x in (q_all, k_all, v_all))
    bufs = U.ulysses_buffers(world, S, H, D, torch.float16)
    for r in range(P):
        bufs.out_view(r, S, H, D).fill_(float("nan"))
    out = U.ulysses_fused(world, q, k, v, bufs, config=cfg)
    serial = U.post_all_to_all([U.attention_forward(q[r], k[r], v[r], config=cfg) for r in range(P)])
    ref = U.reference_ulysses(q_all, k_all, v_all, P)
    pt = U.attention_reference(q_all, k_all, v_all, upcast=False)
    for r in range(P):
        check_bit_identical(out[r], serial[r], f"rank {r}")
        U.check_close(out[r], ref[r], pt[r * S // P:(r + 1) * S // P], f"rank {r}")
    # layouts: sequence-sharded -> head-sharded -> back
    seq = [q_all[r * S // P:(r + 1) * S // P] for r in range(P)]
    assert all(torch.equal(a, b) for a, b in zip(U.pre_all_to_all(seq), q))
    assert all(torch.equal(a, b) for a, b in zip(U.post_all_to_all(U.pre_all_to_all(seq)), seq))


def test_tma_loads_equal_pointer_loads_bit_for_bit():
    """The TMA variant reads the same K/V blocks (rows past S as zeros, then masked): same output bits."""
    S, H, D = 200, 3, 64
    q, k, v = _inputs(S, H, D, seed=random.randrange(2**30))
    a = U.attention_forward(q, k, v, config=U.AttnConfig(64, 64, 4, 1))
    b = U.attention_forward(q, k, v, config=U.AttnConfig(64, 64, 4, 1, True))
    assert not torch.isnan(a).any()
    check_bit_identical(b, a, "tma vs pointer loads")


def test_head_chunks_equal_the_full_launch():
    """The overlapped baseline computes head chunks; each equals the full launch's heads bit for bit."""
    q, k, v = _inputs(192, 3, 64, seed=5)
    cfg = U.AttnConfig(64, 64, 4, 1)
    full = U.attention_forward(q, k, v, config=cfg)
    part = U.attention_forward(q, k, v, config=cfg, h_start=1, heads=2)
    assert torch.equal(part, full[:, 1:3])


def test_check_bit_exact_names_unwritten_elements():
    P, S, H, D = 2, 256, 2, 64
    q_all, k_all, v_all = _inputs(S, H, D, seed=7)
    world = EmulatedWorld(P)
    q, k, v = (U.shard_heads(x, P) for x in (q_all, k_all, v_all))
    bufs = U.ulysses_buffers(world, S, H, D, torch.float16)
    out = U.ulysses_fused(world, q, k, v, bufs, config=U.AttnConfig(64, 64, 4, 1))
    want = out[1].clone()
    out[1][100, 1, 7] = float("nan")                                   # as if that element was never stored
    with pytest.raises(AssertionError, match=r"1 of \d+ elements differ \(1 still NaN.*\[100, 1, 7\]"):
        check_bit_identical(out[1], want, "rank 1")


def test_timestamps_buffer_under_the_interpreter():
    P, S, H, D = 2, 128, 2, 64
    cfg = U.AttnConfig(64, 64, 4, 1)
    world = EmulatedWorld(P)
    q, k, v = (U.shard_heads(x, P) for x in _inputs(S, H, D))
    bufs = U.ulysses_buffers(world, S, H, D, torch.float16)
    n = U.n_programs(S, H // P, cfg)
    ts = {r: torch.full((n, 2), -1, dtype=torch.int64) for r in range(P)}
    U.ulysses_fused(world, q, k, v, bufs, config=cfg, ts=ts)
    assert all(torch.equal(t, torch.zeros_like(t)) for t in ts.values())   # no timer there: every program wrote 0
    assert U.sender_visible_ms(ts[0], n) == 0.0


# ----------------------------------------------------------------------- GPU baselines' layouts, on gloo
def _gloo_worker(rank, P, port, q_all, k_all, v_all, want):
    """One CPU process per rank (gloo): the serial and overlapped baselines' collectives and relayouts."""
    import types

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=P)
    try:
        world = types.SimpleNamespace(dist=dist, world_size=P, local_ranks=[rank], emulated=False)
        Hl = q_all.shape[1] // P
        q, k, v = (x[:, rank * Hl:(rank + 1) * Hl].contiguous() for x in (q_all, k_all, v_all))
        cfg = U.AttnConfig(64, 64, 4, 1)
        serial = U.post_all_to_all_nccl(U.attention_forward(q, k, v, config=cfg), world)
        check_bit_identical(serial, want[rank], f"serial rank {rank}")
        overlapped = U.make_overlapped(world, q, k, v, chunks=2, config=cfg)
        check_bit_identical(overlapped(), want[rank], f"overlapped rank {rank}")
        check_bit_identical(overlapped(), want[rank], f"overlapped rank {rank}, second call")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_serial_and_overlapped_baselines_relayout_like_torch_indexing():
    """The GPU baselines' all_to_all_single + relayout (serial) and head-chunk pipeline (overlapped, async
    collectives) produce the post-all-to-all layout bit for bit; run here with gloo on CPU processes."""
    import torch.multiprocessing as mp

    P, S, H, D = 2, 128, 6, 64                    # Hl = 3 heads: chunks of 1 and 2 heads
    q_all, k_all, v_all = _inputs(S, H, D, torch.float32, seed=11)
    cfg = U.AttnConfig(64, 64, 4, 1)
    q, k, v = (U.shard_heads(x, P) for x in (q_all, k_all, v_all))
    want = U.post_all_to_all([U.attention_forward(q[r], k[r], v[r], config=cfg) for r in range(P)])
    port = free_port()
    mp.spawn(_gloo_worker, args=(P, port, q_all, k_all, v_all, want), nprocs=P, join=True)


def test_sweep_job_end_to_end_on_one_gloo_rank(tmp_path, monkeypatch, cpu_timing):
    """The sweep's whole flow on one CPU rank (gloo; P = 1 is a degenerate Ulysses layer, but every step runs):
    tuning, the bit-exact pre-check, each method's timing (a CPU stand-in for time_ms), the cuDNN baselines
    skipped on every rank when cuDNN SDPA cannot run, rows appended per shape, configs in the sidecar, resume."""
    import types

    import torch.distributed as dist

    from xstage import env

    monkeypatch.setattr(US, "H200_CONFIGS", {64: (U.AttnConfig(64, 64, 4, 1), U.AttnConfig(32, 32, 4, 1))})
    port = free_port()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        emu = EmulatedWorld(1)
        world = types.SimpleNamespace(dist=dist, world_size=1, local_ranks=[0], emulated=False,
                                      device=emu.device, symmetric_empty=emu.symmetric_empty, barrier=emu.barrier)
        shapes = [U.UlyssesShape("a", 96, 2, 64), U.UlyssesShape("b", 64, 1, 64)]
        meta = env.provenance("test", {})
        US.ulysses_job(world, shapes, str(tmp_path), meta, 2, 1, list(U.METHODS), True, 2, 0)
        df, meta = data.load(tmp_path, data.ULYSSES)
        assert set(df.method) == {"fused", "serial_triton", "overlapped", "attention_only"}   # no cuDNN on CPU
        assert len(df) == 2 * 4 * 2 and set(meta["configs"]) == {"a/P1", "b/P1"}
        US.ulysses_job(world, shapes + [U.UlyssesShape("c", 64, 2, 64)], str(tmp_path), meta, 2, 1,
                      ["fused"], False, 2, 0)
        df, _ = data.load(tmp_path, data.ULYSSES)
        assert len(df) == 2 * 4 * 2 + 2 and set(df[df["shape"] == "c"].method) == {"fused"}
        assert (df[df.method == "fused"].sender_visible_ms == 0).all()             # no device timer here
    finally:
        dist.destroy_process_group()


def test_sdpa_baseline_layout():
    """sdpa_cudnn views [S, Hl, D] as [1, Hl, S, D] and back (run here with the CPU backend)."""
    q, k, v = _inputs(96, 3, 64, torch.float32, seed=13)
    U.check_close(U.sdpa_cudnn(q, k, v), U.attention_reference(q, k, v), U.attention_reference(q, k, v), "sdpa")


# ------------------------------------------------------------------------------------------------- barrier
def test_barrier_completes_with_increasing_epochs():
    world = EmulatedWorld(4)
    bufs = U.ulysses_buffers(world, 4, 4, 64, torch.float16)
    for epoch in (1, 2, 3):
        U.end_barrier(world, bufs, max_polls=10)
        assert bufs.epoch == epoch
        assert all(torch.equal(bufs.flags.local(r), torch.full((4,), epoch, dtype=torch.int32)) for r in range(4))
        assert all(int(bufs.status[r][:, 5].sum()) == 0 for r in range(4))


def test_missing_peer_times_out_naming_waiter_and_peer():
    P, S, H, D = 2, 128, 2, 64
    world = EmulatedWorld(P)
    q, k, v = (U.shard_heads(x, P) for x in _inputs(S, H, D))
    bufs = U.ulysses_buffers(world, S, H, D, torch.float16)
    with pytest.raises(RuntimeError, match=r"rank 0 timed out waiting for rank 1 \(expected epoch 1, saw 0 "
                                           r"after 20 polls"):
        U.ulysses_fused(world, q, k, v, bufs, config=U.AttnConfig(64, 64, 4, 1), max_polls=20, silent_ranks=(1,))


def test_barrier_timeout_job_with_three_ranks():
    U.barrier_timeout_job(EmulatedWorld(3), silent_rank=1, max_polls=20)   # ranks 0 and 2 both name rank 1


# --------------------------------------------------------------------------------------------- validation
@pytest.fixture
def no_launch(monkeypatch):
    launched = record_launches(monkeypatch, [(U, "ulysses_attention_kernel"), (xstage.ranks, "epoch_barrier_kernel")])
    yield launched
    assert not launched, "a kernel was launched although the inputs were bad"


def _bad_fused(S=128, D=64, dtype=torch.float16, edit=None):
    """The fused layer on 2 emulated ranks (1 head each) with valid buffers and inputs made bad by the caller."""
    world = EmulatedWorld(2)
    bufs = U.ulysses_buffers(world, 128, 2, 64, torch.float16)
    qkv = {n: {r: torch.zeros(S, 1, D, dtype=dtype) for r in range(2)} for n in "qkv"}
    if edit:
        edit(qkv)
    U.ulysses_fused(world, qkv["q"], qkv["k"], qkv["v"], bufs)


@pytest.mark.parametrize("call,match", [
    (lambda: U.ulysses_buffers(EmulatedWorld(4), 128, 6, 64), r"heads \(6\) must be a positive multiple of .*\(4\)"),
    (lambda: U.check_job(EmulatedWorld(4), [(128, 6, 64)], 0), r"heads \(6\) must be a positive multiple"),
    (lambda: U.reference_ulysses(*_inputs(128, 6, 64), 4), r"heads \(6\)"),
    (lambda: U.check_job(EmulatedWorld(2), [(130, 4, 96)], 0), r"head dim must be one of \(64, 128\), got 96"),
    (lambda: U.attention_forward(*_inputs(64, 2, 96)), r"head dim must be one of \(64, 128\), got 96"),
    (lambda: _bad_fused(D=96), r"head dim must be one of"),
    (lambda: U.attention_forward(*_inputs(64, 2, 64, torch.bfloat16)), r"float16 or float32 under Triton's interp"),
    (lambda: _bad_fused(dtype=torch.bfloat16), r"bf16 tl.dot is wrong"),
    (lambda: U.check_job(EmulatedWorld(2), [(128, 2, 64)], 0, dtype=torch.bfloat16), r"bf16 tl.dot is wrong"),
    (lambda: _bad_fused(edit=lambda t: t["k"].update({1: torch.zeros(64, 1, 64, dtype=torch.float16)})),
     r"q, k, v shapes differ"),
    (lambda: _bad_fused(edit=lambda t: t["v"].update({0: torch.zeros(128, 1, 64)})), r"dtypes differ"),
    (lambda: _bad_fused(edit=lambda t: [t[n].update({1: torch.zeros(64, 1, 64, dtype=torch.float16)})
                                         for n in "qkv"]), r"ranks have different \[S, Hl, D\]"),
    (lambda: _bad_fused(edit=lambda t: t["q"].update({0: torch.zeros(128, 2, 64, dtype=torch.float16)[:, :1]})),
     r"q must be contiguous"),
    (lambda: _bad_fused(edit=lambda t: t["q"].pop(1)), r"q has no tensor for local rank 1"),
    (lambda: _bad_fused(S=127), r"sequence length \(127\) must be a positive multiple"),
    (lambda: U.attention_forward(*_inputs(64, 2, 64), config=U.AttnConfig(48, 64)), r"block_m must be a power"),
    (lambda: U.attention_forward(*_inputs(64, 2, 64), h_start=1, heads=2), r"not within this rank's 2"),
    (lambda: U.ulysses_fused(EmulatedWorld(2), *([{r: torch.zeros(256, 2, 64, dtype=torch.float16)
                                                   for r in range(2)}] * 3),
                             U.ulysses_buffers(EmulatedWorld(2), 128, 4, 64, torch.float16)),
     r"exceeds the buffers"),
])
def test_bad_inputs_fail_before_any_launch(no_launch, call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_sweep_parameters_and_gpus_checked_before_anything_runs(tmp_path):
    with pytest.raises(ValueError, match="world_size must be >= 2"):
        US.run_ulysses(tmp_path, world_size=1)
    with pytest.raises(ValueError, match="methods must be a non-empty subset"):
        US.run_ulysses(tmp_path, methods=("fused", "magic"))
    with pytest.raises(ValueError, match=r"heads \(6\) must be"):
        US.run_ulysses(tmp_path, shapes=[U.UlyssesShape("bad", 4096, 6, 64)], world_size=4)
    with pytest.raises(ValueError, match=r"head dim must be one of"):
        US.run_ulysses(tmp_path, shapes=[U.UlyssesShape("bad", 4096, 8, 96)], world_size=2)
    with pytest.raises(ValueError, match=r"shape names must be unique"):
        US.run_ulysses(tmp_path, shapes=[U.UlyssesShape("a", 4096, 8, 64)] * 2, world_size=2)
    if torch.cuda.device_count() < 2:
        with pytest.raises(RuntimeError, match="needs 2 CUDA GPU"):
            US.run_ulysses(tmp_path, world_size=2)
    assert not any(tmp_path.iterdir())


# ----------------------------------------------------------------------------------- shapes, counts, data
def test_shape_table_and_rounding(capsys):
    assert [s.name for s in U.shapes_for(2)] == [s.name for s in U.DEFAULT_SHAPES]
    p8 = U.shapes_for(8)
    assert "wan21_1.3b_32760" not in [s.name for s in p8] and "12 heads do not divide by 8" in capsys.readouterr().err
    assert [s.S for s in U.shapes_for(16, [U.UlyssesShape("x", 4104, 16, 64)])] == [4096]
    assert "rounded down to 4096" in capsys.readouterr().err
    assert [s.S for s in U.SEQ_SWEEP] == [4096 * 2**i for i in range(6)]
    wan = next(s for s in U.DIT_SHAPES if s.name == "wan21_14b_75600")
    assert (wan.S // 8) % 128 == 106 and (wan.S // 2) % 128 == 40          # its tiles straddle ranks


def test_flop_count_matches_torch_flop_counter():
    from torch.utils.flop_counter import FlopCounterMode

    S, H, D = 64, 3, 64
    q, k, v = (torch.randn(H, S, D) for _ in range(3))
    with FlopCounterMode(display=False) as fc:                       # the two matmuls of attention, per head
        torch.softmax(q @ k.transpose(1, 2), dim=-1) @ v
    assert fc.get_total_flops() == U.attention_flops(S, H, D)
    assert U.alltoall_bytes(4096, 24, 128, 2) == 4096 * 12 * 128 * 2 // 2


def test_schema_resume_and_summary(tmp_path):
    rows = [dict(shape="s", S=4096, H=24, D=128, P=2, method=m, sender_visible_ms=t, end_to_end_ms=t * e,
                 repeat=i, tflops=1.0) for m, t, e in (("fused", 1.0, 1.2), ("serial_triton", 1.5, 1.0),
                                                         ("attention_only", 0.9, 1.0)) for i in range(3)]
    meta = {k: "x" for k in data.REQUIRED_META}
    csv = data.start_file(tmp_path, data.ULYSSES, meta)
    data.append_rows(csv, data.ULYSSES, __import__("pandas").DataFrame(rows))
    assert data.done_keys(csv, data.ULYSSES) == {("s", 4096, 24, 128, 2)}
    df, _ = data.load(tmp_path, data.ULYSSES)
    sp = ulysses_analysis.ulysses_speedups(df).set_index("line").speedup
    assert sp["fused_sv"] == 1.5 and sp["fused_e2e"] == 1.25
    assert ulysses_analysis.ulysses_ratios(df).fused_sv.iloc[0] == pytest.approx(1.111, abs=1e-3)


# ------------------------------------------------------------------------------------------ sm_90 compile
PTX_CHECK = r"""
import re, triton
from triton.backends.compiler import GPUTarget
import xstage.kernels.attention as k
for d, warps, stages, tma in ((64, 4, 3, False), (128, 4, 2, False), (128, 8, 3, True)):
    desc = f'tensordesc<bf16[64,{d}]>' if tma else 'constexpr'
    sig = {'Q': '*bf16', 'K': '*bf16', 'V': '*bf16', 'Kd': desc, 'Vd': desc, 'out_ptr': '*bf16',
           'out_table': '*i64', 'ts_ptr': '*i64', 'S': 'i32', 'rows_per_rank': 'i32', 'in_row_stride': 'i32',
           'out_row_stride': 'i32', 'h_start': 'i32', 'out_head0': 'i32', 'qk_scale': 'fp32', 'n_heads': 'i32',
           'HEAD_DIM': 'constexpr', 'BLOCK_M': 'constexpr', 'BLOCK_N': 'constexpr', 'EVEN_N': 'constexpr',
           'FUSED': 'constexpr', 'TIMED': 'constexpr', 'DEVICE': 'constexpr', 'TMA': 'constexpr', 'WS': 'constexpr',
           'PERSISTENT': 'constexpr', 'PIPE': 'constexpr', 'SCALE_Q': 'constexpr'}
    ce = dict(HEAD_DIM=d, BLOCK_M=128, BLOCK_N=64, EVEN_N=False, FUSED=True, TIMED=True, DEVICE=True, TMA=tma,
              WS=False, PERSISTENT=False, PIPE=False, SCALE_Q=False)
    if not tma:
        ce.update(Kd=None, Vd=None)
    src = triton.compiler.ASTSource(fn=k.ulysses_attention_kernel, signature=sig, constexprs=ce,
        attrs={(a,): [['tt.divisibility', 16]] for a in (0, 1, 2, 5, 6, 7, 10, 11)})
    c = triton.compile(src, target=GPUTarget('cuda', 90, 32), options=dict(num_warps=warps, num_stages=stages))
    ptx = c.asm['ptx']
    print(d, 'wgmma' in ptx, sorted(set(re.findall(r'st\.global\.[\w.]+', ptx))), 'globaltimer' in ptx,
          c.metadata.num_warps, 'cp.async.bulk.tensor' in ptx, c.metadata.shared)
bsig = {'flag_table': '*i64', 'flags': '*i32', 'status_ptr': '*i64', 'rank': 'i32', 'world_size': 'i32',
        'epoch': 'i32', 'max_polls': 'i32', 'SIGNAL': 'constexpr', 'WAIT': 'constexpr', 'DEVICE': 'constexpr'}
import xstage.kernels.sync as ks
c = triton.compile(triton.compiler.ASTSource(fn=ks.epoch_barrier_kernel, signature=bsig, constexprs=dict(
    SIGNAL=True, WAIT=True, DEVICE=True)), target=GPUTarget('cuda', 90, 32), options=dict(num_warps=1))
print('barrier', sorted(set(re.findall(r'(?:atom|fence|ld\.global\.\w+\.acquire)[\w.]*', c.asm['ptx']))))
"""


def test_fused_kernel_compiles_for_hopper_with_wgmma_and_16_byte_peer_stores():
    """sm_90 compile on the CPU: wgmma tensor-core MMAs, the epilogue's peer stores are 16 bytes wide
    (st.global.v4.b32: the alignment hint survives the per-row pointer table), timers present; the barrier
    releases and acquires at system scope."""
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    out = subprocess.run([sys.executable, "-c", PTX_CHECK], env=env, capture_output=True, text=True, timeout=300)
    if out.returncode and "ptxas" in out.stderr.lower() and "not found" in out.stderr.lower():
        pytest.skip("Triton's CUDA backend is not usable here")
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    for line, d, warps, tma in zip(lines[:3], (64, 128, 128), (4, 4, 8), (False, False, True)):
        f = line.split(" ", 2)
        assert f[:2] == [str(d), "True"], line
        assert f"['st.global.b64', 'st.global.v4.b32'] True {warps} {tma} " in line, line  # b64: the timestamps;
        assert int(line.split()[-1]) <= 227 * 1024, line          # TMA: bulk tensor loads; fits H200 shared memory
    assert lines[3] == ("barrier ['atom.global.sys.release.exch.b32', 'fence.acq_rel.sys', "
                        "'ld.global.sys.acquire.b32']"), lines[2]


# ------------------------------------------------------------------ one process driving every rank (issue 14)
@pytest.mark.slow
def test_one_process_sweep_job_on_emulated_ranks(tmp_path, cpu_timing):
    """The one-GPU world's flow with EmulatedWorld (same code path: ``world.emulated``, one process): every
    rank's output poisoned and checked (fused and the copies baseline against the all-to-all by indexing, tiles
    straddling two ranks included), the overlapped pipeline checked over shared receive buffers, its head-chunk
    count picked by timing the candidates (recorded with their times), rows of the observed rank, resume."""
    shapes = [U.UlyssesShape("straddle", 160, 4, 64), U.UlyssesShape("even", 128, 6, 64)]   # Sl = 80, 64
    meta = __import__("xstage").env.provenance("test", {})
    world = EmulatedWorld(2)
    US.H200_CONFIGS[64], saved = (U.AttnConfig(64, 64, 4, 1),), US.H200_CONFIGS[64]
    try:
        US.ulysses_job(world, shapes, str(tmp_path), meta, 2, 1, list(U.METHODS), True, None,
                       random.randrange(2**20))
    finally:
        US.H200_CONFIGS[64] = saved
    df, meta = data.load(tmp_path, data.ULYSSES)
    assert set(df.method) == {"fused", "serial_triton", "overlapped", "attention_only"}   # no cuDNN on the CPU
    assert len(df) == 2 * 4 * 2 and set(df.P) == {2}
    oc = meta["overlap_chunks"]
    assert set(oc) == {"straddle/P2", "even/P2"}
    assert set(oc["straddle/P2"]["ms"]) == {"1", "2"} and set(oc["even/P2"]["ms"]) == {"1", "2", "3"}
    for v in oc.values():
        assert v["tuned"] and v["ms"][str(v["chosen"])] == min(v["ms"].values())
    assert "bursts" not in meta                                       # no device timers under the interpreter
    US.ulysses_job(world, shapes, str(tmp_path), meta, 2, 1, ["fused"], False, None, 0)   # all done: no rows
    assert len(data.load(tmp_path, data.ULYSSES)[0]) == len(df)


@pytest.mark.parametrize("P,S,H,chunks", [(2, 160, 4, 2), pytest.param(4, 192, 8, 3, marks=pytest.mark.slow)])
def test_copies_and_overlapped_equal_the_all_to_all_by_indexing(P, S, H, chunks):
    """The one-process baselines: every rank's sends by copies, then relayouts (serial), and every rank's
    head-chunk pipeline over shared receive buffers (overlapped), equal the all-to-all by indexing bit for bit."""
    D, cfg = 64, U.AttnConfig(32, 32, 4, 1)
    world = EmulatedWorld(P)
    q, k, v = (U.shard_heads(x, P) for x in _inputs(S, H, D, seed=random.randrange(2**30)))
    o = {r: U.attention_forward(q[r], k[r], v[r], config=cfg) for r in range(P)}
    want = U.post_all_to_all([o[r] for r in range(P)])
    got = U.post_all_to_all_copies(world, o)
    recvs = U.overlap_receive_buffers(world, S, H // P, D, torch.float16, chunks)
    fns = [U.make_overlapped(world, q[r], k[r], v[r], chunks, cfg, rank=r, recvs=recvs) for r in range(P)]
    for fn in fns:
        fn()
    for r in range(P):
        check_bit_identical(got[r], want[r], f"copies rank {r}")
        check_bit_identical(fns[r]().clone(), want[r], f"overlapped rank {r}")
    assert U.overlap_chunk_candidates(6) == [1, 2, 3, 4, 6] and U.overlap_chunk_candidates(1) == [1]


def test_fused_launches_only_the_given_ranks():
    """ranks=[r]: only rank r's kernel runs (its tiles land in every rank's output), the barrier is everyone's."""
    P, S, H, D = 2, 128, 2, 64
    cfg = U.AttnConfig(64, 64, 4, 1)
    world = EmulatedWorld(P)
    q, k, v = (U.shard_heads(x, P) for x in _inputs(S, H, D, seed=random.randrange(2**30)))
    bufs = U.ulysses_buffers(world, S, H, D, torch.float16)
    for r in range(P):
        bufs.out_view(r, S, H, D).fill_(float("nan"))
    out = U.ulysses_fused(world, {1: q[1]}, {1: k[1]}, {1: v[1]}, bufs, config=cfg, ranks=[1])
    assert list(out) == [1] and bufs.epoch == 1
    want = U.post_all_to_all([U.attention_forward(q[r], k[r], v[r], config=cfg) for r in range(P)])
    for r in range(P):   # rank 1's heads (columns 1) written everywhere, rank 0's (column 0) still NaN
        check_bit_identical(bufs.out_view(r, S, H, D)[:, 1], want[r][:, 1], f"rank {r}, rank 1's head")
        assert torch.isnan(bufs.out_view(r, S, H, D)[:, 0]).all()
    with pytest.raises(ValueError, match=r"ranks \[2\] must be a non-empty subset"):
        U.ulysses_fused(world, q, k, v, bufs, config=cfg, ranks=[2])


def test_epilogue_bursts_split_programs_by_destination():
    """Synthetic timestamps: programs are (head, query block), tiles split into remote / local / straddling by
    the rows' owner; concurrency from overlapping [start, end) intervals (two waves of 5 here)."""
    cfg = U.AttnConfig(64, 64, 4, 1)
    S, Hl, D, P = 320, 2, 64, 2                  # Sl = 160: blocks 0-1 local, 2 straddles, 3-4 remote (rank 0)
    n = U.n_programs(S, Hl, cfg)
    ts = torch.zeros(n, 2, dtype=torch.int64)
    for pid in range(n):
        m = pid % 5
        start = 0 if pid < 5 else 1000                               # head 0's programs, then head 1's
        ts[pid] = torch.tensor([start, start + (100 if m >= 3 else 50 if m == 2 else 20)])
    b = US.epilogue_bursts(ts, S, Hl, D, P, 0, cfg)
    assert (b["remote"]["programs"], b["local"]["programs"], b["straddle"]["programs"]) == (4, 4, 2)
    assert (b["remote"]["median_ns"], b["local"]["median_ns"], b["straddle"]["median_ns"]) == (100, 20, 50)
    assert b["tile_bytes"] == 64 * 64 * 2 and b["programs"] == n and b["concurrent_max"] == 5
    assert US.epilogue_bursts(torch.zeros(n, 2, dtype=torch.int64), S, Hl, D, P, 0, cfg) is None
    b1 = US.epilogue_bursts(ts, S, Hl, D, P, 1, cfg)
    assert b1["remote"]["median_ns"] == 20 and b1["local"]["median_ns"] == 100


def test_one_gpu_sweep_parameters_checked_before_anything_runs(tmp_path):
    with pytest.raises(ValueError, match=r"world must be one of gpus, one-gpu, got 'mesh'"):
        US.run_ulysses(tmp_path, world="mesh")
    with pytest.raises(ValueError, match=r"link must be one of local, host for the one-GPU world, got 'nvlink'"):
        US.run_ulysses(tmp_path, world="one-gpu", link="nvlink")
    with pytest.raises(ValueError, match=r"link 'host' is for --world one-gpu"):
        US.run_ulysses(tmp_path, link="host")
    with pytest.raises(ValueError, match=r"world_size must be >= 2"):
        US.run_ulysses(tmp_path, world="one-gpu", world_size=1)
    with pytest.raises(ValueError, match=r"chunks must be >= 1"):
        US.run_ulysses(tmp_path, world="one-gpu", chunks=0)
    with pytest.raises(ValueError, match=r"sequence length \(4097\) must be a positive multiple"):
        US.run_ulysses(tmp_path, world="one-gpu", shapes=[U.UlyssesShape("odd", 4097, 8, 64)])
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="needs 1 CUDA GPU"):
            US.run_ulysses(tmp_path, world="one-gpu", world_size=2)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("argv,match", [
    (["--link", "host"], r"--link host is for --world one-gpu"),
    (["--world", "one-gpu", "--link", "nvlink"], r"invalid choice: 'nvlink'"),
    (["--world", "one-gpu", "--ranks", "1"], r"world_size must be >= 2"),
    (["--world", "one-gpu", "--chunks", "0"], r"chunks must be >= 1"),
    (["--world", "one-gpu", "--shapes", "nope"], r"unknown shape"),
])
def test_cli_one_gpu_bad_inputs_one_line_before_anything(tmp_path, capsys, argv, match):
    from xstage import cli

    try:
        code = cli.main(["sweep", "ulysses", "--out", str(tmp_path / "x"), *argv])
    except SystemExit as e:              # argparse's own errors
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert __import__("re").search(match, err, __import__("re").I), err
    assert not (tmp_path / "x").exists()


# ------------------------------------------------- where the one-GPU fused outputs live (commit 9b3934c's fix)
def _copy_record(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return {p.name: p.read_bytes() for p in dst.iterdir()}


def test_fused_outputs_placement_of_the_records():
    """The archived host record (fused outputs in device memory) is placed before the fix, the FA records (made after
    it, no field) and every sweep that names ``params.fused_outputs`` by that field; one process per GPU always."""
    h = data.machine_dir("h200x1") / "archive"
    assert data.ulysses_fused_outputs(data.read_meta(h / "ulysses_host_fused_outputs_on_gpu/ulysses.json",
                                                     data.ULYSSES)) == data.ULYSSES_OUTPUTS_BEFORE_FIX
    assert data.ulysses_fused_outputs(data.read_meta(h / "ulysses_fa4_fused_host/ulysses.json", data.ULYSSES)) == \
        data.ULYSSES_FUSED_OUTPUTS
    early = "2026-01-01T00:00:00+00:00"
    one = {"world": "one-gpu", "link": "host"}
    assert data.ulysses_fused_outputs({"params": one, "date_utc": early}) == data.ULYSSES_OUTPUTS_BEFORE_FIX
    assert data.ulysses_fused_outputs({"params": {**one, "fused_outputs": "destination"}, "date_utc": early}) == \
        "destination"
    assert data.ulysses_fused_outputs({"params": {"world": "gpus"}, "date_utc": early}) == data.ULYSSES_FUSED_OUTPUTS


def test_host_sweep_refuses_a_record_made_before_the_fix(tmp_path, capsys):
    """``xstage sweep ulysses --world one-gpu --link host`` into the archived host folder (fused outputs in device
    memory) is one clear error before the GPU check and anything else: the folder's files are unchanged. The same
    folder's copy with the local link (every buffer in device memory either way) passes the check (then, without a
    GPU, the GPU error); so does a host folder whose first run names destination outputs but whose appended run
    does not, refused too."""
    from xstage import cli

    old = tmp_path / "old"
    before = _copy_record(data.machine_dir("h200x1") / "archive" / "ulysses_host_fused_outputs_on_gpu", old)
    with pytest.raises(data.DataError, match=r"fused outputs in device \(before the fix\).*record into a new folder"):
        US.run_ulysses(old, world="one-gpu", link="host", world_size=2)
    code = cli.main(["sweep", "ulysses", "--world", "one-gpu", "--ranks", "2", "--link", "host", "--out", str(old)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "record into a new folder" in err, err
    assert {p.name: p.read_bytes() for p in old.iterdir()} == before
    US.check_outputs_placement(old, "local")                   # the local link: nothing differs, it continues
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="needs 1 CUDA GPU"):
            US.run_ulysses(old, world="one-gpu", link="local", world_size=2)
    # a record of the fixed sweep continues; one with a run appended from before the fix does not
    meta = data.read_meta(old / "ulysses.json", data.ULYSSES)
    meta["params"]["fused_outputs"] = data.ULYSSES_FUSED_OUTPUTS
    meta["runs"] = []
    data.write_json_atomic(old / "ulysses.json", meta)
    US.check_outputs_placement(old, "host")
    meta["runs"] = [{"params": {"world": "one-gpu", "link": "host"}, "date_utc": "2026-12-01T13:50:33+00:00",
                     "command": "x", "git_commit": "254c00b"}]
    data.write_json_atomic(old / "ulysses.json", meta)
    with pytest.raises(data.DataError, match=r"run of 2026-12-01T13:50:33"):
        US.check_outputs_placement(old, "host")


def test_one_gpu_sweep_names_where_the_fused_outputs_live(tmp_path, monkeypatch):
    """The one-GPU sweep's sidecar params name the placement (``fused_outputs``), so a later sweep can tell."""
    got = {}
    monkeypatch.setattr(US.env, "require_gpus", lambda *a, **k: None)
    monkeypatch.setattr(US.env, "apply_safe_env", lambda *a, **k: None)
    monkeypatch.setattr(xstage.ranks, "OneGPUWorld", lambda *a, **k: None)
    monkeypatch.setattr(US, "ulysses_job", lambda world, shapes, folder, meta, *a: got.update(meta))
    US.run_ulysses(tmp_path, world="one-gpu", link="host", world_size=2, methods=["fused"])
    assert got["params"]["fused_outputs"] == data.ULYSSES_FUSED_OUTPUTS == "destination"
    assert got["params"]["link"] == "host"
