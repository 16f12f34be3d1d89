"""Recorded measurements: tidy CSV (one row per measurement) + a JSON sidecar with provenance.

``data/<machine>/<study>.csv`` and ``data/<machine>/<study>.json``. The sidecar carries the machine, GPU name and
count, driver, torch/triton versions, git commit, date, the exact command and parameters, and the schema
version. Loading checks all of it; a missing or malformed file is a :class:`DataError` naming the file.

Sweeps append rows one configuration at a time with a single ``write`` on an ``O_APPEND`` file followed by
``fsync``, so an interrupted sweep leaves only whole configurations behind and a re-run resumes after them.

Integrity: the sidecar records ``csv_rows`` (data rows) and ``csv_sha256`` (of the uncompressed CSV text, so
``gunzip -c burst_gap.csv.gz | sha256sum`` shows it), updated atomically after every append. Loading checks
both (required for files under data/), then the values: the schema's times finite and positive, no two rows
with the same identity (``key`` + ``row``). A truncated, edited or corrupt file is a :class:`DataError`
naming it.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import lzma
import os
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .env import REPO_ROOT

DATA_ROOT = REPO_ROOT / "data"


class DataError(ValueError):
    """A recorded data file is missing, malformed, or of another schema."""


@dataclass(frozen=True)
class Schema:
    name: str
    version: int
    columns: dict[str, str]      # column -> pandas dtype
    key: tuple[str, ...]         # columns that identify one configuration (resume unit)
    row: tuple[str, ...] = ()    # with ``key``, the columns that identify one row (no two rows share them)
    times: tuple[str, ...] = ()  # times (and rates derived from them): finite and > 0 in every row
    optional_times: tuple[str, ...] = ()  # NaN where not measured, else finite and >= 0


BURST_GAP = Schema(
    "burst_gap", 3,
    {"target": "str", "programs": "int64", "burst_bytes": "int64", "gap_ns": "int64", "store_bytes": "int64",
     "n_bursts": "int64", "drain": "bool", "sync": "bool", "rank": "int64", "repeat": "int64", "burst": "int64",
     "issue_ns": "float64", "issue_ns_max": "float64", "issue_ns_min": "float64", "span_ns": "float64",
     "drain_ns": "float64", "drain_ns_max": "float64", "gap_meas_ns": "float64", "barrier_ns": "float64",
     "idle_ns": "float64", "start_skew_ns": "float64"},
    ("target", "programs", "burst_bytes", "gap_ns", "store_bytes", "n_bursts", "drain", "sync"),
    row=("rank", "repeat", "burst"),
    times=("issue_ns", "issue_ns_max", "issue_ns_min", "span_ns"),
    optional_times=("drain_ns", "drain_ns_max", "gap_meas_ns", "barrier_ns", "idle_ns", "start_skew_ns"),
)
# Columns (per configuration, rank, repeat, burst; medians over programs unless named _max/_min):
#   issue_ns     sender-visible issue time of the burst (CTA barrier -> all warps issued)
#   span_ns      first program's issue start -> last program's issue end
#   drain_ns     issue end -> every thread's fence.acq_rel.sys returned (drain runs only)
#   gap_meas_ns  previous burst's release -> this burst's issue start (the requested gap, as run)
#   barrier_ns   the grid barrier after this burst (sync runs)
#   idle_ns      previous burst's issue end -> this burst's issue start: all store-free time (fence, barrier, gap)
# Older schema versions that load with a documented migration (the file itself is never rewritten):
#   burst_gap version 1 had no grid barrier between bursts, so every version 1 row is sync=False.
#   burst_gap version 2 did not record barrier_ns / idle_ns (NaN).
#   megamoe version 1 timed the compute-only control for expert_wave only (compute_ms); compute_sched_ms is NaN.
#   megamoe versions 1 and 2 rows name only block_m of their tiles: they ran with the first MegaMoE kernels' tiles, whose other
#   fields are MEGAMOE_FIRST_TILES[dtype]; read so, explicitly,
#   so that a later default never reinterprets them.
#   megamoe_gemm version 1 had no per-task timings (task_* columns NaN).
#   megamoe versions 1-3 and megamoe_gemm versions 1-2 rows have no tma column: megamoe rows ran the pointer main loops (tma
#   False); a megamoe_gemm row ran the TMA main loops exactly where its tiles label names them (" tma",
#   xstage.moe_gemm.tile_label), else the pointer loops.
# The first MegaMoE kernels' tiles per dtype, after block_m: (block_n1, block_n2, block_k, num_warps, num_stages).
MEGAMOE_FIRST_TILES = {"bf16": (128, 128, 64, 8, 3), "fp8": (128, 128, 128, 8, 2)}
MEGAMOE_TILE_COLUMNS = ("block_n1", "block_n2", "block_k", "num_warps", "num_stages")
MEGAMOE_TASK_COLUMNS = ("task_l1_us", "task_l2_us", "task_busy", "task_span_us", "task_waited")


def _megamoe_first_tiles(df):
    """Old megamoe rows: the first kernels' tiles of their dtype (a dtype without one is an error, never a guess)."""
    bad = sorted(set(df["dtype"]) - set(MEGAMOE_FIRST_TILES))
    if bad:
        raise DataError(f"megamoe rows of dtype {bad} predate schema version 3 and have no recorded first-kernel tiles")
    cols = {c: df["dtype"].map({d: v[i] for d, v in MEGAMOE_FIRST_TILES.items()})
            for i, c in enumerate(MEGAMOE_TILE_COLUMNS)}
    return df.assign(**cols)


