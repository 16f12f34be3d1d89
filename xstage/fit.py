"""Fit the Burst-Gap model to burst-gap sweep data (scipy least squares, robust loss), with uncertainty
(bootstrap over configurations) and error on held-out configurations (k-fold by configuration, never by
repeat, so a configuration's repeats never sit on both sides).

Residuals are log(predicted / measured) per (configuration, burst) after taking the median over repeats and
ranks: relative errors, so 100 ns bursts and 3 ms bursts weigh alike.

What is compared: the model describes the whole GPU's burst (P * b bytes), so the measured quantity is the
burst's span (first program's issue start -> last program's issue end) in grid-synchronised runs. The gap the
model sees is the store-free time between bursts as run: the requested gap plus the harness's grid-barrier
time, measured in the same sweep on the smallest bursts of each (programs, gap) (``idle_ns`` - gap).

The stage model's fit per link (the rungs of the ladder, the records it reads): :mod:`xstage.stage_fit`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from .fluid import KIB, BurstGapParams, train

CONFIG = ["target", "store_bytes", "programs", "burst_bytes", "gap_ns", "n_bursts", "drain", "sync"]
PARAM_NAMES = ["issue_ns_per_kib", "drain_gbps", "capacity_kib", "overhead_ns"]
UNITS = {"issue_ns_per_kib": "ns/KiB/program", "drain_gbps": "GB/s", "capacity_kib": "KiB", "overhead_ns": "ns"}


def tidy_for_fit(df: pd.DataFrame, target: str = "remote", store_bytes: int = 16,
                 measure: str = "span_ns") -> pd.DataFrame:
    """One row per (configuration, burst): the median ``measure`` over repeats and ranks (issue-only runs),
    with ``gap_eff_ns``: the gap plus the harness's measured barrier time (see the module docstring)."""
    sel = df[(df.target == target) & (df.store_bytes == store_bytes) & (~df.drain.astype(bool))]
    if sel.empty:
        raise ValueError(f"no issue-time rows for target={target!r}, store_bytes={store_bytes}")
    if measure not in ("span_ns", "issue_ns"):
        raise ValueError(f"measure must be 'span_ns' or 'issue_ns', got {measure!r}")
    t = sel.groupby(CONFIG + ["burst"], as_index=False)[[measure, "idle_ns"]].median()
    t = t.rename(columns={measure: "issue_ns"})
    smallest = t[(t.burst_bytes == t.burst_bytes.min()) & (t.burst > 0)]
    harness = (smallest.groupby(["programs", "gap_ns"])["idle_ns"].median() - smallest.groupby(
        ["programs", "gap_ns"])["gap_ns"].first()).clip(lower=0).rename("harness_ns")
    t = t.merge(harness.reset_index(), on=["programs", "gap_ns"], how="left")
    t["gap_eff_ns"] = t.gap_ns + t.harness_ns.fillna(0.0)
    return t.drop(columns=["idle_ns", "harness_ns"])


def _as_arrays(t: pd.DataFrame):
    """Configurations as arrays [n_cfg] and measured times [n_cfg, n_bursts] (NaN where absent)."""
    cfgs = t[CONFIG + ["gap_eff_ns"]].drop_duplicates(subset=CONFIG).reset_index(drop=True)
    n = int(t.n_bursts.max())
    idx = t.merge(cfgs.reset_index(), on=CONFIG)["index"].to_numpy()
    meas = np.full((len(cfgs), n), np.nan)
    meas[idx, t.burst.to_numpy()] = t.issue_ns.to_numpy()
    return cfgs, meas


def predict(cfgs: pd.DataFrame, prm: BurstGapParams, n_bursts: int) -> np.ndarray:
    gap = cfgs.gap_eff_ns if "gap_eff_ns" in cfgs else cfgs.gap_ns
    T, _ = train(cfgs.burst_bytes.to_numpy(), cfgs.programs.to_numpy(), gap.to_numpy(), n_bursts, prm)
    return T


# physically sensible ranges (log space): issue 0.01..1e4 ns/KiB, drain 1..1e6 GB/s, capacity 1 KiB..100 GiB,
# overhead 1 ps..100 us; a fit that ends on a bound says the data do not constrain that parameter
LOG_BOUNDS = (np.log([1e-2, 1.0, 1.0, 1e-3]), np.log([1e4, 1e6, 1e8, 1e5]))


