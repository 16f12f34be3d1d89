"""MegaMoE's GEMM phases against the library, and the schedules' order cost (issue 15, points 2 and 3).

One process, one GPU (:class:`xstage.ranks.OneGPUWorld`, link local), rank 0 timed, per (configuration, dtype):

- study ``ladder``: the Expert-Wave kernel's compute-only time (every combine store local: Linear-1, SwiGLU,
  Linear-2, the epilogue's stores into rank 0's own buffer) for each tile variant of :data:`VARIANTS` (BM x BN1 x
  BN2 x BK, warps, stages; a version ladder), beside ``torch._grouped_mm`` (bf16: Linear-1, SwiGLU, Linear-2 on
  the same rows) and, for fp8, ``torch._scaled_grouped_mm`` (rowwise scales, fast accumulation: x and each
  weight's output channel scaled, Linear-1, SwiGLU, the intermediate quantised per row, Linear-2) on the same
  rows. Before any timing every variant runs the whole layer (combine poisoned first) with each static schedule
  (bit-identical required) and rank 0's combine is compared with the float32 reference (``rel_l2``, within the
  layer's tolerance). A library call that fails is recorded with status ``unavailable`` and NaN times, never 0.
- study ``order``: the default tiles' compute-only time of every schedule under static and dynamic assignment
  (each bit-identical to Expert-Wave static first): the schedules' order cost per assignment.
- study ``gemm`` (round 3, all 84 configurations in table order): the default tiles' Expert-Wave compute-only
  time under the default assignment (dynamic) beside the tiles version 1 (what the earlier records ran, static),
  fp8 where BM = 128 is the default also BM = 64 with 3 stages, and the library (as the ladder), same rounds.
  Checked first: every variant's whole layer (combine poisoned) within tolerance of the float32 reference on
  rank 0; the default's static and dynamic runs bit-identical on every rank.
- study ``controls`` (round 3, same order): the default tiles' compute-only time of every schedule x static /
  dynamic (the current order version; round 3 ran version 2) and, under dynamic, interleaved and lag in order
  version 1 (variant ``order_v1``) and (round 4) every schedule with the tiles row-block-major inside an expert
  (variant ``swizzle0``, the order before moe_plan.TILE_SWIZZLE), every list bit-identical to Expert-Wave
  static first (combine poisoned); then, under dynamic, one launch per list with per-task device timestamps (the task_* columns: what the order costs, tile by tile).
- study ``controls7`` (round 7, same order): ``controls`` for the default assignment (dynamic) and the default
  tiles only (tiles version 3: bf16 through the TMA main loops), every schedule, each list bit-identical to
  Expert-Wave static first, with the per-task timings: each schedule's compute-only time / Expert-Wave's.
- study ``gemm8`` (round 8, all 84 configurations in table order): study ``gemm`` for tiles version 3 (bf16
  through TMA) without version 1: the default's Expert-Wave compute-only time beside the library, same rounds;
  for fp8 also its main loops through TMA (:func:`gemm8_variants`), each checked bit-identical to the default
  (the pointer loops) on every rank, combine poisoned, before any timing.
- study ``controls8`` (round 8): ``controls7`` with fp8 through TMA with one stage more (gemm8's ``tma_s``) in
  place of fp8's default tiles (bf16: the default, as controls7): whether the schedules stay free in compute.
- study ``gemm9`` (round 9, fp8, the 56 configurations with >= 2048 rows on rank 0, table order): the default
  tiles (version 4: fp8 through TMA) beside :func:`gemm9_variants` (the other row block's tiles, one pipeline
  stage more, 4 warps) and ``torch._scaled_grouped_mm``, same rounds; each variant's whole layer (combine
  poisoned) within tolerance of the float32 reference on rank 0, and whether it is bit-identical to the default
  on every rank is recorded in the row's note. Where the default trails the library (the >= 2048-row goal).
  Its default stays version 4's (:data:`STUDY_TILES_VERSIONS`).
- study ``gemm10`` (round 10, fp8, all 84 configurations in table order): study ``gemm9`` for tiles version 5 (fp8's
  BM 128 from 96 rows per expert, read off gemm9's run) with :func:`gemm10_variants` (the other row block, one stage
  more): the rule re-timed on a new run, and for the first time on the 28 configurations with < 2048 rows.
- study ``lags11`` (round 11, all 84 configurations in table order, dynamic, the default tiles): Expert-Wave
  beside schedule ``lag`` at the lags of :data:`LAGS11` (1, 1.5, 2 x n_sms), every list bit-identical to
  Expert-Wave static first, same rounds, one launch per list with per-task timestamps; :func:`lags11_rows` /
  :func:`lags11_summary`: each lag's compute-only time / Expert-Wave's, and lag version 2's rule
  (``moe_plan.lag_of_rule``, whose candidates are these lags: ``lag_v2`` reads the row of the lag it picks on rank
  0's grid, the same list) (issue 15 item 3: lag n's 1.068 / 1.080 on Mixtral T512 hot in controls7, round 10).
- study ``tiles6`` (round 6, the 56 configurations with >= 2048 rows on rank 0, bf16): the TMA main loops
  (:func:`tma_tiles`; x, W1, W2 through tensor descriptors) in :data:`TILES6_VARIANTS` beside the default (pointer
  loads), swizzle 16, and ``torch._grouped_mm``, same rounds; each variant's layer checked as in study tiles.

Every method of a configuration is timed round-robin (warm-up of all, then each round one run of each method):
clock drift between method blocks cannot favour one. One row per method (schema ``megamoe_gemm``, xstage.data),
appended per (study, configuration, dtype): resumable (``xstage.resume``).
"""
from __future__ import annotations

import dataclasses
import math
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from . import bench, data, env
from .data import MEGAMOE_GEMM
from .moe import (MAX_POLLS, _unfused_gemms, _unfused_plan, build_tasks, check_close, dispatch, hi_weights, make_problem,
                  megamoe_layer, moe_buffers, moe_reference, poison_combine, rank_weights, reference_weights,
                  run_experts)
from .moe_plan import (ASSIGNMENTS, CASES, KIND_L1, OUT_DTYPES, SCHEDULES, CostModel, TileConfig, calibrate_rate,
                       cases_by_name, default_tiles, gemm_flops, gpu_tiles, order_group)
from .numeric import check_bit_identical

GEMM_STUDIES = ("gemm", "gemm8", "gemm9", "gemm10")  # our Expert-Wave GEMM phases beside the library, ROUNDS rounds


# Studies gemm8 and controls8 measure round 8's question, so their default is tiles version 3's (fp8 the pointer
# loops) whatever the current version: under version 4 (fp8's default is controls8's tiles) a re-run times what
# they timed, and their sidecars say tiles version 3. Study gemm9 likewise keeps version 4's (the rule version 5
# changed is what it measured).
ROUND8_TILES_VERSION = 3
ROUND8_STUDIES = ("gemm8", "controls8")
# Studies gemm10 and lags11 (sessions 14-15) keep version 5's: gemm10's s_plus is version 6's default, and lags11
# measured lag's lag under version 5's tiles.
STUDY_TILES_VERSIONS = {**{s: ROUND8_TILES_VERSION for s in ROUND8_STUDIES}, "gemm9": 4, "gemm10": 5, "lags11": 5}


def study_tiles_version(study: str) -> int:
    """The tiles version whose default tiles ``study`` runs (and records in its sidecar's params.tiles_version):
    :data:`STUDY_TILES_VERSIONS` (gemm8 / controls8: 3, gemm9: 4, gemm10 / lags11: 5), else the current one (moe_plan.TILES_VERSION)."""
    from .moe_plan import TILES_VERSION

    return STUDY_TILES_VERSIONS.get(study, TILES_VERSION)


def gemm8_variants(dtype: str, d: TileConfig) -> dict[str, TileConfig]:
    """Study gemm8 (round 8): the variants timed beside the default ``d`` (tiles version 3) and the library. fp8:
    its main loops through TMA (``tma``: the default's tiles, x, W1, W2 through tensor descriptors, the scales and
    h pointer-loaded) and the same with one pipeline stage more (``tma_s``: BM 128 3 stages, BM 64 4; sm_90a
    ptxas on the CPU, dynamic: BM 128 2 stages 255 registers / 80 B spilled, 96 KiB shared (the pointer loops 36
    B), BM 64 3 stages 223 / 0 / 120 KiB). Each is checked bit-identical to the default (the pointer loops) on
    every rank before timing. bf16: none (its default is TMA since round 7). ``tma_s`` of version 3's fp8 tiles
    is tiles version 4's fp8 default (xstage.moe_plan.gpu_tiles)."""
    if dtype != "fp8":
        return {}
    return {"tma": dataclasses.replace(d, tma=True),
            "tma_s": dataclasses.replace(d, tma=True, num_stages=d.num_stages + 1)}