def _megamoe_gemm_tma(df):
    """Old megamoe_gemm rows: tma from the tiles label (the only place those rows name their main loops)."""
    if "tiles" not in df.columns:
        raise DataError("megamoe_gemm rows before schema version 3 need a tiles column to tell their main loops")
    return df.assign(tma=df["tiles"].astype(str).str.endswith(" tma"))


MIGRATIONS = {("burst_gap", 1): lambda df: df.assign(sync=False, barrier_ns=float("nan"), idle_ns=float("nan")),
              ("burst_gap", 2): lambda df: df.assign(barrier_ns=float("nan"), idle_ns=float("nan")),
              ("megamoe", 1): lambda df: _megamoe_first_tiles(df.assign(compute_sched_ms=float("nan"), tma=False)),
              ("megamoe", 2): lambda df: _megamoe_first_tiles(df.assign(tma=False)),
              ("megamoe", 3): lambda df: df.assign(tma=False),
              ("megamoe_gemm", 1): lambda df: _megamoe_gemm_tma(
                  df.assign(**{c: float("nan") for c in MEGAMOE_TASK_COLUMNS})),
              ("megamoe_gemm", 2): _megamoe_gemm_tma,
              ("burst_program", 1): lambda df: df.assign(load_ns=float("nan"))}

BANDWIDTH = Schema(
    "bandwidth", 1,
    {"method": "str", "target": "str", "programs": "int64", "num_warps": "int64", "rows": "int64",
     "store_bytes": "int64", "bytes": "int64", "repeat": "int64", "ms": "float64", "gbps": "float64"},
    ("method", "target", "programs", "num_warps", "rows", "store_bytes", "bytes"),
    row=("repeat",), times=("ms", "gbps"),
)

BURST_TRAIN = Schema(
    "burst_train", 1,
    {"train": "str", "target": "str", "programs": "int64", "store_bytes": "int64", "n_bursts": "int64",
     "rank": "int64", "repeat": "int64", "burst": "int64", "burst_bytes": "int64", "gap_ns": "int64",
     "issue_ns": "float64", "issue_p10_ns": "float64", "issue_p25_ns": "float64", "issue_p75_ns": "float64",
     "issue_p90_ns": "float64", "issue_min_ns": "float64", "issue_max_ns": "float64", "start_ns": "float64",
     "start_skew_ns": "float64", "end_skew_ns": "float64", "span_ns": "float64"},
    ("train", "target", "programs", "store_bytes"),
    row=("rank", "repeat", "burst"),
    times=("issue_ns", "issue_p10_ns", "issue_p25_ns", "issue_p75_ns", "issue_p90_ns", "issue_min_ns",
           "issue_max_ns", "span_ns"),
    optional_times=("start_ns", "start_skew_ns", "end_skew_ns"),
)
# burst_train: free-running irregular trains (xstage.remote_store.BurstTrain), one row per (train, target,
# programs, rank, repeat, burst); burst_bytes / gap_ns are that burst's size per program and the compute gap
# after it; issue_* are statistics over the P programs of (issue end - issue start); start_ns is the median
# program's issue start after the launch's earliest program start; *_skew_ns are max - min over programs.
BURST_PROGRAM = Schema(
    "burst_program", 2,
    {"train": "str", "target": "str", "programs": "int64", "store_bytes": "int64", "n_bursts": "int64",
     "rank": "int64", "repeat": "int64", "program": "int64", "smid": "int64", "burst": "int64",
     "burst_bytes": "int64", "gap_ns": "int64", "start_ns": "float64", "issue_ns": "float64", "load_ns": "float64"},
    ("train", "target", "programs", "store_bytes"),
    row=("rank", "repeat", "program", "burst"),
    times=("issue_ns",),
    optional_times=("start_ns", "load_ns"),
)
# burst_program: the same trains per program (``xstage sweep trains --per-program``), beside burst_train in one
# folder and from the same runs: one row per (train, target, programs, rank, repeat, program, burst); smid is
# the SM the program ran on (%smid), start_ns its issue start after the launch's earliest program start and
# issue_ns its issue end - issue start. burst_train's statistics of those runs are these rows summarised.
# Schema version 2: load_ns, the load probe's time after the burst's issue end (``--load-probe``; NaN without one,
# and in version 1 records, which had none).
LEGACY_READ_PERIOD = 4   # int64 entries per 32-byte sector of the train kernel's per-burst parameter arrays


