"""A drop-in for diffusers (extra ``xstage[diffusers]``): a transformer's self-attention through ``xstage.attention``
on one GPU, or through ``xstage.UlyssesAttention`` across ranks.

    from xstage.diffusers_processor import use_xstage_attention
    use_xstage_attention(transformer)                      # every attention module of a diffusers model
    use_xstage_attention(transformer, ulysses=layer)       # Ulysses: layer = xstage.UlyssesAttention(world, ...)

How: each attention module's own processor (``WanAttnProcessor``, ``CogVideoXAttnProcessor2_0``, ...) is wrapped in
an :class:`XStageAttnProcessor`, which runs it unchanged (its projections, norms, rotary embedding, output
projection: diffusers' code) inside a ``TorchFunctionMode`` that takes its one call of
``torch.nn.functional.scaled_dot_product_attention`` (made directly, or by diffusers' ``dispatch_attention_fn``
through its native backend) when that call is plain self-attention: no mask, no dropout, not causal, q, k, v of
one shape [B, H, S, D] with D 64 or 128, a dtype the kernel runs. Everything else (cross-attention to the text
tokens, masks, other head dims) goes to SDPA as before; ``calls`` counts both.

SDPA's [B, H, S, D] is a transposed view of the [B, S, H, D] that the processors build (``unflatten`` of the
projection), so the call passes ``q.transpose(1, 2)`` (no copy where that is dense; a copy where the processor made
it otherwise) and returns the kernel's [B, S, H, D] transposed back.

Ulysses across ranks (``ulysses=``): the model must run on this rank's token shard (each rank's hidden states its
S / P tokens, rotary embeddings of those positions), as xDiT's or diffusers' context-parallel hooks arrange; the
wrapped SDPA call then runs the fused layer over the ranks. In a one-process world (``EmulatedWorld``,
``OneGPUWorld``) the model runs on the whole sequence and the layer splits it over its ranks: the CPU test's check.
"""
from __future__ import annotations

import functools
import inspect

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from . import env
from .attention_api import attention
from .ulysses import HEAD_DIMS

SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def sdpa_arguments(args: tuple, kwargs: dict) -> dict:
    """SDPA's arguments by name, positional or keyword (defaults filled)."""
    got = dict(zip(SDPA_ARGS, args))
    got.update(kwargs)
    for name, default in (("attn_mask", None), ("dropout_p", 0.0), ("is_causal", False), ("scale", None),
                          ("enable_gqa", False)):
        got.setdefault(name, default)
    return got


def routable(a: dict) -> bool:
    """Whether an SDPA call is one the kernel computes the same: plain self-attention (module docstring)."""
    q, k, v = a.get("query"), a.get("key"), a.get("value")
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
        return False
    if a["attn_mask"] is not None or a["dropout_p"] or a["is_causal"] or not q.shape == k.shape == v.shape:
        return False
    if q.shape[-1] not in HEAD_DIMS or not q.dtype == k.dtype == v.dtype:
        return False
    if q.device.type == "cpu":
        return env.interpreted() and q.dtype in (torch.bfloat16, torch.float16, torch.float32)
    return q.device.type == "cuda" and q.dtype == torch.bfloat16 and not env.interpreted()


def _bshd(t: torch.Tensor) -> torch.Tensor:
    """[B, H, S, D] (SDPA's view) -> [B, S, H, D] dense per batch: the transposed view, or a copy."""
    x = t.transpose(1, 2)
    B, S, H, D = x.shape
    return x if x.stride()[1:] == (H * D, D, 1) else x.contiguous()


class _RouteSDPA(TorchFunctionMode):
    """Inside a processor call: routable SDPA calls go to the owner's attention; everything else runs as is."""

    def __init__(self, owner: "XStageAttnProcessor"):
        super().__init__()
        self.owner = owner

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            a = sdpa_arguments(args, kwargs)
            if routable(a):
                self.owner.calls["xstage"] += 1
                q, k, v = (_bshd(a[n]) for n in ("query", "key", "value"))
                out = self.owner.attend(q, k, v, a["scale"])           # [B, S, H, D]
                return out.transpose(1, 2)                              # SDPA's [B, H, S, D]
            self.owner.calls["sdpa"] += 1
        return func(*args, **kwargs)


class XStageAttnProcessor:
    """A diffusers attention processor: ``processor`` (the module's own) run with its plain self-attention SDPA call
    routed to ``xstage.attention``, or to ``ulysses`` (an ``xstage.UlyssesAttention``) where given. ``calls``:
    {"xstage": routed calls, "sdpa": calls left to SDPA}. Its ``__call__`` has the wrapped processor's signature
    (diffusers' ``Attention.forward`` passes only the keyword arguments that signature names)."""

    def __init__(self, processor, ulysses=None):
        self.processor = processor
        self.ulysses = ulysses
        self.calls = {"xstage": 0, "sdpa": 0}

    def attend(self, q, k, v, scale):
        if self.ulysses is not None:
            if scale is not None and self.ulysses.sm_scale is not None and scale != self.ulysses.sm_scale:
                raise ValueError(f"XStageAttnProcessor: SDPA's scale {scale} differs from the Ulysses layer's "
                                 f"sm_scale {self.ulysses.sm_scale}")
            return self.ulysses(q, k, v)
        return attention(q, k, v, sm_scale=scale)

    def _run(self, attn, *args, **kwargs):
        with _RouteSDPA(self):
            return self.processor(attn, *args, **kwargs)

    def __repr__(self) -> str:
        return f"XStageAttnProcessor({type(self.processor).__name__}, ulysses={self.ulysses is not None})"


@functools.lru_cache(maxsize=None)
def _wrapper_class(inner: type) -> type:
    """An XStageAttnProcessor subclass whose ``__call__`` carries ``inner.__call__``'s signature."""
    def __call__(self, *args, **kwargs):
        return self._run(*args, **kwargs)

    __call__.__signature__ = inspect.signature(inner.__call__)
    return type(f"XStage{inner.__name__}", (XStageAttnProcessor,), {"__call__": __call__})


def wrap(processor, ulysses=None) -> XStageAttnProcessor:
    """``processor`` with its self-attention routed (an already wrapped one is unwrapped first)."""
    if isinstance(processor, XStageAttnProcessor):
        processor = processor.processor
    return _wrapper_class(type(processor))(processor, ulysses)


def attention_modules(model: torch.nn.Module) -> dict:
    """{name: module} of every module with a diffusers attention processor (``processor`` and ``set_processor``)."""
    return {n: m for n, m in model.named_modules() if hasattr(m, "set_processor") and hasattr(m, "processor")}


def use_xstage_attention(model: torch.nn.Module, ulysses=None) -> dict:
    """Wrap every attention module's processor of ``model`` (module docstring): {name: XStageAttnProcessor}.
    ValueError naming the model where it has no attention module with a processor."""
    mods = attention_modules(model)
    if not mods:
        raise ValueError(f"use_xstage_attention: {type(model).__name__} has no diffusers attention module (one with "
                         f"processor / set_processor)")
    out = {}
    for name, m in mods.items():
        m.set_processor(wrap(m.processor, ulysses))
        out[name] = m.processor
    return out


def restore_processors(model: torch.nn.Module) -> None:
    """Undo :func:`use_xstage_attention`: every wrapped processor back to the one it wraps."""
    for m in attention_modules(model).values():
        if isinstance(m.processor, XStageAttnProcessor):
            m.set_processor(m.processor.processor)
