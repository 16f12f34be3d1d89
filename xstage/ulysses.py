"""Ulysses sequence-parallel attention with the post-attention all-to-all fused into FlashAttention.

Host side of ``xstage.kernels.attention``: layouts, FLOP/byte counts and the DiT shape table; validated
launchers (plain attention, the fused layer, the end-of-layer barrier); a float32 torch reference with the
all-to-all done by plain indexing; the GPU baselines (serial with our attention or cuDNN SDPA, and the
stream-overlapped head-chunk pipeline) and the correctness jobs. The resumable sweep (schema ``ulysses``, in
xstage.data) is ``xstage.ulysses_sweep``.

Legend: S = sequence length, P = ranks, H = heads, Hl = H / P heads per rank, D = head dim, Sl = S / P rows
each rank owns, Hc = heads of one launch (a chunk of Hl).

Layouts (as in yunchang's ``comm/all_to_all.py``, batch 1, row-major and contiguous):
  before the pre-attention all-to-all    x[r]   [Sl, H, D]   rank r's sequence rows, all heads
  after it (attention input)             q[r]   [S, Hl, D]   full sequence, heads r * Hl .. (r + 1) * Hl
  attention output (plain)               o[r]   [S, Hl, D]
  after the post-attention all-to-all    out[r] [Sl, H, D]   = rows r * Sl .. of every rank's o, heads concatenated
The fused kernel writes out[r] directly; the serial baseline computes o[r] and then all-to-alls it.

Times (``xstage.ulysses_sweep``): ``sender_visible_ms`` is what the sending GPU sees: for the fused kernel, its
device timestamps (max over programs of the time after the last store was issued minus min program start); for
the baselines, the same as end to end. ``end_to_end_ms``: CUDA events around the whole layer on each rank,
ending after the cross-rank barrier (fused) or after the all-to-all and its relayout (baselines): the output is
complete everywhere. Both take the max over ranks per repeat. ``tflops`` = attention FLOPs per rank / end to end.

One process driving every rank (``world.emulated``: ``EmulatedWorld`` on the CPU, ``OneGPUWorld`` on one GPU):
there is no NCCL; the all-to-all is done by copies (``send_copies``: each rank copies the rows each peer owns into
that peer's receive buffer, then ``relayout_received``; ``post_all_to_all_copies`` for every rank), the overlapped
pipeline sends its chunks that way on a side stream, and ``ulysses_fused(..., ranks=[r])`` launches one rank's
kernel (the barrier stays everyone's). The sweep times rank 0 only (``xstage.ulysses_sweep``).

Dtypes: bf16 on GPUs. Under Triton's interpreter (CPU) bf16 ``tl.dot`` is wrong, so fp16/fp32 only there.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from . import env
from .kernels.attention import LOG2E, ulysses_attention_kernel
from .kernels import sync as _sync
from .numeric import check_bit_identical, rel_l2
from .ranks import epoch_barrier, raise_on_barrier_timeout
from .registry import by_name

HEAD_DIMS = (64, 128)
METHODS = ("fused", "serial_triton", "serial_cudnn", "overlapped", "attention_only", "sdpa_only")
BARRIER_NAME = "end-of-attention barrier"
OVERLAP_CHUNKS = 4          # head chunks of the stream-overlapped baseline when not tuned per shape
OVERLAP_CHUNK_CANDIDATES = (1, 2, 3, 4, 6, 8, 12)   # what the sweep times per shape (<= Hl), keeping the fastest
MAX_POLLS = _sync.PEER_MAX_POLLS        # barrier spin bound (~seconds): a peer still compiling must fit
STATUS_FIELDS = _sync.STATUS_FIELDS.value   # (waiter, peer, expected, seen, polls, timed_out) per awaited peer
INT32_MAX = 2**31 - 1


# ------------------------------------------------------------------------------------------- counts, shapes
def attention_flops(S: int, H: int, D: int) -> int:
    """Forward FLOPs of one non-causal attention layer over all ranks: QK^T and PV, 2 * S * S * D each per head.
    Per rank: divide by P."""
    return 4 * S * S * H * D


def alltoall_bytes(S: int, H: int, D: int, P: int, elem_bytes: int = 2) -> int:
    """Bytes one rank sends to other ranks in the post-attention all-to-all: its [S, Hl, D] minus its own rows."""
    return S * (H // P) * D * elem_bytes * (P - 1) // P


@dataclass(frozen=True)
class UlyssesShape:
    """One attention layer of a DiT (batch 1, non-causal, self-attention over all tokens)."""

    name: str
    S: int      # tokens
    H: int      # heads
    D: int      # head dim

    def key(self, P: int) -> tuple:
        return (self.name, self.S, self.H, self.D, P)


# Token counts as the models run them (text + latent tokens where the model concatenates them). All divide by
# P = 2, 4, 8 (CogVideoX's 17,776 = 226 + 17,550 divides by 16, so no rounding was needed); shapes_for() rounds S
# down to a multiple of P where one does not and drops shapes whose heads do not divide (Wan2.1-1.3B at P = 8).
DIT_SHAPES = (
    UlyssesShape("flux1_4608", 4_608, 24, 128),
    UlyssesShape("cogvideox5b_17776", 17_776, 48, 64),
    UlyssesShape("wan21_1.3b_32760", 32_760, 12, 128),
    UlyssesShape("wan21_1.3b_75600", 75_600, 12, 128),
    UlyssesShape("wan21_14b_32760", 32_760, 40, 128),
    UlyssesShape("wan21_14b_75600", 75_600, 40, 128),
    UlyssesShape("hunyuanvideo_118800", 118_800, 24, 128),
)
SEQ_SWEEP = tuple(UlyssesShape(f"seq_{s // 1024}k", s, 24, 128) for s in (2**i for i in range(12, 18)))
DEFAULT_SHAPES = DIT_SHAPES + SEQ_SWEEP


def shapes_by_name(names: Sequence[str]) -> list[UlyssesShape]:
    """Shapes of the DiT table / sequence sweep by name; an unknown name is a ValueError listing the known."""
    return by_name(DEFAULT_SHAPES, names, "shape")


def shapes_for(P: int, shapes: Sequence[UlyssesShape] = DEFAULT_SHAPES, log=None) -> list[UlyssesShape]:
    """The shapes that run on P ranks: S rounded down to a multiple of P (said on ``log``, default stderr);
    shapes whose heads do not divide by P are dropped (said too)."""
    log = log or sys.stderr
    out = []
    for s in shapes:
        if s.H % P:
            print(f"ulysses: skipping {s.name}: {s.H} heads do not divide by {P} ranks", file=log)
            continue
        if s.S % P:
            print(f"ulysses: {s.name}: S = {s.S} rounded down to {s.S - s.S % P} (a multiple of {P})", file=log)
            s = UlyssesShape(s.name, s.S - s.S % P, s.H, s.D)
        out.append(s)
    return out


@dataclass(frozen=True)
class AttnConfig:
    """Tile shape and schedule of the attention kernel (fused and plain share it: same summation order)."""

    block_m: int = 128
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    tma: bool = False      # K/V through Hopper tensor descriptors (TMA) instead of pointer loads
    ws: bool = False       # warp-specialised key loop (Triton's tl.range(..., warp_specialize=True))
    persistent: bool = False   # one program per SM (at most), each looping over tiles
    pipe: bool = False     # software-pipelined key loop: block j+1's scores issued before block j's softmax
    scale_q: bool = False  # the softmax scale folded into q once per tile (no multiply per score)
    maxnreg: int = 0       # > 0: registers per thread capped (ptxas), e.g. 128 so two 8-warp programs share an SM
    per_sm: int = 1        # persistent: programs per SM (the grid is min(tiles, per_sm * SMs))

    @property
    def label(self) -> str:
        """A short name: BMxBN/warps/stages and the switches, e.g. ``128x128w8s3-tma-ws``."""
        sw = "".join(f"-{n}" for n, on in (("tma", self.tma), ("ws", self.ws), ("pers", self.persistent),
                                            ("pipe", self.pipe), ("sq", self.scale_q)) if on)
        if self.persistent and self.per_sm > 1:
            sw = sw.replace("-pers", f"-pers{self.per_sm}")
        if self.maxnreg:
            sw += f"-r{self.maxnreg}"
        return f"{self.block_m}x{self.block_n}w{self.num_warps}s{self.num_stages}{sw}"

    def validate(self) -> None:
        for name in ("block_m", "block_n"):
            v = getattr(self, name)
            if v < 16 or v > 256 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two in [16, 256], got {v}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be a power of two <= 16, got {self.num_warps}")
        if not 1 <= self.num_stages <= 6:
            raise ValueError(f"num_stages must be in [1, 6], got {self.num_stages}")
        if self.maxnreg and not 24 <= self.maxnreg <= 255:
            raise ValueError(f"maxnreg must be 0 (no cap) or in [24, 255], got {self.maxnreg}")
        if not 1 <= self.per_sm <= 8 or (self.per_sm > 1 and not self.persistent):
            raise ValueError(f"per_sm must be in [1, 8] and > 1 only for a persistent launch, got {self.per_sm}")


# H200 (sm_90): BLOCK_M=128, BLOCK_N=64; 4 warps / 2 stages ran 510-523 TFLOP/s at D=128 in a
# reference run before this project's sweeps (docs/findings.mdhas ours). The tuner
# (``tune_config``) times every candidate on the shape and keeps the fastest; the TMA ones load K/V with Hopper's
# bulk tensor copies. The first candidate is the untuned default. The last (TMA, 4 stages, 8 warps) was added
# for issue 14: a deeper K/V pipeline for the S >= 8K shapes (at D = 128 with 64-key blocks: four stages of
# 128-key K/V blocks would need 256 KiB of shared memory). The persistent 128 x 128 tile at D = 128 (one program
# per SM looping over tiles) won in the attention ladder (an earlier record, data/h200x1/attention_ladder: +1-7 % over the
# same tile launched one program per tile, checked bit for bit in the same run); at D = 64 it lost (spills).
H200_CONFIGS = {
    64: (AttnConfig(128, 64, 4, 3), AttnConfig(128, 128, 4, 3), AttnConfig(128, 128, 8, 3), AttnConfig(128, 64, 4, 2),
         AttnConfig(128, 64, 4, 3, True), AttnConfig(128, 128, 4, 3, True), AttnConfig(128, 128, 8, 3, True),
         AttnConfig(128, 64, 4, 4, True), AttnConfig(128, 128, 8, 4, True)),
    128: (AttnConfig(128, 64, 4, 2), AttnConfig(128, 64, 8, 3), AttnConfig(128, 128, 8, 2), AttnConfig(128, 64, 4, 3),
          AttnConfig(128, 64, 4, 3, True), AttnConfig(128, 64, 8, 3, True), AttnConfig(128, 128, 8, 2, True),
          AttnConfig(128, 128, 8, 3, True), AttnConfig(128, 64, 8, 4, True),
          AttnConfig(128, 128, 8, 3, True, persistent=True)),
}
INTERPRETER_CONFIG = AttnConfig(64, 64, 4, 1)


def default_config(D: int) -> AttnConfig:
    """The first H200 candidate on GPUs; small blocks under the interpreter."""
    return INTERPRETER_CONFIG if env.interpreted() else H200_CONFIGS[D][0]


def default_dtype() -> torch.dtype:
    return torch.float16 if env.interpreted() else torch.bfloat16


# ------------------------------------------------------------------------------------------------ validation
def validate_shape(S: int, H: int, D: int, P: int) -> None:
    """Raise ValueError before any launch when the layer cannot be split over P ranks."""
    if P < 1:
        raise ValueError(f"ranks must be >= 1, got {P}")
    if D not in HEAD_DIMS:
        raise ValueError(f"head dim must be one of {HEAD_DIMS}, got {D}")
    if H < 1 or H % P:
        raise ValueError(f"heads ({H}) must be a positive multiple of the number of ranks ({P})")
    if S < 1 or S % P:
        raise ValueError(f"sequence length ({S}) must be a positive multiple of the number of ranks ({P})")
    if S * H * D > INT32_MAX:
        raise ValueError(f"S*H*D = {S * H * D} elements exceeds int32 offsets")


def validate_torch_dtype(dtype: torch.dtype) -> None:
    """A torch dtype the attention kernel runs in here (xstage.moe_plan.validate_dtype takes a dtype name)."""
    if env.interpreted():
        if dtype not in (torch.float16, torch.float32):
            raise ValueError(f"dtype must be float16 or float32 under Triton's interpreter (its bf16 tl.dot is "
                             f"wrong), got {dtype}")
    elif dtype != torch.bfloat16:
        raise ValueError(f"dtype must be bfloat16 on GPUs, got {dtype}")


def validate_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int, int]:
    """q, k, v [S, Hl, D]: same shape, dtype and device, contiguous; returns (S, Hl, D)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"{name} must be a 3-D tensor [S, Hl, D], got "
                             f"{getattr(t, 'shape', type(t).__name__)}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"q, k, v shapes differ: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v devices differ: {q.device}, {k.device}, {v.device}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous [S, Hl, D] (strides {t.stride()})")
    S, Hl, D = q.shape
    if D not in HEAD_DIMS:
        raise ValueError(f"head dim must be one of {HEAD_DIMS}, got {D}")
    validate_torch_dtype(q.dtype)
    want_cpu = env.interpreted()
    if (q.device.type == "cpu") != want_cpu:
        raise ValueError(f"tensors must be on the {'CPU (Triton interpreter)' if want_cpu else 'GPU'}, got "
                         f"{q.device}")
    if S < 1 or Hl < 1 or S * Hl * D > INT32_MAX:
        raise ValueError(f"[S, Hl, D] = {tuple(q.shape)}: empty or beyond int32 offsets")
    return S, Hl, D


