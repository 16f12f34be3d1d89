"""The MegaMoE study (notebook 03): data access (xstage.moe_sweep.megamoe_data), the speedup / summary / coverage
analyses (xstage.megamoe_analysis, xstage.megamoe_model_analysis), the figures (xstage.megamoe_figures) and the
notebook itself, on a small synthetic record built here; the README rows and docs page on the current records.

The synthetic rows are test input only (a seeded RNG; written to a temporary data root at most, never to
data/): the expected numbers are recomputed from them with plain numpy.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from xstage import data, env, moe_plan, moe_sweep, records, sources
from xstage import megamoe_analysis as analysis
from xstage import megamoe_figures as mfig
from xstage import megamoe_model_analysis as model_analysis
from xstage.model import BurstGapParams

# six configurations across the four shapes, the token range and the three routings
CONFIGS = ("deepseek_v4_flash_T128_uniform", "deepseek_v4_flash_T8192_hot", "deepseek_v4_pro_T1024_zipf",
           "qwen3_235b_T256_hot", "qwen3_235b_T4096_uniform", "mixtral_8x7b_T2048_zipf")
NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "03_megamoe_84.ipynb"


def synthetic_rows(configs=CONFIGS, dtypes=("bf16", "fp8"), schedules=moe_plan.SCHEDULES, P: int = 2, seed: int = 0,
                   grouped_mm: bool = True) -> pd.DataFrame:
    """Rows of schema xstage.data.MEGAMOE for ``configs``, times drawn from a seeded RNG."""
    rng = np.random.default_rng(seed)
    rows = []
    for case in moe_plan.cases_by_name(list(configs)):
        s = case.shape
        for dt in dtypes:
            ew = rng.uniform(0.2, 4.0)
            compute = ew * rng.uniform(0.6, 0.9)
            unfused = ew * rng.uniform(1.1, 2.5)
            n_rows = int(case.tokens * s.topk * rng.uniform(0.9, 1.4))
            for sched in schedules:
                k = ew if sched == "expert_wave" else ew / rng.uniform(0.85, 1.7)
                pred = 1.0 if sched == "expert_wave" else ew / k * rng.uniform(0.85, 1.15)
                rows.append(dict(
                    shape=s.name, hidden=s.hidden, intermediate=s.intermediate, experts=s.experts, topk=s.topk,
                    tokens=case.tokens, routing=case.routing, seed=case.seed, P=P, dtype=dt, schedule=sched,
                    schedule_param={"lag": "lag=132", "model_guided": "interleaved"}.get(sched, ""), block_m=64, n_tasks=int(rng.integers(100, 5000)), rows=n_rows,
                    remote_bytes=n_rows * s.hidden, kernel_ms=k, kernel_ms_min=0.97 * k, n_timed=20,
                    calls_per_run=2, tflops=100.0, compute_ms=compute, dispatch_ms=0.05 * ew,
                    layer_ms=k + rng.uniform(0.05, 0.3), unfused_ms=unfused,
                    grouped_mm_ms=compute * rng.uniform(0.5, 1.4) if grouped_mm else np.nan,
                    predicted_ms=k * rng.uniform(0.9, 1.1), predicted_speedup=pred,
                    **dict(zip(data.MEGAMOE_TILE_COLUMNS, data.MEGAMOE_FIRST_TILES[dt]))))   # the first kernels' tiles
    df = pd.DataFrame(rows)
    for col, dtype in data.MEGAMOE.columns.items():   # any column the schema gains later: a neutral value
        if col not in df:
            df[col] = "" if dtype == "str" else np.nan if dtype.startswith("float") else 0
    return df[list(data.MEGAMOE.columns)].astype(data.MEGAMOE.columns)


def record(root: Path, df: pd.DataFrame, machine: str = "h200x2/megamoe", params: dict | None = None) -> Path:
    """``df`` as a recorded sweep under ``root``/<machine> (a temporary data root), with a sidecar."""
    folder = root / machine
    meta = {"machine": machine, "gpu_name": "NVIDIA H200", "gpu_count": 2, "driver": "test", "torch": "test",
            "triton": "test", "git_commit": "test", "date_utc": "2026-01-01T00:00:00Z",
            "command": "synthetic test rows", "params": params or {}}
    csv = data.start_file(folder, data.MEGAMOE, meta)
    data.append_rows(csv, data.MEGAMOE, df)
    return folder


@pytest.fixture
def rows() -> pd.DataFrame:
    return synthetic_rows()


@pytest.fixture
def data_root(tmp_path, monkeypatch):
    """An empty data root in place of data/ (studies and xstage.data read data.DATA_ROOT at call time)."""
    monkeypatch.setattr(data, "DATA_ROOT", tmp_path)
    _clear_record_caches()   # the record summaries are cached per process (the README rows read them once)
    yield tmp_path
    _clear_record_caches()


def _clear_record_caches() -> None:
    for fn in vars(analysis).values():
        if hasattr(fn, "cache_clear"):
            fn.cache_clear()


def _ref(df: pd.DataFrame) -> dict:
    """(config, dtype, schedule) -> the row's numbers, and the expert_wave kernel time per (config, dtype)."""
    names = df["shape"] + "_T" + df.tokens.astype(str) + "_" + df.routing
    out = {(n, d, s): r for n, d, s, r in zip(names, df.dtype, df.schedule, df.to_dict("records"))}
    ew = {(n, d): r["kernel_ms"] for (n, d, s), r in out.items() if s == "expert_wave"}
    return {"rows": out, "ew": ew}


