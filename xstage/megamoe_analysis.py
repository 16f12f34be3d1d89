"""MegaMoE's current results: the README's headline rows and docs/megamoe.md, from the current records only.

Five records (xstage.records, studies megamoe, megamoe_controls, megamoe_gemm_bf16, megamoe_gemm_fp8):

- ``data/h200x2/megamoe``: the 84 configurations per dtype on 2 H200s over NVLink, made with the first kernels;
- ``data/h200x1/megamoe_pcie``: the same 84 on one H200, two ranks in one process, each peer's combine stores
  crossing PCIe into pinned host memory (the current kernels; the model's prediction recorded beside);
- ``data/h200x1/megamoe_controls``: compute only (every store local), each schedule's time / Expert-Wave's;
- ``data/h200x1/megamoe_gemm_bf16`` / ``megamoe_gemm_fp8``: our GEMM phases against ``torch._grouped_mm`` /
  ``torch._scaled_grouped_mm`` timed in the same rounds.

A speedup is Expert-Wave's kernel time over the schedule's (> 1: the schedule is faster); a GEMM ratio is the
library's time over ours (> 1: ours faster).
"""
from __future__ import annotations

from functools import lru_cache

import pandas as pd

from . import data, moe_gemm, records, studies

DOCS_PAGE = "megamoe.md"
NOTEBOOK = "03"
MIN_ROWS = moe_gemm.GEMM8_MIN_ROWS          # the GEMM goal's row threshold (>= 2048 rows)


def _where(rec: records.Record) -> str:
    return {"nvlink": "NVLink, 2x H200", "host": "PCIe to host memory, one H200",
            "local": "compute only, one H200"}[rec.link]


def _rel(rec: records.Record) -> str:
    return f"data/{rec.machine}/{rec.folder}"


@lru_cache(maxsize=None)
def nvlink_summary() -> pd.DataFrame:
    """Per dtype and schedule on 2 H200s over NVLink (first kernels): configurations, geomean / max speedup."""
    rec = records.record("megamoe", "h200x2", "nvlink")
    df, _ = data.load(rec.path, data.MEGAMOE)
    return studies.megamoe_summary(df)


@lru_cache(maxsize=None)
def pcie_summary() -> pd.DataFrame:
    """Per dtype and schedule on one H200, combine over PCIe: geomean / max speedup, the model's geomean and how
    many configurations it predicts within ±10 %."""
    rec = records.record("megamoe", "h200x1", "host")
    df, _ = data.load(rec.path, data.MEGAMOE)
    return studies.megamoe_round7_host_summary(df)


@lru_cache(maxsize=None)
def controls_summary() -> pd.DataFrame:
    """Compute only, dynamic assignment: each schedule's time / Expert-Wave's, geomean and worst, per dtype."""
    df, _ = data.load(records.folder("megamoe_controls", "h200x1", "local"), data.MEGAMOE_GEMM)
    cs = studies.megamoe_round7_controls_summary(studies.megamoe_round3_controls(df, study="controls7"))
    return cs[cs.schedule != studies.MEGAMOE_BASELINE].reset_index(drop=True)


@lru_cache(maxsize=None)
def gemm_bf16_summary() -> pd.DataFrame:
    """bf16 GEMM phases (default tiles) / torch._grouped_mm: geomean, min, min at >= 2048 rows."""
    df, _ = data.load(records.folder("megamoe_gemm_bf16", "h200x1", "local"), data.MEGAMOE_GEMM)
    g = moe_gemm.gemm8_summary(moe_gemm.gemm8_ratios(df))
    return g[(g["dtype"] == "bf16") & (g.variant == "default")].reset_index(drop=True)


@lru_cache(maxsize=None)
def gemm_fp8_summary() -> pd.DataFrame:
    """fp8 GEMM phases (the default tiles: one pipeline stage more) / torch._scaled_grouped_mm."""
    names = ("default", "bm_alt", "s_plus")
    df, _ = data.load(records.folder("megamoe_gemm_fp8", "h200x1", "local"), data.MEGAMOE_GEMM)
    g = moe_gemm.gemm8_summary(moe_gemm.gemm8_ratios(df, "gemm10", names), names=names)
    return g[g.variant == "s_plus"].reset_index(drop=True)


def _row(table: pd.DataFrame, dtype: str, schedule: str = "interleaved"):
    return table[(table["dtype"] == dtype) & (table.schedule == schedule)].iloc[0]


