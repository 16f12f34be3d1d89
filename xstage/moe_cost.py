"""MegaMoE's cost model, CPU only: the predicted kernel time of a task list (``predict_kernel_ns``; the formula is
in xstage.moe_plan's docstring), how tasks go to programs (``ASSIGNMENT_REGISTRY``: static round-robin or dynamic
claims), how a Linear-2 tile's wait on its producers is counted (``WAIT_MODELS``) and how a round's remote stores
are charged against the Burst-Gap stage (``STALL_MODELS``), and the per-program GEMM rate calibrated on a measured
compute-only time (``calibrate_rate``). A task list is anything with ``tasks`` (int32 [n, 5]: kind, expert, row
block, column block, pool block) and ``grid.n_pool`` (xstage.moe_plan.TaskList); tiles: xstage.moe_plan.TileConfig.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, replace

import numpy as np

from .model import BurstGapParams, StageParams, drain_time, issue_time, recover
from .moe_cases import KIND_L1, KIND_L2, TASK_FIELDS
from .registry import Choice, Registry


@dataclass(frozen=True)
class CostModel:
    """What ``predict_kernel_ns`` needs: the Burst-Gap parameters, the GEMM rate, programs, output bytes, and how
    tasks go to programs (``ASSIGNMENTS``)."""

    prm: BurstGapParams | StageParams     # fluid parameters, or a link's stage model (xstage.model.load_params)
    flop_per_ns_per_program: float
    n_programs: int
    out_bytes: int = 2
    assignment: str = "static"
    wait: str | None = None               # WAIT_MODELS name; None: WAIT_DEFAULT[assignment]
    stall: str | None = None              # STALL_MODELS name; None: STALL_DEFAULT

    @classmethod
    def from_tflops(cls, prm: BurstGapParams, tflops: float, n_programs: int, out_bytes: int = 2) -> "CostModel":
        return cls(prm, tflops * 1e3 / n_programs, n_programs, out_bytes)


def _claim_order(work: np.ndarray, n: int) -> np.ndarray:
    """Dynamic assignment: task i goes to the program that becomes free first (list order, ties to the lowest
    program), as an atomic ticket hands them out. Returns each task's program."""
    free = [(0.0, p) for p in range(n)]
    heapq.heapify(free)
    prog = np.empty(len(work), dtype=np.int64)
    for i, w in enumerate(work.tolist()):
        t, p = heapq.heappop(free)
        prog[i] = p
        heapq.heappush(free, (t + w, p))
    return prog


def _static_order(work: np.ndarray, n: int) -> np.ndarray:
    """Static assignment: task i on program i % n (program p walks tasks p, p + n, ...)."""
    return np.arange(len(work)) % n


ASSIGNMENT_REGISTRY = Registry("assignment", (
    Choice("static", "task i on program i % n_programs", _static_order),
    Choice("dynamic", "programs claim the next task in list order (an atomic ticket)", _claim_order),
))
ASSIGNMENTS = ASSIGNMENT_REGISTRY.names


def wait_walk(tasks: np.ndarray, work: np.ndarray, n: int, assignment: str = "dynamic"
              ) -> tuple[np.ndarray, np.ndarray]:
    """The event walk of a task list in time (computed, not measured): task i goes to its program (``dynamic``:
    the program free first, in list order, ties to the lowest, as the kernel's atomic ticket; ``static``: program
    i % n) when that program is free; a Linear-1 tile then takes ``work[i]``; a Linear-2 tile spins until the last
    Linear-1 tile of its row block has ended, then takes ``work[i]``. Every producer precedes its consumers in the
    list (``check_tasks``), so one pass in list order places every claim. Returns (program of each task int64 [n_tasks],
    spin of each task float64 [n_tasks], 0 for Linear-1 tiles and for consumers whose producers had ended)."""
    tasks = np.asarray(tasks)
    dyn = ASSIGNMENT_REGISTRY.check(assignment).name == "dynamic"
    free = [(0.0, p) for p in range(n)]
    heapq.heapify(free)
    at = np.zeros(n)                             # static: each program's free time
    done: dict[int, float] = {}                  # pool block -> end of its latest Linear-1 tile so far
    prog = np.empty(len(tasks), dtype=np.int64)
    spin = np.zeros(len(tasks))
    for i, (kind, pool, w) in enumerate(zip(tasks[:, 0].tolist(), tasks[:, 4].tolist(), np.asarray(work).tolist())):
        if dyn:
            t, p = heapq.heappop(free)
        else:
            p = i % n
            t = float(at[p])
        if kind == KIND_L1:
            end = t + w
            done[pool] = max(done.get(pool, 0.0), end)
        else:
            s_ = max(0.0, done.get(pool, 0.0) - t)
            spin[i] = s_
            end = t + s_ + w
        prog[i] = p
        if dyn:
            heapq.heappush(free, (end, p))
        else:
            at[p] = end
    return prog, spin


