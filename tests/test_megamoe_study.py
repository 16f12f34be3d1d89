"""The MegaMoE study (notebook 03): data access, the speedup / summary / coverage analyses (xstage.studies), the
figures (xstage.figures) and the notebook itself, on a small synthetic record built here.

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

from xstage import data, env, figures, moe_plan, studies
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
                    **dict(zip(data.MEGAMOE_TILE_COLUMNS, data.MEGAMOE_FIRST_TILES[dt]))))   # tiles version 1
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
def data_root(tmp_path, monkeypatch) -> Path:
    """An empty data root in place of data/ (studies and xstage.data read data.DATA_ROOT at call time)."""
    monkeypatch.setattr(data, "DATA_ROOT", tmp_path)
    return tmp_path


def _ref(df: pd.DataFrame) -> dict:
    """(config, dtype, schedule) -> the row's numbers, and the expert_wave kernel time per (config, dtype)."""
    names = df["shape"] + "_T" + df.tokens.astype(str) + "_" + df.routing
    out = {(n, d, s): r for n, d, s, r in zip(names, df.dtype, df.schedule, df.to_dict("records"))}
    ew = {(n, d): r["kernel_ms"] for (n, d, s), r in out.items() if s == "expert_wave"}
    return {"rows": out, "ew": ew}


# --------------------------------------------------------------------------------------------- analyses
def test_speedups_match_a_direct_computation(rows):
    sp = studies.megamoe_speedups(rows)
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
    summ = studies.megamoe_summary(rows).set_index(["dtype", "schedule"])
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
    before = studies.megamoe_summary(rows).set_index(["dtype", "schedule"])
    faster = rows.copy()
    hit = (faster["shape"] == "qwen3_235b") & (faster.tokens == 256) & (faster.dtype == "fp8") & (
        faster.schedule == "lag")
    assert hit.sum() == 1
    faster.loc[hit, "kernel_ms"] /= 2
    after = studies.megamoe_summary(faster).set_index(["dtype", "schedule"])
    assert after.loc[("fp8", "lag"), "geomean_speedup"] == pytest.approx(
        before.loc[("fp8", "lag"), "geomean_speedup"] * 2 ** (1 / len(CONFIGS)), rel=1e-12)
    unchanged = after.drop(index=("fp8", "lag"))
    pd.testing.assert_frame_equal(unchanged, before.drop(index=("fp8", "lag")))


def test_missing_configurations_are_counted_never_dropped(rows):
    gone = rows[~((rows.dtype == "fp8") & rows["shape"].isin(["qwen3_235b", "mixtral_8x7b"]))]   # 3 fp8 configs
    no_base = (gone["shape"] == "deepseek_v4_pro") & (gone.dtype == "bf16") & (gone.schedule == "expert_wave")
    gone = gone[~no_base]                                                   # one bf16 config without a baseline
    cov = studies.megamoe_coverage(gone).set_index("dtype")
    assert cov.loc["bf16", ["P", "expected", "present", "complete"]].tolist() == [2, 84, 6, 5]
    assert cov.loc["fp8", ["P", "expected", "present", "complete"]].tolist() == [2, 84, 3, 3]
    assert len(cov.loc["fp8", "missing"]) == 81 and "qwen3_235b_T256_hot" in cov.loc["fp8", "missing"]
    assert "deepseek_v4_pro_T1024_zipf" not in cov.loc["bf16", "missing"]     # present, just incomplete
    line = studies.megamoe_coverage_line(studies.megamoe_coverage(gone))
    assert line.startswith("bf16: 6 of 84 configurations (5 with every schedule), missing ")
    assert "fp8: 3 of 84 configurations (3 with every schedule)" in line and "(+78 more)" in line
    # the incomplete configuration keeps its rows (NaN speedups); the summary counts what it can compute
    sp = studies.megamoe_speedups(gone)
    inc = sp[(sp.config == "deepseek_v4_pro_T1024_zipf") & (sp.dtype == "bf16")]
    assert len(inc) == 3 and inc.speedup.isna().all() and inc.fused_speedup.notna().all()
    summ = studies.megamoe_summary(gone).set_index(["dtype", "schedule"])
    assert summ.loc[("bf16", "interleaved"), "configs"] == 5 and summ.loc[("fp8", "interleaved"), "configs"] == 3
    # a selection of shapes expects 21 configurations per shape; a dtype without rows is listed with 0
    cov = studies.megamoe_coverage(gone[gone.dtype == "bf16"], shapes=["qwen3_235b"]).set_index("dtype")
    assert cov.loc["bf16", ["expected", "present"]].tolist() == [21, 2]
    assert cov.loc["fp8", ["expected", "present", "complete"]].tolist() == [21, 0, 0]
    assert len(studies.megamoe_expected()) == 84 and len(studies.megamoe_expected(["mixtral_8x7b"])) == 21
    with pytest.raises(ValueError, match="no MegaMoE rows"):
        studies.megamoe_speedups(rows.iloc[:0])


