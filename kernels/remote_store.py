"""X-Stage microbenchmark: trains of remote-store bursts separated by compute gaps.

Each program of a persistent grid issues ``N_BURSTS`` consecutive bursts of ``burst_elems`` int32 stores to a
destination buffer — a peer GPU's buffer reached through a symmetric-memory peer pointer, or local memory as
the control — and between bursts it leaves the store path alone for ``gap_cycles`` (it spins on its SM's
cycle counter, as an SM busy with compute would). Around each burst it records timestamps in SM cycles
(%clock64, fine-grained; the host converts them to ns with a calibrated clock rate and aligns programs with
the global timer read at the program's start):

  t_issue_start  before the burst's first store is issued (after a CTA barrier)
  t_issue_end    after the burst's last store is issued by every warp of the program (CTA barrier, then timer)
  t_drained      with ``DRAIN``: after every thread's ``fence.acq_rel.sys`` returned, i.e. the burst's stores
                 are performed at system scope (visible at the destination)
  t_released     with ``SYNC``: after a grid-wide barrier, so that every program starts its gap and its next
                 burst together (without it, programs drift apart over a train and stop contending). The
                 arrival is a release (``RELEASE``, the recorded sweeps): it returns only once the program's
                 stores are performed, so the barrier also drains the stage (measured: its time is the stage's
                 content / D on both links); ``RELEASE=False`` arrives relaxed and leaves the stage as it is

``t_issue_end - t_issue_start`` is the sender-visible issue time: short bursts cost only their issue, while a
sustained train fills the outstanding capacity between issue and visibility (the X-Stage) and later stores
stall. ``t_drained - t_issue_end`` is the drain side.

Legend: P = programs, B = bursts in the train, N = int32 elements per program per burst, V = int32 per store
(store width 4*V bytes), R = rows of V elements stored per program per loop step.

Destination layout: ``dst[B, P, N]`` int32 (each burst writes fresh lines: a combine or an all-to-all writes
distinct rows too). Payload: ``payload(i) = (i * 0x9E3779B1) ^ seed`` in int32 over the global element index
``i``, computed in registers (no loads on the issue path), so the destination's contents are checkable bit for
bit. Timestamps: ``ts[P, B, 4]`` int64 cycles; ``cal[P, 2]``: (global timer ns, cycles) at the program's start.

Under Triton's interpreter (``DEVICE=False``) there is no timer (all timestamps are 0) and no gap; the data path
is the same.
"""
import triton
import triton.language as tl

from .sync import clock64, fence_sys, globaltimer, smid

PAYLOAD_MULT = tl.constexpr(-1640531535)  # 0x9E3779B1 as int32: Knuth's multiplicative hash


@triton.jit
def payload(idx, seed):
    """Store value for global element index ``idx`` (int64 tensor) -> int32."""
    return (idx.to(tl.int32) * PAYLOAD_MULT) ^ seed


@triton.jit
def burst_gap_store_kernel(
    dst_addr,              # int64: address of dst[B, P, N] int32 (peer pointer or local)
    ts_ptr,                # *int64 [P, B, 4] cycles: issue start, issue end, drained, released (gap start)
    cal_ptr,               # *int64 [P, 2]: global timer (ns) and cycle counter at the program's start
    bar_ptr,               # *int32 [B] grid-barrier arrival counters (zeroed by the host), used with SYNC
    status_ptr,            # *int64 [P, 2] (burst + 1, arrivals seen) of a grid barrier that timed out; 0 if none
    burst_elems,           # N (multiple of R*V)
    gap_cycles,            # int64 gap after each burst (after its drain / barrier), in SM cycles
    seed,                  # int32 payload seed
    max_polls,             # bound on each grid-barrier spin
    N_BURSTS: tl.constexpr,
    V: tl.constexpr,
    R: tl.constexpr,
    DRAIN: tl.constexpr,
    SYNC: tl.constexpr,    # grid barrier after each burst: every program starts its gap (and next burst) together
    DEVICE: tl.constexpr,
    RELEASE: tl.constexpr = True,  # the barrier's arrival is a release (it returns once this program's stores
                                   # are performed: the stage drains at every barrier); False: relaxed arrival
):
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    dst = tl.multiple_of(dst_addr.to(tl.pointer_type(tl.int32)), 16)  # symmetric buffers are 16 B aligned
    BLOCK: tl.constexpr = R * V
    offs = tl.arange(0, R)[:, None] * V + tl.arange(0, V)[None, :]  # [R, V]: each thread stores V contiguous
    offs = tl.max_contiguous(tl.multiple_of(offs, [V, V]), [1, V])  # store width is exactly 4*V bytes
    tl.store(cal_ptr + pid * 2, globaltimer(DEVICE))
    tl.store(cal_ptr + pid * 2 + 1, clock64(DEVICE))
    for b in range(N_BURSTS):
        base = tl.multiple_of((b * n_prog + pid).to(tl.int64) * burst_elems, BLOCK)
        tl.debug_barrier()
        t0 = clock64(DEVICE)
        for start in range(0, burst_elems, BLOCK):
            idx = tl.multiple_of(base + start, BLOCK) + offs
            tl.store(dst + idx, payload(idx, seed))
        tl.debug_barrier()
        t1 = clock64(DEVICE)
        t2 = t1
        if DRAIN:
            fence_sys(DEVICE)
            tl.debug_barrier()
            t2 = clock64(DEVICE)
        t3 = t2
        if SYNC and DEVICE:  # bounded grid barrier (all P programs must be resident; a timeout is reported)
            if RELEASE:
                tl.atomic_add(bar_ptr + b, 1, sem="release", scope="gpu")
            else:
                tl.atomic_add(bar_ptr + b, 1, sem="relaxed", scope="gpu")
            seen = tl.atomic_add(bar_ptr + b, 0, sem="acquire", scope="gpu")
            polls = 0
            while (seen < n_prog) & (polls < max_polls):
                seen = tl.atomic_add(bar_ptr + b, 0, sem="acquire", scope="gpu")
                polls += 1
            if (seen < n_prog) & (tl.load(status_ptr + pid * 2) == 0):  # keep the first barrier that timed out
                tl.store(status_ptr + pid * 2, (b + 1).to(tl.int64))
                tl.store(status_ptr + pid * 2 + 1, seen.to(tl.int64))
            tl.debug_barrier()
            t3 = clock64(DEVICE)
        rec = ts_ptr + (pid * N_BURSTS + b) * 4
        tl.store(rec + 0, t0)
        tl.store(rec + 1, t1)
        tl.store(rec + 2, t2)
        tl.store(rec + 3, t3)
        if DEVICE:
            until = t3 + gap_cycles
            now = clock64(DEVICE)
            while now < until:
                now = clock64(DEVICE)