def gemm9_variants(dtype: str, d: TileConfig, version: int = 4) -> dict[str, TileConfig]:
    """Study gemm9 (round 9): the fp8 variants timed beside the default ``d`` (tiles version 4) and the library,
    fixed before the run. ``bm_alt``: version 4's tiles of the other row block (BM 64 <-> 128); ``s_plus``: one
    pipeline stage more; ``w4``: 4 warps. sm_90a ptxas on the CPU (Triton 3.9, dynamic): BM 64 4 stages (the
    default) 223 registers / 0 B spilled / 160 KiB shared, 5 stages 223 / 0 / 200 KiB, 4 warps 255 / 4 B / 160
    KiB; BM 128 3 stages (the default) 255 / 20 B / 144 KiB, 4 stages 255 / 36 B / 192 KiB. bf16: none (its goals
    are met, study gemm8)."""
    if dtype != "fp8":
        return {}
    return {"bm_alt": gpu_tiles(dtype, 128 if d.block_m == 64 else 64, version),   # the study's tiles version
            "s_plus": dataclasses.replace(d, num_stages=d.num_stages + 1),
            "w4": dataclasses.replace(d, num_warps=4)}


def gemm10_variants(dtype: str, d: TileConfig, version: int = 5) -> dict[str, TileConfig]:
    """Study gemm10 (round 10): :func:`gemm9_variants` of the default ``d`` (tiles version 5) without ``w4`` (1.55x
    the default's time in gemm9): ``bm_alt`` (so both row blocks are timed on every configuration, in the same
    rounds) and ``s_plus``."""
    return {n: t for n, t in gemm9_variants(dtype, d, version).items() if n != "w4"}


# The configurations of the GEMM study, fixed before the first run (every one with >= 2048 rows on rank 0 of 2).
GEMM_CASES = ("deepseek_v4_flash_T4096_uniform", "mixtral_8x7b_T2048_uniform", "qwen3_235b_T1024_zipf",
              "deepseek_v4_flash_T512_uniform")
# Tile variants relative to the default (xstage.moe_plan.default_tiles): name -> change. sm_90 compiles on the
# CPU (Triton 3.9, ptxas -v) fit shared memory without spills, except fp8 bm128 (32 B spilled; recorded anyway).
VARIANTS = {
    "bf16": {"default": {}, "bn2_256": dict(block_n2=256), "bn2_256_s4": dict(block_n2=256, num_stages=4),
             "s4": dict(num_stages=4), "bm_alt": "bm_alt"},
    "fp8": {"default": {}, "s3": dict(num_stages=3), "bm128": dict(block_m=128)},
}
ROUNDS = 10                  # timed rounds (each times every method once)
CALLS_TARGET_MS = 2.0        # back-to-back calls per timed run (as the sweep), at most CALLS_MAX
CALLS_MAX = 16
STUDIES = ("ladder", "order", "gemm", "controls", "tiles", "lists", "tiles6", "controls7", "gemm8", "controls8",
           "gemm9", "gemm10", "lags11")
ROUND3 = ("gemm", "controls", "tiles", "lists", "tiles6", "controls7", "gemm8", "controls8", "gemm9", "gemm10",
          "lags11")   # the table's configurations in order,
#                                                                          weights once per shape
CONTROL_ROUNDS = 6           # controls, lists: rounds
# Study lags11 (round 11, issue 15 item 3), fixed before the run: lag's lags beside Expert-Wave (variant -> units
# of n_sms; moe_plan.LAG_RULE_CANDIDATES, so that every list lag version 2 picks is timed), and LAGS11_RULE, the
# rule the summary reads off them (variant, lag version).
LAGS11 = {"lag_n": 1.0, "lag_1.5n": 1.5, "lag_2n": 2.0}
LAGS11_RULE = ("lag_v2", 2)


def lags11_lag(variant: str, grid, n_sms: int, group: int | None) -> int:
    """The lag of study lags11's ``variant`` on ``grid`` (``group``: the list's row blocks per chunk; the rule's
    variant: moe_plan.lag_of_rule of its version)."""
    from .moe_plan import lag_of_rule

    if variant == LAGS11_RULE[0]:
        return lag_of_rule(grid, n_sms, group, version=LAGS11_RULE[1])
    return int(round(LAGS11[variant] * n_sms))
# Round 5 (issue 15, items 2 and 3), fixed before the run.
# study tiles: bf16 tile variants beside the default and torch._grouped_mm, on every configuration with >= 2048
# rows on rank 0 (the goal's domain, xstage.studies.MEGAMOE_GEMM_GOALS) in table order: name -> (change of
# default_tiles, swizzle or None = the default's). sm_90 compiles on the CPU (Triton 3.9, ptxas -v, dynamic, BM
# 128): default 255 registers, 8 B spilled, 192 KiB shared; s3 252 / 0 / 144 KiB; bn1_64 237 / 0 / 192 KiB;
# bk128_s2 255 / 0 / 192 KiB.
TILES5_VARIANTS = {"s3": (dict(num_stages=3), None), "bn1_64": (dict(block_n1=64), None),
                   "bk128_s2": (dict(block_k=128, num_stages=2), None), "swz16": ({}, 16)}
TILES5_MIN_ROWS = 2048
# study lists: the mixing schedules' lists with lag's row blocks released one at a time (group 1) or eight at a
# time beside the default (group = moe_plan.order_group), dynamic assignment, compute only, same rounds, on the
# DeepSeek-V4-Pro and Qwen3 configurations with T >= 2048 (where round 4's three bf16 pairs over 5 % are):
# name -> (schedule, group).
LISTS5 = {"expert_wave": ("expert_wave", None), "interleaved": ("interleaved", None), "lag": ("lag", None),
          "model_guided": ("model_guided", None), "lag_g1": ("lag", 1), "model_guided_g1": ("model_guided", 1),
          "lag_g8": ("lag", 8)}
LISTS5_CASES = tuple(f"{sh}_T{t}_{r}" for sh in ("deepseek_v4_pro", "qwen3_235b") for t in (2048, 4096, 8192)
                     for r in ("uniform", "zipf", "hot"))




def tma_tiles(t: TileConfig) -> TileConfig:
    """``t`` with the TMA main loops (``tma = True``: x, W1 and W2 through tensor descriptors, h pointer-loaded;
    bf16 / fp16, and fp8 since round 8). The defaults already are: bf16 since tiles version 3, fp8 since version 4
    (xstage.moe_plan.gpu_tiles)."""
    return dataclasses.replace(t, tma=True)


# Round 6 (issue 15, item 2), fixed before the run. study tiles6: bf16, the TMA main loops beside the default
# (round 6: pointer loads; each variant names its main loops, so under tiles version 3 "default" is TMA) and
# torch._grouped_mm on tiles5_cases() (the 56 configurations with >= 2048 rows on rank 0), same rounds: name ->
# (change of default_tiles, swizzle or None = the default's, TMA). sm_90a compiles on the CPU
# (Triton 3.9, ptxas -v, dynamic): default BM 128 255 registers / 8 B spilled / 192 KiB shared; tma BM 128 s4
# 255 / 0 / 192 KiB (16 cp.async.bulk.tensor + 16 cp.async sites), s3 255 / 0 / 144 KiB, BM 64 s4 169 / 0 / 160 KiB.
TILES6_VARIANTS = {"swz16": ({}, 16, False), "tma": ({}, None, True), "tma_s3": (dict(num_stages=3), None, True),
                   "tma_swz16": ({}, 16, True)}


def tiles6_variants(d: TileConfig) -> dict[str, tuple[TileConfig, int | None]]:
    """Study tiles6's variants of the default tiles ``d``: name -> (tiles, swizzle or None)."""
    out = {}
    for name, (change, g, tma) in TILES6_VARIANTS.items():
        out[name] = (dataclasses.replace(d, tma=tma, **change), g)     # main loops as named, whatever d's
    return out


def tiles5_cases() -> list[str]:
    """Study tiles' configurations: every one of the table with >= TILES5_MIN_ROWS rows on rank 0 of 2 (from the
    seeded routing), in table order."""
    from .moe_plan import routing_of
    return [c.name for c in CASES if routing_of(c, 2)[2][0].rows >= TILES5_MIN_ROWS]


def variant_tiles(dtype: str, default: TileConfig, change) -> TileConfig:
    if change == "bm_alt":                        # the other row block of default_tiles' two
        return dataclasses.replace(default, block_m=64 if default.block_m == 128 else 128)
    return dataclasses.replace(default, **change)