@pytest.mark.parametrize("how", ["absent", "all NaN", "NaN for fp8"])
def test_grouped_mm_absent_or_nan(rows, how):
    d = {"absent": rows.drop(columns="grouped_mm_ms"), "all NaN": rows.assign(grouped_mm_ms=np.nan),
         "NaN for fp8": rows.assign(grouped_mm_ms=rows.grouped_mm_ms.where(rows.dtype == "bf16"))}[how]
    sp = studies.megamoe_speedups(d)
    assert sp.speedup.notna().all() and sp.compute_tflops.notna().all()
    assert sp[sp.dtype == "fp8"].gemm_efficiency.isna().all()
    summ = studies.megamoe_summary(d)
    goals = studies.megamoe_goals(summ)
    gemm = goals[goals.quantity.str.startswith("GEMM")].set_index("dtype")
    assert gemm.loc["fp8", "met"] is None and math.isnan(gemm.loc["fp8", "ours"])
    assert studies.megamoe_headline(summ)["gemm"].endswith("fp8: torch._grouped_mm not recorded")
    fig = figures.megamoe_gemm(d)
    ratio = [t for t in fig.data if t.name == "ours ÷ torch._grouped_mm"]
    if how == "NaN for fp8":
        assert len(ratio) == 2 and len(ratio[1].y) == 0 and len(ratio[0].y) == len(CONFIGS)
        assert any("not recorded for this dtype" in a.text for a in fig.layout.annotations)
    else:
        assert not ratio and "not recorded in this data" in fig.layout.title.text
        assert {t.name for t in fig.data} == {"our kernel, compute only"}


def test_goals_and_headline(rows):
    summ = studies.megamoe_summary(rows)
    goals = studies.megamoe_goals(summ, "interleaved")
    assert len(goals) == 5 * 2 and set(goals.schedule) == {"interleaved"}
    paper = goals[goals.quantity.str.contains("paper")]
    assert sorted(set(paper.target)) == [1.18, 1.62] and paper.met.isna().all()
    model = goals[goals.quantity.str.startswith("model")]
    assert (model.target == 1.0).all() and all((m is True) == (o >= 1.0) for m, o in zip(model.met, model.ours))
    fused = goals[goals.quantity.str.startswith("fused")].set_index("dtype")
    assert fused.loc["bf16", "target"] == studies.FUSED_OVER_UNFUSED_GOAL == 1.3
    assert fused.loc["bf16", "met"] is bool(fused.loc["bf16", "ours"] >= 1.3)
    s = summ.set_index(["dtype", "schedule"])
    head = studies.megamoe_headline(summ, "interleaved")
    assert f"bf16: interleaved {s.loc[('bf16', 'interleaved'), 'geomean_speedup']:.2f}x geomean" in head["speedup"]
    assert "(6/84 configs)" in head["speedup"]
    with pytest.raises(ValueError, match="no lag rows"):
        studies.megamoe_goals(studies.megamoe_summary(rows, schedules=["expert_wave", "interleaved"]), "lag")


# --------------------------------------------------------------------------------------------- figures
def _notes(fig) -> list[str]:
    return [a.text for a in fig.layout.annotations]


