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

from .data import BURST_GAP

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
