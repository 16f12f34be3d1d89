"""Low-level device helpers shared by every xstage kernel: timers, fences, cross-rank flags.

All of them sit behind a ``TIMED``/``DEVICE`` constexpr switch where they need inline PTX, because Triton's CPU
interpreter (``TRITON_INTERPRET=1``) cannot run inline assembly. Under the interpreter the timer reads 0 and
the fence is a no-op; programs run one after another there, so ordering holds trivially.

Flags follow the one pattern checked on H200x2 with triton 3.6: the producer stores its data, then
``atomic_xchg(peer_flag, value, sem="release", scope="sys")``; the consumer spins on
``atomic_add(flag, 0, sem="acquire", scope="sys")``. Every spin is bounded by an iteration budget and reports
(who waited, for which flag, what it saw) instead of hanging.
"""
import triton
import triton.language as tl

STATUS_FIELDS = tl.constexpr(6)   # a wait's record, as wait_flag writes it: (waiter, what, expected, seen, polls,
#                                   timed_out); the host re-exports it (xstage.moe_plan, xstage.ulysses)
# Bounds on a spin (polls of a flag or counter), the hosts' default ``max_polls``. They differ on purpose:
PEER_MAX_POLLS = 20_000_000   # a wait on another rank or on another program's tiles (epoch barriers, MegaMoE's
#                               Linear-2 waits): ~seconds on a GPU, since a peer may still be compiling its kernel
GRID_MAX_POLLS = 2_000_000    # the burst-gap grid barrier between bursts of one launch: every program is resident
#                               and already running, so ~100x the longest burst timed is ample and a broken
#                               barrier ends its sweep point sooner


@triton.jit
def globaltimer(DEVICE: tl.constexpr):
    """Nanoseconds from the GPU's global timer (%globaltimer); 0 under the interpreter."""
    if DEVICE:
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False,
                                      pack=1)
    else:
        t = tl.full((), 0, tl.int64)
    return t


@triton.jit
def clock64(DEVICE: tl.constexpr):
    """This SM's cycle counter (%clock64): fine-grained, per SM; 0 under the interpreter."""
    if DEVICE:
        t = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    else:
        t = tl.full((), 0, tl.int64)
    return t


@triton.jit
def smid(DEVICE: tl.constexpr):
    """The SM this program runs on (%smid); -1 under the interpreter (not measured)."""
    if DEVICE:
        t = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    else:
        t = tl.full((), -1, tl.int32)
    return t


@triton.jit
def clock_calibration_kernel(out_ptr, spin_ns, DEVICE: tl.constexpr):
    """Spin ``spin_ns`` on the global timer; write [g0, g1, c0, c1, smallest nonzero global-timer step].

    (c1 - c0) / (g1 - g0) is the SM clock in cycles per ns; the smallest step is the timer's resolution.
    """
    g0 = globaltimer(DEVICE)
    c0 = clock64(DEVICE)
    g = g0
    tick = tl.full((), 1 << 40, tl.int64)
    if DEVICE:
        while g - g0 < spin_ns:
            g_new = globaltimer(DEVICE)
            step = g_new - g
            tick = tl.where((step > 0) & (step < tick), step, tick)
            g = g_new
    c1 = clock64(DEVICE)
    g1 = globaltimer(DEVICE)
    tl.store(out_ptr + 0, g0)
    tl.store(out_ptr + 1, g1)
    tl.store(out_ptr + 2, c0)
    tl.store(out_ptr + 3, c1)
    tl.store(out_ptr + 4, tick)


@triton.jit
def fence_sys(DEVICE: tl.constexpr):
    """Every thread waits until its earlier stores are performed at system scope (fence.acq_rel.sys)."""
    if DEVICE:
        tl.inline_asm_elementwise("fence.acq_rel.sys; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False,
                                  pack=1)


@triton.jit
def signal_flag(flag_ptr, value):
    """Release-store ``value`` into a (possibly peer) flag after this program's data stores."""
    tl.atomic_xchg(flag_ptr, value, sem="release", scope="sys")


@triton.jit
def wait_flag(flag_ptr, expected, max_iters, status_ptr, waiter, what):
    """Spin (acquire, system scope) until ``*flag_ptr >= expected`` or ``max_iters`` polls have passed.

    Writes ``[waiter, what, expected, last_seen, polls, timed_out]`` (int64) to ``status_ptr`` so that the host
    can say who waited for what when a wait times out. Returns 1 if the flag arrived, 0 on timeout.
    """
    seen = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
    polls = 0
    while (seen < expected) & (polls < max_iters):
        seen = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
        polls += 1
    ok = seen >= expected
    zero = tl.zeros((), tl.int64)  # ints equal to 1 arrive as constexprs (Triton specialises them): add to a tensor
    tl.store(status_ptr + 0, zero + waiter)
    tl.store(status_ptr + 1, zero + what)
    tl.store(status_ptr + 2, zero + expected)
    tl.store(status_ptr + 3, seen.to(tl.int64))
    tl.store(status_ptr + 4, polls.to(tl.int64))
    tl.store(status_ptr + 5, (1 - ok.to(tl.int64)))
    return ok


@triton.jit
def epoch_barrier_kernel(
    flag_table,            # *int64 [P]: every rank's flags[P] int32 base address (peer pointers)
    flags,                 # *int32 [P] this rank's flags: flags[src] = last epoch rank src released here
    status_ptr,            # *int64 [P, 6] per awaited peer: (waiter, peer, expected, seen, polls, timed_out)
    rank,                  # this rank
    world_size,            # P
    epoch,                 # int32, grows by one per barrier (flags are never reset)
    max_polls,             # bound on each wait
    SIGNAL: tl.constexpr,  # release this rank's epoch into every rank's flags[rank]
    WAIT: tl.constexpr,    # wait until flags[src] >= epoch for every src
    DEVICE: tl.constexpr,
):
    """Cross-rank barrier after a fused kernel (one program, launched after it in stream order): ends the Ulysses
    attention layer and the MegaMoE layer.

    The GPU runs SIGNAL and WAIT in one launch. Emulated ranks run every rank's SIGNAL launch first, then every
    rank's WAIT launch (kernels only push; waits happen after)."""
    if SIGNAL:
        fence_sys(DEVICE)  # the attention kernel's remote stores are performed before the flag is released
        for peer in range(0, world_size):
            peer_flags = tl.load(flag_table + peer).to(tl.pointer_type(tl.int32))
            signal_flag(peer_flags + rank, epoch)
    if WAIT:
        for src in range(0, world_size):
            src_t = rank * 0 + src  # a tensor on both paths (the interpreter hands the loop a Python int)
            wait_flag(flags + src, epoch, max_polls, status_ptr + src * STATUS_FIELDS, rank, src_t)
