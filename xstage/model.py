"""The Burst-Gap model of X-Stage: what a remote-store burst costs the sender, and when backpressure begins.

A persistent kernel's programs issue remote stores in bursts with compute gaps between them. Issued stores
enter a post-issue stage (X-Stage) and drain to the peer; the stage holds a finite number of outstanding
bytes. Three parameters describe it (all GPU-wide, for one destination link):

  issue_ns_per_kib  backpressure-free issue time: ns for one program to issue 1 KiB when nothing stalls it
                    (P programs together issue at I = P * 1024 / issue_ns_per_kib bytes/ns)
  drain_gbps        effective drain rate D (GB/s = bytes/ns) out of the stage
  capacity_kib      outstanding capacity C (KiB) of the stage

plus the benchmark's own fixed per-burst cost ``overhead_ns`` (CTA barrier + timer reads), fitted along as a
nuisance parameter. Fluid dynamics of the outstanding bytes q:

  issue, I > D:  q grows at I - D until it reaches C; after that the issuers are held to D (backpressure)
  issue, I <= D: no backpressure (q stays empty)
  gap:           q drains at D:  q <- max(0, q - D * gap)

so a burst of B = P * b bytes issued with q0 outstanding costs

  T = o + B / I                                      if B <= I * (C - q0) / (I - D)      (absorbed)
  T = o + t_fill + (B - I * t_fill) / D,  t_fill = (C - q0) / (I - D)                 (backpressured)

and leaves q_end outstanding; a fence after it waits q_end / D more (the drain side). A burst below capacity
costs only its issue time; a long gap recovers fully; sustained injection converges to the drain rate.

Also here: an event simulation of the outstanding-store queue (FIFO, finite capacity, program groups with
start skew) for ``source="simulated"``, and the byte counts that everything else uses.

Legend: P = issuing programs, b = bytes per program per burst, B = P * b, g = gap (ns), n = bursts per train.
"""
from __future__ import annotations

import heapq
from collections import deque
from dataclasses import asdict, dataclass, fields

import numpy as np
import pandas as pd

KIB = 1024


@dataclass(frozen=True)
class BurstGapParams:
    issue_ns_per_kib: float      # backpressure-free issue time per KiB per program (ns)
    drain_gbps: float            # effective drain rate D (GB/s == bytes/ns)
    capacity_kib: float          # outstanding capacity C (KiB, GPU-wide)
    overhead_ns: float = 0.0     # the benchmark's fixed per-burst cost (barrier + timer reads)

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if not np.isfinite(v) or v < 0 or (f.name != "overhead_ns" and v == 0):
                raise ValueError(f"{f.name} must be positive and finite, got {v}")

    @classmethod
    def reference(cls) -> "BurstGapParams":
        """Illustrative values (of the order an NVLink-4 H200 pair shows) for the simulated source."""
        return cls(issue_ns_per_kib=20.0, drain_gbps=370.0, capacity_kib=2048.0, overhead_ns=60.0)

    def issue_rate(self, programs) -> np.ndarray:
        """Aggregate backpressure-free issue rate I (bytes/ns) of ``programs`` programs."""
        return np.asarray(programs, dtype=np.float64) * KIB / self.issue_ns_per_kib

    @property
    def capacity_bytes(self) -> float:
        return self.capacity_kib * KIB

    def as_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------------------------------- byte counts
def burst_bytes_total(programs, burst_bytes) -> np.ndarray:
    """B = P * b: bytes one burst of all programs puts into the stage."""
    return np.asarray(programs, dtype=np.float64) * np.asarray(burst_bytes, dtype=np.float64)


def train_bytes(programs, burst_bytes, n_bursts) -> np.ndarray:
    return burst_bytes_total(programs, burst_bytes) * n_bursts


# ----------------------------------------------------------------------------------------- fluid model
def issue_time(burst_bytes, programs, outstanding, prm: BurstGapParams):
    """Issue time (ns) of one burst and the outstanding bytes it leaves. Vectorized over all arguments.

    ``burst_bytes`` is per program (b); ``outstanding`` is q0 (bytes) when the burst starts issuing.
    """
    B = burst_bytes_total(programs, burst_bytes)
    I = prm.issue_rate(programs)
    D, C = prm.drain_gbps, prm.capacity_bytes
    q0 = np.minimum(np.asarray(outstanding, dtype=np.float64), C)
    q0 = np.maximum(q0, 0.0)
    o = prm.overhead_ns
    q0 = np.maximum(q0 - D * o, 0.0)                     # the stage drains during the fixed overhead
    grows = I > D
    with np.errstate(divide="ignore", invalid="ignore"):
        t_fill = np.where(grows, (C - q0) / (I - D), np.inf)
    absorbed = B <= I * t_fill
    t_abs = B / I
    t_bp = t_fill + (B - I * np.where(np.isfinite(t_fill), t_fill, 0.0)) / D
    T = o + np.where(absorbed, t_abs, t_bp)
    q_end = np.where(absorbed, np.where(grows, q0 + (I - D) * t_abs, np.maximum(q0 - (D - I) * t_abs, 0.0)), C)
    return T, q_end


def recover(outstanding, gap_ns, prm: BurstGapParams):
    """Outstanding bytes after a gap of ``gap_ns`` with no new stores."""
    return np.maximum(np.asarray(outstanding, dtype=np.float64) - prm.drain_gbps * np.asarray(gap_ns), 0.0)


def drain_time(outstanding, prm: BurstGapParams):
    """Time (ns) for a fence after a burst: until the stage is empty (latency not included)."""
    return np.asarray(outstanding, dtype=np.float64) / prm.drain_gbps


def train(burst_bytes, programs, gap_ns, n_bursts: int, prm: BurstGapParams, drain: bool = False):
    """Per-burst issue times of a train of ``n_bursts`` bursts separated by gaps; vectorized over configs.

    Returns (issue_ns[..., n_bursts], outstanding_after_issue[..., n_bursts]). With ``drain`` every burst is
    followed by a fence, so the next one starts with an empty stage.
    """
    b, p, g = np.broadcast_arrays(np.asarray(burst_bytes, np.float64), np.asarray(programs, np.float64),
                                  np.asarray(gap_ns, np.float64))
    q = np.zeros(b.shape)
    T_all, q_all = [], []
    for _ in range(n_bursts):
        T, q_end = issue_time(b, p, q, prm)
        T_all.append(T)
        q_all.append(q_end)
        q = np.zeros(b.shape) if drain else recover(q_end, g, prm)
    return np.stack(T_all, axis=-1), np.stack(q_all, axis=-1)


def onset_burst_bytes(programs, prm: BurstGapParams):
    """Per-program burst size at which a burst issued into an empty stage starts to stall (inf if never):
    b* = C * I / (I - D) / P."""
    I = prm.issue_rate(programs)
    D = prm.drain_gbps
    with np.errstate(divide="ignore"):
        return np.where(I > D, prm.capacity_bytes * I / (I - D) / np.asarray(programs, np.float64), np.inf)


def steady_slowdown(burst_bytes, programs, gap_ns, prm: BurstGapParams, n_bursts: int = 64):
    """Issue time of the n-th burst of a long train over its backpressure-free issue time (1 = no stall)."""
    T, _ = train(burst_bytes, programs, gap_ns, n_bursts, prm)
    free = prm.overhead_ns + np.asarray(burst_bytes, np.float64) * prm.issue_ns_per_kib / KIB
    return T[..., -1] / free


def sustained_rate(burst_bytes, programs, prm: BurstGapParams, n_bursts: int = 64):
    """Aggregate bytes/ns over the last burst of a gapless train, its fixed overhead included (the stage
    drains during it too); converges to the drain rate when I > D."""
    T, _ = train(burst_bytes, programs, 0.0, n_bursts, prm)
    return burst_bytes_total(programs, burst_bytes) / T[..., -1]


# ------------------------------------------------------------------------------------ event simulation
def simulate_train(burst_bytes: int, programs: int, gap_ns: float, n_bursts: int, prm: BurstGapParams,
                   groups: int = 8, chunks: int | None = None, skew_ns: float = 0.0, rng=None,
                   sync: bool = False) -> np.ndarray:
    """Event simulation of the outstanding-store queue; per-burst issue times [groups, n_bursts]."""
    start, end = simulate_train_times(burst_bytes, programs, gap_ns, n_bursts, prm, groups, chunks, skew_ns, rng,
                                      sync)
    return end - start


