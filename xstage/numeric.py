"""The shared numerics of xstage (tests, sweeps' pre-checks, studies and notebooks use these, nothing else):
relative L2 error in float64, bit-for-bit equality for pure data movement and reordered schedules, and the
geometric mean of speedups."""
from __future__ import annotations

import numpy as np
import torch


def geomean(x) -> float:
    """exp(mean(log x)) over the values that are not NaN (a pandas Series, an array or a list); NaN if none."""
    v = np.asarray(x, dtype=float)
    v = v[~np.isnan(v)]
    return float(np.exp(np.log(v).mean())) if v.size else float("nan")


def rel_l2(a: torch.Tensor, ref: torch.Tensor) -> float:
    """||a - ref|| / ||ref|| in float64."""
    a, ref = a.double(), ref.double()
    return float((a - ref).norm() / ref.norm())


def check_bit_identical(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Same bits everywhere; raises naming how many elements differ, how many are still NaN (poisoned, never
    written) and the first bad index with both values."""
    if got.shape != want.shape or got.dtype != want.dtype:
        raise AssertionError(f"{what}: got {tuple(got.shape)} {got.dtype}, want {tuple(want.shape)} {want.dtype}")
    ib = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[got.element_size()]
    bad = (got.contiguous().view(ib) != want.contiguous().view(ib)).nonzero()
    if bad.numel():
        first = tuple(int(x) for x in bad[0])
        unwritten = int(torch.isnan(got).sum()) if got.is_floating_point() and got.element_size() > 1 else 0
        raise AssertionError(f"{what}: {bad.shape[0]} of {got.numel()} elements differ ({unwritten} still NaN, "
                             f"i.e. never written); first at {list(first)}: got {got[first].item()}, "
                             f"want {want[first].item()}")
