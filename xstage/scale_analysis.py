"""The paper's 8-GPU figures, predicted before anything is measured at 8 GPUs or 8 ranks (issue 41): model outputs,
computed from the records, never measured.

What is predicted (per configuration, then the geomean and maximum the paper quotes), at P = 8 ranks, one per GPU
of an 8-GPU NVSwitch node (HGX H200):
- MegaMoE: the interleaved / Expert-Wave kernel speedup over the 84 configurations (paper: 1.18x geomean, 1.62x
  max), per dtype, for the current kernels (dynamic assignment, TMA main loops, swizzled tiles).
- Ulysses: fused (sender-visible) / serial (our attention, then the all-to-all) per shape whose heads divide by 8
  (paper: 1.43x FA3, 1.42x FA4 maximum).

From what (every input is a record or a fit already in data/; no 8-GPU or 8-rank row is read):
- compute: MegaMoE's per-program GEMM rate calibrated on the one-GPU compute-only control (data/h200x1/
  megamoe_controls, link local: Expert-Wave with every combine store local, P = 2, rank 0; the moe_cost formula,
  :func:`xstage.moe_cost.calibrate_rate`), applied to each of the 8 ranks' task lists of the 8-rank routing
  (E / 8 experts per rank, the tiles the sweep's rule picks at 8 ranks). Ulysses' attention time per rank from
  the compute-only ``attention_only`` rows (data/h200x1/ulysses_local, else the 2x H200 record's) at P = 2, scaled
  to H / 8 heads by whole waves of programs (:func:`attention_ms`; checked on the one-GPU record's P = 4 rows).
- communication: the NVLink stage model fitted on 2x H200 (data/h200x2/stage_fit_nvlink.json.gz: drain D, the
  issue time, the shared stage), MegaMoE's round-by-round stall (moe_cost, stall model round_shared, wait model
  time) with each rank's combine bytes to its 7 peers; Ulysses' fused epilogue as the stage model's free-running
  train of one output tile per program (:func:`xstage.model.predict_train`), and the serial all-to-all as the
  NCCL all-to-all times of the 2x H200 record fitted as alpha + bytes / beta (:func:`alltoall_fit`).
- the 8-GPU world (NVSWITCH below): a GPU's NVLink egress is its 18 NVLink-4 links into the NVSwitches whatever the
  destination, 450 GB/s per direction (900 GB/s bidirectional) on HGX H100 / H200, with full bisection (the
  switches carry every GPU's egress at once): the per-GPU stage and drain fitted on the 2-GPU pair (the same 18
  links, there all to the one peer) carry over to 7 peers. Ingress is not modelled (every rank receives about as
  much as it sends: its own tokens' results).

Uncertainty (:data:`N_DRAWS` seeded draws): the stage parameters from their fitted 95 % intervals (independent
normals: the fit records intervals, not samples), the compute time of each configuration from the compute-only
measurements' run-to-run spread (MegaMoE: the controls against the PCIe sweep's own compute_ms; Ulysses: the
repeats' spread), the all-to-all fit redrawn within its points' standard errors, the stage model's own error (its
held-out median |error| on free-running trains: one lognormal factor per draw on every stall, shared, the
conservative choice for a geomean) and each model's error where it is measured, per configuration: MegaMoE's tile
order (the measured compute-only interleaved / Expert-Wave ratio at P = 2 against the cost model's,
:func:`order_error`), Ulysses' speedup at P = 2 against the 2x H200 record (:func:`ulysses_p2_check`). Reported:
the central value (fitted parameters, measured medians) and p5-p95 of the draws.

The 8-rank traffic records on 2 GPUs (data/h200x2/traffic8, ``xstage sweep ... --traffic-ranks 8``; none recorded
when this was written) are not an 8-GPU measurement: each GPU carries ONE rank's layer and its 8-rank egress (7/8
remote), all of it to the one peer, so they check the per-rank compute and the per-GPU egress volume of this
prediction but not the NVSwitch fan-out to 7 peers or 8 GPUs sending at once. They are no input here; the sealed
prediction is written only while data/ holds none of them, nor any 8-GPU record (:func:`scale_measurements`).

The sealed file: :mod:`xstage.prediction_analysis` (``python -m xstage.prediction_analysis --write``) writes these
numbers into data/h200x8/prediction/ with their commit, before any 8-GPU or 8-rank measurement. The two-node
figures of docs/scale-out.md: :func:`two_node_megamoe` and :func:`two_node_ulysses`, the same formulas with the
NIC's public numbers in place of the fitted NVLink stage (labelled so: not fitted).

Legend: P = ranks, S = tokens, H = heads, D = head dim, T = tokens per rank, n = programs (132 SMs).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from . import data, records
from .fluid import KIB, BurstGapParams, drain_time, issue_time
from .model import load_params, predict_train, read_fit
from .moe_cost import WAIT_DEFAULT, WAIT_MODELS, stall_stage
from .moe_plan import (CASES, KIND_L2, OUT_DTYPES, TILE_SWIZZLE, TileGrid, build_schedule, calibrate_rate,
                       gpu_default_tiles, routing_of, schedule_of_param, tiles_of_row)
from .sources import LINK_MACHINES, paper_number
from .stage_params import StageParams
from .ulysses import alltoall_bytes

WORLD = 8                    # the paper's node: 8 GPUs, one rank each
N_SMS = 132                  # H200 (and H100 SXM) SMs: the persistent kernels' programs
N_DRAWS = 100
SEED = 41
ASSIGNMENT = "dynamic"       # the current MegaMoE kernels' task assignment
STALL = "round_shared"       # moe_cost.STALL_DEFAULT (within 10 % on 503 of 504 host-link speedups)
SCHEDULES = ("expert_wave", "interleaved")
KIND = "scale_prediction"
MACHINE = "h200x8"
ATTN_BLOCK_M = 128           # every recorded Ulysses config's row block
STAGE_ERROR_OF = "free"      # the fit's held-out rows whose median |error| sizes the stage model's own error
NOTE = ("a model prediction, computed from recorded 1- and 2-GPU measurements and the NVLink stage fit; no 8-GPU "
        "or 8-rank measurement existed or was read when it was written")

# The 8-GPU world the prediction assumes (public numbers; docs/scale-out.md cites them too).
NVSWITCH = {
    "per_gpu_links": 18,
    "per_gpu_gbps_per_direction": 450.0,
    "per_gpu_gbps_bidirectional": 900.0,
    "source": "NVIDIA H200 / H100 SXM datasheets: NVLink 900 GB/s per GPU (18 NVLink-4 links x 50 GB/s "
              "bidirectional); HGX H100/H200 8-GPU: four NVSwitch chips, every GPU's 18 links into them, full "
              "bisection (non-blocking) between any pairs of GPUs",
    "assumed": "a GPU's NVLink egress drains at the fitted 2-GPU rate D whatever the mix of its 7 destinations "
               "(the 2-GPU machine's 18 links all join the pair; on HGX they join the switches); the stage is "
               "the sender's (its capacity and stall as fitted); full bisection: 8 GPUs sending at once do not "
               "slow one another in the switches; ingress is not modelled",
}
# The NIC of docs/scale-out.md's two-node figures (public numbers, not fitted).
NIC = {
    "name": "ConnectX-7 NDR InfiniBand, one 400 Gb/s NIC per GPU",
    "line_gbps": 50.0,        # 400 Gb/s = 50 GB/s per direction
    "measured_gbps": 43.0,    # DeepEP's NVSHMEM kernels: internode, 16 ranks (2 nodes), 43 GB/s RDMA
    "source": "deepseek-ai/DeepEP docs/legacy.md (its NVSHMEM-based kernels): H800 with a CX7 InfiniBand 400 "
              "Gb/s RDMA NIC each "
              "(~50 GB/s maximum); internode dispatch / combine at 16 ranks: 43 / 43 GB/s (RDMA bottleneck)",
}


# ----------------------------------------------------------------------------------------------- stage draws
@dataclass
class StageDraws:
    """The parameters the round-level stall reads, one value per draw (arrays [N + 1], draw 0 the fitted values):
    the issue time per KiB and program, the drain D (bytes/ns), the shared stage C (bytes) of stall model
    round_shared (phi C_0), and the stage model's own error (a factor on every stall; 1 in draw 0). Duck-types
    the fluid parameters for xstage.fluid's vectorized functions (issue_rate, drain_gbps, capacity_bytes,
    overhead_ns)."""

    issue_ns_per_kib: np.ndarray
    drain_gbps: np.ndarray
    capacity_bytes: np.ndarray
    error: np.ndarray
    overhead_ns: float = 0.0
    stage: tuple = ()              # the StageParams of each draw (stall model issuers reads their C(b))

    def issue_rate(self, programs):
        return np.asarray(programs, np.float64) * KIB / self.issue_ns_per_kib

    def __len__(self) -> int:
        return len(self.drain_gbps)

    def of_issuers(self, b: int) -> "StageDraws":
        """The stage a round of ``b`` issuing programs sees under stall model issuers: phi C(b) of each draw."""
        cap = np.array([p.fluid(b).capacity_bytes for p in self.stage])
        return replace(self, capacity_bytes=cap)


def _positive(rng, mid, lo, hi, n):
    """n draws of a fitted parameter from its 95 % interval (a normal of sd (hi - lo) / 3.92), kept positive."""
    sd = max(float(hi) - float(lo), 0.0) / 3.92
    return np.maximum(rng.normal(float(mid), sd, n), float(mid) * 0.05)


def _fit(link: str) -> dict:
    return read_fit(data.machine_dir(LINK_MACHINES[link]) / f"stage_fit_{link}.json", link)


def stage_error_sigma(link: str = "nvlink") -> float:
    """The stage model's own error as a lognormal sigma: its fit's held-out median |error| (free-running trains)
    / 0.6745 (a normal's median |x| / sigma)."""
    return float(_fit(link)["heldout"][STAGE_ERROR_OF]["median_abs_error"]) / 0.6745


def stage_param_draws(n: int, seed: int = SEED, link: str = "nvlink") -> list[StageParams]:
    """The fitted StageParams of ``link`` followed by ``n`` drawn from its fit's 95 % intervals (overhead,
    arbitration and the rest as fitted)."""
    fit, prm = _fit(link), load_params(data.machine_dir(LINK_MACHINES[link]), link)
    rng = np.random.default_rng(seed)
    lo, hi = fit["ci95_low"], fit["ci95_high"]
    cols = ("issue_ns_per_kib", "drain_gbps", "base_capacity_kib", "capacity_kib", "capacity_per_program_kib")
    drawn = {c: _positive(rng, getattr(prm, c), lo[c], hi[c], n) for c in cols}
    drawn["stalled_fraction"] = np.clip(_positive(rng, prm.stalled_fraction, lo["stalled_fraction"],
                                                  hi["stalled_fraction"], n), 0.01, 1.0)
    drawn["spread"] = np.clip(_positive(rng, prm.spread, lo["spread"], hi["spread"], n), 0.0, 0.95)
    return [prm] + [replace(prm, **{c: float(v[i]) for c, v in drawn.items()}) for i in range(n)]


def error_draws(n: int, seed: int = SEED, link: str = "nvlink") -> np.ndarray:
    """[n + 1] factors of the stage model's own error (1 first, then lognormal draws)."""
    return np.concatenate([[1.0], np.exp(np.random.default_rng(seed + 1).normal(0.0, stage_error_sigma(link), n))])


def stage_draws(prms: list[StageParams], error: np.ndarray) -> StageDraws:
    """The round-level view (:class:`StageDraws`) of ``prms`` with the stage model's error factors ``error``."""
    f = [stall_stage(p, 1, STALL) for p in prms]
    return StageDraws(np.array([x.issue_ns_per_kib for x in f]), np.array([x.drain_gbps for x in f]),
                      np.array([x.capacity_bytes for x in f]), np.asarray(error, np.float64), stage=tuple(prms))


def summary(values: np.ndarray) -> dict:
    """Draw 0 (the central value: the fitted parameters, the measured medians) and p5 / median / p95 of the others.
    The draws of a maximum over configurations lie above its central value: the maximum of noisy values is
    biased up (each configuration's own error is drawn independently)."""
    v = np.asarray(values, np.float64)
    return dict(central=float(v[0]), p5=float(np.percentile(v[1:], 5)), median=float(np.median(v[1:])),
                p95=float(np.percentile(v[1:], 95)))


# --------------------------------------------------------------------------------- MegaMoE: the cost model
@dataclass(frozen=True)
class UnitTerms:
    """One rank's task list under moe_cost.predict_kernel_ns at a GEMM rate of 1 FLOP/ns per program: every
    compute term scales with 1 / rate (the claims of the wait walk do not depend on it), so a list is walked once
    and priced for any rate and any stage. compute: the busiest program's compute + spin; per round k: its mean
    work c[k], issuers b[k], programs m[k] and remote bytes B[k]."""

    compute: float
    c: np.ndarray
    b: np.ndarray
    m: np.ndarray
    B: np.ndarray


def unit_terms(tl_, remote_rows_per_block: np.ndarray, n: int, out_bytes: int, hidden: int, inter: int,
               tiles, assignment: str = ASSIGNMENT) -> UnitTerms:
    """:class:`UnitTerms` of task list ``tl_`` (the walk of moe_cost.predict_kernel_ns, the wait model of
    ``assignment``'s default)."""
    waits = WAIT_MODELS.check(WAIT_DEFAULT[assignment]).impl
    c1 = 2.0 * tiles.block_m * hidden * 2 * tiles.block_n1
    c2 = 2.0 * tiles.block_m * inter * tiles.block_n2
    tasks = tl_.tasks
    is2 = tasks[:, 0] == KIND_L2
    prog, wait = waits(tasks, np.where(is2, c2, c1), c1, n, assignment, tl_.grid.n_pool)
    work = np.where(is2, c2, c1) + wait
    remote = np.where(is2, remote_rows_per_block[tasks[:, 4]] * float(tiles.block_n2 * out_bytes), 0.0)
    load = np.bincount(prog, weights=work, minlength=n)
    compute = float(load[int(np.argmax(load))])
    R = -(-len(tasks) // n)
    pad = R * n - len(tasks)
    rounds = lambda x: np.concatenate([np.asarray(x, np.float64), np.zeros(pad)]).reshape(R, n)  # noqa: E731
    m = np.full(R, float(n))
    m[-1] = n - pad
    return UnitTerms(compute, rounds(work).sum(1) / m, rounds(is2).sum(1).astype(int), m, rounds(remote).sum(1))


def priced_ns(t: UnitTerms, rate, st: StageDraws, stall_model: str = STALL) -> np.ndarray:
    """Kernel time (ns) of :class:`UnitTerms` ``t`` at GEMM rate ``rate`` (FLOP/ns per program; [N + 1] or a
    scalar) for every draw of ``st``: compute / rate + each round's stall + the final drain. Stall model
    round_shared (the prediction's): the issuers' fluid issue time spread over the round, at least the bytes beyond
    the shared stage over D; ``issuers`` (the sensitivity: the first kernels' record's model): the issuers' issue
    time into phi C(b), spread over the round, the stage draining throughout. Draw 0 equals
    moe_cost.predict_kernel_ns under either (tests/test_scale_analysis.py)."""
    if stall_model not in (STALL, "issuers"):
        raise ValueError(f"stall_model must be {STALL} or issuers, got {stall_model!r}")
    inv = 1.0 / np.asarray(rate, np.float64)
    D, C = st.drain_gbps, st.capacity_bytes
    q = np.zeros_like(D)
    stall = np.zeros_like(D)
    seen: dict[int, StageDraws] = {}
    for ck, b, m, B in zip(t.c, t.b, t.m, t.B):
        q = np.maximum(q - D * ck * inv, 0.0)
        if B > 0:
            if stall_model == "issuers":
                sb = seen.setdefault(int(b), st.of_issuers(int(b)))
                T, q = issue_time(B / b, b, q, sb)
                s = b * T / m
            else:
                T, _ = issue_time(B / b, b, q, st)
                s = np.maximum(b * T / m, (q + B - C) / D)
                q = np.clip(q + B - D * s, 0.0, C)
            stall = stall + s
    return t.compute * inv + (stall + drain_time(q, st)) * st.error


def compute_records() -> pd.DataFrame:
    """Per MegaMoE configuration and dtype, the Expert-Wave compute-only time (ms) of the one-GPU control
    (``megamoe_controls``, h200x1, link local; rank 0 of P = 2) with its tiles and schedule param, beside the PCIe
    sweep's own compute-only time of the same kernel (``megamoe`` h200x1 host, column compute_ms: another card,
    another day) as ``repeat_ms``."""
    c, _ = data.load(records.folder("megamoe_controls", "h200x1", "local"), data.MEGAMOE_GEMM)
    p, _ = data.load(records.folder("megamoe", "h200x1", "host"), data.MEGAMOE)
    keys = ["shape", "tokens", "routing", "dtype"]
    c = c[(c.schedule == "expert_wave") & (c.method == "ours") & (c.variant == "default")]
    p = p[p.schedule == "expert_wave"][keys + ["compute_ms"]].rename(columns={"compute_ms": "repeat_ms"})
    out = c.merge(p, on=keys, how="left")
    return out[keys + ["ms", "repeat_ms", "note", "block_m", "block_n1", "block_n2", "block_k", "num_warps",
                       "num_stages", "tma"]].reset_index(drop=True)


def compute_sigma(rec: pd.DataFrame) -> float:
    """Run-to-run spread of one compute-only measurement (lognormal sigma): the sd of log(controls / repeat)
    over the configurations measured twice, / sqrt(2)."""
    r = np.log(rec.ms / rec.repeat_ms).dropna()
    return float(r.std() / np.sqrt(2.0))


def order_error(n: int = N_SMS) -> pd.DataFrame:
    """The cost model's tile-order error where it is measured: per configuration and dtype of the one-GPU
    compute-only controls (P = 2, rank 0, every store local), log of the measured interleaved / Expert-Wave time
    over the model's (the busiest program's compute + spin of each recorded list, the same walk at any rate)."""
    return _order_error(n).copy()


@functools.lru_cache(maxsize=2)
def _order_error(n: int) -> pd.DataFrame:
    c, _ = data.load(records.folder("megamoe_controls", "h200x1", "local"), data.MEGAMOE_GEMM)
    c = c[(c.method == "ours") & (c.variant == "default") & c.schedule.isin(SCHEDULES)]
    cases = {x.name: x for x in CASES}
    rows = []
    for (shape, tokens, routing, dtype), g in c.groupby(["shape", "tokens", "routing", "dtype"], sort=False):
        case = cases[f"{shape}_T{tokens}_{routing}"]
        s = case.shape
        g = g.set_index("schedule")
        tiles = tiles_of_row(g.iloc[0])
        lay = routing_of(case, 2)[2][0]
        grid = TileGrid.of(lay, s.hidden, s.intermediate, tiles)
        rr = grid.remote_rows_per_block(lay)
        unit = {x: unit_terms(schedule_of_param(x, str(g.note[x]), grid, n), rr, n, 2, s.hidden, s.intermediate,
                              tiles).compute for x in SCHEDULES}
        rows.append(dict(config=case.name, dtype=dtype, measured=float(g.ms["interleaved"] / g.ms["expert_wave"]),
                         model=unit["interleaved"] / unit["expert_wave"]))
    out = pd.DataFrame(rows)
    out["log_error"] = np.log(out.measured / out.model)
    return out


def megamoe_config(case, dtype: str, row, st: StageDraws, rate_factor, world: int = WORLD, n: int = N_SMS) -> dict:
    """One configuration at ``world`` ranks: the GEMM rate calibrated on the recorded compute-only time (rank 0 of
    the recorded P = 2 layout, its tiles and list; times ``rate_factor`` per draw), each rank's Expert-Wave and
    interleaved lists at ``world`` ranks (the tiles the GPU sweep picks at that size), priced for every draw; a
    kernel's time is its busiest rank's. Returns the central times and speedup, the central speedup under stall
    model issuers (``speedup_stall_issuers``: the sensitivity to the stall model; ``st`` with its StageParams)
    and the drawn speedups [N + 1]."""
    s = case.shape
    rec_tiles = tiles_of_row(row)
    grid2 = TileGrid.of(routing_of(case, 2)[2][0], s.hidden, s.intermediate, rec_tiles)
    ew2 = schedule_of_param("expert_wave", str(row.note), grid2, n)
    rate = calibrate_rate(ew2, s.hidden, s.intermediate, rec_tiles, n, float(row.ms), ASSIGNMENT)
    tiles = gpu_default_tiles(dtype, case.tokens * world * s.topk / s.experts)
    out_bytes = OUT_DTYPES[dtype].itemsize
    times = {sch: [] for sch in SCHEDULES}
    issuers = {sch: [] for sch in SCHEDULES}      # the sensitivity: stall model issuers, central draw only
    central = StageDraws(st.issue_ns_per_kib[:1], st.drain_gbps[:1], st.capacity_bytes[:1], np.ones(1),
                         stage=st.stage[:1])
    remote = 0
    for lay in routing_of(case, world)[2]:
        grid = TileGrid.of(lay, s.hidden, s.intermediate, tiles, TILE_SWIZZLE)
        rr = grid.remote_rows_per_block(lay)
        remote = max(remote, int(lay.remote_rows) * s.hidden * out_bytes)
        for sch in SCHEDULES:
            u = unit_terms(build_schedule(sch, grid, n), rr, n, out_bytes, s.hidden, s.intermediate, tiles)
            times[sch].append(priced_ns(u, rate * np.asarray(rate_factor), st))
            if st.stage:
                issuers[sch].append(float(priced_ns(u, rate, central, "issuers")[0]))
    ew, il = (np.max(np.stack(times[x]), axis=0) for x in SCHEDULES)
    sens = dict(speedup_stall_issuers=max(issuers["expert_wave"]) / max(issuers["interleaved"])) if st.stage else {}
    return dict(config=case.name, shape=s.name, tokens=case.tokens, routing=case.routing, dtype=dtype,
                compute_ms_p2=float(row.ms), block_m=tiles.block_m, tiles_changed=tiles.block_m != rec_tiles.block_m,
                combine_remote_mb=remote / 1e6, expert_wave_ms=float(ew[0]) / 1e6, interleaved_ms=float(il[0]) / 1e6,
                speedup=float(ew[0] / il[0]), **sens, draws=ew / il)


def megamoe_prediction(n_draws: int = N_DRAWS, seed: int = SEED, configs=None, dtypes=("bf16", "fp8"),
                       world: int = WORLD) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The MegaMoE prediction at ``world`` ranks over NVLink (module docstring). ``configs``: names (None: the 84).
    Returns (per configuration and dtype: central times, speedup, p5 / p95; per dtype: geomean and max of the
    speedups, central and p5 / p95 over the draws, each draw's geomean / max over all its configurations, and the
    central value under stall model issuers, ``central_stall_issuers``: the model's structural sensitivity, not in
    the interval)."""
    rec = compute_records()
    sigma = compute_sigma(rec)
    order = order_error()
    order_sigma = {d: float(g.log_error.std()) for d, g in order.groupby("dtype")}
    st = stage_draws(stage_param_draws(n_draws, seed), error_draws(n_draws, seed))
    rng = np.random.default_rng(seed + 2)
    rows, draws = [], {}
    want = set(configs) if configs is not None else None
    for c in CASES:
        if want is not None and c.name not in want:
            continue
        for dtype in dtypes:
            hit = rec[(rec["shape"] == c.shape.name) & (rec.tokens == c.tokens) & (rec.routing == c.routing)
                      & (rec.dtype == dtype)]
            if hit.empty:
                raise data.DataError(f"no compute-only control for {c.name} {dtype} in megamoe_controls")
            factor = np.concatenate([[1.0], np.exp(rng.normal(0.0, sigma, n_draws))])
            r = megamoe_config(c, dtype, hit.iloc[0], st, factor, world)
            d = r.pop("draws") / np.concatenate([[1.0], np.exp(rng.normal(0.0, order_sigma[dtype], n_draws))])
            draws.setdefault(dtype, []).append(d)
            rows.append({**r, **{k: v for k, v in summary(d).items() if k != "central"}})
    per = pd.DataFrame(rows)
    summ = []
    for dtype, ds in draws.items():
        m = np.stack(ds)                                              # [configs, N + 1]
        g = np.exp(np.log(m).mean(0))
        sens = per[per.dtype == dtype].speedup_stall_issuers
        for metric, v, alt in (("geomean_speedup", g, np.exp(np.log(sens).mean())), ("max_speedup", m.max(0),
                                                                                    sens.max())):
            summ.append(dict(study="megamoe", dtype=dtype, metric=metric, configs=len(ds),
                             paper=paper_number("megamoe", metric), central_stall_issuers=float(alt), **summary(v)))
    return per, pd.DataFrame(summ)


# ------------------------------------------------------------------------------------ Ulysses: attention + a2a
ULYSSES_COMPUTE = (("h200x1", "local"), ("h200x2", "nvlink"))   # attention_only from these records, in this order


def ulysses_records(P: int = 2) -> pd.DataFrame:
    """Per shape, our attention alone (``attention_only``, CUDA events, median ms over repeats and the lognormal
    sigma of the repeats) at ``P`` ranks: the one-GPU record (h200x1 local) where it has the shape, else the
    2x H200 record's own compute-only rows; with the record it came from."""
    out = {}
    for machine, link in ULYSSES_COMPUTE:
        df, _ = data.load(records.folder("ulysses", machine, link), data.ULYSSES)
        a = df[(df.method == "attention_only") & (df.P == P)]
        for (shape, S, H, D), g in a.groupby(["shape", "S", "H", "D"]):
            if shape not in out:
                lg = np.log(g.end_to_end_ms)
                out[shape] = dict(shape=shape, S=int(S), H=int(H), D=int(D), attention_ms=float(g.end_to_end_ms.median()),
                                  sigma=float((lg.quantile(0.75) - lg.quantile(0.25)) / 1.349),
                                  record=f"{machine}/{records.record('ulysses', machine, link).folder}")
    return pd.DataFrame(list(out.values())).sort_values(["S", "H"]).reset_index(drop=True)


def waves(S: int, H: int, P: int, n: int = N_SMS) -> int:
    """Whole waves of the attention grid at P ranks: ceil(S / BM) x H / P programs over n SMs."""
    return -(-(-(-S // ATTN_BLOCK_M) * (H // P)) // n)


def attention_ms(t_ms: float, S: int, H: int, P_from: int, P_to: int, n: int = N_SMS) -> float:
    """Our attention's time at ``P_to`` ranks (H / P_to heads over all S) from its time at ``P_from``: each wave
    of programs (one output tile of one head each, the whole sequence's keys) takes as long, so the time scales
    with the whole waves of the grid (:func:`waves`). A model, computed; :func:`attention_rule_check` scores it
    on the recorded P = 4 rows."""
    return t_ms * waves(S, H, P_to, n) / waves(S, H, P_from, n)


def attention_rule_check() -> pd.DataFrame:
    """The wave rule (:func:`attention_ms`) from P = 2 to P = 4 against the one-GPU record's measured P = 4 rows."""
    df, _ = data.load(records.folder("ulysses", "h200x1", "local"), data.ULYSSES)
    a = df[df.method == "attention_only"].groupby(["shape", "S", "H", "P"]).end_to_end_ms.median().unstack("P")
    rows = []
    for (shape, S, H), r in a.dropna().iterrows():
        pred = attention_ms(float(r[2]), S, H, 2, 4)
        rows.append(dict(shape=shape, measured_p4_ms=float(r[4]), predicted_p4_ms=pred,
                         error=pred / float(r[4]) - 1.0))
    return pd.DataFrame(rows)


def alltoall_fit(n_boot: int = 0, seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """The serial layer's all-to-all (serial_triton - attention_only, medians: NCCL all_to_all_single and the
    relayout) of the 2x H200 record against the bytes each rank sends (xstage.ulysses.alltoall_bytes), fitted
    alpha (ms) + bytes / beta (ms per byte) by least squares weighted by each difference's standard error (1.25 sd /
    sqrt(repeats) of either median: at long sequences the difference is a few ms under an attention's run-to-run
    spread of ~1 %). Returns ([alpha, 1 / beta], and ``n_boot`` refits on the differences redrawn within their
    standard errors [n_boot, 2])."""
    df, _ = data.load(records.folder("ulysses", "h200x2", "nvlink"), data.ULYSSES)
    g = df[df.method.isin(["serial_triton", "attention_only"])].groupby(["S", "H", "D", "P", "method"]).end_to_end_ms
    med, se = g.median().unstack(), (1.2533 * g.std() / np.sqrt(g.size())).unstack()
    x = np.array([alltoall_bytes(S, H, D, P) for S, H, D, P in med.index], np.float64)
    y = (med.serial_triton - med.attention_only).to_numpy()
    e = np.hypot(se.serial_triton, se.attention_only).to_numpy()
    coef = np.polyfit(x, y, 1, w=1.0 / e)[::-1]
    rng = np.random.default_rng(seed + 3)
    fit = coef[0] + coef[1] * x
    boot = np.array([np.polyfit(x, fit + rng.normal(0.0, e), 1, w=1.0 / e)[::-1]
                     for _ in range(n_boot)]).reshape(n_boot, 2)
    return coef, boot


def fused_extra_ms(prm: StageParams, S: int, H: int, D: int, P: int, t_ms: float, n: int = N_SMS) -> float:
    """What the fused epilogue's stores add to the attention's time at P ranks (the stage model of ``prm``, a
    free-running train, :func:`xstage.model.predict_train`): every program stores one output tile (BM x D bf16)
    per wave, (P - 1) / P of them to peers, the programs storing at once those of a full wave times (P - 1) / P,
    a wave's compute between bursts; the sum of the median program's issue times over its bursts (ms)."""
    w = waves(S, H, P, n)
    programs = min(-(-S // ATTN_BLOCK_M) * (H // P), n)
    storing = max(1, round(programs * (P - 1) / P))
    tile = float(ATTN_BLOCK_M * D * 2)
    issue = predict_train(prm, storing, np.full(w, tile), np.full(w, t_ms * 1e6 / w))
    return float(np.sum(issue)) / 1e6


def ulysses_prediction(n_draws: int = N_DRAWS, seed: int = SEED, world: int = WORLD) -> tuple[pd.DataFrame,
                                                                                            pd.DataFrame]:
    """The Ulysses prediction at ``world`` ranks over NVLink (module docstring), per shape whose heads divide by
    ``world``: attention (the wave rule from P = 2), the serial all-to-all (the fit), the fused layer (attention +
    the stores' issue time). The draws add the model's own error where it is measured (the sd of log(model /
    measured) over the 2x H200 record's shapes, :func:`ulysses_p2_check`), per shape. Returns (per shape: central
    times, speedup fused / serial, p5 / p95; the maximum over shapes, central and p5 / p95, beside the paper's FA3
    and FA4 numbers: our attention stands in for both)."""
    att = ulysses_records()
    att = att[att.H % world == 0].reset_index(drop=True)
    coef, boot = alltoall_fit(n_draws, seed)
    prms = stage_param_draws(n_draws, seed)
    err = error_draws(n_draws, seed)
    rng = np.random.default_rng(seed + 4)
    p2 = ulysses_p2_check()
    model_sigma = float(np.log(p2.model / p2.measured).std())    # the model's error where it is measured (P = 2)
    rows, draws = [], []
    for r in att.itertuples(index=False):
        a2 = r.attention_ms * np.concatenate([[1.0], np.exp(rng.normal(0.0, r.sigma, n_draws))])
        t8 = np.array([attention_ms(a, r.S, r.H, 2, world) for a in a2])
        nbytes = alltoall_bytes(r.S, r.H, r.D, world)
        cf = np.vstack([coef, boot])
        a2a = np.maximum(cf[:, 0] + cf[:, 1] * nbytes, 0.0)
        extra = np.array([fused_extra_ms(p, r.S, r.H, r.D, world, t) for p, t in zip(prms, t8)]) * err
        serial, fused = t8 + a2a, t8 + extra
        sp = serial / fused / np.concatenate([[1.0], np.exp(rng.normal(0.0, model_sigma, n_draws))])
        draws.append(sp)
        rows.append(dict(shape=r.shape, S=r.S, H=r.H, D=r.D, P=world, compute_record=r.record,
                         attention_ms_p2=r.attention_ms, attention_ms=float(t8[0]), alltoall_mb=nbytes / 1e6,
                         alltoall_ms=float(a2a[0]), fused_extra_ms=float(extra[0]), serial_ms=float(serial[0]),
                         fused_ms=float(fused[0]), speedup=float(sp[0]),
                         **{k: v for k, v in summary(sp).items() if k != "central"}))
    per = pd.DataFrame(rows)
    best = np.stack(draws).max(0)
    summ = pd.DataFrame([dict(study="ulysses", dtype="bf16", metric=f"{fa}_max_sender_visible_speedup",
                              attention="ours (Triton) in place of " + fa.upper(),
                              configs=len(per), paper=paper_number("ulysses", f"{fa}_max_sender_visible_speedup"),
                              **summary(best)) for fa in ("fa3", "fa4")])
    return per, summ


def ulysses_p2_check() -> pd.DataFrame:
    """The Ulysses model at P = 2 against the 2x H200 record (a check of the model where it is measured, not an
    input): per shape the measured serial / fused end to end (one clock, CUDA events) beside the model's serial /
    (attention + the stores' issue time). The measured fused time includes its barrier; the model's does not."""
    df, _ = data.load(records.folder("ulysses", "h200x2", "nvlink"), data.ULYSSES)
    m = df.groupby(["shape", "S", "H", "D", "method"]).end_to_end_ms.median().unstack()
    coef, _ = alltoall_fit()
    prm = load_params(data.machine_dir(LINK_MACHINES["nvlink"]), "nvlink")
    rows = []
    for (shape, S, H, D), r in m.iterrows():
        t = float(r.attention_only)
        model = (t + coef[0] + coef[1] * alltoall_bytes(S, H, D, 2)) / (t + fused_extra_ms(prm, S, H, D, 2, t))
        rows.append(dict(shape=shape, S=S, measured=float(r.serial_triton / r.fused), model=model,
                         error=model / float(r.serial_triton / r.fused) - 1.0))
    return pd.DataFrame(rows).sort_values("S").reset_index(drop=True)


# ------------------------------------------------------------------ two nodes over InfiniBand (public numbers)
NODES = 2
NIC_QUEUE_MIB = (1.0, 16.0)   # assumed NIC send-queue bytes in flight per GPU (docs/scale-out.md): two cases


def nic_stage(queue_mib: float, drain_gbps: float = NIC["measured_gbps"]) -> StageDraws:
    """The NIC's stage as the round-level stall sees it, from public numbers (not fitted): the drain the DeepEP
    README measured between two nodes, ``queue_mib`` MiB in flight (the send queue's WQEs x message bytes), the
    SM's issue time per KiB as fitted on NVLink (a put still starts with the SM writing the data and a WQE)."""
    f = stall_stage(load_params(data.machine_dir(LINK_MACHINES["nvlink"]), "nvlink"), 1, STALL)
    one = np.ones(1)
    return StageDraws(one * f.issue_ns_per_kib, one * drain_gbps, one * queue_mib * 1024 * KIB, one)


def cross_node_rows_per_block(lay, grid, gpus_per_node: int = WORLD) -> np.ndarray:
    """[n_pool] rows of each row block of ``lay``'s experts whose source rank sits on another node (its combine
    stores cross the NIC): an expert's rows come source by source (xstage.moe_plan.build_layouts)."""
    d, El = lay.rank, lay.experts_local
    out = []
    for le, rows in enumerate(lay.expert_rows):
        cnt = lay.counts[:, d * El + le].tolist()
        bounds = np.cumsum([0] + cnt)
        far = [(bounds[s_], bounds[s_ + 1]) for s_ in range(len(cnt)) if s_ // gpus_per_node != d // gpus_per_node]
        for rb in range(grid.row_blocks[le]):
            r0, r1 = rb * grid.block_m, min((rb + 1) * grid.block_m, rows)
            out.append(sum(max(0, min(r1, b) - max(r0, a)) for a, b in far))
    return np.array(out, dtype=np.int64)


def two_node_megamoe(configs=None, dtype: str = "bf16", n: int = N_SMS) -> pd.DataFrame:
    """MegaMoE on two 8-GPU nodes (16 ranks, one NIC per GPU), the model with the NIC's public numbers in place of
    the fitted NVLink stage (labelled: not fitted): per configuration whose experts divide by 16, each rank's
    combine rows from the other node priced on the NIC's stage (:func:`nic_stage`, each queue of NIC_QUEUE_MIB),
    the in-node rows left out (NVLink drains them ~8x faster, beside the NIC); the kernel time is the busiest rank's.
    Columns: config, cross_node_mb, compute_ms, and per queue the Expert-Wave and interleaved times and speedup."""
    P = NODES * WORLD
    rec = compute_records()
    want = set(configs) if configs is not None else None
    stages = {q: nic_stage(q) for q in NIC_QUEUE_MIB}
    rows = []
    for c in CASES:
        if (want is not None and c.name not in want) or c.shape.experts % P:
            continue
        s = c.shape
        row = rec[(rec["shape"] == s.name) & (rec.tokens == c.tokens) & (rec.routing == c.routing)
                  & (rec.dtype == dtype)].iloc[0]
        rec_tiles = tiles_of_row(row)
        grid2 = TileGrid.of(routing_of(c, 2)[2][0], s.hidden, s.intermediate, rec_tiles)
        rate = calibrate_rate(schedule_of_param("expert_wave", str(row.note), grid2, n), s.hidden, s.intermediate,
                              rec_tiles, n, float(row.ms), ASSIGNMENT)
        tiles = gpu_default_tiles(dtype, c.tokens * P * s.topk / s.experts)
        t = {(q, x): [] for q in NIC_QUEUE_MIB for x in SCHEDULES}
        far_mb, comp = 0.0, 0.0
        for lay in routing_of(c, P)[2]:
            grid = TileGrid.of(lay, s.hidden, s.intermediate, tiles, TILE_SWIZZLE)
            far = cross_node_rows_per_block(lay, grid)
            far_mb = max(far_mb, float(far.sum()) * s.hidden * OUT_DTYPES[dtype].itemsize / 1e6)
            for x in SCHEDULES:
                u = unit_terms(build_schedule(x, grid, n), far, n, OUT_DTYPES[dtype].itemsize, s.hidden,
                               s.intermediate, tiles)
                comp = max(comp, u.compute / rate / 1e6) if x == "expert_wave" else comp
                for q, st in stages.items():
                    t[(q, x)].append(float(priced_ns(u, rate, st)[0]) / 1e6)
        out = dict(config=c.name, dtype=dtype, cross_node_mb=far_mb, compute_ms=comp)
        for q in NIC_QUEUE_MIB:
            ew, il = max(t[(q, "expert_wave")]), max(t[(q, "interleaved")])
            out.update({f"expert_wave_ms_q{q:g}": ew, f"interleaved_ms_q{q:g}": il, f"speedup_q{q:g}": ew / il})
        rows.append(out)
    return pd.DataFrame(rows)


def two_node_ulysses(queue_mib: float = NIC_QUEUE_MIB[0]) -> pd.DataFrame:
    """Ulysses on two 8-GPU nodes (P = 16), the shapes whose heads divide by 16, with the NIC's public numbers
    (not fitted): attention by the wave rule; serial: the fitted all-to-all's latency alpha + the bytes to the
    other node over the NIC's measured rate (the in-node bytes go beside them over NVLink); fused: attention + the
    stores' issue time on the NIC's stage (the fluid stage of :func:`nic_stage`) for the 8 / 16 of the tiles that
    cross. Columns as :func:`ulysses_prediction`'s per shape."""
    P = NODES * WORLD
    att = ulysses_records()
    att = att[att.H % P == 0]
    coef, _ = alltoall_fit()
    nic = StageParams.from_fluid(BurstGapParams(load_params(data.machine_dir(LINK_MACHINES["nvlink"]),
                                                            "nvlink").issue_ns_per_kib, NIC["measured_gbps"],
                                                queue_mib * 1024), sm_count=N_SMS, link="ib")
    rows = []
    for r in att.itertuples(index=False):
        t = attention_ms(r.attention_ms, r.S, r.H, 2, P)
        far = r.S * (r.H // P) * r.D * 2 * (P - WORLD) / P
        a2a = coef[0] + far / (NIC["measured_gbps"] * 1e6)
        w = waves(r.S, r.H, P)
        programs = min(-(-r.S // ATTN_BLOCK_M) * (r.H // P), N_SMS)
        storing = max(1, round(programs * (P - WORLD) / P))
        issue = predict_train(nic, storing, np.full(w, float(ATTN_BLOCK_M * r.D * 2)), np.full(w, t * 1e6 / w))
        extra = float(np.sum(issue)) / 1e6
        rows.append(dict(shape=r.shape, S=r.S, H=r.H, D=r.D, P=P, attention_ms=t, cross_node_mb=far / 1e6,
                         alltoall_ms=a2a, fused_extra_ms=extra, speedup=(t + a2a) / (t + extra)))
    return pd.DataFrame(rows)
