"""``xstage.attention(q, k, v, *, sm_scale=None)``: the project's attention forward as one call for a DiT.

Layout: q, k, v [B, S, H, D] (or [S, H, D], batch 1), the layout of ``flash_attn_func`` and of diffusers'
``dispatch_attention_fn`` (torch SDPA's is [B, H, S, D]: pass ``x.transpose(1, 2)`` of that and transpose the
result back). Self-attention, non-causal, no mask, no dropout: q, k, v share [B, S, H, D]; D 64 or 128; any S >= 1
(the kernels mask the last key block and clip the last query tile). Returns a new contiguous [B, S, H, D] tensor of
q's dtype: ``softmax(q k^T * sm_scale) v`` per batch and head, ``sm_scale`` default ``D ** -0.5``. Forward only
(no autograd).

The kernel, per device (``kernel_for``):
- ``gluon``: sm_90 (H100 / H200) with a Triton that has Gluon for Hopper: kernels/attention_gluon.py's
  warp-specialised kernel with the tiles the studies chose per head dim (``xstage.ulysses_gluon.SWEEP_CONFIGS``: the
  tiles of the measurements beside FA4, docs/attention.md), bf16. Its waits on its own partitions' arrivals are
  unbounded in hardware (kernels/attention_gluon.py); ``ulysses_gluon.CONFIGS``' one-partition kernel, whose waits
  all complete by themselves, is the studies' slower default and is not what this call runs.
- ``triton``: another CUDA GPU: kernels/attention.py with ``xstage.ulysses.default_config(D)``, bf16.
- ``interpreter``: CPU tensors where Triton's CPU interpreter is on (``TRITON_INTERPRET=1``, which ``import xstage``
  sets on a machine without CUDA): the same Triton kernel on small tiles, for tests. The interpreter's bf16
  ``tl.dot`` is wrong, so bf16 inputs run the kernel in float32 and the output is rounded to bf16; float16 and
  float32 run as they are. Slow (seconds at S = 512): it is a correctness path, not a CPU backend.
A CPU tensor on a machine whose interpreter is off, or a CUDA tensor under the interpreter, is one clear error.

No host tax: the first call of a key (shapes, strides, dtypes, devices, sm_scale, 16-byte alignment, current
device) validates (one line per problem, :class:`AttentionInputError`, before any launch), builds the TMA descriptor
templates and compiles (or loads) the kernel; later calls of that key look the entry up in a dict and launch the
kernel's ``CompiledKernel`` launcher directly (``_FastLaunch``: no argument binding, specialisation or JIT cache
lookup; the TMA descriptor objects copied from the key's templates with the new base pointers, no validation; Triton's
launcher still encodes each one's CUtensorMap per launch, one C call each). Compiled kernels persist on disk in
Triton's cache (``TRITON_CACHE_DIR``, default ``~/.triton/cache``; :func:`compile_cache_dir`), so a new process's
first call loads instead of compiling.

Graphs and compile: the call is the custom op ``xstage::attention`` (``torch.library.custom_op``) with a fake
implementation, so ``torch.compile(fullgraph=True)`` traces it without a graph break; in eager mode
``attention`` skips the op's dispatcher (host time). Launches are stream-ordered and sync-free, so they capture in
a CUDA graph (call once before capturing: the first call compiles).
"""
from __future__ import annotations

import inspect
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from . import env, ulysses_gluon
from .kernels import attention_gluon
from .kernels.attention import ulysses_attention_kernel
from .ulysses import HEAD_DIMS, INTERPRETER_CONFIG, LOG2E, default_config
from .ulysses import attention_forward as triton_attention_forward

try:   # launch hooks (profilers) that Triton's own launch path passes to the launcher
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover (Triton < 3.4)
    _knobs = None

KERNELS = ("gluon", "triton", "interpreter")
OP_NAME = "xstage::attention"


