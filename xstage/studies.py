"""Data access and the small analyses the study notebooks share: where a notebook's numbers come from.

A notebook names a ``source`` and gets rows in the recorded schema plus their provenance, whatever the source:

  recorded   data/<machine>/ (committed measurements; ``variant="free_running"`` -> data/<machine>/free_running)
  gpu        a fresh sweep on this machine's GPUs (default grid, plus the drain runs), written to ``out``
  simulated  the Burst-Gap event simulation with reference parameters on a small grid (seconds on a CPU)
  auto       gpu when GPUs are visible (burst-gap: one GPU measures the host link, two NVLink), else recorded

``meta["source"]`` says which one was used. The analyses here (slowdown over the backpressure-free
expectation, measured onset, bandwidth ratio) are what figures and checks read, so a number in a caption and
the panel beside it come from one place.

Legend: P = issuing programs, b = bytes per program per burst, k = burst index in a train (0 = first).
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from . import data, env, records
from .sources import (VARIANTS, check_machine as _check_machine, check_source as _check_source,
                      check_variant as _check_variant, default_out as _default_out, recorded as _recorded,
                      source_data as _source_data, LINK_MACHINES, PAPER_DIR, paper_numbers, paper_number,
                      default_params, recorded_params, caption_provenance)
from .model import KIB, BurstGapParams
from .numeric import geomean

# ------------------------------------------------------------------------------------------- study 4: Ulysses
# Legend: S = sequence length, H = heads, D = head dim, P = ranks; sv = sender-visible, e2e = end to end.
ULYSSES_SHAPE_KEYS = ["shape", "S", "H", "D", "P"]
# What the speedup panel compares with serial_triton (our attention, then NCCL all_to_all): line -> (method,
# time column). The fused layer has both times; a baseline's sender-visible time is its end-to-end time.
ULYSSES_SPEEDUP_LINES = {
    "fused_sv": ("fused", "sender_visible_ms"),
    "fused_e2e": ("fused", "end_to_end_ms"),
    "overlapped": ("overlapped", "end_to_end_ms"),
    "serial_cudnn": ("serial_cudnn", "end_to_end_ms"),
}
ULYSSES_BASELINE = "serial_triton"
FUSED_OVER_ATTENTION_GOAL = 1.05   # fused sender-visible / our attention alone (docs/lab-notebook.md)
ATTENTION_OVER_CUDNN_GOAL = 0.9    # our attention's TFLOP/s / cuDNN SDPA's, same shape


ULYSSES_ONE_GPU_LINKS = ("local", "host")   # xstage.ranks.ONE_GPU_LINKS (not imported: this module needs no torch)
# The one-GPU record each link's numbers come from (data/<machine>/<it>/). The host link's is run V1, made with the
# fused outputs as destination buffers (xstage.data.ulysses_fused_outputs; docs/lab-notebook.md, "Ulysses on one
# GPU, host link, re-recorded"); run U2's
# ulysses_host kept its fused outputs in device memory and is read only by name, labelled as before the fix.
ULYSSES_ONE_GPU_RECORDS = {"local": "ulysses_local", "host": "ulysses_host"}
ULYSSES_HOST_BEFORE_FIX = "archive/ulysses_host_fused_outputs_on_gpu"


def ulysses_data(source: str = "auto", machine: str = "h200x2", out: str | Path | None = None,
                 link: str | None = None, record: str | None = None) -> tuple[pd.DataFrame, dict]:
    """Ulysses attention rows (schema xstage.data.ULYSSES: per shape, method, repeat) and provenance;
    ``df.attrs["world"]`` says which world and link the rows come from (every Ulysses figure's title shows it).

    source:  recorded (data/<machine>/ulysses.csv; with ``link``: data/<machine>/ULYSSES_ONE_GPU_RECORDS[link]/),
             gpu (run or resume the sweep into ``out``: on every visible GPU, or with ``link`` the one-GPU world,
             by default into <out>/ULYSSES_ONE_GPU_RECORDS[link]), or auto (gpu when the GPUs are visible, else
             recorded). There is no simulated source.
    machine: the folder under data/ (recorded); gpu ignores it (the default folder is named after this
             machine's GPUs, see :func:`_default_out`).
    out:     where a gpu sweep writes; a folder already holding a sweep resumes it.
    link:    None: one process per GPU (NCCL, NVLink peers); "local" / "host": the one-GPU world
             (xstage.ranks.OneGPUWorld: every rank on one GPU, the peers' outputs in device memory or in pinned
             host memory, all-to-alls by copies).
    record:  with ``link``, recorded only: another folder under data/<machine>/ than the link's record, e.g.
             ULYSSES_HOST_BEFORE_FIX (run U2, fused outputs in device memory; ``df.attrs["world"]`` says so).
    """
    if link is not None and link not in ULYSSES_ONE_GPU_LINKS:
        raise ValueError(f"link must be None (one process per GPU) or one of {', '.join(ULYSSES_ONE_GPU_LINKS)} "
                         f"(the one-GPU world), got {link!r}")
    if record is not None and (link is None or source != "recorded"):
        raise ValueError(f"record {record!r} names a recorded one-GPU folder: give link= and source='recorded'")
    name = None if link is None else record or ULYSSES_ONE_GPU_RECORDS[link]

    def run(folder: Path) -> None:
        import torch

        from .ulysses_sweep import run_ulysses

        if link is None:
            run_ulysses(folder, world_size=torch.cuda.device_count(), command="xstage.studies.ulysses_data('gpu')")
        else:
            run_ulysses(folder, world="one-gpu", link=link,
                        command=f"xstage.studies.ulysses_data('gpu', link={link!r})")

    def recorded() -> Path:
        if link is None:
            have = sorted({r.machine for r in records.records("ulysses", link="nvlink")})
            if machine not in have:
                raise ValueError(f"machine {machine!r} has no recorded ulysses data; recorded machines: "
                                 f"{', '.join(have) or 'none'}")
            return records.folder("ulysses", machine, "nvlink")
        folder = data.machine_dir(machine) / name
        if not data.paths(folder, data.ULYSSES)[0].is_file():
            raise ValueError(f"machine {machine!r} has no recorded one-GPU Ulysses data for link {link!r} "
                             f"({folder} has no ulysses.csv); record it: xstage sweep ulysses --world one-gpu "
                             f"--link {link} --out {folder}")
        return folder

    def gpu_folder(folder: Path) -> Path:
        return folder if link is None else folder / name

    df, meta, _ = _source_data(source, data.ULYSSES, "the Ulysses study", recorded, run, out,
                               gpu_folder=gpu_folder if out is None else (lambda f: f))
    df.attrs["world"] = ulysses_world(meta, sorted(int(p) for p in set(df.P)))
    return df, meta


def ulysses_world(meta: dict, ranks=None) -> str:
    """Which world and link a Ulysses record was measured in, in words (from its sidecar's params; ``ranks``:
    the rank counts its rows hold, default the first run's)."""
    p = meta.get("params", {})
    ranks = list(ranks or [int(p.get("world_size", meta.get("gpu_count", 0)) or 0)])
    n = " / ".join(str(r) for r in ranks)
    if p.get("world") == "one-gpu":
        where = {"host": "peers' outputs in pinned host memory (host link, PCIe)",
                 "local": "every buffer in device memory (local control)"}.get(p.get("link"), p.get("link"))
        if p.get("link") == "host" and data.ulysses_fused_outputs(meta) != data.ULYSSES_FUSED_OUTPUTS:
            where = ("host link: peers' receive buffers in pinned host memory, fused outputs in device memory "
                     "(before the fix)")
        return f"one GPU, {n} ranks one after another, rank 0 timed; {where}; all-to-all by copies"
    return f"{n} GPUs, one process each (NVLink peers); all-to-all by NCCL"


def ulysses_bursts(metas: dict[str, dict], model_link: str = "host", max_bursts: int = 64) -> pd.DataFrame:
    """The fused epilogue's bursts, measured (the sidecar's ``bursts``: per-program time start -> last store
    issued of one timed run, programs whose tile goes to a peer vs to rank 0's own rows) beside the stage model
    of ``model_link`` (xstage.model.load_params of data/<its machine>, unchanged; ``predict_train``).

    ``metas``: {label: a Ulysses sidecar} (e.g. the one-GPU records per link). Per (record, shape): ``extra_us``
    = median remote program - median local program (what storing the tile to a peer costs the program; ~0 on
    the local control) and ``predicted_us``: the model's median issue time per burst for a free-running train
    of bursts of one tile (``tile_kib``) by the programs that store to peers at once (``concurrent_max`` x
    (P-1)/P), the gap after each burst the median local program's time, as many bursts as remote tiles per such
    program (at most ``max_bursts``); first order: the model's backpressure-free issue time is in it, a local
    store's is not subtracted."""
    from .model import load_params, predict_train

    prm = load_params(data.machine_dir(LINK_MACHINES[model_link]), model_link)
    rows = []
    for label, meta in metas.items():
        for key, b in (meta.get("bursts") or {}).items():
            P = int(key.rsplit("/P", 1)[1])
            rem, loc = b.get("remote", {}), b.get("local", {})
            if not rem.get("programs") or not loc.get("programs"):
                continue
            storing = max(1, round(b["concurrent_max"] * (P - 1) / P))
            n = int(min(max_bursts, max(1, round(rem["programs"] / storing))))
            pred = predict_train(prm, storing, np.full(n, float(b["tile_bytes"])), np.full(n, loc["median_ns"]))
            rows.append(dict(record=label, shape=key.rsplit("/P", 1)[0], P=P, programs=b["programs"],
                             concurrent_max=b["concurrent_max"], storing_programs=storing, bursts=n,
                             tile_kib=b["tile_bytes"] / KIB, local_us=loc["median_ns"] / 1e3,
                             remote_us=rem["median_ns"] / 1e3, extra_us=(rem["median_ns"] - loc["median_ns"]) / 1e3,
                             predicted_us=float(np.median(pred)) / 1e3))
    cols = ["record", "shape", "P", "programs", "concurrent_max", "storing_programs", "bursts", "tile_kib",
            "local_us", "remote_us", "extra_us", "predicted_us"]
    return pd.DataFrame(rows, columns=cols)


def ulysses_family(shape: str) -> str:
    """``sequence sweep`` for the S sweep at fixed heads (names ``seq_*``), ``DiT`` for the model table."""
    return "sequence sweep" if str(shape).startswith("seq_") else "DiT"


def ulysses_medians(df: pd.DataFrame) -> pd.DataFrame:
    """Per shape and method: median and quartiles over repeats of both times, and the median TFLOP/s.
    Columns: shape, S, H, D, P, method, {sv,e2e}_{median,q25,q75}, tflops, n, family."""
    if df.empty:
        raise ValueError("no Ulysses rows")
    g = df.groupby(ULYSSES_SHAPE_KEYS + ["method"])
    parts = {}
    for short, col in (("sv", "sender_visible_ms"), ("e2e", "end_to_end_ms")):
        parts.update({f"{short}_median": g[col].median(), f"{short}_q25": g[col].quantile(0.25),
                      f"{short}_q75": g[col].quantile(0.75)})
    out = pd.DataFrame({**parts, "tflops": g.tflops.median(), "n": g.size()}).reset_index()
    out["family"] = out["shape"].map(ulysses_family)
    return out.sort_values(["P", "D", "H", "S", "method"]).reset_index(drop=True)


def _ulysses_wide(med: pd.DataFrame, stat: str) -> pd.DataFrame:
    """(shape keys) x method table of one statistic, e.g. ``sv_median``."""
    return med.pivot_table(index=ULYSSES_SHAPE_KEYS, columns="method", values=stat)


def ulysses_speedups(df: pd.DataFrame) -> pd.DataFrame:
    """Speedup over serial (our attention, then NCCL all_to_all) of each line of ULYSSES_SPEEDUP_LINES, per
    shape: ``speedup`` = median serial time / median time of the line (same time column on both sides);
    ``low``/``high`` = the quartile ratios q25(serial) / q75(line) and q75(serial) / q25(line), a conservative
    spread over repeats. Lines whose method the data lacks are left out; shapes without the serial baseline
    too. Columns: shape, S, H, D, P, family, line, method, speedup, low, high."""
    med = ulysses_medians(df)
    if ULYSSES_BASELINE not in set(med.method):
        raise ValueError(f"the data has no {ULYSSES_BASELINE} rows (the serial baseline); "
                         f"methods: {sorted(set(med.method))}")
    rows = []
    for line, (method, col) in ULYSSES_SPEEDUP_LINES.items():
        short = "sv" if col == "sender_visible_ms" else "e2e"
        m = {s: _ulysses_wide(med, f"{short}_{s}") for s in ("median", "q25", "q75")}
        if method not in m["median"]:
            continue
        base = {s: m[s][ULYSSES_BASELINE] for s in m}
        t = pd.DataFrame({"speedup": base["median"] / m["median"][method],
                          "low": base["q25"] / m["q75"][method], "high": base["q75"] / m["q25"][method]})
        rows.append(t.dropna().reset_index().assign(line=line, method=method))
    out = pd.concat(rows, ignore_index=True)
    out["family"] = out["shape"].map(ulysses_family)
    cols = ULYSSES_SHAPE_KEYS + ["family", "line", "method", "speedup", "low", "high"]
    return out[cols].sort_values(["line", "P", "D", "H", "S"]).reset_index(drop=True)


def ulysses_ratios(df: pd.DataFrame) -> pd.DataFrame:
    """Per shape, times relative to our attention alone (sender-visible medians): ``fused_sv``, ``fused_e2e``
    (fused layer; the goal is <= FUSED_OVER_ATTENTION_GOAL) and ``serial`` (attention, then NCCL: also the most
    any fusion can gain over serial, were the communication free); ``sent_mb`` = MB each rank sends to other
    ranks in the post-attention all-to-all (bf16); and our attention's TFLOP/s beside cuDNN SDPA's
    (``attention_tflops``, ``sdpa_tflops``, ``attention_over_sdpa``). Columns missing from the data are NaN."""
    from .ulysses import alltoall_bytes

    med = ulysses_medians(df)
    sv, e2e, tf = (_ulysses_wide(med, s) for s in ("sv_median", "e2e_median", "tflops"))
    nan = pd.Series(np.nan, index=sv.index)
    col = lambda t, m: t[m] if m in t else nan  # noqa: E731
    attn = col(sv, "attention_only")
    out = pd.DataFrame({"fused_sv": col(sv, "fused") / attn, "fused_e2e": col(e2e, "fused") / attn,
                        "serial": col(sv, ULYSSES_BASELINE) / attn,
                        "attention_tflops": col(tf, "attention_only"), "sdpa_tflops": col(tf, "sdpa_only")})
    out["attention_over_sdpa"] = out.attention_tflops / out.sdpa_tflops
    out = out.reset_index()
    out.insert(len(ULYSSES_SHAPE_KEYS), "sent_mb",
               [alltoall_bytes(S, H, D, P) / 1e6 for S, H, D, P in zip(out.S, out.H, out.D, out.P)])
    out["family"] = out["shape"].map(ulysses_family)
    return out.sort_values(["P", "D", "H", "S"]).reset_index(drop=True)


ULYSSES_FA_RECORD = "ulysses_fa4_fused"   # data/<machine>/archive/ulysses_fa4_fused_<link>/: FA4's methods, one GPU
ULYSSES_FA_LABELS: dict[str, str] = {}


def ulysses_fa_data(machine: str = "h200x1", link: str = "host", record: str = ULYSSES_FA_RECORD
                    ) -> tuple[pd.DataFrame, dict]:
    """The one-GPU Ulysses record that times FA4 (``fa``, ``fa_serial``, ``fa_fused``: the extra ``fa4``) beside
    ours and cuDNN in the same rounds (archived: data/<machine>/archive/<record>_<link>/; schema ulysses), verified;
    recorded only (it needs a Hopper GPU and the extra). ``record``: the folder's stem (``ulysses_fa4_fused``: FA4
    alone, FA's kernel launched as the fused one is, and the FA4-class fused layer, P = 2; ``ulysses_fa4_fused_p4``:
    the same methods at P = 4). ``df.attrs["world"]`` names the world and link."""
    if link not in ULYSSES_ONE_GPU_LINKS:
        raise ValueError(f"link must be one of {', '.join(ULYSSES_ONE_GPU_LINKS)}, got {link!r}")
    found = [r for r in records.records("ulysses", machine, link, current=None) if r.folder == f"{record}_{link}"]
    folder = found[0].path if found else data.machine_dir(machine) / f"{record}_{link}"
    if not data.paths(folder, data.ULYSSES)[0].is_file():
        raise ValueError(f"machine {machine!r} has no recorded FA4 Ulysses data for link {link!r} ({folder} has no "
                         f"ulysses.csv); record it: scripts/fa4_one_gpu.sh (xstage sweep ulysses --world one-gpu "
                         f"--link {link} --methods ...,fa,fa_serial,fa_fused --out {folder})")
    df, meta = data.load(folder, data.ULYSSES)
    df.attrs["world"] = ulysses_world(meta, sorted(int(p) for p in set(df.P)))
    return df, meta


def ulysses_fa_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per shape of one record, FA4 against ours and cuDNN SDPA (medians over repeats, timed round-robin in the same
    rounds): TFLOP/s of ``ours`` (attention_only), ``cudnn`` (sdpa_only) and ``fa`` (FA4 alone), ``ours_over_fa``
    and ``cudnn_over_fa`` (TFLOP/s ratios); the fused FA layer over FA alone, sender-visible (``fa_fused_sv``: CUDA
    events around the kernel, the same clock as FA alone) and end to end (``fa_fused_e2e``: up to the end of the
    barrier); ``fa_serial`` (FA, then the all-to-all) over FA alone; the end-to-end speedups over the serial layer
    with the same attention, ``fa_speedup`` (fa_serial / fa_fused) and ``ours_speedup`` (serial_triton / fused).
    With ``fa_kernel`` rows (FA's kernel launched as the fused one is, no per-call interface work): its TFLOP/s
    (``fa_kernel``) and the fused layer over it (``fa_fused_sv_k``, ``fa_fused_e2e_k``: one launch path, only the
    epilogue differs). NaN where the record lacks a method (e.g. fa_fused absent after a failed check)."""
    med = ulysses_medians(df)
    sv, e2e, tf = (_ulysses_wide(med, s) for s in ("sv_median", "e2e_median", "tflops"))
    nan = pd.Series(np.nan, index=sv.index)
    col = lambda t, m: t[m] if m in t else nan  # noqa: E731
    fa = col(sv, "fa")
    out = pd.DataFrame({"ours": col(tf, "attention_only"), "cudnn": col(tf, "sdpa_only"), "fa": col(tf, "fa")})
    out["ours_over_fa"] = out.ours / out.fa
    out["cudnn_over_fa"] = out.cudnn / out.fa
    out["fa_fused_sv"] = col(sv, "fa_fused") / fa
    out["fa_fused_e2e"] = col(e2e, "fa_fused") / fa
    out["fa_serial"] = col(e2e, "fa_serial") / fa
    out["fa_speedup"] = col(e2e, "fa_serial") / col(e2e, "fa_fused")
    out["ours_speedup"] = col(e2e, ULYSSES_BASELINE) / col(e2e, "fused")
    out["fa_kernel"] = col(tf, "fa_kernel")
    out["fa_fused_sv_k"] = col(sv, "fa_fused") / col(sv, "fa_kernel")
    out["fa_fused_e2e_k"] = col(e2e, "fa_fused") / col(sv, "fa_kernel")
    out = out.reset_index()
    out["family"] = out["shape"].map(ulysses_family)
    return out.sort_values(["P", "D", "H", "S"]).reset_index(drop=True)


ATTENTION_LADDER_GOAL = 0.95   # issue 14: our attention's TFLOP/s / the FA-class kernel's (cuDNN SDPA stands in)


def attention_ladder_machine(record: str, default: str) -> tuple[str, str]:
    """(machine folder, GPU for captions) of an attention record: ``default`` (notebook 04's one_gpu_machine) when it
    holds ``record``, else the one machine that does (xstage.records)."""
    have = [r.machine for r in records.records("attention", current=None) if r.folder == record]
    machine = default if default in have or not have else have[0]
    return machine, "H100" if machine.startswith("h100") else "H200"


# records whose timing differs from the rest (every figure names it)
ATTENTION_LADDER_LABELS = {"attention_vs_fa4_unqueued": "each sample's clock started on an idle GPU: the host's launch "
                                                        "work inside the sample"}


def attention_ladder_data(machine: str = "h200x1", record: str = "attention_vs_fa4") -> tuple[pd.DataFrame, dict]:
    """The attention ladder's rows (schema xstage.data.ATTENTION_LADDER) and provenance, verified: ``record`` is
    the folder of a registered record of study ``attention`` on ``machine`` (xstage.records: the current
    ``attention_vs_fa4``, ours beside cuDNN and FA4's CuTe Hopper forward in the same rounds, or an archived one).
    Recorded only (the run needs a GPU)."""
    found = [r for r in records.records("attention", machine, current=None) if r.folder == record]
    if not found:
        have = sorted({r.folder for r in records.records("attention", current=None)})
        raise ValueError(f"record must be one of {have} (on its machine), got {record!r} on {machine!r}")
    return data.load(found[0].path, data.ATTENTION_LADDER)


def attention_ladder_table(df: pd.DataFrame, meta: dict | None = None) -> pd.DataFrame:
    """Per head dim, shape and variant (in recorded order): median ms of ours and of cuDNN SDPA timed in the same
    rounds, both TFLOP/s (4 S^2 H D / median), ``ours_over_cudnn`` (TFLOP/s ratio), ``vs_base`` (ours over the
    head dim's first variant on the same shape) and, from ``meta``, the variants that failed before timing
    (``failed``: one row each, times NaN). Where FA4's kernel was timed in the same rounds (record
    attention_vs_fa4): ``fa_ms``, ``fa_tflops``, ``ours_over_fa``; NaN otherwise."""
    keys = ["D", "shape", "S", "H", "variant"]
    med = df.groupby(keys + ["method"], sort=False).ms.median().unstack("method").reset_index()
    from .ulysses import attention_flops

    flops = attention_flops(med.S.astype(float), med.H, med.D)
    # ours: our Triton kernel's rows, or the Gluon kernel's (method gluon: a variant has one of the two)
    # (a record may hold only Gluon rungs: session 26's gluon_jr and gluon_final)
    mine = [m for m in ("triton", "gluon") if m in med]
    med["ours_ms"] = med[mine[0]].fillna(med[mine[-1]])
    med["cudnn_ms"] = med["cudnn"] if "cudnn" in med else np.nan
    med["ours_tflops"] = flops / med.ours_ms / 1e9
    med["cudnn_tflops"] = flops / med.cudnn_ms / 1e9
    med["ours_over_cudnn"] = med.cudnn_ms / med.ours_ms
    med["fa_ms"] = med["fa4"] if "fa4" in med else np.nan
    med["fa_tflops"] = flops / med.fa_ms / 1e9
    med["ours_over_fa"] = med.fa_ms / med.ours_ms
    base = {D: df[df.D == D].variant.iloc[0] for D in df.D.unique()}
    ref = med[med.variant == med.D.map(base)].set_index(["D", "shape"]).ours_tflops
    med["vs_base"] = med.ours_tflops / [ref.get((d, s), np.nan) for d, s in zip(med.D, med["shape"])]
    order = {(d, v): i for i, (d, v) in enumerate(df[["D", "variant"]].drop_duplicates().itertuples(index=False))}
    med["_o"] = [order[(d, v)] for d, v in zip(med.D, med.variant)]
    med = med.sort_values(["D", "S", "_o"], ascending=[False, True, True], kind="stable")
    out = med[keys + ["ours_ms", "cudnn_ms", "ours_tflops", "cudnn_tflops", "ours_over_cudnn", "vs_base", "fa_ms",
                      "fa_tflops", "ours_over_fa"]]
    failed = (meta or {}).get("failed") or {}
    if failed and not all(isinstance(v, dict) for v in failed.values()):
        # run L1's sidecar: keyed by label alone; the head dim from the run's params
        given = {label: D for D, cfgs in (meta.get("params", {}).get("variants") or {}).items()
                 for label in _ladder_labels(cfgs)}
        failed = {D: {v: why for v, why in failed.items() if given.get(v) == D} for D in set(given.values())}
    rows = [(int(D), v, why) for D, fs in failed.items() for v, why in fs.items()]
    if rows:
        out = pd.concat([out, pd.DataFrame(rows, columns=["D", "variant", "failed"])], ignore_index=True)
    return out.reset_index(drop=True)


def attention_vs_fa4_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per shape of a ladder beside FA4 (:func:`attention_ladder_table` of record attention_vs_fa4): FA4's
    TFLOP/s, the base rung's (the head dim's first variant) ours / FA, the fastest variant on that shape and its
    ours / FA, ours / cuDNN, and whether the goal (>= ATTENTION_LADDER_GOAL of FA's TFLOP/s, issue 14: required at
    S >= 8K) is met by the fastest. Each ratio is of medians timed in the same rounds (the variant's block), so
    FA4's TFLOP/s is the median over the variants' blocks. Shapes in the table's order; none without FA rows."""
    t = table.dropna(subset=["ours_over_fa"])
    rows = []
    for (D, shape), g in t.groupby(["D", "shape"], sort=False):
        base, best = g.iloc[0], g.loc[g.ours_tflops.idxmax()]
        rows.append(dict(shape=shape, S=int(base.S), H=int(base.H), D=int(D), fa_tflops=float(g.fa_tflops.median()),
                         base_variant=base.variant, base_tflops=float(base.ours_tflops),
                         base_over_fa=float(base.ours_over_fa), best_variant=best.variant,
                         best_tflops=float(best.ours_tflops), best_over_fa=float(best.ours_over_fa),
                         best_over_cudnn=float(best.ours_over_cudnn), goal=ATTENTION_LADDER_GOAL,
                         goal_applies=bool(base.S >= 8192),
                         met=bool(best.ours_over_fa >= ATTENTION_LADDER_GOAL)))
    return pd.DataFrame(rows, columns=["shape", "S", "H", "D", "fa_tflops", "base_variant", "base_tflops",
                                       "base_over_fa", "best_variant", "best_tflops", "best_over_fa",
                                       "best_over_cudnn", "goal", "goal_applies", "met"])


def attention_vs_fa4_goals(summary: pd.DataFrame, world: str = "") -> pd.DataFrame:
    """The goals row of the beside-FA4 study (same columns as :func:`ulysses_goals`): the smallest over shapes with
    S >= 8K of the fastest variant's TFLOP/s / FA4's (goal >= ATTENTION_LADDER_GOAL); ``met`` None without data."""
    tag = f" ({world})" if world else ""
    need = summary[summary.goal_applies].best_over_fa.dropna()
    ours = float(need.min()) if len(need) else None
    return pd.DataFrame([dict(quantity=f"min our attention (fastest variant) / FA4 TFLOP/s, S >= 8K{tag}", ours=ours,
                              paper=None, goal=f">= {ATTENTION_LADDER_GOAL:g}",
                              met=None if ours is None else ours >= ATTENTION_LADDER_GOAL)],
                        columns=["quantity", "ours", "paper", "goal", "met"])


ATTENTION_CLOCKS_MACHINE = "h100x1"   # the one machine the clocks study was run on


def attention_clocks_data(machine: str = ATTENTION_CLOCKS_MACHINE, record: str = "attention_clocks") -> tuple[pd.DataFrame, dict]:
    """The sustained-clocks study's rows (schema xstage.data.ATTENTION_CLOCKS) and provenance, verified
    (data/<machine>/attention_clocks/, ``scripts/attention_clocks.py``). Recorded only (the run needs a GPU)."""
    folder = records.folder("attention_clocks", machine, "local") if record == "attention_clocks" \
        else data.machine_dir(machine) / record
    if not data.paths(folder, data.ATTENTION_CLOCKS)[0].is_file():
        raise ValueError(f"machine {machine!r} has no recorded {record} ({folder} has no attention_clocks.csv); "
                         f"record it: scripts/attention_vs_fa4.sh install clocks:<s>")
    return data.load(folder, data.ATTENTION_CLOCKS)


def attention_clocks_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per shape and method of the sustained-clocks study (xstage.attention_clocks): medians over its windows of
    TFLOP/s, SM clock (MHz), power (W) and temperature; ``tflops_per_ghz`` (work per clock: TFLOP/s over the SM
    clock in GHz), ``j_per_pflop`` (energy per PFLOP: W over TFLOP/s, x 1000) and the clock-event reasons seen
    (OR over windows, hex)."""
    def bits(r):
        out = 0
        for x in r:
            out |= int(x, 16)
        return f"0x{out:x}"

    t = df.groupby(["shape", "S", "H", "D", "method"], sort=False).agg(
        tflops=("tflops", "median"), sm_mhz=("sm_mhz", "median"), power_w=("power_w", "median"),
        temp_c=("temp_c", "median"), windows=("window", "nunique"), reasons=("reasons", bits)).reset_index()
    t["tflops_per_ghz"] = t.tflops / (t.sm_mhz / 1000)
    t["j_per_pflop"] = t.power_w / t.tflops * 1000
    return t


def attention_clocks_ratios(table: pd.DataFrame) -> pd.DataFrame:
    """Per shape (:func:`attention_clocks_table`): ours / FA4 in TFLOP/s (sustained), the SM clock ours ran at over
    FA4's, ours / FA4 per clock (TFLOP/s per GHz), and power and energy per PFLOP of both. Shapes without FA4 rows
    are left out."""
    rows = []
    for shape, g in table.groupby("shape", sort=False):
        by = g.set_index("method")
        mine = next((m for m in ("gluon", "triton") if m in by.index), None)
        if mine is None or "fa4" not in by.index:
            continue
        o, f = by.loc[mine], by.loc["fa4"]
        rows.append(dict(shape=shape, S=int(o.S), H=int(o.H), D=int(o.D), ours_tflops=o.tflops, fa_tflops=f.tflops,
                         ours_over_fa=o.tflops / f.tflops, ours_mhz=o.sm_mhz, fa_mhz=f.sm_mhz,
                         clock_ratio=o.sm_mhz / f.sm_mhz, ours_over_fa_per_clock=o.tflops_per_ghz / f.tflops_per_ghz,
                         ours_w=o.power_w, fa_w=f.power_w, ours_j_per_pflop=o.j_per_pflop,
                         fa_j_per_pflop=f.j_per_pflop))
    return pd.DataFrame(rows)


def _ladder_labels(cfgs: list[dict]) -> list[str]:
    """xstage.ulysses.AttnConfig.label of each config dict (this module needs no torch)."""
    out = []
    for c in cfgs:
        if c.get("kernel") == "gluon":   # xstage.ulysses_gluon.GluonConfig.label
            ml = ("-ml" if c.get("mask_last") else "") + ("-pp" if c.get("pingpong") else "") + \
                ("-nb" if c.get("named_pp") else "") + ("-pe" if c.get("persistent") else "") + \
                ("-lp" if c.get("peel_last") else "") + ("-rv" if c.get("reverse_kv") else "") + \
                ("-jr" if c.get("joint_release") else "")
            out.append(f"gluon-ws-{c['block_m']}x{c['block_n']}s{c['stages']}r{c['regs']}{ml}" if c.get("ws") else
                       f"gluon-{c['block_m']}x{c['block_n']}w{c['num_warps']}s{c['stages']}{ml}")
            continue
        sw = "".join(f"-{n}" for n, k in (("tma", "tma"), ("ws", "ws"), ("pers", "persistent"), ("pipe", "pipe"),
                                           ("sq", "scale_q")) if c.get(k))
        if c.get("persistent") and c.get("per_sm", 1) > 1:
            sw = sw.replace("-pers", f"-pers{c['per_sm']}")
        if c.get("maxnreg"):
            sw += f"-r{c['maxnreg']}"
        out.append(f"{c['block_m']}x{c['block_n']}w{c['num_warps']}s{c['num_stages']}{sw}")
    return out


def ulysses_headline(df: pd.DataFrame) -> dict:
    """The numbers the notebook's captions quote (each with the shape it comes from): the maximum fused
    sender-visible and end-to-end speedup over serial, the largest fused / attention-alone ratio, and the
    range of our attention's TFLOP/s over cuDNN SDPA's. Keys absent when the data lacks the methods."""
    out = {"shapes": int(df["shape"].nunique()), "ranks": sorted(int(p) for p in set(df.P))}
    sp = ulysses_speedups(df)
    for line in ("fused_sv", "fused_e2e"):
        s = sp[sp.line == line]
        if len(s):
            best = s.loc[s.speedup.idxmax()]
            out[f"max_speedup_{line.split('_')[1]}"] = (float(best.speedup), str(best["shape"]), int(best.P))
    r = ulysses_ratios(df)
    for key, col, pick in (("max_fused_over_attn", "fused_sv", "idxmax"),
                           ("min_attention_over_sdpa", "attention_over_sdpa", "idxmin"),
                           ("max_attention_over_sdpa", "attention_over_sdpa", "idxmax")):
        v = r[col].dropna()
        if len(v):
            i = getattr(v, pick)()
            out[key] = (float(v[i]), str(r.loc[i, "shape"]), int(r.loc[i, "P"]))
    return out


def ulysses_goals(df: pd.DataFrame, world: str = "") -> pd.DataFrame:
    """The Ulysses study's goals table (index.html, via ``xstage.report.export_goals``): one clock per ratio.
    Rows: the largest fused / serial end to end (beside the paper's 1.43x, which is sender-visible on 8 GPUs: a
    comparison, not a pass mark), the largest fused layer (end to end) / attention alone (goal <=
    FUSED_OVER_ATTENTION_GOAL) and the smallest attention / cuDNN SDPA TFLOP/s at S >= 8K (goal >=
    ATTENTION_OVER_CUDNN_GOAL). ``met`` is None where the data has no value. Columns: quantity, ours, paper,
    goal, met."""
    tag = f" ({world})" if world else ""
    sp = ulysses_speedups(df)
    r = ulysses_ratios(df)
    e2e = sp[sp.line == "fused_e2e"].speedup
    sv = r.fused_e2e.dropna()
    big = r[r.S >= 8192].attention_over_sdpa.dropna()
    val = lambda x, f: float(f(x)) if len(x) else None  # noqa: E731
    rows = [dict(quantity=f"max fused / serial, end to end{tag}", ours=val(e2e, np.max),
                 paper=f"{paper_number('ulysses', 'fa3_max_sender_visible_speedup'):g}x (sender-visible, 8 GPUs, FA3)",
                 goal=None, met=None),
            dict(quantity=f"max fused layer (end to end) / attention alone{tag}", ours=val(sv, np.max), paper=None,
                 goal=f"<= {FUSED_OVER_ATTENTION_GOAL:g}"),
            dict(quantity=f"min our attention / cuDNN SDPA TFLOP/s, S >= 8K{tag}", ours=val(big, np.min), paper=None,
                 goal=f">= {ATTENTION_OVER_CUDNN_GOAL:g}")]
    rows[1]["met"] = None if rows[1]["ours"] is None else rows[1]["ours"] <= FUSED_OVER_ATTENTION_GOAL
    rows[2]["met"] = None if rows[2]["ours"] is None else rows[2]["ours"] >= ATTENTION_OVER_CUDNN_GOAL
    return pd.DataFrame(rows, columns=["quantity", "ours", "paper", "goal", "met"])


# ------------------------------------------------------------------------------------------- study 3: MegaMoE
# Legend: a configuration = (shape, tokens per rank T, routing) of xstage.moe_plan.CASES (84 of them), per rank count
# P and dtype; "config" names it <shape>_T<tokens>_<routing> (MoECase.name).
MEGAMOE_KEYS = ["shape", "tokens", "routing", "P", "dtype"]
MEGAMOE_BASELINE = "expert_wave"       # the schedule every kernel speedup divides
MODEL_TOLERANCE = 0.10                 # |predicted - measured| / measured speedup counted as "within"
FUSED_OVER_UNFUSED_GOAL = 1.3          # geomean of unfused_ms / layer_ms (the issue's goal)
GEMM_OVER_GROUPED_MM_GOAL = 0.7        # our compute-only kernel's TFLOP/s / torch._grouped_mm's (same rows)
_MEGAMOE_MEDIANS = ["kernel_ms", "predicted_ms", "predicted_speedup", "layer_ms", "unfused_ms", "compute_ms",
                    "grouped_mm_ms", "compute_sched_ms", "rows"]
_MEGAMOE_DIMS = ["hidden", "intermediate", "experts", "topk"]


class NoRecordedData(data.DataError):
    """A study's recorded data for this machine (or this selection of it) does not exist yet: a notebook says
    so in one line and skips its figures instead of failing."""


def _names(value, what: str, allowed: tuple[str, ...]) -> list[str]:
    """A non-empty list of distinct names, each in ``allowed``; ValueError naming the parameter otherwise."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ValueError(f"{what} must be a list of names, e.g. {list(allowed[:2])}, got {value!r}")
    bad = [v for v in value if v not in allowed]
    if bad:
        raise ValueError(f"{what}: unknown {', '.join(map(repr, bad))}; choose from {', '.join(allowed)}")
    if not value:
        raise ValueError(f"{what} must name at least one of {', '.join(allowed)}")
    if len(set(value)) != len(value):
        raise ValueError(f"{what} lists a name twice: {list(value)}")
    return list(value)


def megamoe_selection(dtypes=None, schedules=None, shapes=None) -> dict[str, list[str]]:
    """Checked notebook parameters of the MegaMoE study (None = all): ``dtypes`` of xstage.moe_plan.DTYPES_GPU,
    ``schedules`` of xstage.moe_plan.SCHEDULES (compared with expert_wave, which is always added as the baseline;
    at least one other), ``shapes`` by name of xstage.moe_plan.SHAPES. Returns them as lists (table order)."""
    from .moe_plan import DTYPES_GPU, SCHEDULES, SHAPES

    shape_names = tuple(s.name for s in SHAPES)
    sel = {"dtypes": _names(list(DTYPES_GPU) if dtypes is None else dtypes, "dtypes", DTYPES_GPU),
           "schedules": _names(list(SCHEDULES) if schedules is None else schedules, "schedules", SCHEDULES),
           "shapes": _names(list(shape_names) if shapes is None else shapes, "shapes", shape_names)}
    others = [s for s in SCHEDULES if s != MEGAMOE_BASELINE]
    if not set(sel["schedules"]) & set(others):
        raise ValueError(f"schedules must name at least one of {', '.join(others)} (compared with "
                         f"{MEGAMOE_BASELINE}), got {sel['schedules']}")
    sel["schedules"] = [s for s in SCHEDULES if s in sel["schedules"] or s == MEGAMOE_BASELINE]
    sel["dtypes"] = [d for d in DTYPES_GPU if d in sel["dtypes"]]
    sel["shapes"] = [s for s in shape_names if s in sel["shapes"]]
    return sel


def megamoe_expected(shapes=None) -> list[str]:
    """Names of the configurations a complete record holds per dtype: the 84 of xstage.moe_plan.CASES, or those of
    ``shapes`` (table order)."""
    from .moe_plan import CASES

    shapes = megamoe_selection(shapes=shapes)["shapes"]
    return [c.name for c in CASES if c.shape.name in shapes]


def megamoe_data(source: str = "auto", machine: str = "h200x2", out: str | Path | None = None,
                 dtypes=None, shapes=None, assignment: str = "static") -> tuple[pd.DataFrame, dict]:
    """MegaMoE rows (schema xstage.data.MEGAMOE: per configuration, dtype, schedule) and provenance.

    source:  recorded (data/<machine>/megamoe.csv or .csv.gz), gpu (run or resume the sweep on every visible
             GPU into ``out``), or auto (gpu when two GPUs are visible, else recorded). No simulated source.
    machine: the folder under data/ (recorded); gpu ignores it (the default folder is named after this
             machine's GPUs, see :func:`_default_out`).
    out:     where a gpu sweep writes; a folder already holding a sweep resumes it.
    dtypes, shapes: the selection (:func:`megamoe_selection`; None = all): what a gpu sweep runs and which
             recorded rows are returned.
    assignment: static (data/<machine>/) or dynamic (data/<machine>/dynamic/): how the kernel's programs took
             tasks (``xstage.moe_plan.ASSIGNMENTS``); a gpu sweep runs with it.
    Recorded data that is not there (no file, or no row of the selection) raises :class:`NoRecordedData`.
    """
    from .moe_plan import ASSIGNMENTS, CASES

    MEGAMOE = data.MEGAMOE
    if assignment not in ASSIGNMENTS:
        raise ValueError(f"assignment must be one of {', '.join(ASSIGNMENTS)}, got {assignment!r}")

    sel = megamoe_selection(dtypes=dtypes, shapes=shapes)
    sub = "dynamic" if assignment == "dynamic" else ""

    def recorded() -> Path:
        folder = data.machine_dir(machine) / (sub or "megamoe")
        if not data.paths(folder, MEGAMOE)[0].is_file():
            have = sorted(p.name for p in data.DATA_ROOT.iterdir() if data.paths(p / "megamoe", MEGAMOE)[0].is_file()) \
                if data.DATA_ROOT.is_dir() else []
            what = "" if assignment == "static" else " with dynamic assignment"
            how = "" if assignment == "static" else f" --assignment dynamic --out data/{machine}/dynamic"
            raise NoRecordedData(f"no recorded MegaMoE data{what} for machine {machine}; run `xstage sweep megamoe"
                                 f"{how}` on 2 GPUs" + (f" (recorded machines: {', '.join(have)})" if have else ""))
        return folder

    def run(folder: Path) -> None:
        import torch

        from .moe_sweep import run_megamoe

        cases = [c for c in CASES if c.shape.name in sel["shapes"]]
        run_megamoe(folder, recorded_params, world_size=torch.cuda.device_count(), dtypes=sel["dtypes"],
                    cases=cases, assignment=assignment,
                    command=f"xstage.studies.megamoe_data('gpu', dtypes={sel['dtypes']}, shapes={sel['shapes']}, "
                            f"assignment={assignment!r})")

    df, meta, folder = _source_data(source, MEGAMOE, "the MegaMoE study", recorded, run, out,
                                    gpu_folder=lambda f: f / sub if sub else f)
    keep = df.dtype.isin(sel["dtypes"]) & df["shape"].isin(sel["shapes"])
    if not keep.any():
        raise NoRecordedData(f"{data.paths(folder, MEGAMOE)[0]} has no rows of dtypes {sel['dtypes']} and shapes "
                             f"{sel['shapes']} yet ({len(df)} rows of others)")
    return df[keep].reset_index(drop=True), meta


def megamoe_config_names(t: pd.DataFrame) -> pd.Series:
    """``<shape>_T<tokens>_<routing>`` per row (xstage.moe_plan.MoECase.name)."""
    return t["shape"].astype(str) + "_T" + t.tokens.astype(str) + "_" + t.routing.astype(str)


def _megamoe_order(t: pd.DataFrame, extra: list[str]) -> pd.DataFrame:
    """Rows in table order (xstage.moe_plan.CASES: shapes, tokens, routings), then by P, dtype and ``extra``;
    configurations outside the table last."""
    from .moe_plan import CASES

    pos = {c.name: i for i, c in enumerate(CASES)}
    t = t.assign(_pos=t.config.map(pos).fillna(len(pos)))
    return t.sort_values(["_pos", "config", "P", "dtype"] + extra).drop(columns="_pos").reset_index(drop=True)


def megamoe_speedups(df: pd.DataFrame) -> pd.DataFrame:
    """Per configuration, rank count, dtype and schedule (medians of the recorded rows; a sweep records one):

      speedup           expert_wave kernel_ms / this schedule's kernel_ms (1 for expert_wave itself)
      predicted_speedup the Burst-Gap model's expert_wave / this schedule (recorded)
      model_error       (predicted_speedup - speedup) / speedup
      fused_speedup     unfused_ms / layer_ms: the fused layer with this schedule against NCCL all_to_all +
                        torch._grouped_mm (the unfused baseline)
      gemm_efficiency   grouped_mm_ms / compute_ms: our kernel with every combine store local (compute only)
                        against torch._grouped_mm on the same rows = ratio of their TFLOP/s; NaN where the data
                        has no grouped_mm_ms (older records) or it is NaN
      compute_tflops, grouped_mm_tflops   GEMM FLOPs of the busiest rank's rows / compute_ms, / grouped_mm_ms

    A configuration without an expert_wave row keeps its rows, with NaN speedups (never dropped). Columns:
    config, shape, tokens, routing, P, dtype, schedule, the dimensions, the medians and the ratios above."""
    from .moe_plan import SCHEDULES, gemm_flops

    if df.empty:
        raise ValueError("no MegaMoE rows")
    d = df.assign(**{c: np.nan for c in ("grouped_mm_ms", "compute_sched_ms") if c not in df})
    t = d.groupby(MEGAMOE_KEYS + ["schedule"])[_MEGAMOE_MEDIANS].median().reset_index()
    dims = d.groupby(MEGAMOE_KEYS)[_MEGAMOE_DIMS].first()
    base = t[t.schedule == MEGAMOE_BASELINE].set_index(MEGAMOE_KEYS).kernel_ms.rename("expert_wave_ms")
    t = t.join(dims, on=MEGAMOE_KEYS).join(base, on=MEGAMOE_KEYS)
    t["speedup"] = t.expert_wave_ms / t.kernel_ms
    t["model_error"] = (t.predicted_speedup - t.speedup) / t.speedup
    t["fused_speedup"] = t.unfused_ms / t.layer_ms
    t["gemm_efficiency"] = t.grouped_mm_ms / t.compute_ms
    flops = gemm_flops(t.rows.astype(float), t.hidden.astype(float), t.intermediate.astype(float))
    t["compute_tflops"] = flops / (t.compute_ms * 1e-3) / 1e12
    t["grouped_mm_tflops"] = flops / (t.grouped_mm_ms * 1e-3) / 1e12
    t.insert(0, "config", megamoe_config_names(t))
    t["_s"] = t.schedule.map({s: i for i, s in enumerate(SCHEDULES)}).fillna(len(SCHEDULES))
    return _megamoe_order(t, ["_s", "schedule"]).drop(columns="_s")


def megamoe_summary(df: pd.DataFrame, schedules=None, shapes=None,
                    tolerance: float = MODEL_TOLERANCE) -> pd.DataFrame:
    """One row per (dtype, schedule) over the configurations (every one the data has; none dropped):

      configs                configurations with a measured speedup (expert_wave and this schedule timed)
      expected               configurations of a complete record per dtype (84, or those of ``shapes``)
      geomean_speedup, max_speedup, max_config   over expert_wave (kernel time)
      geomean_predicted      the model's predicted speedup, geomean over the same configurations
      within_tolerance       fraction of configurations whose |model_error| <= ``tolerance`` (0.1)
      median_abs_model_error
      fused_geomean, fused_min   unfused_ms / layer_ms (the fused layer over the unfused baseline)
      gemm_efficiency_geomean    grouped_mm_ms / compute_ms (NaN without grouped_mm_ms); per dtype, the same
                                 on every schedule's row (compute_ms is the compute-only expert_wave kernel)

    schedules: which rows (None = those in the data, table order); expert_wave's row has speedup 1 and no
    model error, and its fused columns are the Expert-Wave layer's."""
    from .moe_plan import SCHEDULES

    sp = megamoe_speedups(df)
    keep = [s for s in SCHEDULES if s in set(sp.schedule) and (schedules is None or s in schedules)]
    sp = sp[sp.schedule.isin(keep)]
    other = sp.schedule != MEGAMOE_BASELINE
    abs_err = sp.model_error.abs().where(other)
    sp = sp.assign(abs_err=abs_err, within=(abs_err <= tolerance).astype(float).where(abs_err.notna()))
    g = sp.groupby(["dtype", "schedule"], sort=False)
    out = pd.DataFrame({
        "configs": g.speedup.count(), "geomean_speedup": g.speedup.apply(geomean),
        "max_speedup": g.speedup.max(), "geomean_predicted": g.predicted_speedup.apply(geomean),
        "within_tolerance": g.within.mean(), "median_abs_model_error": g.abs_err.median(),
        "fused_geomean": g.fused_speedup.apply(geomean), "fused_min": g.fused_speedup.min(),
        "gemm_efficiency_geomean": g.gemm_efficiency.apply(geomean)})
    best = sp.dropna(subset=["speedup"])
    best = best.loc[best.groupby(["dtype", "schedule"]).speedup.idxmax()].set_index(["dtype", "schedule"]).config
    out.insert(3, "max_config", best.reindex(out.index))
    out.loc[out.index.get_level_values("schedule") == MEGAMOE_BASELINE, "max_config"] = None
    out.insert(1, "expected", len(megamoe_expected(shapes)))
    out = out.reset_index()
    out["_s"] = out.schedule.map({s: i for i, s in enumerate(SCHEDULES)})
    return out.sort_values(["dtype", "_s"]).drop(columns="_s").reset_index(drop=True)


def megamoe_coverage(df: pd.DataFrame, dtypes=None, shapes=None, schedules=None) -> pd.DataFrame:
    """Per dtype and rank count: how many of the expected configurations (:func:`megamoe_expected`) the data
    has at all (``present``) and with a kernel time of expert_wave and of every one of ``schedules``
    (``complete``; None = every schedule in the data), and the names of those absent (``missing``; table
    order). A dtype without a single row is still listed (present 0). Columns: dtype, P, expected, present,
    complete, missing."""
    sel = megamoe_selection(dtypes=dtypes, shapes=shapes, schedules=schedules)
    want = megamoe_expected(sel["shapes"])
    need = [MEGAMOE_BASELINE] + [s for s in (sel["schedules"] if schedules is not None else
                                             sorted(set(df.schedule))) if s != MEGAMOE_BASELINE]
    d = df.assign(config=megamoe_config_names(df))
    times = d.pivot_table(index=["dtype", "P", "config"], columns="schedule", values="kernel_ms", aggfunc="median")
    times = times.reindex(columns=need)
    done = times.notna().all(axis=1).rename("done").reset_index()
    ranks = sorted(set(int(p) for p in d.P)) or [pd.NA]
    grid = pd.MultiIndex.from_product([sel["dtypes"], ranks], names=["dtype", "P"]).to_frame(index=False)
    got = done[done.config.isin(want)].groupby(["dtype", "P"]).agg(
        present=("config", "nunique"), complete=("done", "sum"), names=("config", set))
    out = grid.join(got, on=["dtype", "P"]) if len(got) else grid.assign(present=0, complete=0, names=None)
    out["present"] = out.present.fillna(0).astype(int)
    out["complete"] = out.complete.fillna(0).astype(int)
    out["missing"] = [[w for w in want if not (isinstance(n, set) and w in n)] for n in out.names]
    out.insert(2, "expected", len(want))
    return out.drop(columns="names")


def megamoe_coverage_line(cov: pd.DataFrame, show: int = 3) -> str:
    """One line from :func:`megamoe_coverage`: 'bf16: 84 of 84 configurations (84 with every schedule); fp8:
    60 of 84 ..., missing a, b, c, ... (+21 more)', naming the first ``show`` missing configurations (0: none)."""
    parts = []
    for r in cov.itertuples(index=False):
        p = "" if pd.isna(r.P) or cov.P.nunique() < 2 else f", P={r.P}"
        s = f"{r.dtype}{p}: {r.present} of {r.expected} configurations ({r.complete} with every schedule)"
        if r.missing and show:
            more = f", ... (+{len(r.missing) - show} more)" if len(r.missing) > show else ""
            s += f", missing {', '.join(r.missing[:show])}{more}"
        parts.append(s)
    return "; ".join(parts)


def megamoe_goals(summary: pd.DataFrame, schedule: str = "interleaved") -> pd.DataFrame:
    """The study's goals against :func:`megamoe_summary` of ``schedule`` (the paper's interleaved by default),
    per dtype: its geomean and maximum speedup over Expert-Wave beside the paper's (data/paper/headline.csv),
    the fraction of configurations the model predicts within the tolerance (goal: all), the fused layer over
    the unfused baseline (geomean, goal >= FUSED_OVER_UNFUSED_GOAL) and the GEMM phases over torch._grouped_mm
    (geomean, goal >= GEMM_OVER_GROUPED_MM_GOAL; NaN without grouped_mm_ms). ``met`` is None where the data has
    no value; the paper's numbers are a comparison (8 GPUs), not a pass mark. Columns: quantity, dtype,
    schedule, configs, expected, ours, target, met."""
    rows = summary[summary.schedule == schedule]
    if rows.empty:
        raise ValueError(f"the summary has no {schedule} rows; schedules: {sorted(set(summary.schedule))}")
    specs = [("geomean speedup over Expert-Wave (paper, 8 GPUs)", "geomean_speedup",
              paper_number("megamoe", "geomean_speedup"), None),
             ("max speedup over Expert-Wave (paper, 8 GPUs)", "max_speedup", paper_number("megamoe", "max_speedup"),
              None),
             (f"model within ±{MODEL_TOLERANCE:.0%} of measured (fraction of configurations)", "within_tolerance",
              1.0, "ge"),
             ("fused layer / unfused baseline (geomean)", "fused_geomean", FUSED_OVER_UNFUSED_GOAL, "ge"),
             ("GEMM phases / torch._grouped_mm (geomean)", "gemm_efficiency_geomean", GEMM_OVER_GROUPED_MM_GOAL,
              "ge")]
    out = pd.concat([rows.assign(quantity=q, ours=rows[col], target=t, _cmp=cmp) for q, col, t, cmp in specs],
                    ignore_index=True)
    out["met"] = (out.ours >= out.target).astype(object).where(out._cmp.notna() & out.ours.notna(), None)
    return out[["quantity", "dtype", "schedule", "configs", "expected", "ours", "target", "met"]]


def megamoe_order_cost(df: pd.DataFrame, drain_gbps: float) -> pd.DataFrame:
    """Can the X-Stage explain a schedule's kernel time difference from Expert-Wave? Per configuration, dtype and
    compared schedule (from :func:`megamoe_speedups`):

      extra_ms        this schedule's kernel_ms - Expert-Wave's (positive: slower)
      drain_ms        the busiest rank's remote combine bytes / ``drain_gbps``: the time the stage needs to drain
                      the whole combine. Even with every remote store serialised behind the drain, a schedule
                      can gain or lose at most about this much through the X-Stage
      beyond_stage    |extra_ms| > drain_ms: the difference is something else (tile order, waits, caches)
      ew_comm_share   Expert-Wave's kernel_ms / compute_ms - 1: what its remote combine costs over the same
                      kernel with every store local (0: the combine is hidden already; nothing left to win)
      order_ms        this schedule's compute-only control - Expert-Wave's (``compute_sched_ms``, records of
                      schema v2; NaN before): the difference its tile order makes without any remote store
      comm_ms         kernel_ms - compute_sched_ms: what the remote combine costs this schedule (v2; else NaN)

    ``drain_gbps``: the Burst-Gap drain rate the sweep predicted with (``meta['params']['prm']``)."""
    if not drain_gbps > 0:
        raise ValueError(f"drain_gbps must be > 0, got {drain_gbps}")
    sp = megamoe_speedups(df)
    remote = df.groupby(MEGAMOE_KEYS).remote_bytes.max().rename("remote_bytes")
    t = sp[sp.schedule != MEGAMOE_BASELINE].join(remote, on=MEGAMOE_KEYS)
    ew = sp[sp.schedule == MEGAMOE_BASELINE].set_index(MEGAMOE_KEYS)
    t = t.join((ew.kernel_ms / ew.compute_ms - 1).rename("ew_comm_share"), on=MEGAMOE_KEYS)
    t["extra_ms"] = t.kernel_ms - t.expert_wave_ms
    t["drain_ms"] = t.remote_bytes / (drain_gbps * 1e9) * 1e3
    t["beyond_stage"] = t.extra_ms.abs() > t.drain_ms
    t = t.join(ew.compute_sched_ms.rename("ew_compute_sched_ms"), on=MEGAMOE_KEYS)
    t["order_ms"] = t.compute_sched_ms - t.ew_compute_sched_ms
    t["comm_ms"] = t.kernel_ms - t.compute_sched_ms
    return t[["config", "shape", "tokens", "routing", "P", "dtype", "schedule", "kernel_ms", "expert_wave_ms",
              "compute_ms", "remote_bytes", "extra_ms", "drain_ms", "beyond_stage", "ew_comm_share", "order_ms",
              "comm_ms"]].reset_index(drop=True)


def megamoe_order_cost_line(cost: pd.DataFrame) -> str:
    """One sentence from :func:`megamoe_order_cost`, computed (per dtype)."""
    parts = []
    for d, g in cost.groupby("dtype", sort=False):
        ew = g.drop_duplicates("config").ew_comm_share
        parts.append(f"{d}: Expert-Wave's remote combine costs {ew.median():+.1%} over its compute-only control "
                     f"(median; {ew.min():+.1%} .. {ew.max():+.1%}); the schedules' time differences exceed the "
                     f"whole combine's drain time in {int(g.beyond_stage.sum())} of {len(g)} cases (median "
                     f"{g.extra_ms.median():+.3f} ms against a median drain of {g.drain_ms.median():.3f} ms)"
                     + (f"; the compute-only controls put {g.order_ms.median():+.3f} ms of it on the tile order and "
                        f"{g.comm_ms.median():+.3f} ms on the remote combine (medians)"
                        if g.order_ms.notna().any() else ""))
    return "; ".join(parts)


def megamoe_revised_model(df: pd.DataFrame, meta: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The current model (``xstage.moe_plan.predict_kernel_ns``: the busiest program, static assignment) applied to the
    recorded rows with the Burst-Gap parameters and SM count the sweep ran with (``meta``). Returns (rows with
    ``predicted_speedup`` replaced by the revised model's, so the parity figure can show it; a table per dtype and
    schedule: measured and both models' geomean speedups, the fraction within ±10 %, the median |error| and the
    correlation with the measured speedups)."""
    from .model import BurstGapParams, params_from_dict
    from .moe_plan import record_stall, record_wait, repredict

    recorded = meta.get("params", {}).get("prm")       # the parameters the sweep predicted with, if it kept them
    prm = params_from_dict(recorded) if recorded else BurstGapParams.reference()
    n_sms = int(meta.get("sm_count") or 132)
    rp = repredict(df, prm, n_sms, meta.get("params", {}).get("assignment", "static"), record_wait(meta),
                   record_stall(meta))
    keys = MEGAMOE_KEYS + ["schedule"]
    revised = df.drop(columns=["predicted_speedup"]).merge(
        rp[keys + ["model_speedup"]].rename(columns={"model_speedup": "predicted_speedup"}), on=keys, how="left")
    old, new = megamoe_speedups(df), megamoe_speedups(revised)
    old, new = (x[x.schedule != MEGAMOE_BASELINE] for x in (old, new))

    def stats(t: pd.DataFrame, tag: str) -> pd.DataFrame:
        g = t.groupby(["dtype", "schedule"], sort=False)
        return pd.DataFrame({
            f"{tag}_geomean": g.predicted_speedup.apply(geomean),
            f"{tag}_within_10pct": g.model_error.apply(lambda e: float((e.abs() <= MODEL_TOLERANCE).mean())),
            f"{tag}_median_abs_error": g.model_error.apply(lambda e: float(e.abs().median())),
            f"{tag}_corr": g.apply(lambda x: float(np.corrcoef(x.speedup, x.predicted_speedup)[0, 1])
                                   if len(x) > 2 else float("nan")),
        })
    measured = old.groupby(["dtype", "schedule"], sort=False).speedup.apply(geomean).rename("measured_geomean")
    table = pd.concat([measured, stats(old, "recorded_model"), stats(new, "revised_model")], axis=1).reset_index()
    return revised, table


def repredicted_speedups(df: pd.DataFrame, meta: dict, prm, wait: str | None = None,
                         stall: str | None = None) -> pd.DataFrame:
    """A recorded MegaMoE sweep's speedups over Expert-Wave (:func:`megamoe_speedups`, the baseline's rows
    dropped) with ``predicted_speedup`` re-predicted by the cost model (``moe_plan.repredict``) from stage
    parameters ``prm``, wait model ``wait`` (None: the record's own, moe_plan.record_wait) and stall model
    ``stall`` (None: the record's own, moe_plan.record_stall), for the record's SM count and task assignment, and
    for its observed rank where it timed one (a one-GPU record, sidecar ``params.observed_rank``)."""
    from .moe_plan import record_stall, record_wait, repredict

    p = meta.get("params", {})
    rp = repredict(df, prm, int(meta.get("sm_count") or 132), p.get("assignment", "static"),
                   wait or record_wait(meta), stall or record_stall(meta), observed_rank=p.get("observed_rank"))
    keys = MEGAMOE_KEYS + ["schedule"]
    t = df.drop(columns=["predicted_speedup"]).merge(
        rp[keys + ["model_speedup"]].rename(columns={"model_speedup": "predicted_speedup"}), on=keys, how="left")
    sp = megamoe_speedups(t)
    return sp[sp.schedule != MEGAMOE_BASELINE]


def megamoe_stage_model(df: pd.DataFrame, meta: dict, link: str = "nvlink") -> pd.DataFrame:
    """The MegaMoE cost model with the stage model of ``link`` (its fit in data/, xstage.model.load_params:
    the capacity the round's issuing programs see, the stall, the drain) on the recorded rows: per dtype and
    schedule, measured and predicted geomean speedups, the fraction within +-10 % and the median |error|."""
    from .model import load_params

    sp = repredicted_speedups(df, meta, load_params(data.machine_dir(LINK_MACHINES[link]), link))
    g = sp.groupby(["dtype", "schedule"], sort=False)
    return pd.DataFrame({
        "measured_geomean": g.speedup.apply(geomean), "stage_model_geomean": g.predicted_speedup.apply(geomean),
        "stage_model_within_10pct": g.model_error.apply(lambda e: float((e.abs() <= MODEL_TOLERANCE).mean())),
        "stage_model_median_abs_error": g.model_error.apply(lambda e: float(e.abs().median())),
    }).reset_index()


# The recorded MegaMoE sweeps by world and link (``xstage sweep megamoe --world W --link L``): machine folder,
# subfolder and the label every figure and table of it carries.
MEGAMOE_WORLDS = {
    ("gpus", "nvlink"): ("h200x2", "megamoe", "2 H200s, one rank per GPU, combine over NVLink"),
    ("one-gpu", "host"): ("h200x1", "megamoe_host",
                          "one H200, 2 ranks in one process, combine over PCIe to host memory"),
    ("one-gpu", "local"): ("h200x1", "megamoe_local",
                           "one H200, 2 ranks in one process, every combine store in GPU memory"),
}


def megamoe_world_label(meta: dict) -> str:
    """The world and link a MegaMoE record was measured in, from its sidecar (records before the one-GPU world
    were one process per GPU over NVLink): e.g. 'one H200, 2 ranks in one process, combine over PCIe to host
    memory (rank 0's times)'."""
    prm = meta.get("params", {})
    world, link = prm.get("world", "gpus"), prm.get("link", "nvlink")
    if (world, link) in MEGAMOE_WORLDS and (world != "gpus" or int(meta.get("gpu_count", 2)) == 2):
        label = MEGAMOE_WORLDS[(world, link)][2]
    else:
        label = f"{meta.get('gpu_count', '?')}x {meta.get('gpu_name', 'GPU')}, world {world}, link {link}"
    return label + (" (rank 0's times)" if world == "one-gpu" else "")


# Every recorded one-GPU host-link MegaMoE sweep (folders under data/h200x1/), newest first: round 10's defaults
# (tiles v5: fp8's BM 128 from 96 rows per expert; model_guided by the event walk's waits), round 9's defaults
# (tiles v4: fp8 through the TMA main loops with one stage more too; fp8 first, time-bounded, resumed call by call),
# round 7's defaults (tiles v3: bf16 through the TMA main loops; else as round 4; complete), round 4's defaults
# (dynamic assignment, tiles v2, order v3, tile swizzle 8) and session 4's (static assignment, tiles v1, order
# v1), which MEGAMOE_WORLDS still names as *the* host record (README, earlier sections of notebook 03).
# Round 12 (session 15): tiles v6 (fp8 one stage more), lag version 2; round 13 (session 16): order version 4
# (lag's releases aligned to swizzle groups); round 14 (session 18): round 13's defaults, the schedules timed in
# rounds (moe_sweep.TIMING "round_robin"; every record before it timed each schedule in a block of its own), first.
MEGAMOE_HOST_RECORDS = ("megamoe_pcie", "megamoe_round13_host", "megamoe_round12_host", "megamoe_round10_host", "megamoe_round9_host", "megamoe_round7_host",
                        "megamoe_host_v2", "megamoe_host")


def megamoe_defaults_label(meta: dict) -> str:
    """The kernel defaults a MegaMoE record ran with, from its sidecar: e.g. 'dynamic assignment, tiles v2,
    order v3, tile swizzle 8' (fields a record predates read as their first version: static, v1, row-block-major
    tiles)."""
    p = meta.get("params", {})
    sw = p.get("tile_swizzle")
    return (f"{p.get('assignment', 'static')} assignment, tiles v{p.get('tiles_version', 1)}, order "
            f"v{p.get('order_version', 1)}, " + (f"tile swizzle {sw}" if sw else "row-block-major tiles"))


def megamoe_world_data(world: str, link: str, dtypes=None, shapes=None,
                       record: str | None = None) -> tuple[pd.DataFrame, dict]:
    """The recorded MegaMoE sweep of ``world`` and ``link`` (:data:`MEGAMOE_WORLDS`): rows of the selection and
    provenance (with ``label``: :func:`megamoe_world_label`). :class:`NoRecordedData` when it is not in data/.
    ``record``: another folder of that world and link (one-GPU host link: :data:`MEGAMOE_HOST_RECORDS`); its
    label then also names the record and its defaults (:func:`megamoe_defaults_label`)."""
    if (world, link) not in MEGAMOE_WORLDS:
        raise ValueError(f"(world, link) must be one of {sorted(MEGAMOE_WORLDS)}, got {(world, link)!r}")
    machine, sub, label = MEGAMOE_WORLDS[(world, link)]
    if record is not None:
        known = MEGAMOE_HOST_RECORDS if (world, link) == ("one-gpu", "host") else (sub,)
        if record not in known:
            raise ValueError(f"record must be one of {', '.join(known)} for world {world}, link {link}, got "
                             f"{record!r}")
        sub = record
    sel = megamoe_selection(dtypes=dtypes, shapes=shapes)
    folder = data.machine_dir(machine) / sub
    if not data.paths(folder, data.MEGAMOE)[0].is_file():
        raise NoRecordedData(f"no recorded MegaMoE data for {label} (data/{machine}/{sub}); run `xstage sweep megamoe"
                             + (f" --world {world} --ranks 2 --link {link}" if world != "gpus" else "")
                             + f" --out data/{machine}{'/' + sub if sub else ''}`")
    df, meta = data.load(folder, data.MEGAMOE)
    df = df[df.dtype.isin(sel["dtypes"]) & df["shape"].isin(sel["shapes"])].reset_index(drop=True)
    if df.empty:
        raise NoRecordedData(f"{folder} has no rows of dtypes {sel['dtypes']} and shapes {sel['shapes']}")
    label = megamoe_world_label(meta)
    if record is not None:
        label += f"; data/{machine}/{record}: {megamoe_defaults_label(meta)}"
    return df, {**meta, "source": "recorded", "label": label}


def megamoe_timing_noise(df: pd.DataFrame) -> pd.DataFrame:
    """What the sweep's timing resolves, from one record's own rows: per dtype, the rows where model_guided chose
    expert_wave (the very same task list, timed again in its own block of the run) as ratios to Expert-Wave's
    (``same_list``: how many; ``kernel_min`` / ``kernel_max`` of kernel_ms, ``control_min`` / ``control_max`` of
    compute_sched_ms) and Expert-Wave's compute-only control measured twice (``compute_sched_ms`` /
    ``compute_ms``: ``ew_control_min``, ``ew_control_max``, ``ew_control_std`` of the log). A schedule's ratio
    inside these ranges is not a difference the sweep can tell from 1."""
    out = []
    for dt, g in df.groupby("dtype", sort=False):
        ew = g[g.schedule == MEGAMOE_BASELINE].set_index(MEGAMOE_KEYS)
        mg = g[g.schedule == "model_guided"]
        same = mg[mg.schedule_param.astype(str).str.split(",").str[0] == MEGAMOE_BASELINE].set_index(MEGAMOE_KEYS)
        base = ew.reindex(same.index)
        k, c = same.kernel_ms / base.kernel_ms, same.compute_sched_ms / base.compute_sched_ms
        twice = (ew.compute_sched_ms / ew.compute_ms).dropna()
        out.append(dict(dtype=dt, same_list=len(same), kernel_min=k.min(), kernel_max=k.max(), control_min=c.min(),
                        control_max=c.max(), ew_twice=len(twice), ew_control_min=twice.min(),
                        ew_control_max=twice.max(), ew_control_std=float(np.log(twice).std())))
    return pd.DataFrame(out)


def megamoe_schedule_controls(df: pd.DataFrame) -> pd.DataFrame:
    """The compute-only controls of one record, per dtype and schedule, over the configurations with both
    (records of schema v2: ``compute_sched_ms``): ``compute_only_geomean`` / ``compute_only_worst`` = this
    schedule's kernel with every combine store local / Expert-Wave's the same way (what its tile order costs,
    > 1: slower), and ``combine_cost_geomean`` / ``combine_cost_max`` = the schedule's kernel / its own
    compute-only control (what the remote combine adds to it)."""
    sp = megamoe_speedups(df)
    ew = sp[sp.schedule == MEGAMOE_BASELINE].set_index(MEGAMOE_KEYS).compute_sched_ms.rename("_ewc")
    t = sp.join(ew, on=MEGAMOE_KEYS)
    t = t.assign(order=t.compute_sched_ms / t._ewc, comb=t.kernel_ms / t.compute_sched_ms).dropna(
        subset=["order", "comb"])
    g = t.groupby(["dtype", "schedule"], sort=False)
    return pd.DataFrame({"controls": g.order.count(), "compute_only_geomean": g.order.apply(geomean),
                         "compute_only_worst": g.order.max(), "combine_cost_geomean": g.comb.apply(geomean),
                         "combine_cost_max": g.comb.max()}).reset_index()


def megamoe_links_table(records: dict) -> pd.DataFrame:
    """Records side by side ({label: (df, meta)}): per record, dtype and schedule the measured geomean and max
    speedup over Expert-Wave (:func:`megamoe_summary`, with the model the sweep predicted with: geomean predicted,
    fraction within ±10 %, median |error| of the speedup) and the compute-only controls
    (:func:`megamoe_schedule_controls`). Columns: record, dtype, schedule, configs, expected, geomean_speedup,
    max_speedup, geomean_predicted, within_tolerance, median_abs_model_error, compute_only_geomean,
    compute_only_worst, combine_cost_geomean, combine_cost_max."""
    out = []
    for label, (df, _) in records.items():
        summ = megamoe_summary(df)
        ctl = megamoe_schedule_controls(df)
        t = summ.merge(ctl, on=["dtype", "schedule"], how="left").assign(record=label)
        out.append(t[["record", "dtype", "schedule", "configs", "expected", "geomean_speedup", "max_speedup",
                      "geomean_predicted", "within_tolerance", "median_abs_model_error", "compute_only_geomean",
                      "compute_only_worst", "combine_cost_geomean", "combine_cost_max"]])
    if not out:
        raise ValueError("no records")
    return pd.concat(out, ignore_index=True)


def megamoe_headline(summary: pd.DataFrame, schedule: str = "interleaved") -> dict[str, str]:
    """One line per figure for its caption's ``ours`` (from :func:`megamoe_summary`): ``speedup``, ``model``,
    ``fused``, ``gemm``; each names the dtype and how many configurations of how many it covers."""
    s = summary[summary.schedule == schedule]
    if s.empty:
        raise ValueError(f"the summary has no {schedule} rows; schedules: {sorted(set(summary.schedule))}")
    n = lambda r: f"{r.configs}/{r.expected} configs"  # noqa: E731
    gemm = s.set_index("dtype").gemm_efficiency_geomean
    return {
        "speedup": "; ".join(f"{r.dtype}: {r.schedule} {r.geomean_speedup:.2f}x geomean, {r.max_speedup:.2f}x max "
                             f"over Expert-Wave ({n(r)})" for r in s.itertuples()),
        "model": "; ".join(f"{r.dtype}: {r.within_tolerance:.0%} of {r.schedule} configurations within "
                           f"±{MODEL_TOLERANCE:.0%} (median |error| {r.median_abs_model_error:.1%})"
                           for r in s.itertuples()),
        "fused": "; ".join(f"{r.dtype}: the fused layer ({r.schedule}) {r.fused_geomean:.2f}x the unfused baseline "
                           f"(geomean; goal >= {FUSED_OVER_UNFUSED_GOAL})" for r in s.itertuples()),
        "gemm": "; ".join(f"{d}: " + (f"{v:.2f}x torch._grouped_mm (geomean)" if pd.notna(v) else
                                      "torch._grouped_mm not recorded") for d, v in gemm.items()),
    }


# ----------------------------------------------------------------- MegaMoE on one GPU: GEMMs and order cost
MEGAMOE_GEMM_SUB = "megamoe_gemm"     # data/<machine>/megamoe_gemm/: xstage.moe_gemm's studies


def megamoe_gemm_data(machine: str = "h200x1") -> tuple[pd.DataFrame, dict]:
    """The recorded GEMM ladder / order-cost study (schema ``megamoe_gemm``, xstage.moe_gemm) of ``machine``:
    rows and provenance; :class:`NoRecordedData` when it is not in data/."""
    folder = data.machine_dir(machine) / MEGAMOE_GEMM_SUB
    if not data.paths(folder, data.MEGAMOE_GEMM)[0].is_file():
        raise NoRecordedData(f"no recorded MegaMoE GEMM study for {machine} (data/{machine}/{MEGAMOE_GEMM_SUB}); "
                             f"run `python3 scripts/megamoe_gemm.py --out data/{machine}/{MEGAMOE_GEMM_SUB}`")
    df, meta = data.load(folder, data.MEGAMOE_GEMM)
    return df, {**meta, "source": "recorded"}


def _config(df: pd.DataFrame) -> pd.Series:
    return megamoe_config_names(df)


def megamoe_gemm_ladder(df: pd.DataFrame) -> pd.DataFrame:
    """The version ladder (study ``ladder``): per configuration, dtype and variant of our kernel its TFLOP/s and
    its ratio to each library call of the same rounds (``vs_grouped_mm``, ``vs_scaled_grouped_mm``: ours / the
    library's TFLOP/s, NaN where the library call was unavailable), rank 0's rows, the float32-reference error."""
    d = df[df.study == "ladder"].assign(config=lambda x: _config(x))
    lib = {m: d[d.method == m].set_index(["config", "dtype"]).tflops
           for m in ("torch._grouped_mm", "torch._scaled_grouped_mm")}
    ours = d[d.method == "ours"].copy()
    idx = pd.MultiIndex.from_frame(ours[["config", "dtype"]])
    for m, col in (("torch._grouped_mm", "vs_grouped_mm"), ("torch._scaled_grouped_mm", "vs_scaled_grouped_mm")):
        ref = lib[m][~lib[m].index.duplicated()].reindex(idx).to_numpy(dtype=float)
        ours[col] = ours.tflops.to_numpy() / ref
        ours[m.replace("torch._", "") + "_tflops"] = ref
    return ours[["config", "dtype", "rows", "variant", "tiles", "is_default", "tflops", "grouped_mm_tflops",
                 "vs_grouped_mm", "scaled_grouped_mm_tflops", "vs_scaled_grouped_mm", "rel_l2"]].reset_index(
        drop=True)


def megamoe_gemm_summary(ladder: pd.DataFrame, min_rows: int = 2048) -> pd.DataFrame:
    """Per dtype and variant over the ladder's configurations: geomean and minimum of ours / each library, the
    minimum over configurations with >= ``min_rows`` rows on the rank, and the geomean TFLOP/s."""
    out = []
    for (dt, v), g in ladder.groupby(["dtype", "variant"], sort=False):
        big = g[g.rows >= min_rows]
        row = dict(dtype=dt, variant=v, tiles="; ".join(dict.fromkeys(g.tiles)), configs=len(g),
                   geomean_tflops=geomean(g.tflops))
        for col in ("vs_grouped_mm", "vs_scaled_grouped_mm"):
            row[f"{col}_geomean"] = geomean(g[col])
            row[f"{col}_min"] = float(g[col].min())
            row[f"{col}_min_big"] = float(big[col].min()) if len(big) else float("nan")
        out.append(row)
    return pd.DataFrame(out)


def megamoe_order_table(df: pd.DataFrame) -> pd.DataFrame:
    """The order-cost study (study ``order``): per dtype, assignment and schedule the compute-only time over
    Expert-Wave's under the same assignment (geomean and worst over the configurations, > 1: slower), and
    Expert-Wave's own time over static Expert-Wave's (what the assignment does to it)."""
    d = df[df.study == "order"].assign(config=lambda x: _config(x))
    if d.empty:
        return pd.DataFrame(columns=["dtype", "assignment", "schedule", "configs", "over_ew_geomean",
                                     "over_ew_worst", "ew_over_static_ew_geomean"])
    t = d.pivot_table(index=["config", "dtype"], columns=["schedule", "assignment"], values="ms", aggfunc="first")
    out = []
    for dt in dict.fromkeys(d.dtype):
        td = t.xs(dt, level="dtype")
        for a in dict.fromkeys(d.assignment):
            for s in dict.fromkeys(d.schedule):
                if (s, a) not in td.columns:
                    continue
                r = (td[(s, a)] / td[("expert_wave", a)]).dropna()
                ew = (td[("expert_wave", a)] / td[("expert_wave", "static")]).dropna()
                out.append(dict(dtype=dt, assignment=a, schedule=s, configs=len(r), over_ew_geomean=geomean(r),
                                over_ew_worst=float(r.max()), ew_over_static_ew_geomean=geomean(ew)))
    return pd.DataFrame(out)


def megamoe_sweep_gemm_ratio(df: pd.DataFrame, min_rows: int = 2048) -> pd.DataFrame:
    """A MegaMoE sweep's own GEMM comparison (``grouped_mm_ms`` / ``compute_ms``: ours / torch._grouped_mm
    TFLOP/s, bf16 grouped_mm also for fp8 rows), per dtype over its configurations: geomean, minimum, and the
    minimum over configurations with >= ``min_rows`` rows on the rank."""
    ew = df[df.schedule == "expert_wave"]
    out = []
    for dt, g in ew.groupby("dtype", sort=False):
        r = g.grouped_mm_ms / g.compute_ms
        out.append(dict(dtype=dt, configs=len(g), geomean=geomean(r), min=float(r.min()),
                        min_big=float(r[g.rows >= min_rows].min())))
    return pd.DataFrame(out)


# ----------------------------------------------------- MegaMoE on one GPU, round 3: all 84, tiles v2, order v2
MEGAMOE_ROUND3_SUB = "megamoe_round3"   # data/<machine>/megamoe_round3/: xstage.moe_gemm studies gemm, controls
MEGAMOE_GEMM_GOALS = dict(geomean=0.95, min_big=0.9, min_rows=2048)    # issue 15: ours / the library
MEGAMOE_ORDER_GOALS = dict(geomean=1.02, worst=1.05)                   # issue 15: schedule / Expert-Wave


MEGAMOE_ROUND4_SUB = "megamoe_round4"   # data/<machine>/megamoe_round4/: controls, the tile swizzle beside swizzle0


def megamoe_round3_data(machine: str = "h200x1", sub: str = MEGAMOE_ROUND3_SUB) -> tuple[pd.DataFrame, dict]:
    """The recorded studies (``gemm``, ``controls``; schema ``megamoe_gemm``) of ``machine`` in ``sub`` (round 3,
    or :data:`MEGAMOE_ROUND4_SUB`): rows and provenance; :class:`NoRecordedData` when they are not in data/."""
    folder = data.machine_dir(machine) / sub
    if not data.paths(folder, data.MEGAMOE_GEMM)[0].is_file():
        name, study = {MEGAMOE_ROUND4_SUB: ("round-4", "controls"), MEGAMOE_ROUND5_SUB: ("round-5", "tiles"),
                       MEGAMOE_ROUND6_GEMM_SUB: ("round-6", "tiles6"),
                       MEGAMOE_ROUND7_CONTROLS_SUB: ("round-7", "controls7"),
                       MEGAMOE_ROUND8_GEMM_SUB: ("bf16 GEMM", "gemm8"),
                       MEGAMOE_ROUND8_CONTROLS_SUB: ("round-8", "controls8"),
                       MEGAMOE_ROUND10_GEMM_SUB: ("round-10", "gemm10"),
                       MEGAMOE_ROUND10_CONTROLS_SUB: ("round-10", "controls7"),
                       MEGAMOE_ROUND11_LAGS_SUB: ("round-11", "lags11"),
                       MEGAMOE_ROUND11_GEMM_SUB: ("fp8 GEMM", "gemm10"),
                       MEGAMOE_ROUND12_CONTROLS_SUB: ("round-12", "controls7"),
                       MEGAMOE_ROUND13_CONTROLS_SUB: ("compute-only controls", "controls7"),
                       MEGAMOE_ROUND13_REPEAT_CONTROLS_SUB: ("round-13 repeat", "controls7"),
                       }.get(sub, ("round-3", "gemm"))
        raise NoRecordedData(f"no recorded MegaMoE {name} study for {machine} (data/{machine}/{sub});"
                             f" run `python3 scripts/megamoe_gemm.py --study {study} --out data/{machine}/{sub}`")
    df, meta = data.load(folder, data.MEGAMOE_GEMM)
    return df, {**meta, "source": "recorded"}


def megamoe_round3_gemm(df: pd.DataFrame) -> pd.DataFrame:
    """Study ``gemm``, per configuration and dtype (table order): our Expert-Wave compute-only time with the
    default tiles (default assignment) and with tiles version 1 (static, as the earlier records ran), fp8's BM =
    64 alternative where BM = 128 is the default, and the library of the same rounds; ratios are the library's
    time / ours (= ours / the library's TFLOP/s; > 1: ours faster), NaN where a call was unavailable."""
    d = df[(df.study == "gemm") & (df.status == "ok")].assign(config=lambda x: _config(x))
    if d.empty:
        return pd.DataFrame(columns=["config", "shape", "dtype", "rows", "tiles", "ours_ms", "v1_ms",
                                     "grouped_mm_ms", "scaled_grouped_mm_ms", "vs_grouped_mm",
                                     "v1_vs_grouped_mm", "vs_scaled_grouped_mm", "v1_vs_scaled_grouped_mm",
                                     "bm64_s3_vs_default"])
    key = ["config", "dtype"]

    def col(mask):
        x = d[mask].drop_duplicates(key).set_index(key)
        return x

    ours = col((d.method == "ours") & (d.variant == "default"))
    out = ours[["shape", "rows", "tiles"]].copy()
    out["ours_ms"] = ours.ms
    for name, mask in (("v1_ms", (d.method == "ours") & (d.variant == "v1")),
                       ("bm64_s3_ms", (d.method == "ours") & (d.variant == "bm64_s3")),
                       ("grouped_mm_ms", d.method == "torch._grouped_mm"),
                       ("scaled_grouped_mm_ms", d.method == "torch._scaled_grouped_mm")):
        out[name] = col(mask).ms.reindex(out.index)
    out["vs_grouped_mm"] = out.grouped_mm_ms / out.ours_ms
    out["v1_vs_grouped_mm"] = out.grouped_mm_ms / out.v1_ms
    out["vs_scaled_grouped_mm"] = out.scaled_grouped_mm_ms / out.ours_ms
    out["v1_vs_scaled_grouped_mm"] = out.scaled_grouped_mm_ms / out.v1_ms
    out["bm64_s3_vs_default"] = out.ours_ms / out.bm64_s3_ms          # > 1: the BM = 64 alternative was faster
    out = out.reset_index()
    order = {c.name: i for i, c in enumerate(_moe_cases())}
    return out.assign(_o=out.config.map(order)).sort_values(["dtype", "_o"], kind="stable").drop(
        columns="_o").reset_index(drop=True)


def _moe_cases():
    from .moe_plan import CASES
    return CASES


def megamoe_round3_gemm_summary(g: pd.DataFrame, min_rows: int = MEGAMOE_GEMM_GOALS["min_rows"]) -> pd.DataFrame:
    """Per dtype and ratio of :func:`megamoe_round3_gemm`: configurations, geomean, minimum, the minimum over
    configurations with >= ``min_rows`` rows on the rank, and whether the issue's goals (geomean >= 0.95, every
    >= min_rows configuration >= 0.9) are met."""
    out = []
    for dt, gd in g.groupby("dtype", sort=False):
        for col in ("vs_grouped_mm", "v1_vs_grouped_mm", "vs_scaled_grouped_mm", "v1_vs_scaled_grouped_mm"):
            r = gd[col].dropna()
            if r.empty:
                continue
            big = r[gd.loc[r.index, "rows"] >= min_rows]
            gm, mb = geomean(r), float(big.min()) if len(big) else float("nan")
            out.append(dict(dtype=dt, ratio=col, configs=len(r), geomean=gm, min=float(r.min()),
                            min_big=mb, big_configs=len(big),
                            geomean_met=bool(gm >= MEGAMOE_GEMM_GOALS["geomean"]),
                            min_big_met=bool(mb >= MEGAMOE_GEMM_GOALS["min_big"]) if len(big) else False))
    return pd.DataFrame(out)


def megamoe_round3_controls(df: pd.DataFrame, study: str = "controls") -> pd.DataFrame:
    """Study ``controls`` (or round 7's ``controls7``: dynamic only, ``ew_over_static`` NaN), per configuration,
    dtype, assignment, schedule and order variant: the compute-only
    time over Expert-Wave's under the same assignment and in the same rounds (``over_ew``, > 1: slower),
    Expert-Wave's over static Expert-Wave's (``ew_over_static``), and from the launch with per-task timestamps
    (dynamic only) each tile kind's median time over Expert-Wave's (``l1_tile_rel``, ``l2_tile_rel``), the busy
    share of the programs (``task_busy``) and the share of Linear-2 tiles that waited (``task_waited``)."""
    d = df[df.study == study].assign(config=lambda x: _config(x))
    cols = ["config", "dtype", "rows", "assignment", "schedule", "variant", "param", "ms", "over_ew",
            "ew_over_static", "l1_tile_rel", "l2_tile_rel", "task_busy", "ew_task_busy", "task_waited"]
    if d.empty:
        return pd.DataFrame(columns=cols)
    ew = d[(d.schedule == "expert_wave") & (d.variant == "default")].set_index(["config", "dtype", "assignment"])
    ew = ew[~ew.index.duplicated()]
    k = pd.MultiIndex.from_frame(d[["config", "dtype", "assignment"]])
    base = ew.reindex(k)
    if "static" not in set(ew.index.get_level_values("assignment")):
        return _over_expert_wave(d, base, cols, ew_over_static=np.full(len(d), np.nan))
    st = ew.xs("static", level="assignment").reindex(pd.MultiIndex.from_frame(d[["config", "dtype"]]))
    with np.errstate(divide="ignore", invalid="ignore"):
        return _over_expert_wave(d, base, cols, ew_over_static=base.ms.to_numpy() / st.ms.to_numpy())


def _over_expert_wave(d: pd.DataFrame, base: pd.DataFrame, cols, **more) -> pd.DataFrame:
    """Each row's compute-only time and median tile times over its Expert-Wave row ``base`` (aligned), in the
    84-configuration table's order (timestamps of 0 under the interpreter give NaN ratios)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out = d.assign(param=d.note, over_ew=d.ms.to_numpy() / base.ms.to_numpy(),
                       l1_tile_rel=d.task_l1_us.to_numpy() / base.task_l1_us.to_numpy(),
                       l2_tile_rel=d.task_l2_us.to_numpy() / base.task_l2_us.to_numpy(),
                       ew_task_busy=base.task_busy.to_numpy(), **more)
    order = {c.name: i for i, c in enumerate(_moe_cases())}
    return out.assign(_o=out.config.map(order)).sort_values(["dtype", "_o"], kind="stable")[cols].reset_index(
        drop=True)


def megamoe_round3_controls_summary(per: pd.DataFrame) -> pd.DataFrame:
    """Per dtype, assignment, schedule and order variant over :func:`megamoe_round3_controls`: configurations,
    geomean and worst of the compute-only time over Expert-Wave's, whether the issue's goal holds (geomean <=
    1.02, worst <= 1.05), Expert-Wave over static Expert-Wave, and the per-task evidence (geomean tile-time
    ratios, median busy share against Expert-Wave's, median share of Linear-2 tiles that waited)."""
    out = []
    for (dt, a, s, v), g in per.groupby(["dtype", "assignment", "schedule", "variant"], sort=False):
        r = g.over_ew.dropna()
        if r.empty:
            continue
        gm, worst = geomean(r), float(r.max())
        out.append(dict(dtype=dt, assignment=a, schedule=s, variant=v, configs=len(r), over_ew_geomean=gm,
                        over_ew_worst=worst, worst_config=g.loc[r.idxmax(), "config"],
                        goal_met=bool(gm <= MEGAMOE_ORDER_GOALS["geomean"] and worst <= MEGAMOE_ORDER_GOALS["worst"]),
                        ew_over_static_geomean=geomean(g.ew_over_static.dropna()),
                        l1_tile_rel=geomean(g.l1_tile_rel.dropna()) if g.l1_tile_rel.notna().any() else float("nan"),
                        l2_tile_rel=geomean(g.l2_tile_rel.dropna()) if g.l2_tile_rel.notna().any() else float("nan"),
                        task_busy=float(g.task_busy.median()), ew_task_busy=float(g.ew_task_busy.median()),
                        task_waited=float(g.task_waited.median())))
    return pd.DataFrame(out)


def megamoe_round3_coverage_line(df: pd.DataFrame) -> str:
    """'gemm: bf16 84 of 84, fp8 84 of 84 configurations; controls: ...': how many of the 84 configurations each
    round-3 study holds per dtype (they run in table order, none chosen or dropped)."""
    n = len(_moe_cases())
    parts = []
    for study in ("gemm", "controls"):
        d = df[df.study == study]
        per = [f"{dt} {len(g[['shape', 'tokens', 'routing']].drop_duplicates())} of {n}"
               for dt, g in d.groupby("dtype", sort=False)]
        parts.append(f"{study}: {', '.join(per) if per else 'none'} configurations")
    return "; ".join(parts)


# ------------------------------------------ MegaMoE on one GPU, round 5: tile variants beside the library, lists
MEGAMOE_ROUND5_SUB = "megamoe_round5"   # data/<machine>/megamoe_round5/: xstage.moe_gemm studies tiles, lists


def megamoe_round5_tiles(df: pd.DataFrame) -> pd.DataFrame:
    """Study ``tiles``, per configuration (table order): ``torch._grouped_mm``'s time / each of our variants'
    (the default and xstage.moe_gemm.TILES5_VARIANTS, same rounds; > 1: ours faster), one column per variant,
    with the configuration's shape and rows."""
    d = df[(df.study == "tiles") & (df.status == "ok")].assign(config=lambda x: _config(x))
    if d.empty:
        return pd.DataFrame(columns=["config", "shape", "dtype", "rows", "default"])
    key = ["config", "dtype"]
    lib = d[d.method == "torch._grouped_mm"].drop_duplicates(key).set_index(key).ms
    ours = d[d.method == "ours"].pivot_table(index=key, columns="variant", values="ms", aggfunc="first")
    out = ours.rdiv(lib.reindex(ours.index), axis=0)
    base = d[d.method == "ours"].drop_duplicates(key).set_index(key)[["shape", "rows"]]
    out = base.join(out).reset_index()
    order = {c.name: i for i, c in enumerate(_moe_cases())}
    out.columns.name = None
    return out.assign(_o=out.config.map(order)).sort_values(["dtype", "_o"], kind="stable").drop(
        columns="_o").reset_index(drop=True)


def megamoe_round5_tiles_summary(t: pd.DataFrame) -> pd.DataFrame:
    """Per dtype and variant of :func:`megamoe_round5_tiles` (every configuration the study holds: each has >=
    2048 rows on rank 0): configurations, geomean and minimum of ours / torch._grouped_mm, how many below the goal
    (0.9), the worst configuration; and the row ``best per shape``: per shape the variant with the highest
    geomean over that shape's configurations (chosen on these same rows: an in-sample rule, labelled so)."""
    variants = [c for c in t.columns if c not in ("config", "shape", "dtype", "rows")]
    out = []
    goal = MEGAMOE_GEMM_GOALS["min_big"]
    for dt, g in t.groupby("dtype", sort=False):
        for v in variants:
            r = g[v].dropna()
            if r.empty:
                continue
            out.append(dict(dtype=dt, variant=v, configs=len(r), geomean=geomean(r), min=float(r.min()),
                            below_goal=int((r < goal).sum()), worst_config=g.loc[r.idxmin(), "config"]))
        best = {sh: max(variants, key=lambda v: geomean(gs[v].dropna()) if gs[v].notna().any() else -1.0)
                for sh, gs in g.groupby("shape", sort=False)}
        r = pd.Series([row[best[row["shape"]]] for _, row in g.iterrows()], index=g.index).dropna()
        if len(r):
            out.append(dict(dtype=dt, variant="best per shape (in-sample): " + ", ".join(
                f"{sh} {v}" for sh, v in best.items()), configs=len(r), geomean=geomean(r), min=float(r.min()),
                below_goal=int((r < goal).sum()), worst_config=g.loc[r.idxmin(), "config"]))
    return pd.DataFrame(out)


def megamoe_round5_tiles_noise(t: pd.DataFrame, df: pd.DataFrame, variant: str = "swz16") -> pd.DataFrame:
    """Study tiles' noise floor and the tile order's effect: per configuration of :func:`megamoe_round5_tiles`
    whether ``variant`` (a tile-order variant: the default tiles with another swizzle) ran the very task list
    of the default (Expert-Wave, rank 0, rebuilt from the seeded routing: no expert has more row blocks than the
    default swizzle groups), and ``gain`` = its ours / grouped_mm over the default's. Over the identical lists the
    gain is timing noise of the same rounds; where the lists differ it is the tile order's effect plus that
    noise. Columns: config, shape, rows, same_list, max_row_blocks (rank 0's largest expert), gain."""
    from dataclasses import replace
    from .moe_plan import CASES, build_schedule, routing_of, tiles_of_row, TileGrid, TILE_SWIZZLE

    cases = {c.name: c for c in CASES}
    d = df[(df.study == "tiles") & (df.method == "ours")].assign(config=lambda x: _config(x))
    out = []
    for _, r in t.iterrows():
        c, sh = cases[r.config], cases[r.config].shape
        row = d[(d.config == r.config) & (d.variant == "default")].iloc[0]
        var = d[(d.config == r.config) & (d.variant == variant)].iloc[0]
        g0 = TileGrid.of(routing_of(c, 2)[2][0], sh.hidden, sh.intermediate, tiles_of_row(row), TILE_SWIZZLE)
        from .moe_plan import parse_schedule_param
        g1 = replace(g0, swizzle=parse_schedule_param(var.note)["swizzle"])
        same = bool(np.array_equal(build_schedule("expert_wave", g0, 132).tasks,
                                   build_schedule("expert_wave", g1, 132).tasks))
        out.append(dict(config=r.config, shape=r["shape"], rows=r.rows, same_list=same,
                        max_row_blocks=max(g0.row_blocks), gain=r[variant] / r["default"]))
    return pd.DataFrame(out)


def megamoe_round5_lists(df: pd.DataFrame) -> pd.DataFrame:
    """Study ``lists``, per configuration, dtype and list (xstage.moe_gemm.LISTS5; dynamic assignment, compute
    only, same rounds): the time over Expert-Wave's (``over_ew``), each tile kind's median time over Expert-Wave's
    (``l1_tile_rel``, ``l2_tile_rel``), the busy share of the programs and the share of Linear-2 tiles that
    waited, with the list's param (model_guided: its choice)."""
    d = df[df.study == "lists"].assign(config=lambda x: _config(x))
    cols = ["config", "dtype", "rows", "variant", "schedule", "param", "ms", "over_ew", "l1_tile_rel",
            "l2_tile_rel", "task_busy", "ew_task_busy", "task_waited"]
    if d.empty:
        return pd.DataFrame(columns=cols)
    key = ["config", "dtype"]
    ew = d[d.variant == "expert_wave"].drop_duplicates(key).set_index(key)
    base = ew.reindex(pd.MultiIndex.from_frame(d[key]))
    return _over_expert_wave(d, base, cols)


def megamoe_round5_lists_summary(per: pd.DataFrame) -> pd.DataFrame:
    """Per dtype and list of :func:`megamoe_round5_lists`: configurations, geomean and worst over Expert-Wave,
    the worst configuration, whether the issue's goal holds (geomean <= 1.02, worst <= 1.05), and the per-task
    evidence (geomean tile-time ratios, median busy share, median share of Linear-2 tiles that waited)."""
    out = []
    for (dt, v), g in per.groupby(["dtype", "variant"], sort=False):
        r = g.over_ew.dropna()
        if r.empty:
            continue
        gm, worst = geomean(r), float(r.max())
        out.append(dict(dtype=dt, variant=v, configs=len(r), over_ew_geomean=gm, over_ew_worst=worst,
                        worst_config=g.loc[r.idxmax(), "config"],
                        goal_met=bool(gm <= MEGAMOE_ORDER_GOALS["geomean"] and worst <= MEGAMOE_ORDER_GOALS["worst"]),
                        l1_tile_rel=geomean(g.l1_tile_rel.dropna()) if g.l1_tile_rel.notna().any() else float("nan"),
                        l2_tile_rel=geomean(g.l2_tile_rel.dropna()) if g.l2_tile_rel.notna().any() else float("nan"),
                        task_busy=float(g.task_busy.median()), task_waited=float(g.task_waited.median())))
    return pd.DataFrame(out)


# ---- MegaMoE round 6 (issue 15, item 2): the TMA main loops (xstage.moe_gemm study tiles6)
MEGAMOE_ROUND6_GEMM_SUB = "megamoe_round6_gemm"   # data/<machine>/megamoe_round6_gemm/: study tiles6


def megamoe_round6_tiles(df: pd.DataFrame) -> pd.DataFrame:
    """Study ``tiles6``, per configuration (table order): ``torch._grouped_mm``'s time / each of our variants' (the
    default pointer loops and xstage.moe_gemm.TILES6_VARIANTS, same rounds; > 1: ours faster), as
    :func:`megamoe_round5_tiles` computes it for study tiles."""
    return megamoe_round5_tiles(df[df.study == "tiles6"].assign(study="tiles"))


def megamoe_round6_tiles_summary(t: pd.DataFrame) -> pd.DataFrame:
    """Per variant of :func:`megamoe_round6_tiles`: geomean, minimum, how many below the goal (0.9), the worst
    configuration (:func:`megamoe_round5_tiles_summary`, whose "best per shape" row is in-sample)."""
    return megamoe_round5_tiles_summary(t)


# ---- MegaMoE round 7 (issue 15, items 3-5): tiles version 3 (bf16 through the TMA main loops) as the default; the
# compute-only controls (xstage.moe_gemm study controls7) and the host-link sweep (MEGAMOE_HOST_RECORDS[0]) re-run
MEGAMOE_ROUND7_CONTROLS_SUB = "megamoe_round7_controls"   # data/<machine>/megamoe_round7_controls/: controls7
MEGAMOE_ROUND7_HOST = "megamoe_round7_host"               # data/h200x1/megamoe_round7_host/: the host-link sweep
MEGAMOE_ROUND8_GEMM_SUB = "megamoe_gemm_bf16"             # data/h200x1/megamoe_gemm_bf16/: study gemm8 (bf16 vs torch._grouped_mm)
MEGAMOE_ROUND8_CONTROLS_SUB = "megamoe_round8_controls"     # data/h200x1/megamoe_round8_controls/: controls8
# ---- MegaMoE round 9 (issue 15, item 4): tiles version 4 (fp8 through TMA with one stage more) as the default; the
# host-link sweep re-recorded with it (fp8 first: only fp8's default changed), summarised as round 7's
MEGAMOE_ROUND9_HOST = "megamoe_round9_host"               # data/h200x1/megamoe_round9_host/: the host-link sweep
# ---- MegaMoE round 10 (issue 15, items 2-5): tiles version 5 (fp8's BM 128 from 96 rows per expert) and the dynamic
# wait model the event walk (model_guided's choices): study gemm10 (fp8, both row blocks, all 84), controls7 (both
# dtypes) and the host-link sweep re-recorded (scripts/megamoe_round10.sh)
MEGAMOE_ROUND10_GEMM_SUB = "megamoe_round10_gemm"           # data/h200x1/megamoe_round10_gemm/: study gemm10
MEGAMOE_ROUND10_CONTROLS_SUB = "megamoe_round10_controls"   # data/h200x1/megamoe_round10_controls/: controls7
MEGAMOE_ROUND10_HOST = "megamoe_round10_host"               # data/h200x1/megamoe_round10_host/: the host-link sweep
# ---- MegaMoE rounds 11-12 (issue 15, items 3-4; session 15): study lags11 (lag's lag, compute only) and gemm10 again
# (scripts/megamoe_round11.sh), then under the new defaults (tiles v6, lag version 2) controls7 and the host-link
# sweep (ROUND=megamoe_round12 scripts/megamoe_round10.sh), whose model errors are rescored per stall model
MEGAMOE_ROUND11_LAGS_SUB = "megamoe_round11_lags"           # data/h200x1/megamoe_round11_lags/: study lags11
MEGAMOE_ROUND11_GEMM_SUB = "megamoe_gemm_fp8"    # data/h200x1/megamoe_gemm_fp8/: gemm10 (fp8 vs torch._scaled_grouped_mm)
MEGAMOE_ROUND12_CONTROLS_SUB = "megamoe_round12_controls"   # data/h200x1/megamoe_round12_controls/: controls7
MEGAMOE_ROUND12_HOST = "megamoe_round12_host"               # data/h200x1/megamoe_round12_host/: the host-link sweep
# ---- MegaMoE round 13 (issue 15, items 3-4; session 16): order version 4 (lag's releases never split a swizzle
# group of row blocks), controls7 and the host-link sweep (ROUND=megamoe_round13 scripts/megamoe_round10.sh)
MEGAMOE_ROUND13_CONTROLS_SUB = "megamoe_controls"   # data/h200x1/megamoe_controls/: controls7
MEGAMOE_ROUND13_HOST = "megamoe_round13_host"               # data/h200x1/megamoe_round13_host/: the host-link sweep
# controls7 again under order version 4 in a new process (session 17, call S17-1: the repeat of session 16's S16-3,
# whose files were lost), and one pair (fp8 DeepSeek-V4-Pro T8192 uniform, lag 1.064 there) in five processes (S17-2)
MEGAMOE_ROUND13_REPEAT_CONTROLS_SUB = "megamoe_round13_repeat_controls"   # data/h200x1/<this>/: controls7
MEGAMOE_PAIR_PROCESSES_SUB = "megamoe_s17_pro8192"          # data/h200x1/<this>/p1 ... p5: controls7, one pair each
# ---- MegaMoE round 14 (issue 15; session 18, call S18-1): round 13's defaults, the host-link sweep with the schedules
# timed in rounds (one run of each per round: moe_sweep.TIMING "round_robin"), every timed run kept (runs.jsonl.gz)
MEGAMOE_ROUND14_HOST = "megamoe_pcie"               # data/h200x1/megamoe_pcie/: the host-link sweep
MEGAMOE_STALL_MODELS_SCORED = ("issuers", "round", "round_shared")


MEGAMOE_RUNS_FILES = ("runs.jsonl.gz", "runs.jsonl")     # every timed run of a sweep (moe_sweep.RUNS_ENV's lines)
MEGAMOE_RUN_KINDS = ("kernel_ms", "local_ms", "layer_ms")   # per run: the kernel alone, compute only, the layer


def megamoe_timed_runs(sub: str = MEGAMOE_ROUND14_HOST, machine: str = "h200x1") -> pd.DataFrame:
    """Every timed run of a MegaMoE sweep that printed them (``XSTAGE_MEGAMOE_RUNS=1``: one JSON line per
    configuration, dtype and schedule, kept as data/<machine>/<sub>/runs.jsonl[.gz]), long: config, dtype,
    schedule, run (0-based, the order timed; in a sweep timed in rounds run i of every schedule is round i) and
    the kernel-alone, compute-only and layer times. :class:`NoRecordedData` without the file; ValueError on a
    malformed one."""
    folder = data.machine_dir(machine) / sub
    path = next((folder / f for f in MEGAMOE_RUNS_FILES if (folder / f).is_file()), None)
    if path is None:
        raise NoRecordedData(f"no timed runs recorded in data/{machine}/{sub}/ ({' or '.join(MEGAMOE_RUNS_FILES)}); "
                             f"run the sweep with XSTAGE_MEGAMOE_RUNS=1 and keep its 'megamoe-runs' lines")
    raw = pd.read_json(path, lines=True)
    need = ["config", "dtype", "schedule", *MEGAMOE_RUN_KINDS]
    missing = [c for c in need if c not in raw.columns]
    if missing or raw.empty:
        raise ValueError(f"{path}: malformed timed runs (missing {', '.join(missing) or 'every line'})")
    out = []
    for r in raw.itertuples(index=False):
        cols = {k: np.asarray(getattr(r, k), np.float64) for k in MEGAMOE_RUN_KINDS}
        n = {len(v) for v in cols.values()}
        if len(n) != 1 or not all(np.isfinite(v).all() and (v > 0).all() for v in cols.values()):
            raise ValueError(f"{path}: {r.config} {r.dtype} {r.schedule}: runs of unequal length or not positive")
        out.append(pd.DataFrame({"config": r.config, "dtype": r.dtype, "schedule": r.schedule,
                                 "run": np.arange(n.pop()), **cols}))
    return pd.concat(out, ignore_index=True)


def megamoe_run_drift(runs: pd.DataFrame, quarter: float = 0.25) -> pd.DataFrame:
    """How a configuration's timed runs move while it is timed (:func:`megamoe_timed_runs`): per config, dtype and
    schedule the kernel-alone median (``ms``), its ``rise`` (median of the last ``quarter`` of the runs over the
    first quarter's, minus 1), and, beside Expert-Wave's runs of the same index (one round each in a sweep timed in
    rounds), the ratio of medians (``over_ew``), the median of the per-round ratios (``over_ew_rounds``) and their
    spread (``rounds_iqr``: interquartile range over the median). Session 17 (S17-3, timed in blocks) found every
    schedule's runs rising ~10 % through its block; timed in rounds that rise falls on every schedule alike."""
    rows = []
    for (cfg, dt), g in runs.groupby(["config", "dtype"], sort=False):
        k = {sch: x.sort_values("run").kernel_ms.to_numpy() for sch, x in g.groupby("schedule", sort=False)}
        if MEGAMOE_BASELINE not in k:
            raise ValueError(f"{cfg} {dt}: no {MEGAMOE_BASELINE} runs to compare with")
        ew = k[MEGAMOE_BASELINE]
        for sch, v in k.items():
            q = max(1, int(round(len(v) * quarter)))
            row = dict(config=cfg, dtype=dt, schedule=sch, runs=len(v), ms=float(np.median(v)),
                       rise=float(np.median(v[-q:]) / np.median(v[:q]) - 1))
            if sch != MEGAMOE_BASELINE and len(v) == len(ew):
                rr = v / ew
                q1, q3 = np.percentile(rr, [25, 75])
                row.update(over_ew=float(np.median(v) / np.median(ew)), over_ew_rounds=float(np.median(rr)),
                           rounds_iqr=float((q3 - q1) / np.median(rr)))
            rows.append(row)
    return pd.DataFrame(rows)


def megamoe_pair_processes(machine: str = "h200x1", sub: str = MEGAMOE_PAIR_PROCESSES_SUB) -> pd.DataFrame:
    """One configuration's controls7 recorded in several processes (data/<machine>/<sub>/p1, p2, ...; schema
    ``megamoe_gemm``): per process, dtype, configuration and schedule the median time (``ms``), the fastest timed run
    (``ms_min``) and each over Expert-Wave's of the same process (``over_ew``, ``over_ew_min``): how far one pair's
    ratio moves between processes. :class:`NoRecordedData` when no process folder is recorded."""
    root = data.machine_dir(machine) / sub
    folders = sorted((f for f in root.glob("p*") if data.paths(f, data.MEGAMOE_GEMM)[0].is_file()),
                     key=lambda f: int(f.name[1:]) if f.name[1:].isdigit() else 0) if root.is_dir() else []
    if not folders:
        raise NoRecordedData(f"no recorded MegaMoE pair in several processes for {machine} "
                             f"(data/{machine}/{sub}/p1 ...); "
                             f"run `python3 scripts/megamoe_gemm.py --study controls7 --cases <config> --out "
                             f"data/{machine}/{sub}/p<N>` once per process")
    out = []
    for f in folders:
        df, _ = data.load(f, data.MEGAMOE_GEMM)
        df = df[(df.method == "ours") & (df.status == "ok")]
        df = df.assign(config=megamoe_config_names(df))
        for (dt, cfg), g in df.groupby(["dtype", "config"], sort=False):
            ms = g.groupby("schedule").ms.median()
            mn = g.groupby("schedule").ms_min.min()
            if MEGAMOE_BASELINE not in ms:
                raise ValueError(f"{f}: {cfg} {dt} has no {MEGAMOE_BASELINE} row to compare with")
            for sch in ms.index:
                out.append(dict(process=f.name, dtype=dt, config=cfg, schedule=sch, ms=float(ms[sch]),
                                ms_min=float(mn[sch]), over_ew=float(ms[sch] / ms[MEGAMOE_BASELINE]),
                                over_ew_min=float(mn[sch] / mn[MEGAMOE_BASELINE])))
    return pd.DataFrame(out)


def megamoe_stall_rescore(record: str = MEGAMOE_ROUND12_HOST, stalls=MEGAMOE_STALL_MODELS_SCORED, prms=None
                          ) -> pd.DataFrame:
    """A recorded one-GPU host-link sweep (data/h200x1/<record>) rescored under each stall model
    (moe_round6.host_rescore: the record's wait model, and its stage parameters or each of ``prms``, {name:
    StageParams, a function returning one (called once the record is read), or None for the record's own}, default
    {"recorded": None}): per model, stall model, dtype and
    schedule the configurations, the share and count within +-10 % (MODEL_TOLERANCE), the median and worst |error|.
    A stall model None is the record's own (named in the table). :class:`NoRecordedData` without the record."""
    from .moe_plan import record_stall
    from .moe_round6 import host_rescore

    df, meta = megamoe_world_data("one-gpu", "host", record=record)
    out = []
    for name, prm in (prms or {"recorded": None}).items():
        prm = prm() if callable(prm) else prm
        for st in stalls:
            sp, summ = host_rescore(df, meta, stall=st, prm=prm)
            worst = sp.groupby(["dtype", "schedule"], sort=False).model_error.apply(lambda e: float(e.abs().max()))
            summ = summ.assign(model=name, stall=st or record_stall(meta), within=(summ.within_10pct * summ.configs).round().astype(int),
                               worst_abs_error=worst.reindex(pd.MultiIndex.from_frame(summ[["dtype", "schedule"]]))
                               .to_numpy())
            out.append(summ)
    cols = ["model", "stall", "dtype", "schedule", "configs", "within", "within_10pct", "median_abs_error",
            "worst_abs_error"]
    return pd.concat(out, ignore_index=True)[cols]


def megamoe_host_full_model(record: str = MEGAMOE_ROUND14_HOST) -> pd.DataFrame:
    """A recorded one-GPU host-link sweep re-predicted with the host link's full model now (xstage.model.load_params;
    rung free_store since session 24, fit.FULL_RUNG) beside the stage parameters the sweep recorded, both under the
    record's own stall and wait models (:func:`megamoe_stall_rescore`, ``model``: "recorded" / "full").
    The cost model reads the stage's capacities, stall and drain; free entries (f = 1.6 KiB per burst) are no part
    of it: a combine burst is a tile's rows, hundreds of KiB."""
    from .model import load_params

    full = lambda: load_params(data.machine_dir(LINK_MACHINES["host"]), "host")   # noqa: E731 (once the record is read)
    return megamoe_stall_rescore(record, (None,), {"recorded": None, "full": full})


def megamoe_pairs_line(df: pd.DataFrame, what: str = "host-link sweep") -> str:
    """How much of a sweep a record holds, in (configuration, dtype) pairs of the 84 x bf16 / fp8 (168) with
    every schedule: e.g. 'host-link sweep: 62 of 168 (configuration, dtype) pairs (bf16 0 of 84, fp8 62 of 84)'."""
    cov = megamoe_coverage(df)
    per = {r.dtype: (int(r.complete), int(r.expected)) for r in cov.itertuples(index=False)}
    n, total = sum(c for c, _ in per.values()), sum(e for _, e in per.values())
    return (f"{what}: {n} of {total} (configuration, dtype) pairs ("
            + ", ".join(f"{d} {c} of {e}" for d, (c, e) in per.items()) + ")")


def megamoe_round7_controls(df: pd.DataFrame) -> pd.DataFrame:
    """Study ``controls7``, per configuration, dtype and schedule (dynamic, the default tiles; table order): the
    compute-only time over Expert-Wave's in the same rounds and the per-task evidence, as
    :func:`megamoe_round3_controls` computes it for study controls."""
    return megamoe_round3_controls(df, study="controls7")


def megamoe_round7_controls_summary(per: pd.DataFrame) -> pd.DataFrame:
    """Per dtype and schedule of :func:`megamoe_round7_controls`: configurations, geomean and worst over
    Expert-Wave (the worst configuration), whether the goal holds (geomean <= 1.02, worst <= 1.05), how many
    configurations are over 1.05, and the per-task evidence (:func:`megamoe_round3_controls_summary`)."""
    s = megamoe_round3_controls_summary(per).drop(columns=["ew_over_static_geomean", "variant"])
    over = per[per.over_ew > MEGAMOE_ORDER_GOALS["worst"]].groupby(["dtype", "schedule"]).size()
    s.insert(s.columns.get_loc("goal_met") + 1, "over_worst",
             [int(over.get((d, c), 0)) for d, c in zip(s.dtype, s.schedule)])
    return s


def megamoe_round7_host_summary(df: pd.DataFrame, before: pd.DataFrame | None = None,
                                tolerance: float = MODEL_TOLERANCE) -> pd.DataFrame:
    """The host-link sweep of round 7 (``df``) per dtype and schedule over the configurations it holds:
    ``configs`` (of 84), measured speedup over Expert-Wave (geomean, max), the model's predicted speedup with the
    host link's fitted stage model as the sweep recorded it (geomean, max), how many within ``tolerance`` (10 %) of
    the measured one (``within``) and the fraction; with ``before`` (round 4's record, megamoe_host_v2) the same
    configurations' measured geomean there (``before_geomean``: the pointer loops, same link and model)."""
    sp = megamoe_speedups(df)
    sp = sp[sp.schedule != MEGAMOE_BASELINE].dropna(subset=["speedup"])
    sp = sp.assign(within=(sp.model_error.abs() <= tolerance))
    old = None
    if before is not None:
        old = megamoe_speedups(before).set_index(["config", "dtype", "schedule"]).speedup
    out = []
    for (dt, sch), g in sp.groupby(["dtype", "schedule"], sort=False):
        row = dict(dtype=dt, schedule=sch, configs=len(g), expected=len(megamoe_expected()),
                   geomean_speedup=geomean(g.speedup), max_speedup=float(g.speedup.max()),
                   max_config=g.loc[g.speedup.idxmax(), "config"], geomean_predicted=geomean(g.predicted_speedup),
                   max_predicted=float(g.predicted_speedup.max()), within=int(g.within.sum()),
                   within_tolerance=float(g.within.mean()))
        if old is not None:
            o = old.reindex(pd.MultiIndex.from_arrays([g.config, g.dtype, g.schedule]))
            row["before_geomean"] = geomean(o.to_numpy())
            row["before_configs"] = int(o.notna().sum())
        out.append(row)
    return pd.DataFrame(out)