def legacy_read_bursts(meta: dict, n_bursts: int) -> tuple[int, ...]:
    """The bursts of a burst_train / burst_program record whose issue times also hold a wait that is no store's:
    recorded on a GPU by the legacy train kernel (the grid has no ``preload``, or it is False), which read each
    burst's size, offset and gap at the burst's top, and at bursts 4, 8, ... (a new 32-byte sector of its int64
    arrays, an L1 miss) that read waited behind the program's outstanding stores inside the timed issue
    (docs/findings.md). The stage model simulates that wait there (``read_fence``); simulated records
    have none."""
    params = meta.get("params") or {}
    if params.get("source", "gpu") != "gpu" or (params.get("grid") or {}).get("preload", False):
        return ()
    return tuple(range(LEGACY_READ_PERIOD, int(n_bursts), LEGACY_READ_PERIOD))


MEGAMOE = Schema(
    "megamoe", 4,
    {"shape": "str", "hidden": "int64", "intermediate": "int64", "experts": "int64", "topk": "int64",
     "tokens": "int64", "routing": "str", "seed": "int64", "P": "int64", "dtype": "str", "schedule": "str",
     "schedule_param": "str", "block_m": "int64", "block_n1": "int64", "block_n2": "int64", "block_k": "int64",
     "num_warps": "int64", "num_stages": "int64", "tma": "bool", "n_tasks": "int64", "rows": "int64",
     "remote_bytes": "int64",
     "kernel_ms": "float64", "kernel_ms_min": "float64", "n_timed": "int64", "calls_per_run": "int64",
     "tflops": "float64",
     "compute_ms": "float64", "dispatch_ms": "float64", "layer_ms": "float64", "unfused_ms": "float64",
     "grouped_mm_ms": "float64", "compute_sched_ms": "float64",
     "predicted_ms": "float64", "predicted_speedup": "float64"},
    ("shape", "tokens", "routing", "P", "dtype"),
    row=("schedule", "schedule_param"),
    times=("kernel_ms", "kernel_ms_min", "tflops", "compute_ms", "dispatch_ms", "layer_ms", "unfused_ms",
           "predicted_ms", "predicted_speedup"),
    optional_times=("grouped_mm_ms", "compute_sched_ms"),
)
# megamoe (xstage.moe_sweep), per configuration, dtype and schedule; every time is the median over repeats of
# the max over ranks:
#   kernel_ms          CUDA events around the experts kernel alone (no barrier); kernel_ms_min its minimum
#   n_timed            timed runs (after warm-up), each of calls_per_run back-to-back calls (times are per call)
#   tflops             GEMM FLOPs of all ranks / P / kernel_ms (per GPU)
#   rows, remote_bytes the busiest rank's received rows, and the largest remote combine bytes of a rank
#   compute_ms         the expert_wave kernel with every combine store local (compute-only control; same per row)
#   dispatch_ms        dispatch push + its barrier; layer_ms: the whole fused layer (dispatch, barrier, kernel,
#                      barrier, top-k sum); unfused_ms: NCCL all_to_all + torch._grouped_mm layer (bf16 weights,
#                      also on fp8 rows); routing layout and task lists are built outside all timed regions
#   grouped_mm_ms      the GEMM phases alone in torch: torch._grouped_mm Linear-1, SwiGLU, torch._grouped_mm
#                      Linear-2 on this rank's rows in bf16 (no communication); compare with compute_ms
#   compute_sched_ms   this schedule's kernel with every combine store local (schema version 2; NaN in version 1 records, which have
#                      the compute-only control of expert_wave alone, compute_ms): kernel_ms - compute_sched_ms is
#                      what the remote combine costs this schedule, compute_sched_ms - compute_ms its tile order
#   predicted_ms       the Burst-Gap prediction of kernel_ms (xstage.moe_plan; max over ranks)
#   predicted_speedup  predicted expert_wave / predicted this schedule
#   schedule_param     lag=<tiles> for lag; model_guided's chosen candidate; the order's version where it has
#                      one (xstage.moe_plan: chunk=<row blocks> for interleaved, group=<row blocks> for lag; absent =
#                      version 1, one tile at a time; order version 2 wrote no chunk of 1, version 3, the sidecar's
#                      order_version, names every chunk)
#   block_m .. num_stages  the tiles the kernel ran with (schema version 3; older rows: MEGAMOE_FIRST_TILES)
#   tma                the main loops through TMA tensor descriptors (schema version 4; older rows: False, the pointer loops)

# megamoe_traffic (xstage.traffic; `xstage sweep megamoe --traffic-ranks 8 --out data/h200x2/traffic8`): MegaMoE rows
# of 8-rank traffic on 2 GPUs, in a file of their own so that no reader of megamoe.csv takes them for 8 GPUs. The
# megamoe columns (P = the layer's EP size, i.e. traffic_ranks: E / P experts and one rank's rows per GPU; every
# time the max over the 2 GPUs, each playing one rank) plus
#   traffic_ranks      the logical ranks whose layer and per-GPU egress the GPUs carry (8)
#   gpus               the GPUs that carry it (2)
# unfused_ms is NaN (not measured): an 8-rank all_to_all has no 2-GPU equivalent. Its version follows megamoe's.
MEGAMOE_TRAFFIC = Schema(
    "megamoe_traffic", MEGAMOE.version, {**MEGAMOE.columns, "traffic_ranks": "int64", "gpus": "int64"},
    MEGAMOE.key, row=MEGAMOE.row, times=tuple(c for c in MEGAMOE.times if c != "unfused_ms"),
    optional_times=MEGAMOE.optional_times + ("unfused_ms",),
)