def test_figures_build_and_show_the_computed_numbers(rows):
    summ = studies.megamoe_summary(rows).set_index(["dtype", "schedule"])
    n_routings = rows.routing.nunique()
    fig = figures.megamoe_speedup(rows)
    assert len(fig.data) == 3 * 2 * n_routings                      # (schedules but expert_wave) x dtypes x routings
    assert sum(len(t.x) for t in fig.data) == 3 * 2 * len(CONFIGS)
    notes = _notes(fig)
    assert "paper geomean 1.18×" in notes and "paper max 1.62×" in notes
    for dt in ("bf16", "fp8"):
        r = summ.loc[(dt, "interleaved")]
        want = f"geomean <b>{r.geomean_speedup:.2f}×</b> · max <b>{r.max_speedup:.2f}×</b> ({len(CONFIGS)} configs)"
        assert want in notes
    assert not any("paper" in t for t in _notes(figures.megamoe_speedup(rows, paper={})))
    one = figures.megamoe_speedup(rows, ["interleaved"])
    assert {t.xaxis for t in one.data} == {"x", "x2"}                # one row, two dtypes

    parity = figures.megamoe_model_parity(rows)
    assert len(parity.data) == 3 + 3 * 2
    inside = summ.loc[("fp8", "lag"), "within_tolerance"]
    assert f"lag · fp8: {inside:.0%} within ±10%" in {t.name for t in parity.data}

    fused = figures.megamoe_fused_over_unfused(rows)
    assert len(fused.data) == 4 * 2 * n_routings
    assert "goal: geomean ≥ 1.3×" in _notes(fused)
    r = summ.loc[("bf16", "expert_wave")]
    assert f"geomean <b>{r.fused_geomean:.2f}×</b> · min {r.fused_min:.2f}× ({len(CONFIGS)} configs)" in _notes(fused)

    gemm = figures.megamoe_gemm(rows)
    assert len(gemm.data) == 2 * 3 and "goal ≥ 0.7" in _notes(gemm)
    for f in (fig, parity, fused, gemm):
        assert f.layout.title.text and all(len(t.y) for t in f.data if t.name)


def test_figures_reject_what_is_not_there(rows):
    with pytest.raises(ValueError, match=r"none of schedules=\['lag'\] is in the data"):
        figures.megamoe_speedup(rows[rows.schedule != "lag"], ["lag"])
    with pytest.raises(ValueError, match="none of schedules"):
        figures.megamoe_model_parity(rows, ["expert_wave"])


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
        studies.megamoe_selection(**kw)


def test_selection_is_normalised_to_table_order():
    sel = studies.megamoe_selection(["fp8", "bf16"], ["model_guided", "expert_wave", "lag"], ["mixtral_8x7b"])
    assert sel == {"dtypes": ["bf16", "fp8"], "schedules": ["expert_wave", "lag", "model_guided"],
                   "shapes": ["mixtral_8x7b"]}
    assert studies.megamoe_selection()["schedules"] == list(moe_plan.SCHEDULES)
    assert studies.megamoe_selection(schedules=["lag"])["schedules"] == ["expert_wave", "lag"]


def test_sources(rows, data_root):
    with pytest.raises(studies.NoRecordedData) as e:
        studies.megamoe_data("recorded", "h200x2")
    assert str(e.value) == "no recorded MegaMoE data for machine h200x2; run `xstage sweep megamoe` on 2 GPUs"
    assert isinstance(e.value, ValueError)
    with pytest.raises(ValueError, match="the MegaMoE study has no simulated source; use recorded or gpu"):
        studies.megamoe_data("simulated")
    with pytest.raises(ValueError, match="source must be one of"):
        studies.megamoe_data("cloud")
    with pytest.raises(ValueError, match="dtypes: unknown 'int8'"):     # checked before any data is looked for
        studies.megamoe_data("recorded", "h200x2", dtypes=["int8"])
    record(data_root, rows)
    df, meta = studies.megamoe_data("recorded", "h200x2")
    assert meta["source"] == "recorded" and meta["schema"] == "megamoe" and len(df) == len(rows)
    pd.testing.assert_frame_equal(studies.megamoe_summary(df), studies.megamoe_summary(rows))
    df, _ = studies.megamoe_data("recorded", "h200x2", dtypes=["fp8"], shapes=["qwen3_235b"])
    assert set(df.dtype) == {"fp8"} and set(df["shape"]) == {"qwen3_235b"} and len(df) == 2 * 4
    record(data_root, rows[rows["shape"] != "mixtral_8x7b"], machine="partial/megamoe")
    with pytest.raises(studies.NoRecordedData, match=r"partial/megamoe/megamoe\.csv has no rows of dtypes \['bf16'\] and "
                                                     r"shapes \['mixtral_8x7b'\] yet \(40 rows of others\)"):
        studies.megamoe_data("recorded", "partial", dtypes=["bf16"], shapes=["mixtral_8x7b"])
    with pytest.raises(studies.NoRecordedData, match="recorded machines: h200x2, partial"):
        studies.megamoe_data("recorded", "a100x8")
    with pytest.raises(studies.NoRecordedData, match=r"with dynamic assignment for machine h200x2; run `xstage "
                                                     r"sweep megamoe --assignment dynamic --out data/h200x2/dynamic`"):
        studies.megamoe_data("recorded", "h200x2", assignment="dynamic")
    dyn = rows[rows["shape"] == "qwen3_235b"]
    record(data_root, dyn, machine="h200x2/dynamic")                  # data/<machine>/dynamic/megamoe.csv
    df, _ = studies.megamoe_data("recorded", "h200x2", assignment="dynamic")
    assert len(df) == len(dyn) and set(df["shape"]) == {"qwen3_235b"}


