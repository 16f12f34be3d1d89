"""The attention speed ladder: launch variants of our attention, each checked, then timed
beside cuDNN SDPA in the same run.

``run_attention_ladder`` is what ``scripts/attention_ladder.py`` calls on one GPU. For every variant (an
:class:`xstage.ulysses.AttnConfig`: tile shape, warps, stages, TMA, warp specialisation, persistent tiles),
before any timing:

1. against a float32 reference (``attention_reference``, torch, upcast inputs) on fresh random inputs
   (relative L2 below ``REF_TOL``);
2. the fused layer bit for bit against this variant's attention + the all-to-all (every rank of a P = 2
   one-process world, outputs poisoned with NaN first; a shape whose tiles straddle the two ranks), because the
   fused kernel shares the variant's inner loop and tile schedule (``xstage.ulysses_measure.check_fused``).

A variant that fails to compile or fails a check is recorded as such in the sidecar (``failed``) and never
timed. The sidecar's ``configs`` / ``checks`` / ``failed`` are keyed by head dim, then ``AttnConfig.label`` (run
L1's record predates that: keyed by label alone, so a label given for both head dims kept the D = 64 check). Then, per shape of ``LADDER_SHAPES`` (one head dim's variants on that head dim's shapes), our attention
and cuDNN SDPA are warmed up and timed round-robin (``repeats`` rounds of one run each, CUDA events): the ratio
of their medians is a same-clock ratio. Rows (schema ``attention_ladder``, xstage.data) are appended one
(variant, shape) at a time, so a run cut short keeps what finished and a re-run resumes. Without a cuDNN that
runs and agrees with our attention (or on the CPU) the cuDNN rows are absent (one line says why), never 0.

Beside FA4 (``run_attention_vs_fa4``, ``scripts/attention_vs_fa4.py``): the same job with
FA4's CuTe Hopper forward as a third method (``fa4``: ``xstage.fa4.attention_kernel``, FA's kernel launched
directly, bit for bit ``flash_attn_func``'s output in an earlier record), timed in the same rounds as ours and cuDNN, on
``FA4_SHAPES`` (the issue's table and the per-rank shapes of the one-GPU sweep) with ``FA4_VARIANTS``. Before a
shape is timed, ours, FA4 and cuDNN are each compared with the float32 reference on sampled query rows of that
shape's fresh inputs (``shape_checks`` in the sidecar; a method that disagrees is not timed). Each timed sample is
``launches`` back-to-back launches between two events, divided by ``launches``: the host's launch work (Python,
TMA descriptors, FA's TVM-FFI call) hides behind the previous kernel for every launch but the first, whose start
event fires on an idle GPU. That first launch's host work differs between methods (ours ~100-250 us more than FA4's
on an H100) and weighs most on the shortest kernels: ``lead=True`` queues each sample behind a
GPU-side wait first (``bench.time_ms``), so a sample is GPU time alone (the H100's current record).
Without FA4 (no extra, not Hopper, the CPU) its rows are absent with one line (``fa4_absent``), never 0.
"""
from __future__ import annotations

import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Mapping, Sequence

import pandas as pd
import torch

from . import bench, data, env, fa4, ulysses_gluon
from .bench import median
from .data import ATTENTION_LADDER
from .numeric import rel_l2
from .ranks import EmulatedWorld, OneGPUWorld
from .ulysses import (LAST_LAUNCH, AttnConfig, UlyssesShape, attention_flops, attention_forward, default_dtype,
                      receive_buffers, sdpa_cudnn, ulysses_buffers, validate_shape)
from .ulysses_gluon import LAST_LAUNCH as GLUON_LAST_LAUNCH
from .ulysses_gluon import GluonConfig, ptx_facts
from .ulysses_measure import check_fused, make_inputs


def ours(config) -> tuple[str, callable]:
    """The method name of a variant's rows and its attention: ``triton`` for an AttnConfig (kernels/attention.py),
    ``gluon`` for a GluonConfig (kernels/attention_gluon.py); fn(q, k, v) -> out [S, Hl, D]."""
    if isinstance(config, GluonConfig):

        return ulysses_gluon.METHOD, lambda q, k, v: ulysses_gluon.attention_forward(q, k, v, config=config)
    return "triton", lambda q, k, v: attention_forward(q, k, v, config=config)