MEGAMOE_GEMM = Schema(
    "megamoe_gemm", 3,
    {"study": "str", "shape": "str", "hidden": "int64", "intermediate": "int64", "experts": "int64",
     "topk": "int64", "tokens": "int64", "routing": "str", "seed": "int64", "P": "int64", "dtype": "str",
     "rank": "int64", "rows": "int64", "method": "str", "variant": "str", "tiles": "str", "block_m": "int64",
     "block_n1": "int64", "block_n2": "int64", "block_k": "int64", "num_warps": "int64", "num_stages": "int64",
     "tma": "bool", "schedule": "str", "assignment": "str", "is_default": "bool", "status": "str", "note": "str",
     "rel_l2": "float64", "ms": "float64", "ms_min": "float64", "n_timed": "int64", "calls_per_run": "int64",
     "tflops": "float64", "task_l1_us": "float64", "task_l2_us": "float64", "task_busy": "float64",
     "task_span_us": "float64", "task_waited": "float64"},
    ("study", "shape", "tokens", "routing", "P", "dtype"),
    row=("method", "variant", "schedule", "assignment"),
    optional_times=("rel_l2", "ms", "ms_min", "tflops", "task_l1_us", "task_l2_us", "task_busy", "task_span_us",
                    "task_waited"),
)
# megamoe_gemm (xstage.moe_gemm), one GPU (link local), rank 0 of 2, per study, configuration, dtype, method:
#   study      ladder: Expert-Wave compute-only per tile variant beside torch._grouped_mm / _scaled_grouped_mm;
#              order: the default tiles' compute-only time per schedule x assignment
#   method     ours (the experts kernel, every combine store local) | torch._grouped_mm | torch._scaled_grouped_mm
#   variant    the tile variant's name (xstage.moe_gemm.VARIANTS); tiles: BM x BN1 x BN2 x BK, warps, stages
#   tma        (schema version 3) the main loops through TMA tensor descriptors (older rows: read from the tiles label)
#   status     ok | unavailable (the library call failed: note says why; times NaN, never 0)
#   rel_l2     rank 0's combine vs the float32 reference (fp8: its quantisation emulated), checked before timing
#   ms         median over n_timed round-robin runs of calls_per_run back-to-back calls (per call); tflops from it
#   note       model_guided's chosen candidate (order), or why a library call is unavailable
#   task_*     (schema version 2; study controls, NaN elsewhere) one extra launch with per-task device timestamps: median
#              Linear-1 / Linear-2 tile time (start -> last store issued, us), task_busy = sum of task times /
#              (programs x span), task_span_us = first start -> last end, task_waited = share of Linear-2 tasks
#              whose dependency wait polled at least once (the kernel's wait status)

ULYSSES = Schema(
    "ulysses", 1,
    {"shape": "str", "S": "int64", "H": "int64", "D": "int64", "P": "int64", "method": "str",
     "sender_visible_ms": "float64", "end_to_end_ms": "float64", "repeat": "int64", "tflops": "float64"},
    ("shape", "S", "H", "D", "P"),
    row=("method", "repeat"), times=("end_to_end_ms", "tflops"),
    optional_times=("sender_visible_ms",),  # 0 under the Triton interpreter (no device timers)
)
# ulysses (xstage.ulysses_sweep), per shape, method, repeat; the max over ranks:
#   sender_visible_ms  fused: device timestamps, last store issued - first program start; baselines: = end_to_end
#   end_to_end_ms      CUDA events around the layer on each rank, output complete everywhere
#   tflops             attention FLOPs per rank (attention_flops / P) / end_to_end
# params.fused_outputs (one-GPU world, sidecar): where the fused layer's outputs live, ULYSSES_FUSED_OUTPUTS.

# ulysses_traffic (xstage.traffic_ulysses; `xstage sweep ulysses --traffic-ranks 8 --out data/h200x2/traffic8`):
# Ulysses rows of 8-rank traffic on 2 GPUs, in a file of their own so that no reader of ulysses.csv takes them for
# 8 GPUs. The ulysses columns (P = the layer's sequence-parallel size, i.e. traffic_ranks: H / P heads over the
# full sequence per GPU, 7/P of its fused output stored to the peer; every time the max over the 2 GPUs, each
# playing one rank) plus
#   traffic_ranks      the logical ranks whose layer and per-GPU egress the GPUs carry (8)
#   gpus               the GPUs that carry it (2)
# Methods: fused (the fused layer and the end-of-attention barrier over the 2 GPUs), attention_only, and
# serial_bytes: our attention, then ONE 2-rank NCCL all_to_all_single moving the bytes rank L_g moves at P ranks
# (1/P of its output to itself, the rest to the peer) and the P-rank relayout: a timing of those bytes, not the
# layer's output (an 8-rank all_to_all has no 2-GPU equivalent). Its version follows ulysses'.
ULYSSES_TRAFFIC = Schema(
    "ulysses_traffic", ULYSSES.version, {**ULYSSES.columns, "traffic_ranks": "int64", "gpus": "int64"},
    ULYSSES.key, row=ULYSSES.row, times=ULYSSES.times, optional_times=ULYSSES.optional_times,
)

