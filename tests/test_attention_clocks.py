"""The sustained-clocks study (xstage.attention_clocks): nvidia-smi's samples parsed and cut to
a window, bad input refused before anything runs, the schema's round trip, and the summary's ratios recomputed."""
from datetime import datetime, timedelta

import numpy as np
import pandas as pd
import pytest

from xstage import attention_clocks as ac
from xstage import attention_analysis, data
from xstage.ulysses import UlyssesShape

T0 = datetime(2026, 12, 6, 5, 19, 32, 100000)


def _smi_lines(n, mhz, watts, start=T0, period_ms=50, reasons="0x0000000000000004"):
    return "\n".join(f"{(start + timedelta(milliseconds=period_ms * i)):%Y/%m/%d %H:%M:%S.%f}"[:-3]
                     + f", {mhz[i % len(mhz)]}, {watts[i % len(watts)]:.2f}, 61, {reasons}" for i in range(n))


def test_parse_smi_reads_samples_and_na_fields():
    text = _smi_lines(4, [1980, 1755], [690.5]) + "\n" + \
        f"{T0 + timedelta(seconds=1):%Y/%m/%d %H:%M:%S.%f}"[:-3] + ", 1980, [N/A], 62, [Not Supported]\n"
    s = ac.parse_smi(text)
    assert len(s) == 5 and list(s.sm_mhz[:4]) == [1980, 1755, 1980, 1755]
    assert s.power_w[:4].tolist() == [690.5] * 4 and np.isnan(s.power_w[4])
    assert s.reasons[:4].tolist() == [4] * 4 and s.reasons[4] == 0
    assert s.t[1] - s.t[0] == pd.Timedelta(milliseconds=50)


@pytest.mark.parametrize("line", ["Failed to initialize NVML: Driver/library version mismatch",
                                  "not a time, 1980, 690, 61, 0x0"])
def test_parse_smi_refuses_what_is_not_a_sample(line):
    with pytest.raises(ValueError, match="nvidia-smi sample"):
        ac.parse_smi(line)


def test_window_stats_leaves_out_the_settling_and_what_lies_outside():
    # 0-1 s idle at 345 MHz, then 1-4 s loaded: the window [1 s, 4 s] with 0.5 s settling sees only loaded samples
    idle = _smi_lines(20, [345], [80.0])
    busy = _smi_lines(60, [1700, 1800, 1900], [650.0, 700.0], start=T0 + timedelta(seconds=1), reasons="0x4")
    after = _smi_lines(20, [345], [80.0], start=T0 + timedelta(seconds=4.05))
    s = ac.parse_smi("\n".join([idle, busy, after]))
    w = ac.window_stats(s, T0 + timedelta(seconds=1), T0 + timedelta(seconds=4), settle_s=0.5)
    assert w["sm_mhz"] == 1800 and w["power_w"] == pytest.approx(675.0) and w["temp_c"] == 61
    assert w["samples"] == 50 and w["reasons"] == "0x4"
    with pytest.raises(ValueError, match="nvidia-smi samples in the window"):
        ac.window_stats(s, T0 + timedelta(seconds=1), T0 + timedelta(seconds=1.6), settle_s=0.5)


@pytest.mark.parametrize("kw, msg", [(dict(seconds=0.6), "seconds must exceed"),
                                     (dict(windows=0), "windows must be >= 1"),
                                     (dict(shapes=(UlyssesShape("d96", 8192, 24, 96),)), "head dim")])
def test_bad_input_is_refused_before_anything_runs(kw, msg):
    args = dict(shapes=ac.CLOCK_SHAPES, seconds=3.0, windows=2) | kw
    with pytest.raises(ValueError, match=msg):
        ac.validate(args["shapes"], args["seconds"], args["windows"])


def test_run_without_a_gpu_says_so(tmp_path):
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        ac.run_attention_clocks(tmp_path / "clocks")
    assert not (tmp_path / "clocks" / "attention_clocks.csv").exists()