class AttentionInputError(ValueError):
    """Input that ``xstage.attention`` cannot take; raised before any launch, one line."""


# ------------------------------------------------------------------------------------------- which kernel
def kernel_for(device: torch.device) -> str:
    """``gluon`` (sm_90 and Gluon present), ``triton`` (another CUDA GPU) or ``interpreter`` (CPU, Triton's
    interpreter on); AttentionInputError where the device cannot run any (a CPU tensor without the interpreter,
    a CUDA tensor under it)."""
    if device.type == "cpu":
        if env.interpreted():
            return "interpreter"
        raise AttentionInputError(
            "xstage.attention: q is on the CPU; the kernels run on a CUDA GPU (move q, k, v with .cuda()). Tests "
            "on a machine without CUDA run them in Triton's CPU interpreter (TRITON_INTERPRET=1, set by "
            "`import xstage` there)")
    if device.type != "cuda":
        raise AttentionInputError(f"xstage.attention: q is on {device}; the kernels run on a CUDA GPU")
    if env.interpreted():
        raise AttentionInputError(
            f"xstage.attention: q is on {device} but Triton's CPU interpreter is on (TRITON_INTERPRET="
            f"{os.environ.get('TRITON_INTERPRET')}): unset it before importing xstage to run on the GPU")
    if torch.cuda.get_device_capability(device)[0] == 9 and ulysses_gluon.available()[0]:
        return "gluon"
    return "triton"


def compile_cache_dir() -> Path:
    """Where Triton keeps compiled kernels between processes (TRITON_CACHE_DIR, else Triton's default)."""
    try:
        from triton import knobs

        return Path(knobs.cache.dir)
    except (ImportError, AttributeError):   # an older Triton: the environment variable or its default
        return Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")