@pytest.mark.skipif(env.gpu_count() >= 2, reason="this machine has the GPUs")
def test_gpu_source_without_gpus_says_so():
    with pytest.raises(RuntimeError, match="needs 2 CUDA GPU"):
        studies.megamoe_data("gpu")


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
    assert all("if have_data:" in c or "except studies.NoRecordedData" in c for c in code[2:])


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
    assert out == ["no recorded MegaMoE data for machine h200x2; run `xstage sweep megamoe` on 2 GPUs",
                   "note: no recorded MegaMoE data for 2 H200s, one rank per GPU, combine over NVLink (data/h200x2/megamoe); "
                   "run `xstage sweep megamoe --out data/h200x2/megamoe`",
                   "note: no recorded MegaMoE data for one H200, 2 ranks in one process, combine over PCIe to host "
                   "memory (data/h200x1/megamoe_host); run `xstage sweep megamoe --world one-gpu --ranks 2 --link "
                   "host --out data/h200x1/megamoe_host`",
                   "note: no recorded MegaMoE data for one H200, 2 ranks in one process, combine over PCIe to host "
                   "memory (data/h200x1/megamoe_pcie); run `xstage sweep megamoe --world one-gpu --ranks 2 --link "
                   "host --out data/h200x1/megamoe_pcie`",
                   "note: no recorded MegaMoE compute-only controls study for h200x1 (data/h200x1/megamoe_controls); "
                   "run `python3 scripts/megamoe_gemm.py --study controls7 --out data/h200x1/megamoe_controls`",
                   "note: no recorded MegaMoE bf16 GEMM study for h200x1 (data/h200x1/megamoe_gemm_bf16); run `python3 "
                   "scripts/megamoe_gemm.py --study gemm8 --out data/h200x1/megamoe_gemm_bf16`",
                   "no MegaMoE data: nothing to check"]
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
    assert len(figs) == 6 and len(tables) == 4          # the records by link: the NVLink one alone
    assert set(tables[0].schedule) == {"expert_wave", "interleaved", "model_guided"}
    assert set(tables[3].record) == {"2 H200s, one rank per GPU, combine over NVLink"}
    assert "combine over NVLink" in figs[0].layout.title.text and "note: no recorded MegaMoE data for one H200" in out
    record(data_root, rows[rows["shape"] == "qwen3_235b"], machine="h200x1/megamoe_host", params=HOST_PARAMS)
    ns = run_notebook(monkeypatch, source="recorded")
    figs = [x for x in ns["_shown"] if isinstance(x, go.Figure)]
    assert len(figs) == 8 and "combine over PCIe to host memory (rank 0's times)" in figs[6].layout.title.text
    assert "host link's stage model" in figs[7].layout.title.text
    assert set(ns["link_table"].record) == {"2 H200s, one rank per GPU, combine over NVLink",
                                            "one H200, 2 ranks in one process, combine over PCIe to host memory "
                                            "(rank 0's times)"}
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
    cost = studies.megamoe_order_cost(rows, drain_gbps)
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
    line = studies.megamoe_order_cost_line(cost)
    for d, g in cost.groupby("dtype"):
        assert f"in {int(g.beyond_stage.sum())} of {len(g)} cases" in line
    fig = figures.megamoe_order_cost(cost)
    assert any(f"outside the wedge: {int(cost[cost.dtype == 'bf16'].beyond_stage.sum())} of" in n for n in _notes(fig))
    with pytest.raises(ValueError, match="drain_gbps must be > 0"):
        studies.megamoe_order_cost(rows, 0.0)


