"""FA-class attention (flash-attn-4's CuTe DSL Hopper kernel) for the Ulysses study; optional (extra ``fa4``).

flash-attn-4 and the CUTLASS DSL are imported under a guard by ``xstage.kernels.attention_fa4`` (its ``AVAILABLE``,
``WHY``): ``available()`` says whether they can run here, as (bool, one reason line). Without the extra, or on a GPU other than Hopper (sm_90), the sweep drops the
FA methods with that line and records them as absent (``xstage.ulysses_sweep``; never as a 0 time).

- ``attention(q, k, v)``: FA alone, [S, Hl, D] -> [S, Hl, D] (``flash_attn.cute.flash_attn_func``, non-causal).
- ``attention_kernel(q, k, v)``: the same FA kernel (FA's SM90 class, FA's config) compiled once and launched the
  way the fused layer is (no per-call work of FA's Python interface): the sweep's ``fa_kernel``, checked bit for
  bit against ``attention``; fused / fa_kernel compares two launches of one path, differing only in the epilogue.
- ``ulysses_fused_fa(world, q, k, v, bufs, ranks=...)``: the layer with the post-attention all-to-all fused into FA's
  Hopper kernel (``xstage.kernels.attention_fa4.UlyssesFusedSm90``: the epilogue stores each row to its owner
  rank through a table of peer addresses), then the project's end-of-layer barrier
  (``xstage.ulysses.end_barrier``) -- the same buffers and completion as ``xstage.ulysses.ulysses_fused``.

The fused kernel uses FA's own tile choice for the head dim (``flash_attn.cute.interface._tile_size_fwd_sm90``),
so its arithmetic is FA alone's: the GPU tests check it bit for bit against ``attention`` + the all-to-all.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import torch

from . import env
from .kernels import attention_fa4
from .ulysses import MAX_POLLS, _validate_fused, end_barrier, validate_qkv

METHODS = ("fa", "fa_kernel", "fa_serial", "fa_fused")
PACKAGES = ("flash-attn-4==4.0.0b36", "nvidia-cutlass-dsl[cu13]==4.8.1", "quack-kernels==0.6.5",
            "apache-tvm-ffi==0.1.15.post2", "torch-c-dlpack-ext==0.1.5")   # = pyproject.toml's extra fa4
NUM_STAGES, NUM_THREADS = 2, 384     # what flash_attn.cute.interface builds its SM90 forward with
TABLE_HEADER = 3                     # = xstage.kernels.attention_fa4.TABLE_HEADER (checked when it loads)


_AVAILABLE: tuple[bool, str] | None = None


def available() -> tuple[bool, str]:
    """(True, versions) when FA4's Hopper kernel can run here; else (False, why), one line."""
    global _AVAILABLE
    if _AVAILABLE is not None:
        return _AVAILABLE
    if env.interpreted() or not torch.cuda.is_available():
        _AVAILABLE = (False, "FA4 needs a CUDA GPU (none visible, or Triton's CPU interpreter)")
        return _AVAILABLE
    cap = torch.cuda.get_device_capability()
    if cap[0] != 9:
        _AVAILABLE = (False, f"FA4's fused Ulysses kernel is the SM90 (Hopper) one; this GPU is sm_{cap[0]}{cap[1]}")
        return _AVAILABLE
    if not attention_fa4.AVAILABLE:
        _AVAILABLE = (False, f"flash-attn-4 is not importable ({attention_fa4.WHY}); "
                             f"install the extra: pip install -e '.[fa4]'")
        return _AVAILABLE
    import cutlass
    from importlib.metadata import version

    try:
        fa_v = version("flash-attn-4")
    except Exception:  # noqa: BLE001
        fa_v = "?"
    _AVAILABLE = (True, f"flash-attn-4 {fa_v}, cutlass-dsl {getattr(cutlass, '__version__', '?')}")
    return _AVAILABLE


def require() -> None:
    ok, why = available()
    if not ok:
        raise RuntimeError(why)


def versions() -> dict:
    """The FA stack's versions (for sidecars); {} when not available."""
    if not available()[0]:
        return {}
    from importlib.metadata import version

    out = {}
    for spec in PACKAGES:
        name = spec.split("[")[0].split("=")[0]
        try:
            out[name] = version(name)
        except Exception:  # noqa: BLE001
            out[name] = None
    return out


