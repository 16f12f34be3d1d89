"""Our attention forward beside FA4's CuTe Hopper forward and cuDNN SDPA (one GPU, no communication): the launch
variants' table, the per-shape summary against the goal, the sustained-clocks study, and the README's headline row
(:func:`headline`) and docs page (:func:`docs_page`), read from the current records (xstage.records, studies
``attention`` and ``attention_clocks``).

Every ratio is of medians timed round-robin in the same rounds (``scripts/attention_vs_fa4.sh``): ours / FA4 in
TFLOP/s (4 S^2 H D / median time); the goal is >= :data:`ATTENTION_LADDER_GOAL` of FA4's TFLOP/s on every shape
with S >= 8K, met by the fastest variant on that shape.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from . import data, records
from .ulysses import attention_flops

DOCS_PAGE = "attention.md"
NOTEBOOK = "04"
MACHINES = ("h100x1", "h200x1")   # the machines with a current record beside FA4 (the README row: H100 first)

ATTENTION_LADDER_GOAL = 0.95   # our attention's TFLOP/s / the FA-class kernel's (FA4; against cuDNN, cuDNN stands in)


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
    flops = attention_flops(med.S.astype(float), med.H, med.D)
    # ours: our Triton kernel's rows, or the Gluon kernel's (method gluon: a variant has one of the two; a record
    # may hold only Gluon variants)
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
        # an older sidecar layout (the archived Triton ladder): keyed by label alone; the head dim from the params
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
    ours / FA, ours / cuDNN, and whether the goal (>= ATTENTION_LADDER_GOAL of FA's TFLOP/s, required at
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



# ------------------------------------------------------------------------ the README's row and the docs page
def _rel(rec: records.Record) -> str:
    return str(rec.path.relative_to(records.DATA_ROOT.parent))


def attention_summary(machine: str) -> pd.DataFrame:
    """Per shape of the machine's current record beside FA4: the fastest variant's ours / FA4 and more
    (:func:`attention_vs_fa4_summary`)."""
    rec = records.record("attention", machine, "local")
    df, meta = attention_ladder_data(machine, rec.folder)
    return attention_vs_fa4_summary(attention_ladder_table(df, meta))


def attention_numbers(machine: str) -> dict:
    """The smallest ours / FA4 over the shapes with S >= 8K and on how many distinct shapes the goal is met."""
    s = attention_summary(machine)
    need = s[s.goal_applies]
    per_shape = need.groupby(["S", "H", "D"]).met.all()
    return dict(record=_rel(records.record("attention", machine, "local")), min=float(need.best_over_fa.min()),
                met=int(per_shape.sum()), shapes=int(len(per_shape)))


def headline() -> list[records.Headline]:
    """The README's row of the attention study (current records only)."""
    h100, h200 = (attention_numbers(m) for m in MACHINES)
    return [records.Headline(f">= {ATTENTION_LADDER_GOAL:g} of FA4's TFLOP/s at S >= 8K (our goal)",
                             f"ours / FA4, fastest variant: min **{h100['min']:.3f}**, {h100['met']} of "
                             f"{h100['shapes']} shapes >= {ATTENTION_LADDER_GOAL:g} (GPU time, samples queued); one "
                             f"H200: min {h200['min']:.3f}, {h200['met']} of {h200['shapes']}",
                             "one H100 / one H200", h100["record"], NOTEBOOK)]


# ------------------------------------------------------------------------------------------ the attention call
LAYER_MACHINES = ("h100x1",)   # the machines with a current record of xstage.attention (scripts/attention_layer_gpu.py)


def issue_table(summary: dict) -> str:
    """The issue's table from this run's summary (ranges over the shapes), with host us per call and first-call s."""
    t, h, f = (summary["parts"].get(p, {}) for p in ("timing", "host_us", "first_call"))

    def rng(x, fmt="{:.3f}"):
        return "-" if not x else (fmt.format(x[0]) if abs(x[1] - x[0]) < 1e-9 else
                                  f"{fmt.format(x[0])}-{fmt.format(x[1])}")
    lines = ["| timing | ours / `flash_attn_func` | ours / cuDNN SDPA |", "| --- | --- | --- |"]
    for mode, label in (("plain", "plain (GPU idle before each sample)"), ("queued", "queued behind a GPU-side wait"),
                        ("back_to_back", "8 launches back to back")):
        lines.append(f"| {label} | {rng(t.get(f'{mode}_ours_over_fa4'))} | {rng(t.get(f'{mode}_ours_over_cudnn'))} |")
    names = {"ours": "ours", "ours_validated_launcher": "ours through the studies' validated launcher",
             "flash_attn_func": "`flash_attn_func`", "fa4_kernel_direct": "FA4's compiled kernel launched directly",
             "cudnn": "cuDNN SDPA"}
    host = ", ".join(f"{n} {rng(h[m], '{:.0f}')} us" for m, n in names.items() if h.get(m))
    first = ", ".join(f"{m} {f[f'{m}_cold_first_s']:.2f} s cold / {f[f'{m}_warm_first_s']:.2f} s warm"
                      for m in ("ours", "fa4", "cudnn") if f.get(f"{m}_cold_first_s") is not None
                      and f.get(f"{m}_warm_first_s") is not None)
    return "\n".join(lines) + f"\n\nHost time per call: {host or '-'}.\n\nFirst call of a new shape: {first or '-'}.\n"


