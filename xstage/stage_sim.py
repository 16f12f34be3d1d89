"""The stage model's event simulation: every configuration's train through the link's stage, vectorized over
configurations and program groups (:func:`simulate_stage`), its fast path for arbitration "gpc_drain"
(alike groups merged into units) and what the benchmark measures of it (:func:`stage_measure`).
"""
from __future__ import annotations

import numpy as np

from .fluid import KIB
from .stage_params import (FENCE_ARBITRATIONS, GPC_DRAIN_GROUPS, MAX_STAGE_WORK, N_GPC, STAGE_GROUPS, StageParams,
                           _gpc_groups, gpc_drain_groups)


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


def _stage_units_run(prm: StageParams, P, b, g, sync, drains, lay, U, G, fence=None, delay=None):
    """The loop of :func:`_stage_units` for configurations of U units each (``fence`` [N, n]: simulate_stage's
    read_fence, phase 5 as there). ``b``, ``g`` [N, n], or [N, U, n]: every unit its own sizes and gaps
    (free-running only); ``delay`` [N, U] (None: none): ns before a unit's first burst (spent as a gap before
    burst 0: it holds its slots and issues nothing). Returns start, end [N, U, n]."""
    N, n = b.shape[0], b.shape[-1]
    per_unit = b.ndim == 3
    if per_unit and (g.shape != b.shape or sync.any()):
        raise ValueError("per-unit sizes need per-unit gaps of their shape and free-running rows")
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
    if delay is not None:                          # a late unit: a gap before burst 0 (k = -1)
        late = valid & (np.asarray(delay, np.float64) > 0)
        phase, k, rem = np.where(late, 2, phase), np.where(late, -1, k), np.where(late, delay, rem)
        start[:, :, 0] = np.where(late, np.nan, start[:, :, 0])
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
                remf[f0] = bf[(f0 if per_unit else ii[s_]) * n + kc[s_]]
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
                    remf[f1] = np.where(sy, remf[f1], gf[(f1 if per_unit else i1) * n + kc[s_]])
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


def models_read_fence(prm) -> bool:
    """Whether a recorded read fence (``data.legacy_read_bursts``) is simulated under ``prm``: where its arbitration
    keeps every program's stores apart (FENCE_ARBITRATIONS); the fits and scores ask this."""
    return getattr(prm, "arbitration", "") in FENCE_ARBITRATIONS


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