# --------------------------------------------------------------------------------------------- analyses
def test_speedups_match_a_direct_computation(rows):
    sp = analysis.speedups(rows)
    ref = _ref(rows)
    assert len(sp) == len(rows) == len(CONFIGS) * 2 * len(moe_plan.SCHEDULES)
    assert list(sp.config.drop_duplicates()) == [c.name for c in moe_plan.CASES if c.name in CONFIGS]  # table order
    for r in sp.itertuples():
        x = ref["rows"][(r.config, r.dtype, r.schedule)]
        meas = ref["ew"][(r.config, r.dtype)] / x["kernel_ms"]
        flops = 6.0 * x["rows"] * x["hidden"] * x["intermediate"]      # Linear-1 (gate, up) + Linear-2
        np.testing.assert_allclose(
            [r.speedup, r.predicted_speedup, r.model_error, r.fused_speedup, r.gemm_efficiency, r.compute_tflops,
             r.grouped_mm_tflops],
            [meas, x["predicted_speedup"], (x["predicted_speedup"] - meas) / meas, x["unfused_ms"] / x["layer_ms"],
             x["grouped_mm_ms"] / x["compute_ms"], flops / x["compute_ms"] / 1e9, flops / x["grouped_mm_ms"] / 1e9],
            rtol=1e-12)
    assert (sp[sp.schedule == "expert_wave"].speedup == 1.0).all()


def test_summary_matches_numpy(rows):
    summ = analysis.summary(rows).set_index(["dtype", "schedule"])
    ref = _ref(rows)
    assert list(summ.index.get_level_values("schedule")[:4]) == list(moe_plan.SCHEDULES)
    for (dt, sched), r in summ.iterrows():
        mine = [(n, x) for (n, d, s), x in ref["rows"].items() if d == dt and s == sched]
        meas = np.array([ref["ew"][(n, dt)] / x["kernel_ms"] for n, x in mine])
        pred = np.array([x["predicted_speedup"] for _, x in mine])
        fused = np.array([x["unfused_ms"] / x["layer_ms"] for _, x in mine])
        gemm = np.array([x["grouped_mm_ms"] / x["compute_ms"] for _, x in mine])
        assert r.configs == len(CONFIGS) and r.expected == 84
        assert r.geomean_speedup == pytest.approx(np.exp(np.mean(np.log(meas))), rel=1e-12)
        assert r.max_speedup == pytest.approx(meas.max(), rel=1e-12)
        assert r.geomean_predicted == pytest.approx(np.exp(np.mean(np.log(pred))), rel=1e-12)
        assert r.fused_geomean == pytest.approx(np.exp(np.mean(np.log(fused))), rel=1e-12)
        assert r.fused_min == pytest.approx(fused.min(), rel=1e-12)
        assert r.gemm_efficiency_geomean == pytest.approx(np.exp(np.mean(np.log(gemm))), rel=1e-12)
        if sched == "expert_wave":
            assert r.geomean_speedup == 1.0 and math.isnan(r.within_tolerance) and pd.isna(r.max_config)
        else:
            err = np.abs(pred - meas) / meas
            assert r.within_tolerance == pytest.approx(np.mean(err <= 0.10))
            assert r.median_abs_model_error == pytest.approx(np.median(err))
            assert r.max_config == mine[int(np.argmax(meas))][0]


def test_summary_follows_the_data(rows):
    """Twice as fast on one configuration: that configuration's speedup doubles, so the geomean over n grows by
    2^(1/n) and nothing else of the row moves."""
    before = analysis.summary(rows).set_index(["dtype", "schedule"])
    faster = rows.copy()
    hit = (faster["shape"] == "qwen3_235b") & (faster.tokens == 256) & (faster.dtype == "fp8") & (
        faster.schedule == "lag")
    assert hit.sum() == 1
    faster.loc[hit, "kernel_ms"] /= 2
    after = analysis.summary(faster).set_index(["dtype", "schedule"])
    assert after.loc[("fp8", "lag"), "geomean_speedup"] == pytest.approx(
        before.loc[("fp8", "lag"), "geomean_speedup"] * 2 ** (1 / len(CONFIGS)), rel=1e-12)
    unchanged = after.drop(index=("fp8", "lag"))
    pd.testing.assert_frame_equal(unchanged, before.drop(index=("fp8", "lag")))