# Where the one-GPU world's fused outputs lived. Since commit 9b3934c (xstage.ulysses.ulysses_buffers) they are
# destination buffers: on the host link the peers' outputs are pinned host memory, like the copies baselines'
# receive buffers. Before it they were device memory on both links (run U2's data/h200x1/ulysses_host/). A sweep
# names the placement in params.fused_outputs; a record without it is placed by its date (the fix's commit time).
ULYSSES_FUSED_OUTPUTS = "destination"
ULYSSES_OUTPUTS_BEFORE_FIX = "device (before the fix)"
ULYSSES_OUTPUTS_FIX_UTC = "2026-12-01T16:45:30+00:00"   # commit 9b3934c


def ulysses_fused_outputs(run: dict) -> str:
    """Where a one-GPU Ulysses run's fused outputs lived: ``run`` is a sidecar (its first run) or one entry of its
    ``runs`` (both hold ``params`` and ``date_utc``). ULYSSES_FUSED_OUTPUTS (destination buffers: pinned host
    memory for the host link's peers) or ULYSSES_OUTPUTS_BEFORE_FIX (device memory, recorded before 9b3934c)."""
    p = run.get("params") or {}
    if "fused_outputs" in p:
        return str(p["fused_outputs"])
    if p.get("world") != "one-gpu":   # one process per GPU: every output in its GPU's memory, peers store there
        return ULYSSES_FUSED_OUTPUTS
    return ULYSSES_OUTPUTS_BEFORE_FIX if str(run.get("date_utc", "")) < ULYSSES_OUTPUTS_FIX_UTC else \
        ULYSSES_FUSED_OUTPUTS


ATTENTION_LADDER = Schema(
    "attention_ladder", 1,
    {"variant": "str", "shape": "str", "S": "int64", "H": "int64", "D": "int64", "method": "str",
     "repeat": "int64", "ms": "float64", "tflops": "float64"},
    ("variant", "shape", "S", "H", "D"), row=("method", "repeat"), times=("ms", "tflops"),
)
# attention_ladder (xstage.ulysses_ladder), per launch variant of our attention, shape, method, repeat:
#   variant  AttnConfig.label (its fields in the sidecar's ``configs``; its checks in ``checks``)
#   method   triton (our attention), gluon (our attention in Gluon, kernels/attention_gluon.py: a variant has one of
#            the two), cudnn (torch SDPA, cuDNN backend), fa4 (FA4's kernel), timed round-robin in the same rounds
#   ms       CUDA events around one launch; tflops = 4 S^2 H D / ms

ATTENTION_CLOCKS = Schema(
    "attention_clocks", 1,
    {"variant": "str", "shape": "str", "S": "int64", "H": "int64", "D": "int64", "method": "str",
     "window": "int64", "launches": "int64", "seconds": "float64", "ms": "float64", "tflops": "float64",
     "sm_mhz": "float64", "power_w": "float64", "temp_c": "float64", "samples": "int64", "reasons": "str"},
    ("variant", "shape", "S", "H", "D"), row=("method", "window"), times=("ms", "tflops", "sm_mhz", "power_w"),
)
# attention_clocks (xstage.attention_clocks), per variant of ours, shape, method, window: one method launched back to
# back for ``seconds`` while nvidia-smi samples the GPU; windows run ours, FA4, cuDNN in turn, ``window`` times over
#   launches, ms   launches in the window; CUDA events around them / launches; tflops = 4 S^2 H D / ms
#   sm_mhz, power_w, temp_c   medians of the nvidia-smi samples in the window after its first SETTLE_S
#   samples        how many samples those medians are of; reasons: the clock-event reasons seen (hex, OR of all)

SCHEMAS = {s.name: s for s in (BURST_GAP, BANDWIDTH, BURST_TRAIN, BURST_PROGRAM, MEGAMOE, MEGAMOE_TRAFFIC,
                                 MEGAMOE_GEMM, ULYSSES, ULYSSES_TRAFFIC, ATTENTION_LADDER, ATTENTION_CLOCKS)}
REQUIRED_META = ("schema", "schema_version", "machine", "gpu_name", "gpu_count", "driver", "torch", "triton",
                 "git_commit", "date_utc", "command", "params")


