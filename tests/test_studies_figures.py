"""Study data access (xstage.sources, xstage.*_sweep), the figure builders (xstage.*_figures) and the model explorer, on the
recorded H200x2 data and on the simulated source."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from xstage import (burst_gap_analysis, burst_gap_figures, burst_gap_sweep, env, figures, fit, sources,
                    ulysses_analysis, ulysses_figures, ulysses_sweep)
from xstage.model import KIB, BurstGapParams, train

PROGRAMS = [1, 4, 16, 66, 132, 264]
SIM_PROGRAMS = list(burst_gap_sweep.SIMULATED_GRID["programs"])


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def recorded():
    df, meta = burst_gap_sweep.burst_gap_data("recorded")
    free, free_meta = burst_gap_sweep.burst_gap_data("recorded", variant="free_running")
    bw, _ = burst_gap_sweep.bandwidth_data("recorded", "h200x2")
    return df, free, bw, meta


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    out = tmp_path_factory.mktemp("sim")
    df, meta = burst_gap_sweep.burst_gap_data("simulated", out=out)
    free, _ = burst_gap_sweep.burst_gap_data("simulated", variant="free_running", out=out)
    return df, free, meta


@pytest.fixture(scope="module")
def fitted(recorded):
    return fit.fit_burst_gap(recorded[0], n_bootstrap=0, uncertainty="jacobian", k_folds=3)


def _nonempty(fig: go.Figure) -> None:
    for tr in fig.data:
        y = np.asarray(tr.y if tr.type != "table" else tr.cells.values[1], dtype=object)
        assert y.size > 0, f"trace {tr.name!r} has no data"
    assert fig.layout.title.text


# --------------------------------------------------------------------------------------------- data access
def test_sources_and_provenance(recorded, simulated):
    df, free, bw, meta = recorded
    assert meta["source"] == "recorded" and meta["machine"] == "h200x2"
    assert df.sync.all() and not free.sync.any()
    assert {"sm_store", "sm_tma_store", "ce_peer_copy"} <= set(bw.method)
    sdf, sfree, smeta = simulated
    assert smeta["source"] == "simulated" and smeta["machine"] == "simulated"
    assert sorted(sdf.programs.unique()) == SIM_PROGRAMS and set(sdf.target) == {"remote", "local"}
    assert sdf.sync.all() and not sfree.sync.any()
    assert "clock" not in sources.caption_provenance(meta)


@pytest.mark.parametrize("call, match", [
    (lambda: burst_gap_sweep.burst_gap_data("nope"), "source must be one of"),
    (lambda: burst_gap_sweep.burst_gap_data("recorded", machine="a100x8"), r"machine 'a100x8'.*recorded machines: h200x1, h200x2"),
    (lambda: burst_gap_sweep.burst_gap_data("recorded", variant="async"), "variant must be one of sync, free_running"),
    (lambda: burst_gap_sweep.bandwidth_data("recorded", "nowhere"), r"machine 'nowhere'.*h200x2"),
    (lambda: burst_gap_sweep.bandwidth_data("simulated", "h200x2"), "source 'simulated' has no bandwidth"),
    (lambda: sources.paper_number("megamoe", "min_speedup"), "no paper number megamoe/min_speedup"),
])
def test_bad_parameters_name_the_parameter(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.skipif(env.gpu_count() >= 2, reason="this machine has the GPUs")
def test_gpu_source_without_gpus_says_so():
    with pytest.raises(RuntimeError, match="needs 1 CUDA GPU"):
        burst_gap_sweep.burst_gap_data("gpu")


def test_select_and_pick_bursts_name_what_exists(recorded):
    df = recorded[0]
    with pytest.raises(ValueError, match=r"gap_us=2\.0 not in the data.*have \[0\.0, 1\.0, 3\.0"):
        burst_gap_analysis.select(df, "remote", 16, gap_us=2.0)
    with pytest.raises(ValueError, match="store_bytes=8 not in the data"):
        burst_gap_analysis.select(df, "remote", 8)
    with pytest.raises(ValueError, match="burst must be one of first, later, all"):
        burst_gap_analysis.pick_bursts(df, "middle")
    assert set(burst_gap_analysis.pick_bursts(df, "later").burst) == set(range(1, 8))


def test_paper_numbers_are_the_abstracts():
    df, meta = sources.paper_numbers()
    assert list(df.columns) == ["study", "metric", "value", "unit", "hardware"]
    got = {(s, m): v for s, m, v in zip(df.study, df.metric, df.value)}
    assert got == {("megamoe", "geomean_speedup"): 1.18, ("megamoe", "max_speedup"): 1.62,
                   ("ulysses", "fa3_max_sender_visible_speedup"): 1.43,
                   ("ulysses", "fa4_max_sender_visible_speedup"): 1.42}
    assert set(df.unit) == {"x"} and "84 configurations" in meta["metrics"]["megamoe/geomean_speedup"]


def test_slowdown_is_one_at_the_reference_and_smallest_burst(recorded):
    slow = burst_gap_analysis.slowdown_table(recorded[0])
    assert np.allclose(slow[slow.programs == 1].slowdown, 1.0)
    assert np.allclose(slow[slow.burst_bytes == 1024].slowdown, 1.0)
    # drain-limited: P programs at ~54 GB/s each against ~360 GB/s -> slowdown ~ P * 54 / 360
    big = slow[(slow.programs == 264) & (slow.burst_bytes == 4 << 20)].slowdown.item()
    assert 30 < big < 45


def test_recorded_numbers(recorded):
    """The numbers notebook 01's check cell prints (from the committed data)."""
    df, free, bw, _ = recorded
    assert (len(df), len(free), len(bw)) == (174720, 174720, 940)
    assert round(burst_gap_analysis.sm_over_ce(bw), 2) == 0.94
    onset = burst_gap_analysis.measured_onset(burst_gap_analysis.slowdown_table(df, "remote", 16, 0.0, "first"))
    assert {int(p): round(b / KIB) for p, b in onset.dropna().items()} == {16: 64, 66: 32, 132: 32, 264: 16}
    assert onset.loc[[1, 4]].isna().all()