def simulate_train_times(burst_bytes: int, programs: int, gap_ns: float, n_bursts: int, prm: BurstGapParams,
                         groups: int = 8, chunks: int | None = None, skew_ns: float = 0.0, rng=None,
                         sync: bool = False):
    """Event simulation of the outstanding-store queue; (start, end) of every group's bursts [groups, n].

    The P programs are simulated as ``min(groups, P)`` groups (each issuing for P/groups programs, with a
    random start offset up to ``skew_ns``), each burst in ``chunks`` chunks. A chunk enters the stage when it
    is issued if the stage has room (else the group waits until enough earlier chunks have drained); the
    stage is a FIFO that drains at D. ``chunks=None``: 8, or more so that a chunk is at most C/4.
    ``sync``: the benchmark's grid barrier: burst k + 1 starts for every group ``gap_ns`` after the LAST group
    finished burst k (the fluid model's assumption; without it, groups that finish early start early).
    """
    rng = rng or np.random.default_rng(0)
    G = int(min(groups, programs))
    per_group = programs / G
    if chunks is None:
        chunks = max(8, int(np.ceil(4 * burst_bytes * per_group / prm.capacity_bytes)))
    c = burst_bytes * per_group / chunks                  # bytes per chunk
    t_chunk = c * prm.issue_ns_per_kib / KIB / per_group  # a group issues per_group programs' worth at once
    D, C = prm.drain_gbps, prm.capacity_bytes
    if c > C:
        raise ValueError(f"chunk ({c:.0f} B) larger than the capacity ({C:.0f} B): raise `chunks`")
    stage: deque = deque()      # (depart_time, bytes) in FIFO order
    held = 0.0
    last_depart = 0.0
    start = np.full((G, n_bursts), np.nan)
    end = np.full((G, n_bursts), np.nan)
    # (time, since: when this chunk first asked (FIFO among waiters, so groups share the drain fairly), g, k, j)
    heap = [(t0, t0, g, 0, 0) for g, t0 in enumerate(rng.uniform(0, skew_ns, G) if skew_ns else np.zeros(G))]
    heapq.heapify(heap)
    while heap:
        t, since, g, k, j = heapq.heappop(heap)
        if j == 0 and np.isnan(start[g, k]):
            start[g, k] = t
            t += prm.overhead_ns
        while stage and stage[0][0] <= t:
            held -= stage.popleft()[1]
        if held + c > C * (1 + 1e-12):
            need, t_free = held + c - C, t
            for dep, nb in stage:
                need -= nb
                t_free = dep
                if need <= 0:
                    break
            heapq.heappush(heap, (t_free, since, g, k, j))
            continue
        t_done = t + t_chunk
        last_depart = max(t_done, last_depart) + c / D
        stage.append((last_depart, c))
        held += c
        if j + 1 < chunks:
            heapq.heappush(heap, (t_done, t_done, g, k, j + 1))
        else:
            end[g, k] = t_done
            if k + 1 < n_bursts and not sync:
                heapq.heappush(heap, (t_done + gap_ns, t_done + gap_ns, g, k + 1, 0))
            elif k + 1 < n_bursts and np.isfinite(end[:, k]).all():   # the last group through the barrier
                t_next = end[:, k].max() + gap_ns
                for gg in range(G):
                    heapq.heappush(heap, (t_next, t_next, gg, k + 1, 0))
    return start, end


def simulate_sweep(grid, prm: BurstGapParams, sm_count: int = 132, seed: int = 0, noise: float = 0.03,
                   skew_ns: float = 200.0, engine: str = "auto") -> pd.DataFrame:
    """Rows in the recorded burst-gap schema, from the model plus lognormal timing noise.

    engine: ``fluid`` (:func:`train`, the model :func:`xstage.fit.fit_burst_gap` fits: a self-test of the fit,
    whose intervals must then cover ``prm``), ``event`` (:func:`simulate_train_times`: chunks, groups, a FIFO
    stage; an independent discretisation that agrees with the fluid model to ~1 % and has start skew), or
    ``auto``: fluid for the synchronised points, event for free-running ones (the fluid model has no drift).
    """
    from .data import BURST_GAP

    if engine not in ("auto", "fluid", "event"):
        raise ValueError(f"engine must be 'auto', 'fluid' or 'event', got {engine!r}")
    rng = np.random.default_rng(seed)
    out = []
    for p in grid.points(sm_count):
        if p.drain:
            raise ValueError("the simulated source models issue times only (drain=False)")
        tgt = prm if p.target == "remote" else BurstGapParams(prm.issue_ns_per_kib, 10 * prm.drain_gbps,
                                                              prm.capacity_kib, prm.overhead_ns)
        fluid = engine == "fluid" or (engine == "auto" and p.sync)
        if fluid and not p.sync:
            raise ValueError("the fluid engine models the synchronised benchmark only (sync=True)")
        for rep in range(grid.repeats):
            if fluid:
                T0 = train(p.burst_bytes, p.programs, p.gap_ns, p.n_bursts, tgt)[0]
                start = np.zeros((1, p.n_bursts))
                T0_span = T0
            else:
                start, end = simulate_train_times(p.burst_bytes, p.programs, p.gap_ns, p.n_bursts, tgt,
                                                  skew_ns=skew_ns, rng=rng, sync=p.sync)
                T0 = np.median(end - start, axis=0)
                T0_span = end.max(axis=0) - start.min(axis=0)
            noise_k = rng.lognormal(0.0, noise, size=p.n_bursts)
            T, span = T0 * noise_k, T0_span * noise_k
            row = {**asdict(p), "rank": 0, "repeat": rep, "burst": np.arange(p.n_bursts), "issue_ns": T,
                   "issue_ns_max": T, "issue_ns_min": T, "span_ns": span, "drain_ns": 0.0,
                   "drain_ns_max": 0.0, "gap_meas_ns": float(p.gap_ns), "barrier_ns": 0.0,
                   "idle_ns": float(p.gap_ns), "start_skew_ns": float(np.ptp(start[:, 0]))}
            out.append(pd.DataFrame(row))
    return pd.concat(out, ignore_index=True)[list(BURST_GAP.columns)]


# ============================================================================ per-program stage model (rung shares)
# The fluid model above treats the grid as one issuer. Fused kernels never synchronise their bursts: each
# program runs its own train, programs drift apart, and later bursts stop contending. The stage model follows
# every program (in G weight groups) through its train:
#
#   issue     a program issues at r = 1024 / issue_ns_per_kib bytes/ns while the stage has room
#   stage     one finite stage per link, capacity C(P) = C_0 + 1 / (1 / (c_p * min(P, S)) + 1 / C_max): a part
#             present whatever the grid (C_0; host link: 4 programs already absorb >= 1 MB) and a part that
#             grows with the programs that feed it (per-SM store slots, c_p each, S = SMs) up to C_max
#             (measured: the bytes a grid absorbs grow with P but not in proportion)
#   drain     at D bytes/ns; while the stage is full the issuers together get D, shared by arbitration:
#             program weights w uniform on [1 - spread, 1] (water-filled: nobody above r). spread = 0 is equal
#             shares, under which programs that start together stay together; spread > 0 lets the favoured
#             programs finish first, which is the drift measured in free-running trains (a contended burst's
#             fastest program finishes at ~0.35-0.55 of the slowest). Other laws fitted no better on the host
#             link's held-out trains (w = exp(-k u): 26 %; 1 - spread * u^a, a fitted: 21 %; uniform: 18 %).
#   slots     (arbitration="slots", the full model) C(P) - C_0 is not one pool but every program's own store
#             slots, a_i = (C(P) - C_0) w_i / sum(w) (weighted as the drain), and only C_0 is shared: a program
#             below its slots, or with room in the shared part, issues at r; its stores drain at its weight's
#             share of D among the programs holding stores (one FIFO drain's steady state); while the shared
#             part is full, the programs beyond their slots share what leaves it, and a program at its slots
#             keeps them full. Measured on the host link (first bursts into an empty stage, data/h200x1
#             burst_train): past the onset most programs finish unimpeded while a tail waits 20-40x longer
#             (P = 264 x 18 KiB: median 0.8 us, p90 8 us, max 16 us), which one pool shared by weight cannot
#             give (there every program waits once the pool is full); arbitration="pool" is rung pool.
#   overhead  o ns per burst inside the measured issue time (CTA barrier + timer reads); the stage drains then
#   stall     once the stage (slots: its shared part) has filled, it holds only phi * C(P) until it has emptied again: the issuers wait
#             until it drained to there. Measured on both links: a burst into an empty stage absorbs C (e.g. 2.2 MB
#             in 0.4-0.5 us at P = 132), but sustained bursts settle on B / D minus a much smaller intercept
#             (0.5-1 MB): the first stall costs (1 - phi) C / D once per busy period.
#
#   barrier   (the synchronised sweep's harness, not the link) the grid barrier's arrival is a release, which
#             returns once the program's stores are performed: the barrier waits until the stage has drained,
#             so every synchronised burst starts with an empty stage whatever the gap. Measured: its time is
#             the stage's content / D (40 us for 2.16 MB on the host link, 6.5 us on NVLink), and the same grid
#             with a relaxed arrival slows the later bursts (data/h200x1/barrier_{release,relaxed}/).
#
# A train is given per burst: bytes per program b_k and the compute gap g_k that FOLLOWS burst k (g_{n-1} is
# unused). ``sync=True`` adds the synchronised sweep's grid barrier: every program starts burst k + 1 together,
# g_k after the last one finished burst k and the stage drained (``barrier_drains``); the measured quantity is
# then the grid's span per burst.
# Rung fluid of the ladder is the paper's fluid model (c_p -> inf, spread = 0, sync); capacity_p adds C(P) (spread 0).

