"""Notebook 04's goals table (index.html): one clock per ratio, each verdict derived from its own number."""
from __future__ import annotations

import pytest

from xstage import ulysses_analysis, ulysses_sweep


@pytest.fixture(scope="module")
def recorded():
    return ulysses_sweep.ulysses_data("recorded", "h200x2")[0]


def test_goals_follow_their_numbers(recorded):
    g = ulysses_analysis.ulysses_goals(recorded, "2x H200").set_index("quantity")
    assert len(g) == 3 and all("2x H200" in q for q in g.index)
    sp = ulysses_analysis.ulysses_speedups(recorded)
    assert g.ours.iloc[0] == pytest.approx(sp[sp.line == "fused_e2e"].speedup.max())
    assert g.met.iloc[0] is None                     # the paper's number is a comparison, not a pass mark
    assert g.met.iloc[1] == (g.ours.iloc[1] <= ulysses_analysis.FUSED_OVER_ATTENTION_GOAL)
    assert g.met.iloc[2] == (g.ours.iloc[2] >= ulysses_analysis.ATTENTION_OVER_CUDNN_GOAL)


def test_a_record_without_cudnn_has_no_verdict(recorded):
    g = ulysses_analysis.ulysses_goals(recorded[recorded.method != "sdpa_only"])
    assert g.ours.iloc[2] is None or g.ours.isna().iloc[2]
    assert g.met.iloc[2] is None


# ------------------------------------------- the one-GPU host link: the record made after the fused-outputs fix
def test_one_gpu_host_numbers_come_from_the_record_after_the_fix():
    """The host link's numbers (studies, goals, the headline row) come from ulysses_host, whose fused
    outputs were destination buffers; run U2's record is read only by name and labelled as before the fix."""
    from xstage import data, ulysses_analysis

    d, m = ulysses_sweep.ulysses_data("recorded", "h200x1", link="host")
    assert ulysses_analysis.ULYSSES_ONE_GPU_RECORDS["host"] == "ulysses_host"
    assert data.ulysses_fused_outputs(m) == data.ULYSSES_FUSED_OUTPUTS == m["params"]["fused_outputs"]
    assert "pinned host memory" in d.attrs["world"] and "before the fix" not in d.attrs["world"]
    old, om = ulysses_sweep.ulysses_data("recorded", "h200x1", link="host", record=ulysses_analysis.ULYSSES_HOST_BEFORE_FIX)
    assert "fused outputs in device memory (before the fix)" in old.attrs["world"]
    assert om["date_utc"] < data.ULYSSES_OUTPUTS_FIX_UTC <= m["date_utc"]
    sp = ulysses_analysis.ulysses_speedups(d)
    e2e = sp[sp.line == "fused_e2e"].speedup
    row = [r for r in ulysses_analysis.headline() if r.where.startswith("PCIe")]
    assert len(row) == 1 and row[0].record == "data/h200x1/ulysses_host", row
    assert f"**{e2e.max():.2f}x**" in row[0].ours and f"{e2e.min():.2f}x" in row[0].ours, row
    g = ulysses_analysis.ulysses_goals(d, "one GPU, link host")
    assert g.ours.iloc[0] == pytest.approx(e2e.max())
    with pytest.raises(ValueError, match="names a recorded one-GPU folder"):
        ulysses_sweep.ulysses_data("auto", "h200x1", record=ulysses_analysis.ULYSSES_HOST_BEFORE_FIX)
