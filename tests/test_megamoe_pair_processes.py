"""One MegaMoE pair timed in several processes (session 17, S17-2: fp8 DeepSeek-V4-Pro T8192 uniform, whose lag went
to 1.064 of Expert-Wave in round 13's repeat while model_guided ran the same list at 0.992), replayed from data/
through ``studies.megamoe_pair_processes``; and round 13's repeat of controls7 read like every controls record."""
import shutil

import numpy as np
import pandas as pd
import pytest

from xstage import data, studies

ROOT = data.machine_dir("h200x1")


def test_pair_processes_replay_the_raw_rows():
    t = studies.megamoe_pair_processes()
    assert sorted(t.process.unique()) == [f"p{i}" for i in range(1, 6)]
    assert set(t.schedule) == {"expert_wave", "interleaved", "lag", "model_guided"}
    for p, g in t.groupby("process"):
        raw = pd.read_csv(ROOT / studies.MEGAMOE_PAIR_PROCESSES_SUB / p / "megamoe_gemm.csv")
        raw = raw[raw.method == "ours"].set_index("schedule")
        for r in g.itertuples():
            assert r.ms == raw.ms[r.schedule] and r.ms_min == raw.ms_min[r.schedule]
            assert r.over_ew == pytest.approx(raw.ms[r.schedule] / raw.ms["expert_wave"], rel=1e-12)
    # lag and model_guided ran the same task list in every process (the recorded param)
    for p in t.process.unique():
        raw = pd.read_csv(ROOT / studies.MEGAMOE_PAIR_PROCESSES_SUB / p / "megamoe_gemm.csv").set_index("schedule")
        assert raw.note["lag"] == raw.note["model_guided"]


def test_pair_processes_no_record_and_bad_record(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "DATA_ROOT", tmp_path)
    with pytest.raises(studies.NoRecordedData, match="megamoe_s17_pro8192"):
        studies.megamoe_pair_processes()
    src = ROOT / studies.MEGAMOE_PAIR_PROCESSES_SUB / "p1"
    dst = tmp_path / "h200x1" / studies.MEGAMOE_PAIR_PROCESSES_SUB / "p1"
    shutil.copytree(src, dst)
    raw = pd.read_csv(dst / "megamoe_gemm.csv")
    raw[raw.schedule != "expert_wave"].to_csv(dst / "megamoe_gemm.csv", index=False)
    with pytest.raises(ValueError, match="truncated or edited"):      # the loader refuses it before the study
        studies.megamoe_pair_processes()


def test_round13_repeat_controls_read_as_controls7():
    c, meta = studies.megamoe_round3_data("h200x1", sub=studies.MEGAMOE_ROUND13_REPEAT_CONTROLS_SUB)
    s = studies.megamoe_round7_controls_summary(studies.megamoe_round7_controls(c))
    assert set(s.dtype) == {"bf16", "fp8"} and (s.configs == 84).all()
    row = s[(s.dtype == "fp8") & (s.schedule == "lag")].iloc[0]
    raw = pd.read_csv(ROOT / studies.MEGAMOE_ROUND13_REPEAT_CONTROLS_SUB / "megamoe_gemm.csv")
    pro = raw[(raw["shape"] == "deepseek_v4_pro") & (raw.tokens == 8192) & (raw.routing == "uniform")
              & (raw.dtype == "fp8") & (raw.method == "ours")].set_index("schedule")
    assert row.worst_config == "deepseek_v4_pro_T8192_uniform" and not row.goal_met
    assert row.over_ew_worst == pytest.approx(pro.ms["lag"] / pro.ms["expert_wave"], rel=1e-9)
    assert np.isfinite(s.over_ew_geomean).all()
