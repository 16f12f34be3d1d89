"""MegaMoE: one persistent kernel per rank for Linear-1 -> SwiGLU -> Linear-2, with the combine as remote stores.

Expert parallelism over P ranks: rank r owns experts r * El .. (r + 1) * El. Before this kernel, a dispatch kernel
has pushed every token row routed to one of this rank's experts into this rank's receive buffer, grouped by
expert (contiguous rows per expert, ``offs[e] .. offs[e + 1]``), each row with its source rank, source token,
top-k slot and router weight. The persistent kernel then walks a task list that the host built (the schedule is
data): a Linear-1 task computes one [BLOCK_M, BLOCK_N1] tile of gate and up, applies SwiGLU times the router
weight and writes the intermediate tile; a Linear-2 task computes one [BLOCK_M, BLOCK_N2] output tile and its
epilogue stores each row straight into the combine buffer of the row's source rank (through a table of every
rank's combine-buffer address: a peer pointer, or a local store when the source is this rank). There is no
separate combine all-to-all: the stores drain through NVLink (the X-Stage) while the SM goes on computing.

It wins over the unfused layer (all-to-all, grouped GEMM, SwiGLU, grouped GEMM, all-to-all) by removing the two
collectives' launch and synchronisation costs and overlapping the combine with Linear-2; and the *order* of the
task list decides how bursty the remote stores are. Expert-Wave (all Linear-1 tiles of a wave of experts, then
all Linear-2 tiles) concentrates the stores in the Linear-2 phase; interleaving Linear-2 work of one wave with
Linear-1 work of the next puts computation between bursts, so the outstanding stores drain instead of filling
the stage's capacity (the Burst-Gap model, xstage.model).

Dependencies: a Linear-2 tile of (expert, row block) reads all I columns of the intermediate rows, so it waits
until every Linear-1 tile of that row block has been written: each Linear-1 tile ends with a CTA barrier and an
``atomic_add(counter[pool block], 1, release, gpu scope)``; a Linear-2 tile spins (acquire, bounded by
``max_polls``) until the counter reaches ``expected`` = launch epoch * (I / BLOCK_N1) (counters are never reset
between launches). Every wait writes ``[rank, task, expected, seen, polls, timed_out]`` to its task's status row,
so a missing producer ends in a host-side error naming rank, expert and tile instead of a hang.

Progress: program p walks tasks p, p + n_programs, ...; the host guarantees that every Linear-2 task comes after
all of its Linear-1 producers in the list. On a GPU with all programs resident (n_programs <= SMs), the earliest
unfinished task then never waits on a later one, so the kernel cannot deadlock. Under Triton's interpreter the
programs run one after another, so the launcher uses one program per task (or a single program) there.
Assignment: static (task i -> program i % n_programs), or DYNAMIC: each program claims the next task of the list
with an atomic ticket (an expensive tile no longer pins every later tile of its program: on 2 H200s the static
assignment of the interleaved list gave a third of the programs every Linear-1 tile). Claims follow list order,
so the same argument rules out a deadlock.

Version ladder (constexprs of one kernel; each a bar of the MegaMoE figure):
  1. FP8=False: bf16 on GPUs (fp16 / fp32 under the interpreter, whose bf16 ``tl.dot`` is wrong), fp32
     accumulation, the intermediate rounded to the activation dtype once.
  2. FP8=True: e4m3 activations and weights with per-block scales as DeepGEMM's SM90 FP8 MegaMoE: 1 x 128 for
     activations (and the intermediate, quantised in the Linear-1 epilogue: scale = max(|h|, 1e-4) / 448 per
     row and 128 columns), 128 x 128 for weights; each 128-deep K block's fp8 MMA is scaled and added in fp32.
     Needs BLOCK_N1 = BLOCK_N2 = BLOCK_K = 128. Not runnable under the interpreter (no fp8 there): compiled for
     sm_90 in the tests, run on GPUs only.
  +  TIMED: global-timer ns at each task's start and after its last store was issued (CTA barrier first).
  3. TMA (``megamoe_tma_kernel``, bf16 / fp16): the main loops load x, W1 and W2 through tensor
     descriptors made per tile (``cp.async.bulk.tensor`` into shared memory, completing on mbarriers) instead of
     pointer loads with cp.async; h stays pointer-loaded (written by other programs in this launch). sm_90a
     (ptxas, BM 128, dynamic): 255 registers and 0 B spilled against the pointer loops' 8 B; same shared memory.
     Output bit-identical to the pointer loops (GPU tests). One H200, compute only, ours / torch._grouped_mm on
     the 56 configurations with >= 2048 rows on rank 0, same rounds (geomean / min / below 0.9; the record is at
     commit 8ed668e): pointer loops 1.062 / 0.844 / 13 -> TMA 1.138 / 0.911 / 0 (a second
     run: 1.074 / 0.849 / 11 -> 1.158 / 0.928 / 0); TMA with 3 stages 1.082 / 0.869 / 2; TMA with tile swizzle
     16 1.140 / 0.921 / 0. Over all 84: pointer loops 1.092 -> TMA 1.154 (geomean). Peak 626 TFLOP/s (TMA)
     against 523 (pointer loops) and grouped_mm's 592 in the same rounds.
  4. TMA with FP8 (the fp8 default, xstage.moe_plan.gpu_tiles): x, W1, W2 e4m3
     through descriptors, the scales pointer-loaded by the same helpers as the pointer loops
     (:func:`_linear1_scales`, :func:`_linear2_scales`), one pipeline stage more than the pointer loops could
     afford (the default tiles add one more: BM 64: 5, BM 128: 4). Bit-identical to the pointer loops on all 84
     configurations; their time 0.834x (geomean), fp8 / torch._scaled_grouped_mm 0.961 -> 1.153 (the record is at
     commit 8ed668e; the current one: data/h200x1/megamoe_gemm_fp8).
A second kernel here is the dispatch (push): each rank stores its tokens' rows into the owners' receive buffers.

Legend: P = ranks, E = experts, El = E / P local experts, K = top-k, T = tokens per rank, Hd = hidden,
I = intermediate, R = rows received by this rank (sum over its experts), BM / BN1 / BN2 / BK = tile sizes.

Layouts (row-major, contiguous, element strides):
  x         [R, Hd]        received rows (activation dtype; fp8 e4m3 with FP8), expert-major: offs[e] ..
  xs        [R, Hd/128]    fp32 activation scales (FP8)
  w1        [El, 2I, Hd]   rows 0 .. I: gate, rows I .. 2I: up (nn.Linear layout: out x in)
  w1s       [El, 2I/128, Hd/128] fp32 weight scales (FP8)
  w2        [El, Hd, I]
  w2s       [El, Hd/128, I/128] fp32 (FP8)
  h         [R, I]         intermediate (activation dtype; fp8 with FP8), hs [R, I/128] fp32 (FP8)
  meta      [R, 4] int32   source rank, source token, top-k slot, router weight (float32 bits)
  offs      [El + 1] int32 expert row offsets
  tasks     [n_tasks, 5] int32  kind (0 = Linear-1, 1 = Linear-2), local expert, row block, column block, pool
                           block (the row block's index over all experts: its counter)
  combine[r] [K, T, Hd]    rank r's combine buffer (bf16 / fp16 / fp32); row (slot, token) of source rank r
  table     [P] int64      every rank's combine base address, valid in this process (peer pointers)
  status    [n_tasks, 6] int64  per Linear-2 task: (rank, task, expected, seen, polls, timed_out)
  ts        [n_tasks, 2] int64  TIMED: task start, after its last store
  ticket    [1] int32      DYNAMIC: tickets drawn so far (cumulative over launches; launch k's task 0 is ticket_base)
"""
import triton
import triton.language as tl

