"""Ulysses attention: a FlashAttention forward whose epilogue sends each output tile to the rank that owns it.

Ulysses sequence parallelism shards the sequence over P ranks; a pre-attention all-to-all gives every rank the
full sequence for H/P heads, attention runs locally, and a post-attention all-to-all returns every rank its
own sequence rows for all H heads. Here that post-attention all-to-all is fused into the attention kernel tile
by tile: the program that finishes an output tile [BLOCK_M rows, one head] stores it straight into the owning
rank's output buffer through a symmetric-memory peer pointer and goes back to computing its next tile. There
is no communication warp or program: the stores drain through NVLink (the X-Stage) while the SM computes, so
the all-to-all hides behind attention as long as bursts stay below the link's outstanding capacity. It wins
over attention-then-all-to-all when the all-to-all is a sizeable share of the layer (short and medium
sequences); at long sequences the fused kernel approaches attention alone.

Version ladder (each a figure's bar, each selected by constexprs of one kernel):
  1. FUSED=False: plain FlashAttention forward (online softmax in base 2, as triton-lang's 06 tutorial),
     output in this rank's layout [S, Hc, D]; "our attention alone", and the first half of the serial baseline.
  2. FUSED=True: the same compute; the epilogue routes each row to its owner rank (row // Sl) and local row
     (row % Sl) through a table of every rank's output base address, so a tile that straddles two ranks (Sl
     not a multiple of BLOCK_M) is split row by row.
  +  TIMED (either variant): the global timer at each program's start and after its last store was issued
     (CTA barrier first); sender-visible time = max(last store) - min(start) over programs.

Launch levers (``xstage.ulysses.AttnConfig``; the same arithmetic under each, picked per shape by
``xstage.ulysses_sweep.tune_config``): the query / key block sizes BM x BN, warps and pipeline stages; K/V through
Hopper TMA tensor descriptors instead of pointer loads (bulk tensor loads: fewer registers and address
instructions in the inner loop); a persistent grid (one program per SM walking tiles); a software-pipelined key
loop (block j+1's scores issued before block j's softmax); the softmax scale folded into q once per tile; a
register cap per thread. The Hopper forward with asynchronous wgmma and warp specialisation is the Gluon kernel
(kernels/attention_gluon.py); measured numbers live in the records (xstage/records.py) and docs/ulysses.md.

A separate one-program kernel (``sync.epoch_barrier_kernel``) ends the fused layer: each rank releases its epoch
into every peer's flag slot (system scope) and waits (acquire, bounded) for every peer's, so "output complete
everywhere" has a time and a failure to arrive has a report instead of a hang.

Legend: S = sequence length (all of it), P = ranks, H = heads of the layer, Hl = H / P heads per rank,
Hc = heads of one launch (Hl, or a chunk of them), D = head dim (64 or 128), Sl = S / P sequence rows per rank,
BM / BN = query / key rows per block.

Layouts (row-major, contiguous, element strides):
  q, k, v    [S, Hl, D]  this rank's heads over the full sequence (after the pre-attention all-to-all)
  out local  [S, Hc, D]  FUSED=False: heads h_start .. h_start + Hc of this rank
  out[r]     [Sl, H, D]  FUSED=True: rank r's symmetric output; this rank's head h lands at global head
                         rank * Hl + h; rank r owns sequence rows [r * Sl, (r + 1) * Sl)
  out_table  [P] int64   every rank's out base address, valid in this process (peer pointers)
  Kd, Vd     TMA only: host tensor descriptors over k, v viewed [S, Hl*D] (block [BN, D], the head at column
             h*D); Hopper's bulk tensor loads replace per-thread pointer loads (fewer registers and address
             instructions in the inner loop). Same arithmetic either way.
  ts         [n_programs, 2] int64 global-timer ns (program start, after its last store), TIMED only
Every program handles one (query block, head): program (m, h) has linear id h * cdiv(S, BM) + m, so
consecutive programs share a head and its K/V stay in L2. PERSISTENT: a 1-D grid of min(tiles, SMs) programs;
program p handles tiles p, p + grid, ... (tile t = that linear id), same tile body; ``ts`` is indexed by tile.

Under Triton's interpreter (``DEVICE=False``) there are no timers (timestamps are 0) and no fences; the data
path is the same. bf16 ``tl.dot`` is wrong in the interpreter: test there in fp16 or fp32.
"""
import triton
import triton.language as tl

from .sync import globaltimer

LOG2E = 1.4426950408889634  # softmax(x) = exp2(x * log2(e) - max): the launcher folds log2(e) into the scale