def test_missing_configurations_are_counted_never_dropped(rows):
    gone = rows[~((rows.dtype == "fp8") & rows["shape"].isin(["qwen3_235b", "mixtral_8x7b"]))]   # 3 fp8 configs
    no_base = (gone["shape"] == "deepseek_v4_pro") & (gone.dtype == "bf16") & (gone.schedule == "expert_wave")
    gone = gone[~no_base]                                                   # one bf16 config without a baseline
    cov = analysis.coverage(gone).set_index("dtype")
    assert cov.loc["bf16", ["P", "expected", "present", "complete"]].tolist() == [2, 84, 6, 5]
    assert cov.loc["fp8", ["P", "expected", "present", "complete"]].tolist() == [2, 84, 3, 3]
    assert len(cov.loc["fp8", "missing"]) == 81 and "qwen3_235b_T256_hot" in cov.loc["fp8", "missing"]
    assert "deepseek_v4_pro_T1024_zipf" not in cov.loc["bf16", "missing"]     # present, just incomplete
    line = analysis.coverage_line(analysis.coverage(gone))
    assert line.startswith("bf16: 6 of 84 configurations (5 with every schedule), missing ")
    assert "fp8: 3 of 84 configurations (3 with every schedule)" in line and "(+78 more)" in line
    # the incomplete configuration keeps its rows (NaN speedups); the summary counts what it can compute
    sp = analysis.speedups(gone)
    inc = sp[(sp.config == "deepseek_v4_pro_T1024_zipf") & (sp.dtype == "bf16")]
    assert len(inc) == 3 and inc.speedup.isna().all() and inc.fused_speedup.notna().all()
    summ = analysis.summary(gone).set_index(["dtype", "schedule"])
    assert summ.loc[("bf16", "interleaved"), "configs"] == 5 and summ.loc[("fp8", "interleaved"), "configs"] == 3
    # a selection of shapes expects 21 configurations per shape; a dtype without rows is listed with 0
    cov = analysis.coverage(gone[gone.dtype == "bf16"], shapes=["qwen3_235b"]).set_index("dtype")
    assert cov.loc["bf16", ["expected", "present"]].tolist() == [21, 2]
    assert cov.loc["fp8", ["expected", "present", "complete"]].tolist() == [21, 0, 0]
    assert len(analysis.expected_configs()) == 84 and len(analysis.expected_configs(["mixtral_8x7b"])) == 21
    with pytest.raises(ValueError, match="no MegaMoE rows"):
        analysis.speedups(rows.iloc[:0])


@pytest.mark.parametrize("how", ["absent", "all NaN", "NaN for fp8"])
def test_grouped_mm_absent_or_nan(rows, how):
    d = {"absent": rows.drop(columns="grouped_mm_ms"), "all NaN": rows.assign(grouped_mm_ms=np.nan),
         "NaN for fp8": rows.assign(grouped_mm_ms=rows.grouped_mm_ms.where(rows.dtype == "bf16"))}[how]
    sp = analysis.speedups(d)
    assert sp.speedup.notna().all() and sp.compute_tflops.notna().all()
    assert sp[sp.dtype == "fp8"].gemm_efficiency.isna().all()
    summ = analysis.summary(d)
    goals = analysis.goals(summ)
    gemm = goals[goals.quantity.str.startswith("GEMM")].set_index("dtype")
    assert gemm.loc["fp8", "met"] is None and math.isnan(gemm.loc["fp8", "ours"])
    assert analysis.caption_lines(summ)["gemm"].endswith("fp8: torch._grouped_mm not recorded")
    fig = mfig.gemm_figure(d)
    ratio = [t for t in fig.data if t.name == "ours ÷ torch._grouped_mm"]
    if how == "NaN for fp8":
        assert len(ratio) == 2 and len(ratio[1].y) == 0 and len(ratio[0].y) == len(CONFIGS)
        assert any("not recorded for this dtype" in a.text for a in fig.layout.annotations)
    else:
        assert not ratio and "not recorded in this data" in fig.layout.title.text
        assert {t.name for t in fig.data} == {"our kernel, compute only"}


def test_goals_and_headline(rows):
    summ = analysis.summary(rows)
    goals = analysis.goals(summ, "interleaved")
    assert len(goals) == 5 * 2 and set(goals.schedule) == {"interleaved"}
    paper = goals[goals.quantity.str.contains("paper")]
    assert sorted(set(paper.target)) == [1.18, 1.62] and paper.met.isna().all()
    model = goals[goals.quantity.str.startswith("model")]
    assert (model.target == 1.0).all() and all((m is True) == (o >= 1.0) for m, o in zip(model.met, model.ours))
    fused = goals[goals.quantity.str.startswith("fused")].set_index("dtype")
    assert fused.loc["bf16", "target"] == analysis.FUSED_OVER_UNFUSED_GOAL == 1.3
    assert fused.loc["bf16", "met"] is bool(fused.loc["bf16", "ours"] >= 1.3)
    s = summ.set_index(["dtype", "schedule"])
    head = analysis.caption_lines(summ, "interleaved")
    assert f"bf16: interleaved {s.loc[('bf16', 'interleaved'), 'geomean_speedup']:.2f}x geomean" in head["speedup"]
    assert "(6/84 configs)" in head["speedup"]
    with pytest.raises(ValueError, match="no lag rows"):
        analysis.goals(analysis.summary(rows, schedules=["expert_wave", "interleaved"]), "lag")