# ------------------------------------------------------------------------------------------- validation
def validate_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int, int]:
    """q, k, v [S, Hl, D] bf16 contiguous on one CUDA device, D 64 or 128 -> (S, Hl, D); one clear error."""

    S, Hl, D = validate_qkv(q, k, v)
    if q.dtype != torch.bfloat16 or not q.is_cuda:
        raise ValueError(f"FA4 runs bf16 on a CUDA device here, got {q.dtype} on {q.device}")
    return S, Hl, D


def peer_table_values(S: int, H: int, D: int, P: int, rank: int, ptrs: Sequence[int]) -> list[int]:
    """The fused kernel's int64 table for ``rank``: [Sl, H * D, head0 * D, ptr_0 .. ptr_{P-1}] (head0 = rank's
    first global head, rank * H / P; ``ptrs[j]``: rank j's output base address)."""
    if len(ptrs) != P:
        raise ValueError(f"{len(ptrs)} peer addresses for {P} ranks")
    if H % P or S % P or not 0 <= rank < P:
        raise ValueError(f"S = {S}, H = {H} must divide by P = {P}; rank {rank} must be in [0, {P})")
    if any(int(p) % 16 for p in ptrs):
        raise ValueError("every output must be 16-byte aligned (the epilogue stores 16-byte pieces)")
    return [S // P, H * D, rank * (H // P) * D] + [int(p) for p in ptrs]


def fa_config(D: int):
    """FA4's own SM90 forward config for head dim D (tile_m, tile_n, mma_pv_is_rs, intra_wg_overlap)."""
    from flash_attn.cute.interface import _tile_size_fwd_sm90

    c = _tile_size_fwd_sm90(D, D, False, False)
    return c.m_block_size, c.n_block_size, c.mma_pv_is_rs, c.intra_wg_overlap


# ------------------------------------------------------------------------------------------------ FA alone
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float | None = None) -> torch.Tensor:
    """FA4 alone (non-causal): [S, Hl, D] -> [S, Hl, D]."""
    require()
    validate_inputs(q, k, v)
    from flash_attn.cute import flash_attn_func

    with torch.no_grad():
        o = flash_attn_func(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), softmax_scale=sm_scale, causal=False)
    o = o[0] if isinstance(o, tuple) else o
    return o[0]


def attention_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float | None = None,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """FA4's kernel alone, launched as the fused layer launches its own (see the module docstring):
    [S, Hl, D] -> [S, Hl, D] (``out`` if given: contiguous, same shape and dtype)."""
    require()
    S, Hl, D = validate_inputs(q, k, v)
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or not out.is_contiguous() or out.device != q.device:
        raise ValueError(f"out must be contiguous {tuple(q.shape)} {q.dtype} on {q.device}")
    from flash_attn.cute.utils import AuxData

    q_bshd, k_bshd, v_bshd, o_bshd = (t.unsqueeze(0) for t in (q, k, v, out))
    scale = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
    _compiled(D, q_bshd, k_bshd, v_bshd, o_bshd, None)(q_bshd, k_bshd, v_bshd, o_bshd, None, scale, None, None, None, None, None, None, None, None,
                                       None, AuxData(None, None), None, None)
    return out


# ------------------------------------------------------------------------------------------- fused layer
_COMPILED: dict = {}
_TABLES: dict = {}
_SCRATCH: dict = {}


