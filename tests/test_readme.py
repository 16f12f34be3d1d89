"""Every number in the README's measured tables is derived from data/ by the summary functions the notebooks use:
the README's blocks must equal what xstage.readme makes now (`make readme` rewrites them)."""
from __future__ import annotations

import pytest

from xstage import readme
from xstage.env import REPO_ROOT

pytestmark = pytest.mark.timeout(600)


@pytest.mark.parametrize("start, end, make", readme.BLOCKS, ids=["two-gpu record", "one-gpu record", "links and stage model"])
def test_readme_block_is_derived_from_the_data(start, end, make):
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert readme.block(text, start, end) == make(), "the README disagrees with data/: run `make readme`"


def test_a_readme_without_markers_is_one_clear_error(tmp_path):
    f = tmp_path / "README.md"
    f.write_text("# no tables here\n", encoding="utf-8")
    with pytest.raises(ValueError, match="has no markers"):
        readme.write_readme(f)