def claim_walk(tasks: np.ndarray, t1: float, t2: float, n: int) -> tuple[float, float]:
    """An event model of the dynamic assignment (computed, not measured; ``wait_walk`` with every Linear-1 tile
    ``t1`` and every Linear-2 tile ``t2``): ``n`` programs claim the tasks of the list in order as each becomes
    free (the kernel's atomic ticket); a Linear-2 tile, claimed at t, spins until the last Linear-1 tile of its row
    block has ended. Returns (makespan, share of Linear-2 tiles that spun). Unlike the positional wait term, it
    places each claim in time, so short Linear-2 tiles between a producer and its consumer bring the consumer's
    claim forward (scripts/megamoe_wait_model.py); ``predict_kernel_ns`` uses it with wait model ``time``."""
    tasks = np.asarray(tasks).reshape(-1, TASK_FIELDS)
    is2 = tasks[:, 0] == KIND_L2
    work = np.where(is2, float(t2), float(t1))
    prog, spin = wait_walk(tasks, work, n, "dynamic")
    load = np.bincount(prog, weights=work + spin, minlength=n)
    return float(load.max()) if len(tasks) else 0.0, float((spin[is2] > 0).mean()) if is2.any() else 0.0


def _wait_positions(tasks: np.ndarray, c: np.ndarray, c1: float, n: int, assignment: str, n_pool: int):
    """Wait model ``positions``: a consumer d < n list positions behind its last producer spins c1 (1 - d / n)
    (a round of n positions lasting one Linear-1 tile); programs by ``assignment`` over work + spin."""
    is2 = tasks[:, 0] == KIND_L2
    pos = np.arange(len(tasks))
    last_l1 = np.full(max(n_pool, 1), -1)
    np.maximum.at(last_l1, tasks[~is2, 4], pos[~is2])
    spin = np.where(is2, c1 * np.clip(1.0 - (pos - last_l1[tasks[:, 4]]) / n, 0.0, 1.0), 0.0)
    return ASSIGNMENT_REGISTRY.check(assignment).impl(c + spin, n), spin


def _wait_time(tasks: np.ndarray, c: np.ndarray, c1: float, n: int, assignment: str, n_pool: int):
    """Wait model ``time``: the event walk (``wait_walk``): each consumer spins until its producers have ended
    in time, under the assignment's claims."""
    return wait_walk(tasks, c, n, assignment)


# How predict_kernel_ns counts a Linear-2 tile's spin on its row block's Linear-1 tiles. impl(tasks, compute per
# task, c1, n, assignment, n_pool) -> (program of each task, spin of each task).
WAIT_MODELS = Registry("wait model", (
    Choice("positions", "a consumer d < n list positions behind its producer spins c1 (1 - d / n)", _wait_positions),
    Choice("time", "the event walk: claims placed in time, a consumer spins until its producers end", _wait_time),
))
# The wait model a CostModel without one uses, per assignment: under dynamic claims ``time`` (the event walk; the
# positional term prices a half-round lag at 5 % of compute where the kernel pays 12 %, docs/findings.md); a record's
# sidecar names its own as params.wait_default (:func:`record_wait`); one that names none predicted ``positions``.
WAIT_DEFAULT = {"static": "positions", "dynamic": "time"}
WAIT_UNNAMED = "positions"     # the wait model of every record whose sidecar names none


def record_wait(meta: dict) -> str:
    """The wait model a recorded MegaMoE sweep or study predicted and chose with: its sidecar's
    params.wait_default for its assignment, else (a sidecar that names none) ``positions``."""
    p = meta.get("params", {}) if meta else {}
    wd = p.get("wait_default")
    return WAIT_MODELS.check(wd[p.get("assignment", "static")] if wd else WAIT_UNNAMED).name