def test_revised_model_on_recorded_rows(rows):
    """The revised model (busiest program) on rows of real configurations: Expert-Wave's own speedup is 1, the
    other schedules' revised speedups are the ratio of the model's times, interleaved's period-3 pattern
    (divides 132 programs) is predicted slower than Expert-Wave where it loads a third of the programs with
    every Linear-1 tile; a record whose model_guided choice names no candidate is refused."""
    sub = rows[rows["shape"].isin(["deepseek_v4_flash", "qwen3_235b"]) & rows.tokens.isin([128, 4096])
               & (rows.routing == "uniform")]                 # deepseek_v4_flash_T128, qwen3_235b_T4096
    assert len(sub.groupby(["shape", "tokens"])) == 2
    meta = {"sm_count": 132, "params": {}}
    revised, table = studies.megamoe_revised_model(sub, meta)
    rp = moe_plan.repredict(sub, BurstGapParams.reference(), 132)
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
        moe_plan.repredict(bad, BurstGapParams.reference(), 132)


def test_order_cost_splits_order_and_communication_when_recorded(rows):
    """Schema v2 rows carry each schedule's compute-only control: order_ms = its control - Expert-Wave's,
    comm_ms = its kernel - its control, and the line reports both; v1 rows (NaN) leave them out."""
    v2 = rows.copy()
    v2["compute_sched_ms"] = v2.compute_ms * np.where(v2.schedule == "expert_wave", 1.0, 1.1)
    cost = studies.megamoe_order_cost(v2, 300.0)
    ew = v2[v2.schedule == "expert_wave"].set_index(["shape", "tokens", "routing", "dtype"])
    for r in cost.sample(5, random_state=1).itertuples():
        e = ew.loc[(r.shape, r.tokens, r.routing, r.dtype)]
        assert r.order_ms == pytest.approx(0.1 * e.compute_ms)
        assert r.comm_ms == pytest.approx(r.kernel_ms - 1.1 * e.compute_ms)
    assert "on the tile order" in studies.megamoe_order_cost_line(cost)
    old = studies.megamoe_order_cost(rows.assign(compute_sched_ms=np.nan), 300.0)
    assert old.order_ms.isna().all() and "tile order" not in studies.megamoe_order_cost_line(old)