# --------------------------------------------------------------------------------------------- figures
def _notes(fig) -> list[str]:
    return [a.text for a in fig.layout.annotations]


def test_figures_build_and_show_the_computed_numbers(rows):
    summ = analysis.summary(rows).set_index(["dtype", "schedule"])
    n_routings = rows.routing.nunique()
    fig = mfig.speedup_figure(rows)
    assert len(fig.data) == 3 * 2 * n_routings                      # (schedules but expert_wave) x dtypes x routings
    assert sum(len(t.x) for t in fig.data) == 3 * 2 * len(CONFIGS)
    notes = _notes(fig)
    assert "paper geomean 1.18×" in notes and "paper max 1.62×" in notes
    for dt in ("bf16", "fp8"):
        r = summ.loc[(dt, "interleaved")]
        want = f"geomean <b>{r.geomean_speedup:.2f}×</b> · max <b>{r.max_speedup:.2f}×</b> ({len(CONFIGS)} configs)"
        assert want in notes
    assert not any("paper" in t for t in _notes(mfig.speedup_figure(rows, paper={})))
    one = mfig.speedup_figure(rows, ["interleaved"])
    assert {t.xaxis for t in one.data} == {"x", "x2"}                # one row, two dtypes

    parity = mfig.model_parity_figure(rows)
    assert len(parity.data) == 3 + 3 * 2
    inside = summ.loc[("fp8", "lag"), "within_tolerance"]
    assert f"lag · fp8: {inside:.0%} within ±10%" in {t.name for t in parity.data}

    fused = mfig.fused_figure(rows)
    assert len(fused.data) == 4 * 2 * n_routings
    assert "goal: geomean ≥ 1.3×" in _notes(fused)
    r = summ.loc[("bf16", "expert_wave")]
    assert f"geomean <b>{r.fused_geomean:.2f}×</b> · min {r.fused_min:.2f}× ({len(CONFIGS)} configs)" in _notes(fused)

    gemm = mfig.gemm_figure(rows)
    assert len(gemm.data) == 2 * 3 and "goal ≥ 0.7" in _notes(gemm)
    for f in (fig, parity, fused, gemm):
        assert f.layout.title.text and all(len(t.y) for t in f.data if t.name)


def test_figures_reject_what_is_not_there(rows):
    with pytest.raises(ValueError, match=r"none of schedules=\['lag'\] is in the data"):
        mfig.speedup_figure(rows[rows.schedule != "lag"], ["lag"])
    with pytest.raises(ValueError, match="none of schedules"):
        mfig.model_parity_figure(rows, ["expert_wave"])


# --------------------------------------------------------------------------------------------- parameters, data
@pytest.mark.parametrize("kw, match", [
    (dict(dtypes=["fp16"]), r"dtypes: unknown 'fp16'; choose from bf16, fp8"),
    (dict(dtypes="bf16"), r"dtypes must be a list of names, e\.g\. \['bf16', 'fp8'\], got 'bf16'"),
    (dict(dtypes=[]), "dtypes must name at least one of bf16, fp8"),
    (dict(schedules=["interleaved", "interleaved"]), "schedules lists a name twice"),
    (dict(schedules=["fastest"]), r"schedules: unknown 'fastest'; choose from expert_wave, interleaved"),
    (dict(schedules=["expert_wave"]), r"schedules must name at least one of interleaved, lag, model_guided"),
    (dict(shapes=["llama3_70b"]), r"shapes: unknown 'llama3_70b'; choose from deepseek_v4_flash"),
])
def test_bad_parameters_name_the_parameter(kw, match):
    with pytest.raises(ValueError, match=match):
        analysis.selection(**kw)


def test_selection_is_normalised_to_table_order():
    sel = analysis.selection(["fp8", "bf16"], ["model_guided", "expert_wave", "lag"], ["mixtral_8x7b"])
    assert sel == {"dtypes": ["bf16", "fp8"], "schedules": ["expert_wave", "lag", "model_guided"],
                   "shapes": ["mixtral_8x7b"]}
    assert analysis.selection()["schedules"] == list(moe_plan.SCHEDULES)
    assert analysis.selection(schedules=["lag"])["schedules"] == ["expert_wave", "lag"]


