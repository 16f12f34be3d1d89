"""One check of what a user passes to the models, in the user's words (programs, KiB, us, option names): the
train of :func:`xstage.model.predict_train` and ``xstage predict``, the workload of the fluid model's explorer.
Every check raises ValueError with one line naming the value as typed, before anything is simulated.
"""
from __future__ import annotations

import numpy as np

KIB = 1024


def programs(value, name: str = "programs") -> int:
    """A whole number of programs >= 1."""
    if isinstance(value, (bool, np.bool_)) or not np.isscalar(value) or not np.isfinite(value) \
            or int(value) != value or value < 1:
        raise ValueError(f"{name} must be a whole number of programs >= 1, got {value!r}")
    return int(value)


def flag(value, name: str) -> bool:
    """True or False, nothing that merely converts to one (``sync='no'`` is an error, not True)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def sizes(value, name: str, unit: str = "KiB") -> np.ndarray:
    """A list of burst sizes > 0 (one per burst, at least one), in ``unit``; returns bytes."""
    if np.isscalar(value) or isinstance(value, str):
        raise ValueError(f"{name} must be a list of sizes in {unit} (one per burst), got the single value {value!r}")
    x = np.asarray(value, dtype=np.float64).ravel()
    if x.size == 0:
        raise ValueError(f"{name} is empty: a train needs at least one burst")
    if not np.all(np.isfinite(x)) or np.any(x <= 0):
        raise ValueError(f"{name} must be sizes > 0 {unit}, got {_show(x)}")
    return x * (KIB if unit == "KiB" else 1.0)


def gaps(value, name: str, n: int, unit: str = "us") -> np.ndarray:
    """A list of ``n`` gaps >= 0 (the gap after each burst), in ``unit``; returns ns."""
    if np.isscalar(value) or isinstance(value, str):
        raise ValueError(f"{name} must be a list of gaps in {unit} (one per burst), got the single value {value!r}")
    x = np.asarray(value, dtype=np.float64).ravel()
    if x.size != n:
        raise ValueError(f"{name} must hold one gap per burst: {n} bursts, {x.size} gaps")
    if not np.all(np.isfinite(x)) or np.any(x < 0):
        raise ValueError(f"{name} must be gaps >= 0 {unit} (finite numbers), got {_show(x)}")
    return x * (1e3 if unit == "us" else 1.0)


def train(programs_, burst_bytes, gap_ns) -> tuple[int, np.ndarray, np.ndarray]:
    """(programs, burst bytes [n], gaps ns [n]) of one train given in bytes and ns (the model's own units)."""
    P = programs(programs_)
    b = sizes(burst_bytes, "burst_bytes", unit="bytes")
    g = gaps(gap_ns, "gap_ns", len(b), unit="ns")
    return P, b, g


def _show(x: np.ndarray) -> str:
    return "[" + ", ".join(f"{v:g}" for v in x.tolist()) + "]"


def explorer_workload(programs_, burst_kib, gap_us, n_bursts, train_programs, train_burst_kib, train_gap_us) -> None:
    """Notebook 00's parameters, named as the notebook names them (``papermill -p programs -5`` stops here)."""
    programs(programs_, "programs")
    programs(n_bursts, "n_bursts")
    sizes([burst_kib], "burst_kib")
    gaps([gap_us], "gap_us", 1)
    programs(train_programs, "train_programs")
    gaps(train_gap_us, "train_gap_us", len(sizes(train_burst_kib, "train_burst_kib")))
