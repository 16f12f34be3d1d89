"""Traffic the stage model was never fitted on: free-running trains of remote-store bursts whose shape is not the
fitting kernel's (``remote_store.burst_train_store_kernel``: 4 warps, 16-byte stores, every program the same train,
every program resident from the start).

``family_store_kernel`` runs one train per program with, per program, its own burst sizes (``elems[P, B]``) and its
own start delay (``delay[P]`` cycles of compute before its first burst: programs that start at different times), a
store width of 4 * V bytes and any block size (``num_warps`` of the launch, R = 32 * num_warps rows per loop step).
A grid larger than the GPU holds at once (e.g. 16 warps per program, 8 programs per SM) runs in waves: a program
starts once an earlier one has ended, which its calibrated start time records. What a fused kernel's own stores look
like is one of these shapes; the stage model must predict them with the parameters of the fitting kernel's trains.

Legend: P = programs, B = bursts, N[p, b] = int32 elements program p stores in burst b (a multiple of R * V),
V = int32 per store, R = rows of V elements per loop step.

Destination: dst[sum_{p, b} N[p, b]] int32, burst-major (burst b of every program, then burst b + 1), program p's
burst b at base[p, b]; every element written once with ``payload(i) = (i * 0x9E3779B1) ^ seed`` (the same payload
as the other kernels), so the whole destination is checkable bit for bit. Timestamps ts[P, B, 2] (issue start,
issue end) in SM cycles, cal[P, 2] (global timer ns, cycles) at the program's start, sm[P] its SM.

Under Triton's interpreter (``DEVICE=False``) there is no timer (timestamps 0), no gap and no delay; the data path
is the same.
"""
import triton
import triton.language as tl

from .remote_store import payload
from .sync import clock64, globaltimer, smid


@triton.jit
def family_store_kernel(
    dst_addr,              # int64: address of dst[sum N] int32 (pinned host, peer pointer or local)
    elems_ptr,             # *int32 [P, B] N[p, b]: int32 elements program p stores in burst b (multiple of R*V)
    base_ptr,              # *int64 [P, B] element offset of program p's burst b
    gap_ptr,               # *int64 [B] compute gap after burst b, SM cycles (every program the same)
    delay_ptr,             # *int64 [P] compute before program p's first burst, SM cycles
    ts_ptr,                # *int64 [P, B, 2] cycles: issue start, issue end
    cal_ptr,               # *int64 [P, 2]: global timer (ns) and cycle counter at the program's start
    sm_ptr,                # *int32 [P]: the SM each program ran on (-1 under the interpreter)
    seed,                  # int32 payload seed
    N_BURSTS: tl.constexpr,
    NB: tl.constexpr,      # a power of two >= N_BURSTS
    V: tl.constexpr,
    R: tl.constexpr,
    DEVICE: tl.constexpr,
):
    pid = tl.program_id(0)
    dst = tl.multiple_of(dst_addr.to(tl.pointer_type(tl.int32)), 16)
    BLOCK: tl.constexpr = R * V
    offs = tl.arange(0, R)[:, None] * V + tl.arange(0, V)[None, :]  # [R, V]: each thread stores V contiguous
    offs = tl.max_contiguous(tl.multiple_of(offs, [V, V]), [1, V])
    kk = tl.arange(0, NB)
    k_ok = kk < N_BURSTS
    row = pid.to(tl.int64) * N_BURSTS
    n_all = tl.load(elems_ptr + row + kk, mask=k_ok, other=0)       # this program's train, in registers
    base_all = tl.load(base_ptr + row + kk, mask=k_ok, other=0)
    gap_all = tl.load(gap_ptr + kk, mask=k_ok, other=0)
    delay = tl.load(delay_ptr + pid)
    tl.store(cal_ptr + pid * 2, globaltimer(DEVICE))
    tl.store(cal_ptr + pid * 2 + 1, clock64(DEVICE))
    tl.store(sm_ptr + pid, smid(DEVICE))
    if DEVICE:
        until = clock64(DEVICE) + delay
        now = clock64(DEVICE)
        while now < until:
            now = clock64(DEVICE)
    for b in range(N_BURSTS):
        n = tl.sum(tl.where(kk == b, n_all, 0))
        base_b = tl.sum(tl.where(kk == b, base_all, 0))
        gap = tl.sum(tl.where(kk == b, gap_all, 0))
        base = tl.multiple_of(base_b, BLOCK)
        tl.debug_barrier()
        t0 = clock64(DEVICE)
        for start in range(0, n, BLOCK):
            idx = tl.multiple_of(base + start, BLOCK) + offs
            tl.store(dst + idx, payload(idx, seed))
        tl.debug_barrier()
        t1 = clock64(DEVICE)
        rec = ts_ptr + (pid * N_BURSTS + b) * 2
        tl.store(rec + 0, t0)
        tl.store(rec + 1, t1)
        if DEVICE:
            until = t1 + gap
            now = clock64(DEVICE)
            while now < until:
                now = clock64(DEVICE)