def paths(folder: Path | str, schema: Schema) -> tuple[Path, Path]:
    """The study's CSV (a sweep writes plain ``.csv``; recorded files may be committed compressed as ``.csv.gz`` or
    ``.csv.xz`` (COMPRESSED_SUFFIXES, in that order of preference), which loading reads too) and its JSON sidecar."""
    folder = Path(folder)
    csv = folder / f"{schema.name}.csv"
    if not csv.exists():
        for suffix in COMPRESSED_SUFFIXES:
            if csv.with_suffix(".csv" + suffix).exists():
                return csv.with_suffix(".csv" + suffix), folder / f"{schema.name}.json"
    return csv, folder / f"{schema.name}.json"


COMPRESSED_SUFFIXES = (".gz", ".xz")   # committed records: gzip, or xz (a third smaller: the tracked tree must stay
                                       # under the 64 MiB the device tool carries)


def machine_dir(machine: str) -> Path:
    return DATA_ROOT / machine


def recorded_machines(schema: Schema = BURST_GAP) -> list[str]:
    """Machines under data/ that hold this study (``paper`` excluded)."""
    if not DATA_ROOT.is_dir():
        return []
    return sorted(p.name for p in DATA_ROOT.iterdir() if paths(p, schema)[0].is_file())


# ------------------------------------------------------------------------------------------------- write
def write_json_atomic(path: Path, obj: dict, indent: int | None = 2) -> None:
    """``obj`` as JSON at ``path``, replaced atomically (``indent=None``: compact, for large tables). A path
    ending in ``.gz`` is written gzip-compressed (reproducibly: no timestamp in the header)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(obj, indent=indent, sort_keys=True, separators=None if indent else (",", ":")) + "\n"
    raw = gzip.compress(text.encode(), mtime=0) if path.suffix == ".gz" else text.encode()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.fchmod(fd, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(raw)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------- integrity
INTEGRITY_FIELDS = ("csv_rows", "csv_sha256")
_HASHES: dict[str, tuple[int, object, int]] = {}  # csv path -> (bytes hashed, running sha256, rows): appends


def integrity(raw: bytes) -> dict:
    """The sidecar's integrity fields for a CSV's (uncompressed) bytes: data rows (header excluded), sha256."""
    return {"csv_rows": max(raw.count(b"\n") - 1, 0), "csv_sha256": hashlib.sha256(raw).hexdigest()}


def read_bytes(csv: Path) -> bytes:
    """The CSV's bytes, ``.csv.gz`` / ``.csv.xz`` decompressed; a missing, unreadable or corrupt file is a
    DataError naming it."""
    if not csv.is_file():
        raise DataError(f"missing data file {csv}")
    try:
        raw = csv.read_bytes()
    except OSError as e:
        raise DataError(f"{csv} cannot be read: {e.strerror or e}") from e
    if csv.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except EOFError as e:
            raise DataError(f"{csv} is a truncated gzip file ({e})") from e
        except (gzip.BadGzipFile, zlib.error, OSError) as e:
            raise DataError(f"{csv} is not a valid gzip file ({type(e).__name__}: {e})") from e
    elif csv.suffix == ".xz":
        try:
            raw = lzma.decompress(raw, format=lzma.FORMAT_XZ)
        except EOFError as e:
            raise DataError(f"{csv} is a truncated xz file ({e})") from e
        except lzma.LZMAError as e:
            what = "a truncated" if "ended before the end-of-stream" in str(e) else "not a valid"
            raise DataError(f"{csv} is {what} xz file ({e})") from e
    return raw


def seal(folder: Path | str, schema: Schema) -> dict:
    """Record ``csv_rows`` / ``csv_sha256`` of the study's CSV, as the file is now, in its sidecar (for files
    recorded before sidecars carried them); returns them. The CSV itself is never rewritten."""
    csv, side = paths(folder, schema)
    meta = read_meta(side, schema)
    fields = integrity(read_bytes(csv))
    write_json_atomic(side, {**meta, **fields})
    return fields


def _under_data_root(path: Path) -> bool:
    try:
        path.resolve().relative_to(DATA_ROOT.resolve())
        return True
    except ValueError:
        return False


def check_integrity(csv: Path, raw: bytes, meta: dict) -> None:
    """The CSV against its sidecar's ``csv_rows`` / ``csv_sha256``; required for files under data/."""
    if not any(k in meta for k in INTEGRITY_FIELDS):
        if _under_data_root(csv):
            raise DataError(f"the sidecar of {csv} records no csv_rows / csv_sha256: every recorded file under "
                            f"data/ must (xstage.data.seal records them)")
        return
    got = integrity(raw)
    if "csv_rows" in meta and got["csv_rows"] != meta["csv_rows"]:
        raise DataError(f"{csv} has {got['csv_rows']} rows, its sidecar records {meta['csv_rows']}: the file was "
                        f"truncated or edited (an interrupted sweep: run it again to resume)")
    if "csv_sha256" in meta and got["csv_sha256"] != meta["csv_sha256"]:
        raise DataError(f"{csv} does not match the sha256 its sidecar records ({str(meta['csv_sha256'])[:12]}..., "
                        f"file {got['csv_sha256'][:12]}...): the file was edited or is corrupt")