def wait_model_of(cost: "CostModel") -> str:
    """The wait model ``cost`` predicts with (its own, else WAIT_DEFAULT of its assignment)."""
    ASSIGNMENT_REGISTRY.check(cost.assignment)
    return WAIT_MODELS.check(cost.wait or WAIT_DEFAULT[cost.assignment]).name


def _stall_issuers(B: float, b: int, m: int, q: float, prm_k: BurstGapParams) -> tuple[float, float]:
    """Stall model ``issuers``: the b issuing programs issue and stall T (``issue_time``, the stage draining
    throughout T); the round is charged b T / m. Returns (stall charged, stage bytes after)."""
    T, q_end = issue_time(B / b, b, q, prm_k)
    return b * float(T) / m, float(q_end)


def _stall_round(B: float, b: int, m: int, q: float, prm_k: BurstGapParams) -> tuple[float, float]:
    """Stall model ``round_shared``'s charge: as ``issuers``, but the stage drains only during time the kernel is charged: the
    round cannot end before the bytes that do not fit in the stage (q + B - C_b) have drained at D, so the charge
    is max(b T / m, (q + B - C_b) / D), and the stage after it q + B - D x charge, within [0, C_b]. Where every
    program of the round issues (b = m) the two models agree; in a mixed round ``issuers`` credits the link with
    the drain of the issuers' whole T while charging b T / m, and can predict a kernel faster than its bytes / D."""
    s_, _ = _stall_issuers(B, b, m, q, prm_k)
    C, D = prm_k.capacity_bytes, prm_k.drain_gbps
    s = max(s_, (q + B - C) / D)
    return s, float(min(max(q + B - D * s, 0.0), C))



# How predict_kernel_ns charges a round's remote stores. impl(bytes B, issuers b, programs m, stage bytes q after
# the round's compute, the fluid parameters of b issuers) -> (stall charged to the round, stage bytes after).
STALL_MODELS = Registry("stall model", (
    Choice("issuers", "the issuers' stall T spread over the round (b T / m); the stage drains for all of T",
           _stall_issuers),
    Choice("round_shared", "the round lasts until the bytes beyond the stage have drained (the stage drains only "
                           "in charged time), with only the stage's shared part phi C_0 for every round (a stage "
                           "model's base_capacity_kib; the programs' own slots not the combine's)", _stall_round),
))
# Stall models that see only the shared part of a StageParams stage (phi C_0) instead of phi C(b).
STALL_SHARED = ("round_shared",)


def stall_stage(prm: "BurstGapParams | StageParams", b: int, stall: str) -> BurstGapParams:
    """The fluid parameters a round of ``b`` issuing programs sees under stall model ``stall``: a stage model's
    ``fluid(b)`` (phi C(b)), or for STALL_SHARED its shared part phi C_0 (a stage without one is an error); fluid
    parameters as they are, without the harness's overhead."""
    name = STALL_MODELS.check(stall).name
    if not isinstance(prm, StageParams):
        return replace(prm, overhead_ns=0.0)
    f = prm.fluid(b)
    if name in STALL_SHARED:
        if prm.base_capacity_kib <= 0:
            raise ValueError(f"stall model {stall!r} needs a stage with a shared part (base_capacity_kib > 0)")
        f = replace(f, capacity_kib=prm.base_capacity_kib * prm.stalled_fraction)
    return f
# The stall model a CostModel without one uses: ``round_shared`` (within 10 % on 503 of the one-H200 host-link
# record's 504 speedups, docs/findings.md); ``issuers`` is the model of every record whose sidecar names none (the
# 2x H200 record's: a sidecar names its own as params.stall_default, :func:`record_stall`).
STALL_DEFAULT = "round_shared"
STALL_UNNAMED = "issuers"      # the stall model of every record whose sidecar names none


def record_stall(meta: dict) -> str:
    """The stall model a recorded MegaMoE sweep predicted and chose with: its sidecar's params.stall_default,
    else (a sidecar that names none) ``issuers``."""
    p = meta.get("params", {}) if meta else {}
    return STALL_MODELS.check(p.get("stall_default") or STALL_UNNAMED).name


def stall_model_of(cost: "CostModel") -> str:
    """The stall model ``cost`` predicts with (its own, else STALL_DEFAULT)."""
    return STALL_MODELS.check(cost.stall or STALL_DEFAULT).name