def config_record(config) -> dict:
    """A variant's fields for the sidecar (``kernel`` names which kernel: triton or gluon)."""
    return {"kernel": ours(config)[0], **asdict(config)}

# one layer on one GPU (24 heads, as the FA-class table), and one head-dim-64 shape whose S is not a
# multiple of any key block (the masked last block)
LADDER_SHAPES = (
    UlyssesShape("seq_8k", 8_192, 24, 128),
    UlyssesShape("seq_16k", 16_384, 24, 128),
    UlyssesShape("seq_32k", 32_768, 24, 128),
    UlyssesShape("s30000_d64", 30_000, 20, 64),
)
# per head dim: the U2 record's chosen configuration first (the ladder's base rung), then the levers
LADDER_VARIANTS = {
    128: (AttnConfig(128, 128, 8, 3, True),                      # d: chosen at every S >= 8K in an earlier record
          AttnConfig(128, 128, 8, 3, True, ws=True),             # + warp-specialised key loop
          AttnConfig(128, 128, 8, 2, True, ws=True),
          AttnConfig(128, 64, 4, 3, True, ws=True),              # the tutorial's 4-warp tile, specialised
          AttnConfig(128, 128, 8, 3, True, persistent=True),     # + persistent tiles (<= one program per SM)
          AttnConfig(128, 128, 8, 3, True, ws=True, persistent=True),
          AttnConfig(256, 64, 8, 3, True),                       # 128 query rows per warpgroup
          AttnConfig(256, 64, 8, 2, True)),
    64: (AttnConfig(128, 128, 4, 3, True),                       # chosen at CogVideoX (D = 64) in an earlier record
         AttnConfig(128, 128, 4, 3, True, ws=True),
         AttnConfig(128, 128, 8, 3, True, ws=True),
         AttnConfig(128, 128, 4, 3, True, persistent=True),
         AttnConfig(256, 128, 8, 3, True),
         AttnConfig(256, 64, 8, 3, True)),
}
# ours beside FA4's CuTe Hopper forward. [S, H, D] per rank: the issue's table, then the one-GPU
# sweep's shapes at P = 2 (heads halved)
FA4_SHAPES = (
    UlyssesShape("s8192_h24", 8_192, 24, 128),
    UlyssesShape("s16384_h24", 16_384, 24, 128),
    UlyssesShape("s32768_h12", 32_768, 12, 128),
    UlyssesShape("s49152_h12", 49_152, 12, 128),
    UlyssesShape("s30000_h20_d64", 30_000, 20, 64),
    UlyssesShape("seq_4k_p2", 4_096, 12, 128),
    UlyssesShape("cogvideox5b_17776_p2", 17_776, 24, 64),
    UlyssesShape("wan21_1.3b_32760_p2", 32_760, 6, 128),
)
# the levers (kernels/attention.py's launch levers): the tuner's best first (the base rung), the scale folded
# into q, the source-pipelined key loop, two programs per SM (registers capped at 128, or one warpgroup per program)
FA4_VARIANTS = {
    128: (AttnConfig(128, 128, 8, 3, True, persistent=True),              # h: L1's best, a tuner candidate
          AttnConfig(128, 64, 8, 2, True, maxnreg=128),                   # 2 programs (4 warpgroups) per SM
          AttnConfig(128, 64, 8, 2, True, persistent=True, per_sm=2, maxnreg=128),
          AttnConfig(64, 64, 4, 3, True),                                 # 2 one-warpgroup programs per SM
          AttnConfig(128, 128, 8, 3, True, persistent=True, scale_q=True)),
    # (128x64w8s3-tma-pers-pipe was timed in an earlier record only: data/h200x1/attention_vs_fa4_late_v/)
    64: (AttnConfig(128, 128, 4, 3, True),                                # U2 / L1's best at D = 64
         AttnConfig(128, 64, 8, 3, True),                                 # 2 programs of 8 warps per SM
         AttnConfig(128, 128, 8, 2, True, maxnreg=128),
         AttnConfig(64, 128, 4, 2, True),                                 # 3 one-warpgroup programs per SM
         AttnConfig(128, 128, 4, 3, True, scale_q=True)),
}
LAUNCHES = 2             # back-to-back launches per timed sample (run_attention_vs_fa4)
SAMPLE_ROWS = 256        # query rows per head compared with float32 on each timed shape (fresh inputs)
REF_TOL = 2e-2           # relative L2 of bf16 attention against float32 (fp16 under the interpreter: ~1e-3)
CUDNN_TOL = 2e-2         # cuDNN SDPA against our attention, relative L2, before its times count
CHECK_P = 2              # the fused check's world: P ranks of one process, tiles straddling the ranks
CHECK_SHAPES = {128: UlyssesShape("check_d128", 3_968, 4, 128),   # Sl = 1984: not a multiple of 128 or 256
                64: UlyssesShape("check_d64", 3_000, 4, 64)}      # Sl = 1500; S % 64 != 0 (masked keys)
