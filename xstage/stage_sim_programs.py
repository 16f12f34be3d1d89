"""The stage model for a kernel's own grid, programs as launched: every program its own burst sizes, its own start
delay, and a grid larger than the GPU holds at once run in waves (:func:`simulate_programs`), and the spread of
its issue times over programs (:func:`program_quantiles`). The physics is :mod:`xstage.stage_sim`'s, unchanged;
only the inputs are the launch's.

- Alike programs (the same sizes, no delay, one wave): the grid is simulated as :func:`xstage.stage_sim.simulate_stage`
  does (its weight groups), bit for bit what :func:`xstage.model.predict_train` sees.
- Otherwise every program is its own group (arbitration "gpc_drain": its GPC by the dispatch order, its spread level
  within the GPC by a low-discrepancy permutation of the GPC's programs, so that neither sizes nor delays in program
  order line up with the favour): it carries its own sizes and starts issuing at its delay, the stage shared.
- Waves: at most :func:`resident_programs` programs (the launch's occupancy: threads and blocks per SM) run at once;
  the block scheduler gives a finished program's place to the next program of the grid. A grid of k full waves is
  exactly every resident place running k programs in turn (each finish frees one place, and the next wave has as
  many programs as places), so each place is simulated as one train of its programs' bursts in turn, the gap after
  a program's last burst (the kernel spends it) before the next program's delay. A partial last wave is placed on
  the first places (approximate: the scheduler gives it the places that finish first).

Legend: P = programs of the grid, R = resident at once, n = bursts per program, K = simulated rows (groups).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .stage_params import GPC_OF_SM, StageParams, dispatch_order
from .stage_sim import _stage_units_run, simulate_stage

THREADS_PER_SM = 2048      # Hopper: threads one SM holds (64 warps)
BLOCKS_PER_SM = 32         # Hopper: thread blocks one SM holds
REGS_PER_SM = 65536        # Hopper: 32-bit registers of one SM
REG_UNIT = 256             # Hopper: registers are allocated per warp in units of 256
GOLDEN = 0.6180339887498949


def resident_programs(num_warps: int, sm_count: int = 132, regs_per_thread: int | None = None) -> int:
    """R: programs of ``num_warps`` warps resident at once: the SMs times the programs one SM holds by its threads,
    its blocks and (``regs_per_thread``, the compiled kernel's count; None: not binding) its registers, allocated
    per warp in units of 256 (Hopper). Shared memory is taken not to bind."""
    w = int(num_warps)
    if w < 1 or 32 * w > 1024:
        raise ValueError(f"num_warps must be 1-32, got {num_warps}")
    per_sm = min(BLOCKS_PER_SM, THREADS_PER_SM // (32 * w))
    if regs_per_thread is not None:
        if not 1 <= int(regs_per_thread) <= 255:
            raise ValueError(f"regs_per_thread must be 1-255, got {regs_per_thread}")
        per_warp = -(-32 * int(regs_per_thread) // REG_UNIT) * REG_UNIT
        per_sm = min(per_sm, REGS_PER_SM // (per_warp * w))
    return int(sm_count) * per_sm


@dataclass(frozen=True)
class ProgramTimes:
    """Simulated issue times: row j of ``start`` / ``end`` [K, n] stands for ``weight[j]`` programs (a weight group
    of alike programs, or one program); ``program[j]`` is its program index (-1: a group of alike programs)."""

    start: np.ndarray    # [K, n] ns from the launch
    end: np.ndarray      # [K, n]
    weight: np.ndarray   # [K]
    program: np.ndarray  # [K]

    @property
    def issue(self) -> np.ndarray:
        return self.end - self.start


def _levels(count: int, spread: float) -> np.ndarray:
    """Spread weights of a GPC's ``count`` programs in program order: the uniform law's levels
    1 - spread (j + 0.5) / count, level j given to programs by the ranks of frac((i + 1) golden)."""
    rank = np.argsort(np.argsort(((np.arange(count) + 1) * GOLDEN) % 1.0, kind="stable"), kind="stable")
    return 1.0 - spread * (rank + 0.5) / count


def _per_program(prm: StageParams, b: np.ndarray, g: np.ndarray, delay: np.ndarray):
    """Every row of b, g [R, n] (a resident place: its sizes and the gaps after them) its own group under
    "gpc_drain", starting at delay [R]: start, end [R, n]."""
    if prm.arbitration != "gpc_drain":
        raise ValueError(f"per-program sizes, delays or waves need arbitration 'gpc_drain', got {prm.arbitration!r}")
    R, n = b.shape
    gpc = GPC_OF_SM[dispatch_order(prm.sm_count)[np.arange(R) % prm.sm_count]]
    occ = list(dict.fromkeys(gpc.tolist()))                    # GPCs in the order of their first program
    order = np.concatenate([np.flatnonzero(gpc == c) for c in occ])  # units grouped by GPC
    ws = np.zeros(R)
    for c in occ:
        idx = np.flatnonzero(gpc == c)
        ws[idx] = _levels(len(idx), prm.spread)
    cls = np.array([occ.index(c) for c in gpc[order]], int)
    lay = (np.ones(R), ws[order], np.ones(R), cls, np.ones(len(occ)), np.arange(R))
    s, e = _stage_units_run(prm, np.array([float(R)]), b[order][None], g[order][None], np.zeros(1, bool),
                            np.zeros(1, bool), [lay], R, R, None, delay[order][None])
    start, end = np.empty((R, n)), np.empty((R, n))
    start[order], end[order] = s[0], e[0]
    return start, end


def simulate_programs(prm: StageParams, burst_bytes, gap_ns, delay_ns=None, resident: int | None = None
                      ) -> ProgramTimes:
    """The free-running grid of ``burst_bytes`` [P, n] (or [n]: every program alike, with P = len(delay_ns)) bytes
    per program per burst, ``gap_ns`` [n] the compute gap after each burst (the last one too: the kernel spends it
    before its program ends), ``delay_ns`` [P] compute before each program's first burst (None: none), ``resident``
    R programs at once (None: all of them; :func:`resident_programs` gives a launch's). Returns every program's
    (or weight group's) issue start and end per burst, from the launch."""
    b = np.asarray(burst_bytes, np.float64)
    g = np.asarray(gap_ns, np.float64).ravel()
    if b.ndim == 1:
        if delay_ns is None:
            raise ValueError("burst_bytes [n] needs delay_ns [P] to say how many programs; pass burst_bytes [P, n]")
        b = np.broadcast_to(b, (len(delay_ns), len(b)))
    if b.ndim != 2 or b.shape[1] != len(g) or not len(g):
        raise ValueError(f"burst_bytes must be [programs, bursts] with bursts = len(gap_ns) = {len(g)}, got {b.shape}")
    P, n = b.shape
    d = np.zeros(P) if delay_ns is None else np.asarray(delay_ns, np.float64).ravel()
    if len(d) != P:
        raise ValueError(f"delay_ns needs one entry per program ({P}), got {len(d)}")
    if (b < 0).any() or (g < 0).any() or (d < 0).any() or not (np.isfinite(b).all() and np.isfinite(g).all()
                                                                and np.isfinite(d).all()):
        raise ValueError("burst sizes, gaps and delays must be finite and >= 0")
    R = P if resident is None else int(resident)
    if R < 1:
        raise ValueError(f"resident must be >= 1, got {resident}")
    R = min(R, P)
    waves = -(-P // R)
    alike = bool((b == b[:1]).all())
    if alike and waves == 1 and not d.any():                   # the model's own grid (predict_train's)
        s, e, m = simulate_stage(prm, [P], b[:1], g[None], [False])
        ok = m[0] > 0
        return ProgramTimes(s[0][ok], e[0][ok], m[0][ok], np.full(int(ok.sum()), -1))
    # place j runs programs j, j + R, ... in turn: one train of waves * n bursts (missing programs: empty bursts)
    prog = np.arange(waves * R).reshape(waves, R)                        # [waves, R]
    have = prog < P
    pc = np.minimum(prog, P - 1)
    bw = np.where(have[:, :, None], b[pc], 0.0)                          # [waves, R, n]
    gw = np.where(have[:, :, None], np.broadcast_to(g, bw.shape), 0.0).copy()
    if waves > 1:   # the next program's delay follows the last gap: its compute before burst 0, as a gap
        gw[:-1, :, -1] += np.where(have[1:], d[pc[1:]], 0.0)
    chain_b = bw.transpose(1, 0, 2).reshape(R, waves * n)
    chain_g = gw.transpose(1, 0, 2).reshape(R, waves * n)
    if alike and not d.any() and have.all():                             # alike places: the weight groups
        s, e, m = simulate_stage(prm, [R], chain_b[:1], chain_g[:1], [False])
        ok = m[0] > 0
        s, e = s[0][ok].reshape(-1, waves, n), e[0][ok].reshape(-1, waves, n)      # [K, waves, n]
        w = m[0][ok]
        s, e = s.transpose(1, 0, 2).reshape(-1, n), e.transpose(1, 0, 2).reshape(-1, n)     # [waves * K, n]
        return ProgramTimes(s, e, np.tile(w, waves), np.full(len(s), -1))
    s, e = _per_program(prm, chain_b, chain_g, d[:R])
    s, e = s.reshape(R, waves, n).transpose(1, 0, 2), e.reshape(R, waves, n).transpose(1, 0, 2)   # [waves, R, n]
    return ProgramTimes(s[have], e[have], np.ones(P), prog[have])


def program_quantiles(times: ProgramTimes, qs=(0.1, 0.5, 0.9)) -> np.ndarray:
    """[len(qs), n]: the quantiles over programs of each burst's issue time (rows weighted by the programs they
    stand for; the midpoint rule, interpolated)."""
    x, w = times.issue, np.asarray(times.weight, np.float64)
    out = np.full((len(qs), x.shape[1]), np.nan)
    for k in range(x.shape[1]):
        ok = (w > 0) & np.isfinite(x[:, k])
        if not ok.any():
            continue
        v, ww = x[ok, k], w[ok]
        o = np.argsort(v, kind="stable")
        c = (np.cumsum(ww[o]) - 0.5 * ww[o]) / ww.sum()
        out[:, k] = np.interp(qs, c, v[o])
    return out