def tile_label(t: TileConfig) -> str:
    tma = " tma" if t.tma else ""
    return f"{t.block_m}x{t.block_n1}x{t.block_n2}x{t.block_k} w{t.num_warps} s{t.num_stages}{tma}"


# ------------------------------------------------------------------------------------- the library's side
def _rowwise_fp8(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """t [..., N, K] -> (e4m3 [..., N, K], float32 scales [..., N]): one scale per row (amax / 448)."""
    s = t.float().abs().amax(-1).clamp_min(1e-12) / torch.finfo(torch.float8_e4m3fn).max
    return (t.float() / s[..., None]).to(torch.float8_e4m3fn), s


def rowwise_weights(w_hi: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """(w1 [El, 2I, Hd], w2 [El, Hd, I]) bf16 -> the library's fp8 operands (q1t [El, Hd, 2I] column-major, s1
    [El, 2I], q2t [El, I, Hd], s2 [El, Hd]), quantised expert by expert (a float32 copy of every expert at once
    would not fit: DeepSeek-V4-Pro)."""
    w1, w2 = w_hi
    q1 = torch.empty(w1.shape, dtype=torch.float8_e4m3fn, device=w1.device)
    q2 = torch.empty(w2.shape, dtype=torch.float8_e4m3fn, device=w2.device)
    s1 = torch.empty(w1.shape[:2], dtype=torch.float32, device=w1.device)
    s2 = torch.empty(w2.shape[:2], dtype=torch.float32, device=w2.device)
    for e in range(w1.shape[0]):
        q1[e], s1[e] = _rowwise_fp8(w1[e])
        q2[e], s2[e] = _rowwise_fp8(w2[e])
    return q1.transpose(1, 2), s1, q2.transpose(1, 2), s2


def _add_library_methods(prob, inp, dtype, dev, study, flops, methods, info, rows, info_tail, wq=None) -> None:
    """The library baselines on the same rows (torch._grouped_mm, and torch._scaled_grouped_mm for FP8), each run
    once: into ``methods`` / ``info`` (``info_tail`` ends its info tuple) when torch can, else an "unavailable"
    row with the reason (recorded, never 0)."""
    s = prob.case.shape
    plan = _unfused_plan(inp, hi_weights(inp.weights))
    xg = torch.randn(prob.layouts[0].rows, s.hidden, device=dev).to(inp.x.dtype)   # bf16 (also for fp8)
    libs = {"torch._grouped_mm": lambda: _unfused_gemms(plan, xg)}

    def unavailable(name, e):
        rows.append(_row(prob, study, dtype, name, "", None, "", "", False, "unavailable",
                         f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", float("nan"), [], 0,
                         flops))

    if dtype == "fp8":
        try:
            libs["torch._scaled_grouped_mm"] = scaled_grouped_gemms(plan, hi_weights(inp.weights),
                                                                    prob.layouts[0].rows, s.hidden, dev, wq)
        except Exception as e:  # noqa: BLE001 - recorded, never 0
            unavailable("torch._scaled_grouped_mm", e)
    for n, fn in libs.items():
        try:
            fn()
            torch.cuda.synchronize()
            methods[n] = fn
            info[n] = (n, "", None, "", "", False, *info_tail)
        except Exception as e:  # noqa: BLE001 - recorded, never 0
            unavailable(n, e)


def scaled_grouped_gemms(p, w_hi: tuple[torch.Tensor, torch.Tensor], rows: int, hidden: int, dev,
                         wq: tuple[torch.Tensor, ...] | None = None) -> Callable[[], torch.Tensor]:
    """torch._scaled_grouped_mm Linear-1 (x rowwise-quantised, w1 per output channel), SwiGLU in bf16, the
    intermediate quantised per row, Linear-2, on ``rows`` expert-major rows; raises where torch cannot (the
    caller records "unavailable"). ``wq``: the weights already quantised (:func:`rowwise_weights`)."""
    fn = getattr(torch, "_scaled_grouped_mm", None)
    if fn is None:
        raise RuntimeError(f"torch {torch.__version__} has no torch._scaled_grouped_mm")
    q1t, s1, q2t, s2 = wq if wq is not None else rowwise_weights(w_hi)
    xq, xs = _rowwise_fp8(torch.randn(rows, hidden, device=dev))
    I = w_hi[1].shape[2]

    def run() -> torch.Tensor:
        gu = fn(xq, q1t, xs, s1, offs=p.offs, out_dtype=torch.bfloat16, use_fast_accum=True)   # [R, 2I]
        h = torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]
        hq, hs = _rowwise_fp8(h)
        return fn(hq, q2t, hs, s2, offs=p.offs, out_dtype=torch.bfloat16, use_fast_accum=True)
    return run


# ------------------------------------------------------------------------------------------------ timing
def _round_robin(methods: dict[str, Callable[[], None]], rounds: int) -> tuple[dict, int]:
    """{name: [ms per call] * rounds}, calls per timed run: every method warmed, then round by round."""
    for fn in methods.values():
        fn()
    torch.cuda.synchronize()
    probe = min(bench.median(bench.time_ms(fn, warmup=1, reps=3)) for fn in methods.values())
    inner = min(CALLS_MAX, max(1, math.ceil(CALLS_TARGET_MS / max(probe, 1e-3))))

    def calls(fn):
        def c():
            for _ in range(inner):
                fn()
        return c
    # settle=1: one untimed call first, so the switch from the previous method (its counters reset, L2
    # contents) stays outside the timed run
    ms = bench.round_robin_ms({n: calls(fn) for n, fn in methods.items()}, rounds, warmup=0, settle=1)
    return {n: [t / inner for t in v] for n, v in ms.items()}, inner


# --------------------------------------------------------------------------------------------- the job
def _row(prob, study, dtype, method, variant, tiles, schedule, assignment, is_default, status, note, rel, times,
         inner, flops, task: dict | None = None):
    c, s = prob.case, prob.case.shape
    ms = float(np.median(times)) if times else float("nan")
    variant, schedule, assignment, note = (v or "-" for v in (variant, schedule, assignment, note))
    return dict(study=study, shape=s.name, hidden=s.hidden, intermediate=s.intermediate, experts=s.experts,
                topk=s.topk, tokens=c.tokens, routing=c.routing, seed=c.seed, P=len(prob.layouts), dtype=dtype,
                rank=0, rows=prob.layouts[0].rows, method=method, variant=variant,
                tiles=tile_label(tiles) if tiles is not None else "-", block_m=tiles.block_m if tiles else 0,
                block_n1=tiles.block_n1 if tiles else 0, block_n2=tiles.block_n2 if tiles else 0,
                block_k=tiles.block_k if tiles else 0, num_warps=tiles.num_warps if tiles else 0,
                num_stages=tiles.num_stages if tiles else 0, tma=bool(tiles.tma) if tiles else False,
                schedule=schedule, assignment=assignment,
                is_default=is_default, status=status, note=note[:200], rel_l2=rel, ms=ms,
                ms_min=float(np.min(times)) if times else float("nan"), n_timed=len(times), calls_per_run=inner,
                tflops=flops / (ms * 1e-3) / 1e12 if times else float("nan"),
                **{c: float((task or {}).get(c, float("nan"))) for c in data.MEGAMOE_TASK_COLUMNS})


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors hold the same bits (xstage.numeric.check_bit_identical, as a yes / no)."""
    try:
        check_bit_identical(a, b, "")
    except AssertionError:
        return False
    return True


def _runs_bit_identical(world, bufs, prob, tiles, lists, what) -> dict:
    """Every task list of ``lists`` ({(schedule, assignment): {rank: tasks}}) run as the whole layer with
    ``tiles``, combine poisoned first; every rank's combine bit-identical to the first list's. Returns the first
    list's combine per rank."""
    first, lead = {}, None
    for (sched, assign), tasks in lists.items():
        lead = lead or f"{sched} {assign}"
        poison_combine(world, bufs, prob.case.tokens)
        megamoe_layer(world, bufs, prob.inputs, tasks, tiles, dynamic=assign == "dynamic")
        torch.cuda.synchronize()
        for r in world.local_ranks:
            comb = bufs.combine_view(r, prob.case.tokens)
            if r in first:
                check_bit_identical(comb, first[r], f"{what} rank {r}: {sched} {assign} vs {lead}")
            else:
                first[r] = comb.clone()
    return first


def _check_layer(world, bufs, prob, tiles, runs, ref, what) -> float:
    """Whole layer per (schedule, assignment) of ``runs`` with ``tiles``, combine poisoned first; every run's
    combine of every rank bit-identical to the first's; rank 0's first within tolerance of ``ref``."""
    p = dataclasses.replace(prob, tiles=tiles)
    sms = torch.cuda.get_device_properties(world.device(0)).multi_processor_count
    lists = {(sched, assign): {r: build_tasks(p, sched, sms, r) for r in world.local_ranks} for sched, assign in runs}
    what = f"{what} {tile_label(tiles)}"
    first = _runs_bit_identical(world, bufs, p, tiles, lists, what)
    return check_close(first[0], ref[0], ref[1], prob.dtype, what)[0]


def gemm_job(world, cases, dtypes, folder, meta, study: str, prm, deadline: float | None,
             rounds: int = ROUNDS) -> None:
    """Rank 0 of ``world`` (one process): per (case, dtype) not yet in ``folder``, check, time, append."""
    from .model import params_from_dict

    P = world.world_size
    items = [(c, d) for c in cases for d in dtypes]
    from .resume import pending
    csv, todo, _ = pending(world, folder, MEGAMOE_GEMM, meta, items, lambda cd: (study, *cd[0].key(P, cd[1])))
    dev = world.device(0)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    for c, dtype in todo:
        if deadline is not None and time.time() > deadline:
            print(f"megamoe-gemm ({study}): time budget reached; run again to resume", file=sys.stderr, flush=True)
            return
        t0 = time.perf_counter()
        s = c.shape
        w = {r: rank_weights(s.hidden, s.intermediate, s.experts, P, r, 0, dev, dtype) for r in world.local_ranks}
        d = default_tiles(dtype, c.tokens * P * s.topk / s.experts)
        variants = ({n: variant_tiles(dtype, d, ch) for n, ch in VARIANTS[dtype].items()} if study == "ladder"
                    else {"default": d})
        prob = make_problem(world, c, dtype, d, weights=w, weight_seed=0)
        bufs = moe_buffers(world, max(prob.cap_rows, 1), c.tokens, s.hidden, s.intermediate, s.topk,
                           s.experts // P, dtype, min_block_m=min(t.block_m for t in variants.values()))
        inp = prob.inputs[0]
        ref_w = reference_weights(s.hidden, s.intermediate, 0, dev, dtype)
        ref = (moe_reference(inp.x, inp.ids, inp.wts, ref_w, fp8=dtype == "fp8"),
               None if dtype == "fp8" else moe_reference(inp.x, inp.ids, inp.wts, ref_w, dtype=OUT_DTYPES[dtype]))
        what = f"{c.name} {dtype}"
        flops = gemm_flops(prob.layouts[0].rows, s.hidden, s.intermediate)
        rows, methods, info = [], {}, {}
        if study == "ladder":
            runs = [(sch, "static") for sch in ("expert_wave", "interleaved", "lag")]
            for name, t in variants.items():
                err = _check_layer(world, bufs, prob, t, runs, ref, what)
                p = dataclasses.replace(prob, tiles=t)
                tasks = {0: build_tasks(p, "expert_wave", sms, 0)}
                methods[f"ours:{name}"] = (lambda tasks=tasks, t=t: run_experts(
                    world, bufs, prob.inputs, tasks, t, barrier=False, check=False, local_combine=True, ranks=[0]))
                info[f"ours:{name}"] = ("ours", name, t, "expert_wave", "static", name == "default", err)
            _add_library_methods(prob, inp, dtype, dev, study, flops, methods, info, rows, (float("nan"),))
        else:
            from .moe_plan import OUT_DTYPES as OD
            ew = build_tasks(prob, "expert_wave", sms, 0)
            dispatch(world, bufs, prob.inputs)
            ms_ew = bench.median(bench.time_ms(lambda: run_experts(world, bufs, prob.inputs, {0: ew}, d,
                                                                   barrier=False, check=False, local_combine=True,
                                                                   ranks=[0]), warmup=2, reps=5))
            runs = [(sch, a) for a in ASSIGNMENTS for sch in SCHEDULES]
            lists = {}
            for sch, a in runs:
                cost = CostModel(params_from_dict(prm), calibrate_rate(ew, s.hidden, s.intermediate, d, sms, ms_ew,
                                                                        a), sms, OD[dtype].itemsize, a)
                lists[(sch, a)] = {r: build_tasks(prob, sch, sms, r, cost=cost) for r in world.local_ranks}
            # bit-identical first (every schedule x assignment vs expert_wave static), with the lists timed below
            first = _runs_bit_identical(world, bufs, prob, d, lists, what)
            err = check_close(first[0], ref[0], ref[1], dtype, what)[0]
            del first
            for (sch, a), tasks in lists.items():
                key = f"{sch}:{a}"
                methods[key] = (lambda tl_={0: tasks[0]}, a=a: run_experts(
                    world, bufs, prob.inputs, tl_, d, barrier=False, check=False, local_combine=True,
                    dynamic=a == "dynamic", ranks=[0]))
                info[key] = ("ours", "default", d, sch, a, True, err)
        t_check = time.perf_counter() - t0
        times, inner = _round_robin(methods, rounds)
        for key, fn in methods.items():
            method, variant, t, sch, a, is_def, err = info[key]
            note = ""
            if study == "order":
                note = lists[(sch, a)][0].param or ""
            rows.append(_row(prob, study, dtype, method, variant, t, sch, a, is_def, "ok", note, err, times[key],
                             inner, flops))
        data.append_rows(csv, MEGAMOE_GEMM, pd.DataFrame(rows))
        summary = " ".join(f"{k} {np.median(v):.3f}" for k, v in times.items())
        print(f"megamoe-gemm ({study}): {c.name} {dtype} in {time.perf_counter() - t0:.1f} s (checks "
              f"{t_check:.1f}; inner {inner}): {summary}", file=sys.stderr, flush=True)
        del prob, bufs, w, methods, ref
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------- round 3: all 84
def task_stats(tl_, ts: torch.Tensor, n_programs: int) -> dict:
    """Per-task device timestamps of one launch (``ts`` [n_tasks, 2] ns: start, after the last store) and the
    launch's wait status -> the task_* columns (xstage.data.MEGAMOE_GEMM)."""
    t = ts.view(-1, 2)[: tl_.n_tasks].cpu().numpy().astype(np.float64)
    dur = t[:, 1] - t[:, 0]
    span = float(t[:, 1].max() - t[:, 0].min())
    l1 = tl_.tasks[:, 0] == KIND_L1
    polls = tl_.on(ts.device)[1][:, 4].cpu().numpy()[: tl_.n_tasks]
    return dict(task_l1_us=float(np.median(dur[l1])) / 1e3 if l1.any() else float("nan"),
                task_l2_us=float(np.median(dur[~l1])) / 1e3 if (~l1).any() else float("nan"),
                task_busy=float(dur.sum() / (n_programs * span)) if span > 0 else float("nan"),
                task_span_us=span / 1e3, task_waited=float((polls[~l1] > 0).mean()) if (~l1).any() else 0.0)


def _pairs(cases, dtypes) -> list[tuple]:
    """The fixed order of round 3: shape by shape (the table's), each dtype, the shape's configurations in table
    order (weights are generated once per shape and dtype)."""
    shapes = list(dict.fromkeys(c.shape for c in cases))
    return [(c, d) for sh in shapes for d in dtypes for c in cases if c.shape == sh]


def round3_job(world, cases, dtypes, folder, meta, study: str, prm, deadline: float | None,
               rounds: int | None = None) -> None:
    """Study ``gemm`` or ``controls`` (module docstring) on rank 0 of ``world`` (one process): per (case, dtype)
    not yet in ``folder``, in :func:`_pairs` order, check, time, append; stops starting pairs after
    ``deadline``."""
    from .resume import pending

    P = world.world_size
    csv, todo, _ = pending(world, folder, MEGAMOE_GEMM, meta, _pairs(cases, dtypes),
                           lambda cd: (study, *cd[0].key(P, cd[1])))
    dev = world.device(0)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    rounds = rounds or (ROUNDS if study in GEMM_STUDIES else CONTROL_ROUNDS)
    groups = list(dict.fromkeys((c.shape, d) for c, d in todo))
    for shape, dtype in groups:
        mine = [c for c, d in todo if c.shape == shape and d == dtype]
        if deadline is not None and time.time() > deadline:
            break
        t0 = time.perf_counter()
        s = shape
        w = {r: rank_weights(s.hidden, s.intermediate, s.experts, P, r, 0, dev, dtype) for r in world.local_ranks}
        wq = rowwise_weights(hi_weights(w[0])) if study in GEMM_STUDIES and dtype == "fp8" else None
        print(f"megamoe-gemm ({study}): {s.name} {dtype} weights in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr, flush=True)
        for c in mine:
            if deadline is not None and time.time() > deadline:
                print(f"megamoe-gemm ({study}): time budget reached; run again to resume", file=sys.stderr,
                      flush=True)
                return
            t0 = time.perf_counter()
            rows = _round3_case(world, c, dtype, w, wq, study, prm, sms, rounds)
            data.append_rows(csv, MEGAMOE_GEMM, pd.DataFrame(rows))
            summary = " ".join(f"{r['method'].replace('torch.', '')}:{r['variant']}:{r['schedule']}:"
                               f"{r['assignment'][:3]} {r['ms']:.3f}" for r in rows)
            print(f"megamoe-gemm ({study}): {c.name} {dtype} in {time.perf_counter() - t0:.1f} s: {summary}",
                  file=sys.stderr, flush=True)
            torch.cuda.empty_cache()
        del w, wq
        torch.cuda.empty_cache()
    if deadline is not None and time.time() > deadline and todo:
        print(f"megamoe-gemm ({study}): time budget reached; run again to resume", file=sys.stderr, flush=True)


def _layer_weights_f32(prob) -> Callable:
    """e -> (w1, w2) in float32 from the weights the layer holds (every rank's, one process): what
    ``xstage.moe.reference_weights`` regenerates from the seed (the same generator; for fp8 the same 128 x 128
    quantisation, dequantised), without generating every expert again per configuration."""
    from .moe import dequantize_fp8
    from .moe_plan import FP8_BLOCK

    El = prob.case.shape.experts // len(prob.layouts)

    def get(e: int):
        w = prob.inputs[e // El].weights
        le = e % El
        if prob.dtype == "fp8":
            return (dequantize_fp8(w.w1[le], w.w1s[le], FP8_BLOCK), dequantize_fp8(w.w2[le], w.w2s[le], FP8_BLOCK))
        return w.w1[le].float(), w.w2[le].float()
    return get


def _round3_case(world, c, dtype, w, wq, study, prm, sms, rounds) -> list[dict]:
    from .model import params_from_dict

    P = world.world_size
    s = c.shape
    dev = world.device(0)
    rpe = c.tokens * P * s.topk / s.experts
    d = default_tiles(dtype, rpe, version=study_tiles_version(study))
    if study == "controls8" and dtype == "fp8":     # round 8: fp8 through TMA with one stage more (gemm8's tma_s)
        d = gemm8_variants(dtype, d)["tma_s"]
    variants = {"default": d}
    swz = {}                                              # study tiles: a variant's tile order (swizzle)
    if study == "gemm8":
        variants.update(gemm8_variants(dtype, d))
    elif study == "gemm9":
        variants.update(gemm9_variants(dtype, d))
    elif study == "gemm10":
        variants.update(gemm10_variants(dtype, d))
    elif study == "gemm":
        variants["v1"] = default_tiles(dtype, rpe, version=1)
        if dtype == "fp8" and d.block_m == 128:     # BM 64 with 3 stages, the default's main loops
            variants["bm64_s3"] = dataclasses.replace(d, block_m=64, num_stages=3)
    elif study == "tiles":
        for name, (change, g) in TILES5_VARIANTS.items():
            variants[name] = dataclasses.replace(d, **change)
            if g is not None:
                swz[name] = g
    elif study == "tiles6":
        for name, (t, g) in tiles6_variants(d).items():
            variants[name] = t
            if g is not None:
                swz[name] = g
    prob = make_problem(world, c, dtype, d, weights=w, weight_seed=0)
    bufs = moe_buffers(world, max(prob.cap_rows, 1), c.tokens, s.hidden, s.intermediate, s.topk, s.experts // P,
                       dtype, min_block_m=min(t.block_m for t in variants.values()))
    inp = prob.inputs[0]
    what = f"{c.name} {dtype}"
    flops = gemm_flops(prob.layouts[0].rows, s.hidden, s.intermediate)
    rows, methods, info, lists, notes, same9 = [], {}, {}, {}, {}, {}
    if study in ("gemm", "tiles", "tiles6", "gemm8", "gemm9", "gemm10"):
        base = None                                       # gemm8: the default's combine per rank
        ref_w = _layer_weights_f32(prob)
        ref = (moe_reference(inp.x, inp.ids, inp.wts, ref_w, fp8=dtype == "fp8"),
               None if dtype == "fp8" else moe_reference(inp.x, inp.ids, inp.wts, ref_w, dtype=OUT_DTYPES[dtype]))
        for name, t in variants.items():
            assign = "static" if name == "v1" else "dynamic"
            runs = [("expert_wave", "dynamic"), ("expert_wave", "static")] if name == "default" else \
                [("expert_wave", assign)]
            p = dataclasses.replace(prob, tiles=t, swizzle=swz.get(name, prob.swizzle))
            ls = {(sch, a): {r: build_tasks(p, sch, sms, r) for r in world.local_ranks} for sch, a in runs}
            first = _runs_bit_identical(world, bufs, p, t, ls, f"{what} {tile_label(t)}")
            err = check_close(first[0], ref[0], ref[1], dtype, f"{what} {tile_label(t)}")[0]
            if study in ("gemm8", "gemm9", "gemm10") and name == "default":
                base = first
            elif study == "gemm8":      # the other main loops: the same bits as the default's, every rank
                for r in world.local_ranks:
                    check_bit_identical(first[r], base[r], f"{what} rank {r}: {tile_label(t)} vs {tile_label(d)}")
            elif study in ("gemm9", "gemm10"):      # within tolerance (above); whether bit-identical too goes in the note
                same = all(_same_bits(first[r], base[r]) for r in world.local_ranks)
                same9[f"ours:{name}"] = f"bit_identical={int(same)}"
            del first
            tasks = {0: ls[("expert_wave", assign)][0]}
            methods[f"ours:{name}"] = (lambda tasks=tasks, t=t, dyn=assign == "dynamic": run_experts(
                world, bufs, prob.inputs, tasks, t, barrier=False, check=False, local_combine=True, dynamic=dyn,
                ranks=[0]))
            info[f"ours:{name}"] = ("ours", name, t, "expert_wave", assign, name == "default", err, None)
            notes[f"ours:{name}"] = tasks[0].param
        del ref
        _add_library_methods(prob, inp, dtype, dev, study, flops, methods, info, rows, (float("nan"), None), wq)
    elif study == "lists":
        ew = build_tasks(prob, "expert_wave", sms, 0)
        dispatch(world, bufs, prob.inputs)
        ms_ew = bench.median(bench.time_ms(lambda: run_experts(world, bufs, prob.inputs, {0: ew}, d, barrier=False,
                                                               check=False, local_combine=True, dynamic=True,
                                                               ranks=[0]), warmup=2, reps=3))
        cost = CostModel(params_from_dict(prm), calibrate_rate(ew, s.hidden, s.intermediate, d, sms, ms_ew,
                                                               "dynamic"), sms, OUT_DTYPES[dtype].itemsize, "dynamic")
        ref_lists = {("expert_wave[static]", "static"): {r: build_tasks(prob, "expert_wave", sms, r)
                                                         for r in world.local_ranks}}
        for name, (sch, g) in LISTS5.items():
            lists[name] = {r: build_tasks(prob, sch, sms, r, cost=cost, group=g) for r in world.local_ranks}
        # bit-identical first: every list (dynamic) vs expert_wave static, combine poisoned before each layer
        _runs_bit_identical(world, bufs, prob, d, {**ref_lists, **{(n, "dynamic"): ls for n, ls in lists.items()}},
                            what)
        for name, ls in lists.items():
            sch = LISTS5[name][0]
            key = f"ours:{name}"
            methods[key] = (lambda tl_={0: ls[0]}: run_experts(world, bufs, prob.inputs, tl_, d, barrier=False,
                                                                check=False, local_combine=True, dynamic=True,
                                                                ranks=[0]))
            ts = torch.zeros(2 * max(ls[0].n_tasks, 1), dtype=torch.int64, device=dev)
            run_experts(world, bufs, prob.inputs, {0: ls[0]}, d, barrier=False, check=True, local_combine=True,
                        dynamic=True, ranks=[0], ts={0: ts})
            info[key] = ("ours", name, d, sch, "dynamic", name == sch, float("nan"),
                         task_stats(ls[0], ts, min(sms, ls[0].n_tasks)))
            notes[key] = ls[0].param
    else:
        ew = build_tasks(prob, "expert_wave", sms, 0)
        dispatch(world, bufs, prob.inputs)
        ms_ew = bench.median(bench.time_ms(lambda: run_experts(world, bufs, prob.inputs, {0: ew}, d, barrier=False,
                                                               check=False, local_combine=True, dynamic=True,
                                                               ranks=[0]), warmup=2, reps=3))
        if study in ("controls7", "controls8"):     # rounds 7-8: the default assignment only
            runs = [(sch, "dynamic", "default") for sch in SCHEDULES]
        elif study == "lags11":                      # round 11: Expert-Wave and lag at each lag
            runs = [("expert_wave", "dynamic", "default")] + [("lag", "dynamic", v) for v in LAGS11]
        else:
            runs = [(sch, a, "default") for a in ASSIGNMENTS for sch in SCHEDULES]
            runs += [(sch, "dynamic", "order_v1") for sch in ("interleaved", "lag")]
            runs += [(sch, "dynamic", "swizzle0") for sch in SCHEDULES]      # the tile order before round 4
        for sch, a, var in runs:
            cost = CostModel(params_from_dict(prm), calibrate_rate(ew, s.hidden, s.intermediate, d, sms, ms_ew, a),
                             sms, OUT_DTYPES[dtype].itemsize, a)
            p = dataclasses.replace(prob, swizzle=0) if var == "swizzle0" else prob
            lag = {}
            if study == "lags11" and sch == "lag":   # each rank's lag (the rule's depends on the rank's grid)
                lag = {r: lags11_lag(var, p.grid(r), sms, order_group(p.grid(r), sms)) for r in world.local_ranks}
            lists[(sch, a, var)] = {r: build_tasks(p, sch, sms, r, cost=cost, lag=lag.get(r),
                                                   order=1 if var == "order_v1" else None)
                                    for r in world.local_ranks}
        # bit-identical first: every list vs expert_wave static (combine poisoned before each layer)
        ref_lists = {} if study == "controls" else {("expert_wave[static]", "static"): {
            r: build_tasks(prob, "expert_wave", sms, r) for r in world.local_ranks}}
        first = _runs_bit_identical(world, bufs, prob, d, {**ref_lists, **{(f"{sch}[{var}]", a): ls
                                                           for (sch, a, var), ls in lists.items()}}, what)
        del first
        for (sch, a, var), ls in lists.items():
            key = f"{sch}:{a}:{var}"
            methods[key] = (lambda tl_={0: ls[0]}, a=a: run_experts(
                world, bufs, prob.inputs, tl_, d, barrier=False, check=False, local_combine=True,
                dynamic=a == "dynamic", ranks=[0]))
            task = None
            if a == "dynamic":   # one launch with per-task timestamps (not timed; the timings below have none)
                ts = torch.zeros(2 * max(ls[0].n_tasks, 1), dtype=torch.int64, device=dev)
                run_experts(world, bufs, prob.inputs, {0: ls[0]}, d, barrier=False, check=True, local_combine=True,
                            dynamic=True, ranks=[0], ts={0: ts})
                task = task_stats(ls[0], ts, min(sms, ls[0].n_tasks))
            info[key] = ("ours", var, d, sch, a, var == "default", float("nan"), task)
    times, inner = _round_robin(methods, rounds)
    for key in methods:
        method, variant, t, sch, a, is_def, err, task = info[key]
        note = notes.get(key, "") if study in ("tiles", "lists", "tiles6") else same9.get(key, "")
        if study in ("controls", "controls7", "controls8", "lags11"):
            sch_, a_, var_ = key.split(":")
            note = lists[(sch_, a_, var_)][0].param or ""
        rows.append(_row(prob, study, dtype, method, variant, t, sch, a, is_def, "ok", note, err, times[key], inner,
                         flops, task))
    del prob, bufs, methods
    return rows


def warm_variants(dtypes: Sequence[str] = ("bf16", "fp8"), round3: bool = True,
                  defaults_only: bool = False) -> list[tuple]:
    """(dtype, tiles, dynamic, timed) of every experts-kernel launch the studies make: round 3 (``round3``: the
    default tiles of both row-block classes static / dynamic, dynamic with timestamps, tiles version 1 static)
    or the ladder and order studies. ``defaults_only``: only what the sweep and the one-GPU tests launch (the default
    tiles of both row-block classes, static and dynamic; for fp8 also tiles version 3's, dynamic: the reference of
    tests/test_megamoe_round9.py's bit-identity test)."""
    todo = set()
    for dtype in dtypes:
        if defaults_only:
            todo |= {(dtype, default_tiles(dtype, rpe), dyn, False) for rpe in (32.0, 1024.0)
                     for dyn in (False, True)}
            if dtype == "fp8":
                todo |= {(dtype, default_tiles(dtype, rpe, version=ROUND8_TILES_VERSION), True, False)
                         for rpe in (32.0, 1024.0)}
        elif round3:
            defaults = {default_tiles(dtype, rpe) for rpe in (32.0, 256.0, 1024.0)}
            todo |= {(dtype, t, dyn, timed) for t in defaults for dyn, timed in ((False, False), (True, False),
                                                                                  (True, True))}
            todo |= {(dtype, default_tiles(dtype, rpe, version=1), False, False) for rpe in (32.0, 256.0)}
            if dtype == "fp8":                                      # round 8, studies gemm8 / controls8
                v3 = {default_tiles(dtype, rpe, version=ROUND8_TILES_VERSION) for rpe in (32.0, 256.0, 1024.0)}
                todo |= {(dtype, t, dyn, False) for t in v3 for dyn in (False, True)}
                todo |= {(dtype, v, True, timed) for t in v3 for v in gemm8_variants(dtype, t).values()
                         for timed in (False, True)}
                todo |= {(dtype, v, True, False) for bm in (64, 128)                 # round 9, study gemm9
                         for ver in (4, 5) for v in (gpu_tiles(dtype, bm, ver), *gemm9_variants(
                             dtype, gpu_tiles(dtype, bm, ver), ver).values())}  # (gemm10's: version 5)
            if dtype == "bf16":                                                    # round 5, study tiles
                todo |= {(dtype, dataclasses.replace(t, **ch), True, False) for t in defaults
                         for ch, _ in TILES5_VARIANTS.values() if ch}
                todo |= {(dtype, v, True, False) for t in defaults                 # round 6, study tiles6
                         for v, _ in tiles6_variants(t).values() if v.tma}
        else:
            defaults = {default_tiles(dtype, rpe, version=1) for rpe in (32.0, 256.0)}
            todo |= {(dtype, variant_tiles(dtype, d, ch), False, False) for d in defaults
                     for ch in VARIANTS[dtype].values()}
            todo |= {(dtype, d, True, False) for d in defaults}
    return sorted(todo, key=str)


def warm(dtypes: Sequence[str] = ("bf16", "fp8"), part: int = 0, parts: int = 1, round3: bool = True,
         defaults_only: bool = False) -> int:
    """Compile (no launch) the kernel variants of :func:`warm_variants` (every ``parts``-th from ``part``: run
    several processes side by side) into Triton's cache, with arguments of the launch's dtypes and alignment;
    returns how many. Run beside another job to take the compiles off the device's clock."""
    from .kernels.moe import megamoe_kernel, megamoe_tma_kernel

    dev = torch.device("cuda", 0)
    n = 0
    for dtype, t, dyn, timed in warm_variants(dtypes, round3, defaults_only)[part::parts]:
        fp8 = dtype == "fp8"
        act = torch.float8_e4m3fn if fp8 else torch.bfloat16
        a = torch.empty(64, device=dev, dtype=torch.uint8).view(act) if fp8 else torch.empty(64, device=dev,
                                                                                             dtype=act)
        f32 = torch.empty(64, device=dev, dtype=torch.float32)
        sc = f32 if fp8 else a
        i32 = torch.empty(64, device=dev, dtype=torch.int32)
        i64 = torch.empty(64, device=dev, dtype=torch.int64)
        comb = torch.empty(64, device=dev, dtype=OUT_DTYPES[dtype])
        try:
            (megamoe_tma_kernel if t.tma else megamoe_kernel).warmup(a, sc, a, sc, a, sc, a, sc, i32, i32, i32, i32, i64, comb, i64, i64, i32,
                                  100, 0, 100, 4096, 2048, 7, MAX_POLLS, 0,
                                  BLOCK_M=t.block_m, BLOCK_N1=t.block_n1, BLOCK_N2=t.block_n2,
                                  BLOCK_K=t.block_k, FP8=fp8, TIMED=timed, DEVICE=True, DYNAMIC=dyn,
                                  num_warps=t.num_warps, num_stages=t.num_stages, grid=(1,))
        except Exception as e:  # noqa: BLE001 - the study compiles it itself then
            print(f"megamoe-gemm warm: {dtype} {tile_label(t)} failed: {type(e).__name__}: {e}",
                  file=sys.stderr, flush=True)
            continue
        n += 1
        print(f"megamoe-gemm warm: {dtype} {tile_label(t)}{' dynamic' if dyn else ''}{' timed' if timed else ''}",
              file=sys.stderr, flush=True)
    return n


def run_megamoe_gemm(out: str | Path, study: str = "ladder", cases: Sequence[str] | None = None,
                     dtypes: Sequence[str] = ("bf16", "fp8"), max_minutes: float | None = None, command: str = "",
                     rounds: int | None = None) -> Path:
    """Run (or resume) a study of this module into ``out``/megamoe_gemm.csv on one GPU; returns its path.
    ``cases``: default GEMM_CASES (ladder, order) or all 84 in table order (gemm, controls)."""
    from .moe_plan import LAG_VERSION, ORDER_VERSION, STALL_DEFAULT, TILE_SWIZZLE, WAIT_DEFAULT

    if study not in STUDIES:
        raise ValueError(f"study must be one of {', '.join(STUDIES)}, got {study!r}")
    if cases is None:
        cases = (tiles5_cases() if study in ("tiles", "tiles6", "gemm9") else list(LISTS5_CASES) if study == "lists"
                 else [c.name for c in CASES] if study in ROUND3 else GEMM_CASES)
    cs = cases_by_name(cases)
    if not dtypes or any(d not in VARIANTS for d in dtypes):
        raise ValueError(f"dtypes must be a non-empty subset of {tuple(VARIANTS)}, got {list(dtypes)}")
    if rounds is not None and rounds < 5:
        raise ValueError(f"rounds must be >= 5, got {rounds}")
    if max_minutes is not None and max_minutes <= 0:
        raise ValueError(f"max_minutes must be > 0, got {max_minutes}")
    env.require_gpus(1, "the MegaMoE GEMM study")
    from .ranks import OneGPUWorld
    from .studies import recorded_params

    prm = recorded_params("h200x1")
    params = dict(study_cases=list(cases), dtypes=list(dtypes), rounds=rounds, world="one-gpu", world_size=2,
                  link="local", observed_rank=0, variants={d: {n: str(ch) for n, ch in VARIANTS[d].items()}
                                                           for d in dtypes},
                  prm=prm.as_dict(), source="gpu", fp8_library="torch._scaled_grouped_mm rowwise, use_fast_accum",
                  tiles_version=study_tiles_version(study), order_version=ORDER_VERSION,
                  tile_swizzle=TILE_SWIZZLE, wait_default=dict(WAIT_DEFAULT), stall_default=STALL_DEFAULT,
                  lag_version=LAG_VERSION)
    if study == "tiles":
        params["tiles5_variants"] = {n: dict(change=str(ch), swizzle=g) for n, (ch, g) in TILES5_VARIANTS.items()}
        params["tiles5_min_rows"] = TILES5_MIN_ROWS
    if study == "tiles6":
        params["tiles6_variants"] = {n: dict(change=str(ch), swizzle=g, tma=tma)
                                     for n, (ch, g, tma) in TILES6_VARIANTS.items()}
        params["tiles6_min_rows"] = TILES5_MIN_ROWS
    if study == "gemm8":
        params["gemm8_variants"] = {dt: {n: tile_label(t) for n, t in gemm8_variants(
            dt, default_tiles(dt, 1024.0, version=ROUND8_TILES_VERSION)).items()} for dt in dtypes}
    if study in ("gemm9", "gemm10"):
        fn = gemm9_variants if study == "gemm9" else gemm10_variants
        params[f"{study}_variants"] = {dt: {f"{n}@BM{bm}": tile_label(t) for bm in (64, 128)
                                            for n, t in fn(dt, gpu_tiles(dt, bm, study_tiles_version(study))
                                                           ).items()} for dt in dtypes}
        params[f"{study}_min_rows"] = TILES5_MIN_ROWS
    if study == "lists":
        params["lists5"] = {n: dict(schedule=sch, group=g) for n, (sch, g) in LISTS5.items()}
    if study == "lags11":
        from .moe_plan import LAG_RULE_CANDIDATES, LAG_RULE_TOLERANCE

        params["lags11"] = dict(fixed=dict(LAGS11), rule=dict(variant=LAGS11_RULE[0], lag_version=LAGS11_RULE[1],
                                                             candidates=list(LAG_RULE_CANDIDATES),
                                                             tolerance=LAG_RULE_TOLERANCE))
    meta = env.provenance(command, params)
    env.apply_safe_env()
    deadline = None if max_minutes is None else time.time() + 60 * max_minutes
    world = OneGPUWorld(2, link="local", observed=0)
    if study in ROUND3:
        round3_job(world, cs, list(dtypes), str(out), meta, study, prm.as_dict(), deadline, rounds)
    else:
        gemm_job(world, cs, list(dtypes), str(out), meta, study, prm.as_dict(), deadline, rounds or ROUNDS)
    return Path(out) / f"{MEGAMOE_GEMM.name}.csv"


# ------------------------------------------------------------------------------------------ study gemm8's tables
GEMM8_MIN_ROWS = 2048        # issue 15's domain of the per-configuration goal (rows on rank 0)


GEMM8_NAMES = ("default", "tma", "tma_s")
GEMM9_NAMES = ("default", "bm_alt", "s_plus", "w4")


def gemm8_ratios(df: pd.DataFrame, study: str = "gemm8", names: Sequence[str] = GEMM8_NAMES) -> pd.DataFrame:
    """Study gemm8 per configuration and dtype (table order): each of our variants' Expert-Wave compute-only time
    (``<variant>_ms``: default, and for fp8 tma, tma_s) and the library's of the same rounds, and the ratios the
    issue asks for: the library's time / ours (> 1: ours faster), bf16 against torch._grouped_mm
    (``<variant>_vs_grouped_mm``), fp8 against torch._scaled_grouped_mm (``<variant>_vs_scaled_grouped_mm``); NaN
    where a call was unavailable or a variant not run. ``study`` / ``names``: study gemm9 and its variants
    (:data:`GEMM9_NAMES`) the same way."""
    from .moe_plan import CASES

    d = df[(df.study == study) & (df.status == "ok")].copy()
    d["config"] = [f"{s}_T{t}_{r}" for s, t, r in zip(d["shape"], d.tokens, d.routing)]
    key = ["config", "dtype"]
    base = d[(d.method == "ours") & (d.variant == "default")].drop_duplicates(key).set_index(key)
    out = base[["shape", "rows", "tiles"]].copy()
    for v in names:
        out[f"{v}_ms"] = d[(d.method == "ours") & (d.variant == v)].drop_duplicates(key).set_index(key).ms.reindex(
            out.index)
    for lib in ("grouped_mm", "scaled_grouped_mm"):
        out[f"{lib}_ms"] = d[d.method == f"torch._{lib}"].drop_duplicates(key).set_index(key).ms.reindex(out.index)
        for v in names:
            out[f"{v}_vs_{lib}"] = out[f"{lib}_ms"] / out[f"{v}_ms"]
    out = out.reset_index()
    order = {c.name: i for i, c in enumerate(CASES)}
    return out.assign(_o=out.config.map(order)).sort_values(["dtype", "_o"], kind="stable").drop(
        columns="_o").reset_index(drop=True)


def gemm8_summary(g: pd.DataFrame, min_rows: int = GEMM8_MIN_ROWS,
                  names: Sequence[str] = GEMM8_NAMES) -> pd.DataFrame:
    """Per dtype and variant of :func:`gemm8_ratios`, against the dtype's library (bf16: torch._grouped_mm, fp8:
    torch._scaled_grouped_mm): configurations, geomean, minimum (and where), the minimum over configurations with
    >= ``min_rows`` rows on rank 0, and that set's size; and each variant's time over the default's (geomean)."""
    from .numeric import geomean

    out = []
    for dt, gd in g.groupby("dtype", sort=False):
        lib = "grouped_mm" if dt == "bf16" else "scaled_grouped_mm"
        for v in names:
            r = gd[f"{v}_vs_{lib}"].dropna()
            if r.empty:
                continue
            big = r[gd.loc[r.index, "rows"] >= min_rows]
            out.append(dict(dtype=dt, variant=v, library=f"torch._{lib}", configs=len(r), geomean=geomean(r),
                            min=float(r.min()), min_config=gd.loc[r.idxmin(), "config"],
                            min_big=float(big.min()) if len(big) else float("nan"), big_configs=len(big),
                            over_default=geomean(gd.loc[r.index, f"{v}_ms"] / gd.loc[r.index, "default_ms"])))
    return pd.DataFrame(out)


# ------------------------------------------------------------------------------------ study gemm10's tables
def gemm10_rule(df: pd.DataFrame, study: str = "gemm10") -> pd.DataFrame:
    """fp8's row-block rule per configuration of a study that timed both row blocks in the same rounds (gemm10:
    the default and ``bm_alt``; gemm9 likewise): rows on rank 0, average rows per expert (``rpe``), our time with
    BM 64 and BM 128 and each / torch._scaled_grouped_mm (``bm64_vs_lib``, ``bm128_vs_lib``), and what the rule of
    tiles version 4 (BM 128 from FP8_BM128_ROWS_V2 rows) and of version 5 (from FP8_BM128_ROWS) picks (``v4_bm``,
    ``v5_bm``) with its ratio (``v4_vs_lib``, ``v5_vs_lib``); table order."""
    from .moe_plan import fp8_block_m

    g = gemm8_ratios(df, study=study, names=("default", "bm_alt"))
    g = g[g.dtype == "fp8"].reset_index(drop=True)
    if g.empty:
        raise ValueError(f"no fp8 rows of study {study} with both row blocks")
    cs = {c.name: c for c in cases_by_name(list(g.config))}
    P = df[df.study == study].P.iloc[0]
    rpe = np.array([cs[n].tokens * int(P) * cs[n].shape.topk / cs[n].shape.experts for n in g.config])
    bm_def = np.array([int(t.split("x")[0]) for t in g.tiles])
    out = pd.DataFrame(dict(config=g.config, rows=g.rows, rpe=rpe))
    for bm in (64, 128):
        ms = np.where(bm_def == bm, g.default_ms, g.bm_alt_ms)
        out[f"bm{bm}_ms"] = ms
        out[f"bm{bm}_vs_lib"] = g.scaled_grouped_mm_ms / ms
    for v in (4, 5):
        pick = np.array([fp8_block_m(r, v) for r in rpe])
        out[f"v{v}_bm"] = pick
        out[f"v{v}_vs_lib"] = np.where(pick == 128, out.bm128_vs_lib, out.bm64_vs_lib)
    return out


def gemm10_rule_summary(r: pd.DataFrame, min_rows: int = GEMM8_MIN_ROWS) -> pd.DataFrame:
    """Per rule of :func:`gemm10_rule` (v4, v5, and each configuration's faster row block ``best``, in-sample):
    configurations, geomean / torch._scaled_grouped_mm, minimum (and where), the minimum over configurations with
    >= ``min_rows`` rows on rank 0, and the geomean of the rule's time over the faster block's."""
    from .numeric import geomean

    best = np.maximum(r.bm64_vs_lib, r.bm128_vs_lib)
    out = []
    for name, x in (("v4", r.v4_vs_lib), ("v5", r.v5_vs_lib), ("best", best)):
        big = x[r.rows >= min_rows]
        out.append(dict(rule=name, configs=len(x), geomean=geomean(x), min=float(x.min()),
                        min_config=r.config[x.idxmin()], min_big=float(big.min()) if len(big) else float("nan"),
                        big_configs=len(big), over_best=geomean(best / x)))
    return pd.DataFrame(out)


# ------------------------------------------------------------------------------------------ study lags11's tables
def lags11_rows(df: pd.DataFrame, study: str = "lags11", rule: bool = True) -> pd.DataFrame:
    """Study lags11 per configuration, dtype and lag variant (table order): the recorded lag (``lag``, from the
    list's param), the compute-only time over Expert-Wave's in the same rounds from the medians (``over_ew``), from
    the fastest rounds (``over_ew_min``: ms_min) and from the launch with timestamps (``over_ew_span``), the share of
    Linear-2 tiles that waited and the busy share (the variant's and Expert-Wave's). ``rule``: also the rule's
    variant (LAGS11_RULE, ``lag_v2``): per configuration the row of the timed lag the rule picks on rank 0's grid
    (the recorded tiles and swizzle; computed, ~0.1 s a configuration), the same list; ValueError if none was timed."""
    from .moe_plan import parse_schedule_param
    from .studies import megamoe_round3_controls

    per = megamoe_round3_controls(df, study=study)
    cols = ["config", "dtype", "rows", "variant", "lag", "over_ew", "over_ew_min", "over_ew_span", "task_waited",
            "ew_task_waited", "task_busy", "ew_task_busy"]
    if per.empty:
        return pd.DataFrame(columns=cols)
    d = df[df.study == study].assign(config=lambda x: x["shape"] + "_T" + x.tokens.astype(str) + "_" + x.routing)
    k = ["config", "dtype", "schedule", "variant"]
    d = d.drop_duplicates(k).set_index(k)
    ew = d.xs(("expert_wave", "default"), level=("schedule", "variant"))
    lag = per[per.schedule == "lag"].reset_index(drop=True)
    me = d.reindex(pd.MultiIndex.from_frame(lag[k]))
    base = ew.reindex(pd.MultiIndex.from_frame(lag[["config", "dtype"]]))
    with np.errstate(divide="ignore", invalid="ignore"):
        lag = lag.assign(lag=[parse_schedule_param(p)["lag"] for p in lag.param],
                         over_ew_min=me.ms_min.to_numpy() / base.ms_min.to_numpy(),
                         over_ew_span=me.task_span_us.to_numpy() / base.task_span_us.to_numpy(),
                         ew_task_waited=base.task_waited.to_numpy())
    if rule and not lag.empty:
        lag = pd.concat([lag, _lags11_rule_rows(lag, ew)], ignore_index=True)
    return lag[cols]


def _lags11_rule_rows(lag: pd.DataFrame, ew: pd.DataFrame) -> pd.DataFrame:
    """The rule variant's rows of :func:`lags11_rows`: per configuration and dtype, the timed variant whose lag the
    rule picks on rank 0's grid (n_sms: lag_n's lag; the Expert-Wave row's tiles and swizzle)."""
    from .moe_plan import TileGrid, _layouts_of, order_group, parse_schedule_param, tiles_of_row

    out = []
    for (config, dtype), g in lag.groupby(["config", "dtype"], sort=False):
        e = ew.loc[(config, dtype)]
        c = cases_by_name([config])[0]
        s = c.shape
        n = int(g.lag[g.variant == "lag_n"].iloc[0])
        grid = TileGrid.of(_layouts_of(c, int(e.P))[0], s.hidden, s.intermediate, tiles_of_row(e),
                           parse_schedule_param(e.note)["swizzle"])
        want = lags11_lag(LAGS11_RULE[0], grid, n, order_group(grid, n))
        hit = g[(g.lag == want) & (g.variant != LAGS11_RULE[0])]
        if hit.empty:
            raise ValueError(f"{config} {dtype}: the rule's lag {want} was not timed (lags {sorted(set(g.lag))})")
        out.append(hit.iloc[0].copy())
        out[-1]["variant"] = LAGS11_RULE[0]
    return pd.DataFrame(out)


def lags11_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per dtype and lag variant of :func:`lags11_rows`: configurations, geomean and worst of each ratio over
    Expert-Wave (medians, fastest rounds, timestamped span), the worst configuration (medians), whether issue 15's
    goal holds on the medians (geomean <= 1.02, worst <= 1.05), configurations over 1.05, the median share of
    waited Linear-2 tiles, and the lags the variant listed (``lags``: lag -> configurations)."""
    from .numeric import geomean
    from .studies import MEGAMOE_ORDER_GOALS

    out = []
    for (dt, v), g in rows.groupby(["dtype", "variant"], sort=False):
        r = g.dropna(subset=["over_ew"])
        if r.empty:
            continue
        gm, worst = geomean(r.over_ew), float(r.over_ew.max())
        out.append(dict(dtype=dt, variant=v, configs=len(r), over_ew_geomean=gm, over_ew_worst=worst,
                        worst_config=r.loc[r.over_ew.idxmax(), "config"],
                        goal_met=bool(gm <= MEGAMOE_ORDER_GOALS["geomean"] and worst <= MEGAMOE_ORDER_GOALS["worst"]),
                        over_worst=int((r.over_ew > MEGAMOE_ORDER_GOALS["worst"]).sum()),
                        min_geomean=geomean(r.over_ew_min.dropna()), min_worst=float(r.over_ew_min.max()),
                        span_geomean=geomean(r.over_ew_span.dropna()), span_worst=float(r.over_ew_span.max()),
                        task_waited=float(r.task_waited.median()),
                        lags=";".join(f"{int(k)}:{n}" for k, n in r.lag.value_counts().sort_index().items())))
    return pd.DataFrame(out)
