"""MegaMoE round 9 (issue 15, items 2 and 4) on the CPU: the fp8 block-scale loads folded into one helper per
Linear (used by the TMA and the pointer main loops alike; run under Triton's interpreter against torch indexing),
tiles version 4 (fp8 through TMA with one stage more, round 8's ``tma_s``) as the default while older versions and
records read what they ran, studies gemm8 / controls8 pinned to what they measured, the device script's stages;
on one GPU (marker ``gpu``) the new fp8 default bit-identical to version 3's pointer loops."""
import ast
import dataclasses
import inspect
import random
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from xstage import env
from xstage import moe_gemm as MG
from xstage import moe_plan as MP
from xstage.kernels import moe as K


# ------------------------------------------------------------------------------------- the fold (task 1)
@triton.jit
def _scales_probe(xs_ptr, w1s_ptr, hs_ptr, w2s_ptr, out1_ptr, out2_ptr, row0, row_end, Hd, I, expert,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Every (column block, K block) of one expert's row block: the helpers' scales, stored as [a_s | w scales]."""
    rows = row0 + tl.arange(0, BLOCK_M)
    row_ok = rows < row_end
    rows64 = rows.to(tl.int64)
    e64 = expert.to(tl.int64)
    m = tl.arange(0, BLOCK_M)
    i = 0
    for col_block in range(0, I // BLOCK_N):
        for k in range(0, Hd, BLOCK_K):
            a_s, g_s, u_s = K._linear1_scales(xs_ptr, w1s_ptr, e64, rows64, row_ok, col_block, k, Hd, I, BLOCK_N,
                                              BLOCK_K)
            base = out1_ptr + i * (BLOCK_M + 2)
            tl.store(base + m, a_s)
            tl.store(base + BLOCK_M, g_s)
            tl.store(base + BLOCK_M + 1, u_s)
            i += 1
    j = 0
    for col_block in range(0, Hd // BLOCK_N):
        for k in range(0, I, BLOCK_K):
            a_s, w_s = K._linear2_scales(hs_ptr, w2s_ptr, e64, rows64, row_ok, col_block, k, Hd, I, BLOCK_N,
                                         BLOCK_K)
            base = out2_ptr + j * (BLOCK_M + 1)
            tl.store(base + m, a_s)
            tl.store(base + BLOCK_M, w_s)
            j += 1


@pytest.mark.interpreter
def test_fp8_scale_helpers_load_the_blocks_the_layouts_name():
    """Under the interpreter (fp32 scales; the layouts of kernels/moe.py's docstring): for a row block that runs
    past its expert's end, every column block and K block, a_s is the rows' 1 x 128 scale (0 past the end), the
    gate / up / W2 block scales the 128 x 128 ones. Fresh random scales (never zeros)."""
    if not env.interpreted():
        pytest.skip("runs under Triton's interpreter")
    B = 16                                   # stands in for the 128 scale block (the helpers take it as BLOCK_N/K)
    El, R, Hd, I = 3, 40, 3 * B, 2 * B
    g = torch.Generator().manual_seed(random.randrange(2**31))
    xs = torch.rand(R, Hd // B, generator=g) + 0.5
    w1s = torch.rand(El, 2 * I // B, Hd // B, generator=g) + 0.5
    hs = torch.rand(R, I // B, generator=g) + 0.5
    w2s = torch.rand(El, Hd // B, I // B, generator=g) + 0.5
    e, row0, row_end, BM = 1, 24, 33, 16     # 9 rows left of the expert: 7 rows of the block read 0
    n1, n2 = (I // B) * (Hd // B), (Hd // B) * (I // B)
    out1 = torch.full((n1, BM + 2), float("nan"))
    out2 = torch.full((n2, BM + 1), float("nan"))
    _scales_probe[(1,)](xs, w1s, hs, w2s, out1, out2, row0, row_end, Hd, I, e, BLOCK_M=BM, BLOCK_N=B, BLOCK_K=B)
    rows = torch.arange(row0, row0 + BM)
    ok = rows < row_end
    i = 0
    for cb in range(I // B):
        for kb in range(Hd // B):
            want = torch.where(ok, xs[rows.clamp(max=R - 1), kb], torch.zeros(()))
            assert torch.equal(out1[i, :BM], want)
            assert out1[i, BM] == w1s[e, cb, kb] and out1[i, BM + 1] == w1s[e, I // B + cb, kb]
            i += 1
    j = 0
    for cb in range(Hd // B):
        for kb in range(I // B):
            want = torch.where(ok, hs[rows.clamp(max=R - 1), kb], torch.zeros(()))
            assert torch.equal(out2[j, :BM], want) and out2[j, BM] == w2s[e, cb, kb]
            j += 1


def _calls(fn) -> list[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn.fn if hasattr(fn, "fn") else fn)))
    return [n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", "")
            for n in ast.walk(tree) if isinstance(n, ast.Call)]


def test_both_main_loops_take_their_scales_from_the_one_helper():
    """The fold: each Linear's TMA and pointer main loops call its scale helper, and no loop loads a scale itself
    (the scale tensors appear in no tl.load outside the helpers)."""
    for fn, helper in ((K._linear1_acc_tma, "_linear1_scales"), (K._linear1_tile, "_linear1_scales"),
                       (K._linear2_acc_tma, "_linear2_scales"), (K._linear2_tile, "_linear2_scales")):
        assert _calls(fn).count(helper) == 1, fn
    src = Path(K.__file__).read_text()
    for name in ("xs_ptr + rows64", "hs_ptr + rows64", "s_base +", "w2s_ptr + e64"):
        loads = [ln for ln in src.splitlines() if "tl.load(" in ln and name in ln]
        assert len(loads) == (2 if name == "s_base +" else 1), (name, loads)