def check_values(df: pd.DataFrame, schema: Schema, csv: Path) -> None:
    """Times finite and positive (optional times NaN or >= 0), no two rows with the same identity."""
    row, times, optional = schema.row, schema.times, schema.optional_times
    for cols, ok, what in ((times, lambda v: np.isfinite(v) & (v > 0), "finite and > 0"),
                           (optional, lambda v: np.isnan(v) | (np.isfinite(v) & (v >= 0)),
                            "NaN (not measured) or finite and >= 0")):
        for col in cols:
            if col not in df.columns:
                continue
            v = df[col].to_numpy(dtype=float)
            bad = ~ok(v)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise DataError(f"{csv}: {col} must be {what}; {int(bad.sum())} row(s) are not "
                                f"(first: line {i + 2}, {col}={v[i]})")
    ident = list(schema.key) + [c for c in row if c in df.columns]
    if row:
        dup = df.duplicated(ident)
        if dup.any():
            i = int(np.flatnonzero(dup.to_numpy())[0])
            first = ", ".join(f"{c}={df[c].iloc[i]}" for c in ident)
            raise DataError(f"{csv}: {int(dup.sum())} duplicate row(s) (same {'/'.join(ident)}); first: line "
                            f"{i + 2} ({first})")


def start_file(folder: Path | str, schema: Schema, meta: dict) -> Path:
    """Create (or continue) ``<schema>.csv`` with its sidecar; returns the CSV path.

    Continuing keeps the first run's provenance and appends this run's to ``meta['runs']``.
    """
    csv, side = paths(folder, schema)
    if csv.suffix in COMPRESSED_SUFFIXES:
        raise DataError(f"{csv} is compressed: decompress it to resume or extend that sweep, or record elsewhere")
    meta = {**meta, "schema": schema.name, "schema_version": schema.version}
    if csv.exists() and side.exists():
        old = read_meta(side, schema)
        if old["schema_version"] != schema.version:
            raise DataError(f"{csv} holds schema version {old['schema_version']}; record version {schema.version} elsewhere")
        run = {k: meta[k] for k in ("git_commit", "date_utc", "command", "params")}
        old.setdefault("runs", []).append({**run, **({"launcher": meta["launcher"]} if "launcher" in meta else {})})
        meta = {**old, **integrity(read_bytes(csv))}  # as the file is now (it may have been cut back by hand)
    elif csv.exists():
        raise DataError(f"{csv} exists without its provenance sidecar {side.name}; move it away first")
    else:
        meta["runs"] = []
        csv.parent.mkdir(parents=True, exist_ok=True)
        header = (",".join(schema.columns) + "\n").encode()
        with open(csv, "wb") as f:
            f.write(header)
        meta.update(integrity(header))
    _HASHES.pop(str(csv.resolve()), None)
    write_json_atomic(side, meta)
    return csv


def append_rows(csv: Path, schema: Schema, df: pd.DataFrame) -> None:
    """Append whole rows in one write + fsync (one configuration at a time), then record the file's rows and
    sha256 in its sidecar (an atomic replace; the running hash is kept, so an append hashes only its rows)."""
    missing = [c for c in schema.columns if c not in df.columns]
    if missing:
        raise DataError(f"rows for {csv} lack columns {missing}")
    buf = io.StringIO()
    df[list(schema.columns)].to_csv(buf, header=False, index=False)
    data = buf.getvalue().encode()
    fd = os.open(csv, os.O_WRONLY | os.O_APPEND)
    try:
        before = os.fstat(fd).st_size
        os.write(fd, data)
        os.fsync(fd)
        after = os.fstat(fd).st_size
    finally:
        os.close(fd)
    side = csv.with_suffix(".json")
    if not side.is_file():
        return
    key = str(csv.resolve())
    cached = _HASHES.get(key)
    if cached is not None and cached[0] == before and after == before + len(data):
        h, rows = cached[1], cached[2] + data.count(b"\n")
        h.update(data)
    else:  # first append of this process, or someone else wrote too: hash the file as it is
        raw = csv.read_bytes()
        h, rows, after = hashlib.sha256(raw), max(raw.count(b"\n") - 1, 0), len(raw)
    _HASHES[key] = (after, h, rows)
    meta = json.loads(side.read_text())
    write_json_atomic(side, {**meta, "csv_rows": rows, "csv_sha256": h.copy().hexdigest()})


