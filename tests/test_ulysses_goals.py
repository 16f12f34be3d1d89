"""Notebook 04's goals table (index.html): one clock per ratio, each verdict derived from its own number."""
from __future__ import annotations

import pytest

from xstage import studies


@pytest.fixture(scope="module")
def recorded():
    return studies.ulysses_data("recorded", "h200x2")[0]


def test_goals_follow_their_numbers(recorded):
    g = studies.ulysses_goals(recorded, "2x H200").set_index("quantity")
    assert len(g) == 3 and all("2x H200" in q for q in g.index)
    sp = studies.ulysses_speedups(recorded)
    assert g.ours.iloc[0] == pytest.approx(sp[sp.line == "fused_e2e"].speedup.max())
    assert g.met.iloc[0] is None                     # the paper's number is a comparison, not a pass mark
    assert g.met.iloc[1] == (g.ours.iloc[1] <= studies.FUSED_OVER_ATTENTION_GOAL)
    assert g.met.iloc[2] == (g.ours.iloc[2] >= studies.ATTENTION_OVER_CUDNN_GOAL)


def test_a_record_without_cudnn_has_no_verdict(recorded):
    g = studies.ulysses_goals(recorded[recorded.method != "sdpa_only"])
    assert g.ours.iloc[2] is None or g.ours.isna().iloc[2]
    assert g.met.iloc[2] is None
