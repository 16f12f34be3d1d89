"""Our attention forward written in Gluon for Hopper (``xstage.kernels.attention_gluon``), a method beside the Triton
kernel: same I/O as ``xstage.ulysses.attention_forward`` ([S, Hl, D] bf16, D 64 / 128,
non-causal), plus the optional log-sum-exp [Hl, S] float32.

- ``available()``: (True, versions) on a Hopper GPU whose Triton has Gluon for Hopper; else (False, one line):
  Gluon does not run under Triton's CPU interpreter, needs sm_90, and needs Triton >= 3.5.
- ``attention_forward(q, k, v, config=GluonConfig(...))``: validated first (head dim, dtype, shape, the tile
  against S and D, Gluon present), then one launch.
- ``compile_sm90(config, D)``: the kernel compiled for sm_90a without a GPU (Triton's compiler and ptxas run on any
  machine): registers, shared memory and the PTX facts that say whether the wgmma waits are the overlapped ones.

The ladder (``xstage.ulysses_ladder``) times a ``GluonConfig`` as method ``gluon`` in the same rounds as FA4's kernel
and cuDNN SDPA, after checking it against a float32 reference on fresh inputs; the ladder does not run a fused
(all-to-all) epilogue for it, so the fused layer's bit-exact check does not apply there (recorded as such).
- ``attention_fused`` / ``ulysses_fused`` (compiled for sm_90a, **not yet run on a GPU**): the ws kernel
  with the Ulysses post-attention all-to-all in its epilogue (each row to its owner rank through a table of peer
  addresses, straddling tiles split per row), then ``xstage.ulysses.end_barrier``; tests/test_attention_gluon.py
  checks it bit for bit against the kernel alone + ``post_all_to_all`` on one GPU (local and host link).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import torch

from . import env
from .kernels import attention_gluon
from .kernels.attention_gluon import AVAILABLE, WHY, gluon_attention_kernel, gluon_attention_ws_kernel
from .ulysses import HEAD_DIMS, end_barrier

METHOD = "gluon"          # the ladder's method name for this kernel's rows


@dataclass(frozen=True)
class GluonConfig:
    """Tile shape of the Gluon kernel: BLOCK_M query rows per CTA (num_warps / 4 warpgroups of 16 rows per warp),
    BLOCK_N keys per block, STAGES K/V ring slots. ``ws``: the warp-specialised kernel (a loader warp and two
    consumer warpgroups of num_warps = 4 warps, 64 rows each, sharing the K/V ring; BLOCK_M 128, or 192: three
    consumers, D = 64 only, as FA4 tiles D = 64), its consumers' registers raised to ``regs`` (setmaxnreg);
    ``pingpong`` with ``named_pp`` (ws only): the consumers issue their GEMMs in turn (FA3's ping-pong), the turns in
    hardware named barriers (bar.sync / bar.arrive), as FA4's Hopper kernel orders them (its warp-scheduler
    barriers); ``reverse_kv``: the key blocks last to first, so the one masked block runs before the overlapped loop;
    ``persistent``: at most one CTA per SM walking tiles; ``joint_release``: one ring-slot release per key block."""

    block_m: int = 128
    block_n: int = 128
    num_warps: int = 8
    stages: int = 2
    ws: bool = False
    regs: int = 232
    mask_last: bool = False   # S % BLOCK_N != 0: mask only the last key block (else every block); on in every
                              # current config; the field's default keeps the recorded labels' meaning
    pingpong: bool = False    # ws, with named_pp: the consumers' GEMMs issued in turn
    persistent: bool = False  # ws: at most one CTA per SM, each walking tiles; the output in its own buffer
    named_pp: bool = False    # ws, with pingpong: the turns in named barriers (the only kind of turn)
    reverse_kv: bool = False  # ws, with mask_last: the key blocks last to first, the masked one outside the loop
    joint_release: bool = False   # ws: one release per ring slot (after the P V that read its V), not K's and V's apart

    @property
    def label(self) -> str:
        ml = ("-ml" if self.mask_last else "") + ("-pp" if self.pingpong else "") + ("-nb" if self.named_pp else "") \
            + ("-pe" if self.persistent else "") + ("-rv" if self.reverse_kv else "") \
            + ("-jr" if self.joint_release else "")
        if self.ws:
            return f"gluon-ws-{self.block_m}x{self.block_n}s{self.stages}r{self.regs}{ml}"
        return f"gluon-{self.block_m}x{self.block_n}w{self.num_warps}s{self.stages}{ml}"

    def validate(self, D: int | None = None, fused: bool = False) -> None:
        """One clear error (ValueError) for a tile the kernel cannot run; with ``D``, the shared-memory budget
        (``fused``: with the fused Ulysses epilogue's staging)."""
        if self.num_warps not in (4, 8):
            raise ValueError(f"Gluon attention: num_warps must be 4 or 8 (one or two warpgroups), got {self.num_warps}")
        if self.ws:
            if self.num_warps != 4 or self.block_m not in (128, 192):
                raise ValueError(f"Gluon attention, warp-specialised: two or three consumer warpgroups of 4 warps and "
                                 f"64 rows (num_warps 4, block_m 128 or 192), got num_warps {self.num_warps}, "
                                 f"block_m {self.block_m}")
            top = 240 if self.block_m == 128 else 160     # 3 consumers + the loader's warpgroup: 64K registers
            if self.regs % 8 or not 128 <= self.regs <= top:
                raise ValueError(f"Gluon attention: regs must be a multiple of 8 in [128, {top}] with "
                                 f"{self.block_m // 64} consumers, got {self.regs}")
            if self.block_m == 192 and D is not None and D != 64:
                raise ValueError(f"Gluon attention, three consumers (block_m 192): D = 64 only (the O accumulator "
                                 f"of D = {D} does not fit {self.regs} registers), got D = {D}")
        elif self.pingpong:
            raise ValueError("Gluon attention: pingpong orders the consumers of the warp-specialised kernel (ws)")
        elif self.persistent:
            raise ValueError("Gluon attention: persistent is a grid of the warp-specialised kernel (ws)")
        elif self.block_m != 16 * self.num_warps:
            raise ValueError(f"Gluon attention: block_m must be 16 x num_warps = {16 * self.num_warps} (16 rows per "
                             f"warp, warps stacked along the rows), got {self.block_m}")
        if self.reverse_kv and (not self.ws or not self.mask_last):
            raise ValueError("Gluon attention: reverse_kv (the key blocks last to first) is a loop of the "
                             "warp-specialised kernel (ws) with mask_last=True")
        if self.joint_release and not self.ws:
            raise ValueError("Gluon attention: joint_release is a ring of the warp-specialised kernel (ws)")
        if self.named_pp != self.pingpong:
            raise ValueError("Gluon attention: the ping-pong's turns are named barriers: pingpong and named_pp go "
                             f"together, got pingpong={self.pingpong}, named_pp={self.named_pp}")
        if self.block_n not in (32, 64, 128, 256):
            raise ValueError(f"Gluon attention: block_n must be 32, 64, 128 or 256, got {self.block_n}")
        if not 1 <= self.stages <= 4:
            raise ValueError(f"Gluon attention: stages must be in [1, 4], got {self.stages}")
        if D is not None:
            smem = self.shared_bytes(D, fused)
            if smem > SMEM_LIMIT:
                what = ", the fused epilogue's staging" if fused else ", the output" if self.persistent else ""
                raise ValueError(f"Gluon attention {self.label} at D = {D}: {smem} B of shared memory for Q{what} "
                                 f"and the K/V ring (limit {SMEM_LIMIT})")

    def shared_bytes(self, D: int, fused: bool = False) -> int:
        """The kernel's shared memory in bytes, its mbarriers left out (under 512 B): Q, the K/V ring, the
        persistent grid's output buffer, and with the fused Ulysses epilogue (ws; it stores from Q's buffer) Triton's
        staging of the row-wise stores, block_m x 64 elements. Checked against Triton 3.6's sm_90a builds
        (tests/test_attention_gluon.py): e.g. ws s3 -jr at D = 128 fused needs 245 888 B, over the limit, where
        alone it fits (229 680 B)."""
        q_out = self.block_m * (2 if self.persistent and not fused else 1)
        return 2 * D * (q_out + 2 * self.stages * self.block_n) + 2 * 64 * self.block_m * fused


SMEM_LIMIT = 227 * 1024   # Hopper's shared memory per CTA (opt-in maximum)
# the default tiles (attention_forward without a config): the one-partition kernel (its waits complete by
# themselves; the ws kernel's do not, see tests/test_attention_gluon.py), with the key mask on the last block only
# (an earlier record: +33 % for ws on 32760x6, the same on the shapes with S % 128 == 0)
CONFIGS = {128: (GluonConfig(128, 128, 8, 2, mask_last=True),), 64: (GluonConfig(128, 128, 8, 3, mask_last=True),)}

_AVAILABLE: tuple[bool, str] | None = None


def available() -> tuple[bool, str]:
    """(True, "triton X") where the Gluon kernel can run; else (False, why), one line."""
    global _AVAILABLE
    if _AVAILABLE is not None:
        return _AVAILABLE
    if env.interpreted() or not torch.cuda.is_available():
        _AVAILABLE = (False, "Gluon attention needs a Hopper GPU (none visible, or Triton's CPU interpreter: Gluon "
                             "does not run under it)")
        return _AVAILABLE
    cap = torch.cuda.get_device_capability()
    if cap[0] != 9:
        _AVAILABLE = (False, f"Gluon attention is written for sm_90 (Hopper's wgmma); this GPU is sm_{cap[0]}{cap[1]}")
        return _AVAILABLE

    if not attention_gluon.AVAILABLE:
        _AVAILABLE = (False, f"this Triton has no Gluon for Hopper ({attention_gluon.WHY}); needs Triton >= 3.5")
        return _AVAILABLE
    import triton

    _AVAILABLE = (True, f"triton {triton.__version__}")
    return _AVAILABLE


def require() -> None:
    ok, why = available()
    if not ok:
        raise RuntimeError(why)


def validate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: GluonConfig) -> tuple[int, int, int]:
    """q, k, v [S, Hl, D] bf16 contiguous on one CUDA device, D 64 or 128, a tile that fits -> (S, Hl, D); one
    clear error before any launch (Gluon's absence included)."""

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"{name} must be a 3-D tensor [S, Hl, D], got {getattr(t, 'shape', type(t).__name__)}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"q, k, v shapes differ: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    S, Hl, D = q.shape
    if D not in HEAD_DIMS:
        raise ValueError(f"head dim must be one of {HEAD_DIMS}, got {D}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype != torch.bfloat16:
            raise ValueError(f"Gluon attention runs bf16, got {name} {t.dtype}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous [S, Hl, D] (strides {t.stride()})")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v devices differ: {q.device}, {k.device}, {v.device}")
    if S < 1 or Hl < 1 or S * Hl * D >= 2 ** 31:
        raise ValueError(f"[S, Hl, D] = {tuple(q.shape)}: empty or beyond int32 offsets")
    config.validate(D)
    require()
    if q.device.type != "cuda":
        raise ValueError(f"Gluon attention runs on a CUDA device, got {q.device}")
    return S, Hl, D


def _layout(block, dtype):
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout.get_default_for(block, dtype)


def _descriptors(q, k, v, out, config: GluonConfig):
    """Gluon TMA descriptors over [S, Hl * D]: q / out blocks [BLOCK_M, D], k / v blocks [BLOCK_N, D]."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    S, Hl, D = q.shape
    bq, bk = [64 if config.ws else config.block_m, D], [config.block_n, D]
    lq, lk = _layout(bq, gl.bfloat16), _layout(bk, gl.bfloat16)
    return (TensorDescriptor.from_tensor(q.view(S, Hl * D), bq, lq),
            TensorDescriptor.from_tensor(k.view(S, Hl * D), bk, lk),
            TensorDescriptor.from_tensor(v.view(S, Hl * D), bk, lk),
            TensorDescriptor.from_tensor(out.view(S, Hl * D), bq, lq))


LAST_LAUNCH: dict = {}   # "kernel": the compiled kernel of the last launch (registers, shared memory, PTX)


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float | None = None,
                      config: GluonConfig | None = None, out: torch.Tensor | None = None,
                      lse: torch.Tensor | None = None, fused: tuple | None = None) -> torch.Tensor:
    """The Gluon attention (non-causal): [S, Hl, D] -> out [S, Hl, D]; ``lse`` (float32 [Hl, S], contiguous) gets
    the natural-log softmax denominators when given. ``fused`` (ws kernels only; see :func:`attention_fused`):
    (out_table int64 [P], rank, P): each output row goes to its owner rank's out [Sl, H, D] instead of ``out``."""

    D = q.shape[-1] if isinstance(q, torch.Tensor) and q.dim() == 3 else None
    config = config or CONFIGS.get(D, CONFIGS[128])[0]
    S, Hl, D = validate(q, k, v, config)
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or not out.is_contiguous() or out.device != q.device:
        raise ValueError(f"out must be contiguous {tuple(q.shape)} {q.dtype} on {q.device}")
    if lse is not None and (lse.shape != (Hl, S) or lse.dtype != torch.float32 or not lse.is_contiguous()
                            or lse.device != q.device):
        raise ValueError(f"lse must be contiguous float32 [{Hl}, {S}] on {q.device}")
    scale = (1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)) * 1.4426950408889634
    qd, kd, vd, od = _descriptors(q, k, v, out, config)
    grid = (-(-S // config.block_m) * Hl,)
    if config.persistent:   # at most one CTA per SM (the ws tiles take more than half an SM's shared memory)
        grid = (min(grid[0], _sm_count(q.device)),)
    kern, extra = (gluon_attention_ws_kernel, {"CONSUMER_REGS": config.regs, "PINGPONG": config.pingpong,
                                               "JOINT": config.joint_release}) \
        if config.ws else \
        (gluon_attention_kernel, {})
    ws_args = ()
    if config.ws:   # the fused epilogue's arguments (unused by the plain store)
        table, rank, P = fused if fused is not None else (_no_table(q.device), 0, 1)
        ws_args = (table, S // P, Hl * P * D, rank * Hl)
        extra["FUSED"] = fused is not None
        extra["PERSISTENT"] = config.persistent
    elif fused is not None:
        raise ValueError(f"the fused epilogue is in the warp-specialised Gluon kernel only, got {config.label}")
    LAST_LAUNCH["kernel"] = kern[grid](
        qd, kd, vd, od, lse if lse is not None else out, S, Hl, scale, *ws_args, HEAD_DIM=D, BLOCK_M=config.block_m,
        BLOCK_N=config.block_n, STAGES=config.stages, EVEN_N=S % config.block_n == 0, WRITE_LSE=lse is not None,
        num_warps=config.num_warps, MASK_LAST=mask_last_arg(config), **extra)
    return out


def mask_last_arg(config: GluonConfig):
    """The kernels' MASK_LAST constexpr: False (every key block masked when S % BLOCK_N != 0), True (the last block
    only, a branch in the loop), 3 (ws, reverse_kv: the key blocks last to first, so the masked block is the first,
    outside the overlapped loop)."""
    return 3 if config.reverse_kv else config.mask_last


_SMS: dict = {}


def _sm_count(device) -> int:
    if device not in _SMS:
        _SMS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SMS[device]


_NO_TABLE: dict = {}


def _no_table(device) -> torch.Tensor:
    """A one-entry int64 table for the plain launches of the ws kernel (the fused epilogue's pointer argument)."""
    if device not in _NO_TABLE:
        _NO_TABLE[device] = torch.zeros(1, dtype=torch.int64, device=device)
    return _NO_TABLE[device]


# ------------------------------------------------------------------------------- the fused Ulysses epilogue
def validate_fused(q: torch.Tensor, config: GluonConfig, out_table: torch.Tensor, rank: int, P: int,
                   addresses: bool = True) -> None:
    """One clear error before any launch: a ws tile, 1 <= P, 0 <= rank < P, S divisible by P, a table of P int64
    addresses on q's device, each 16-byte aligned (the epilogue's stores are 16 bytes of a row; ``addresses``:
    read the table to check it, one device-to-host copy; ``ulysses_fused`` skips it, its buffers' addresses were
    checked when ``xstage.ulysses.ulysses_buffers`` made them)."""
    if not config.ws:
        raise ValueError(f"the fused epilogue is in the warp-specialised Gluon kernel only (ws=True), got "
                         f"{config.label}")
    if q.dim() == 3:
        config.validate(q.shape[2], fused=True)
    if not (isinstance(P, int) and P >= 1 and isinstance(rank, int) and 0 <= rank < P):
        raise ValueError(f"rank must be in [0, P) with P >= 1, got rank {rank}, P {P}")
    if q.dim() == 3 and q.shape[0] % P:
        raise ValueError(f"S = {q.shape[0]} is not divisible by P = {P} (Sl = S / P rows per rank)")
    if not (isinstance(out_table, torch.Tensor) and out_table.dtype == torch.int64 and out_table.shape == (P,)
            and out_table.device == q.device):
        raise ValueError(f"out_table must be int64 [{P}] on {q.device} (every rank's out base address)")
    if addresses:
        bad = [hex(a) for a in out_table.tolist() if a % 16]
        if bad:
            raise ValueError(f"out_table's addresses must be 16-byte aligned (the fused epilogue stores 16 bytes of a "
                             f"row at a time), got {bad}")


def attention_fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out_table: torch.Tensor, rank: int, P: int,
                    config: GluonConfig, sm_scale: float | None = None) -> None:
    """Rank ``rank``'s attention with the Ulysses post-attention all-to-all in the epilogue: q, k, v [S, Hl, D]
    (this rank's heads over the whole sequence); each output row s goes to rank s // Sl's out [Sl, H, D] at row
    s % Sl and global head rank * Hl + h, through ``out_table`` (every rank's out base address, valid on q's
    device: peer pointers, or pinned host memory for the host link). Validated before any launch."""
    validate_fused(q, config, out_table, rank, P)
    validate(q, k, v, config)
    attention_forward(q, k, v, sm_scale, config=config, fused=(out_table, rank, P))


def ulysses_fused(world, q, k, v, bufs, config: GluonConfig | None = None, barrier: bool = True,
                  check: bool = True, ranks=None, events=None) -> dict:
    """The fused layer with the Gluon kernel: the fused attention of ``ranks`` (default every local rank) into
    ``bufs`` (an ``xstage.ulysses.UlyssesBuffers``), then the existing end-of-layer epoch barrier of every rank
    (``xstage.ulysses.end_barrier``; ``check``: read its status and raise on a timeout). In a one-process world the
    ranks run one after another. ``config``: default ``SWEEP_CONFIGS[D]``. ``events`` (start, end): CUDA events
    recorded around the kernels (before the barrier), the sender's view. Every rank's inputs are validated before
    any launch. Returns {rank: its out [Sl, H, D] view}."""

    P = world.world_size
    ranks = list(world.local_ranks if ranks is None else ranks)
    S, Hl, D = q[ranks[0]].shape
    config = sweep_config(D) if config is None else config
    for r in ranks:
        validate_fused(q[r], config, bufs.out_table[r], r, P, addresses=False)
        validate(q[r], k[r], v[r], config)
    if events is not None:
        events[0].record()
    for r in ranks:
        attention_forward(q[r], k[r], v[r], config=config, fused=(bufs.out_table[r], r, P))
    if events is not None:
        events[1].record()
    if barrier:
        end_barrier(world, bufs, check=check)
    return {r: bufs.out_view(r, S, Hl * P, D) for r in ranks}


# the Ulysses sweep's Gluon methods (xstage.ulysses_sweep): the Gluon kernel alone, then the
# post-attention all-to-all as serial_* does it, and its fused layer (the all-to-all in the epilogue, then the
# end-of-layer barrier; sender-visible: CUDA events around the kernel). Dropped with one line where
# ``available()`` says no (recorded as absent in the sidecar's ``params.gluon``, never as a 0 time).
SWEEP_METHODS = ("gluon", "gluon_serial", "gluon_fused")
# the sweep's tile per head dim: FA4's schedule, the fastest fused-capable variants of the ladder (two consumers
# with the key blocks reversed at D = 128; FA4's 192-row tile, three consumers in named-barrier turns, at D = 64;
# docs/findings.md). Sweep records made with other tiles name theirs (params.gluon.configs). Both checked bit for
# bit in the fused epilogue on one GPU (tests/test_attention_gluon.py).
SWEEP_CONFIGS = {128: GluonConfig(128, 128, 4, 2, ws=True, mask_last=True, reverse_kv=True),
                 64: GluonConfig(192, 128, 4, 2, ws=True, regs=160, mask_last=True, pingpong=True, named_pp=True,
                                 reverse_kv=True)}
# The ladder of the current record beside FA4 (data/<machine>/attention_vs_fa4, scripts/attention_vs_fa4.py),
# each step named by what it adds to the sweep's tile: the persistent grid (-pe) and one release per ring slot (-jr, with a third ring slot); at
# D = 64 also the keys in forward order (-pp-nb, no -rv) and -jr on the persistent grid (one CTA per SM: -jr's third
# slot fits beside the second Q buffer at D = 64 only).
LADDER = {
    128: (SWEEP_CONFIGS[128],
          replace(SWEEP_CONFIGS[128], persistent=True),
          replace(SWEEP_CONFIGS[128], stages=3, joint_release=True)),
    64: (SWEEP_CONFIGS[64],
         replace(SWEEP_CONFIGS[64], reverse_kv=False),
         replace(SWEEP_CONFIGS[64], stages=3, joint_release=True),
         replace(SWEEP_CONFIGS[64], stages=3, joint_release=True, persistent=True)),
}


def sweep_config(D: int) -> GluonConfig:
    """The sweep's Gluon tile for head dim ``D`` (``SWEEP_CONFIGS``); ValueError for another head dim."""
    if D not in SWEEP_CONFIGS:
        raise ValueError(f"Gluon attention: head dim must be one of {sorted(SWEEP_CONFIGS)}, got {D}")
    return SWEEP_CONFIGS[D]


# ------------------------------------------------------------------------------------ sm_90a compile, no GPU
def compile_sm90(config: GluonConfig, D: int, even_n: bool = True, write_lse: bool = False, fused: bool = False):
    """The kernel compiled for sm_90a by this machine's Triton (no GPU needed): the CompiledKernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type


    if not AVAILABLE:
        raise RuntimeError(f"this Triton has no Gluon for Hopper ({WHY})")
    config.validate(D)
    S, Hl = 4 * config.block_n, 2
    t = torch.empty(S, Hl, D, dtype=torch.bfloat16)
    qd, kd, vd, od = _descriptors(t, t, t, t, config)
    sig = {"q_desc": mangle_type(qd), "k_desc": mangle_type(kd), "v_desc": mangle_type(vd), "o_desc": mangle_type(od),
           "lse_ptr": "*fp32", "S": "i32", "Hl": "i32", "qk_scale": "fp32",
           "HEAD_DIM": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "STAGES": "constexpr",
           "EVEN_N": "constexpr", "WRITE_LSE": "constexpr", "num_warps": "constexpr"}
    const = {"HEAD_DIM": D, "BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "STAGES": config.stages,
             "EVEN_N": even_n, "WRITE_LSE": write_lse, "num_warps": config.num_warps}
    if config.ws:
        head = {k: v for k, v in sig.items() if k not in const}
        sig = {**head, "out_table": "*i64", "rows_per_rank": "i32", "out_row_stride": "i32", "out_head0": "i32",
               **{k: v for k, v in sig.items() if k in const and k != "num_warps"}, "CONSUMER_REGS": "constexpr",
               "num_warps": "constexpr"}
        const["CONSUMER_REGS"] = config.regs
    sig["MASK_LAST"] = "constexpr"
    const["MASK_LAST"] = mask_last_arg(config)
    if config.ws:
        sig["PINGPONG"] = "constexpr"
        const["PINGPONG"] = config.pingpong
        sig["FUSED"] = "constexpr"
        const["FUSED"] = fused
        sig["PERSISTENT"] = "constexpr"
        const["PERSISTENT"] = config.persistent
        sig["JOINT"] = "constexpr"
        const["JOINT"] = config.joint_release
    src = GluonASTSource(gluon_attention_ws_kernel if config.ws else gluon_attention_kernel, sig,
                         constexprs={(list(sig).index(k),): v for k, v in const.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=config.num_warps))


def ptx_facts(ptx: str) -> dict:
    """What the PTX says about the schedule: wgmma instructions, their wait_group counts (a ``wait_group 1``
    is the overlapped wait: one group left in flight), TMA loads and stores."""
    waits = [int(n) for n in re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx)]
    return {"wgmma": len(re.findall(r"wgmma\.mma_async", ptx)), "wait_groups": sorted(set(waits)),
            "wait_group_1": waits.count(1), "tma_loads": len(re.findall(r"cp\.async\.bulk\.tensor\.[^\n]*global", ptx)),
            "setmaxnreg": "setmaxnreg" in ptx}