def test_the_study_reads_only_the_planning_module():
    """studies and figures import MegaMoE's CPU planning module only (no GPU module, no sweep), and the planning
    module imports neither studies nor the GPU side: no import circle."""
    import subprocess
    import sys

    code = ("import sys, xstage.moe_plan; a = set(sys.modules); import xstage.studies, xstage.figures; "
            "print(sorted(m for m in a if m.startswith('xstage.')), sorted(m for m in sys.modules "
            "if m.startswith('xstage.')), sep='\\n')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    plan, both = (set(eval(line)) for line in out.splitlines())   # two printed lists of module names
    assert "xstage.moe_plan" in plan and not plan & {"xstage.studies", "xstage.moe", "xstage.moe_sweep"}
    assert not both & {"xstage.moe", "xstage.moe_sweep", "xstage.ulysses_sweep"}


HOST_PARAMS = {"world": "one-gpu", "link": "host", "world_size": 2, "observed_rank": 0}


def test_records_by_world_and_link(rows, data_root):
    """The NVLink x2 and the one-GPU host-link records side by side: labels from the sidecars, the summary's
    speedups, and the compute-only controls against a direct computation from the rows."""
    with pytest.raises(studies.NoRecordedData, match=r"run `xstage sweep megamoe --world one-gpu --ranks 2 --link "
                                                     r"host --out data/h200x1/megamoe_host`"):
        studies.megamoe_world_data("one-gpu", "host")
    with pytest.raises(ValueError, match=r"\(world, link\) must be one of"):
        studies.megamoe_world_data("one-gpu", "nvlink")
    host = rows.copy()
    host["compute_sched_ms"] = host.kernel_ms * np.random.default_rng(3).uniform(0.7, 1.0, len(host))
    record(data_root, rows)
    record(data_root, host, machine="h200x1/megamoe_host", params=HOST_PARAMS)
    recs = {}
    for w, lk in (("gpus", "nvlink"), ("one-gpu", "host")):
        d, m = studies.megamoe_world_data(w, lk, dtypes=["fp8"])
        assert set(d.dtype) == {"fp8"}
        recs[m["label"]] = (d, m)
    assert list(recs) == ["2 H200s, one rank per GPU, combine over NVLink",
                          "one H200, 2 ranks in one process, combine over PCIe to host memory (rank 0's times)"]
    t = studies.megamoe_links_table(recs).set_index(["record", "schedule"])
    lab = list(recs)[1]
    summ = studies.megamoe_summary(recs[lab][0]).set_index("schedule")
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


# ------------------------------------------------------------- one H200: the GEMM ladder and the order study
def test_recorded_one_gpu_gemm_study_is_coherent():
    """data/h200x1/megamoe_gemm: every (study, configuration, dtype) complete (ladder: each variant of
    xstage.moe_gemm.VARIANTS + torch._grouped_mm, fp8 also torch._scaled_grouped_mm, ok with a time or unavailable
    with NaN; order: every schedule x assignment), each of our rows checked against the float32 reference, and
    the tables' ratios recomputed from the recorded times."""
    from xstage import moe_gemm
    from xstage.numeric import geomean

    try:
        df, meta = studies.megamoe_gemm_data("h200x1")
    except studies.NoRecordedData:
        pytest.skip("no recorded one-GPU GEMM study")
    assert meta["params"]["world"] == "one-gpu" and meta["params"]["link"] == "local"
    for (study, dt), g in df.groupby(["study", "dtype"]):
        for _, c in g.groupby(["shape", "tokens", "routing"]):
            ours = c[c.method == "ours"]
            if study == "ladder":
                assert set(ours.variant) == set(moe_gemm.VARIANTS[dt]) and ours.is_default.sum() == 1
                libs = {"torch._grouped_mm"} | ({"torch._scaled_grouped_mm"} if dt == "fp8" else set())
                assert set(c.method) - {"ours"} == libs
            else:
                assert set(zip(ours.schedule, ours.assignment)) == {(s, a) for s in moe_plan.SCHEDULES
                                                                    for a in moe_plan.ASSIGNMENTS}
            lim = 2e-2 if dt == "fp8" else 1e-2
            assert ((ours.rel_l2 > 0) & (ours.rel_l2 < lim)).all()
            ok = c.status == "ok"
            assert (c.ms[ok] > 0).all() and c.ms[~ok].isna().all() and set(c.status) <= {"ok", "unavailable"}
    lad = studies.megamoe_gemm_ladder(df)
    d = df[df.study == "ladder"].assign(config=lambda x: x["shape"] + "_T" + x.tokens.astype(str) + "_" + x.routing)
    for _, r in lad.sample(5, random_state=np.random.randint(1 << 30)).iterrows():
        lib = d[(d.config == r.config) & (d.dtype == r["dtype"]) & (d.method == "torch._grouped_mm")].ms.iloc[0]
        mine = d[(d.config == r.config) & (d.dtype == r["dtype"]) & (d.variant == r.variant)].ms.iloc[0]
        assert r.vs_grouped_mm == pytest.approx(lib / mine)
    summ = studies.megamoe_gemm_summary(lad)
    for _, s in summ.iterrows():
        g = lad[(lad.dtype == s["dtype"]) & (lad.variant == s.variant)]
        assert s.vs_grouped_mm_geomean == pytest.approx(geomean(g.vs_grouped_mm))
        assert s.vs_grouped_mm_min_big == pytest.approx(g[g.rows >= 2048].vs_grouped_mm.min())
    tab = studies.megamoe_order_table(df)
    o = df[df.study == "order"]
    for _, t in tab.sample(4, random_state=np.random.randint(1 << 30)).iterrows():
        g = o[o.dtype == t["dtype"]].pivot_table(index=["shape", "tokens", "routing"], columns=["schedule", "assignment"],
                                              values="ms")
        want = g[(t.schedule, t.assignment)] / g[("expert_wave", t.assignment)]
        assert t.over_ew_geomean == pytest.approx(geomean(want)) and t.over_ew_worst == pytest.approx(want.max())


def test_recorded_host_link_sweep_has_all_84_configurations_per_dtype():
    try:
        df, meta = studies.megamoe_world_data("one-gpu", "host")
    except studies.NoRecordedData:
        pytest.skip("no recorded host-link sweep")
    cov = studies.megamoe_coverage(df, **studies.megamoe_selection())
    assert "84 of 84" in studies.megamoe_coverage_line(cov, show=0), studies.megamoe_coverage_line(cov, show=0)
    r = studies.megamoe_sweep_gemm_ratio(df)
    ew = df[df.schedule == "expert_wave"]
    for _, row in r.iterrows():
        g = ew[ew.dtype == row["dtype"]]
        assert row.configs == 84 and row["min"] == pytest.approx((g.grouped_mm_ms / g.compute_ms).min())
