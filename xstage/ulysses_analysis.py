"""The Ulysses study's analysis: medians, speedups over serial, times over attention alone, the fused epilogue's
bursts beside the stage model, FA4's one-GPU records, the goals table and the README's headline rows
(:func:`headline`) and docs page (:func:`docs_page`), read from the current records (xstage.records).

The fused layer (attention whose epilogue stores each tile straight into its destination rank's buffer, then one
epoch barrier) against the serial layer (the same attention, then the all-to-all), end to end. The analysis takes
DataFrames of the ``ulysses`` schema (xstage.data); ``xstage.ulysses_sweep.ulysses_data`` gives them for any
source, :func:`xstage.ulysses_records.recorded` for a record. Our attention beside FA4 is
``xstage.attention_analysis``.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from . import data, records, ulysses_records
from .model import KIB, load_params, predict_train
from .sources import LINK_MACHINES, paper_number
from .ulysses import alltoall_bytes
from .ulysses_records import (ULYSSES_HOST_BEFORE_FIX, ULYSSES_ONE_GPU_LINKS, ULYSSES_ONE_GPU_RECORDS,  # noqa: F401
                              ulysses_world)

DOCS_PAGE = "ulysses.md"
ONE_GPU = "h200x1"
NOTEBOOK = "04"

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
FUSED_OVER_ATTENTION_GOAL = 1.05   # fused sender-visible / our attention alone (docs/findings.md)
ATTENTION_OVER_CUDNN_GOAL = 0.9    # our attention's TFLOP/s / cuDNN SDPA's, same shape


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



# ------------------------------------------------------------------------ the README's rows and the docs page
def _rel(rec: records.Record) -> str:
    return str(rec.path.relative_to(records.DATA_ROOT.parent))


def nvlink_numbers() -> dict:
    """2x H200 over NVLink: the best and the longest shape's fused / serial end to end, and the largest fused
    (sender-visible) / attention alone at S >= 32K."""
    rec = records.record("ulysses", "h200x2", "nvlink")
    df, _ = ulysses_records.recorded("h200x2")
    sp = ulysses_speedups(df)
    e2e = sp[sp.line == "fused_e2e"].sort_values("S")
    best, last = e2e.loc[e2e.speedup.idxmax()], e2e.iloc[-1]
    r = ulysses_ratios(df)
    a = r[r.S >= 16384].attention_over_sdpa.dropna()
    return dict(record=_rel(rec), best=float(best.speedup), best_shape=best["shape"], best_P=int(best.P),
                last=float(last.speedup), last_shape=last["shape"],
                fused_sv_max=float(r[r.S >= 32768].fused_sv.max()),
                sdpa_min=float(a.min()), sdpa_max=float(a.max()), sdpa_median=float(np.median(a)))


def one_gpu_numbers(link: str) -> dict:
    """One H200, the one-GPU world on ``link``: the worst and best fused / serial end to end."""
    rec = records.record("ulysses", ONE_GPU, link)
    df, _ = ulysses_records.recorded(ONE_GPU, link=link)
    sp = ulysses_speedups(df)
    e2e = sp[sp.line == "fused_e2e"]
    best, worst = e2e.loc[e2e.speedup.idxmax()], e2e.loc[e2e.speedup.idxmin()]
    return dict(record=_rel(rec), best=float(best.speedup), best_shape=best["shape"], best_P=int(best.P),
                worst=float(worst.speedup), worst_shape=worst["shape"], worst_P=int(worst.P),
                shapes=int(e2e["shape"].nunique()))


def headline() -> list[records.Headline]:
    """The README's rows of the Ulysses study (current records only)."""
    nv = nvlink_numbers()
    host, local = one_gpu_numbers("host"), one_gpu_numbers("local")
    return [
        records.Headline("", f"Ulysses fused / serial (our attention + NCCL), end to end: **{nv['best']:.2f}x** "
                             f"({nv['best_shape']}, P = {nv['best_P']}); {nv['last']:.2f}x at {nv['last_shape']}; "
                             f"fused (sender-visible) / attention alone <= {nv['fused_sv_max']:.3f} at S >= 32K",
                         "NVLink, 2x H200", nv["record"], NOTEBOOK),
        records.Headline("", f"Ulysses fused / serial (attention + copies), peers' outputs in pinned host memory: "
                             f"{host['worst']:.2f}x ({host['worst_shape']}, P = {host['worst_P']}) to "
                             f"**{host['best']:.2f}x** ({host['best_shape']}, P = {host['best_P']}), "
                             f"{host['shapes']} shapes", "PCIe (host), one H200", host["record"], NOTEBOOK),
        records.Headline("", f"Ulysses fused / serial (attention + copies), every buffer on the GPU: "
                             f"{local['worst']:.2f}x ({local['worst_shape']}, P = {local['worst_P']}) to "
                             f"**{local['best']:.2f}x** ({local['best_shape']}, P = {local['best_P']}), "
                             f"{local['shapes']} shapes", "local, one H200", local["record"], NOTEBOOK),
    ]


def docs_page() -> str:
    """docs/ulysses.md: the current numbers of the Ulysses study (generated)."""
    parts = records.docs_head("Ulysses: the all-to-all fused into attention's epilogue", "ulysses_analysis",
                              "notebook 04 shows the figures. Our attention beside FA4: [attention.md](attention.md).",
                              headline())
    df, _ = ulysses_records.recorded("h200x2")
    sp = ulysses_speedups(df)
    e2e = sp[sp.line == "fused_e2e"][["shape", "S", "H", "D", "P", "speedup", "low", "high"]]
    r = ulysses_ratios(df)[["shape", "P", "fused_sv", "fused_e2e", "serial"]]
    t = e2e.merge(r, on=["shape", "P"]).rename(columns={"speedup": "fused / serial", "fused_sv": "fused sv / attn",
                                                         "fused_e2e": "fused e2e / attn", "serial": "serial / attn"})
    parts += ["", f"## Per shape, 2x H200 over NVLink (`{nvlink_numbers()['record']}`)", "",
              "Fused / serial end to end (medians; low / high: quartile ratios) and each layer's time over our "
              "attention alone.", "", records.markdown_table(t.sort_values(["P", "S"]).reset_index(drop=True))]
    return "\n".join(parts) + "\n"
