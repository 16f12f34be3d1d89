"""``xstage.UlyssesAttention(world, heads, head_dim, seq_len)``: the fused Ulysses attention layer as an ``nn.Module``.

Ulysses sequence parallelism over the P ranks of ``world`` (``xstage.ranks``): each rank holds Sl = S / P tokens of
every head; the pre-attention all-to-all gives each rank the whole sequence for H / P heads, the attention kernel
runs with the post-attention all-to-all fused into its epilogue (each output tile stored to the rank that owns its
rows: ``xstage.ulysses_gluon.attention_forward(..., fused=...)`` on sm_90, the warp-specialised Gluon kernel with
``SWEEP_CONFIGS``; ``xstage.ulysses.ulysses_fused`` (kernels/attention.py) elsewhere and under the CPU interpreter),
then the end-of-layer barrier (bounded: a peer that never arrives is recorded, :meth:`check` raises on it). Under
``torch.compile`` the forward is the custom op ``xstage::ulysses_attention`` (a fake implementation propagates the
shape), so a model around the layer compiles with ``fullgraph=True``.

forward(q, k, v) -> out, same shape as q (self-attention, non-causal, scale ``sm_scale`` or D ** -0.5):
- a world of one process per GPU (``TorchSymmWorld`` under torchrun): this rank's tokens, q, k, v [B, Sl, H, D] or
  [Sl, H, D] (the layout of ``xstage.attention``); the pre-attention all-to-all is NCCL's ``all_to_all_single``.
- a world whose process drives every rank (``EmulatedWorld`` on the CPU, ``OneGPUWorld`` on one GPU): the whole
  sequence, [B, S, H, D] or [S, H, D], rank r's tokens the rows r * Sl ..; the all-to-all by indexing; the output
  is every rank's rows in order (what a single-process test compares with ``xstage.attention``).
The output is a copy out of the symmetric buffer made before this call returns (the next layer's peers store into
that buffer only after the next pre-attention all-to-all, which this rank joins after the copy).

The symmetric buffers (``xstage.ulysses.ulysses_buffers``) are allocated once, collectively, for layers up to
[seq_len, heads, head_dim]; a longer sequence is one clear error. Checks run on the first call of each input shape
(one line, before any launch); later calls launch. Forward only.
"""
from __future__ import annotations

import itertools
import weakref

import torch
from torch import nn

from . import env, ulysses_gluon
from .attention_api import AttentionInputError, validate_shapes
from .ulysses import (check_barrier_status, default_dtype, end_barrier, pre_all_to_all, ulysses_buffers,
                      ulysses_fused, validate_shape)