INTERPRETER_CHECK_SHAPES = {128: UlyssesShape("check_d128", 200, 4, 128),
                            64: UlyssesShape("check_d64", 150, 4, 64)}


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float | None = None
                        ) -> torch.Tensor:
    """Non-causal attention in float32 (inputs upcast): [S, Hl, D] -> [S, Hl, D]."""
    D = q.shape[-1]
    scale = D ** -0.5 if sm_scale is None else sm_scale
    qf, kf, vf = (t.float().transpose(0, 1) for t in (q, k, v))           # [Hl, S, D]
    p = torch.softmax(qf @ kf.transpose(1, 2) * scale, dim=-1)
    return (p @ vf).transpose(0, 1)


def attention_reference_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor,
                             sm_scale: float | None = None) -> torch.Tensor:
    """Float32 attention of the query rows ``rows`` only, over every key (inputs upcast): [len(rows), Hl, D]."""
    return attention_reference(q[rows], k, v, sm_scale) if len(rows) else q[:0].float()


def sample_rows(S: int, n: int, g: torch.Generator) -> torch.Tensor:
    """``n`` distinct query rows of [0, S) (fewer when S is smaller), the last row always among them (the masked
    tail of the last query tile), sorted."""
    n = min(n, S)
    rows = torch.randperm(S - 1, generator=g, device=g.device)[:n - 1] if n > 1 else torch.zeros(0, dtype=torch.long)
    return torch.cat([rows.to(g.device), torch.tensor([S - 1], device=g.device)]).sort().values


