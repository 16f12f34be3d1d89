"""MegaMoE's headline rows and docs page come from the current records and say what they measured."""
from __future__ import annotations

from pathlib import Path

from xstage import megamoe_analysis as A
from xstage import records

ROOT = Path(__file__).resolve().parents[1]


def test_headline_rows_read_the_current_records():
    rows = A.headline()
    assert 1 <= len(rows) <= 5
    current = {f"data/{r.machine}/{r.folder}" for r in records.records()}
    assert all(h.record in current and h.notebook == "03" and h.ours and h.where for h in rows)
    text = " ".join(h.ours for h in rows)
    for number in ("0.84 / 0.82x", "max 0.99 / 1.00x", "bf16 **1.025** (max 1.11; model 1.022, 84 of 84",
                   "fp8 **1.062** (max 1.16)", "geomean **1.181**, min 0.882 (0.952 at >= 2048 rows)",
                   "geomean **1.228**, min 0.999"):
        assert number in text, number


def test_pcie_summary_matches_a_direct_geomean():
    import numpy as np

    from xstage import data
    df, _ = data.load(records.folder("megamoe", "h200x1", "host"), data.MEGAMOE)
    key = ["shape", "tokens", "routing", "dtype"]
    ew = df[df.schedule == "expert_wave"].set_index(key).kernel_ms
    il = df[df.schedule == "interleaved"].set_index(key).kernel_ms
    sp = (ew / il.reindex(ew.index)).dropna()
    s = A.pcie_summary()
    for dt in ("bf16", "fp8"):
        got = s[(s["dtype"] == dt) & (s.schedule == "interleaved")].geomean_speedup.iloc[0]
        want = float(np.exp(np.log(sp.xs(dt, level="dtype")).mean()))
        assert abs(got - want) < 1e-9


def test_docs_page_is_current():
    assert A.DOCS_PAGE == "megamoe.md"
    assert (ROOT / "docs" / A.DOCS_PAGE).read_text() == A.docs_page()