from .sync import STATUS_FIELDS, globaltimer, wait_flag

TASK_FIELDS = tl.constexpr(5)       # kind, expert, row block, column block, pool block
META_FIELDS = tl.constexpr(4)       # source rank, token, slot, weight bits
ITEM_FIELDS = tl.constexpr(6)       # dispatch item (ITEMS): source, token, slot, owner rank, owner's row, weight bits
FP8_BLOCK = tl.constexpr(128)       # scale block edge (1 x 128 activations, 128 x 128 weights)
FP8_MAX = tl.constexpr(448.0)       # largest finite e4m3 value
FP8_AMAX_FLOOR = tl.constexpr(1e-4)  # scale = max(amax, floor) / 448: an all-zero block stays finite


@triton.jit
def _linear1_scales(xs_ptr, w1s_ptr, e64, rows64, row_ok, col_block, k, Hd, I,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """FP8: the scales of Linear-1's 128-deep K block at ``k``: the tile rows' activation scales ``a_s`` [BM] (1 x
    128; rows past the expert's end read 0) and the gate and up weight blocks' ``g_s``, ``u_s`` (128 x 128). The one
    place both main loops (TMA and pointer) load them, so both scale each block's MMA from the same loads."""
    n_kb = Hd // BLOCK_K
    kb = k // BLOCK_K
    a_s = tl.load(xs_ptr + rows64 * n_kb + kb, mask=row_ok, other=0.0)                # [BM]
    s_base = w1s_ptr + e64 * (2 * I // BLOCK_N) * n_kb
    g_s = tl.load(s_base + col_block * n_kb + kb)                                      # gate block's scale
    u_s = tl.load(s_base + (I // BLOCK_N + col_block) * n_kb + kb)                     # up block's scale
    return a_s, g_s, u_s


@triton.jit
def _linear2_scales(hs_ptr, w2s_ptr, e64, rows64, row_ok, col_block, k, Hd, I,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """FP8: the scales of Linear-2's 128-deep K block at ``k``: the intermediate rows' ``a_s`` [BM] (.cg: other
    programs wrote them during this launch) and the W2 block's ``w_s``. The one place both main loops load them."""
    n_kb = I // BLOCK_K
    kb = k // BLOCK_K
    a_s = tl.load(hs_ptr + rows64 * n_kb + kb, mask=row_ok, other=0.0, cache_modifier=".cg")   # [BM]
    w_s = tl.load(w2s_ptr + e64 * (Hd // BLOCK_N) * n_kb + col_block * n_kb + kb)
    return a_s, w_s


@triton.jit
def _linear1_acc_tma(x_ptr, xs_ptr, w1_ptr, w1s_ptr, e64, rows64, row_ok, row0, row_end, col_block, Hd, I,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FP8: tl.constexpr):
    """Linear-1's main loop through TMA: (x W_gate^T, x W_up^T) fp32 [BM, BN] each. Descriptors are made per tile:
    x from the tile's first row with the expert's remaining rows as its extent (rows past the expert's end read as
    zero, as the pointer loop's ``other=0``), W1 of the expert [2I, Hd]. Both were written before this launch (no
    proxy fence needed). FP8: e4m3 operands, each 128-deep K block's MMA scaled and added in fp32 exactly
    as the pointer loop does (the same expression, so the same bits); the scales stay pointer loads."""
    xd = tl.make_tensor_descriptor(x_ptr + row0.to(tl.int64) * Hd, shape=[row_end - row0, Hd], strides=[Hd, 1],
                                   block_shape=[BLOCK_M, BLOCK_K])                     # [rows left, Hd]
    wd = tl.make_tensor_descriptor(w1_ptr + e64 * (2 * I) * Hd, shape=[2 * I, Hd], strides=[Hd, 1],
                                   block_shape=[BLOCK_N, BLOCK_K])                     # [2I, Hd] gate, up
    n0 = col_block * BLOCK_N
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in range(0, Hd, BLOCK_K):
        a = xd.load([0, k])                                            # [BM, BK]
        wg = wd.load([n0, k])                                          # [BN, BK] gate rows
        wu = wd.load([I + n0, k])                                      # [BN, BK] up rows
        if FP8:
            a_s, g_s, u_s = _linear1_scales(xs_ptr, w1s_ptr, e64, rows64, row_ok, col_block, k, Hd, I, BLOCK_N,
                                            BLOCK_K)
            acc_g += tl.dot(a, wg.T) * (a_s[:, None] * g_s)
            acc_u += tl.dot(a, wu.T) * (a_s[:, None] * u_s)
        else:
            acc_g = tl.dot(a, wg.T, acc_g)
            acc_u = tl.dot(a, wu.T, acc_u)
    return acc_g, acc_u


@triton.jit
def _linear2_acc_tma(a_ptrs, hs_ptr, w2s_ptr, rows64, row_ok, w2_ptr, e64, col_block, Hd, I,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FP8: tl.constexpr):
    """Linear-2's main loop: h W2^T fp32 [BM, BN]. W2 of the expert [Hd, I] through a descriptor made per tile;
    the intermediate h (and with FP8 its scales) stays pointer-loaded (.cg): other programs wrote it during this
    launch with generic-proxy stores, which a TMA read would need a proxy fence to see. FP8: as the pointer loop."""
    wd = tl.make_tensor_descriptor(w2_ptr + e64 * Hd * I, shape=[Hd, I], strides=[I, 1],
                                   block_shape=[BLOCK_N, BLOCK_K])                     # [Hd, I]
    n0 = col_block * BLOCK_N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in range(0, I, BLOCK_K):
        a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0, cache_modifier=".cg")   # [BM, BK]
        w = wd.load([n0, k])                                           # [BN, BK]
        if FP8:
            a_s, w_s = _linear2_scales(hs_ptr, w2s_ptr, e64, rows64, row_ok, col_block, k, Hd, I, BLOCK_N, BLOCK_K)
            acc += tl.dot(a, w.T) * (a_s[:, None] * w_s)
        else:
            acc = tl.dot(a, w.T, acc)
        a_ptrs += BLOCK_K
    return acc


@triton.jit
def _linear1_tile(x_ptr, xs_ptr, w1_ptr, w1s_ptr, h_ptr, hs_ptr, meta_ptr, counters_ptr,
                  expert, row0, row_end, col_block, pool, Hd, I,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FP8: tl.constexpr,
                  TMA: tl.constexpr = False):
    """h[rows, cols] = silu(x W_gate^T) * (x W_up^T) * router weight, then release the row block's counter.
    TMA: the main loop of :func:`_linear1_acc_tma` (bf16 or fp8); the epilogue is the same code."""
    rows = row0 + tl.arange(0, BLOCK_M)                                # [BM] received rows of this expert
    row_ok = rows < row_end
    rows64 = rows.to(tl.int64)
    cols = col_block * BLOCK_N + tl.arange(0, BLOCK_N)                 # [BN] intermediate columns
    ks = tl.arange(0, BLOCK_K)                                         # [BK]
    e64 = expert.to(tl.int64)
    a_ptrs = x_ptr + rows64[:, None] * Hd + ks[None, :]               # [BM, BK]
    wg_ptrs = w1_ptr + e64 * (2 * I) * Hd + cols[None, :] * Hd + ks[:, None]   # [BK, BN] gate rows, transposed
    wu_ptrs = wg_ptrs + I * Hd                                         # [BK, BN] up rows
    if TMA:
        acc_g, acc_u = _linear1_acc_tma(x_ptr, xs_ptr, w1_ptr, w1s_ptr, e64, rows64, row_ok, row0, row_end,
                                        col_block, Hd, I, BLOCK_M, BLOCK_N, BLOCK_K, FP8)
    else:
        acc_g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k in range(0, Hd, BLOCK_K):
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
            wg = tl.load(wg_ptrs)
            wu = tl.load(wu_ptrs)
            if FP8:
                a_s, g_s, u_s = _linear1_scales(xs_ptr, w1s_ptr, e64, rows64, row_ok, col_block, k, Hd, I,
                                                BLOCK_N, BLOCK_K)
                acc_g += tl.dot(a, wg) * (a_s[:, None] * g_s)
                acc_u += tl.dot(a, wu) * (a_s[:, None] * u_s)
            else:
                acc_g = tl.dot(a, wg, acc_g)
                acc_u = tl.dot(a, wu, acc_u)
            a_ptrs += BLOCK_K
            wg_ptrs += BLOCK_K
            wu_ptrs += BLOCK_K
    wt = tl.load(meta_ptr + rows64 * META_FIELDS + 3, mask=row_ok, other=0).to(tl.float32, bitcast=True)  # [BM]
    h = acc_g * tl.sigmoid(acc_g) * acc_u * wt[:, None]                # [BM, BN] fp32
    h_ptrs = h_ptr + rows64[:, None] * I + cols[None, :]
    if FP8:  # 1 x 128 quantisation of the intermediate: BLOCK_N == 128, one scale per row of the tile
        scale = tl.maximum(tl.max(tl.abs(h), 1), FP8_AMAX_FLOOR) / FP8_MAX           # [BM]
        tl.store(h_ptrs, (h / scale[:, None]).to(h_ptr.dtype.element_ty), mask=row_ok[:, None])
        tl.store(hs_ptr + rows64 * (I // BLOCK_N) + col_block, scale, mask=row_ok)
    else:
        tl.store(h_ptrs, h.to(h_ptr.dtype.element_ty), mask=row_ok[:, None])
    tl.debug_barrier()                                                 # every warp's stores precede the release
    tl.atomic_add(counters_ptr + pool, 1, sem="release", scope="gpu")


@triton.jit
def _linear2_tile(h_ptr, hs_ptr, w2_ptr, w2s_ptr, meta_ptr, counters_ptr, combine_table, comb_ptr, status_ptr,
                  task, rank, expert, row0, row_end, col_block, pool, expected, max_polls, T, Hd, I,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FP8: tl.constexpr,
                  TMA: tl.constexpr = False):
    """Wait for the row block's Linear-1 tiles, y[rows, cols] = h W2^T, store each row into its source's combine.
    TMA: W2 through a tensor descriptor (:func:`_linear2_acc_tma`, bf16 or fp8); the epilogue is the same code."""
    wait_flag(counters_ptr + pool, expected, max_polls, status_ptr + task * STATUS_FIELDS, rank, task)
    rows = row0 + tl.arange(0, BLOCK_M)                                # [BM]
    row_ok = rows < row_end
    rows64 = rows.to(tl.int64)
    cols = col_block * BLOCK_N + tl.arange(0, BLOCK_N)                 # [BN] hidden columns
    ks = tl.arange(0, BLOCK_K)
    e64 = expert.to(tl.int64)
    a_ptrs = h_ptr + rows64[:, None] * I + ks[None, :]                # [BM, BK]
    w_ptrs = w2_ptr + e64 * Hd * I + cols[None, :] * I + ks[:, None]  # [BK, BN] W2 rows, transposed
    if TMA:
        acc = _linear2_acc_tma(a_ptrs, hs_ptr, w2s_ptr, rows64, row_ok, w2_ptr, e64, col_block, Hd, I,
                               BLOCK_M, BLOCK_N, BLOCK_K, FP8)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k in range(0, I, BLOCK_K):
            # .cg: the intermediate was written by other programs during this launch; read it from L2, not L1
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0, cache_modifier=".cg")
            w = tl.load(w_ptrs)
            if FP8:
                a_s, w_s = _linear2_scales(hs_ptr, w2s_ptr, e64, rows64, row_ok, col_block, k, Hd, I, BLOCK_N,
                                           BLOCK_K)
                acc += tl.dot(a, w) * (a_s[:, None] * w_s)
            else:
                acc = tl.dot(a, w, acc)
            a_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
    out = acc.to(comb_ptr.dtype.element_ty)                            # [BM, BN]
    src = tl.load(meta_ptr + rows64 * META_FIELDS + 0, mask=row_ok, other=0)   # [BM] source rank
    tok = tl.load(meta_ptr + rows64 * META_FIELDS + 1, mask=row_ok, other=0)   # [BM] source token
    slot = tl.load(meta_ptr + rows64 * META_FIELDS + 2, mask=row_ok, other=0)  # [BM] top-k slot
    base = tl.load(combine_table + src, mask=row_ok, other=0)          # [BM] int64 source's combine base
    base = base.to(tl.pointer_type(comb_ptr.dtype.element_ty))
    base = tl.multiple_of(base, 16)  # symmetric buffers are >= 16 B aligned (on the pointer, not the int64)
    dst = base + (slot.to(tl.int64) * T + tok) * Hd                    # [BM] row (slot, token) in its combine
    tl.store(dst[:, None] + cols[None, :], out, mask=row_ok[:, None])


@triton.jit
def _run_task(task, x_ptr, xs_ptr, w1_ptr, w1s_ptr, w2_ptr, w2s_ptr, h_ptr, hs_ptr, meta_ptr, offs_ptr, tasks_ptr,
              counters_ptr, combine_table, comb_ptr, status_ptr, ts_ptr, rank, T, Hd, I, expected, max_polls,
              BLOCK_M: tl.constexpr, BLOCK_N1: tl.constexpr, BLOCK_N2: tl.constexpr, BLOCK_K: tl.constexpr,
              FP8: tl.constexpr, TIMED: tl.constexpr, DEVICE: tl.constexpr, TMA: tl.constexpr = False):
    """One task of the list: a Linear-1 tile or a Linear-2 tile (with its wait and remote-store epilogue)."""
    tp = tasks_ptr + task * TASK_FIELDS
    kind = tl.load(tp + 0)
    expert = tl.load(tp + 1)
    row_block = tl.load(tp + 2)
    col_block = tl.load(tp + 3)
    pool = tl.load(tp + 4)
    row0 = tl.load(offs_ptr + expert) + row_block * BLOCK_M
    row_end = tl.load(offs_ptr + expert + 1)
    if TIMED:
        t0 = globaltimer(DEVICE)
    if kind == 0:
        _linear1_tile(x_ptr, xs_ptr, w1_ptr, w1s_ptr, h_ptr, hs_ptr, meta_ptr, counters_ptr,
                      expert, row0, row_end, col_block, pool, Hd, I, BLOCK_M, BLOCK_N1, BLOCK_K, FP8, TMA)
    else:
        _linear2_tile(h_ptr, hs_ptr, w2_ptr, w2s_ptr, meta_ptr, counters_ptr, combine_table, comb_ptr,
                      status_ptr, task, rank, expert, row0, row_end, col_block, pool, expected, max_polls,
                      T, Hd, I, BLOCK_M, BLOCK_N2, BLOCK_K, FP8, TMA)
    if TIMED:
        tl.debug_barrier()                                             # every warp has issued its stores
        tl.store(ts_ptr + task * 2, t0)
        tl.store(ts_ptr + task * 2 + 1, globaltimer(DEVICE))


@triton.jit
def _megamoe_program(x_ptr, xs_ptr, w1_ptr, w1s_ptr, w2_ptr, w2s_ptr, h_ptr, hs_ptr, meta_ptr, offs_ptr, tasks_ptr,
                     counters_ptr, combine_table, comb_ptr, status_ptr, ts_ptr, ticket_ptr, n_tasks, rank, T, Hd, I,
                     expected, max_polls, ticket_base,
                     BLOCK_M: tl.constexpr, BLOCK_N1: tl.constexpr, BLOCK_N2: tl.constexpr, BLOCK_K: tl.constexpr,
                     FP8: tl.constexpr, TIMED: tl.constexpr, DEVICE: tl.constexpr, DYNAMIC: tl.constexpr,
                     TMA: tl.constexpr):
    """One program's walk over the task list (the arguments: :func:`megamoe_kernel`'s)."""
    if DYNAMIC:
        # Tasks are claimed in list order, so every task before a claimed one is claimed by a running program:
        # with all programs resident a Linear-2 wait always ends (its producers come earlier in the list).
        # Every program draws until it gets a ticket past the list: n_tasks + programs tickets per launch.
        task = tl.atomic_add(ticket_ptr, 1) - ticket_base
        while task < n_tasks:
            _run_task(task, x_ptr, xs_ptr, w1_ptr, w1s_ptr, w2_ptr, w2s_ptr, h_ptr, hs_ptr, meta_ptr, offs_ptr,
                      tasks_ptr, counters_ptr, combine_table, comb_ptr, status_ptr, ts_ptr, rank, T, Hd, I,
                      expected, max_polls, BLOCK_M, BLOCK_N1, BLOCK_N2, BLOCK_K, FP8, TIMED, DEVICE, TMA)
            task = tl.atomic_add(ticket_ptr, 1) - ticket_base
    else:
        pid = tl.program_id(0)
        n_prog = tl.num_programs(0)
        for task in range(pid, n_tasks, n_prog):                       # task i -> program i % n_programs
            _run_task(task, x_ptr, xs_ptr, w1_ptr, w1s_ptr, w2_ptr, w2s_ptr, h_ptr, hs_ptr, meta_ptr, offs_ptr,
                      tasks_ptr, counters_ptr, combine_table, comb_ptr, status_ptr, ts_ptr, rank, T, Hd, I,
                      expected, max_polls, BLOCK_M, BLOCK_N1, BLOCK_N2, BLOCK_K, FP8, TIMED, DEVICE, TMA)


# Integers that change between launches (the epoch every launch) are not specialised: one compile per variant.
@triton.jit(do_not_specialize=["n_tasks", "rank", "T", "expected", "max_polls", "ticket_base"])
def megamoe_kernel(
    x_ptr, xs_ptr,         # [R, Hd] received rows; [R, Hd/128] fp32 scales (FP8; else any pointer)
    w1_ptr, w1s_ptr,       # [El, 2I, Hd]; [El, 2I/128, Hd/128] (FP8)
    w2_ptr, w2s_ptr,       # [El, Hd, I]; [El, Hd/128, I/128] (FP8)
    h_ptr, hs_ptr,         # [R, I] intermediate; [R, I/128] (FP8)
    meta_ptr,              # int32 [R, 4]
    offs_ptr,              # int32 [El + 1] expert row offsets
    tasks_ptr,             # int32 [n_tasks, 5]
    counters_ptr,          # int32 [pool blocks] Linear-1 tiles done per row block (cumulative over launches)
    combine_table,         # int64 [P] every rank's combine buffer address
    comb_ptr,              # this rank's combine buffer (its element type is the output's)
    status_ptr,            # int64 [n_tasks, 6] Linear-2 waits
    ts_ptr,                # int64 [n_tasks, 2] (TIMED)
    ticket_ptr,            # int32 [1] DYNAMIC: the next task's ticket (cumulative over launches)
    n_tasks, rank, T, Hd, I,
    expected,              # counter value meaning "all Linear-1 tiles of the row block done in this launch"
    max_polls,             # bound on every wait
    ticket_base,           # DYNAMIC: the ticket of this launch's task 0 (each launch draws n_tasks + programs)
    BLOCK_M: tl.constexpr, BLOCK_N1: tl.constexpr, BLOCK_N2: tl.constexpr, BLOCK_K: tl.constexpr,
    FP8: tl.constexpr, TIMED: tl.constexpr, DEVICE: tl.constexpr,
    DYNAMIC: tl.constexpr = False,  # programs claim the next task of the list (atomic ticket) instead of i % n
):
    _megamoe_program(x_ptr, xs_ptr, w1_ptr, w1s_ptr, w2_ptr, w2s_ptr, h_ptr, hs_ptr, meta_ptr, offs_ptr, tasks_ptr,
                     counters_ptr, combine_table, comb_ptr, status_ptr, ts_ptr, ticket_ptr, n_tasks, rank, T, Hd, I,
                     expected, max_polls, ticket_base, BLOCK_M, BLOCK_N1, BLOCK_N2, BLOCK_K, FP8, TIMED, DEVICE,
                     DYNAMIC, False)


@triton.jit(do_not_specialize=["n_tasks", "rank", "T", "expected", "max_polls", "ticket_base"])
def megamoe_tma_kernel(
    x_ptr, xs_ptr, w1_ptr, w1s_ptr, w2_ptr, w2s_ptr, h_ptr, hs_ptr, meta_ptr, offs_ptr, tasks_ptr, counters_ptr,
    combine_table, comb_ptr, status_ptr, ts_ptr, ticket_ptr, n_tasks, rank, T, Hd, I, expected, max_polls,
    ticket_base, BLOCK_M: tl.constexpr, BLOCK_N1: tl.constexpr, BLOCK_N2: tl.constexpr, BLOCK_K: tl.constexpr,
    FP8: tl.constexpr, TIMED: tl.constexpr, DEVICE: tl.constexpr, DYNAMIC: tl.constexpr = False,
):
    """:func:`megamoe_kernel` (the same arguments) with the TMA main loops (:func:`_linear1_acc_tma`,
    :func:`_linear2_acc_tma`): bf16 / fp16, and fp8 e4m3 with its scales; the default of both on GPUs. A kernel of its own, so that the pointer loops' signature and compiled code stay as they
    were."""
    _megamoe_program(x_ptr, xs_ptr, w1_ptr, w1s_ptr, w2_ptr, w2s_ptr, h_ptr, hs_ptr, meta_ptr, offs_ptr, tasks_ptr,
                     counters_ptr, combine_table, comb_ptr, status_ptr, ts_ptr, ticket_ptr, n_tasks, rank, T, Hd, I,
                     expected, max_polls, ticket_base, BLOCK_M, BLOCK_N1, BLOCK_N2, BLOCK_K, FP8, TIMED, DEVICE,
                     DYNAMIC, True)


@triton.jit(do_not_specialize=["rank", "n_items"])
def dispatch_push_kernel(
    x_ptr,                 # [T, Hd] this rank's token rows (raw bits: the host passes an integer view); ITEMS: any
    #                        tensor of the rows' raw element type (only its type is used)
    xs_ptr,                # fp32 [T, Hd/128] activation scales (FP8); ITEMS: int64 [P] each source's scales
    dest_ptr,              # int32 [T*K, 2] per (token, slot) item: destination rank, destination row; ITEMS: int32
    #                        [n_items, 6] per item: source rank, token, slot, owner rank, owner's row, weight bits
    wbits_ptr,             # int32 [T*K] router weight (float32 bits) per item; ITEMS: int64 [P] each source's token
    #                        rows [T, Hd] (raw bits; 0 where no source is played here)
    x_table,               # int64 [P] every rank's receive rows [cap, Hd]
    xs_table,              # int64 [P] every rank's receive scales [cap, Hd/128] (FP8)
    meta_table,            # int64 [P] every rank's receive meta [cap, 4] int32
    rank, n_items, K, Hd,
    BLOCK_R: tl.constexpr,  # items per program
    BLOCK_H: tl.constexpr,  # columns per store step (divides Hd)
    SCALE_COLS: tl.constexpr,  # power of two >= Hd / 128 (FP8)
    FP8: tl.constexpr,
    ITEMS: tl.constexpr = False,  # an item list instead of one source's (token, slot) range (xstage.traffic)
):
    """Push each (token, slot) item's row, meta and scales into the receive buffer of the expert's owner rank.
    ITEMS (8-rank traffic on 2 GPUs, ``xstage.traffic.push``: one GPU pushes the rows of several sources and skips
    items): each item of ``dest_ptr`` names its source rank, token, slot, owner and row, its row and scales read
    from that source's through the tables ``wbits_ptr`` / ``xs_ptr`` (``rank`` and ``K`` unused). The plain branch
    compiles to the kernel it was before ITEMS existed (same PTX for sm_90, tests/test_traffic8.py)."""
    pid = tl.program_id(0)
    items = pid * BLOCK_R + tl.arange(0, BLOCK_R)                      # [BR] (token, slot) items
    ok = items < n_items
    if ITEMS:
        it = dest_ptr + items.to(tl.int64) * ITEM_FIELDS
        src_rank = tl.load(it + 0, mask=ok, other=0)                   # [BR]
        tok = tl.load(it + 1, mask=ok, other=0)
        slot = tl.load(it + 2, mask=ok, other=0)
        d_rank = tl.load(it + 3, mask=ok, other=0)
        d_row = tl.load(it + 4, mask=ok, other=0).to(tl.int64)
        wbits = tl.load(it + 5, mask=ok, other=0)
        tok64 = tok.to(tl.int64)
    else:
        tok = items // K
        slot = items - tok * K
        tok64 = tok.to(tl.int64)
        d_rank = tl.load(dest_ptr + items * 2, mask=ok, other=0)       # [BR]
        d_row = tl.load(dest_ptr + items * 2 + 1, mask=ok, other=0).to(tl.int64)
    xb = tl.load(x_table + d_rank, mask=ok, other=0).to(tl.pointer_type(x_ptr.dtype.element_ty))
    xb = tl.multiple_of(xb, 16)
    cols = tl.arange(0, BLOCK_H)
    if ITEMS:
        sb = tl.load(wbits_ptr + src_rank, mask=ok, other=0).to(tl.pointer_type(x_ptr.dtype.element_ty))
        sb = tl.multiple_of(sb, 16)
        src = sb[:, None] + tok64[:, None] * Hd + cols[None, :]        # [BR, BH] each item's source's rows
    else:
        src = x_ptr + tok64[:, None] * Hd + cols[None, :]              # [BR, BH]
    dst = xb[:, None] + d_row[:, None] * Hd + cols[None, :]            # [BR, BH] owner's receive rows
    for h in range(0, Hd, BLOCK_H):
        tl.store(dst + h, tl.load(src + h, mask=ok[:, None]), mask=ok[:, None])
    mb = tl.load(meta_table + d_rank, mask=ok, other=0).to(tl.pointer_type(tl.int32)) + d_row * META_FIELDS
    if ITEMS:
        tl.store(mb + 0, src_rank, mask=ok)
        tl.store(mb + 1, tok, mask=ok)
        tl.store(mb + 2, slot, mask=ok)
        tl.store(mb + 3, wbits, mask=ok)
    else:
        tl.store(mb + 0, tok * 0 + rank, mask=ok)
        tl.store(mb + 1, tok, mask=ok)
        tl.store(mb + 2, slot, mask=ok)
        tl.store(mb + 3, tl.load(wbits_ptr + items, mask=ok, other=0), mask=ok)
    if FP8:
        n_sc = Hd // FP8_BLOCK
        sc = tl.arange(0, SCALE_COLS)
        smask = ok[:, None] & (sc[None, :] < n_sc)
        sb = tl.load(xs_table + d_rank, mask=ok, other=0).to(tl.pointer_type(tl.float32))
        if ITEMS:
            ssb = tl.load(xs_ptr + src_rank, mask=ok, other=0).to(tl.pointer_type(tl.float32))
            s = tl.load(ssb[:, None] + tok64[:, None] * n_sc + sc[None, :], mask=smask)
        else:
            s = tl.load(xs_ptr + tok64[:, None] * n_sc + sc[None, :], mask=smask)
        tl.store(sb[:, None] + d_row[:, None] * n_sc + sc[None, :], s, mask=smask)