def check_variant(config: AttnConfig, D: int, seed: int, world=None) -> dict:
    """The checks before timing (module docstring) on fresh random inputs drawn from ``seed``; raises
    AssertionError naming what failed. ``world``: the P-rank one-process world of the fused check (default
    OneGPUWorld(CHECK_P) on a GPU, EmulatedWorld(CHECK_P) on the CPU). Returns what was checked."""

    shape = (INTERPRETER_CHECK_SHAPES if env.interpreted() else CHECK_SHAPES)[D]
    if world is None:
        world = EmulatedWorld(CHECK_P) if env.interpreted() else OneGPUWorld(CHECK_P, "local")
    dtype = default_dtype()
    qkv = make_inputs(world, shape, dtype, seed, range(CHECK_P))
    q, k, v = qkv[0]
    method, fn = ours(config)
    if method != "triton":

        ulysses_gluon.require()     # one line where the Gluon kernel cannot run (the interpreter, not Hopper)
    err = rel_l2(fn(q, k, v), attention_reference(q, k, v))
    facts = compiled_facts(method)
    if not err < REF_TOL:
        raise AssertionError(f"{config.label}: relative L2 {err:.3g} against the float32 reference "
                             f"(limit {REF_TOL})")
    if method != "triton":   # no fused (all-to-all) epilogue in the Gluon kernel yet: nothing to check bit for bit
        return {"rel_l2_vs_fp32": err, "reference_shape": [shape.S, shape.H // CHECK_P, shape.D],
                "fused_bit_exact": None, "fused": "no fused epilogue in this kernel (Gluon rung)", "seed": seed,
                **facts}
    bufs = ulysses_buffers(world, shape.S, shape.H, shape.D, dtype)
    recv = receive_buffers(world, shape.S, shape.H // CHECK_P, shape.D, dtype)
    check_fused(world, shape, bufs, qkv, config, recv)
    return {"rel_l2_vs_fp32": err, "reference_shape": [shape.S, shape.H // CHECK_P, shape.D],
            "fused_bit_exact": True, "fused_shape": [shape.S, shape.H, shape.D], "fused_P": CHECK_P, "seed": seed,
            **facts}


def compiled_facts(method: str = "triton") -> dict:
    """What the last attention launch of ``method`` compiled to (GPU; {} under the interpreter): registers, spills,
    shared memory, and whether its PTX re-allocates registers between warp groups (``setmaxnreg``: the mark of
    Hopper warp specialisation; without it ``ws`` compiled to the plain software pipeline); for the Gluon kernel
    also its wgmma waits (``xstage.ulysses_gluon.ptx_facts``: ``wait_group 1`` is the overlapped wait)."""
    kern = (LAST_LAUNCH if method == "triton" else GLUON_LAST_LAUNCH).get("kernel")
    if kern is None or env.interpreted():
        return {}
    out = {}
    for name in ("n_regs", "n_spills"):
        if isinstance(getattr(kern, name, None), int):
            out[name] = getattr(kern, name)
    try:
        ptx = kern.asm["ptx"]
        out.update(shared_bytes=int(kern.metadata.shared), setmaxnreg="setmaxnreg" in ptx,
                   ptx_sha256=__import__("hashlib").sha256(ptx.encode()).hexdigest()[:16])
        if method != "triton":

            out["ptx"] = ptx_facts(ptx)
    except (AttributeError, KeyError, TypeError):
        pass
    return out


def _cudnn_agrees(q, k, v, config) -> str | None:
    """None when cuDNN SDPA runs here and agrees with our attention; else why not (one line)."""
    if q.device.type != "cuda":
        return "no CUDA device (cuDNN SDPA needs one)"
    from torch.nn.attention import SDPBackend, sdpa_kernel

    try:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            err = rel_l2(sdpa_cudnn(q, k, v), ours(config)[1](q, k, v))
    except RuntimeError as e:
        return f"cuDNN SDPA failed: {str(e).splitlines()[0]}"
    return None if err < CUDNN_TOL else f"cuDNN SDPA differs from our attention by {err:.3g} (relative L2)"


def method_fns(q, k, v, config, cudnn: bool, fa: bool = False) -> tuple[dict, object]:
    """The methods of one shape, each a no-argument launch: ({"triton" or "gluon" (:func:`ours`): ours, "cudnn":
    SDPA's cuDNN backend (if ``cudnn``), "fa4": FA4's kernel (if ``fa``, ``xstage.fa4.attention_kernel``)}, the
    context manager to launch them in (the cuDNN backend selected, or a null context))."""
    from contextlib import nullcontext

    out_fa = torch.empty_like(q) if fa else None
    method, fn = ours(config)
    fns = {method: lambda: fn(q, k, v)}
    if cudnn:
        fns["cudnn"] = lambda: sdpa_cudnn(q, k, v)
    if fa:

        fns["fa4"] = lambda: fa4.attention_kernel(q, k, v, out=out_fa)
    ctx = nullcontext()
    if cudnn:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        ctx = sdpa_kernel(SDPBackend.CUDNN_ATTENTION)
    return fns, ctx


def time_pair(q, k, v, config, repeats: int, warmup: int, cudnn: bool, fa: bool = False,
              launches: int = 1, lead: bool = False) -> dict[str, list[float]]:
    """{"triton" (or "gluon" for a GluonConfig: :func:`ours`): ms per repeat, "cudnn": ms per repeat (if ``cudnn``),
    "fa4": ms per repeat (if ``fa``: FA4's kernel, ``xstage.fa4.attention_kernel``)}: all warmed up, then each
    repeat round-robin over them (one sample each), so a clock drift falls on all alike. A sample is ``launches``
    back-to-back launches between two events, divided by ``launches``; ``lead``: each sample queued behind a GPU-side
    wait first (``bench.time_ms``), so the host's launch work is outside every sample."""
    fns, ctx = method_fns(q, k, v, config, cudnn, fa)
    with ctx:
        ms = bench.round_robin_ms({m: (lambda f=f: [f() for _ in range(launches)]) for m, f in fns.items()},
                                  repeats, warmup=warmup, lead=lead)
    return {m: [t / launches for t in ts] for m, ts in ms.items()}


def check_shape(q, k, v, config, seed: int, cudnn: bool, fa: bool) -> dict:
    """Ours (``config``), FA4 (if ``fa``) and cuDNN SDPA (if ``cudnn``) against the float32 reference on
    ``SAMPLE_ROWS`` sampled query rows of this shape's inputs: {method: relative L2}; raises AssertionError naming
    the first method over ``REF_TOL``."""
    g = torch.Generator(device=q.device).manual_seed(seed)
    rows = sample_rows(q.shape[0], SAMPLE_ROWS, g)
    ref = attention_reference_rows(q, k, v, rows)
    method, fn = ours(config)
    errs = {method: rel_l2(fn(q, k, v)[rows], ref)}
    if fa:

        errs["fa4"] = rel_l2(fa4.attention_kernel(q, k, v)[rows], ref)
    if cudnn:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            errs["cudnn"] = rel_l2(sdpa_cudnn(q, k, v)[rows], ref)
    bad = [m for m, e in errs.items() if not e < REF_TOL]
    if bad:
        raise AssertionError(f"{config.label}: {bad[0]} has relative L2 {errs[bad[0]]:.3g} against the float32 "
                             f"reference on {len(rows)} sampled rows (limit {REF_TOL})")
    return {**errs, "rows": len(rows)}


def validate_ladder(variants: Mapping[int, Sequence[AttnConfig]], shapes: Sequence[UlyssesShape], repeats: int,
                    warmup: int) -> None:
    """One clear error before anything runs."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats}, {warmup}")
    if not shapes:
        raise ValueError("no shapes")
    for s in shapes:
        validate_shape(s.S, s.H, s.D, 1)
        if not variants.get(s.D):
            raise ValueError(f"shape {s.name} has head dim {s.D}, for which no variant is given")
    for D, cfgs in variants.items():
        for c in cfgs:
            c.validate(D) if isinstance(c, GluonConfig) else c.validate()
        labels = [c.label for c in cfgs]
        if len(set(labels)) != len(labels):
            raise ValueError(f"head dim {D}: variants repeat ({labels})")
    if len({s.name for s in shapes}) != len(shapes):
        raise ValueError("shape names must be unique")


def ladder_job(folder: str | Path, meta: dict, variants: Mapping[int, Sequence[AttnConfig]],
               shapes: Sequence[UlyssesShape], repeats: int, warmup: int, seed: int,
               deadline_s: float | None = None, world=None, fa: bool = False, launches: int = 1,
               lead: bool = False) -> Path:
    """Check, then time, every variant on its head dim's shapes (module docstring); appends to
    ``folder``/attention_ladder.csv (resumable). ``deadline_s``: no new variant starts after this many
    seconds (what finished is kept). ``fa``: FA4's kernel timed in the same rounds (when it runs here), and each
    timed shape checked against float32 first (``check_shape``); ``launches`` per timed sample. Returns the CSV
    path."""
    t0 = time.monotonic()
    csv = data.start_file(folder, ATTENTION_LADDER, meta)
    done = data.done_keys(csv, ATTENTION_LADDER)
    side = Path(folder) / f"{ATTENTION_LADDER.name}.json"
    dtype = default_dtype()
    cudnn_why: dict[str, str | None] = {}
    fa_why = None
    if fa:

        ok, why = fa4.available()
        fa_why = None if ok else why
        if fa_why:
            print(f"ladder: no FA4 rows ({fa_why})", file=sys.stderr, flush=True)
            m = data.read_meta(side, ATTENTION_LADDER)
            m["fa4_absent"] = fa_why
            data.write_json_atomic(side, m)
    # each head dim's variants in turn, interleaved (every head dim's base rung first), so a deadline cuts the
    # last levers of both head dims rather than all of one
    dims = sorted({s.D for s in shapes}, reverse=True)
    order = [(D, variants[D][i]) for i in range(max(len(variants[D]) for D in dims)) for D in dims
             if i < len(variants[D])]
    for D, cfg in order:
        mine = [s for s in shapes if s.D == D]
        todo = [s for s in mine if (cfg.label, s.name, s.S, s.H, s.D) not in done]
        if not todo:
            continue
        if deadline_s is not None and time.monotonic() - t0 > deadline_s:
            print(f"ladder: {cfg.label} D={D} not started (past the {deadline_s:.0f} s deadline)",
                  file=sys.stderr, flush=True)
            continue
        m = data.read_meta(side, ATTENTION_LADDER)
        m.setdefault("configs", {}).setdefault(str(D), {})[cfg.label] = config_record(cfg)
        try:
            chk = check_variant(cfg, D, seed + 1000 * sum(map(len, m["configs"].values())), world)
        except Exception as e:  # noqa: BLE001 (compile errors, OutOfResources, failed checks: recorded)
            why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            m.setdefault("failed", {}).setdefault(str(D), {})[cfg.label] = why
            data.write_json_atomic(side, m)
            print(f"ladder: {cfg.label} D={D} FAILED before timing: {why}", file=sys.stderr, flush=True)
            continue
        m.setdefault("checks", {}).setdefault(str(D), {})[cfg.label] = chk
        m.get("failed", {}).get(str(D), {}).pop(cfg.label, None)
        data.write_json_atomic(side, m)
        for s in todo:
            dev = torch.device("cpu") if env.interpreted() else torch.device("cuda")
            g = torch.Generator(device=dev).manual_seed(seed + s.S + s.H)
            q, k, v = (torch.randn(s.S, s.H, s.D, generator=g, device=dev).to(dtype) for _ in range(3))
            if s.name not in cudnn_why:
                cudnn_why[s.name] = _cudnn_agrees(q, k, v, cfg)
                if cudnn_why[s.name]:
                    print(f"ladder: {s.name}: no cuDNN rows ({cudnn_why[s.name]})", file=sys.stderr)
            use_cudnn, use_fa = cudnn_why[s.name] is None, fa and fa_why is None
            if fa:
                try:
                    errs = check_shape(q, k, v, cfg, seed + 7 * s.S + s.H, use_cudnn, use_fa)
                except Exception as e:  # noqa: BLE001 (a failed check, or OutOfResources on this shape's tail block)
                    why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
                    m = data.read_meta(side, ATTENTION_LADDER)
                    m.setdefault("failed_shapes", {}).setdefault(str(D), {}).setdefault(cfg.label, {})[s.name] = why
                    data.write_json_atomic(side, m)
                    print(f"ladder: {cfg.label} {s.name} not timed: {why}", file=sys.stderr, flush=True)
                    continue
                m = data.read_meta(side, ATTENTION_LADDER)
                m.setdefault("shape_checks", {}).setdefault(str(D), {}).setdefault(cfg.label, {})[s.name] = errs
                data.write_json_atomic(side, m)
            times = time_pair(q, k, v, cfg, repeats, warmup, use_cudnn, use_fa, launches, lead)
            flops = attention_flops(s.S, s.H, s.D)
            rows = [dict(variant=cfg.label, shape=s.name, S=s.S, H=s.H, D=s.D, method=meth, repeat=i, ms=ms,
                         tflops=flops / (ms * 1e-3) / 1e12)
                    for meth, ts in times.items() for i, ms in enumerate(ts)]
            data.append_rows(csv, ATTENTION_LADDER, pd.DataFrame(rows))
            med = {meth: median(ts) for meth, ts in times.items()}
            mine = med[ours(cfg)[0]]
            ratio = f", ours/cuDNN {med['cudnn'] / mine:.3f}" if "cudnn" in med else ""
            ratio += f", ours/FA4 {med['fa4'] / mine:.3f}" if "fa4" in med else ""
            print(f"ladder: {cfg.label} {s.name}: {flops / mine / 1e9:.0f} TFLOP/s{ratio}",
                  file=sys.stderr, flush=True)
            del q, k, v
        m = data.read_meta(side, ATTENTION_LADDER)
        m.setdefault("cudnn_absent", {}).update({k: v for k, v in cudnn_why.items() if v})
        data.write_json_atomic(side, m)
    return csv


def run_attention_ladder(out: str | Path, variants: Mapping[int, Sequence[AttnConfig]] | None = None,
                         shapes: Sequence[UlyssesShape] | None = None, repeats: int = 10, warmup: int = 3,
                         seed: int = 0, deadline_s: float | None = None, command: str = "") -> Path:
    """The ladder on one GPU into ``out``/attention_ladder.csv (validated, then the GPU checked)."""
    variants = LADDER_VARIANTS if variants is None else variants
    shapes = LADDER_SHAPES if shapes is None else list(shapes)
    validate_ladder(variants, shapes, repeats, warmup)
    env.require_gpus(1, "the attention ladder")
    env.apply_safe_env()
    params = dict(variants={str(D): [asdict(c) for c in cs] for D, cs in variants.items()},
                  shapes=[asdict(s) for s in shapes], repeats=repeats, warmup=warmup, seed=seed,
                  deadline_s=deadline_s, source="gpu", ref_tol=REF_TOL, cudnn_tol=CUDNN_TOL,
                  check_shapes={str(D): asdict(s) for D, s in CHECK_SHAPES.items()}, check_P=CHECK_P,
                  timing="both warmed up, then each repeat round-robin: ours, cuDNN SDPA (CUDA events)")
    return ladder_job(out, env.provenance(command, params), variants, shapes, repeats, warmup, seed, deadline_s)



def run_attention_vs_fa4(out: str | Path, variants: Mapping[int, Sequence[AttnConfig]] | None = None,
                         shapes: Sequence[UlyssesShape] | None = None, repeats: int = 10, warmup: int = 3,
                         launches: int = LAUNCHES, seed: int = 0, deadline_s: float | None = None,
                         command: str = "", lead: bool = False) -> Path:
    """Our attention's variants beside FA4's CuTe Hopper forward and cuDNN SDPA, same rounds, on one GPU, into
    ``out``/attention_ladder.csv (module docstring; record folder data/<machine>/attention_vs_fa4/). ``lead``: each
    sample queued behind a GPU-side wait (``bench.time_ms``), recorded in the sidecar's ``lead``."""

    variants = FA4_VARIANTS if variants is None else variants
    shapes = FA4_SHAPES if shapes is None else list(shapes)
    validate_ladder(variants, shapes, repeats, warmup)
    if launches < 1:
        raise ValueError(f"launches must be >= 1, got {launches}")
    env.require_gpus(1, "the attention study beside FA4")
    env.apply_safe_env()
    ok, why = fa4.available()
    fa_cfg = {}
    if ok:
        for D in sorted({sh.D for sh in shapes}):
            fa_cfg[str(D)] = dict(zip(("tile_m", "tile_n", "mma_pv_is_rs", "intra_wg_overlap"), fa4.fa_config(D)))
    params = dict(variants={str(D): [config_record(c) for c in cs] for D, cs in variants.items()},
                  shapes=[asdict(s) for s in shapes], repeats=repeats, warmup=warmup, launches=launches, seed=seed,
                  deadline_s=deadline_s, source="gpu", ref_tol=REF_TOL, cudnn_tol=CUDNN_TOL,
                  sample_rows=SAMPLE_ROWS, check_shapes={str(D): asdict(s) for D, s in CHECK_SHAPES.items()},
                  check_P=CHECK_P, fa4=dict(available=ok, why=why, versions=fa4.versions(), config=fa_cfg,
                                            num_stages=fa4.NUM_STAGES, num_threads=fa4.NUM_THREADS),
                  gluon=_gluon_params(variants),
                  lead=lead, lead_cycles=bench.LEAD_CYCLES if lead else 0,
                  timing=f"all warmed up, then each repeat round-robin: ours, cuDNN SDPA, FA4's kernel (CUDA "
                         f"events around {launches} back-to-back launches, divided by {launches}"
                         + (f"; each sample queued behind a {bench.LEAD_CYCLES}-cycle GPU wait)" if lead else ")"))
    return ladder_job(out, env.provenance(command, params), variants, shapes, repeats, warmup, seed, deadline_s,
                      fa=True, launches=launches, lead=lead)


def _gluon_params(variants) -> dict | None:
    """The Gluon kernel's availability for the sidecar (None when no variant is a Gluon one)."""
    if not any(isinstance(c, GluonConfig) for cs in variants.values() for c in cs):
        return None

    ok, why = ulysses_gluon.available()
    return dict(available=ok, why=why)