@triton.jit
def stream_store_kernel(
    dst_addr,              # int64: address of dst[total] int32 (peer pointer or local)
    elems_per_program,     # int32 elements each program writes (multiple of R*V)
    seed,
    V: tl.constexpr,
    R: tl.constexpr,
):
    """Peak-bandwidth variant: one long burst per program, no timers (timed from the host with events)."""
    pid = tl.program_id(0)
    dst = tl.multiple_of(dst_addr.to(tl.pointer_type(tl.int32)), 16)
    BLOCK: tl.constexpr = R * V
    offs = tl.arange(0, R)[:, None] * V + tl.arange(0, V)[None, :]
    offs = tl.max_contiguous(tl.multiple_of(offs, [V, V]), [1, V])
    base = tl.multiple_of(pid.to(tl.int64) * elems_per_program, BLOCK)
    for start in range(0, elems_per_program, BLOCK):
        idx = tl.multiple_of(base + start, BLOCK) + offs
        tl.store(dst + idx, payload(idx, seed))


@triton.jit
def stream_store_tma_kernel(
    dst_addr,              # int64: address of dst[total] int32 (peer pointer or local)
    elems_per_program,     # int32 elements each program writes (multiple of R*C)
    seed,
    R: tl.constexpr,       # rows per bulk store
    C: tl.constexpr,       # int32 per row (C*4 bytes inner box)
):
    """Peak-bandwidth variant through the bulk tensor copy engine (TMA): registers -> shared -> one
    ``cp.async.bulk.tensor`` store of an [R, C] tile per step, so the fabric sees whole-tile writes instead of
    per-thread 16-byte stores. Same payload as the other kernels."""
    pid = tl.program_id(0)
    dst = tl.multiple_of(dst_addr.to(tl.pointer_type(tl.int32)), 16)
    rows_total = elems_per_program // C
    base = pid.to(tl.int64) * elems_per_program
    desc = tl.make_tensor_descriptor(dst + base, shape=[rows_total, C], strides=[C, 1], block_shape=[R, C])
    offs = tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :]
    for r0 in range(0, rows_total, R):
        idx = base + r0 * C + offs
        desc.store([r0, 0], payload(idx, seed))


