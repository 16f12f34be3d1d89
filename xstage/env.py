"""Where we are running: GPUs or not, the interpreter, who launched this process (torchrun, srun or nobody), the
machine's name, and provenance for recorded data."""
from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import socket
import subprocess
from dataclasses import dataclass
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


CPU_RANKS = "XSTAGE_CPU_RANKS"


def cpu_ranks() -> bool:
    """True when a sweep's ranks are CPU processes (gloo, shared memory; ``xstage.ranks.SharedMemoryWorld``):
    ``XSTAGE_CPU_RANKS=1`` under Triton's interpreter (tests of the launchers). Otherwise ranks are GPUs."""
    return interpreted() and os.environ.get(CPU_RANKS, "0") not in ("", "0")


# ------------------------------------------------------------------------------ who started this process
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Launch:
    """This process as one rank of a world an existing launcher started: ``torchrun`` (its RANK, WORLD_SIZE,
    LOCAL_RANK, MASTER_ADDR, MASTER_PORT) or ``slurm`` (an ``srun`` task: SLURM_PROCID, SLURM_NTASKS,
    SLURM_LOCALID, and MASTER_ADDR or the first host of the step's node list)."""

    launcher: str
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    host: str            # this node's name (SLURMD_NODENAME under SLURM, else the host name)
    nodes: int | None = None   # nodes the launcher says the world spans (None: it does not say)
    nodes_var: str = ""        # the variable that says so

    def describe(self) -> str:
        return f"rank {self.rank} of {self.world_size} ({self.launcher}, host {self.host})"


def host_name(environ=None) -> str:
    """This node's name: SLURM's (SLURMD_NODENAME) where SLURM runs the task, else the host name."""
    environ = os.environ if environ is None else environ
    return environ.get("SLURMD_NODENAME") or socket.gethostname()


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: ``gpu[03-05,9],login1`` -> ``gpu03``, ``a,b`` -> ``a``."""
    m = re.match(r"([^,\[]*)(?:\[([^\]]+)\])?([^,]*)", nodelist.strip())
    prefix, ranges, rest = m.groups() if m else ("", None, "")
    if ranges is not None:
        first = ranges.split(",")[0].split("-")[0].strip()
        return prefix + first + (first_host(rest) if "[" in rest else rest)
    if not prefix:
        raise ValueError(f"SLURM node list {nodelist!r} names no host")
    return prefix + rest


def _int_var(environ, name: str, low: int = 0) -> int:
    raw = environ[name]
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None
    if value < low:
        raise ValueError(f"{name}={value} must be >= {low}")
    return value


def _check_rank(launcher: str, rank: int, world: int, local: int, names: tuple[str, str, str]) -> None:
    if rank >= world:
        raise ValueError(f"{launcher}: {names[0]}={rank} is outside the world of {names[1]}={world}")
    if local > rank:
        raise ValueError(f"{launcher}: {names[2]}={local} is larger than {names[0]}={rank}")


def _torchrun(environ) -> Launch:
    missing = [v for v in TORCHRUN_VARS if not environ.get(v)]
    if missing:
        have = ", ".join(f"{v}={environ[v]}" for v in TORCHRUN_VARS if environ.get(v))
        raise ValueError(f"{have} set but {', '.join(missing)} not: a launcher (torchrun) sets all of "
                         f"{', '.join(TORCHRUN_VARS)}; unset them to let xstage start its own ranks")
    rank, world = _int_var(environ, "RANK"), _int_var(environ, "WORLD_SIZE", 1)
    local, port = _int_var(environ, "LOCAL_RANK"), _int_var(environ, "MASTER_PORT", 1)
    _check_rank("torchrun", rank, world, local, ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    nodes, var = None, ""
    if environ.get("GROUP_WORLD_SIZE"):            # torchrun: one agent (group) per node
        nodes, var = _int_var(environ, "GROUP_WORLD_SIZE", 1), "GROUP_WORLD_SIZE"
    elif environ.get("LOCAL_WORLD_SIZE"):
        local_world = _int_var(environ, "LOCAL_WORLD_SIZE", 1)
        nodes, var = -(-world // local_world), "LOCAL_WORLD_SIZE"
    return Launch("torchrun", rank, world, local, environ["MASTER_ADDR"], port, host_name(environ), nodes, var)


def _slurm(environ) -> Launch:
    ntasks = next((v for v in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS") if environ.get(v)), None)
    missing = [v for v, ok in (("SLURM_NTASKS", ntasks), ("SLURM_LOCALID", environ.get("SLURM_LOCALID"))) if not ok]
    if missing:
        raise ValueError(f"srun task SLURM_PROCID={environ['SLURM_PROCID']} without {', '.join(missing)}: "
                         f"SLURM sets SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID together")
    rank, world, local = _int_var(environ, "SLURM_PROCID"), _int_var(environ, ntasks, 1), \
        _int_var(environ, "SLURM_LOCALID")
    _check_rank("slurm", rank, world, local, ("SLURM_PROCID", ntasks, "SLURM_LOCALID"))
    addr = environ.get("MASTER_ADDR")
    if not addr:
        nodes = next((environ[v] for v in ("SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST")
                      if environ.get(v)), None)
        if nodes is None:
            raise ValueError("srun task without MASTER_ADDR or SLURM_NODELIST: set MASTER_ADDR to rank 0's host")
        addr = first_host(nodes)
    if environ.get("MASTER_PORT"):
        port = _int_var(environ, "MASTER_PORT", 1)
    else:   # the same on every task of a step, different for two steps of one job
        job = _int_var(environ, "SLURM_JOB_ID") if environ.get("SLURM_JOB_ID") else 0
        port = 20000 + (job % 1000) * 10 + int(environ.get("SLURM_STEP_ID", "0") or 0) % 10
    nodes = _int_var(environ, "SLURM_STEP_NUM_NODES", 1) if environ.get("SLURM_STEP_NUM_NODES") else None
    return Launch("slurm", rank, world, local, addr, port, host_name(environ), nodes, "SLURM_STEP_NUM_NODES")


def launched(environ=None) -> Launch | None:
    """The launcher that started this process, from its environment, or None (xstage starts its own ranks).

    torchrun: any of RANK, WORLD_SIZE, LOCAL_RANK set (all of :data:`TORCHRUN_VARS` must be). SLURM: an srun
    task (SLURM_PROCID with SLURM_STEP_ID; a batch script's own environment has no step) of a step of more
    than one task (``srun -n 1`` is one process that starts its own ranks, as without a launcher). A bad
    environment raises ValueError naming the variables."""
    environ = os.environ if environ is None else environ
    if any(environ.get(v) for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK")):
        return _torchrun(environ)
    if environ.get("SLURM_PROCID") and environ.get("SLURM_STEP_ID"):
        launch = _slurm(environ)
        return launch if launch.world_size > 1 else None
    return None


def launcher_name(environ=None) -> str:
    """``torchrun``, ``slurm`` or ``xstage`` (its own ranks), for provenance; a bad launcher environment says
    ``unknown`` here (the sweep itself refuses it before anything launches)."""
    try:
        launch = launched(environ)
    except ValueError:
        return "unknown"
    return launch.launcher if launch else "xstage"


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
        "launcher": launcher_name(),
        "params": params,
    }