@triton.jit
def _scores(q, K, Kd, col, start_n, S, row_stride, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
            MASK_N: tl.constexpr, TMA: tl.constexpr):
    """q K^T of one key block: [BM, BN] fp32 (unscaled; keys past S score -inf when MASK_N). TMA: the K block
    comes through the tensor descriptor Kd over [S, Hl*D] at column ``col`` (rows past S read as 0); otherwise
    through the pointer K (this head's first element)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)                           # [BN] key rows
    offs_d = tl.arange(0, HEAD_DIM)                                    # [D]
    key_ok = offs_n < S
    if TMA:
        k = Kd.load([start_n, col])                                    # [BN, D]
    else:
        kv = offs_n[:, None] * row_stride + offs_d[None, :]            # [BN, D] element offsets from this head
        if MASK_N:  # the last, partial key block (S % BN != 0): missing keys load 0 and score -inf
            k = tl.load(K + kv, mask=key_ok[:, None], other=0.0)      # [BN, D]
        else:
            k = tl.load(K + kv)
    qk = tl.dot(q, tl.trans(k))                                        # [BM, BN] fp32
    if MASK_N:
        qk = tl.where(key_ok[None, :], qk, float("-inf"))
    return qk


@triton.jit
def _online_softmax(acc, l_i, m_i, qk, qk_scale, SCALE_Q: tl.constexpr):
    """One key block's step of the online softmax (base 2): the block's probabilities p [BM, BN], the rescaled
    acc [BM, D] and row sums l_i [BM], the new running max [BM]. SCALE_Q: the scores are already scaled."""
    if SCALE_Q:
        m_new = tl.maximum(m_i, tl.max(qk, 1))                         # [BM]
        p = tl.math.exp2(qk - m_new[:, None])                          # [BM, BN]
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)              # [BM]
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])               # [BM, BN]
    alpha = tl.math.exp2(m_i - m_new)                                  # [BM] rescale of what came before
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    return p, acc, l_i, m_new


@triton.jit
def _softmax_pv(acc, l_i, m_i, qk, V, Vd, col, start_n, S, row_stride, qk_scale, HEAD_DIM: tl.constexpr,
                BLOCK_N: tl.constexpr, MASK_N: tl.constexpr, TMA: tl.constexpr, SCALE_Q: tl.constexpr):
    """The online softmax of one key block's scores ``qk`` [BM, BN], then P V into acc[BM, D]: l_i[BM] (row
    sums), m_i[BM] (running max, base 2). SCALE_Q: the scores are already scaled (q was multiplied by
    ``qk_scale``), so no multiply here."""
    offs_n = start_n + tl.arange(0, BLOCK_N)                           # [BN]
    offs_d = tl.arange(0, HEAD_DIM)                                    # [D]
    p, acc, l_i, m_new = _online_softmax(acc, l_i, m_i, qk, qk_scale, SCALE_Q)
    if TMA:
        v = Vd.load([start_n, col])                                    # [BN, D]
    else:
        kv = offs_n[:, None] * row_stride + offs_d[None, :]
        if MASK_N:
            v = tl.load(V + kv, mask=(offs_n < S)[:, None], other=0.0)
        else:
            v = tl.load(V + kv)
    acc = tl.dot(p.to(v.dtype), v, acc)                                # [BM, D] fp32
    return acc, l_i, m_new


@triton.jit
def _attend_block(acc, l_i, m_i, q, K, V, Kd, Vd, col, start_n, S, row_stride, qk_scale,
                  HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASK_N: tl.constexpr, TMA: tl.constexpr,
                  SCALE_Q: tl.constexpr):
    """One key block of the online softmax: acc[BM, D], l_i[BM] (row sums), m_i[BM] (running max, base 2).
    TMA: K/V blocks come through tensor descriptors Kd/Vd over [S, Hl*D] at column ``col`` (rows past S read
    as 0); otherwise through pointers K/V (this head's first element). K and V are both loaded before the
    scores (the order the software pipeliner is given, so V's load overlaps the scores and the softmax).
    SCALE_Q: the scores are already scaled."""
    offs_n = start_n + tl.arange(0, BLOCK_N)                           # [BN] key rows
    offs_d = tl.arange(0, HEAD_DIM)                                    # [D]
    key_ok = offs_n < S
    if TMA:
        k = Kd.load([start_n, col])                                    # [BN, D]
        v = Vd.load([start_n, col])
    else:
        kv = offs_n[:, None] * row_stride + offs_d[None, :]            # [BN, D] element offsets from this head
        if MASK_N:  # the last, partial key block (S % BN != 0): missing keys load 0 and score -inf
            k = tl.load(K + kv, mask=key_ok[:, None], other=0.0)      # [BN, D]
            v = tl.load(V + kv, mask=key_ok[:, None], other=0.0)      # [BN, D]
        else:
            k = tl.load(K + kv)
            v = tl.load(V + kv)
    qk = tl.dot(q, tl.trans(k))                                        # [BM, BN] fp32
    if MASK_N:
        qk = tl.where(key_ok[None, :], qk, float("-inf"))
    p, acc, l_i, m_new = _online_softmax(acc, l_i, m_i, qk, qk_scale, SCALE_Q)
    acc = tl.dot(p.to(v.dtype), v, acc)                                # [BM, D] fp32
    return acc, l_i, m_new


@triton.jit
def _tile(Q, K_h, V_h, Kd, Vd, out_ptr, out_table, ts_ptr, pid_m, pid_h, tile_id, S, rows_per_rank, in_row_stride,
          out_row_stride, h, out_head0, qk_scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
          BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr, FUSED: tl.constexpr, TIMED: tl.constexpr,
          DEVICE: tl.constexpr, TMA: tl.constexpr, WS: tl.constexpr, PIPE: tl.constexpr, SCALE_Q: tl.constexpr):
    """One output tile [BLOCK_M query rows of head h]: the online softmax over every key block, then the
    epilogue (this rank's layout, or row by row to the owner ranks); ``tile_id`` indexes the timestamps."""
    if TIMED:
        t_start = globaltimer(DEVICE)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)                   # [BM] query rows
    offs_d = tl.arange(0, HEAD_DIM)                                    # [D]
    row_ok = offs_m < S                                                # [BM]
    head_off = h * HEAD_DIM
    q = tl.load(Q + head_off + offs_m[:, None] * in_row_stride + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)                       # [BM, D]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)                # [BM]
    l_i = tl.zeros([BLOCK_M], tl.float32)                              # [BM]
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)                    # [BM, D]
    if SCALE_Q:  # the softmax scale folded into q once per tile (bf16: q * scale rounded; ~2^-9 relative)
        q = (q.to(tl.float32) * qk_scale).to(Q.dtype.element_ty)
    n_full = S - S % BLOCK_N
    if PIPE:
        # software-pipelined key loop (FA3's intra-warpgroup overlap written in the source): the scores of key
        # block j + 1 are issued before block j's softmax, so the tensor cores compute q K_{j+1}^T while the
        # softmax of block j runs; same arithmetic per block, so the same bits as without it
        if n_full > 0:
            qk = _scores(q, K_h, Kd, head_off, 0, S, in_row_stride, HEAD_DIM, BLOCK_N, False, TMA)
            for start_n in tl.range(BLOCK_N, n_full, BLOCK_N, warp_specialize=WS):
                qk_next = _scores(q, K_h, Kd, head_off, start_n, S, in_row_stride, HEAD_DIM, BLOCK_N, False, TMA)
                acc, l_i, m_i = _softmax_pv(acc, l_i, m_i, qk, V_h, Vd, head_off, start_n - BLOCK_N, S,
                                            in_row_stride, qk_scale, HEAD_DIM, BLOCK_N, False, TMA, SCALE_Q)
                qk = qk_next
            acc, l_i, m_i = _softmax_pv(acc, l_i, m_i, qk, V_h, Vd, head_off, n_full - BLOCK_N, S, in_row_stride,
                                        qk_scale, HEAD_DIM, BLOCK_N, False, TMA, SCALE_Q)
    else:
        # WS: Triton's warp specialisation of the key loop (loads in a producer partition, the MMAs and the
        # softmax in consumer partitions); same arithmetic, so the same bits as without it
        for start_n in tl.range(0, n_full, BLOCK_N, warp_specialize=WS):
            acc, l_i, m_i = _attend_block(acc, l_i, m_i, q, K_h, V_h, Kd, Vd, head_off, start_n, S, in_row_stride,
                                          qk_scale, HEAD_DIM, BLOCK_N, False, TMA, SCALE_Q)
    if not EVEN_N:
        acc, l_i, m_i = _attend_block(acc, l_i, m_i, q, K_h, V_h, Kd, Vd, head_off, n_full, S, in_row_stride,
                                      qk_scale, HEAD_DIM, BLOCK_N, True, TMA, SCALE_Q)
    o = (acc / l_i[:, None]).to(Q.dtype.element_ty)                    # [BM, D]
    col = (out_head0 + pid_h) * HEAD_DIM                               # output head's first element in a row
    if FUSED:
        # Route row by row: owner rank and its local row; a tile straddling two ranks splits here.
        dest = offs_m // rows_per_rank                                 # [BM] owner rank
        local_row = offs_m - dest * rows_per_rank                      # [BM] row in the owner's out[Sl, H, D]
        base = tl.load(out_table + dest, mask=row_ok, other=0)         # [BM] int64 owner's base address
        base = base.to(tl.pointer_type(Q.dtype.element_ty))            # [BM] peer pointers
        base = tl.multiple_of(base, 16)  # symmetric buffers are >= 16 B aligned: 16-byte stores (on the pointer,
        #                                  not the int64: the hint does not survive the int -> pointer cast)
        row_ptr = base + local_row * out_row_stride + col              # [BM] row starts in the owners' out
        tl.store(row_ptr[:, None] + offs_d[None, :], o, mask=row_ok[:, None])
    else:
        tl.store(out_ptr + offs_m[:, None] * out_row_stride + col + offs_d[None, :], o, mask=row_ok[:, None])
    if TIMED:
        tl.debug_barrier()                                             # every warp has issued its stores
        t_end = globaltimer(DEVICE)
        tl.store(ts_ptr + tile_id * 2, t_start)
        tl.store(ts_ptr + tile_id * 2 + 1, t_end)


@triton.jit
def ulysses_attention_kernel(
    Q, K, V,               # *T [S, Hl, D]
    Kd, Vd,                # TMA: tensor descriptors over K, V viewed [S, Hl*D], block [BLOCK_N, D]; else None
    out_ptr,               # FUSED=False: *T [S, Hc, D] (this launch's heads); FUSED=True: unused (pass q)
    out_table,             # *int64 [P]: every rank's out[Sl, H, D] base address (FUSED); unused otherwise
    ts_ptr,                # *int64 [n_tiles, 2] global timer ns: tile start, after its last store (TIMED)
    S,                     # sequence length
    rows_per_rank,         # Sl = S / P (FUSED)
    in_row_stride,         # Hl * D: elements between consecutive sequence rows of q, k, v
    out_row_stride,        # Hc * D (plain) or H * D (fused)
    h_start,               # this launch's first head within the rank's Hl (grid axis 1 covers Hc heads)
    out_head0,             # output head of this launch's first head: 0 (plain), rank * Hl + h_start (fused)
    qk_scale,              # sm_scale * log2(e)
    n_heads,               # Hc: heads of this launch (PERSISTENT: the tile count is cdiv(S, BM) * Hc)
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVEN_N: tl.constexpr,  # S % BLOCK_N == 0: no key masking at all
    FUSED: tl.constexpr,   # epilogue stores each row into its owner rank's buffer (peer pointers)
    TIMED: tl.constexpr,   # record the tile's start and last-store times
    DEVICE: tl.constexpr,  # real GPU (timers are inline PTX); False under the interpreter
    TMA: tl.constexpr = False,  # K/V through tensor descriptors (Hopper TMA loads) instead of pointers
    WS: tl.constexpr = False,   # warp-specialised key loop (tl.range(..., warp_specialize=True))
    PERSISTENT: tl.constexpr = False,  # a 1-D grid of <= SMs programs, each looping over tiles t = pid, pid + grid..
    PIPE: tl.constexpr = False,        # software-pipelined key loop: block j+1's q K^T issued before block j's softmax
    SCALE_Q: tl.constexpr = False,     # the softmax scale (times log2 e) folded into q once per tile
):
    n_m = tl.cdiv(S, BLOCK_M)
    if PERSISTENT:
        for t in tl.range(tl.program_id(0), n_m * n_heads, tl.num_programs(0)):
            pid_h = t // n_m
            pid_m = t - pid_h * n_m
            h = h_start + pid_h
            _tile(Q, K + h * HEAD_DIM, V + h * HEAD_DIM, Kd, Vd, out_ptr, out_table, ts_ptr, pid_m, pid_h, t, S,
                  rows_per_rank, in_row_stride, out_row_stride, h, out_head0, qk_scale, HEAD_DIM, BLOCK_M,
                  BLOCK_N, EVEN_N, FUSED, TIMED, DEVICE, TMA, WS, PIPE, SCALE_Q)
    else:
        pid_m = tl.program_id(0)
        pid_h = tl.program_id(1)
        h = h_start + pid_h
        _tile(Q, K + h * HEAD_DIM, V + h * HEAD_DIM, Kd, Vd, out_ptr, out_table, ts_ptr, pid_m, pid_h,
              pid_h * n_m + pid_m, S, rows_per_rank, in_row_stride, out_row_stride, h, out_head0, qk_scale,
              HEAD_DIM, BLOCK_M, BLOCK_N, EVEN_N, FUSED, TIMED, DEVICE, TMA, WS, PIPE, SCALE_Q)