def attention_layer_summary(rec: records.Record) -> tuple[dict, dict]:
    """(summary, sidecar) of an attention-call record: ``summary["parts"]`` as the script wrote it."""
    lines, meta = data.load_jsonl(rec.path, "attention_layer")
    return {"parts": {ln["part"]: ln["summary"] for ln in lines if "summary" in ln}}, meta


def attention_layer_section(machine: str = "h100x1") -> list[str]:
    """The docs page's part on ``xstage.attention``: the issue's table, graphs, compile and the DiT block."""
    rec = records.record("attention_layer", machine, "local")
    summary, meta = attention_layer_summary(rec)
    p = summary["parts"]
    g, c, d = p.get("graphs", {}), p.get("compile", {}), p.get("dit_block", {})
    out = ["", f"## `xstage.attention`, {records.MACHINES[machine]} (`{_rel(rec)}`)", "",
           f"`scripts/attention_layer_gpu.py`, {meta.get('card')}, FA4 {(meta.get('fa4') or ['', '-'])[1]}; ours / them is "
           "their time over ours (above 1: ours faster), ranges over the shapes.", "", issue_table(summary).rstrip()]
    if g:
        ok = all(g.get(k, {}).get("new_data_bit_identical") for k in ("attention", "ulysses_p2"))
        out += ["", f"CUDA graphs (the call and the P = 2 layer): replays on new data {'' if ok else 'NOT '}"
                "bit-identical to eager."]
    if c:
        out += ["", f"torch.compile(fullgraph=True): {c.get('graph_breaks')} graph breaks, {c.get('graphs')} graph, rel. L2 "
                f"{c.get('rel_l2', float('nan')):.1e} to eager."]
    if d.get("speedup"):
        out += ["", f"Wan 2.1 1.3B block (S = {d['S']}, random weights), diffusers' SDPA processor / ours: "
                f"{d['diffusers_sdpa_ms']:.1f} ms / {d['xstage_ms']:.1f} ms = **{d['speedup']:.2f}x**, outputs rel. L2 "
                f"{d['rel_l2_ours_vs_sdpa']:.1e}."]
    return out


def docs_page() -> str:
    """docs/attention.md: the current numbers of our attention beside FA4 (generated)."""
    parts = records.docs_head("Our attention beside FA4", "attention_analysis",
                              "notebook 04 shows the figures. The fused Ulysses layer: [ulysses.md](ulysses.md).",
                              headline())
    for machine in MACHINES:
        s = attention_summary(machine)[["shape", "S", "H", "D", "fa_tflops", "best_variant", "best_tflops",
                                        "best_over_fa", "met"]]
        parts += ["", f"## Ours beside FA4, {records.MACHINES[machine]} (`{attention_numbers(machine)['record']}`)",
                  "", "Fastest variant per shape, TFLOP/s of medians timed in the same rounds; the goal applies "
                  "at S >= 8K.", "", records.markdown_table(s)]
    clocks = attention_clocks_ratios(attention_clocks_table(attention_clocks_data()[0]))
    parts += ["", f"## Sustained clocks, {records.MACHINES[ATTENTION_CLOCKS_MACHINE]} "
              f"(`{_rel(records.record('attention_clocks', ATTENTION_CLOCKS_MACHINE, 'local'))}`)", "",
              "Each method back to back for 3 s at the power cap: ours / FA4 in time and per SM clock.", "",
              records.markdown_table(clocks[["shape", "S", "H", "D", "ours_over_fa", "clock_ratio", "ours_over_fa_per_clock",
                                     "ours_w", "fa_w"]])]
    for machine in LAYER_MACHINES:
        parts += attention_layer_section(machine)
    return "\n".join(parts) + "\n"