# -------------------------------------------------------------------------------------------------- read
def read_meta(side: Path, schema: Schema) -> dict:
    if not side.is_file():
        raise DataError(f"missing provenance sidecar {side}")
    try:
        meta = json.loads(side.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{side} is not valid JSON: {e}") from e
    if not isinstance(meta, dict):
        raise DataError(f"{side} is not a JSON object (got {type(meta).__name__})")
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise DataError(f"{side} lacks provenance fields {missing}")
    if meta["schema"] == schema.name and (schema.name, meta["schema_version"]) in MIGRATIONS:
        return meta
    if meta["schema"] != schema.name or meta["schema_version"] != schema.version:
        raise DataError(f"{side} holds schema {meta['schema']!r} version {meta['schema_version']}, "
                        f"expected {schema.name!r} version {schema.version}")
    return meta


def read_rows(csv: Path, schema: Schema, version: int | None = None) -> pd.DataFrame:
    return _read_rows(csv, schema, version)[0]


def _read_rows(csv: Path, schema: Schema, version: int | None = None) -> tuple[pd.DataFrame, bytes]:
    raw = read_bytes(csv)
    if raw and not raw.endswith(b"\n"):
        raise DataError(f"{csv} ends mid-row: the file is truncated (its last line has no newline)")
    try:
        df = pd.read_csv(io.BytesIO(raw))
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise DataError(f"{csv} is not a readable CSV: {e}") from e
    if version is not None and version != schema.version:
        df = MIGRATIONS[(schema.name, version)](df)
    missing = [c for c in schema.columns if c not in df.columns]
    if missing:
        raise DataError(f"{csv} lacks columns {missing} (schema {schema.name} v{schema.version})")
    df = df[list(schema.columns) + [c for c in df.columns if c not in schema.columns]]
    if "tma" in schema.columns:                    # megamoe schemas: True / False (as written), never a guess
        v = df["tma"].map({True: True, False: False, "True": True, "False": False})
        if v.isna().any():
            i = int(np.flatnonzero(v.isna().to_numpy())[0])
            raise DataError(f"{csv} has a malformed value: tma must be True or False; {int(v.isna().sum())} row(s) "
                            f"are not (first: line {i + 2}, tma={df['tma'].iloc[i]})")
        df = df.assign(tma=v.astype(bool))
    try:
        df = df.astype(schema.columns)
    except (ValueError, TypeError) as e:
        raise DataError(f"{csv} has a malformed value: {e}") from e
    return df, raw


def load(folder: Path | str, schema: Schema = BURST_GAP) -> tuple[pd.DataFrame, dict]:
    """Rows and provenance of one recorded study, verified (module docstring); clear errors naming the file."""
    csv, side = paths(folder, schema)
    meta = read_meta(side, schema)
    df, raw = _read_rows(csv, schema, meta["schema_version"])
    check_integrity(csv, raw, meta)
    check_values(df, schema, csv)
    return df, meta


JSONL_KINDS = ("gpc_map", "scale_prediction", "attention_layer")  # records that are JSON lines beside a sidecar
# (kind, jsonl_sha256), not a CSV schema (scale_prediction: a model output, never measured; attention_layer: the
# attention call's parts, scripts/attention_layer_gpu.py)


def load_jsonl(folder: Path | str, kind: str) -> tuple[list[dict], dict]:
    """A JSON-lines record (``<kind>.jsonl`` + ``<kind>.json``: e.g. scripts/gpc_map.sh's SM -> GPC map): its lines
    and its sidecar, the file checked against the sidecar's ``jsonl_sha256``."""
    if kind not in JSONL_KINDS:
        raise ValueError(f"kind must be one of {', '.join(JSONL_KINDS)}, got {kind!r}")
    folder = Path(folder)
    lines_path, side = folder / f"{kind}.jsonl", folder / f"{kind}.json"
    for p in (lines_path, side):
        if not p.is_file():
            raise DataError(f"missing {p}")
    meta = json.loads(side.read_text())
    raw = lines_path.read_bytes()
    if meta.get("kind") != kind or hashlib.sha256(raw).hexdigest() != meta.get("jsonl_sha256"):
        raise DataError(f"{lines_path} does not match its sidecar {side.name} (kind {meta.get('kind')!r}, "
                        "jsonl_sha256): the file changed after it was recorded")
    return [json.loads(line) for line in raw.decode().splitlines() if line.strip()], meta


def write_jsonl(folder: Path | str, kind: str, lines: list[dict], meta: dict) -> Path:
    """Write a JSON-lines record (``<kind>.jsonl`` + its sidecar ``<kind>.json`` with ``kind`` and ``jsonl_sha256``),
    each file atomically; :func:`load_jsonl` reads it back checked."""
    if kind not in JSONL_KINDS:
        raise ValueError(f"kind must be one of {', '.join(JSONL_KINDS)}, got {kind!r}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    raw = "".join(json.dumps(line, sort_keys=True, default=str) + "\n" for line in lines).encode()
    path = folder / f"{kind}.jsonl"
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.")
    os.fchmod(fd, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(raw)
    os.replace(tmp, path)
    write_json_atomic(folder / f"{kind}.json", {**meta, "kind": kind, "jsonl_sha256": hashlib.sha256(raw).hexdigest(),
                                                "lines": len(lines)})
    return folder / f"{kind}.jsonl"


def done_keys(csv: Path, schema: Schema) -> set[tuple]:
    """Configurations already recorded in ``csv`` (for resuming)."""
    if not csv.is_file():
        return set()
    df = read_rows(csv, schema)
    return set(df[list(schema.key)].itertuples(index=False, name=None))