def _compiled(D: int, q_bshd, k_bshd, v_bshd, o_bshd, table):
    """The fused kernel for head dim D (``table`` given) or FA's own kernel (``table`` None), compiled once per head
    dim and device (shapes are dynamic), with FA's config and FA's compile options."""
    key = (D, q_bshd.device, table is None)
    if key not in _COMPILED:
        import cutlass
        import cutlass.cute as cute
        from flash_attn.cute.cute_dsl_utils import to_cute_tensor
        from flash_attn.cute.flash_fwd_sm90 import FlashAttentionForwardSm90
        from flash_attn.cute.utils import AuxData

        if attention_fa4.TABLE_HEADER != TABLE_HEADER:
            raise RuntimeError("xstage.fa4.TABLE_HEADER and the kernel's disagree")
        tile_m, tile_n, rs, overlap = fa_config(D)
        cls = FlashAttentionForwardSm90 if table is None else attention_fa4.UlyssesFusedSm90
        kern = cls(
            cutlass.BFloat16, D, D, 1, is_causal=False, is_local=False, pack_gqa=False, tile_m=tile_m,
            tile_n=tile_n, num_stages=NUM_STAGES, num_threads=NUM_THREADS, Q_in_regs=False,
            intra_wg_overlap=overlap, mma_pv_is_rs=rs)
        qt, kt, vt = (to_cute_tensor(t) for t in (q_bshd, k_bshd, v_bshd))
        ot = to_cute_tensor(o_bshd, assumed_align=16)
        aux = AuxData(None if table is None else [to_cute_tensor(table, assumed_align=8, leading_dim=0)], None)
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        _COMPILED[key] = cute.compile(kern, qt, kt, vt, ot, None, 1.0, None, None, None, None, None, None, None,
                                      None, None, aux, None, None, stream,
                                      options="--enable-tvm-ffi")
    return _COMPILED[key]


def _table(bufs, S: int, H: int, D: int, rank: int, device) -> torch.Tensor:
    """The fused kernel's peer table on ``device``, cached by its values (the buffers' addresses), never by the
    buffers object's id: a freed object's id comes back for new buffers at other addresses (an earlier record of
    docs/findings.md: a host-link sweep after a local one in one process stored into the freed buffers)."""
    vals = peer_table_values(S, H, D, bufs.world_size, rank, bufs.out.ptrs)
    key = (tuple(vals), rank, device)
    if key not in _TABLES:
        _TABLES[key] = torch.tensor(vals, dtype=torch.int64, device=device)
    return _TABLES[key]


def _scratch(q: torch.Tensor) -> torch.Tensor:
    """FA's O argument (its TMA descriptor is built, the fused epilogue never stores to it): one per shape."""
    key = (tuple(q.shape), q.dtype, q.device)
    if key not in _SCRATCH:
        _SCRATCH[key] = torch.empty((1, *q.shape), dtype=q.dtype, device=q.device)
    return _SCRATCH[key]


def ulysses_fused_fa(world, q: Mapping[int, torch.Tensor], k: Mapping[int, torch.Tensor],
                     v: Mapping[int, torch.Tensor], bufs, sm_scale: float | None = None, barrier: bool = True,
                     check: bool = True, max_polls: int | None = None, ranks: Sequence[int] | None = None,
                     events: Sequence | None = None) -> dict[int, torch.Tensor]:
    """The fused layer with FA4's kernel on ``ranks`` (default all local): q[r], k[r], v[r] [S, Hl, D] ->
    out[r] [Sl, H, D] in ``bufs`` (``xstage.ulysses.ulysses_buffers``), then the end-of-layer barrier of every
    rank. ``events`` (start, end) CUDA events recorded around the kernels (before the barrier): the sender's
    view. Everything is validated before any launch."""

    require()
    ranks = list(world.local_ranks if ranks is None else ranks)
    S, Hl, D = _validate_fused(world, q, k, v, bufs, ranks)
    for r in ranks:
        validate_inputs(q[r], k[r], v[r])
    P = world.world_size
    H = Hl * P
    scale = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
    from flash_attn.cute.utils import AuxData

    launches = []
    for r in ranks:
        q_bshd, k_bshd, v_bshd = (t[r].unsqueeze(0) for t in (q, k, v))
        table = _table(bufs, S, H, D, r, q_bshd.device)
        launches.append((_compiled(D, q_bshd, k_bshd, v_bshd, _scratch(q[r]), table), q_bshd, k_bshd, v_bshd, _scratch(q[r]), table))
    if events is not None:
        events[0].record()
    for fn, q_bshd, k_bshd, v_bshd, o_bshd, table in launches:
        fn(q_bshd, k_bshd, v_bshd, o_bshd, None, scale, None, None, None, None, None, None, None, None, None,
           AuxData([table], None), None, None)
    if events is not None:
        events[1].record()
    if barrier:
        end_barrier(world, bufs, check=check, max_polls=MAX_POLLS if max_polls is None else max_polls)
    return {r: bufs.out_view(r, S, H, D) for r in ranks}