def _rows(rng):
    rows = []
    for shape, S, H, D in (("s8192_h24", 8192, 24, 128), ("cogvideox5b_17776_p2", 17776, 24, 64)):
        for w in range(2):
            for meth, mhz, ms in (("gluon", 1650 + 10 * rng.random(), 1.35), ("cudnn", 1750.0, 1.40),
                                  ("fa4", 1830 + 10 * rng.random(), 1.25)):
                ms = ms * (1 + 0.01 * rng.random())
                rows.append(dict(variant="gluon-ws-128x128s2r232-ml-rv", shape=shape, S=S, H=H, D=D, method=meth,
                                 window=w, launches=2000, seconds=3.0, ms=ms, tflops=4 * S * S * H * D / ms / 1e9,
                                 sm_mhz=mhz, power_w=690.0 + rng.random(), temp_c=60.0, samples=50,
                                 reasons=["0x4", "0x0"][w]))
    return pd.DataFrame(rows)


def test_schema_round_trip_and_the_ratios_recomputed(tmp_path):
    df = _rows(np.random.default_rng(0))
    meta = {"schema": "attention_clocks", "schema_version": 1, "machine": "test", "gpu_name": "none",
            "gpu_count": 0, "driver": "none", "torch": "x", "triton": "x", "git_commit": "x",
            "date_utc": "2026-12-06T00:00:00+00:00", "command": "test", "params": {}}
    csv = data.start_file(tmp_path, data.ATTENTION_CLOCKS, meta)
    data.append_rows(csv, data.ATTENTION_CLOCKS, df)
    back, _ = data.load(tmp_path, data.ATTENTION_CLOCKS)
    assert len(back) == len(df)
    t = attention_analysis.attention_clocks_table(back)
    assert set(t.reasons) == {"0x4"} and (t.windows == 2).all()
    r = attention_analysis.attention_clocks_ratios(t).set_index("shape")
    for shape, g in back.groupby("shape"):
        ours, fa = g[g.method == "gluon"], g[g.method == "fa4"]
        assert r.ours_over_fa[shape] == pytest.approx(ours.tflops.median() / fa.tflops.median())
        assert r.clock_ratio[shape] == pytest.approx(ours.sm_mhz.median() / fa.sm_mhz.median())
        per_clock = (ours.tflops.median() / ours.sm_mhz.median()) / (fa.tflops.median() / fa.sm_mhz.median())
        assert r.ours_over_fa_per_clock[shape] == pytest.approx(per_clock)
    # a clock or power that is not > 0 is a malformed file: refused when read
    data.append_rows(data.start_file(tmp_path / "bad", data.ATTENTION_CLOCKS, meta), data.ATTENTION_CLOCKS,
                     df.assign(sm_mhz=-1.0))
    with pytest.raises(data.DataError, match="sm_mhz"):
        data.load(tmp_path / "bad", data.ATTENTION_CLOCKS)


def test_recorded_clocks_replay_the_refuted_power_hypothesis():
    """data/h100x1/attention_clocks (one H100, commit cd3e751 + the study): every shape's
    methods checked against float32 first; all windows at the card's power limit (reason 0x4 set); at D = 128 ours
    and FA4 at the same SM clock (the power hypothesis refuted), and sustained ours / FA4 >= 0.95 on every shape."""
    df, m = attention_analysis.attention_clocks_data("h100x1")
    assert m["git_commit"].startswith("cd3e751") and "H100" in m["gpu_name"]
    assert set(m["shape_checks"]) == {s.name for s in ac.CLOCK_SHAPES}
    assert all(e < 1e-2 for errs in m["shape_checks"].values() for k, e in errs.items() if k != "rows")
    assert (df.samples >= 40).all() and all(int(r, 16) & 0x4 for r in df.reasons)
    assert df.groupby(["shape", "method"]).window.nunique().eq(2).all()
    r = attention_analysis.attention_clocks_ratios(attention_analysis.attention_clocks_table(df)).set_index("shape")
    assert (r.clock_ratio[["s8192_h24", "s32768_h12"]] == 1.0).all()
    assert (r.ours_over_fa >= 0.95).all()