def _params(x) -> BurstGapParams:
    return BurstGapParams(*np.exp(x))


def _solve(cfgs, meas, x0, max_nfev: int = 400):
    mask = np.isfinite(meas) & (meas > 0)
    n = meas.shape[1]

    def resid(x):
        return (np.log(predict(cfgs, _params(x), n)) - np.log(meas))[mask]

    x0 = np.clip(x0, LOG_BOUNDS[0] + 1e-9, LOG_BOUNDS[1] - 1e-9)
    return least_squares(resid, x0, loss="soft_l1", f_scale=0.1, method="trf", x_scale="jac", max_nfev=max_nfev,
                         bounds=LOG_BOUNDS)


def _initial_guess(cfgs, meas) -> np.ndarray:
    """From the data: half the smallest burst's time (overhead), the fewest programs' per-KiB time on their
    largest burst, the aggregate rate of the largest bursts (drain); then the capacity (256 KiB .. 16 MiB)
    whose start fits best."""
    B = (cfgs.programs * cfgs.burst_bytes).to_numpy()
    small = np.nanmedian(meas[cfgs.burst_bytes == cfgs.burst_bytes.min()])
    one = (cfgs.programs == cfgs.programs.min()).to_numpy()
    big = one & (cfgs.burst_bytes == cfgs.burst_bytes[one].max()).to_numpy()
    per_kib = np.nanmedian(meas[big]) / (cfgs.burst_bytes[big].max() / KIB)
    top = B >= np.sort(B)[-max(len(B) // 20, 1)]
    rate = np.nanmedian(B[top, None] / meas[top])
    starts = [np.log([max(per_kib, 1e-3), max(rate, 1e-3), c, max(small * 0.5, 1.0)])
              for c in (256.0, 1024.0, 4096.0, 16384.0)]
    return min(starts, key=lambda x: _solve(cfgs, meas, x, max_nfev=3).cost)


@dataclass
class FitResult:
    params: BurstGapParams
    ci_low: dict
    ci_high: dict
    uncertainty: str
    cfgs: pd.DataFrame = field(repr=False)
    measured: np.ndarray = field(repr=False)
    predicted: np.ndarray = field(repr=False)
    heldout: pd.DataFrame | None = field(default=None, repr=False)
    target: str = "remote"
    store_bytes: int = 16

    @property
    def rel_error(self) -> np.ndarray:
        return self.predicted / self.measured - 1.0

    @property
    def heldout_median_abs_error(self) -> float:
        return float(np.nanmedian(np.abs(self.heldout.rel_error))) if self.heldout is not None else np.nan

    def table(self) -> pd.DataFrame:
        """Predicted vs measured per (configuration, burst)."""
        rows = self.cfgs.loc[self.cfgs.index.repeat(self.measured.shape[1])].reset_index(drop=True)
        rows["burst"] = np.tile(np.arange(self.measured.shape[1]), len(self.cfgs))
        rows["measured_ns"] = self.measured.ravel()
        rows["predicted_ns"] = self.predicted.ravel()
        rows["rel_error"] = rows.predicted_ns / rows.measured_ns - 1
        return rows.dropna(subset=["measured_ns"])


def kfold_heldout(cfgs, meas, x0, k: int = 5, seed: int = 0) -> pd.DataFrame:
    """Refit on k-1 folds of configurations, predict the held-out fold; rows per (configuration, burst)."""
    rng = np.random.default_rng(seed)
    fold = rng.permutation(len(cfgs)) % k
    out = []
    n = meas.shape[1]
    for f in range(k):
        tr, te = fold != f, fold == f
        x = _solve(cfgs[tr].reset_index(drop=True), meas[tr], x0).x
        pred = predict(cfgs[te].reset_index(drop=True), _params(x), n)
        part = cfgs[te].loc[cfgs[te].index.repeat(n)].reset_index(drop=True)
        part["burst"] = np.tile(np.arange(n), te.sum())
        part["fold"] = f
        part["measured_ns"] = meas[te].ravel()
        part["predicted_ns"] = pred.ravel()
        out.append(part)
    ho = pd.concat(out, ignore_index=True).dropna(subset=["measured_ns"])
    ho["rel_error"] = ho.predicted_ns / ho.measured_ns - 1
    return ho


def fit_burst_gap(df: pd.DataFrame, target: str = "remote", store_bytes: int = 16, n_bootstrap: int = 100,
                  k_folds: int = 5, seed: int = 0, uncertainty: str = "bootstrap",
                  measure: str = "span_ns") -> FitResult:
    """Fit the three Burst-Gap parameters (+ the benchmark's fixed overhead) to sweep rows ``df``."""
    if uncertainty not in ("bootstrap", "jacobian"):
        raise ValueError(f"uncertainty must be 'bootstrap' or 'jacobian', got {uncertainty!r}")
    if n_bootstrap < 0 or k_folds < 2:
        raise ValueError(f"need n_bootstrap >= 0 and k_folds >= 2, got {n_bootstrap}, {k_folds}")
    cfgs, meas = _as_arrays(tidy_for_fit(df, target, store_bytes, measure))
    if len(cfgs) < 2 * k_folds:
        raise ValueError(f"{len(cfgs)} configurations are too few to fit and cross-validate ({k_folds} folds)")
    x0 = _initial_guess(cfgs, meas)
    sol = _solve(cfgs, meas, x0)
    best = _params(sol.x)
    if uncertainty == "bootstrap" and n_bootstrap:
        rng = np.random.default_rng(seed)
        draws = []
        for _ in range(n_bootstrap):
            pick = rng.integers(0, len(cfgs), len(cfgs))
            draws.append(np.exp(_solve(cfgs.iloc[pick].reset_index(drop=True), meas[pick], sol.x).x))
        lo, hi = np.percentile(np.array(draws), [2.5, 97.5], axis=0)
    else:  # Gauss-Newton covariance of the log-parameters
        J = sol.jac
        dof = max(J.shape[0] - J.shape[1], 1)
        s2 = 2 * sol.cost / dof
        cov = np.linalg.pinv(J.T @ J) * s2
        se = np.sqrt(np.diag(cov))
        # an unconstrained parameter (e.g. a capacity on its bound) has a huge se: its interval spans the bounds
        lo = np.exp(np.maximum(sol.x - 1.96 * se, LOG_BOUNDS[0]))
        hi = np.exp(np.minimum(sol.x + 1.96 * se, LOG_BOUNDS[1]))
    heldout = kfold_heldout(cfgs, meas, sol.x, k=k_folds, seed=seed)
    return FitResult(best, dict(zip(PARAM_NAMES, lo)), dict(zip(PARAM_NAMES, hi)), uncertainty, cfgs, meas,
                     predict(cfgs, best, meas.shape[1]), heldout, target, store_bytes)


def coverage(res: FitResult, truth: BurstGapParams | dict) -> pd.DataFrame:
    """The self-test of a fit on simulated data: for each parameter the truth the data were made with, the
    estimate, its 95 % interval, whether the interval ``covers`` the truth and the estimate's relative error.
    (The simulated source's sidecar names its truth: ``meta["params"]["model"]``.) Nominal coverage is 95 % per
    parameter; ``tests/test_fit.py`` measures it over seeds."""
    t = truth if isinstance(truth, dict) else asdict(truth)
    missing = [k for k in PARAM_NAMES if k not in t]
    if missing:
        raise ValueError(f"truth lacks {missing} (expected the fluid parameters {list(PARAM_NAMES)})")
    p = asdict(res.params)
    return pd.DataFrame([dict(parameter=k, truth=float(t[k]), value=p[k], ci95_low=res.ci_low[k],
                              ci95_high=res.ci_high[k], covers=bool(res.ci_low[k] <= t[k] <= res.ci_high[k]),
                              rel_error=p[k] / float(t[k]) - 1.0, unit=UNITS[k]) for k in PARAM_NAMES])


def fluid_summary(res: FitResult) -> pd.DataFrame:
    """Parameter, value, 95% interval, unit; then the held-out error."""
    p = res.params.as_dict()
    rows = [dict(parameter=k, value=p[k], ci95_low=res.ci_low[k], ci95_high=res.ci_high[k], unit=UNITS[k])
            for k in PARAM_NAMES]
    rows.append(dict(parameter="heldout_median_abs_error", value=res.heldout_median_abs_error, ci95_low=np.nan,
                     ci95_high=np.nan, unit="fraction"))
    return pd.DataFrame(rows)
