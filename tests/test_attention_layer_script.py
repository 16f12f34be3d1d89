"""scripts/attention_layer_gpu.py (issue 43's GPU measurements) in its CPU smoke mode: every part that can run on the
CPU runs (Triton's interpreter, tiny shapes) and writes its summary and rows, so the GPU run is one call."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.interpreter


def _script():
    spec = importlib.util.spec_from_file_location("attention_layer_gpu", ROOT / "scripts" / "attention_layer_gpu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_smoke_parts(tmp_path):
    pytest.importorskip("diffusers")
    summary = _script().main(["--smoke", "--parts", "env,bad_input,correctness,host_us,compile,dit_block",
                              "--out", str(tmp_path)])
    parts = summary["parts"]
    assert not [p for p, r in parts.items() if "error" in r], {p: r.get("error") for p, r in parts.items()}
    assert parts["env"]["kernel"] == "interpreter" and parts["host_us"] == {"skipped": "needs a CUDA GPU"}
    assert parts["bad_input"]["all_one_line"] and parts["bad_input"]["cache_unchanged"]
    assert len(parts["bad_input"]["cases"]) == 5 and all(parts["bad_input"]["cases"].values())
    assert parts["correctness"]["max_rel_l2_ours"] < 2e-2 and parts["correctness"]["all_hits_bit_identical"]
    assert parts["compile"]["graph_breaks"] == 0 and parts["compile"]["bit_identical"]
    assert parts["compile"]["ulysses_p2"]["graph_breaks"] == 0 and parts["compile"]["ulysses_p2"]["bit_identical"]
    assert parts["dit_block"]["routed"] == {"attn1": {"xstage": 1, "sdpa": 0}, "attn2": {"xstage": 0, "sdpa": 1}}
    assert parts["dit_block"]["rel_l2_ours_vs_sdpa"] < 2e-2
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert set(on_disk["parts"]) == set(parts) and (tmp_path / "correctness.csv").exists()


@pytest.mark.slow
def test_smoke_first_call(tmp_path):
    """A fresh process's first call, Triton's cache folder empty then filled (subprocesses: seconds)."""
    got = _script().main(["--smoke", "--parts", "first_call", "--out", str(tmp_path)])["parts"]["first_call"]
    assert got["ours_cold_first_s"] > 0 and got["ours_warm_first_s"] > 0, got
    assert (tmp_path / "first_call.csv").read_text().count("ours") == 2