def headline() -> list[records.Headline]:
    """MegaMoE's README rows (current records only)."""
    nv = nvlink_summary()
    b, f = _row(nv, "bf16"), _row(nv, "fp8")
    paper = (studies.paper_number("megamoe", "geomean_speedup"), studies.paper_number("megamoe", "max_speedup"))
    rec_nv = records.record("megamoe", "h200x2", "nvlink")
    pc = pcie_summary()
    pb, pf = _row(pc, "bf16"), _row(pc, "fp8")
    rec_pc = records.record("megamoe", "h200x1", "host")
    gb, gf = gemm_bf16_summary().iloc[0], gemm_fp8_summary().iloc[0]
    rec_gb, rec_gf = records.record("megamoe_gemm_bf16"), records.record("megamoe_gemm_fp8")
    return [
        records.Headline(
            f"fused MoE layer: interleaved / Expert-Wave kernel time geomean {paper[0]:.2f}x, max {paper[1]:.2f}x "
            "(8 GPUs)",
            f"first kernels, 84 configurations per dtype: geomean **{b.geomean_speedup:.2f} / "
            f"{f.geomean_speedup:.2f}x**, max {b.max_speedup:.2f} / {f.max_speedup:.2f}x (bf16 / fp8)",
            _where(rec_nv), _rel(rec_nv), NOTEBOOK),
        records.Headline(
            "",
            f"combine over PCIe, interleaved / Expert-Wave: bf16 **{pb.geomean_speedup:.3f}** (max "
            f"{pb.max_speedup:.2f}; model {pb.geomean_predicted:.3f}, {int(pb.within)} of {int(pb.configs)} within "
            f"±10 %), fp8 **{pf.geomean_speedup:.3f}** (max {pf.max_speedup:.2f})",
            _where(rec_pc), _rel(rec_pc), NOTEBOOK),
        records.Headline(
            "",
            f"bf16 GEMM phases / `torch._grouped_mm`: geomean **{gb.geomean:.3f}**, min {gb['min']:.3f} "
            f"({gb.min_big:.3f} at >= {MIN_ROWS} rows), {int(gb.configs)} configurations",
            _where(rec_gb), _rel(rec_gb), NOTEBOOK),
        records.Headline(
            "",
            f"fp8 GEMM phases / `torch._scaled_grouped_mm`: geomean **{gf.geomean:.3f}**, min {gf['min']:.3f}, "
            f"{int(gf.configs)} configurations",
            _where(rec_gf), _rel(rec_gf), NOTEBOOK),
    ]


def _md(df: pd.DataFrame, fmt: dict[str, str]) -> str:
    cols = list(fmt)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(format(r[c], fmt[c]) if fmt[c] else str(r[c]) for c in cols) + " |")
    return "\n".join(lines)


def docs_page() -> str:
    """docs/megamoe.md: the current record's tables and what each shows."""
    rec_nv, rec_pc = records.record("megamoe", "h200x2", "nvlink"), records.record("megamoe", "h200x1", "host")
    nv = nvlink_summary()
    nv = nv[nv.schedule != studies.MEGAMOE_BASELINE]
    pc = pcie_summary()
    ctl = controls_summary()
    gb, gf = gemm_bf16_summary(), gemm_fp8_summary()
    parts = [
        "# MegaMoE: fused dispatch, grouped GEMMs and combine", "",
        "One kernel per rank dispatches tokens to their experts, runs both grouped GEMMs and stores each output "
        "row into its source rank's combine buffer. A schedule orders the kernel's tasks; Expert-Wave (one expert "
        "wave after the other) is the baseline. Speedup = Expert-Wave's kernel time / the schedule's (> 1: faster). "
        "Every table covers the 84 configurations per dtype of `xstage.moe_plan.CASES`; notebook 03 shows them "
        "configuration by configuration.", "",
        f"## One H200, combine over PCIe (`{_rel(rec_pc)}`)", "",
        "Two ranks in one process on one H200; each peer's combine stores cross PCIe into pinned host memory. "
        "`predicted` is the model's geomean speedup recorded beside the run; `within` counts configurations it "
        "predicts within ±10 %.", "",
        _md(pc, {"dtype": "", "schedule": "", "configs": "d", "geomean_speedup": ".3f", "max_speedup": ".2f",
                 "geomean_predicted": ".3f", "within": "d"}), "",
        f"## Two H200s over NVLink (`{_rel(rec_nv)}`, the first kernels)", "",
        _md(nv, {"dtype": "", "schedule": "", "configs": "d", "geomean_speedup": ".2f", "max_speedup": ".2f"}), "",
        f"## Compute only, every store local (`{_rel(records.record('megamoe_controls'))}`)", "",
        "Each schedule's compute-only time / Expert-Wave's (dynamic assignment; > 1: slower). Goal: geomean <= "
        "1.02, worst <= 1.05.", "",
        _md(ctl, {"dtype": "", "schedule": "", "configs": "d", "over_ew_geomean": ".3f", "over_ew_worst": ".3f"}),
        "",
        "## GEMM phases against the library, same rounds", "",
        f"The library's time / ours (> 1: ours faster); `min_big`: the minimum over configurations with >= "
        f"{MIN_ROWS} rows. bf16: `{_rel(records.record('megamoe_gemm_bf16'))}` against `torch._grouped_mm`; "
        f"fp8: `{_rel(records.record('megamoe_gemm_fp8'))}` against `torch._scaled_grouped_mm`.", "",
        _md(pd.concat([gb, gf], ignore_index=True),
            {"dtype": "", "library": "", "configs": "d", "geomean": ".3f", "min": ".3f", "min_big": ".3f"}), "",
    ]
    return "\n".join(parts)