@triton.jit
def burst_train_store_kernel(
    dst_addr,              # int64: address of dst[sum_k P * N_k] int32 (peer pointer, pinned host, or local)
    elems_ptr,             # *int32 [B] N_k: int32 elements each program stores in burst k (multiple of R*V)
    base_ptr,              # *int64 [B] element offset of burst k's block: sum_{j<k} P * N_j
    gap_ptr,               # *int64 [B] compute gap after burst k, in SM cycles
    ts_ptr,                # *int64 [P, B, 2] cycles: issue start, issue end of every program's every burst
    cal_ptr,               # *int64 [P, 2]: global timer (ns) and cycle counter at the program's start
    sm_ptr,                # *int32 [P]: the SM each program ran on (%smid; -1 under the interpreter)
    seed,                  # int32 payload seed
    probe_ptr,             # *int64 [P, B, 16] (LOAD_PROBE): device words one load after each burst reads
    sink_ptr,              # *int64 [P, B] (LOAD_PROBE): probe word + 1, written with the loaded value
    N_BURSTS: tl.constexpr,
    V: tl.constexpr,
    R: tl.constexpr,
    DEVICE: tl.constexpr,
    PRELOAD: tl.constexpr = True,   # read every burst's N_k, base_k, gap_k into registers before the first burst
    NB: tl.constexpr = 16,          # a power of two >= N_BURSTS (the preloaded vectors' length)
    LOAD_PROBE: tl.constexpr = 0,   # 0: none; 1: after each burst one load of a word the program read before its
                                    # first burst (an L1 hit); 2: one load of a word of its own 128-byte line that
                                    # bypasses L1 (ld.global.cg, an L2 hit). ts then holds 3 stamps per burst
):
    """A free-running train given as data: burst k of every program stores N_k int32 (at base_k + pid * N_k)
    and is followed by gap_k cycles of compute (a clock spin). No grid barrier: programs start together (one
    launch) and then drift apart as the stage shares its drain among them. Same payload as the other kernels.
    PRELOAD=False reads N_k, base_k and gap_k from global memory at the top of burst k, as records before session
    20 did. Their bursts 4 and 8 (a new 32-byte sector of the int64 arrays, an L1 miss) are slow in every
    configuration, 0.16 us with an empty stage and up to 49 us with a busy one (docs/findings.md): the read,
    issued before t0 and first used inside the timed issue, waits behind the program's outstanding remote stores
    (the hypothesis the legacy / preload A/B in one call tests).
    LOAD_PROBE (the load-after-store test): right after burst k's stores issued (t1), the program loads
    one device word and writes it + 1 to ``sink`` (the store needs the loaded value, so the program waits for the
    load there), then takes t2 after a CTA barrier; its gap starts at t2. t2 - t1 is what a fused kernel's next
    load pays behind its own remote stores: kind 1 a word read before the first burst (resident in L1 unless the
    stores evict it), kind 2 a word in L2 read past L1."""
    pid = tl.program_id(0)
    dst = tl.multiple_of(dst_addr.to(tl.pointer_type(tl.int32)), 16)
    BLOCK: tl.constexpr = R * V
    offs = tl.arange(0, R)[:, None] * V + tl.arange(0, V)[None, :]  # [R, V]
    offs = tl.max_contiguous(tl.multiple_of(offs, [V, V]), [1, V])
    if PRELOAD:
        tl.static_assert(NB >= N_BURSTS, "NB must cover every burst")
        kk = tl.arange(0, NB)
        k_ok = kk < N_BURSTS
        n_all = tl.load(elems_ptr + kk, mask=k_ok, other=0)
        base_all = tl.load(base_ptr + kk, mask=k_ok, other=0)
        gap_all = tl.load(gap_ptr + kk, mask=k_ok, other=0)
    STAMPS: tl.constexpr = 3 if LOAD_PROBE else 2
    if LOAD_PROBE == 1:   # the word every later load of this program reads, brought into L1 before the first burst
        w1 = probe_ptr + pid.to(tl.int64) * N_BURSTS * 16
        word = tl.load(w1)
        tl.store(sink_ptr + pid.to(tl.int64) * N_BURSTS, word)   # waits for it here, before the train starts
    tl.store(cal_ptr + pid * 2, globaltimer(DEVICE))
    tl.store(cal_ptr + pid * 2 + 1, clock64(DEVICE))
    tl.store(sm_ptr + pid, smid(DEVICE))
    for b in range(N_BURSTS):
        if PRELOAD:   # burst b's entries, picked out of the registers (no memory access inside the train)
            n = tl.sum(tl.where(kk == b, n_all, 0))
            base_b = tl.sum(tl.where(kk == b, base_all, 0))
            gap = tl.sum(tl.where(kk == b, gap_all, 0))
        else:
            n = tl.load(elems_ptr + b)
            base_b = tl.load(base_ptr + b)
            gap = tl.load(gap_ptr + b)
        base = tl.multiple_of(base_b + pid.to(tl.int64) * n, BLOCK)
        tl.debug_barrier()
        t0 = clock64(DEVICE)
        for start in range(0, n, BLOCK):
            idx = tl.multiple_of(base + start, BLOCK) + offs
            tl.store(dst + idx, payload(idx, seed))
        tl.debug_barrier()
        t1 = clock64(DEVICE)
        t_end = t1
        rec = ts_ptr + (pid * N_BURSTS + b) * STAMPS
        if LOAD_PROBE != 0:
            slot = pid.to(tl.int64) * N_BURSTS + b
            if LOAD_PROBE == 1:
                v = tl.load(probe_ptr + pid.to(tl.int64) * N_BURSTS * 16)
            else:
                v = tl.load(probe_ptr + slot * 16, cache_modifier=".cg")
            tl.store(sink_ptr + slot, v + 1)
            tl.debug_barrier()
            t_end = clock64(DEVICE)
            tl.store(rec + 2, t_end)
        tl.store(rec + 0, t0)
        tl.store(rec + 1, t1)
        if DEVICE:
            until = t_end + gap
            now = clock64(DEVICE)
            while now < until:
                now = clock64(DEVICE)