def test_default_params_are_a_fit_or_the_reference(recorded):
    assert sources.default_params(None) == BurstGapParams.reference()
    p = sources.default_params(recorded[0])
    assert 10 < p.issue_ns_per_kib < 40 and 200 < p.drain_gbps < 500 and isinstance(p.drain_gbps, float)


# --------------------------------------------------------------------------------------------- figures
def test_sweep_figures_recorded(recorded, fitted):
    df, free, bw, _ = recorded
    cases = [
        (burst_gap_figures.issue_vs_burst(df), 12),                                              # 6 P x (remote, local)
        (burst_gap_figures.issue_vs_burst(df, "local", 4, "later", 10.0, control=False), 6),
        (burst_gap_figures.effective_bandwidth(df, reference={"copy engine": 396.0}), 12),
        (burst_gap_figures.burst_train(pd.concat([df, free])), 2 * 3 * 5),                      # variants x programs x gaps
        (burst_gap_figures.burst_train(df, programs=132, gaps_us=[0, 100]), 2),
        (burst_gap_figures.backpressure_map(df), 4),
        (burst_gap_figures.backpressure_map(df, params=fitted.params), 6),
        (burst_gap_figures.drain_vs_burst(df, params=fitted.params), 12),
        (burst_gap_figures.free_vs_sync(df, free), 2 * 2 * 3),
        (burst_gap_figures.bandwidth_bars(bw), 2),
    ]
    for fig, n in cases:
        assert len(fig.data) == n, fig.layout.title.text
        _nonempty(fig)
    assert [t.name for t in burst_gap_figures.issue_vs_burst(df).data[:2]] == ["P=1", "P=4"]
    assert "NVLink 0.936" in burst_gap_figures.bandwidth_bars(bw).layout.title.text


def test_sweep_figures_simulated(simulated):
    df, free, _ = simulated
    n = len(SIM_PROGRAMS)
    assert len(burst_gap_figures.issue_vs_burst(df).data) == 2 * n
    assert len(burst_gap_figures.effective_bandwidth(df).data) == 2 * n
    assert len(burst_gap_figures.burst_train(df).data) == 2 * 3          # P 66, 264 of (66, 132, 264); gaps 0, 10, 100
    assert len(burst_gap_figures.backpressure_map(df, params=BurstGapParams.reference()).data) == 6
    assert len(burst_gap_figures.free_vs_sync(df, free).data) == 2 * 2  # of the default configurations only (264, 16 KiB)
    for fig in (burst_gap_figures.issue_vs_burst(df), burst_gap_figures.burst_train(df), burst_gap_figures.backpressure_map(df)):
        _nonempty(fig)
    drain = burst_gap_figures.drain_vs_burst(df)
    assert len(drain.data) == 0 and "no drain runs" in drain.layout.annotations[0].text