# ------------------------------------------------------------------------------------------------- launchers
def _scale(sm_scale: float | None, D: int) -> float:
    return (1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)) * LOG2E


def n_programs(S: int, heads: int, config: AttnConfig) -> int:
    """Output tiles of one launch over ``heads`` heads (programs, unless persistent; rows of the timestamp
    buffer)."""
    return -(-S // config.block_m) * heads


def _launch(q, k, v, out_ptr, out_table, ts, S, Sl, out_row_stride, h_start, heads, out_head0, qk_scale,
            config: AttnConfig, fused: bool) -> None:
    D = q.shape[2]
    n_tiles = -(-S // config.block_m) * heads
    grid = (-(-S // config.block_m), heads)
    if config.persistent:   # at most one program per SM (a few under the interpreter, so the tile loop loops)
        grid = (min(n_tiles, 3 if env.interpreted() else config.per_sm * _sm_count(q.device)),)
    timed = ts is not None
    dummy = _dummy(q.device)
    kd = vd = None
    if config.tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        Hl = q.shape[1]
        kd = TensorDescriptor.from_tensor(k.view(S, Hl * D), [config.block_n, D])
        vd = TensorDescriptor.from_tensor(v.view(S, Hl * D), [config.block_n, D])
    LAST_LAUNCH["kernel"] = ulysses_attention_kernel[grid](
        q, k, v, kd, vd, out_ptr if out_ptr is not None else q, out_table if out_table is not None else dummy,
        ts if timed else dummy, S, Sl, q.shape[1] * D, out_row_stride, h_start, out_head0, qk_scale, heads,
        HEAD_DIM=D, BLOCK_M=config.block_m, BLOCK_N=config.block_n, EVEN_N=S % config.block_n == 0,
        FUSED=fused, TIMED=timed, DEVICE=not env.interpreted(), TMA=config.tma, WS=config.ws,
        PERSISTENT=config.persistent, PIPE=config.pipe, SCALE_Q=config.scale_q,
        num_warps=config.num_warps, num_stages=config.num_stages,
        **({"maxnreg": config.maxnreg} if config.maxnreg and not env.interpreted() else {}),
    )


LAST_LAUNCH: dict = {}   # "kernel": the compiled kernel of the last launch (GPU: registers, spills, PTX)
_SMS: dict[torch.device, int] = {}


def _sm_count(device: torch.device) -> int:
    if device not in _SMS:
        _SMS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SMS[device]


_DUMMIES: dict[torch.device, torch.Tensor] = {}


def _dummy(device: torch.device) -> torch.Tensor:
    """An int64 placeholder for pointer arguments a constexpr switch leaves unused (allocated once)."""
    if device not in _DUMMIES:
        _DUMMIES[device] = torch.zeros(1, dtype=torch.int64, device=device)
    return _DUMMIES[device]


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float | None = None,
                      config: AttnConfig | None = None, out: torch.Tensor | None = None, h_start: int = 0,
                      heads: int | None = None, ts: torch.Tensor | None = None) -> torch.Tensor:
    """Our attention alone (non-causal): q, k, v [S, Hl, D] -> out [S, Hc, D] for heads h_start .. h_start + Hc
    (all Hl by default). ``ts`` int64 [n_programs, 2] gets device timestamps (GPU)."""
    S, Hl, D = validate_qkv(q, k, v)
    config = config or default_config(D)
    config.validate()
    heads = Hl - h_start if heads is None else heads
    if not (0 <= h_start and heads >= 1 and h_start + heads <= Hl):
        raise ValueError(f"heads {h_start} .. {h_start + heads} are not within this rank's {Hl}")
    if out is None:
        out = torch.empty(S, heads, D, dtype=q.dtype, device=q.device)
    elif out.shape != (S, heads, D) or out.dtype != q.dtype or not out.is_contiguous():
        raise ValueError(f"out must be contiguous {(S, heads, D)} {q.dtype}, got {tuple(out.shape)} {out.dtype}")
    _check_ts(ts, n_programs(S, heads, config))
    _launch(q, k, v, out, None, ts, S, S, heads * D, h_start, heads, 0, _scale(sm_scale, D), config, fused=False)
    return out


def _check_ts(ts, n: int) -> None:
    if ts is not None and (ts.dtype != torch.int64 or ts.numel() < 2 * n or not ts.is_contiguous()):
        raise ValueError(f"ts must be a contiguous int64 buffer of >= {2 * n} elements ([programs, 2])")


@dataclass
class UlyssesBuffers:
    """Symmetric buffers of the fused layer: every rank's output out[Sl, H, D] (capacity ``numel`` elements)
    and flags[P] int32, their peer-pointer tables on each local rank's device, the barrier's status, the epoch."""

    world_size: int
    numel: int
    dtype: torch.dtype
    out: object                                   # SymmTensor
    flags: object                                 # SymmTensor int32 [P]
    out_table: dict[int, torch.Tensor]            # rank -> int64 [P] every rank's out base address
    flag_table: dict[int, torch.Tensor]           # rank -> int64 [P] every rank's flags base address
    status: dict[int, torch.Tensor]               # rank -> int64 [P, 6] barrier waits
    epoch: int = 0

    def out_view(self, rank: int, S: int, H: int, D: int) -> torch.Tensor:
        """Rank ``rank``'s output as [Sl, H, D]."""
        n = S // self.world_size * H * D
        return self.out.local(rank)[:n].view(S // self.world_size, H, D)


def ulysses_buffers(world, S: int, H: int, D: int, dtype: torch.dtype | None = None) -> UlyssesBuffers:
    """Allocate (collectively, on GPUs) the fused layer's buffers for layers up to [S, H, D]; flags zeroed."""
    P = world.world_size
    dtype = dtype or default_dtype()
    validate_shape(S, H, D, P)
    validate_torch_dtype(dtype)
    numel = S // P * H * D
    # peers store into every rank's output: a destination buffer (pinned host memory for the peers of
    # OneGPUWorld(link="host"), so the observed rank's fused stores cross PCIe; before this was marked, the
    # one-GPU host-link records' fused outputs were all in device memory (docs/findings.md); the tables are each rank's own (``SymmTensor.table``: ``ptrs`` in every world but
    # xstage.traffic.TrafficWorld, whose GPU g sends the rows of the ranks no GPU plays into sinks on its peer)
    out = world.symmetric_empty(numel, dtype, destination=True)
    flags = world.symmetric_empty(P, torch.int32)
    for r in world.local_ranks:
        flags.local(r).zero_()
    dev = {r: world.device(r) for r in world.local_ranks}
    for r in world.local_ranks:  # the fused epilogues store 16 bytes of a row at a time (kernels/attention_gluon.py)
        bad = [hex(a) for a in out.table(r) if a % 16]
        if bad:
            raise ValueError(f"rank {r}: the output buffers' addresses must be 16-byte aligned, got {bad}")
    bufs = UlyssesBuffers(
        P, numel, dtype, out, flags,
        {r: torch.tensor(out.table(r), dtype=torch.int64, device=dev[r]) for r in world.local_ranks},
        {r: torch.tensor(flags.table(r), dtype=torch.int64, device=dev[r]) for r in world.local_ranks},
        {r: torch.zeros(P, STATUS_FIELDS, dtype=torch.int64, device=dev[r]) for r in world.local_ranks})
    world.barrier()  # every rank's flags are zero before anyone signals
    return bufs


def _validate_fused(world, q, k, v, bufs: UlyssesBuffers, ranks: Sequence[int]) -> tuple[int, int, int]:
    P = world.world_size
    if bufs.world_size != P:
        raise ValueError(f"buffers are for {bufs.world_size} ranks, the world has {P}")
    if not ranks or any(r not in world.local_ranks for r in ranks):
        raise ValueError(f"ranks {list(ranks)} must be a non-empty subset of this process's {world.local_ranks}")
    shapes = set()
    for r in ranks:
        for name, t in (("q", q), ("k", k), ("v", v)):
            missing = (r not in t) if isinstance(t, Mapping) else (r >= len(t))
            if missing:
                raise ValueError(f"{name} has no tensor for local rank {r}")
        shapes.add(validate_qkv(q[r], k[r], v[r]))
        if q[r].dtype != bufs.dtype:
            raise ValueError(f"rank {r}: inputs are {q[r].dtype}, the output buffers {bufs.dtype}")
        if q[r].device != world.device(r):
            raise ValueError(f"rank {r}: inputs on {q[r].device}, the rank's device is {world.device(r)}")
    if len(shapes) != 1:
        raise ValueError(f"ranks have different [S, Hl, D]: {sorted(shapes)}")
    S, Hl, D = shapes.pop()
    validate_shape(S, Hl * P, D, P)
    if S // P * Hl * P * D > bufs.numel:
        raise ValueError(f"output [S/P, H, D] = {[S // P, Hl * P, D]} exceeds the buffers' {bufs.numel} elements")
    return S, Hl, D


def ulysses_fused(world, q: Mapping[int, torch.Tensor], k: Mapping[int, torch.Tensor],
                  v: Mapping[int, torch.Tensor], bufs: UlyssesBuffers, sm_scale: float | None = None,
                  config: AttnConfig | None = None, barrier: bool = True, ts: Mapping[int, torch.Tensor] | None = None,
                  check: bool = True, max_polls: int = MAX_POLLS, silent_ranks: Sequence[int] = (),
                  ranks: Sequence[int] | None = None) -> dict[int, torch.Tensor]:
    """The fused Ulysses layer on every local rank: q[r], k[r], v[r] [S, Hl, D] -> out[r] [Sl, H, D] in
    ``bufs`` (written by every rank's kernel through peer pointers), then the cross-rank barrier.

    ``ts[r]``: int64 [n_programs, 2] device timestamps. ``check``: read the barrier status and raise on a
    timeout (a host sync; the sweep checks once after timing). ``silent_ranks`` skip the barrier altogether
    (tests: a peer that never signals). ``ranks``: the local ranks whose kernels launch (default: all; the
    one-process worlds time one rank's kernel, the others having run before); the barrier is every rank's.
    Returns {rank: out view [Sl, H, D]}."""
    ranks = list(world.local_ranks if ranks is None else ranks)
    S, Hl, D = _validate_fused(world, q, k, v, bufs, ranks)
    config = config or default_config(D)
    config.validate()
    P = world.world_size
    for r in ranks:
        if ts is not None:
            _check_ts(ts[r], n_programs(S, Hl, config))
    for r in ranks:
        _launch(q[r], k[r], v[r], None, bufs.out_table[r], None if ts is None else ts[r], S, S // P, Hl * P * D,
                0, Hl, r * Hl, _scale(sm_scale, D), config, fused=True)
    if barrier:
        end_barrier(world, bufs, check=check, max_polls=max_polls, silent_ranks=silent_ranks)
    return {r: bufs.out_view(r, S, Hl * P, D) for r in ranks}


def end_barrier(world, bufs: UlyssesBuffers, check: bool = True, max_polls: int = MAX_POLLS,
                silent_ranks: Sequence[int] = ()) -> None:
    """Every rank releases the next epoch into every peer's flags and waits (bounded) for all peers'."""
    bufs.epoch += 1
    epoch_barrier(world, bufs.flag_table, bufs.flags, bufs.status, bufs.epoch, BARRIER_NAME, max_polls, check,
                  silent_ranks)


def check_barrier_status(bufs: UlyssesBuffers, rank: int) -> None:
    """Raise RuntimeError naming the waiting rank and the peer that never arrived (instead of having hung)."""
    raise_on_barrier_timeout(bufs.status[rank], BARRIER_NAME)


def sender_visible_ms(ts: torch.Tensor, n: int) -> float:
    """ts [>= n, 2] global-timer ns -> max(last store) - min(start) over the n programs, in ms (int64 first)."""
    t = ts.reshape(-1)[: 2 * n].view(n, 2).cpu()
    return int(t[:, 1].max() - t[:, 0].min()) / 1e6


# ----------------------------------------------------------------------------------- layouts and reference
def shard_heads(x_all: torch.Tensor, P: int) -> list[torch.Tensor]:
    """[S, H, D] -> P x [S, Hl, D] contiguous: the attention inputs after the pre-attention all-to-all."""
    S, H, D = x_all.shape
    Hl = H // P
    return [x_all[:, r * Hl:(r + 1) * Hl].contiguous() for r in range(P)]


def pre_all_to_all(xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """P x [Sl, H, D] (sequence-sharded) -> P x [S, Hl, D] (head-sharded), by plain indexing."""
    P = len(xs)
    Hl = xs[0].shape[1] // P
    return [torch.cat([x[:, r * Hl:(r + 1) * Hl] for x in xs], dim=0).contiguous() for r in range(P)]


def post_all_to_all(os_: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """P x [S, Hl, D] (head-sharded) -> P x [Sl, H, D] (sequence-sharded), by plain indexing: rank r gets rows
    r * Sl .. of every rank's output, heads in rank order."""
    P = len(os_)
    Sl = os_[0].shape[0] // P
    return [torch.cat([o[r * Sl:(r + 1) * Sl] for o in os_], dim=1).contiguous() for r in range(P)]


def relayout_received(recv: torch.Tensor, P: int, S: int, Hl: int, D: int) -> torch.Tensor:
    """A rank's receive buffer [P, Sl, Hl, D] (block i from rank i) -> its output [Sl, H, D] (a copy)."""
    return recv.reshape(-1)[: S * Hl * D].view(P, S // P, Hl, D).transpose(0, 1).reshape(S // P, P * Hl, D)


def post_all_to_all_nccl(o: torch.Tensor, world, recv: torch.Tensor | None = None) -> torch.Tensor:
    """This rank's [S, Hl, D] -> [Sl, H, D] with ``all_to_all_single`` (NCCL), then the relayout (a copy)."""
    P = world.world_size
    S, Hl, D = o.shape
    recv = torch.empty_like(o) if recv is None else recv                       # [P, Sl, Hl, D]: from rank i
    world.dist.all_to_all_single(recv, o)
    return relayout_received(recv, P, S, Hl, D)


def receive_buffers(world, S: int, Hl: int, D: int, dtype: torch.dtype):
    """Every rank's receive buffer of the all-to-all by copies, [P, Sl, Hl, D] each (a destination buffer:
    peers copy into it; in pinned host memory for the peers of ``OneGPUWorld(link="host")``)."""
    return world.symmetric_empty(S * Hl * D, dtype, destination=True)


def send_copies(world, rank: int, o: torch.Tensor, recv) -> None:
    """Rank ``rank``'s share of the post-attention all-to-all by copies, in a world where one process drives
    every rank (``world.emulated``: the CPU world, the one-GPU world; no NCCL there): the rows each rank owns,
    o[r * Sl:(r + 1) * Sl] (contiguous [Sl, Hl, D]), copied into block ``rank`` of rank r's receive buffer
    (``receive_buffers``). On a GPU each is one asynchronous cudaMemcpy (device to device, or device to pinned
    host memory: PCIe, for a host-link peer); the receiver then runs ``relayout_received`` once every rank has
    sent."""
    n = o.numel() // world.world_size
    flat = o.reshape(-1)
    for r in range(world.world_size):
        recv.local(r)[rank * n:(rank + 1) * n].copy_(flat[r * n:(r + 1) * n], non_blocking=True)


def post_all_to_all_copies(world, os_: Mapping[int, torch.Tensor], recv=None) -> dict[int, torch.Tensor]:
    """The post-attention all-to-all of every rank by copies (``send_copies`` from each, then each rank's
    relayout): {rank: [S, Hl, D]} -> {rank: [Sl, H, D]}, on each rank's receive-buffer device."""
    P = world.world_size
    S, Hl, D = next(iter(os_.values())).shape
    recv = receive_buffers(world, S, Hl, D, next(iter(os_.values())).dtype) if recv is None else recv
    for r in range(P):
        send_copies(world, r, os_[r], recv)
    if any(recv.local(r).is_cuda for r in range(P)):
        torch.cuda.synchronize()
    return {r: relayout_received(recv.local(r), P, S, Hl, D) for r in range(P)}


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float | None = None,
                        rows: slice | None = None, upcast: bool = True, chunk: int = 4096) -> torch.Tensor:
    """softmax(q k^T * scale) v per head, for query rows ``rows``: q, k, v [S, H, D] -> [R, H, D].

    ``upcast=True``: float32 (exact up to float32 rounding; TF32 off): the reference. ``upcast=False``: in the
    inputs' dtype, as plain PyTorch would (scores and probabilities rounded to it): PyTorch's own error, which
    the kernel may exceed by at most ~2x (flash-attention's ``attention_ref`` convention)."""
    S, H, D = q.shape
    rows = rows or slice(0, S)
    scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    dt = torch.float32 if upcast else q.dtype
    qr = q[rows]
    out = torch.empty(qr.shape[0], H, D, dtype=dt, device=q.device)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for h in range(H):
            kh, vh = k[:, h].to(dt), v[:, h].to(dt)                            # [S, D]
            for i in range(0, qr.shape[0], chunk):
                s = (qr[i:i + chunk, h].to(dt) * scale) @ kh.T                 # [c, S]
                out[i:i + chunk, h] = torch.softmax(s, dim=-1).to(dt) @ vh
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return out


def reference_ulysses(q_all: torch.Tensor, k_all: torch.Tensor, v_all: torch.Tensor, P: int,
                      sm_scale: float | None = None) -> list[torch.Tensor]:
    """Float32 reference of the whole layer: attention on the upcast [S, H, D] inputs, then the post
    all-to-all by indexing -> P x [Sl, H, D] (rank r: rows r * Sl ..)."""
    S, H, D = q_all.shape
    validate_shape(S, H, D, P)
    ref = attention_reference(q_all, k_all, v_all, sm_scale)
    Sl = S // P
    return [ref[r * Sl:(r + 1) * Sl] for r in range(P)]


REL_L2_FLOOR = {torch.float32: 1e-6, torch.float16: 1e-4, torch.bfloat16: 1e-3}


def check_close(out: torch.Tensor, ref: torch.Tensor, torch_out: torch.Tensor, what: str) -> tuple[float, float]:
    """The kernel's relative L2 error to the float32 reference at most 2x PyTorch's own at that dtype (plus a
    small floor); returns (kernel error, PyTorch error)."""
    err, err_pt = rel_l2(out, ref), rel_l2(torch_out, ref)
    if not err <= 2 * err_pt + REL_L2_FLOOR[out.dtype]:
        raise AssertionError(f"{what}: relative L2 error {err:.3g} > 2 x PyTorch's {err_pt:.3g} "
                             f"+ {REL_L2_FLOOR[out.dtype]:g}")
    return err, err_pt


# ------------------------------------------------------------------------------------ baselines (GPU only)
def sdpa_cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float | None = None) -> torch.Tensor:
    """torch SDPA with the cuDNN backend: [S, Hl, D] -> [S, Hl, D] (viewed as [1, Hl, S, D] without copies).
    Call inside ``sdpa_kernel(SDPBackend.CUDNN_ATTENTION)``."""
    import torch.nn.functional as F

    def bhsd(t):
        return t.transpose(0, 1).unsqueeze(0)                                 # [1, Hl, S, D]
    o = F.scaled_dot_product_attention(bhsd(q), bhsd(k), bhsd(v), scale=sm_scale)
    return o.squeeze(0).transpose(0, 1).contiguous()                           # [S, Hl, D]


def overlap_chunk_candidates(Hl: int, candidates: Sequence[int] = OVERLAP_CHUNK_CANDIDATES) -> list[int]:
    """The head-chunk counts worth timing for Hl heads per rank: each candidate capped at Hl, duplicates dropped."""
    return sorted({max(1, min(c, Hl)) for c in candidates})


def _chunk_bounds(Hl: int, n: int) -> list[int]:
    return [Hl * i // n for i in range(n + 1)]


def overlap_receive_buffers(world, S: int, Hl: int, D: int, dtype: torch.dtype, chunks: int) -> list:
    """Every rank's receive buffers of the overlapped pipeline by copies: one per head chunk."""
    n = max(1, min(chunks, Hl))
    b = _chunk_bounds(Hl, n)
    return [receive_buffers(world, S, b[i + 1] - b[i], D, dtype) for i in range(n)]


def make_overlapped(world, q, k, v, chunks: int = OVERLAP_CHUNKS, config: AttnConfig | None = None,
                    sm_scale: float | None = None, rank: int | None = None, recvs=None):
    """The stream-overlapped baseline (as yunchang's AsyncLongContextAttention, on the output side): attention on
    head chunk c while chunk c-1's all-to-all runs beside it; returns fn() -> [Sl, H, D].

    One process per GPU (``world.emulated`` False): NCCL ``all_to_all_single`` with ``async_op`` (NCCL's
    stream). One process driving every rank (the one-GPU world; the CPU world): rank ``rank``'s share by copies
    (``send_copies``) on a side CUDA stream (sequential on the CPU); its own relayout reads what the peers sent
    before (their sends are not timed). ``recvs``: the receive buffers per chunk (``overlap_receive_buffers``),
    shared by every rank's pipeline so that each rank's output is complete once every rank has run."""
    S, Hl, D = q.shape
    P = world.world_size
    rank = world.local_ranks[0] if rank is None else rank
    n = max(1, min(chunks, Hl))
    bounds = _chunk_bounds(Hl, n)                                             # head chunk edges
    outs = [torch.empty(S, bounds[i + 1] - bounds[i], D, dtype=q.dtype, device=q.device) for i in range(n)]
    final = torch.empty(S // P, P, Hl, D, dtype=q.dtype, device=q.device)       # [Sl, P, Hl, D] = [Sl, H, D]
    copies = world.emulated
    if copies:
        recvs = overlap_receive_buffers(world, S, Hl, D, q.dtype, n) if recvs is None else recvs
        if len(recvs) != n:
            raise ValueError(f"{len(recvs)} receive buffers for {n} head chunks")
        side = torch.cuda.Stream(q.device) if q.is_cuda else None
    else:
        recvs = [torch.empty_like(o) for o in outs]

    def start(i):
        if not copies:
            return world.dist.all_to_all_single(recvs[i], outs[i], async_op=True)
        if side is None:
            send_copies(world, rank, outs[i], recvs[i])
            return None
        side.wait_stream(torch.cuda.current_stream(q.device))
        with torch.cuda.stream(side):
            send_copies(world, rank, outs[i], recvs[i])
            done = torch.cuda.Event()
            done.record(side)
        return done

    def finish(i, work):
        if not copies:
            work.wait()
        elif work is not None:
            torch.cuda.current_stream(q.device).wait_event(work)
        return recvs[i].local(rank) if copies else recvs[i]

    def run() -> torch.Tensor:
        works = []
        for i in range(n):
            attention_forward(q, k, v, sm_scale, config, out=outs[i], h_start=bounds[i],
                              heads=bounds[i + 1] - bounds[i])
            works.append(start(i))
        for i in range(n):
            got = finish(i, works[i])
            hc = bounds[i + 1] - bounds[i]
            blocks = got.reshape(-1)[: S * hc * D].view(P, S // P, hc, D)           # block j from rank j
            final[:, :, bounds[i]:bounds[i + 1]] = blocks.transpose(0, 1)
        return final.view(S // P, P * Hl, D)
    return run


# ------------------------------------------------------------------------------------------- correctness job
def _as_shape(c) -> UlyssesShape:
    if isinstance(c, UlyssesShape):
        return c
    S, H, D = c
    return UlyssesShape(f"S{S}_H{H}_D{D}", S, H, D)


def _random_inputs(shape: UlyssesShape, dtype, device, seed: int):
    """The layer's q, k, v [S, H, D], identical on every rank (same seed, same generator type)."""
    g = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(shape.S, shape.H, shape.D, generator=g, device=device).to(dtype) for _ in range(3)]


def check_job(world, cases: Sequence, seed: int, dtype: torch.dtype | None = None, config: AttnConfig | None = None,
              max_polls: int = MAX_POLLS) -> list[dict]:
    """For each case (an UlyssesShape or (S, H, D)): poison every output with NaN, run the fused layer, and
    require (1) bit-exact equality with our attention followed by the all-to-all (NCCL ``all_to_all_single`` on
    GPUs, torch indexing for emulated ranks), which also proves every element was written; (2) a relative L2
    error to the float32 reference at most 2x PyTorch's own at that dtype. Runs on every rank (GPU) or once for
    an emulated world. Returns one dict per (case, local rank) with both errors."""
    if getattr(world, "traffic_ranks", None):   # rows of the ranks no GPU plays stay unwritten there, by design
        raise ValueError(f"check_job cannot check this world ({world.label}): use xstage.traffic_ulysses.check_job")
    P = world.world_size
    dtype = dtype or default_dtype()
    validate_torch_dtype(dtype)
    cases = [_as_shape(c) for c in cases]
    for c in cases:
        validate_shape(c.S, c.H, c.D, P)
        (config or default_config(c.D)).validate()
    big = max(cases, key=lambda c: c.S // P * c.H * c.D)
    bufs = ulysses_buffers(world, big.S, big.H, big.D, dtype)
    dev = world.device(world.local_ranks[0])
    results = []
    for i, c in enumerate(cases):
        S, H, D, Hl, Sl = c.S, c.H, c.D, c.H // P, c.S // P
        cfg = config or default_config(D)
        q_all, k_all, v_all = _random_inputs(c, dtype, dev, seed + 1000 * i)
        q, k, v = ({r: x[:, r * Hl:(r + 1) * Hl].contiguous() for r in world.local_ranks}
                   for x in (q_all, k_all, v_all))
        if not world.emulated:  # compile before the first barrier, so that no rank waits on a peer's compiler
            ulysses_fused(world, q, k, v, bufs, config=cfg, barrier=False)
            world.barrier()
        for r in world.local_ranks:
            bufs.out_view(r, S, H, D).fill_(float("nan"))
        world.barrier()
        outs = ulysses_fused(world, q, k, v, bufs, config=cfg, max_polls=max_polls)
        world.barrier()
        local = {r: attention_forward(q[r], k[r], v[r], config=cfg) for r in world.local_ranks}
        if world.emulated:
            serial = dict(enumerate(post_all_to_all([local[r] for r in range(P)])))
            copies = post_all_to_all_copies(world, local)           # the one-process worlds' serial baseline
            for r in range(P):
                check_bit_identical(copies[r].to(dev), serial[r], f"{c.name} P={P} rank {r}: all-to-all by copies "
                                    f"vs by indexing")
        else:
            serial = {r: post_all_to_all_nccl(local[r], world) for r in world.local_ranks}
        for r in world.local_ranks:
            out_r = outs[r].to(dev)                                  # a host-link peer's output is in host memory
            check_bit_identical(out_r, serial[r], f"{c.name} P={P} rank {r}: fused vs attention + all-to-all")
            rows = slice(r * Sl, (r + 1) * Sl)
            ref = attention_reference(q_all, k_all, v_all, rows=rows)
            pt = attention_reference(q_all, k_all, v_all, rows=rows, upcast=False)
            err, err_pt = check_close(out_r, ref, pt, f"{c.name} P={P} rank {r}")
            results.append(dict(case=c.name, S=S, H=H, D=D, P=P, rank=r, rel_l2=err, rel_l2_torch=err_pt,
                                straddles=bool(Sl % cfg.block_m)))
        del q_all, k_all, v_all, q, k, v, outs, local, serial, out_r
    return results


def barrier_timeout_job(world, silent_rank: int, max_polls: int = 100_000) -> None:
    """A planted missing peer: ``silent_rank`` never signals; every other rank must raise a RuntimeError naming
    itself and the silent rank (checked here, on GPUs inside ``spawn``)."""
    bufs = ulysses_buffers(world, world.world_size, world.world_size, 64, default_dtype())
    end_barrier(world, bufs, check=False, max_polls=max_polls, silent_ranks=(silent_rank,))
    for r in world.local_ranks:
        if r == silent_rank:
            continue
        try:
            check_barrier_status(bufs, r)
        except RuntimeError as e:
            if f"rank {r} timed out waiting for rank {silent_rank}" not in str(e):
                raise
        else:
            raise AssertionError(f"rank {r}: the barrier completed although rank {silent_rank} never signalled")