def test_sources(rows, data_root):
    with pytest.raises(sources.NoRecordedData) as e:
        moe_sweep.megamoe_data("recorded", "h200x2")
    assert str(e.value) == "no recorded MegaMoE data for machine h200x2; run `xstage sweep megamoe` on 2 GPUs"
    assert isinstance(e.value, ValueError)
    with pytest.raises(ValueError, match="the MegaMoE study has no simulated source; use recorded or gpu"):
        moe_sweep.megamoe_data("simulated")
    with pytest.raises(ValueError, match="source must be one of"):
        moe_sweep.megamoe_data("cloud")
    with pytest.raises(ValueError, match="dtypes: unknown 'int8'"):     # checked before any data is looked for
        moe_sweep.megamoe_data("recorded", "h200x2", dtypes=["int8"])
    record(data_root, rows)
    df, meta = moe_sweep.megamoe_data("recorded", "h200x2")
    assert meta["source"] == "recorded" and meta["schema"] == "megamoe" and len(df) == len(rows)
    pd.testing.assert_frame_equal(analysis.summary(df), analysis.summary(rows))
    df, _ = moe_sweep.megamoe_data("recorded", "h200x2", dtypes=["fp8"], shapes=["qwen3_235b"])
    assert set(df.dtype) == {"fp8"} and set(df["shape"]) == {"qwen3_235b"} and len(df) == 2 * 4
    record(data_root, rows[rows["shape"] != "mixtral_8x7b"], machine="partial/megamoe")
    with pytest.raises(sources.NoRecordedData, match=r"partial/megamoe/megamoe\.csv has no rows of dtypes \['bf16'\] and "
                                                     r"shapes \['mixtral_8x7b'\] yet \(40 rows of others\)"):
        moe_sweep.megamoe_data("recorded", "partial", dtypes=["bf16"], shapes=["mixtral_8x7b"])
    with pytest.raises(sources.NoRecordedData, match="recorded machines: h200x2, partial"):
        moe_sweep.megamoe_data("recorded", "a100x8")
    with pytest.raises(sources.NoRecordedData, match=r"with dynamic assignment for machine h200x2; run `xstage "
                                                     r"sweep megamoe --assignment dynamic --out data/h200x2/dynamic`"):
        moe_sweep.megamoe_data("recorded", "h200x2", assignment="dynamic")
    dyn = rows[rows["shape"] == "qwen3_235b"]
    record(data_root, dyn, machine="h200x2/dynamic")                  # data/<machine>/dynamic/megamoe.csv
    df, _ = moe_sweep.megamoe_data("recorded", "h200x2", assignment="dynamic")
    assert len(df) == len(dyn) and set(df["shape"]) == {"qwen3_235b"}


@pytest.mark.skipif(env.gpu_count() >= 2, reason="this machine has the GPUs")
def test_gpu_source_without_gpus_says_so():
    with pytest.raises(RuntimeError, match="needs 2 CUDA GPU"):
        moe_sweep.megamoe_data("gpu")


