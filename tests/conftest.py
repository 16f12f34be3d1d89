"""Markers: ``gpu`` (one CUDA GPU), ``multigpu`` (two NVLink peers), ``browser``; skipped where missing."""
import os
import shutil

import pytest
import torch

import xstage  # noqa: F401  (turns on the Triton interpreter on CPU-only machines before kernels load)


def pytest_collection_modifyitems(config, items):
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in items:
        if "gpu" in item.keywords and n < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "multigpu" in item.keywords and n < 2:
            item.add_marker(pytest.mark.skip(reason=f"needs 2 CUDA GPUs, {n} visible"))
        if "browser" in item.keywords and not (shutil.which("chromium") or os.environ.get("XSTAGE_CHROMIUM")):
            item.add_marker(pytest.mark.skip(reason="needs a headless Chromium"))


@pytest.fixture
def cpu_timing(monkeypatch):
    """Sweeps on the CPU (gloo ranks): xstage.bench.time_ms measured with the host clock, no CUDA syncs."""
    import time

    from xstage import bench

    def cpu_time_ms(fn, warmup=3, reps=10, device=None, lead=False):   # lead: no GPU to wait on
        for _ in range(warmup):
            fn()
        out = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1e3)
        return out

    monkeypatch.setattr(bench, "time_ms", cpu_time_ms)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)


def record_launches(monkeypatch, targets) -> list:
    """Replace each (module, kernel name) in ``targets`` with a stand-in that records the grid it is launched
    with instead of launching: the list of grids (what a bad-input test asserts stays empty)."""
    launched = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *a, **kw: launched.append(grid)

    for module, name in targets:
        monkeypatch.setattr(module, name, Recorder())
    return launched


@pytest.fixture
def tiny_gemm_case(monkeypatch, cpu_timing):
    """One tiny MoE configuration for the GEMM studies' end-to-end runs under the interpreter (tests/
    test_moe_gemm.py): 2 SMs, the interpreter's tiles for every default."""
    import types

    from xstage import moe_gemm as MG
    from xstage import moe_plan as MP

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: types.SimpleNamespace(multi_processor_count=2))
    monkeypatch.setattr(MG, "default_tiles", lambda *a, **k: MP.INTERPRETER_TILES)
    return [MP.MoECase(MP.MoEShape("tiny", 64, 32, 4, 2), 12, "uniform", 1)]


def random_stage_params(rng, **kw):
    """StageParams drawn from wide ranges around the fitted host link's (arbitration "slots" unless ``kw`` says),
    for property tests of the stage model's arbitrations."""
    from xstage.model import StageParams

    base = dict(issue_ns_per_kib=rng.uniform(5, 30), drain_gbps=rng.uniform(20, 100),
                capacity_kib=rng.uniform(2000, 9000), capacity_per_program_kib=rng.uniform(10, 60),
                spread=rng.uniform(0.1, 0.9), stalled_fraction=rng.uniform(0.3, 1.0),
                base_capacity_kib=rng.uniform(100, 1000), overhead_ns=rng.uniform(0, 200), arbitration="slots")
    base.update(kw)
    return StageParams(**base)