ARBITRATIONS = ("pool", "slots", "gpc_drain")
STAGE_GROUPS = 8             # weight groups a grid is simulated as (min(P, 8)); each holds P / G programs
GPC_DRAIN_GROUPS = 128       # arbitration "gpc_drain": groups per grid, 16 per occupied GPC at most (one per program up
                             # to 16 programs in a GPC: P = 66 and 132 one group per program but GPCs 6-7's 18 at 132);
                             # 32 / 64 groups gave all trains 15.8 / 13.7 % against 13.0 with 128 (the stage fit's
                             # parameters; lab notes)
N_GPC = 8                    # GPCs of the measured map (GPC_OF_SM)
MAX_STAGE_WORK = 50_000_000  # bound on configurations x groups x bursts one call may simulate
NO_LIMIT_KIB = 1e12          # "no per-program limit": C(P) = C_max (rung fluid)


@dataclass(frozen=True)
class StageParams:
    """Parameters of one link's stage model (see the section comment above)."""

    issue_ns_per_kib: float          # ns for one program to issue 1 KiB unimpeded
    drain_gbps: float                # D (GB/s == bytes/ns)
    capacity_kib: float              # C_max: GPU-wide limit of the stage (KiB)
    capacity_per_program_kib: float  # c_p: stage bytes each issuing program (up to one per SM) adds (KiB)
    spread: float                    # arbitration: weights uniform on [1 - spread, 1]; 0 = equal shares
    overhead_ns: float = 0.0         # fixed cost inside each measured issue time
    stalled_fraction: float = 1.0    # phi: the part of C(P) a stage that filled keeps until it empties again
    base_capacity_kib: float = 0.0   # C_0: stage bytes present whatever the programs (KiB)
    sm_count: int = 132              # S: programs beyond one per SM add no stage (not fitted: the GPU's count)
    link: str = ""                   # "nvlink" or "host" (a label)
    arbitration: str = "pool"        # "pool": C(P) is one shared stage, its drain shared by weight once full;
                                     # "slots": C(P) - C_0 is every program's own slots (by weight), C_0 shared;
                                     # "gpc_drain": the drain shared equally per GPC holding stores,
                                     # within it by the spread among its holding programs, each program's own
                                     # slots by the spread's weight alone (as "slots": an SM's slots are the SM's),
                                     # GPC_DRAIN_GROUPS groups (the spread per program)
    free_kib: float = 0.0            # f: the first f KiB of every burst of a program enter the stage at once,
                                     # whatever the stage's state, while the program holds less than its own slots
                                     # + free_cap_kib (beyond its slots they count in the pool, which may go over
                                     # and then waits to drain as after a stall). Measured: a clean
                                     # 2 KiB burst, one 16-byte store per thread of the benchmark's program, issues
                                     # in ~60 ns after a contended lead and at every busy share, where the stage
                                     # models without f wait microseconds. Needs own slots (FENCE_ARBITRATIONS)
    free_cap_kib: float = 0.0        # F >= f: how far beyond its own slots a program's free entries may take it (a
                                     # bound, so that a train of small bursts cannot issue faster than the drain:
                                     # eleven 2 KiB probes issue freely after a contended lead, F >= 22 KiB)

    def __post_init__(self):
        for name in ("issue_ns_per_kib", "drain_gbps", "capacity_kib", "capacity_per_program_kib"):
            v = getattr(self, name)
            if not (np.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be positive and finite, got {v}")
        if not (np.isfinite(self.overhead_ns) and self.overhead_ns >= 0):
            raise ValueError(f"overhead_ns must be >= 0 and finite, got {self.overhead_ns}")
        if not (0 <= self.spread < 1):
            raise ValueError(f"spread must be in [0, 1), got {self.spread}")
        if not (np.isfinite(self.base_capacity_kib) and self.base_capacity_kib >= 0):
            raise ValueError(f"base_capacity_kib must be >= 0 and finite, got {self.base_capacity_kib}")
        if not (0 < self.stalled_fraction <= 1):
            raise ValueError(f"stalled_fraction must be in (0, 1], got {self.stalled_fraction}")
        if int(self.sm_count) != self.sm_count or self.sm_count < 1:
            raise ValueError(f"sm_count must be a positive integer, got {self.sm_count}")
        if self.arbitration == "gpc_drain" and int(self.sm_count) != len(GPC_OF_SM):
            raise ValueError(f"arbitration '{self.arbitration}' needs the measured GPC map, which is of a {len(GPC_OF_SM)}-SM "
                             f"chip (H200); sm_count is {self.sm_count}")
        if self.arbitration not in ARBITRATIONS:
            raise ValueError(f"arbitration must be one of {', '.join(ARBITRATIONS)}, got {self.arbitration!r}")
        if not (np.isfinite(self.free_kib) and self.free_kib >= 0):
            raise ValueError(f"free_kib must be >= 0 and finite, got {self.free_kib}")
        if not (np.isfinite(self.free_cap_kib) and self.free_cap_kib >= self.free_kib):
            raise ValueError(f"free_cap_kib must be finite and >= free_kib ({self.free_kib}), got {self.free_cap_kib}")
        if self.free_kib != 0 and self.arbitration not in FENCE_ARBITRATIONS:
            raise ValueError(f"free_kib {self.free_kib} needs every program's own stores: arbitration one of "
                             f"{', '.join(FENCE_ARBITRATIONS)}, got {self.arbitration!r}")

    def capacity_bytes(self, programs) -> np.ndarray:
        """C(P) in bytes."""
        p = np.minimum(np.asarray(programs, np.float64), self.sm_count)
        return KIB * (self.base_capacity_kib + 1.0 / (1.0 / (self.capacity_per_program_kib * p)
                                                       + 1.0 / self.capacity_kib))

    @property
    def program_rate(self) -> float:
        """r: bytes/ns one program issues unimpeded."""
        return KIB / self.issue_ns_per_kib

    def as_dict(self) -> dict:
        return asdict(self)

    def fluid(self, programs: int) -> BurstGapParams:
        """The fluid-rung parameters of a burst issued by ``programs`` programs at once: the stage's C(P)
        and D, the stall folded into the capacity a sustained burst sees (phi C), no harness overhead. What
        round-level cost models (xstage.moe_plan.predict_kernel_ns) use."""
        cap = float(self.capacity_bytes(max(int(programs), 1))) / KIB * self.stalled_fraction
        return BurstGapParams(self.issue_ns_per_kib, self.drain_gbps, cap, 0.0)

    @classmethod
    def from_fluid(cls, prm: BurstGapParams, sm_count: int = 132, link: str = "") -> "StageParams":
        """Rung fluid: the paper's three parameters as a stage model (constant capacity, equal shares)."""
        return cls(prm.issue_ns_per_kib, prm.drain_gbps, prm.capacity_kib, NO_LIMIT_KIB, 0.0, prm.overhead_ns,
                   sm_count=sm_count, link=link)


def _water_fill(w, m, total, cap):
    """Per-program rates s[N, G] with sum_g m * s = total[N] (where the issuers can take it), s <= cap, shares
    proportional to w among those below the cap. w = 0 marks groups that do not take part."""
    s = np.zeros_like(w)
    free = w > 0
    left = total.copy()
    for _ in range(w.shape[1] + 1):
        mw = np.where(free, m * w, 0.0).sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            s_try = np.where(free, w * (left / mw)[:, None], 0.0)
        over = free & (s_try > cap)
        if not over.any():
            return np.where(free, s_try, s)
        s = np.where(over, cap, s)
        left = left - np.where(over, m * cap, 0.0).sum(axis=1)
        free = free & ~over
    return s


def dispatch_order(sm_count: int = 132) -> np.ndarray:
    """The SM each program of a grid lands on, in program order (one program per SM per pass; a grid larger than
    the SMs wraps around in the same order). Measured on the host link's per-program records (data/h200x1
    burst_program, smid; the same on every chip recorded): programs 0-3 on the even SMs of the last 4 TPCs
    (SMs 124, 126, 128, 130), 4-7 on their odd SMs, then one SM per remaining TPC (the even ones, the order over
    GPCs is the chip's), then the other SM of each of those TPCs. TPC t = SMs 2t and 2t + 1."""
    S = int(sm_count)
    last = min(8, S - S % 2)
    head = list(range(S - last, S, 2)) + list(range(S - last + 1, S, 2))
    rest = S - last
    return np.array(head + list(range(0, rest, 2)) + list(range(1, rest, 2)) + list(range(rest, S - last)), int)


def _gpc_of_tpc(t: int) -> int:
    """The GPC (0-7) of TPC t of an H200, as measured with thread-block clusters (data/h200x1/gpc_map: two chips and
    one process before and after its trains alike; stage_programs_analysis.gpc_map): TPCs 0-31 are GPC t mod 8 in turn, TPCs 32-59
    the seven GPCs but GPC 0 in turn. TPCs 60-65 never run a cluster of 4. TPCs 62-65 (the dispatch head, programs
    0-7) are put in GPC 0: they take GPC 0's share at P = 16-66 (stage_programs_analysis.favour_by_gpc). TPCs 60 and 61 are not
    measured: a GPC has at most 9 TPCs, so GPC 0 (4 + the head's 4) cannot hold them; they are put in GPCs 6 and 7
    (the two that hold none of the 12 TPCs favoured at P = 132 in data/h200x1/train_programs_p; GPCs 1 and 2
    score the same within 0.5 %, and all six in GPC 0 worse: lab notebook)."""
    if t < 32:
        return t % 8
    if t < 60:
        return 1 + (t - 32) % 7
    return {60: 6, 61: 7}.get(t, 0)


GPC_OF_SM = np.array([_gpc_of_tpc(sm // 2) for sm in range(132)], int)   # SM -> GPC id (0-7) of a 132-SM H200


def _gpc_groups(P, spread: float, groups: int, sm_count: int):
    """m, w, ws, gid [N, groups] for arbitration="gpc_drain": every occupied GPC (of the grid placed by dispatch_order
    on GPC_OF_SM) its own weight groups, min(groups // occupied GPCs, its programs) of them, with the spread's
    uniform law within the GPC (ws = 1 - spread (j + 0.5) / k); w = ws / (programs in the GPC), the "gpc" rung's
    static weights; gid: the group's GPC (-1: no group)."""
    N = len(P)
    m = np.zeros((N, groups))
    w = np.zeros((N, groups))
    ws = np.zeros((N, groups))
    gid = np.full((N, groups), -1)
    if int(sm_count) != len(GPC_OF_SM):
        raise ValueError(f"the GPC map is of a {len(GPC_OF_SM)}-SM chip, got sm_count {sm_count}")
    cache: dict[int, tuple] = {}
    for i, p in enumerate(P):
        p = int(p)
        if p not in cache:
            if p < 1:
                raise ValueError(f"programs must be >= 1, got {p!r}")
            n = np.bincount(GPC_OF_SM[dispatch_order(sm_count)[np.arange(p) % sm_count]], minlength=N_GPC)
            occ = np.flatnonzero(n)
            if len(occ) > groups:
                raise ValueError(f"{p} programs occupy {len(occ)} GPCs, more than the {groups} weight groups the "
                                 f"model simulates; pass groups >= {len(occ)}")
            sub = groups // len(occ)
            mm, ww, ss, gg = [], [], [], []
            for c in occ:
                k = min(sub, int(n[c]))
                for j in range(k):
                    mm.append(n[c] / k)
                    ss.append(1.0 - spread * (j + 0.5) / k)
                    ww.append((1.0 / n[c]) * (1.0 - spread * (j + 0.5) / k))
                    gg.append(c)
            cache[p] = tuple(np.array(x) for x in (mm, ww, ss, gg))
        mm, ww, ss, gg = cache[p]
        m[i, :len(mm)], w[i, :len(ww)], ws[i, :len(ss)], gid[i, :len(gg)] = mm, ww, ss, gg
    return m, w, ws, gid


def _gpc_dynamic_weights(ws, m, holding, H):
    """Drain weights [N, G] of arbitration "gpc_drain" now (the general loop of simulate_stage, the reference of
    :func:`_stage_units`): every GPC with a holding group an equal share, split among
    its holding groups' programs by their spread weights ws; 0 for groups not holding. H [N, G, N_GPC]: one-hot
    GPC of each group. Sums to 1 over the holding programs (sum of m * w) of every row with a holding group."""
    x = np.where(holding, m * ws, 0.0)
    S = np.einsum("ng,ngc->nc", x, H)                      # holding programs' spread weight per GPC
    n_hold = (S > 0).sum(axis=1)                           # GPCs that hold stores
    Sg = np.einsum("nc,ngc->ng", S, H)                     # ... of each group's GPC
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(holding & (Sg > 0), ws / Sg / np.maximum(n_hold, 1)[:, None], 0.0)


def gpc_drain_groups(programs: int, sm_count: int = 132) -> int:
    """Weight groups arbitration "gpc_drain" simulates a grid of ``programs`` as: every occupied GPC min(programs
    in it, GPC_DRAIN_GROUPS // occupied GPCs) groups (_gpc_groups with GPC_DRAIN_GROUPS)."""
    P = int(programs)
    if P < 1:
        raise ValueError(f"programs must be >= 1, got {programs!r}")
    n = np.bincount(GPC_OF_SM[dispatch_order(sm_count)[np.arange(P) % sm_count]], minlength=N_GPC)
    return int(np.minimum(n[n > 0], GPC_DRAIN_GROUPS // int((n > 0).sum())).sum())


def _gpc_drain_batched(prm: StageParams, P, b, g, sync, drains, fence=None):
    """simulate_stage for arbitration "gpc_drain" with GPC_DRAIN_GROUPS groups, each set of configurations that use
    the same number of groups (gpc_drain_groups) simulated with only those: the same result (a configuration's
    unused groups take no part) at a fraction of the cost; each batch runs through :func:`_stage_units` (with
    GPC_DRAIN_FAST). Returns start, end [N, GPC_DRAIN_GROUPS, n] and m."""
    N, n = b.shape
    G = GPC_DRAIN_GROUPS
    if N * G * n > MAX_STAGE_WORK:
        raise ValueError(f"{N} configurations x {n} bursts x {G} groups exceed the model's work bound "
                         f"({MAX_STAGE_WORK}); predict fewer at a time")
    need = np.array([gpc_drain_groups(p, prm.sm_count) for p in P.astype(int)], int)
    start = np.full((N, G, n), np.nan)
    end = np.full((N, G, n), np.nan)
    m = np.zeros((N, G))
    for k in np.unique(need):
        idx = np.flatnonzero(need == k)
        s_k, e_k, m_k = simulate_stage(prm, P[idx], b[idx], g[idx], sync[idx], groups=int(k),
                                       barrier_drains=drains[idx], read_fence=None if fence is None else fence[idx])
        start[idx, :k], end[idx, :k], m[idx, :k] = s_k, e_k, m_k
    return start, end, m


GPC_DRAIN_FAST = True   # arbitration "gpc_drain" through _stage_units (False: the general loop of simulate_stage,
                        # kept as the reference the fast path is tested against)


def _sim_state(valid, o: float, n: int):
    """The simulation's starting state for groups ``valid`` [N, G] and ``n`` bursts: phase (0 overhead, 1 issuing,
    2 gap, 3 waiting at the grid barrier (sync), 4 done), burst index k, time left in the phase (the overhead
    ``o``), start / end [N, G, n] (NaN until reached; every valid group starts burst 0 at 0) and the clock t [N]."""
    N, G = valid.shape
    start = np.full((N, G, n), np.nan)
    start[:, :, 0] = np.where(valid, 0.0, np.nan)
    return (np.where(valid, 0, 4), np.zeros((N, G), int), np.where(valid, o, 0.0), start,
            np.full((N, G, n), np.nan), np.zeros(N))


def _drain_units(m, ws, gid):
    """The groups of one grid under "gpc_drain" as units: the groups of GPCs whose groups are alike (the same
    programs per group and spread levels: GPCs of equal population) evolve bitwise alike, so each such set of groups
    is simulated once, ``mult`` times (one per GPC of its class). m, ws, gid [G] (one row of _gpc_groups).
    Returns per unit m (programs of one copy), ws, mult, cls (its class), per class ncopies (GPCs), and gmap [G]:
    the unit of each group (-1: no group)."""
    gmap = np.full(len(m), -1)
    keys: dict = {}
    um, uws, ucls, ncopies = [], [], [], []
    for c in dict.fromkeys(gid[gid >= 0].tolist()):   # GPCs in the order of their groups
        cols = np.flatnonzero(gid == c)
        key = (m[cols].tobytes(), ws[cols].tobytes())
        if key not in keys:
            keys[key] = (len(ncopies), len(um))
            ncopies.append(0)
            um.extend(m[cols])
            uws.extend(ws[cols])
            ucls.extend([len(ncopies) - 1] * len(cols))
        kc, off = keys[key]
        ncopies[kc] += 1
        gmap[cols] = off + np.arange(len(cols))
    mult = np.array([ncopies[c] for c in ucls], np.float64)
    return (np.array(um, np.float64), np.array(uws, np.float64), mult, np.array(ucls, int),
            np.array(ncopies, np.float64), gmap)


def _stage_units(prm: StageParams, P, b, g, sync, drains, m, ws, gid, G, fence=None):
    """simulate_stage's loop for arbitration "gpc_drain" (the slots and drain shares as simulate_stage computes them;
    the same results to rounding), faster: alike groups merged into units (:func:`_drain_units`), rows whose train
    has ended dropped, the transitions applied to the elements whose event is due only, the per-GPC sums by
    bincount. Configurations of equal unit counts are simulated together. m, ws, gid [N, G]: the groups
    (_gpc_groups). Returns start, end [N, G, n]."""
    N, n = b.shape
    start = np.full((N, G, n), np.nan)
    end = np.full((N, G, n), np.nan)
    layouts: dict = {}
    lay = []
    for i in range(N):
        key = (m[i].tobytes(), ws[i].tobytes(), gid[i].tobytes())
        if key not in layouts:
            layouts[key] = _drain_units(m[i], ws[i], gid[i])
        lay.append(layouts[key])
    U = np.array([len(x[0]) for x in lay])
    for u in np.unique(U):
        idx = np.flatnonzero(U == u)
        su, eu = _stage_units_run(prm, P[idx], b[idx], g[idx], sync[idx], drains[idx], [lay[i] for i in idx],
                                  int(u), G, None if fence is None else fence[idx])
        gm = np.stack([lay[i][5] for i in idx])                        # [n_idx, G]
        r = np.arange(len(idx))[:, None]
        ok = (gm >= 0)[:, :, None]
        start[idx] = np.where(ok, su[r, np.maximum(gm, 0)], np.nan)
        end[idx] = np.where(ok, eu[r, np.maximum(gm, 0)], np.nan)
    return start, end


def _stage_units_run(prm: StageParams, P, b, g, sync, drains, lay, U, G, fence=None):
    """The loop of :func:`_stage_units` for configurations of U units each (``fence`` [N, n]: simulate_stage's
    read_fence, phase 5 as there). Returns start, end [N, U, n]."""
    N, n = b.shape
    fence = np.zeros((N, n), bool) if fence is None else np.asarray(fence, bool)
    fenced_any = bool(fence.any())
    m = np.zeros((N, U))
    ws = np.zeros((N, U))
    mult = np.zeros((N, U))
    Kc = max(len(x[4]) for x in lay)
    cls = np.full((N, U), Kc)                      # Kc: no unit (a class of its own, no GPC)
    ncop = np.zeros((N, Kc + 1))
    for i, (um, uws, umult, ucls, unc, _) in enumerate(lay):
        k_ = len(um)
        m[i, :k_], ws[i, :k_], mult[i, :k_], cls[i, :k_] = um, uws, umult, ucls
        ncop[i, :len(unc)] = unc
    valid = m > 0
    M = m * mult                                   # programs a unit stands for
    mws = m * ws
    w = ws                                         # own slots by the spread's weight alone
    r, D, o, phi = prm.program_rate, prm.drain_gbps, prm.overhead_ns, prm.stalled_fraction
    free_b, free_cap = KIB * prm.free_kib, KIB * prm.free_cap_kib
    C = prm.capacity_bytes(P)
    C0 = np.full(N, KIB * prm.base_capacity_kib)
    a = (C - C0)[:, None] * w / np.maximum((M * w).sum(axis=1), 1e-300)[:, None]
    a_lo, a_hi = a * (1 - 1e-9), a * (1 + 1e-9)
    q = np.zeros((N, U))
    Q = np.zeros(N)                                # the pool's content: sum of M (q - a)+ (0 with q = 0)
    stalled = np.zeros(N, bool)
    phase, k, rem, start, end, t = _sim_state(valid, o, n)
    phase = phase.astype(np.int8)
    orig = np.arange(N)                            # the row of start / end each current row writes
    nvalid = valid.sum(axis=1)
    n3 = np.zeros(N, int)                          # units waiting at the grid barrier
    n4 = np.zeros(N, int)                          # units done
    flat_cls = np.arange(N)[:, None] * (Kc + 1) + cls
    eps_t = 1e-9
    any_sync = bool(sync.any())
    startf, endf = start.ravel(), end.ravel()                  # views
    bf, gf = b.ravel(), g.ravel()
    with np.errstate(divide="ignore", invalid="ignore"):
        for _ in range(160 * G * n + 100):
            # transitions whose time is up, on the elements concerned only (as simulate_stage's four passes)
            fi_prev = None
            phf, kf, remf, qf = phase.ravel(), k.ravel(), rem.ravel(), q.ravel()   # flat views (element i * U + j)
            ff = fence.ravel()
            for p_ in range(4):
                if p_ == 0:
                    due = (rem <= eps_t) & (phase < 3)
                    fi = np.flatnonzero((due | ((phase == 5) & (q <= 0))) if fenced_any else due)
                else:
                    fi = fi_prev[(remf[fi_prev] <= eps_t) & (phf[fi_prev] < 3)]
                if any_sync:
                    cand = sync & (n3 == nvalid) & (n3 > 0)
                    if cand.any():
                        rc = np.flatnonzero(cand)
                        rc = rc[((M[rc] * q[rc]).sum(axis=1) <= C[rc] * 1e-12) | ~drains[rc]]
                        if len(rc):
                            ri, rj = np.nonzero(phase[rc] == 3)
                            fr = rc[ri] * U + rj
                            phf[fr] = 2
                            remf[fr] = gf[rc[ri] * n + kf[fr]]
                            n3[rc] = 0
                            fi = np.concatenate([fi, fr[remf[fr] <= eps_t]])
                if not len(fi):
                    break
                ph = phf[fi]
                kk = kf[fi]
                ii = fi // U
                kc = np.minimum(kk, n - 1)
                s_ = ph == 0                                   # to issue
                if fenced_any:                                 # a read fence: wait until its stores drained
                    fz = s_ & ff[ii * n + kc] & (qf[fi] > 0)
                    phf[fi[fz]] = 5
                    s_ = (s_ & ~fz) | (ph == 5)
                f0 = fi[s_]
                phf[f0] = 1
                remf[f0] = bf[ii[s_] * n + kc[s_]]
                if free_b:                                     # its first f bytes enter the stage at once
                    take = np.clip(np.minimum(free_b, a.ravel()[f0] + free_cap - qf[f0]), 0.0, remf[f0])
                    remf[f0] -= take
                    qf[f0] += take
                s_ = ph == 1                                   # end of the burst
                if s_.any():
                    f1, i1, k1 = fi[s_], ii[s_], kk[s_]
                    endf[(orig[i1] * U + (f1 - i1 * U)) * n + k1] = t[i1]
                    last = k1 == n - 1
                    sy = sync[i1]
                    phf[f1] = np.where(last, 4, np.where(sy, 3, 2))
                    remf[f1] = np.where(sy, remf[f1], gf[i1 * n + kc[s_]])
                    n3 += np.bincount(i1[~last & sy], minlength=len(n3))
                    n4 += np.bincount(i1[last], minlength=len(n4))
                s_ = ph == 2                                   # the gap is over: the next burst's overhead
                if s_.any():
                    f2, i2, k2 = fi[s_], ii[s_], kk[s_] + 1
                    kf[f2] = k2
                    startf[(orig[i2] * U + (f2 - i2 * U)) * n + k2] = t[i2]
                    phf[f2] = 0
                    remf[f2] = o
                fi_prev = fi
            active = n4 < nvalid
            if not active.all():                               # drop the rows whose trains have ended
                if not active.any():
                    break
                keep = np.flatnonzero(active)
                (P, b, g, sync, drains, mws, ws, M, valid, C, C0, a, a_lo, a_hi, q, Q, stalled, phase, k, rem, t,
                 orig, nvalid, n3, n4, ncop, cls, fence) = (x[keep] for x in (
                    P, b, g, sync, drains, mws, ws, M, valid, C, C0, a, a_lo, a_hi, q, Q, stalled, phase, k, rem, t,
                    orig, nvalid, n3, n4, ncop, cls, fence))
                flat_cls = np.arange(len(keep))[:, None] * (Kc + 1) + cls
                bf, gf = b.ravel(), g.ravel()
            Nn = len(t)
            if free_b:                                         # q moved at a burst's start too
                Q = (M * np.maximum(q - a, 0.0)).sum(axis=1)
            # (no unit: m = a = q = 0 and phase 4, so it neither holds, nor is below or beyond its slots)
            issuing = phase == 1
            holding = (q > 0) | issuing
            # the drain shares now (_gpc_dynamic_weights): equal per GPC holding stores, within it by ws
            x = np.where(holding, mws, 0.0)
            S = np.bincount(flat_cls.ravel(), weights=x.ravel(), minlength=Nn * (Kc + 1)).reshape(Nn, Kc + 1)
            n_hold = ((S > 0) * ncop).sum(axis=1)
            Sg = S.ravel()[flat_cls]
            wd = np.where(holding, ws / Sg / np.maximum(n_hold, 1)[:, None], 0.0)   # (holding: Sg >= m ws > 0)
            dr = D * wd / np.maximum((M * wd).sum(axis=1), 1e-300)[:, None]   # 0 where not holding (wd = 0)
            Cs = np.where(stalled, C0 * phi, C0)
            below = q < a_lo
            beyond = q > a_hi
            at = ~(below | beyond)
            over = Q > Cs * (1 + 1e-9) + 1e-6
            full = ~over & (Q >= Cs * (1 - 1e-9) - 1e-6)
            closed = (full | over)[:, None]
            rate = np.where(issuing, r, 0.0)
            rate = np.where(issuing & at & closed, np.minimum(r, dr), rate)
            ib = issuing & beyond
            rate = np.where(ib & over[:, None], 0.0, rate)
            sh = ib & full[:, None]
            rs = np.flatnonzero(sh.any(axis=1))
            if len(rs):                                        # share what leaves the pool (the rows concerned)
                F = (M[rs] * dr[rs] * beyond[rs]).sum(axis=1)  # bytes/ns leaving the pool
                shared = np.zeros_like(rate)
                shared[rs] = _water_fill(np.where(sh[rs], wd[rs], 0.0), M[rs], F, r)
                rate = np.where(sh, shared, rate)
            qdot = rate - dr
            qdot = np.where((q <= 0) & (qdot < 0), 0.0, qdot)
            Qdot = (M * qdot * (beyond | (at & (qdot > 0)))).sum(axis=1)
            gapish = (phase == 0) | (phase == 2)
            t_evt = np.where(rate > 0, rem / rate, np.where(gapish, rem, np.inf))   # (rate > 0: issuing)
            # its slots fill (below) or it leaves the pool (beyond): (q - a) / -qdot is (a - q) / qdot exactly
            t_sl = np.where((below & (qdot > 0)) | (beyond & (qdot < 0)), (a - q) / qdot, np.inf)
            t_empty = np.where((q > 0) & (qdot < 0), q / -qdot, np.inf)
            t_fill = np.where(~full & ~over & (Qdot > 0), (Cs - Q) / Qdot, np.inf)
            t_unover = np.where(over & (Qdot < 0), (Q - Cs) / -Qdot, np.inf)
            dt = np.minimum(np.minimum(t_evt, t_sl), t_empty).min(axis=1)
            dt = np.minimum(dt, np.minimum(t_fill, t_unover))
            dt = np.where(np.isfinite(dt), np.maximum(dt, 0.0), 0.0)
            t = t + dt
            near = dt[:, None] * (1 + 1e-12)
            dtc = dt[:, None]
            rem = rem - np.where(gapish, dtc, rate * dtc)      # (rate = 0 unless issuing: rem - 0 = rem)
            rem = np.where(t_evt <= near, 0.0, rem)
            q = np.maximum(q + qdot * dtc, 0.0)
            q = np.where(t_sl <= near, a, q)
            q = np.where(t_empty <= near, 0.0, q)
            filled = np.isfinite(t_fill) & (dt >= t_fill * (1 - 1e-12))
            Q = (M * np.maximum(q - a, 0.0)).sum(axis=1)   # (the next pass's Q too: q moves only here)
            stalled = (stalled | filled) & (Q > 0)
        else:
            raise RuntimeError("stage simulation did not finish within its step bound (a bug: please report)")
    return start, end


def _advance(t, dt, active, issuing, phase, rem, rate, t_evt):
    """One step of simulate_stage's clock (per-program stages): dt clamped to the active configurations, the
    issuers' remaining bytes and the others' remaining time taken down, the events that set dt landed exactly.
    Returns (dt, t, near, rem); ``near``: the [N, 1] tolerance within which an event counts as reached."""
    dt = np.where(active & np.isfinite(dt), np.maximum(dt, 0.0), 0.0)
    t = t + dt
    near = dt[:, None] * (1 + 1e-12)
    rem = np.where(issuing, rem - rate * dt[:, None], np.where((phase == 0) | (phase == 2), rem - dt[:, None], rem))
    rem = np.where(t_evt <= near, 0.0, rem)
    return dt, t, near, rem


FENCE_ARBITRATIONS = ("slots", "gpc_drain")   # per program stores: the arbitrations a read fence (simulate_stage's read_fence) applies to
READ_FENCE = True            # records with the legacy kernel's read simulate it (False: no read wait simulated)


def models_read_fence(prm) -> bool:
    """Whether a recorded read fence (``data.legacy_read_bursts``) is simulated under ``prm``: READ_FENCE is on and
    its arbitration keeps every program's stores apart (FENCE_ARBITRATIONS); the fits and scores ask this."""
    return READ_FENCE and getattr(prm, "arbitration", "") in FENCE_ARBITRATIONS


def simulate_stage(prm: StageParams, programs, burst_bytes, gap_ns, sync, groups: int | None = None,
                   barrier_drains=True, read_fence=None):
    """Every configuration's train through the stage model, vectorized over configurations.

    programs [N]; burst_bytes, gap_ns [N, n] (per program; gap after each burst); sync [N] bool;
    barrier_drains [N] bool (sync only): the grid barrier's arrival is a release, which returns once the
    program's stores are performed, so the barrier also waits for the stage to drain (the recorded sweeps;
    their barrier time is the stage's content / D on both links); False: a relaxed barrier.
    ``groups``: weight groups per grid (None: GPC_DRAIN_GROUPS for arbitration "gpc_drain" (simulated in batches of equal group counts, :func:`gpc_drain_groups`), else STAGE_GROUPS).
    Returns (start, end) [N, G, n] ns per weight group (groups beyond min(P, G) are NaN) and the group
    sizes m [N, G] (programs per group).

    ``read_fence`` [N, n] bool (None: none): the bursts whose start holds a read that waits behind the program's
    own outstanding stores (the legacy train kernel's parameter reads at bursts 4, 8, ...:
    :func:`xstage.data.legacy_read_bursts`). Such a burst's issue begins, after the overhead, only once the
    program's stores in the stage have drained; the wait counts in its issue time (free-running rows only; the
    arbitrations of FENCE_ARBITRATIONS, which keep every program's stores apart)."""
    P = np.asarray(programs, np.float64)
    b = np.asarray(burst_bytes, np.float64)
    g = np.asarray(gap_ns, np.float64)
    sync = np.broadcast_to(np.asarray(sync, bool), P.shape)
    drains = sync & np.broadcast_to(np.asarray(barrier_drains, bool), P.shape)
    N, n = b.shape
    fence = None
    if read_fence is not None:
        fence = np.asarray(read_fence, bool)
        if fence.shape != b.shape:
            raise ValueError(f"read_fence must have the bursts' shape {b.shape}, got {fence.shape}")
        fence = fence & ~sync[:, None]
        if not fence.any():
            fence = None
        elif prm.arbitration not in FENCE_ARBITRATIONS:
            raise ValueError(f"a read fence needs every program's own stores: arbitration one of "
                             f"{', '.join(FENCE_ARBITRATIONS)}, got {prm.arbitration!r}")
    if groups is None:
        if prm.arbitration == "gpc_drain":
            return _gpc_drain_batched(prm, P, b, g, sync, drains, fence)
        groups = STAGE_GROUPS
    if N * groups * n > MAX_STAGE_WORK:
        raise ValueError(f"{N} configurations x {n} bursts x {groups} groups exceed the model's work bound "
                         f"({MAX_STAGE_WORK}); predict fewer at a time")
    G = groups
    H = None   # gpc_drain: the one-hot GPC of each group [N, G, N_GPC]
    if prm.arbitration == "gpc_drain":
        # the spread levels of GPC_DRAIN_GROUPS groups (of ``groups`` when more), simulated in the first G
        m, w, ws, gid = _gpc_groups(P, prm.spread, max(G, GPC_DRAIN_GROUPS), prm.sm_count)
        if (m[:, G:] > 0).any():
            raise ValueError(f"arbitration 'gpc_drain' simulates these grids as up to "
                             f"{int((m > 0).sum(axis=1).max())} groups; got groups={G}")
        m, ws, gid = m[:, :G], ws[:, :G], gid[:, :G]
        w = ws   # own slots by the spread's weight alone; the drain by _gpc_dynamic_weights(ws, ...) below
        if GPC_DRAIN_FAST:   # the same simulation, alike groups merged (_stage_units)
            start, end = _stage_units(prm, P, b, g, sync, drains, m, ws, gid, G, fence)
            return start, end, m
        valid = m > 0
        H = (gid[:, :, None] == np.arange(N_GPC)[None, None, :]).astype(np.float64)
    else:
        Gc = np.minimum(P, G).astype(int)                                  # groups used per configuration
        gi = np.arange(G)[None, :]
        valid = gi < Gc[:, None]                                            # [N, G]
        m = np.where(valid, P[:, None] / np.maximum(Gc, 1)[:, None], 0.0)   # programs per group
        w = np.where(valid, 1.0 - prm.spread * (gi + 0.5) / np.maximum(Gc, 1)[:, None], 0.0)
    r, D, o, phi = prm.program_rate, prm.drain_gbps, prm.overhead_ns, prm.stalled_fraction
    C = prm.capacity_bytes(P)
    private = prm.arbitration in FENCE_ARBITRATIONS
    if private:   # each program's own slots: the part of C(P) beyond C_0, by weight; q per program [N, G]
        C0 = np.full(N, KIB * prm.base_capacity_kib)
        a = (C - C0)[:, None] * w / np.maximum((m * w).sum(axis=1), 1e-300)[:, None]
        q = np.zeros((N, G))
        stalled = np.zeros(N, bool)
    else:
        q = np.zeros(N)
        stalled = np.zeros(N, bool)
    phase, k, rem, start, end, t = _sim_state(valid, o, n)
    rows = np.arange(N)[:, None]
    eps_t = 1e-9
    for _ in range((160 if private else 40) * G * n + 100):   # slots: every program's slots fill and empty
        # transitions whose time is up (zero-length gaps and overheads chain within one pass of this loop)
        for _ in range(4):
            bb = b[rows, np.minimum(k, n - 1)]
            gg = g[rows, np.minimum(k, n - 1)]
            up = (rem <= eps_t) & (phase < 3)
            # the grid barrier: when every group of a sync configuration waits (and, with a release barrier, the
            # stage has drained), all start the gap together
            release = (sync & np.all((phase == 3) | ~valid, axis=1) & np.any(phase == 3, axis=1)
                       & (((np.sum(m * q, axis=1) if private else q) <= C * 1e-12) | ~drains))
            if release.any():
                rel = release[:, None] & (phase == 3)
                phase = np.where(rel, 2, phase)
                rem = np.where(rel, g[rows, k], rem)
                up = up | (rel & (rem <= eps_t))
            freed = (phase == 5) & (q <= 0) if fence is not None else False   # a read fence whose stores drained
            if not (up | freed).any():
                break
            to_issue = up & (phase == 0)
            to_end = up & (phase == 1)
            to_next = up & (phase == 2)
            if fence is not None:   # a read fence: wait (phase 5) until the program's own stores have drained
                fenced = to_issue & fence[rows, np.minimum(k, n - 1)] & (q > 0)
                phase = np.where(fenced, 5, phase)
                to_issue = (to_issue & ~fenced) | freed
            phase = np.where(to_issue, 1, phase)
            rem = np.where(to_issue, bb, rem)
            if prm.free_kib and to_issue.any():   # its first f bytes enter the stage at once (own stores: q [N, G])
                take = np.where(to_issue, np.clip(np.minimum(KIB * prm.free_kib, a + KIB * prm.free_cap_kib - q),
                                                  0.0, rem), 0.0)
                rem = rem - take
                q = q + take
            if to_end.any():
                ii, jj = np.nonzero(to_end)
                end[ii, jj, k[ii, jj]] = t[ii]
                last = k == n - 1
                phase = np.where(to_end & last, 4, np.where(to_end & sync[:, None], 3, np.where(to_end, 2, phase)))
                rem = np.where(to_end & ~sync[:, None], gg, rem)
            if to_next.any():
                k = np.where(to_next, k + 1, k)
                ii, jj = np.nonzero(to_next)
                start[ii, jj, k[ii, jj]] = t[ii]
                phase = np.where(to_next, 0, phase)
                rem = np.where(to_next, o, rem)
        active = np.any((phase < 4) | (phase == 5), axis=1)
        if not active.any():
            break
        issuing = phase == 1
        if private:
            # per program: x = its stores in the stage, a = its own slots; beyond a it uses the shared pool (C_0,
            # phi C_0 once stalled). Every program's stores drain at its weight's share of D among the programs
            # holding stores (the steady state of one FIFO drain). A program below its slots, or with room in the
            # pool, issues at r; while the pool is full its users share what leaves the pool, by weight.
            holding = valid & ((q > 0) | issuing)
            wd = w if H is None else _gpc_dynamic_weights(ws, m, holding, H)   # gpc_drain: the shares now
            dr = np.where(holding, D * wd / np.maximum((m * wd * holding).sum(axis=1), 1e-300)[:, None], 0.0)
            Cs = np.where(stalled, C0 * phi, C0)                                   # [N]
            below = valid & (q < a * (1 - 1e-9))
            beyond = valid & (q > a * (1 + 1e-9))
            at = valid & ~below & ~beyond                                          # exactly at its slots
            Q = (m * np.maximum(q - a, 0.0)).sum(axis=1)
            over = Q > Cs * (1 + 1e-9) + 1e-6
            full = ~over & (Q >= Cs * (1 - 1e-9) - 1e-6)
            closed = (full | over)[:, None]
            F = (m * dr * beyond).sum(axis=1)                                      # bytes/ns leaving the pool
            shared = _water_fill(np.where(issuing & beyond & full[:, None], wd, 0.0), m, F, r)
            rate = np.where(issuing, r, 0.0)                                       # below its slots, or pool open
            rate = np.where(issuing & at & closed, np.minimum(r, dr), rate)        # keeps its own slots full
            rate = np.where(issuing & beyond & over[:, None], 0.0, rate)           # a stalled pool: wait
            rate = np.where(issuing & beyond & full[:, None], shared, rate)        # share what leaves the pool
            qdot = rate - dr
            qdot = np.where((q <= 0) & (qdot < 0), 0.0, qdot)
            Qdot = (m * qdot * (beyond | (at & (qdot > 0)))).sum(axis=1)
            with np.errstate(divide="ignore", invalid="ignore"):
                t_evt = np.where(issuing & (rate > 0), rem / rate,
                                 np.where((phase == 0) | (phase == 2), rem, np.inf))
                t_slot = np.where(below & (qdot > 0), (a - q) / qdot, np.inf)             # its slots fill
                t_leave = np.where(beyond & (qdot < 0), (q - a) / -qdot, np.inf)         # it leaves the pool
                t_empty = np.where((q > 0) & (qdot < 0), q / -qdot, np.inf)
                t_fill = np.where(~full & ~over & (Qdot > 0), (Cs - Q) / Qdot, np.inf)
                t_unover = np.where(over & (Qdot < 0), (Q - Cs) / -Qdot, np.inf)
            dt = np.minimum(np.minimum(t_evt, t_slot), np.minimum(t_leave, t_empty))
            dt = dt.min(axis=1)
            dt = np.minimum(dt, np.minimum(t_fill, t_unover))
            dt, t, near, rem = _advance(t, dt, active, issuing, phase, rem, rate, t_evt)
            q = np.maximum(q + qdot * dt[:, None], 0.0)
            q = np.where((t_slot <= near) | (t_leave <= near), a, q)
            q = np.where(t_empty <= near, 0.0, q)
            filled = np.isfinite(t_fill) & (dt >= t_fill * (1 - 1e-12))
            Q = (m * np.maximum(q - a, 0.0)).sum(axis=1)
            stalled = (stalled | filled) & (Q > 0)
            continue
        waiting = drains & np.all((phase == 3) | ~valid, axis=1) & np.any(phase == 3, axis=1)  # barrier: drain
        demand = np.where(issuing, m * r, 0.0).sum(axis=1)
        Ce = np.where(stalled, C * phi, C)
        over = q > Ce * (1 + 1e-9)                                   # a stage that just filled: issuers wait
        full = ~over & (q >= Ce * (1 - 1e-9)) & (demand > D)
        rate = np.where(issuing & ~over[:, None], r, 0.0)
        if full.any():
            shared = _water_fill(np.where(issuing & full[:, None], w, 0.0), m, np.full(N, D), r)
            rate = np.where(full[:, None], shared, rate)
        inflow = (m * rate).sum(axis=1)
        qdot = np.where(over, -D, np.where(full, 0.0, inflow - D))
        qdot = np.where((q <= 0) & (qdot < 0), 0.0, qdot)
        with np.errstate(divide="ignore", invalid="ignore"):
            t_evt = np.where(issuing & (rate > 0), rem / rate,
                             np.where((phase == 0) | (phase == 2), rem, np.inf))
            t_fill = np.where(~full & ~over & (qdot > 0), (Ce - q) / qdot, np.inf)
            t_unover = np.where(over, (q - Ce) / D, np.inf)
            t_empty = np.where((stalled | waiting) & ~over & (qdot < 0), q / -qdot, np.inf)
        dt = np.minimum(np.minimum(t_evt.min(axis=1), t_fill), np.minimum(t_unover, t_empty))
        dt = np.where(active & np.isfinite(dt), np.maximum(dt, 0.0), 0.0)
        t = t + dt
        rem = np.where(issuing, rem - rate * dt[:, None], np.where((phase == 0) | (phase == 2),
                                                                    rem - dt[:, None], rem))
        rem = np.where(t_evt <= dt[:, None] * (1 + 1e-12), 0.0, rem)   # the events that set dt land exactly
        q = np.clip(q + qdot * dt, 0.0, C)
        filled = np.isfinite(t_fill) & (dt >= t_fill)
        q = np.where(filled, Ce, q)
        q = np.where(np.isfinite(t_unover) & (dt >= t_unover), Ce, q)
        q = np.where(np.isfinite(t_empty) & (dt >= t_empty), 0.0, q)
        stalled = (stalled | filled) & (q > 0)
    else:
        raise RuntimeError("stage simulation did not finish within its step bound (a bug: please report)")
    return start, end, m


def _check_train(programs, burst_bytes, gap_ns):
    """Validated (programs, burst_bytes[n], gap_ns[n]) of one train; ValueError naming what is wrong."""
    b = np.asarray(burst_bytes, dtype=np.float64).ravel()
    g = np.asarray(gap_ns, dtype=np.float64).ravel()
    if isinstance(programs, bool) or not np.isscalar(programs) or int(programs) != programs or programs < 1:
        raise ValueError(f"programs must be a positive integer, got {programs!r}")
    if b.size == 0:
        raise ValueError("burst_bytes is empty: a train needs at least one burst")
    if b.size != g.size:
        raise ValueError(f"burst_bytes and gap_ns must have the same length, got {b.size} and {g.size}")
    for name, x in (("burst_bytes", b), ("gap_ns", g)):
        if not np.all(np.isfinite(x)):
            raise ValueError(f"{name} must be finite, got {x.tolist()}")
        if np.any(x < 0):
            raise ValueError(f"{name} must be >= 0, got {x.tolist()}")
    if np.any(b == 0):
        raise ValueError(f"burst_bytes must be positive, got {b.tolist()}")
    return int(programs), b, g


def predict_train(prm: StageParams, programs: int, burst_bytes, gap_ns, sync: bool = False,
                  barrier: str = "release", read_fence=()) -> np.ndarray:
    """ns per burst of a train that every one of ``programs`` programs runs (bytes per program per burst,
    ``gap_ns[k]`` = the compute gap after burst k, the last one unused).

    sync=False: the median program's issue time of each burst of a free-running train whose programs all
    start together. sync=True: the grid's span of each burst (first start -> last end) when a grid barrier
    starts every burst together, ``gap_ns[k]`` after the last program finished burst k (as the synchronised
    sweep, where the harness's barrier time belongs in the gap). ``barrier`` (sync only): "release" (the
    recorded sweeps: the barrier waits until the stage has drained, then the gap follows) or "relaxed" (the
    next burst starts ``gap_ns[k]`` after the last program finished, whatever the stage holds).
    ``read_fence`` (free-running only; default none): indices of the bursts whose start holds a read that waits
    behind the program's own outstanding stores, as the legacy train kernel's parameter reads did
    (:func:`xstage.data.legacy_read_bursts`); such a burst starts issuing once the program's stores have drained.
    A kernel that reads nothing between its bursts (every fused kernel's steady state, the train kernel's
    clean form) has none."""
    if not isinstance(prm, StageParams):
        raise ValueError(f"prm must be StageParams (xstage.model.load_params), got {type(prm).__name__}")
    if barrier not in ("release", "relaxed"):
        raise ValueError(f"barrier must be 'release' or 'relaxed', got {barrier!r}")
    P, b, g = _check_train(programs, burst_bytes, gap_ns)
    fence = None
    ks = np.asarray(list(read_fence), dtype=np.int64).ravel() if len(read_fence) else np.zeros(0, np.int64)
    if len(ks):
        if sync:
            raise ValueError("read_fence applies to free-running trains (sync=False)")
        if ks.min() < 0 or ks.max() >= len(b):
            raise ValueError(f"read_fence holds burst indices outside 0..{len(b) - 1}: {sorted(set(ks.tolist()))}")
        fence = np.zeros((1, len(b)), bool)
        fence[0, ks] = True
    start, end, m = simulate_stage(prm, [P], b[None, :], g[None, :], [bool(sync)],
                                   barrier_drains=[barrier == "release"], read_fence=fence)
    return stage_measure(start, end, [bool(sync)], m)[0]


def stage_measure(start, end, sync, m=None) -> np.ndarray:
    """What the benchmark measures per burst [N, n]: the span over groups (sync) or the median program's issue
    time (free-running). ``m`` [N, G]: programs per group (simulate_stage's third result); where a row's groups
    hold unequal numbers of programs (arbitration "gpc_drain": GPCs of unequal population) the median is weighted by
    them, else (and without ``m``) it is the median group's, which is then the median program's."""
    sync = np.asarray(sync, bool)
    span = np.nanmax(end, axis=1) - np.nanmin(start, axis=1)
    x = end - start
    med = np.nanmedian(x, axis=1)
    if m is not None:
        m = np.asarray(m, np.float64)
        valid = m > 0
        lo = np.where(valid, m, np.inf).min(axis=1)
        hi = np.where(valid, m, -np.inf).max(axis=1)
        for i in np.flatnonzero((hi > lo * (1 + 1e-12)) & ~np.broadcast_to(sync, hi.shape)):   # unequal groups: the
                                                                 # weighted median (sync rows take the span)
            for k in range(x.shape[2]):
                ok = valid[i] & np.isfinite(x[i, :, k])
                if not ok.any():
                    continue
                v, w = x[i, ok, k], m[i, ok]
                o = np.argsort(v, kind="stable")
                c = np.cumsum(w[o]) / w.sum()
                j = int(np.searchsorted(c, 0.5))
                # exactly half the programs below: the mean of the two middle programs, as np.median does
                med[i, k] = 0.5 * (v[o][j] + v[o][j + 1]) if np.isclose(c[j], 0.5) and j + 1 < len(v) else v[o][j]
    return np.where(sync[:, None], span, med)


def simulated_train_rows(trains, prm: StageParams, repeats: int, noise: float = 0.03, seed: int = 0) -> pd.DataFrame:
    """Rows in the recorded ``burst_train`` schema for ``trains`` (xstage.remote_store.BurstTrain), from the
    stage model plus lognormal timing noise per (repeat, burst). Statistics are over the weight groups."""
    from .data import BURST_TRAIN

    rng = np.random.default_rng(seed)
    out = []
    for tr in trains:
        start, end, _ = simulate_stage(prm, [tr.programs], np.asarray([tr.burst_bytes], np.float64),
                                       np.asarray([tr.gap_ns], np.float64), [False])
        s, e = start[0], end[0]
        keep = np.isfinite(s[:, 0])
        s, e = s[keep], e[keep]
        issue = e - s
        for rep in range(repeats):
            k = rng.lognormal(0.0, noise, size=tr.n_bursts)
            q = np.percentile(issue, [10, 25, 75, 90], axis=0) * k
            out.append(pd.DataFrame({
                "train": tr.name, "target": tr.target, "programs": tr.programs, "store_bytes": tr.store_bytes,
                "n_bursts": tr.n_bursts, "rank": 0, "repeat": rep, "burst": np.arange(tr.n_bursts),
                "burst_bytes": np.asarray(tr.burst_bytes), "gap_ns": np.asarray(tr.gap_ns),
                "issue_ns": np.median(issue, axis=0) * k, "issue_p10_ns": q[0], "issue_p25_ns": q[1],
                "issue_p75_ns": q[2], "issue_p90_ns": q[3], "issue_min_ns": issue.min(axis=0) * k,
                "issue_max_ns": issue.max(axis=0) * k, "start_ns": np.median(s, axis=0),
                "start_skew_ns": np.ptp(s, axis=0), "end_skew_ns": np.ptp(e, axis=0),
                "span_ns": (e.max(axis=0) - s.min(axis=0)) * k}))
    return pd.concat(out, ignore_index=True)[list(BURST_TRAIN.columns)]


# ------------------------------------------------------------------------------------------ fitted parameters
LINKS = ("nvlink", "host")


def params_from_dict(d: dict) -> "BurstGapParams | StageParams":
    """Either kind of parameters from their ``as_dict()`` (what sweeps record in their sidecars)."""
    return StageParams(**d) if "capacity_per_program_kib" in d else BurstGapParams(**d)


def load_params(data_dir, link: str) -> StageParams:
    """The stage-model parameters fitted to ``data_dir``'s record of ``link`` ("nvlink": stores to a peer GPU;
    "host": pinned host memory over PCIe), as ``xstage fit --data DIR --link LINK --write`` wrote them
    (``stage_fit_<link>.json``). Pure JSON: no torch needed. ValueError for an unknown link, a folder without a
    fit for that link, or a fit made from other versions of the folder's records (refit then)."""
    import json
    from pathlib import Path

    if link not in LINKS:
        raise ValueError(f"link must be one of {', '.join(LINKS)}, got {link!r}")
    folder = Path(data_dir)
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder")
    return StageParams(**read_fit(folder / f"stage_fit_{link}.json", link)["params"])


def fit_file(path):
    """The file of a written fit named ``path`` (``stage_fit_<link>[_<rung>].json``): the file itself, or, where only
    that exists, its gzip-compressed form ``<name>.json.gz`` (how ``xstage fit --write`` writes them: their
    per-burst tables are ~1 MB of JSON each)."""
    from pathlib import Path

    path = Path(path)
    gz = path.with_name(path.name + ".gz")
    return gz if not path.is_file() and gz.is_file() else path


def read_fit(path, link: str) -> dict:
    """A written stage fit (JSON, or JSON gzip-compressed: :func:`fit_file`), checked: the right link, parameters
    that validate, fitted to the records as they are now (the sha256 of each source CSV against its sidecar)."""
    import gzip
    import json
    from pathlib import Path

    path = fit_file(path)
    folder = path.parent
    if not path.is_file():
        have = sorted(p.name for p in folder.glob("stage_fit_*.json*"))
        raise ValueError(f"{folder} has no fit for link {link!r} ({path.name} missing; has: "
                         f"{', '.join(have) or 'none'}); fit it: xstage fit --data {folder} --link {link} --write")
    try:
        raw = path.read_bytes()
        obj = json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)
        StageParams(**obj["params"])
    except (json.JSONDecodeError, KeyError, TypeError, OSError, EOFError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not a stage fit: {e}") from None
    if obj.get("link") != link:
        raise ValueError(f"{path} holds link {obj.get('link')!r}, not {link!r}")
    for src in obj.get("sources", {}).values():
        side = folder / Path(src["file"]).parent / (Path(src["file"]).name.split(".")[0] + ".json")
        if src.get("sha256") and side.is_file() and json.loads(side.read_text()).get("csv_sha256") != src["sha256"]:
            raise ValueError(f"{path} was fitted to another version of {src['file']}: refit "
                             f"(xstage fit --data {folder} --link {link} --write)")
    return obj
