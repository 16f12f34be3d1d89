"""Ulysses and our attention beside FA4: each study's current numbers, read from its current record
(xstage.records), as README headline rows (:func:`headline`) and the docs page (:func:`docs_page`).

Ulysses: the fused layer (attention whose epilogue stores each tile straight into its destination rank's buffer,
then one epoch barrier) against the serial layer (the same attention, then the all-to-all), end to end. Attention:
our Gluon forward's TFLOP/s over FA4's CuTe Hopper forward, timed round-robin in the same rounds; the goal is
>= 0.95 on every shape with S >= 8K. The attention study's rows live here too: a module named attention_analysis
matches the launchers' pattern ``attention*`` in tests/test_layers.py (see the report to the lead).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from . import records, studies

DOCS_PAGE = "ulysses.md"
ONE_GPU = "h200x1"
NOTEBOOK = "04"


def _rel(rec: records.Record) -> str:
    return str(rec.path.relative_to(records.DATA_ROOT.parent))


def nvlink_numbers() -> dict:
    """2x H200 over NVLink: the best and the longest shape's fused / serial end to end, and the largest fused
    (sender-visible) / attention alone at S >= 32K."""
    rec = records.record("ulysses", "h200x2", "nvlink")
    df, _ = studies.ulysses_data("recorded", "h200x2")
    sp = studies.ulysses_speedups(df)
    e2e = sp[sp.line == "fused_e2e"].sort_values("S")
    best, last = e2e.loc[e2e.speedup.idxmax()], e2e.iloc[-1]
    r = studies.ulysses_ratios(df)
    a = r[r.S >= 16384].attention_over_sdpa.dropna()
    return dict(record=_rel(rec), best=float(best.speedup), best_shape=best["shape"], best_P=int(best.P),
                last=float(last.speedup), last_shape=last["shape"],
                fused_sv_max=float(r[r.S >= 32768].fused_sv.max()),
                sdpa_min=float(a.min()), sdpa_max=float(a.max()), sdpa_median=float(np.median(a)))


def one_gpu_numbers(link: str) -> dict:
    """One H200, the one-GPU world on ``link``: the worst and best fused / serial end to end."""
    rec = records.record("ulysses", ONE_GPU, link)
    df, _ = studies.ulysses_data("recorded", ONE_GPU, link=link)
    sp = studies.ulysses_speedups(df)
    e2e = sp[sp.line == "fused_e2e"]
    best, worst = e2e.loc[e2e.speedup.idxmax()], e2e.loc[e2e.speedup.idxmin()]
    return dict(record=_rel(rec), best=float(best.speedup), best_shape=best["shape"], best_P=int(best.P),
                worst=float(worst.speedup), worst_shape=worst["shape"], worst_P=int(worst.P),
                shapes=int(e2e["shape"].nunique()))


def attention_summary(machine: str) -> pd.DataFrame:
    """Per shape of the machine's current record beside FA4: the fastest variant's ours / FA4 and more
    (studies.attention_vs_fa4_summary)."""
    rec = records.record("attention", machine, "local")
    df, meta = studies.attention_ladder_data(machine, rec.folder)
    return studies.attention_vs_fa4_summary(studies.attention_ladder_table(df, meta))


def attention_numbers(machine: str) -> dict:
    """The smallest ours / FA4 over the shapes with S >= 8K and on how many distinct shapes the goal is met."""
    s = attention_summary(machine)
    need = s[s.goal_applies]
    per_shape = need.groupby(["S", "H", "D"]).met.all()
    return dict(record=_rel(records.record("attention", machine, "local")), min=float(need.best_over_fa.min()),
                met=int(per_shape.sum()), shapes=int(len(per_shape)))


def headline() -> list[records.Headline]:
    """The README's rows of the Ulysses and attention studies (current records only)."""
    nv = nvlink_numbers()
    host, local = one_gpu_numbers("host"), one_gpu_numbers("local")
    h100, h200 = attention_numbers("h100x1"), attention_numbers("h200x1")
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
        records.Headline(f">= {studies.ATTENTION_LADDER_GOAL:g} of FA4's TFLOP/s at S >= 8K (our goal)",
                         f"ours / FA4, fastest variant: min **{h100['min']:.3f}**, {h100['met']} of {h100['shapes']} "
                         f"shapes >= {studies.ATTENTION_LADDER_GOAL:g} (GPU time, samples queued); one H200: min "
                         f"{h200['min']:.3f}, {h200['met']} of {h200['shapes']}",
                         "one H100 / one H200", h100["record"], NOTEBOOK),
    ]


def _table(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    rows = ["| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    rows += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in df.itertuples(index=False)]
    return "\n".join(rows)


def docs_page() -> str:
    """docs/ulysses.md: the current numbers of the Ulysses and attention studies (generated)."""
    parts = ["# Ulysses and our attention beside FA4", "",
             "Generated from the current records (xstage/records.py) by `xstage.ulysses_analysis.docs_page`; "
             "notebook 04 shows the figures.", "",
             "| claim | ours | where | record |", "| --- | --- | --- | --- |"]
    parts += [f"| {h.claim} | {h.ours} | {h.where} | `{h.record}` |" for h in headline()]
    for machine in ("h100x1", "h200x1"):
        s = attention_summary(machine)[["shape", "S", "H", "D", "fa_tflops", "best_variant", "best_tflops",
                                        "best_over_fa", "met"]]
        parts += ["", f"## Ours beside FA4, {records.MACHINES[machine]} (`{attention_numbers(machine)['record']}`)",
                  "", "Fastest variant per shape, TFLOP/s of medians timed in the same rounds; the goal applies "
                  "at S >= 8K.", "", _table(s)]
    return "\n".join(parts) + "\n"