def predict_kernel_ns(tl_: "TaskList", remote_rows_per_block: np.ndarray, cost: CostModel,
                      hidden: int, inter: int, tiles: "TileConfig") -> dict:
    """The module docstring's formula: {'total_ns', 'compute_ns', 'wait_ns', 'stall_ns', 'drain_ns', 'rounds',
    'imbalance'}. Compute and waits are the busiest program's (``cost.assignment``: static round-robin, task i on
    program i % n, or dynamic, each task to the program free first; ``imbalance`` = its load / the mean load);
    stalls and the final drain come from the Burst-Gap stage, round by round."""
    waits = WAIT_MODELS.check(wait_model_of(cost)).impl
    stall_name = stall_model_of(cost)
    stalls = STALL_MODELS.check(stall_name).impl
    stage = isinstance(cost.prm, StageParams)   # the per-link stage model: C(P) of the round's issuers
    prm = cost.prm.fluid(cost.n_programs) if stage else replace(cost.prm, overhead_ns=0.0)  # overhead: the harness's
    n = max(1, cost.n_programs)
    F = cost.flop_per_ns_per_program
    c1 = 2.0 * tiles.block_m * hidden * 2 * tiles.block_n1 / F
    c2 = 2.0 * tiles.block_m * inter * tiles.block_n2 / F
    tasks = tl_.tasks
    is2 = tasks[:, 0] == KIND_L2
    # a consumer whose producers have not ended spins (the wait model: list positions, or the claims in time)
    prog, wait = waits(tasks, np.where(is2, c2, c1), c1, n, cost.assignment, tl_.grid.n_pool)
    work = np.where(is2, c2, c1) + wait
    remote = np.where(is2, remote_rows_per_block[tasks[:, 4]] * float(tiles.block_n2 * cost.out_bytes), 0.0)
    # Program p walks tasks p, p + n, ... (a static round-robin): the kernel lasts as long as its busiest program,
    # so a list whose expensive tiles land on the same programs is slower than its round averages say.
    load = np.bincount(prog, weights=work, minlength=n)
    busiest = int(np.argmax(load))
    compute = float(np.bincount(prog, weights=work - wait, minlength=n)[busiest])
    waited = float(np.bincount(prog, weights=wait, minlength=n)[busiest])
    imbalance = float(load.max() / load.mean()) if load.mean() > 0 else 1.0
    q = 0.0
    stall = 0.0
    n_rounds = -(-len(tasks) // n)
    for k in range(n_rounds):
        sl = slice(k * n, (k + 1) * n)
        m = len(work[sl])                                 # programs busy in this round (n but in the last)
        c_k = float(work[sl].sum()) / m
        b = int(is2[sl].sum())
        B = float(remote[sl].sum())
        q = float(recover(q, c_k, prm))                  # the stage drains during the round's compute
        if B > 0:
            prm_k = stall_stage(cost.prm, b, stall_name)  # the stage the b issuing programs see
            s_k, q = stalls(B, b, m, q, prm_k)           # issuers: b programs issue (and stall) T, the others
            stall += s_k                                  # compute (round_shared: the link drains in charged time)
    drain = float(drain_time(q, prm))
    return dict(total_ns=compute + waited + stall + drain, compute_ns=compute, wait_ns=waited, stall_ns=stall,
                drain_ns=drain, rounds=n_rounds, imbalance=imbalance)


def calibrate_rate(tl_: "TaskList", hidden: int, inter: int, tiles: "TileConfig", n_programs: int,
                   compute_ms: float, assignment: str = "static", wait: str | None = None) -> float:
    """Per-program FLOP/ns such that the model's compute-only time of ``tl_`` equals ``compute_ms`` (the kernel
    measured with every combine store local, tasks assigned by ``assignment``; ``wait``: the wait model, None =
    WAIT_DEFAULT's). Every term of the compute-only time scales with 1 / rate, so one unit-rate walk suffices."""
    unit = CostModel(BurstGapParams.reference(), 1.0, n_programs, assignment=assignment, wait=wait)
    none = np.zeros(max(tl_.grid.n_pool, 1), dtype=np.int64)
    return predict_kernel_ns(tl_, none, unit, hidden, inter, tiles)["total_ns"] / (compute_ms * 1e6)
