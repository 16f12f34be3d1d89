"""Markers: ``gpu`` (one CUDA GPU), ``multigpu`` (two NVLink peers), ``browser``; skipped where missing.

Under a launcher (``torchrun --nproc-per-node 2 -m pytest -m multigpu tests/...``, or srun): every rank runs the
multi-rank (``multigpu``) tests, whose ``spawn`` runs each rank's part in this process; the others are skipped,
every rank draws the same random numbers per test and every rank's ``tmp_path`` is the same folder."""
import os
import random
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

import xstage  # noqa: F401  (turns on the Triton interpreter on CPU-only machines before kernels load)
from xstage import env


def _launch():
    try:
        return env.launched()
    except ValueError:   # a bad launcher environment: the tests that spawn ranks say so themselves
        return None


LAUNCH = _launch()


def _run_id() -> str:
    """One name for this launch on every rank."""
    e = os.environ
    if e.get("TORCHELASTIC_RUN_ID"):
        rid = e["TORCHELASTIC_RUN_ID"]
    elif LAUNCH is not None and LAUNCH.launcher == "slurm":
        rid = f"{e.get('SLURM_JOB_ID')}.{e.get('SLURM_STEP_ID')}"
    else:
        rid = f"{e.get('MASTER_ADDR')}-{e.get('MASTER_PORT')}"
    return re.sub(r"[^\w.-]", "_", rid)


def pytest_collection_modifyitems(config, items):
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in items:
        if LAUNCH is not None and "multigpu" not in item.keywords:
            item.add_marker(pytest.mark.skip(reason=f"launched ({LAUNCH.describe()}): only the multi-rank "
                                                    f"(multigpu) tests run under a launcher"))
        if "gpu" in item.keywords and n < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "multigpu" in item.keywords and n < 2:
            item.add_marker(pytest.mark.skip(reason=f"needs 2 CUDA GPUs, {n} visible"))
        if "browser" in item.keywords and not (shutil.which("chromium") or os.environ.get("XSTAGE_CHROMIUM")):
            item.add_marker(pytest.mark.skip(reason="needs a headless Chromium"))


@pytest.fixture(autouse=True)
def _same_draws_on_every_rank(request):
    """Under a launcher: the same seeds on every rank (a plan's random draws must agree: xstage.ranks.spawn)."""
    if LAUNCH is not None:
        random.seed(f"{_run_id()}:{request.node.nodeid}")


@pytest.fixture
def tmp_path(tmp_path, request):
    """pytest's, or under a launcher one folder every rank of this host shares (rank 0 writes the records)."""
    if LAUNCH is None:
        return tmp_path
    test = re.sub(r"\W", "_", request.node.nodeid)[-120:]
    shared = Path(tempfile.gettempdir()) / f"xstage-launched-{_run_id()}" / test
    shared.mkdir(parents=True, exist_ok=True)
    return shared


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
