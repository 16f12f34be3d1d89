"""Our attention beside FA4: the headline row and docs/attention.md come from the current records (one per
machine), and the page is the one generated from them."""
from __future__ import annotations

from pathlib import Path

from xstage import attention_analysis as AA
from xstage import records

ROOT = Path(__file__).resolve().parents[1]


def test_headline_row_holds_the_current_numbers():
    (row,) = AA.headline()
    assert isinstance(row, records.Headline) and (ROOT / row.record).is_dir() and row.notebook == "04"
    h100, h200 = AA.attention_numbers("h100x1"), AA.attention_numbers("h200x1")
    assert round(h100["min"], 3) == 0.962 and h100["met"] == h100["shapes"] == 7
    assert round(h200["min"], 3) == 0.897 and (h200["met"], h200["shapes"]) == (3, 7)
    assert "**0.962**" in row.ours


def test_one_current_record_per_machine():
    for study in ("attention", "attention_clocks"):
        current = records.records(study)
        assert len({r.machine for r in current}) == len(current), f"{study}: more than one current record per machine"


def test_docs_page_is_current():
    page = ROOT / "docs" / AA.DOCS_PAGE
    assert page.read_text() == AA.docs_page(), f"{page} is stale: regenerate it from xstage.attention_analysis"