# ------------------------------------------------------------------------------------------------ checks
def _shape_line(t) -> str:
    return str(tuple(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__


def validate_shapes(q, k, v) -> tuple[int, int, int, int]:
    """Shape, head-dim and dtype checks that need no device (also the fake implementation's): (B, S, H, D)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() not in (3, 4):
            raise AttentionInputError(f"xstage.attention: {name} must be a tensor [B, S, H, D] (or [S, H, D]), got "
                                      f"{_shape_line(t)}")
    if not q.dim() == k.dim() == v.dim():
        raise AttentionInputError(f"xstage.attention: q, k, v must all be [B, S, H, D] (or all [S, H, D]), got "
                                  f"{_shape_line(q)}, {_shape_line(k)}, {_shape_line(v)}")
    B, S, H, D = (1, *q.shape) if q.dim() == 3 else tuple(q.shape)
    for name, t in (("k", k), ("v", v)):
        b, s, h, d = (1, *t.shape) if t.dim() == 3 else tuple(t.shape)
        if h != H:
            raise AttentionInputError(f"xstage.attention: q has {H} heads, {name} {h}: heads must match (no grouped-"
                                      f"query attention: repeat {name}'s heads first)")
        if d != D:
            raise AttentionInputError(f"xstage.attention: q has head dim {D}, {name} {d}: they must match")
        if s != S:
            raise AttentionInputError(f"xstage.attention: q has S = {S}, {name} S = {s}: self-attention only (q, k, "
                                      f"v over the same tokens)")
        if b != B:
            raise AttentionInputError(f"xstage.attention: q has batch {B}, {name} {b}: they must match")
    if D not in HEAD_DIMS:
        raise AttentionInputError(f"xstage.attention: head dim {D} is not supported (64 or 128)")
    if B < 1 or S < 1 or H < 1:
        raise AttentionInputError(f"xstage.attention: empty input [B, S, H, D] = {[B, S, H, D]}")
    if S * H * D >= 2 ** 31:
        raise AttentionInputError(f"xstage.attention: S * H * D = {S * H * D} elements per batch exceeds int32 "
                                  f"offsets")
    if not q.dtype == k.dtype == v.dtype:
        raise AttentionInputError(f"xstage.attention: q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    return B, S, H, D


def validate(q, k, v, sm_scale) -> tuple[str, int, int, int, int]:
    """Every check of the first call of a key, in the words the user typed: (kernel, B, S, H, D)."""
    B, S, H, D = validate_shapes(q, k, v)
    if not (q.device == k.device == v.device):
        raise AttentionInputError(f"xstage.attention: q, k, v devices differ: {q.device}, {k.device}, {v.device}")
    kernel = kernel_for(q.device)
    ok = (torch.bfloat16, torch.float16, torch.float32) if kernel == "interpreter" else (torch.bfloat16,)
    if q.dtype not in ok:
        raise AttentionInputError(f"xstage.attention: q is {q.dtype}; the {kernel} kernel runs "
                                  f"{' / '.join(str(d) for d in ok)} (q.to(torch.bfloat16))")
    for name, t in (("q", q), ("k", k), ("v", v)):
        dense = (H * D, D, 1)
        if tuple(t.stride()[-3:]) != dense and not (S == 1 and tuple(t.stride()[-2:]) == dense[1:]):
            raise AttentionInputError(
                f"xstage.attention: {name} has strides {tuple(t.stride())}; each batch's [S, H, D] must be dense "
                f"(strides (..., {H * D}, {D}, 1): heads side by side in a token's row, as [B, S, H, D] from "
                f".unflatten(-1, (H, D)) of a projection). A [B, H, S, D] tensor (SDPA's layout) or a slice of a "
                f"fused QKV projection is not: pass {name}.transpose(1, 2).contiguous() or {name}.contiguous()")
        if t.dim() == 4 and B > 1 and (t.stride(0) * t.element_size()) % 16:
            raise AttentionInputError(f"xstage.attention: {name}'s batch stride {t.stride(0)} is not a multiple of "
                                      f"16 bytes (the kernel's TMA loads need it)")
        if t.data_ptr() % 16:
            raise AttentionInputError(f"xstage.attention: {name}'s data is not 16-byte aligned (address "
                                      f"{t.data_ptr():#x}; the kernel's TMA loads need it): pass {name}.clone()")
    if sm_scale is not None and not (isinstance(sm_scale, (int, float)) and math.isfinite(sm_scale)):
        raise AttentionInputError(f"xstage.attention: sm_scale must be a finite number or None, got {sm_scale!r}")
    return kernel, B, S, H, D


# ------------------------------------------------------------------------------------------- the launcher
def _launch_hooks():
    if _knobs is None:
        return None, None
    rt = _knobs.runtime
    return rt.launch_enter_hook, rt.launch_exit_hook


class _FastLaunch:
    """One kernel launch, compiled (or loaded from Triton's disk cache) on the first call through ``kernel[grid]``,
    then launched through that ``CompiledKernel``'s launcher with the argument list kept from the first call: only
    the ``dynamic`` arguments change (passed positionally, in that order). Where this Triton's launcher does not
    take the list (its calling convention differs), the entry falls back to ``kernel[grid]`` for good
    (``path`` says which: ``compiled`` or ``jit``)."""

    def __init__(self, kernel, grid: tuple, kwargs: dict, dynamic: tuple[str, ...]):
        params = inspect.signature(kernel.fn).parameters
        self.kernel, self.grid = kernel, tuple(grid) + (1,) * (3 - len(grid))
        self.options = {n: val for n, val in kwargs.items() if n not in params}
        bound = inspect.signature(kernel.fn).bind(**{n: val for n, val in kwargs.items() if n in params})
        bound.apply_defaults()
        self.names = list(bound.arguments)
        self.args = list(bound.arguments.values())
        self.slots = tuple(self.names.index(n) for n in dynamic)
        for i in self.slots:   # every call passes these: the entry keeps no reference to the first call's tensors
            self.args[i] = None
        self.compiled = None
        self.path = "jit"
        self.device = torch.cuda.current_device() if torch.cuda.is_available() else -1

    def first(self, *values) -> None:
        """The first launch (compiles or loads), through Triton's JIT."""
        args = self._args(values)
        self.compiled = self.kernel[self.grid](**dict(zip(self.names, args)), **self.options)
        if self.compiled is not None and hasattr(self.compiled, "packed_metadata"):
            self.path = "compiled"
            self.launcher = self.compiled.run
            self.function = self.compiled.function
            self.packed = self.compiled.packed_metadata
            self.stream = torch._C._cuda_getCurrentRawStream

    def _args(self, values) -> list:
        args = self.args.copy()      # a fresh list: the entry keeps no reference to a call's tensors
        for i, val in zip(self.slots, values):
            args[i] = val
        return args

    def __call__(self, *values) -> None:
        args = self._args(values)
        if self.path == "compiled":
            stream = self.stream(self.device)
            enter, leave = _launch_hooks()
            meta = self.compiled.launch_metadata(self.grid, stream, *args)   # None unless a hook is set
            try:
                self.launcher(*self.grid, stream, self.function, self.packed, meta, enter, leave, *args)
                return
            except (TypeError, SystemError, ValueError) as e:
                self.path, self.fallback = "jit", f"{type(e).__name__}: {e}"   # this Triton's launcher differs
        self.kernel[self.grid](**dict(zip(self.names, args)), **self.options)


def _descriptor_like(template, base: torch.Tensor):
    """A copy of a TMA descriptor template over ``base`` (same shape, strides, block and layout): no validation
    (the key's first call validated the layout; the key holds the 16-byte alignment)."""
    d = object.__new__(type(template))
    d.__dict__.update(template.__dict__)
    d.base = base
    return d


@dataclass
class _Entry:
    """What the first call of a key built: ``run(q, k, v) -> out``."""

    kernel: str
    shape: tuple
    run: Callable
    launches: list = field(default_factory=list)
    first_out: object = None      # the first call's result (its launches were the entry's first), handed out once


def _gluon_entry(q, k, v, sm_scale, B, S, H, D) -> _Entry:
    """The warp-specialised Gluon kernel, ``ulysses_gluon.sweep_config(D)``, one launch per batch, each over that
    batch's [S, H * D] (descriptors as ``ulysses_gluon.attention_forward`` builds them)."""
    config = ulysses_gluon.sweep_config(D)
    config.validate(D)
    out_shape = tuple(q.shape)
    q_first, k_first, v_first = (t if t.dim() == 3 else t[0] for t in (q, k, v))
    probe = torch.empty(S, H, D, dtype=q.dtype, device=q.device)
    templates = ulysses_gluon._descriptors(q_first, k_first, v_first, probe, config)
    scale = (D ** -0.5 if sm_scale is None else float(sm_scale)) * LOG2E
    grid = (-(-S // config.block_m) * H,)
    if config.persistent:
        grid = (min(grid[0], ulysses_gluon._sm_count(q.device)),)
    table = ulysses_gluon._no_table(q.device)
    kwargs = dict(q_desc=templates[0], k_desc=templates[1], v_desc=templates[2], o_desc=templates[3], lse_ptr=probe,
                  S=S, Hl=H, qk_scale=scale, out_table=table, rows_per_rank=S, out_row_stride=H * D, out_head0=0,
                  HEAD_DIM=D, BLOCK_M=config.block_m, BLOCK_N=config.block_n, STAGES=config.stages,
                  EVEN_N=S % config.block_n == 0, WRITE_LSE=False, CONSUMER_REGS=config.regs,
                  num_warps=config.num_warps, MASK_LAST=ulysses_gluon.mask_last_arg(config), PINGPONG=config.pingpong,
                  FUSED=False, PERSISTENT=config.persistent, JOINT=config.joint_release)
    launch = _FastLaunch(attention_gluon.gluon_attention_ws_kernel, grid, kwargs, ("q_desc", "k_desc", "v_desc", "o_desc", "lse_ptr"))
    tq, tk, tv, to = templates
    for t in templates:   # the templates keep no reference to this call's tensors (every launch sets its base)
        t.base = None
    batched = q.dim() == 4

    def run(q, k, v):
        out = torch.empty(out_shape, dtype=q.dtype, device=q.device)
        for b in range(B):
            qb, kb, vb, ob = (q[b], k[b], v[b], out[b]) if batched and b else (q, k, v, out)
            launch(_descriptor_like(tq, qb), _descriptor_like(tk, kb), _descriptor_like(tv, vb),
                   _descriptor_like(to, ob), ob)
        return out

    out = torch.empty(out_shape, dtype=q.dtype, device=q.device)
    for b in range(B):   # the first call: compiles on the first launch
        qb, kb, vb, ob = (q[b], k[b], v[b], out[b]) if batched and b else (q, k, v, out)
        args = (_descriptor_like(tq, qb), _descriptor_like(tk, kb), _descriptor_like(tv, vb), _descriptor_like(to, ob),
                ob)
        launch.first(*args) if b == 0 else launch(*args)
    return _Entry("gluon", out_shape, run, [launch], out)


def _triton_entry(q, k, v, sm_scale, B, S, H, D) -> _Entry:
    """kernels/attention.py (pointer loads, ``default_config(D)``), one launch per batch."""
    config = default_config(D)
    config.validate()
    out_shape = tuple(q.shape)
    dummy = torch.zeros(1, dtype=torch.int64, device=q.device)
    grid = (-(-S // config.block_m), H)
    kwargs = dict(Q=q, K=k, V=v, Kd=None, Vd=None, out_ptr=q, out_table=dummy, ts_ptr=dummy, S=S, rows_per_rank=S,
                  in_row_stride=H * D, out_row_stride=H * D, h_start=0, out_head0=0,
                  qk_scale=(D ** -0.5 if sm_scale is None else float(sm_scale)) * LOG2E, n_heads=H, HEAD_DIM=D,
                  BLOCK_M=config.block_m, BLOCK_N=config.block_n, EVEN_N=S % config.block_n == 0, FUSED=False,
                  TIMED=False, DEVICE=True, TMA=False, WS=False, PERSISTENT=False, PIPE=config.pipe,
                  SCALE_Q=config.scale_q, num_warps=config.num_warps, num_stages=config.num_stages)
    launch = _FastLaunch(ulysses_attention_kernel, grid, kwargs, ("Q", "K", "V", "out_ptr"))
    batched = q.dim() == 4

    def run(q, k, v):
        out = torch.empty(out_shape, dtype=q.dtype, device=q.device)
        for b in range(B):
            launch(*((q[b], k[b], v[b], out[b]) if batched and b else (q, k, v, out)))
        return out

    out = torch.empty(out_shape, dtype=q.dtype, device=q.device)
    for b in range(B):
        args = (q[b], k[b], v[b], out[b]) if batched and b else (q, k, v, out)
        launch.first(*args) if b == 0 else launch(*args)
    return _Entry("triton", out_shape, run, [launch], out)


def _interpreter_entry(q, k, v, sm_scale, B, S, H, D) -> _Entry:
    """The Triton kernel in the CPU interpreter (``ulysses.attention_forward`` per batch, small tiles); bf16 runs in
    float32 (the interpreter's bf16 ``tl.dot`` is wrong), the output rounded to bf16."""
    def run(q, k, v):
        dt = q.dtype
        work = torch.float32 if dt == torch.bfloat16 else dt
        q_bshd, k_bshd, v_bshd = ((t if t.dim() == 4 else t.unsqueeze(0)) for t in (q, k, v))
        outs = [triton_attention_forward(*(t[b].to(work).contiguous() for t in (q_bshd, k_bshd, v_bshd)), sm_scale,
                                         config=INTERPRETER_CONFIG) for b in range(B)]
        out = torch.stack(outs).to(dt)
        return out if q.dim() == 4 else out[0]

    return _Entry("interpreter", tuple(q.shape), run)


_BUILD = {"gluon": _gluon_entry, "triton": _triton_entry, "interpreter": _interpreter_entry}
_CACHE: dict = {}
STATS = {"hits": 0, "misses": 0}
_current_device = torch._C._cuda_getDevice if torch.cuda.is_available() else (lambda: -1)


def _key(q, k, v, sm_scale):
    return (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype, q.device,
            k.device, v.device, sm_scale, (q.data_ptr() | k.data_ptr() | v.data_ptr()) & 15, _current_device())


def _attention(q, k, v, sm_scale=None):
    """The eager call: a dict lookup on the key, then the entry's launches; the first call of a key validates and
    builds it (and its result is that first launch's)."""
    try:
        key = _key(q, k, v, sm_scale)
        entry = _CACHE.get(key)
    except (AttributeError, TypeError):   # not tensors, or an unhashable sm_scale: validate says which
        key, entry = None, None
    if entry is not None:
        STATS["hits"] += 1
        return entry.run(q, k, v)
    kernel, B, S, H, D = validate(q, k, v, sm_scale)
    device = q.device
    with (torch.cuda.device(device) if device.type == "cuda" else _null()):
        entry = _BUILD[kernel](q, k, v, sm_scale, B, S, H, D)
    STATS["misses"] += 1
    _CACHE[key] = entry
    first, entry.first_out = entry.first_out, None
    return first if first is not None else entry.run(q, k, v)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def cache_info() -> dict:
    """Entries of the launch cache, hits and misses, each entry's kernel and launch path (``compiled``: the
    CompiledKernel's launcher; ``jit``: Triton's ``kernel[grid]``), and Triton's on-disk cache folder."""
    paths = sorted({lc.path for e in _CACHE.values() for lc in e.launches})
    return {"entries": len(_CACHE), **STATS, "kernels": sorted({e.kernel for e in _CACHE.values()}),
            "launch_paths": paths, "disk_cache": str(compile_cache_dir())}


def clear_cache() -> None:
    """Forget every entry (the next call of each key validates and builds again; compiled kernels stay in
    Triton's caches)."""
    _CACHE.clear()
    STATS.update(hits=0, misses=0)


# ----------------------------------------------------------------------------------- the custom op (compile)
@torch.library.custom_op(OP_NAME, mutates_args=())
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: Optional[float] = None) -> torch.Tensor:
    """``xstage::attention``: :func:`attention` as a registered op (what ``torch.compile`` traces)."""
    return _attention(q, k, v, sm_scale)


@attention_op.register_fake
def _attention_fake(q, k, v, sm_scale=None):
    validate_shapes(q, k, v)
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, sm_scale: float | None = None) -> torch.Tensor:
    """Attention forward: q, k, v [B, S, H, D] (or [S, H, D]) -> out of the same shape, contiguous, q's dtype:
    ``softmax(q k^T * sm_scale) v`` per batch and head (non-causal; ``sm_scale`` default ``D ** -0.5``). The layout
    of ``flash_attn_func(q, k, v)`` and diffusers' ``dispatch_attention_fn``; from SDPA's [B, H, S, D] pass
    ``x.transpose(1, 2)`` (after ``.contiguous()``). bf16 on GPUs (D 64 / 128, any S); the kernel is chosen per
    device (module docstring). Bad input: one :class:`AttentionInputError` line before any launch. Under
    ``torch.compile`` this is the custom op ``xstage::attention``."""
    if torch.compiler.is_compiling():
        return attention_op(q, k, v, sm_scale)
    return _attention(q, k, v, sm_scale)
