"""The Ulysses headline rows and docs page come from the current records, and docs/ulysses.md is the page
generated from them."""
from __future__ import annotations

from pathlib import Path

from xstage import records
from xstage import ulysses_analysis as UA

ROOT = Path(__file__).resolve().parents[1]


def test_headline_rows_hold_the_current_numbers():
    rows = UA.headline()
    assert len(rows) == 3 and all(isinstance(r, records.Headline) for r in rows)
    assert all((ROOT / r.record).is_dir() and r.notebook == "04" for r in rows)
    nv, host, local = UA.nvlink_numbers(), UA.one_gpu_numbers("host"), UA.one_gpu_numbers("local")
    assert round(nv["best"], 2) == 1.18 and nv["best_shape"] == "seq_4k" and round(nv["fused_sv_max"], 3) == 1.016
    assert (round(host["worst"], 2), round(host["best"], 2)) == (0.97, 1.17)
    assert (round(local["worst"], 2), round(local["best"], 2)) == (0.92, 1.08)
    assert "**1.18x**" in rows[0].ours


def test_docs_page_is_current():
    page = ROOT / "docs" / UA.DOCS_PAGE
    assert page.read_text() == UA.docs_page(), f"{page} is stale: regenerate it from xstage.ulysses_analysis"