# --------------------------------------------------------------------------------------------- the notebook
def test_notebook_parameters_are_typed_for_reproduce():
    from xstage import reproduce

    params = reproduce.inspect_parameters(NOTEBOOK)
    assert {k: v["type"] for k, v in params.items()} == {
        "source": "str", "machine": "str", "dtypes": "list[str]", "schedules": "list[str]", "shapes": "list[str]",
        "assignment": "str"}
    got = reproduce.resolve_parameters([NOTEBOOK], {"dtypes": "fp8", "shapes": "qwen3_235b,mixtral_8x7b"})[NOTEBOOK]
    assert got == {"source": "auto", "dtypes": ["fp8"], "shapes": ["qwen3_235b", "mixtral_8x7b"]}
    nb = json.loads(NOTEBOOK.read_text())
    assert not any(c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code")
    # every cell after the loading one shows nothing without data (the cell of the records by link loads its own:
    # each record it lacks is a note)
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    assert all("if have_data:" in c or "except sources.NoRecordedData" in c for c in code[2:])


def run_notebook(monkeypatch, **params) -> dict:
    """The notebook's code cells in this process (so a test data root applies), with ``params`` injected after
    the parameters cell; returns its namespace (``_shown``: what it displayed)."""
    monkeypatch.delenv("XSTAGE_RUN_DIR", raising=False)
    nb = json.loads(NOTEBOOK.read_text())
    shown = []
    ns = {"display": shown.append, "_shown": shown}
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        exec(compile("".join(cell["source"]), str(NOTEBOOK), "exec"), ns)
        if "parameters" in cell["metadata"].get("tags", []):
            ns.update(params)
    return ns


def test_notebook_without_data_says_so_and_shows_nothing(data_root, monkeypatch, capsys):
    ns = run_notebook(monkeypatch, source="recorded")
    out = capsys.readouterr().out.splitlines()
    pcie = ("note: no recorded MegaMoE data for one H200, 2 ranks in one process, combine over PCIe (Gen 5 x16) to "
            "host memory (data/h200x1/megamoe_pcie); run `xstage sweep megamoe --world one-gpu --ranks 2 --link host "
            "--out data/h200x1/megamoe_pcie`")
    assert out[0] == pcie and out[6] == pcie and out[1].startswith("note: no timed runs recorded in ")
    for line, rec in zip(out[2:5], ("megamoe_controls", "megamoe_gemm_bf16", "megamoe_gemm_fp8")):
        assert line.startswith(f"note: no recorded {rec} for h200x1 (data/h200x1/{rec}); run `python3 "
                               "scripts/megamoe_gemm.py --study "), line
    assert out[5] == "no recorded MegaMoE data for machine h200x2; run `xstage sweep megamoe` on 2 GPUs"
    assert out[7].startswith("note: no recorded MegaMoE data for 2 H200s, one rank per GPU, combine over NVLink "
                             "(data/h200x2/megamoe); run `xstage sweep megamoe")
    assert out[8].startswith("note: no sealed 8-GPU prediction in "), out[8]   # the prediction cell: one note
    assert out[9:] == ["no MegaMoE data: nothing to check"]
    assert ns["have_data"] is False and ns["_shown"] == []


def test_notebook_with_data(rows, data_root, monkeypatch, capsys):
    import plotly.graph_objects as go

    record(data_root, rows[~((rows.dtype == "fp8") & (rows["shape"] == "qwen3_235b"))])
    ns = run_notebook(monkeypatch, source="recorded", schedules=["interleaved", "model_guided"])
    out = capsys.readouterr().out
    assert ns["have_data"] is True and ns["main"] == "interleaved"
    assert "bf16: 6 of 84 configurations (6 with every schedule); fp8: 4 of 84 configurations" in out
    figs = [x for x in ns["_shown"] if isinstance(x, go.Figure)]
    tables = [x for x in ns["_shown"] if isinstance(x, pd.DataFrame)]
    assert len(figs) == 5 and len(tables) == 3          # no PCIe record: the NVLink one alone
    assert set(tables[0].schedule) == {"expert_wave", "interleaved", "model_guided"}
    nvlink = "2 H200s, one rank per GPU, combine over NVLink; the first kernels"
    assert all(r.startswith(nvlink) for r in tables[2].record)
    assert "combine over NVLink" in figs[0].layout.title.text and "note: no recorded MegaMoE data for one H200" in out
    record(data_root, rows[rows["shape"] == "qwen3_235b"], machine="h200x1/megamoe_pcie", params=HOST_PARAMS)
    ns = run_notebook(monkeypatch, source="recorded")
    figs = [x for x in ns["_shown"] if isinstance(x, go.Figure)]
    assert len(figs) == 7 and "combine over PCIe (Gen 5 x16) to host memory (rank 0's times)" in figs[0].layout.title.text
    assert "host link's stage model" in figs[1].layout.title.text
    assert "no timed runs recorded" in capsys.readouterr().out
    assert "fp8: interleaved" in ns["head"]["speedup"] and "(4/84 configs)" in ns["head"]["speedup"]
    with pytest.raises(ValueError, match="shapes: unknown 'gpt4'"):
        run_notebook(monkeypatch, source="recorded", shapes=["gpt4"])
    with pytest.raises(ValueError, match="assignment must be one of static, dynamic, got 'greedy'"):
        run_notebook(monkeypatch, source="recorded", assignment="greedy")


def test_order_cost_against_a_direct_computation(rows):
    """extra = schedule - Expert-Wave kernel time, drain = remote bytes / rate, beyond = |extra| > drain, and
    Expert-Wave's combine cost = kernel / compute-only - 1, each checked config by config; the line and the
    figure say the computed counts."""
    drain_gbps = 300.0
    cost = model_analysis.order_cost(rows, drain_gbps)
    assert set(cost.schedule) == set(moe_plan.SCHEDULES) - {"expert_wave"}
    assert len(cost) == len(rows) - len(rows[rows.schedule == "expert_wave"])
    key = ["shape", "tokens", "routing", "P", "dtype"]
    ew = rows[rows.schedule == "expert_wave"].set_index(key)
    for r in cost.sample(8, random_state=0).itertuples():
        e = ew.loc[(r.shape, r.tokens, r.routing, r.P, r.dtype)]
        mine = rows[(rows["shape"] == r.shape) & (rows.tokens == r.tokens) & (rows.routing == r.routing)
                    & (rows.dtype == r.dtype) & (rows.schedule == r.schedule)].iloc[0]
        assert r.extra_ms == pytest.approx(mine.kernel_ms - e.kernel_ms)
        assert r.drain_ms == pytest.approx(mine.remote_bytes / (drain_gbps * 1e9) * 1e3)
        assert r.beyond_stage == (abs(r.extra_ms) > r.drain_ms)
        assert r.ew_comm_share == pytest.approx(e.kernel_ms / e.compute_ms - 1)
    line = model_analysis.order_cost_line(cost)
    for d, g in cost.groupby("dtype"):
        assert f"in {int(g.beyond_stage.sum())} of {len(g)} cases" in line
    fig = mfig.order_cost_figure(cost)
    assert any(f"outside the wedge: {int(cost[cost.dtype == 'bf16'].beyond_stage.sum())} of" in n for n in _notes(fig))
    with pytest.raises(ValueError, match="drain_gbps must be > 0"):
        model_analysis.order_cost(rows, 0.0)


def test_revised_model_on_recorded_rows(rows):
    """The revised model (busiest program) on rows of real configurations: Expert-Wave's own speedup is 1, the
    other schedules' revised speedups are the ratio of the model's times, interleaved's period-3 pattern
    (divides 132 programs) is predicted slower than Expert-Wave where it loads a third of the programs with
    every Linear-1 tile; a record whose model_guided choice names no candidate is refused."""
    sub = rows[rows["shape"].isin(["deepseek_v4_flash", "qwen3_235b"]) & rows.tokens.isin([128, 4096])
               & (rows.routing == "uniform")]                 # deepseek_v4_flash_T128, qwen3_235b_T4096
    assert len(sub.groupby(["shape", "tokens"])) == 2
    meta = {"sm_count": 132, "params": {}}
    revised, table = model_analysis.revised_model(sub, meta)
    rp = model_analysis.repredict(sub, BurstGapParams.reference(), 132)
    assert (rp[rp.schedule == "expert_wave"].model_speedup == 1).all()
    for _, g in rp.groupby(["shape", "tokens", "dtype"]):
        ew = g[g.schedule == "expert_wave"].model_ms.iloc[0]
        assert np.allclose(g.model_speedup, ew / g.model_ms)
        iv = g[g.schedule == "interleaved"].iloc[0]
        assert iv.imbalance > g[g.schedule == "expert_wave"].imbalance.iloc[0] and iv.model_speedup < 1
    assert set(table.schedule) == {"interleaved", "lag", "model_guided"}
    assert revised.predicted_speedup.notna().all()
    bad = sub.copy()
    bad.loc[bad.schedule == "model_guided", "schedule_param"] = "banana"
    with pytest.raises(ValueError, match="model_guided's recorded choice 'banana' names no candidate"):
        model_analysis.repredict(bad, BurstGapParams.reference(), 132)


def test_order_cost_splits_order_and_communication_when_recorded(rows):
    """Rows with each schedule's compute-only control: order_ms = its control - Expert-Wave's, comm_ms = its
    kernel - its control, and the line reports both; rows without the control (NaN) leave them out."""
    ctl = rows.copy()
    ctl["compute_sched_ms"] = ctl.compute_ms * np.where(ctl.schedule == "expert_wave", 1.0, 1.1)
    cost = model_analysis.order_cost(ctl, 300.0)
    ew = ctl[ctl.schedule == "expert_wave"].set_index(["shape", "tokens", "routing", "dtype"])
    for r in cost.sample(5, random_state=1).itertuples():
        e = ew.loc[(r.shape, r.tokens, r.routing, r.dtype)]
        assert r.order_ms == pytest.approx(0.1 * e.compute_ms)
        assert r.comm_ms == pytest.approx(r.kernel_ms - 1.1 * e.compute_ms)
    assert "on the tile order" in model_analysis.order_cost_line(cost)
    old = model_analysis.order_cost(rows.assign(compute_sched_ms=np.nan), 300.0)
    assert old.order_ms.isna().all() and "tile order" not in model_analysis.order_cost_line(old)


def test_the_study_reads_only_the_planning_module():
    """The analysis and figures import MegaMoE's CPU planning module only (no GPU module, no sweep), and the
    planning module imports neither the analysis nor the GPU side: no import circle."""
    import subprocess
    import sys

    code = ("import sys, xstage.moe_plan; a = set(sys.modules); import xstage.megamoe_analysis, xstage.megamoe_figures; "
            "print(sorted(m for m in a if m.startswith('xstage.')), sorted(m for m in sys.modules "
            "if m.startswith('xstage.')), sep='\\n')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    plan, both = (set(eval(line)) for line in out.splitlines())   # two printed lists of module names
    assert "xstage.moe_plan" in plan and not plan & {"xstage.megamoe_analysis", "xstage.moe", "xstage.moe_sweep"}
    assert not both & {"xstage.moe", "xstage.moe_sweep", "xstage.ulysses_sweep", "xstage.traffic"}


HOST_PARAMS = {"world": "one-gpu", "link": "host", "world_size": 2, "observed_rank": 0}


def test_records_by_world_and_link(rows, data_root):
    """The NVLink x2 and the one-GPU host-link records side by side: labels from the sidecars, the summary's
    speedups, and the compute-only controls against a direct computation from the rows."""
    with pytest.raises(sources.NoRecordedData, match=r"run `xstage sweep megamoe --world one-gpu --ranks 2 --link "
                                                     r"host --out data/h200x1/megamoe_pcie`"):
        analysis.world_data("one-gpu", "host")
    with pytest.raises(ValueError, match=r"\(world, link\) must be one of"):
        analysis.world_data("one-gpu", "nvlink")
    host = rows.copy()
    host["compute_sched_ms"] = host.kernel_ms * np.random.default_rng(3).uniform(0.7, 1.0, len(host))
    record(data_root, rows)
    record(data_root, host, machine="h200x1/megamoe_pcie", params=HOST_PARAMS)
    recs = {}
    for w, lk in (("gpus", "nvlink"), ("one-gpu", "host")):
        d, m = analysis.world_data(w, lk, dtypes=["fp8"])
        assert set(d.dtype) == {"fp8"}
        recs[m["label"]] = (d, m)
    first = "; the first kernels (static assignment, pointer main loops, row-block-major tiles)"
    assert list(recs) == ["2 H200s, one rank per GPU, combine over NVLink" + first,
                          "one H200, 2 ranks in one process, combine over PCIe (Gen 5 x16) to host memory (rank 0's "
                          "times)" + first]
    now = analysis.world_label({"params": {**HOST_PARAMS, "tiles_version": moe_plan.TILES_VERSION,
                                           "order_version": moe_plan.ORDER_VERSION, "assignment": "dynamic",
                                           "lag_version": moe_plan.LAG_VERSION}})
    assert now.endswith("(rank 0's times); the current kernels (dynamic assignment, TMA main loops, swizzled tiles)")
    t = analysis.links_table(recs).set_index(["record", "schedule"])
    lab = list(recs)[1]
    summ = analysis.summary(recs[lab][0]).set_index("schedule")
    assert t.loc[(lab, "interleaved"), "geomean_speedup"] == pytest.approx(summ.loc["interleaved", "geomean_speedup"])
    assert t.loc[(list(recs)[0], "interleaved")][["compute_only_geomean"]].isna().all()   # NaN: not recorded
    h = host[host.dtype == "fp8"].assign(config=lambda x: x["shape"] + "_T" + x.tokens.astype(str) + x.routing)
    ew = h[h.schedule == "expert_wave"].set_index("config")
    for sched in ("interleaved", "lag"):
        x = h[h.schedule == sched].set_index("config")
        order = x.compute_sched_ms / ew.compute_sched_ms
        comb = x.kernel_ms / x.compute_sched_ms
        got = t.loc[(lab, sched)]
        assert got.compute_only_geomean == pytest.approx(math.exp(np.log(order).mean()))
        assert got.compute_only_worst == pytest.approx(order.max())
        assert got.combine_cost_max == pytest.approx(comb.max())
    assert t.loc[(lab, "expert_wave"), "compute_only_worst"] == 1.0



def test_recorded_host_link_sweep_has_all_84_configurations_per_dtype():
    try:
        df, meta = analysis.world_data("one-gpu", "host")
    except sources.NoRecordedData:
        pytest.skip("no recorded host-link sweep")
    cov = analysis.coverage(df, **analysis.selection())
    assert "84 of 84" in analysis.coverage_line(cov, show=0), analysis.coverage_line(cov, show=0)


# ------------------------------------------------------------------- the current records: README and docs
ROOT = Path(__file__).resolve().parents[1]


def test_headline_rows_read_the_current_records():
    rows = analysis.headline()
    assert 1 <= len(rows) <= 5
    current = {f"data/{r.machine}/{r.folder}" for r in records.records()}
    assert all(h.record in current and h.notebook == "03" and h.ours and h.where for h in rows)
    text = " ".join(h.ours for h in rows)
    for number in ("0.84 / 0.82x", "max 0.99 / 1.00x", "bf16 **1.025** (max 1.11; model 1.022, 84 of 84",
                   "fp8 **1.062** (max 1.16)", "geomean **1.181**, min 0.882 (0.952 at >= 2048 rows)",
                   "geomean **1.228**, min 0.999"):
        assert number in text, number


def test_pcie_summary_matches_a_direct_geomean():
    df, _ = data.load(records.folder("megamoe", "h200x1", "host"), data.MEGAMOE)
    key = ["shape", "tokens", "routing", "dtype"]
    ew = df[df.schedule == "expert_wave"].set_index(key).kernel_ms
    il = df[df.schedule == "interleaved"].set_index(key).kernel_ms
    sp = (ew / il.reindex(ew.index)).dropna()
    s = analysis.pcie_summary()
    for dt in ("bf16", "fp8"):
        got = s[(s["dtype"] == dt) & (s.schedule == "interleaved")].geomean_speedup.iloc[0]
        want = float(np.exp(np.log(sp.xs(dt, level="dtype")).mean()))
        assert abs(got - want) < 1e-9


def test_docs_page_is_current():
    assert analysis.DOCS_PAGE == "megamoe.md"
    assert (ROOT / "docs" / analysis.DOCS_PAGE).read_text() == analysis.docs_page()