def test_figures_reject_what_is_not_there(recorded):
    df = recorded[0]
    with pytest.raises(ValueError, match="none of programs"):
        burst_gap_figures.burst_train(df, programs=[7])
    with pytest.raises(ValueError, match="burst_bytes=3000 not in the data"):
        burst_gap_figures.burst_train(df, burst_bytes=3000)


def test_fit_figures(fitted):
    n = fitted.cfgs.programs.nunique()
    assert len(burst_gap_figures.fit_parity(fitted).data) == n + 2
    assert len(burst_gap_figures.fit_residuals(fitted).data) == n + 1
    assert len(burst_gap_figures.heldout_error(fitted).data) == 3
    table = burst_gap_figures.params_table_figure(fitted)
    assert len(table.data) == 1 and list(table.data[0].cells.values[0])[:3] == ["issue_ns_per_kib", "drain_gbps",
                                                                                "capacity_kib"]
    for fig in (burst_gap_figures.fit_parity(fitted), burst_gap_figures.fit_residuals(fitted), burst_gap_figures.heldout_error(fitted)):
        _nonempty(fig)


def test_timeline_follows_the_model():
    prm = BurstGapParams(18.8, 360.0, 976.0, 207.0)
    for P, b, g in [(1, 4096, 0.0), (16, 65536, 1000.0), (132, 32768, 1000.0), (264, 8192, 3000.0)]:
        T, q = train(b, P, g, 8, prm)
        t, qq, start, end = burst_gap_figures.train_timeline(prm, P, b, g, 8)
        assert np.allclose(end - start, T)
        assert np.all(np.diff(t) >= 0) and qq.max() <= prm.capacity_bytes * (1 + 1e-12) and qq[-1] == 0
        assert np.allclose([qq[np.flatnonzero(t == e)[-1]] for e in end], q)
    fig = burst_gap_figures.model_explorer_figure(prm)
    assert [tr.name for tr in fig.data] == ["predicted issue time", "backpressure-free", "outstanding q(t)",
                                            "capacity C"]


# --------------------------------------------------------------------------------------------- explorer
def test_explorer_updates_in_place():
    from xstage.explorer import PARAMS, SLIDERS, WORKLOAD, explorer

    ex = explorer(BurstGapParams(18.8, 360.0, 976.0, 207.0))
    assert set(ex.sliders) == set(SLIDERS) == set(PARAMS) | set(WORKLOAD)
    for name, w in ex.sliders.items():
        assert w.description and f"xstage-slider-{name}" in w._dom_classes
    assert "xstage-explorer-figure" in ex.figure._dom_classes and "xstage-explorer" in ex._dom_classes
    fig = ex.figure
    bars0, q0 = np.array(fig.data[0].y), np.array(fig.data[2].y)
    ex.sliders["capacity_kib"].value = 8192.0
    bars1 = np.array(fig.data[0].y)
    assert not np.allclose(bars0, bars1) and bars1[0] < bars0[0]     # a larger stage absorbs the first burst
    assert np.array(fig.data[3].y)[0] == pytest.approx(8192.0)
    ex.sliders["n_bursts"].value = 3
    assert len(fig.data[0].y) == 3 and not np.array_equal(np.array(fig.data[2].y), q0)
    ex.sliders["programs"].value = 4                                  # I < D: never stalls
    assert np.allclose(fig.data[0].y, fig.data[1].y)
    assert "132" not in fig.layout.title.text and "4 ×" in fig.layout.title.text


# --------------------------------------------------------------------------------------------- Ulysses
ULYSSES_FIGURES = ("ulysses_speedup", "ulysses_fused_over_attention", "ulysses_tflops", "ulysses_times")


@pytest.fixture(scope="module")
def ulysses_recorded():
    return ulysses_sweep.ulysses_data("recorded")