def pre_all_to_all_nccl(x: torch.Tensor, world) -> torch.Tensor:
    """This rank's [Sl, H, D] -> [S, Hl, D] (the whole sequence, this rank's heads) with ``all_to_all_single``:
    head group r of every token goes to rank r; what rank i sends lands in rows i * Sl .. (rank order is token
    order)."""
    P = world.world_size
    Sl, H, D = x.shape
    send = x.reshape(Sl, P, H // P, D).transpose(0, 1).contiguous()        # [P, Sl, Hl, D]: block r to rank r
    recv = torch.empty_like(send)                                          # [P, Sl, Hl, D]: block i from rank i
    world.dist.all_to_all_single(recv, send)
    return recv.view(P * Sl, H // P, D)


_LAYERS: "weakref.WeakValueDictionary[int, UlyssesAttention]" = weakref.WeakValueDictionary()
_IDS = itertools.count()
OP_NAME = "xstage::ulysses_attention"


@torch.library.custom_op(OP_NAME, mutates_args=())
def ulysses_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
    """``xstage::ulysses_attention``: layer number ``layer``'s forward as a registered op (what ``torch.compile``
    traces; the layer, its world and buffers stay outside the graph)."""
    return _LAYERS[layer]._forward(q, k, v)


@ulysses_attention_op.register_fake
def _ulysses_attention_fake(q, k, v, layer):
    validate_shapes(q, k, v)
    return torch.empty_like(q, memory_format=torch.contiguous_format)


class UlyssesAttention(nn.Module):
    """The fused Ulysses attention layer over ``world``'s ranks (module docstring). ``dtype``: the buffers' (bf16
    on GPUs; float32 under the CPU interpreter, whose bf16 ``tl.dot`` is wrong: there bf16 / float16 inputs run in
    float32 and the output is rounded back, as ``xstage.attention`` does there)."""

    def __init__(self, world, heads: int, head_dim: int, seq_len: int, *, sm_scale: float | None = None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        P = world.world_size
        validate_shape(seq_len, heads, head_dim, P)
        self.world, self.heads, self.head_dim, self.seq_len, self.sm_scale = world, heads, head_dim, seq_len, sm_scale
        self.interpreted = env.interpreted()
        self.dtype = dtype or (torch.float32 if self.interpreted else default_dtype())
        device = world.device(world.local_ranks[0])
        self.kernel = "gluon" if device.type == "cuda" and ulysses_gluon.available()[0] else "triton"
        self.config = ulysses_gluon.sweep_config(head_dim) if self.kernel == "gluon" else None
        self.bufs = ulysses_buffers(world, seq_len, heads, head_dim, self.dtype)
        self._checked: set = set()
        self.layer_id = next(_IDS)
        _LAYERS[self.layer_id] = self

    def extra_repr(self) -> str:
        return (f"world_size={self.world.world_size}, heads={self.heads}, head_dim={self.head_dim}, "
                f"seq_len={self.seq_len}, kernel={self.kernel}")

    def _check(self, q, k, v) -> None:
        key = (q.shape, k.shape, v.shape, q.dtype, q.device, q.stride(), k.stride(), v.stride())
        if key in self._checked:
            return
        B, S, H, D = validate_shapes(q, k, v)
        P = self.world.world_size
        S_all = S if self.world.emulated else S * P
        what = "S" if self.world.emulated else "S / P"
        if H != self.heads or D != self.head_dim:
            raise AttentionInputError(f"UlyssesAttention: inputs have {H} heads of dim {D}; the layer was built for "
                                      f"{self.heads} of dim {self.head_dim}")
        if S_all > self.seq_len or S_all % P:
            raise AttentionInputError(f"UlyssesAttention: {what} = {S} gives a sequence of {S_all} tokens; the layer "
                                      f"takes a multiple of {P} ranks up to seq_len = {self.seq_len}")
        if q.dtype != self.dtype and not (self.interpreted and q.dtype in (torch.bfloat16, torch.float16)):
            raise AttentionInputError(f"UlyssesAttention: q is {q.dtype}, the layer's buffers {self.dtype}")
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t.device != self.world.device(self.world.local_ranks[0]):
                raise AttentionInputError(f"UlyssesAttention: {name} is on {t.device}, the rank's device is "
                                          f"{self.world.device(self.world.local_ranks[0])}")
            if not t.is_contiguous():
                raise AttentionInputError(f"UlyssesAttention: {name} must be contiguous (strides {t.stride()})")
        if self.config is not None:
            self.config.validate(D, fused=True)
        self._checked.add(key)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q, k, v -> out, the same shape (module docstring); under ``torch.compile`` the op
        ``xstage::ulysses_attention``."""
        if torch.compiler.is_compiling():
            return ulysses_attention_op(q, k, v, self.layer_id)
        return self._forward(q, k, v)

    def _forward(self, q, k, v) -> torch.Tensor:
        self._check(q, k, v)
        dt = q.dtype
        if dt != self.dtype:   # the interpreter only (checked): the kernel in float32, the output rounded back
            q, k, v = (t.to(self.dtype) for t in (q, k, v))
        if q.dim() == 4:
            out = torch.stack([self._layer(q[b], k[b], v[b]) for b in range(q.shape[0])])
        else:
            out = self._layer(q, k, v)
        return out.to(dt)

    def _layer(self, q, k, v) -> torch.Tensor:
        """One batch: [S or Sl, H, D] -> the same shape."""
        world, P = self.world, self.world.world_size
        if world.emulated:
            Sl = q.shape[0] // P
            qs, ks, vs = (dict(enumerate(pre_all_to_all([t[r * Sl:(r + 1) * Sl] for r in range(P)])))
                          for t in (q, k, v))
        else:
            r = world.local_ranks[0]
            qs, ks, vs = ({r: pre_all_to_all_nccl(t, world)} for t in (q, k, v))
        outs = self._fused(qs, ks, vs)
        if world.emulated:
            return torch.cat([outs[r] for r in range(P)], dim=0)
        return outs[world.local_ranks[0]].clone()

    def _fused(self, q, k, v) -> dict:
        """Every local rank's fused attention into the buffers, then the barrier (no host sync: :meth:`check`)."""
        world, bufs, P = self.world, self.bufs, self.world.world_size
        ranks = list(world.local_ranks)
        S, Hl, D = q[ranks[0]].shape
        if self.kernel == "triton":
            return ulysses_fused(world, q, k, v, bufs, self.sm_scale, barrier=True, check=False, ranks=ranks)
        for r in ranks:
            ulysses_gluon.attention_forward(q[r], k[r], v[r], self.sm_scale, config=self.config,
                                            fused=(bufs.out_table[r], r, P))
        end_barrier(world, bufs, check=False)
        return {r: bufs.out_view(r, S, Hl * P, D) for r in ranks}

    def check(self) -> None:
        """Raise where a peer never arrived at the last barrier (reads the barrier status: a host sync)."""
        for r in self.world.local_ranks:
            check_barrier_status(self.bufs, r)

