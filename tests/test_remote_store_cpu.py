"""The burst-gap kernel under Triton's CPU interpreter with emulated ranks: every destination holds exactly
the bytes its sender stored (poisoned first, fresh random seeds), for 2, 4 and 8 ranks; the compiled kernel
issues stores of the width asked for; bad parameters fail before any launch."""
import os
import random
import subprocess
import sys

import pytest
import torch

from xstage import cli, sweep
from xstage.ranks import EmulatedWorld
from xstage.remote_store import (POISON, BurstGapPoint, burst_gap_buffers, check_destination, launch_burst_gap,
                                 payload_reference)

pytestmark = pytest.mark.interpreter


@pytest.mark.parametrize("world_size", [2, 4, 8])
@pytest.mark.parametrize("target", ["remote", "local"])
@pytest.mark.parametrize("store_bytes", [4, 8, 16])
def test_destinations_bit_exact(world_size, target, store_bytes):
    programs, kib, bursts = random.choice([(1, 1, 3), (3, 2, 2), (5, 1, 2)])
    p = BurstGapPoint(target, programs, kib * 1024, 0, store_bytes, bursts, False, True)
    world = EmulatedWorld(world_size)
    symm, local = sweep.allocate(world, [p])
    sweep.check_point(world, symm, local, p, seed=random.randrange(2**31))


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
    symm, local = sweep.allocate(world, [p])
    df = sweep.measure_point(world, symm, local, p, repeats=2)
    assert len(df) == 2 * 2 * 3 and set(df["rank"]) == {0, 1}


PTX_CHECK = r"""
import re, triton
from triton.backends.compiler import GPUTarget
import xstage.kernels.remote_store as k
sig = {'dst_addr': 'i64', 'ts_ptr': '*i64', 'cal_ptr': '*i64', 'bar_ptr': '*i32', 'status_ptr': '*i64',
       'burst_elems': 'i32', 'gap_cycles': 'i64', 'seed': 'i32', 'max_polls': 'i32', 'N_BURSTS': 'constexpr',
       'V': 'constexpr', 'R': 'constexpr', 'DRAIN': 'constexpr', 'SYNC': 'constexpr', 'DEVICE': 'constexpr'}
for v in (1, 2, 4):
    src = triton.compiler.ASTSource(fn=k.burst_gap_store_kernel, signature=sig, constexprs=dict(
        N_BURSTS=2, V=v, R=128, DRAIN=True, SYNC=True, DEVICE=True))
    ptx = triton.compile(src, target=GPUTarget('cuda', 90, 32)).asm['ptx']
    print(v, sorted(set(re.findall(r'st\.global\.(?:v\d\.)?b32', ptx))), 'fence.acq_rel.sys' in ptx,
          '%clock64' in ptx, 'ld.global.gpu.acquire' in ptx)
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
                     "4 ['st.global.v4.b32'] True True True"]


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
    (["--world-size", "1"], "world_size must be >= 2"),
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
