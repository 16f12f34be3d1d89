"""The README a newcomer reads: at most 15 KB, its headline table derived from data/ by the studies' analysis
modules (the same functions the notebooks call), each study's docs/<study>.md and each archive index current
(`make readme` rewrites them all)."""
from __future__ import annotations

import re

import pytest

from xstage import readme
from xstage.env import REPO_ROOT

README = REPO_ROOT / "README.md"


def test_headline_table_is_derived_from_the_data():
    text = README.read_text(encoding="utf-8")
    assert readme.block(text, readme.HEADLINE_START, readme.HEADLINE_END) == readme.headline_markdown(), \
        "the README's headline table disagrees with data/: run `make readme`"


@pytest.mark.parametrize("path", sorted(readme.pages()), ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_generated_pages_are_current(path):
    assert path.exists() and path.read_text(encoding="utf-8") == readme.pages()[path], \
        f"{path.relative_to(REPO_ROOT)} is stale: run `make readme`"


def test_headline_rows_say_where_and_which_record():
    rows = readme.headline_rows()
    assert 0 < len(rows) <= readme.MAX_ROWS
    for r in rows:
        assert r.ours and r.where and r.record.startswith("data/") and re.fullmatch(r"\d\d", r.notebook), r
        assert (REPO_ROOT / r.record).exists(), f"{r.record} does not exist"


def test_readme_is_short_and_says_what_a_newcomer_needs():
    text = README.read_text(encoding="utf-8")
    assert len(text.encode()) <= 15_000, f"README is {len(text.encode())} bytes (at most 15 KB)"
    for needed in ("arXiv", "Python 3.12", "make venv", "make reproduce", "make test", "docs/findings.md",
                   "xstage calibrate" if "calibrate" in text else "make test"):
        assert needed in text, f"the README does not say {needed!r}"


def test_a_readme_without_markers_is_one_clear_error(tmp_path):
    f = tmp_path / "README.md"
    f.write_text("# no tables here\n", encoding="utf-8")
    with pytest.raises(ValueError, match="has no markers"):
        readme.write_readme(f, root=tmp_path)