def _ulysses_many(df: pd.DataFrame) -> pd.DataFrame:
    """The DiT table and the S sweep on 2 and 8 ranks, made from the recorded seq_32k rows (times scaled by
    the FLOPs, so every method is present): the layout of many shapes and two rank counts."""
    from xstage.ulysses import DEFAULT_SHAPES

    base = df[df["shape"] == "seq_32k"]
    parts = []
    for P in (2, 8):
        for s in DEFAULT_SHAPES:
            if s.H % P == 0:
                f = (s.S / 32768) ** 2 * s.H / 24 * s.D / 128 * 2 / P
                parts.append(base.assign(shape=s.name, S=s.S, H=s.H, D=s.D, P=P,
                                         sender_visible_ms=base.sender_visible_ms * f,
                                         end_to_end_ms=base.end_to_end_ms * f))
    return pd.concat(parts, ignore_index=True)


def test_ulysses_recorded_source(ulysses_recorded):
    df, meta = ulysses_recorded
    assert meta["source"] == "recorded" and meta["schema"] == "ulysses" and meta["machine"] == "h200x2"
    assert {"fused", "serial_triton", "attention_only"} <= set(df.method)
    assert "clock" not in sources.caption_provenance(meta)


@pytest.mark.parametrize("call, match", [
    (lambda: ulysses_sweep.ulysses_data("simulated"), "the Ulysses study has no simulated source; use recorded or gpu"),
    (lambda: ulysses_sweep.ulysses_data("recorded", machine="a100x8"), r"machine 'a100x8'.*recorded machines: h200x2"),
    (lambda: ulysses_sweep.ulysses_data("nope"), "source must be one of"),
])
def test_ulysses_bad_parameters_name_the_parameter(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.skipif(env.gpu_count() >= 2, reason="this machine has the GPUs")
def test_ulysses_gpu_source_without_gpus_says_so():
    with pytest.raises(RuntimeError, match="needs 2 CUDA GPU"):
        ulysses_sweep.ulysses_data("gpu")


def test_ulysses_analyses(ulysses_recorded):
    df, _ = ulysses_recorded
    sp = ulysses_analysis.ulysses_speedups(df)
    for line in ("fused_sv", "fused_e2e"):
        s = sp[sp.line == line].set_index("shape")
        assert (s.low <= s.speedup).all() and (s.speedup <= s.high).all()
    ra = ulysses_analysis.ulysses_ratios(df).set_index("shape")
    assert (ra.sent_mb > 0).all() and ra.attention_over_sdpa.between(0.1, 2).all()
    head = ulysses_analysis.ulysses_headline(df)
    assert head["max_speedup_sv"][0] == pytest.approx(sp[sp.line == "fused_sv"].speedup.max())
    with pytest.raises(ValueError, match="no serial_triton rows"):
        ulysses_analysis.ulysses_speedups(df[df.method != "serial_triton"])


def test_ulysses_figures_recorded(ulysses_recorded):
    df, _ = ulysses_recorded
    for name in ULYSSES_FIGURES:
        fig = getattr(ulysses_figures, name)(df)
        assert len(fig.data) > 0, name
        _nonempty(fig)
    notes = [a.text for a in ulysses_figures.ulysses_speedup(df).layout.annotations]
    assert "paper FA3 (8 GPUs): 1.43×" in notes and "paper FA4 (8 GPUs): 1.42×" in notes
    assert not any("paper" in t for t in (a.text for a in ulysses_figures.ulysses_speedup(df, paper={}).layout.annotations))
    assert any("1.05" in a.text for a in ulysses_figures.ulysses_fused_over_attention(df).layout.annotations)
    names = {t.name for t in ulysses_figures.ulysses_speedup(df).data}
    assert any(n.startswith("fused: ") for n in names) and any(n.startswith("overlapped") for n in names)


@pytest.mark.parametrize("shapes", ["one", "many"])
def test_ulysses_figures_any_number_of_shapes(ulysses_recorded, shapes):
    df, _ = ulysses_recorded
    d = df[df["shape"] == df["shape"].iloc[0]] if shapes == "one" else _ulysses_many(df)
    n_shapes = d.groupby(["shape", "P"]).ngroups
    for name in ULYSSES_FIGURES:
        fig = getattr(ulysses_figures, name)(d)
        _nonempty(fig)
    panels = d.P.nunique()
    assert len(ulysses_figures.ulysses_speedup(d).layout.annotations) >= panels * 3   # serial + 2 paper lines per panel
    times = ulysses_figures.ulysses_times(d)
    assert len(times.data) == n_shapes * 7                                       # fused twice + 5 methods
    assert len(ulysses_figures.ulysses_tflops(d).data[0].y) == n_shapes
