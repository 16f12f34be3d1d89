"""The stage model's parameters and the chip it runs on: StageParams (one link's stage), the dispatch order of a
grid's programs, the measured SM -> GPC map and the weight groups arbitration "gpc_drain" simulates.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .fluid import KIB, BurstGapParams

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
    """The GPC (0-7) of TPC t of an H200, as measured with thread-block clusters (data/h200x1/gpc_map, and data/h200x1/archive/gpc_map_second_chip: two chips and
    one process before and after its trains alike; stage_programs_analysis.gpc_map): TPCs 0-31 are GPC t mod 8 in turn, TPCs 32-59
    the seven GPCs but GPC 0 in turn. TPCs 60-65 never run a cluster of 4. TPCs 62-65 (the dispatch head, programs
    0-7) are put in GPC 0: they take GPC 0's share at P = 16-66 (stage_programs_analysis.favour_by_gpc). TPCs 60 and 61 are not
    measured: a GPC has at most 9 TPCs, so GPC 0 (4 + the head's 4) cannot hold them; they are put in GPCs 6 and 7
    (the two that hold none of the 12 TPCs favoured at P = 132 in data/h200x1/train_programs_p; GPCs 1 and 2
    score the same within 0.5 %, and all six in GPC 0 worse: docs/findings.md)."""
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


def gpc_drain_groups(programs: int, sm_count: int = 132) -> int:
    """Weight groups arbitration "gpc_drain" simulates a grid of ``programs`` as: every occupied GPC min(programs
    in it, GPC_DRAIN_GROUPS // occupied GPCs) groups (_gpc_groups with GPC_DRAIN_GROUPS)."""
    P = int(programs)
    if P < 1:
        raise ValueError(f"programs must be >= 1, got {programs!r}")
    n = np.bincount(GPC_OF_SM[dispatch_order(sm_count)[np.arange(P) % sm_count]], minlength=N_GPC)
    return int(np.minimum(n[n > 0], GPC_DRAIN_GROUPS // int((n > 0).sum())).sum())


FENCE_ARBITRATIONS = ("slots", "gpc_drain")   # per program stores: the arbitrations a read fence (simulate_stage's read_fence) applies to
