"""Where we are running: GPUs or not, the interpreter, the machine's name, and provenance for recorded data."""
from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("auto", "gpu", "recorded", "simulated")
# Multicast (NVLS) stays off: a program using it can take a shared host's GPUs out of service.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def apply_safe_env() -> None:
    for k, v in SAFE_ENV.items():
        os.environ.setdefault(k, v)


def interpreted() -> bool:
    """True when Triton kernels run in the CPU interpreter (no device timers, no inline PTX)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# What has a simulated source (the Burst-Gap / stage model): only GPU errors for a ``what`` starting with one of
# these suggest source='simulated' (MegaMoE, Ulysses and the bandwidth benchmark have none).
SIMULATED_STUDIES = ("the burst-gap sweep", "the train study")


def require_gpus(n: int, what: str, simulated: bool | None = None) -> None:
    """Clear error before any launch when ``what`` needs ``n`` GPUs and fewer are visible.

    simulated: whether ``what`` has a simulated source to suggest instead (None: ``what`` starts with one of
    :data:`SIMULATED_STUDIES`).
    """
    have = gpu_count()
    if have < n:
        if simulated is None:
            simulated = what.startswith(SIMULATED_STUDIES)
        alt = ("source='recorded' replays data/, source='simulated' runs the model" if simulated
               else "source='recorded' replays the measurements in data/ (this has no simulated source)")
        raise RuntimeError(f"{what} needs {n} CUDA GPU(s) ({'NVLink peers for remote stores' if n > 1 else 'the host link needs one'}); {have} visible. "
                           f"Without GPUs: {alt}.")


def resolve_source(source: str, gpus_needed: int = 2, simulated: bool = True) -> str:
    """``auto`` -> ``gpu`` when enough GPUs are visible, else ``recorded``; other values are checked.
    simulated: whether the caller has a simulated source (only then does an error suggest it)."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    if source == "auto":
        return "gpu" if gpu_count() >= gpus_needed else "recorded"
    if source == "gpu":
        require_gpus(gpus_needed, "source='gpu'", simulated=simulated)
    return source


def machine_name() -> str:
    """Short name of this machine's GPUs, e.g. ``h200x2`` (the folder under data/)."""
    n = gpu_count()
    if n == 0:
        return "cpu"
    name = torch.cuda.get_device_name(0).lower().replace("nvidia", "").strip().split()[0]
    return f"{name}x{n}"


def git_commit(root: Path = REPO_ROOT) -> str | None:
    """HEAD of the git checkout at ``root``; None outside one (or without git)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _git_commit() -> str:
    """The commit a recorded file names: $XSTAGE_GIT_COMMIT (a copy without .git), else HEAD, else unknown."""
    return os.environ.get("XSTAGE_GIT_COMMIT") or git_commit() or "unknown"


def _driver() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _pcie() -> str:
    """GPU 0's PCIe link as it runs (the host link's generation and width), or 'unknown'."""
    try:
        out = subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=pcie.link.gen.current,pcie.link.width.current",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        gen, width = (x.strip() for x in out.stdout.strip().split(","))
        return f"Gen {gen} x{width}" if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError, ValueError):
        return "unknown"


def provenance(command: str, params: dict) -> dict:
    """Everything a recorded file's JSON sidecar says about where its numbers came from."""
    import triton

    n = gpu_count()
    props = torch.cuda.get_device_properties(0) if n else None
    return {
        "machine": machine_name(),
        "gpu_name": torch.cuda.get_device_name(0) if n else "none",
        "gpu_count": n,
        "sm_count": props.multi_processor_count if props else 0,
        "gpu_uuid": str(props.uuid) if props is not None and hasattr(props, "uuid") else "none",
        "driver": _driver() if n else "none",
        "pcie": _pcie() if n else "none",
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "git_commit": _git_commit(),
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "params": params,
    }
