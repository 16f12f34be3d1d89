"""MegaMoE's seeded inputs and its float32 reference: expert weights and tokens (seeded per expert and rank, the
same values on any rank of one device type), the fp8 block quantisation the kernel applies (1 x 128 for
activations, 128 x 128 for weights, scale = max(amax, 1e-4) / 448), the torch reference of one rank's combine
buffer, the top-k reduction, and the closeness check every MegaMoE correctness job uses.

The fused layer that these feed is ``xstage.moe``; the unfused baseline ``xstage.moe_unfused``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from .kernels import moe as _device
from .moe_plan import FP8_BLOCK, OUT_DTYPES, REL_L2_FLOOR
from .numeric import rel_l2

FP8_MAX = _device.FP8_MAX.value              # largest finite e4m3 value (the kernel's constant)
FP8_AMAX_FLOOR = _device.FP8_AMAX_FLOOR.value
FP8_REL_L2 = 2e-2           # fp8: kernel vs the float32 emulation of the same quantisation

# ----------------------------------------------------------------------------------------- weights, inputs
def quantize_fp8(t: torch.Tensor, block_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., M, N] -> (e4m3 [..., M, N], fp32 scales [..., M / block_rows, N / 128]): per block_rows x 128 block,
    scale = max(amax, 1e-4) / 448 (as the kernel quantises the intermediate)."""
    *lead, M, N = t.shape
    b = t.float().reshape(*lead, M // block_rows, block_rows, N // FP8_BLOCK, FP8_BLOCK)
    scale = b.abs().amax(dim=(-3, -1)).clamp_min(FP8_AMAX_FLOOR) / FP8_MAX          # [..., M/br, N/128]
    q = (b / scale[..., :, None, :, None]).reshape(t.shape).to(torch.float8_e4m3fn)
    return q, scale


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, block_rows: int) -> torch.Tensor:
    *lead, M, N = q.shape
    b = q.float().reshape(*lead, M // block_rows, block_rows, N // FP8_BLOCK, FP8_BLOCK)
    return (b * scale[..., :, None, :, None]).reshape(q.shape)


def expert_weights(hidden: int, inter: int, expert: int, seed: int, device, dtype: torch.dtype
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert ``expert``'s (w1 [2I, Hd], w2 [Hd, I]) in ``dtype``, seeded per expert (same values on any rank of
    one device type): N(0, 1) / sqrt(fan-in), so activations stay O(1)."""
    g = torch.Generator(device=device).manual_seed(1_000_003 * seed + 31 * expert + 5)
    w1 = torch.randn(2 * inter, hidden, generator=g, device=device).div_(math.sqrt(hidden)).to(dtype)
    w2 = torch.randn(hidden, inter, generator=g, device=device).div_(math.sqrt(inter)).to(dtype)
    return w1, w2


@dataclass
class RankWeights:
    """One rank's experts: w1 [El, 2I, Hd], w2 [El, Hd, I] (activation dtype); fp8 scales w1s, w2s or None;
    ``w1_hi``, ``w2_hi``: the bf16/fp16/fp32 weights the fp8 ones were quantised from (the unfused baseline)."""

    w1: torch.Tensor
    w2: torch.Tensor
    w1s: torch.Tensor | None = None
    w2s: torch.Tensor | None = None
    w1_hi: torch.Tensor | None = None
    w2_hi: torch.Tensor | None = None


def rank_weights(hidden: int, inter: int, experts: int, P: int, rank: int, seed: int, device, dtype: str
                 ) -> RankWeights:
    """Rank ``rank``'s local experts (global ids rank * El ..), generated expert by expert."""
    El = experts // P
    hi = OUT_DTYPES[dtype]
    w1 = torch.empty(El, 2 * inter, hidden, dtype=hi, device=device)
    w2 = torch.empty(El, hidden, inter, dtype=hi, device=device)
    for le in range(El):
        w1[le], w2[le] = expert_weights(hidden, inter, rank * El + le, seed, device, hi)
    if dtype != "fp8":
        return RankWeights(w1, w2)
    q1 = torch.empty(w1.shape, dtype=torch.float8_e4m3fn, device=device)
    q2 = torch.empty(w2.shape, dtype=torch.float8_e4m3fn, device=device)
    s1 = torch.empty(El, 2 * inter // FP8_BLOCK, hidden // FP8_BLOCK, dtype=torch.float32, device=device)
    s2 = torch.empty(El, hidden // FP8_BLOCK, inter // FP8_BLOCK, dtype=torch.float32, device=device)
    for le in range(El):   # expert by expert: a float32 copy of all experts would not fit (DeepSeek-V4-Pro)
        q1[le], s1[le] = quantize_fp8(w1[le], FP8_BLOCK)
        q2[le], s2[le] = quantize_fp8(w2[le], FP8_BLOCK)
    return RankWeights(q1, q2, s1, s2, w1, w2)


def reference_weights(hidden: int, inter: int, seed: int, device, dtype: str) -> Callable:
    """e -> (w1, w2) as the layer computes with them, in float32: the generated weights, or for fp8 their
    dequantised 128x128-block quantisation."""
    def get(e: int):
        w1, w2 = expert_weights(hidden, inter, e, seed, device, OUT_DTYPES[dtype])
        if dtype == "fp8":
            return (dequantize_fp8(*quantize_fp8(w1, FP8_BLOCK), FP8_BLOCK),
                    dequantize_fp8(*quantize_fp8(w2, FP8_BLOCK), FP8_BLOCK))
        return w1.float(), w2.float()
    return get


def rank_tokens(tokens: int, hidden: int, seed: int, rank: int, device, dtype: str) -> torch.Tensor:
    """Rank ``rank``'s layer input x [T, Hd] (bf16 for fp8 layers: the dispatch quantises it)."""
    g = torch.Generator(device=device).manual_seed(1_000_003 * seed + 104_729 * (rank + 1) + 3)
    return torch.randn(tokens, hidden, generator=g, device=device).to(OUT_DTYPES[dtype])


# ------------------------------------------------------------------------------------------------ reference
def moe_reference(x: torch.Tensor, ids: torch.Tensor, wts: torch.Tensor, weights: Callable,
                  dtype: torch.dtype = torch.float32, fp8: bool = False) -> torch.Tensor:
    """One rank's combine buffer [K, T, Hd] computed with torch: row (slot, token) = expert ids[token, slot]'s
    (silu(x W_g^T) * (x W_u^T) * weight) W2^T. x [T, Hd], ids / wts [T, K], ``weights(e)`` -> (w1 [2I, Hd],
    w2 [Hd, I]).

    ``dtype=float32`` (TF32 off): the reference. ``dtype`` = the layer's fp16/bf16: PyTorch's own error at that
    dtype (each op rounds to it), which the kernel may exceed by at most 2x. ``fp8``: x is quantised 1x128 and
    the intermediate too (as the kernel does), both dequantised, and the math is float32: the kernel's own
    quantisation, emulated."""
    T, K = ids.shape
    Hd = x.shape[1]
    if fp8:
        x = dequantize_fp8(*quantize_fp8(x, 1), 1)
    out = torch.full((K, T, Hd), float("nan"), dtype=dtype, device=x.device)
    flat = ids.flatten().to(x.device)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for e in torch.unique(flat).tolist():
            items = (flat == e).nonzero().flatten()
            tok, slot = items // K, items % K
            w1, w2 = (w.to(dtype) for w in weights(e))
            I = w2.shape[1]
            gu = x[tok].to(dtype) @ w1.T                                        # [n, 2I]
            h = torch.nn.functional.silu(gu[:, :I]) * gu[:, I:] * wts.to(x.device)[tok, slot].to(dtype)[:, None]
            if fp8:
                h = dequantize_fp8(*quantize_fp8(h, 1), 1)
            out[slot, tok] = h @ w2.T                                           # [n, Hd]
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return out


def topk_reduce(combine: torch.Tensor) -> torch.Tensor:
    """[K, T, Hd] -> [T, Hd]: the sum over top-k slots in float32, rounded to the buffer's dtype once."""
    return combine.float().sum(0).to(combine.dtype)


def check_close(out: torch.Tensor, ref: torch.Tensor, torch_out: torch.Tensor | None, dtype: str, what: str
                ) -> tuple[float, float]:
    """No NaN (every element written); relative L2 error to the float32 reference at most 2x PyTorch's own
    at that dtype plus a floor (fp8: at most FP8_REL_L2 against the emulated quantisation)."""
    nan = int(torch.isnan(out).sum())
    if nan:
        bad = torch.isnan(out).nonzero()[0].tolist()
        raise AssertionError(f"{what}: {nan} of {out.numel()} elements are NaN (never written); first at "
                             f"[slot, token, col] = {bad}")
    err = rel_l2(out, ref)
    if dtype == "fp8":
        if not err <= FP8_REL_L2:
            raise AssertionError(f"{what}: relative L2 error {err:.3g} to the fp8 emulation > {FP8_REL_L2}")
        return err, float("nan")
    err_pt = rel_l2(torch_out, ref)
    if not err <= 2 * err_pt + REL_L2_FLOOR[dtype]:
        raise AssertionError(f"{what}: relative L2 error {err:.3g} > 2 x PyTorch's {err_pt:.3g} "
                             f"+ {REL_L2_FLOOR[dtype]:g}")
    return err, err_pt
