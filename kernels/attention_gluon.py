"""Our attention forward in Gluon for Hopper (sm_90): asynchronous wgmma, so the softmax runs under the tensor cores.

Why Gluon: Triton 3.6's ``tl.dot`` waits for every wgmma group right after issuing it (``wgmma.wait_group 0``
after each commit, docs/findings.md), so in kernels/attention.py the softmax of a key block
never overlaps a GEMM. Gluon (``triton.experimental.gluon``, in Triton 3.6) exposes the wgmma token
(``warpgroup_mma(..., is_async=True)``, ``warpgroup_mma_wait(num_outstanding, deps)``), the TMA engine and
mbarriers, so the schedule is written out (FA3's intra-warpgroup overlap):

    S_0 = Q K_0^T ; softmax(S_0) -> P_0
    for j = 1 .. n-1:
        issue S_j = Q K_j^T            (async)
        issue O  += P_{j-1} V_{j-1}    (async, P from registers)
        wait until only the second is outstanding   -> S_j is in registers
        softmax(S_j) -> P_j, alpha_j   (runs while the tensor cores do P_{j-1} V_{j-1})
        wait for P_{j-1} V_{j-1}; O *= alpha_j
        every warp of the CTA is past both reads: K_j's and V_{j-1}'s ring slots are refilled (TMA)
    O += P_{n-1} V_{n-1}; O /= l

The same online softmax in base 2 as kernels/attention.py (scores times ``qk_scale`` = sm_scale * log2 e inside
the exp2, one FFMA per score; running max ``m``, row sums ``l``); the summation order differs from the Triton
kernel's (different MMA shapes and overlap), so the two agree to bf16 rounding, not bit for bit: the checks are
against a float32 reference.

I/O contract (kernels/attention.py's forward, ``xstage.ulysses_gluon.attention_forward``): q, k, v [S, Hl, D] bf16
contiguous, D 64 or 128, non-causal; out [S, Hl, D] bf16; optional lse [Hl, S] float32 (natural log of the softmax
denominator, with the scale applied: lse = log sum_j exp(sm_scale * q k_j)).

Tiles: one CTA = BLOCK_M query rows of one head; ``num_warps`` warps stacked along the rows (8 warps = two
warpgroups of 64 rows each at BLOCK_M 128); K/V blocks of BLOCK_N keys through a ring of STAGES shared-memory
slots filled by TMA (descriptors over [S, Hl * D], the head at column h * D: rows past S read as zero; their
scores are masked to -inf when S % BLOCK_N != 0). Q is loaded once by TMA; its shared buffer stages the output
tile for the TMA store (rows past S are clipped by the store). Program (m, h) has linear id h * cdiv(S, BM) + m,
as in kernels/attention.py (consecutive programs share a head's K/V in L2).

Two kernels:
- ``gluon_attention_kernel``, one partition: ``num_warps`` warps (one or two warpgroups) run the loop above in step;
  the default tile (``xstage.ulysses_gluon.CONFIGS``).
- ``gluon_attention_ws_kernel``, warp-specialised (FA3 / FA4's CTA): a one-warp TMA loader and NC = BLOCK_M / 64
  consumer warpgroups (two at D = 128, three with FA4's 192-row tile at D = 64), each running the loop on its own 64
  rows over a shared K/V ring. Its constexprs: ``MASK_LAST`` (3: the key blocks last to first, so the one block
  with keys past S is each consumer's first, outside the overlapped loop), ``PINGPONG`` (the consumers issue their
  GEMMs in turn, the turns in hardware named barriers), ``PERSISTENT`` (at most one CTA per SM walking tiles, the
  output staged apart from Q so the next tile loads under this one's epilogue), ``JOINT`` (one release per ring
  slot, after the P V that read its V), ``FUSED`` (the Ulysses post-attention all-to-all in the epilogue: each
  output row stored to its owner rank through a table of addresses). The measured ladder of these tiles is
  ``xstage.ulysses_gluon.LADDER``; its numbers are in docs/attention.md and docs/findings.md.

In the one-partition kernel every wait is on hardware that completes by itself (TMA byte counts, wgmma groups); no
wait depends on another CTA. The warp-specialised kernel's waits depend on its other partitions' arrivals (ring
slots) and are unbounded (Gluon 3.6's ``mbarrier.wait`` has no bound, and a try_wait loop in inline PTX would need
the barrier's shared-memory address, which Gluon does not hand to ``inline_asm_elementwise``); so are the
ping-pong's named-barrier turns (``bar.sync`` has no bound in hardware). It is kept off the default path
(``xstage.ulysses_gluon.CONFIGS``; the Ulysses sweep's Gluon methods run it, ``SWEEP_CONFIGS``), and every GPU call
runs it under a process timeout. Gluon does not run under Triton's CPU interpreter: ``AVAILABLE`` is False there (and where this
Triton has no Gluon for Hopper), and the launcher says so in one line before any launch.
"""
try:  # Gluon's Hopper language: Triton >= 3.5 (the GPU machine has 3.6)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                  warpgroup_mma_wait)
    # the TMA copies' names: Triton 3.6 (the GPU machine) async_copy_global_to_shared / async_copy_shared_to_global;
    # later Triton (3.9 on the CPU machines, for the sm_90a compile test) async_load / async_store
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    _tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    _cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier     # 3.6: thread_barrier; later: barrier
    AVAILABLE, WHY = True, ""
except Exception as _e:  # noqa: BLE001 (ImportError, or an older Triton's different Gluon)
    AVAILABLE, WHY = False, f"{type(_e).__name__}: {_e}"

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

if AVAILABLE:
    @gluon.jit
    def _issue_kv(desc, ring, bars, block, row0, col, STAGES: gl.constexpr, pred):
        """TMA of key block ``block`` (rows row0 .. row0 + BLOCK_N of column ``col``) into its ring slot."""
        slot = block % STAGES
        bar = bars.index(slot)
        mbarrier.expect(bar, desc.block_type.nbytes, pred=pred)
        _tma_load(desc, [row0, col], bar, ring.index(slot), pred=pred)

    @gluon.jit
    def _wait_kv(bars, block, STAGES: gl.constexpr):
        mbarrier.wait(bars.index(block % STAGES), (block // STAGES) & 1)

    @gluon.jit
    def _softmax_step(s, m_i, l_i, start_n, S, qk_scale, s_layout: gl.constexpr, BLOCK_N: gl.constexpr,
                      EVEN_N: gl.constexpr, MASK_LAST: gl.constexpr = False):
        """One key block's online-softmax step on raw scores ``s`` [BM, BN] fp32: (p fp32, alpha, m_new, l_new);
        alpha rescales what came before. Keys past S score -inf (S % BLOCK_N != 0): in every block, or with
        MASK_LAST only in the block that holds them (a uniform branch)."""
        if not EVEN_N:
            if MASK_LAST:
                if start_n + BLOCK_N > S:
                    offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
                    s = gl.where(gl.expand_dims(offs_n < S, 0), s, float("-inf"))
            else:
                offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
                s = gl.where(gl.expand_dims(offs_n < S, 0), s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
        alpha = gl.exp2(m_i - m_new)
        l_new = l_i * alpha + gl.sum(p, 1)
        return p, alpha, m_new, l_new

    @gluon.jit
    def gluon_attention_kernel(q_desc, k_desc, v_desc, o_desc, lse_ptr, S, Hl, qk_scale,
                               HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                               STAGES: gl.constexpr, EVEN_N: gl.constexpr, WRITE_LSE: gl.constexpr,
                               num_warps: gl.constexpr, MASK_LAST: gl.constexpr = False):
        """One (query block, head) per CTA; see the module docstring. Descriptors over [S, Hl * D]: q/o blocks
        [BLOCK_M, D], k/v blocks [BLOCK_N, D]. lse_ptr: *fp32 [Hl, S] (WRITE_LSE)."""
        n_m = gl.cdiv(S, BLOCK_M)
        pid = gl.program_id(0)
        h = pid // n_m
        off_m = (pid - h * n_m) * BLOCK_M
        col = h * HEAD_DIM
        dtype: gl.constexpr = q_desc.dtype

        # wgmma layouts: warps stacked along the rows (16 rows each), instruction N = the tile's N
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                           instr_shape=[16, HEAD_DIM, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_desc.layout)
        k_ring = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
        v_ring = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_bars.index(i), count=1)
            mbarrier.init(v_bars.index(i), count=1)
        fence_async_shared()

        n_blocks = gl.cdiv(S, BLOCK_N)
        mbarrier.expect(q_bar, q_desc.block_type.nbytes)
        _tma_load(q_desc, [off_m, col], q_bar, q_smem)
        for i in gl.static_range(STAGES):   # the ring's first fill
            _issue_kv(k_desc, k_ring, k_bars, i, i * BLOCK_N, col, STAGES, i < n_blocks)
            _issue_kv(v_desc, v_ring, v_bars, i, i * BLOCK_N, col, STAGES, i < n_blocks)

        zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
        acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_s)
        l_i = gl.zeros([BLOCK_M], gl.float32, layout=row_s)

        # block 0: its scores, its softmax (nothing to overlap with yet)
        mbarrier.wait(q_bar, 0)
        _wait_kv(k_bars, 0, STAGES)
        s_tok = warpgroup_mma(q_smem, k_ring.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok, ))
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, 0, S, qk_scale, s_layout, BLOCK_N, EVEN_N, MASK_LAST)
        _cta_barrier()                 # every warp is past K_0: its slot takes K_STAGES
        _issue_kv(k_desc, k_ring, k_bars, STAGES, STAGES * BLOCK_N, col, STAGES, STAGES < n_blocks)
        p_op = gl.convert_layout(p.to(dtype), p_layout)

        for j in range(1, n_blocks):
            _wait_kv(k_bars, j, STAGES)
            s_tok = warpgroup_mma(q_smem, k_ring.index(j % STAGES).permute((1, 0)), zero_s, use_acc=False,
                                  is_async=True)
            _wait_kv(v_bars, j - 1, STAGES)
            o_tok = warpgroup_mma(p_op, v_ring.index((j - 1) % STAGES), acc, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok, ))          # S_j here, P_{j-1} V_{j-1} runs on
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, j * BLOCK_N, S, qk_scale, s_layout, BLOCK_N, EVEN_N,
                                               MASK_LAST)
            acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_op))
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
            _cta_barrier()             # every warp is past K_j and V_{j-1}: refill both slots
            nk = j + STAGES
            _issue_kv(k_desc, k_ring, k_bars, nk, nk * BLOCK_N, col, STAGES, nk < n_blocks)
            nv = j - 1 + STAGES
            _issue_kv(v_desc, v_ring, v_bars, nv, nv * BLOCK_N, col, STAGES, nv < n_blocks)
            p_op = gl.convert_layout(p.to(dtype), p_layout)

        last = n_blocks - 1
        _wait_kv(v_bars, last, STAGES)
        o_tok = warpgroup_mma(p_op, v_ring.index(last % STAGES), acc, is_async=True)
        acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_op))

        l_o = gl.convert_layout(l_i, row_o)
        o = (acc / gl.expand_dims(l_o, 1)).to(dtype)
        if WRITE_LSE:   # natural log: (m + log2 l) / log2 e
            offs_m = off_m + gl.arange(0, BLOCK_M, layout=row_s)
            lse = (m_i + gl.log2(l_i)) * 0.6931471805599453
            gl.store(lse_ptr + h * S + offs_m, lse, mask=offs_m < S)
        q_smem.store(o)                     # Q's buffer stages the output tile (every S wgmma has completed)
        fence_async_shared()
        _cta_barrier()                 # every warp's part of the tile is in shared memory
        _tma_store(o_desc, [off_m, col], q_smem)
        tma.store_wait(pendings=0)
        mbarrier.invalidate(q_bar)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(k_bars.index(i))
            mbarrier.invalidate(v_bars.index(i))


# ------------------------------------------------------------------------------------------ warp-specialised kernel
# FA3's CTA: a loader warp (TMA of Q, and of K/V into the ring, slot by slot as the consumers free it) and NC
# consumer warpgroups, each 64 query rows of the tile, each running the overlapped loop above on its own rows and
# storing its own rows. The consumers share the K/V ring (1 / NC of the K/V traffic of 64-row CTAs) and are
# coupled through the ring's mbarriers ("ready": the TMA's bytes landed; "empty": every consumer's wgmmas that
# read the slot completed, NC arrivals), so one warpgroup's softmax can run while another's GEMMs use the tensor
# cores; with PINGPONG the order of their GEMMs is fixed by named barriers (below).
if AVAILABLE:
    @gluon.jit
    def _ws_tile(tile, n_m, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr):
        """Tile ``tile`` (linear id h * n_m + m, as the one-CTA-per-tile grid numbers them) -> (h, off_m, col)."""
        h = tile // n_m
        return h, (tile - h * n_m) * BLOCK_M, h * HEAD_DIM

    @gluon.jit
    def _ws_loader_tile(it, tile, q_desc, k_desc, v_desc, q_smem, k_ring, v_ring, q_bar, q_empty, k_ready, v_ready,
                        k_empty, v_empty, n_m, n_blocks, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                        BLOCK_N: gl.constexpr, HALF_M: gl.constexpr, STAGES: gl.constexpr, NC: gl.constexpr,
                        REVERSE: gl.constexpr = False, JOINT: gl.constexpr = False):
        """The loader's work for this CTA's it-th tile: its Q (once every consumer is past the last tile's S
        GEMMs: ``q_empty``), then its K/V blocks into the ring; ring phases count blocks over the CTA's tiles."""
        h, off_m, col = _ws_tile(tile, n_m, HEAD_DIM, BLOCK_M)
        mbarrier.wait(q_empty, (it & 1) ^ 1)         # a fresh barrier passes parity 1: the first tile's Q
        mbarrier.expect(q_bar, NC * q_desc.block_type.nbytes)
        for c in gl.static_range(NC):        # each consumer's 64 rows of Q
            _tma_load(q_desc, [off_m + c * HALF_M, col], q_bar, q_smem.index(c))
        base = it * n_blocks
        for j in range(n_blocks):
            g = base + j
            slot = g % STAGES
            phase = ((g // STAGES) & 1) ^ 1          # a fresh barrier passes parity 1: the ring's first fill
            if JOINT:   # -jr: one release per slot, after the P V that read its V (K's S GEMM came before it)
                mbarrier.wait(v_empty.index(slot), phase)
            else:
                mbarrier.wait(k_empty.index(slot), phase)
            mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
            if REVERSE:   # -rv: the key blocks last to first, the masked block (if any) first
                row = (n_blocks - 1 - j) * BLOCK_N
            else:
                row = j * BLOCK_N
            _tma_load(k_desc, [row, col], k_ready.index(slot), k_ring.index(slot))
            if not JOINT:
                mbarrier.wait(v_empty.index(slot), phase)
            mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
            _tma_load(v_desc, [row, col], v_ready.index(slot), v_ring.index(slot))

    @gluon.jit
    def _ws_loader(q_desc, k_desc, v_desc, q_smem, k_ring, v_ring, q_bar, q_empty, k_ready, v_ready, k_empty, v_empty,
                   n_m, n_tiles, n_blocks, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                   HALF_M: gl.constexpr, STAGES: gl.constexpr, NC: gl.constexpr = 2,
                   PERSISTENT: gl.constexpr = False, REVERSE: gl.constexpr = False, JOINT: gl.constexpr = False):
        if PERSISTENT:   # this CTA's tiles: program_id, + num_programs, ...
            it = 0
            for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
                _ws_loader_tile(it, tile, q_desc, k_desc, v_desc, q_smem, k_ring, v_ring, q_bar, q_empty, k_ready,
                                v_ready, k_empty, v_empty, n_m, n_blocks, HEAD_DIM, BLOCK_M, BLOCK_N, HALF_M, STAGES,
                                NC, REVERSE, JOINT)
                it += 1
        else:
            _ws_loader_tile(0, gl.program_id(0), q_desc, k_desc, v_desc, q_smem, k_ring, v_ring, q_bar, q_empty,
                            k_ready, v_ready, k_empty, v_empty, n_m, n_blocks, HEAD_DIM, BLOCK_M, BLOCK_N, HALF_M,
                            STAGES, NC, REVERSE, JOINT)

    # FA3 / FA4's warp-scheduler barriers (``GluonConfig.pingpong`` / ``named_pp``, label -pp-nb): the consumers'
    # turns in hardware named barriers (``bar.sync`` / ``bar.arrive``, 128 threads that wait + 128 that arrive).
    # Gluon 3.6 has no named-barrier op, so one PTX line per
    # thread through inline asm over a [128] tensor of one element per thread (the partition's 4 warps). Ids from
    # NB_BASE: Triton's warp specialisation takes 0 (the default partition), 1 (its start barrier) and one per
    # worker partition from 2 (at most 2 .. 4 here); tests/test_attention_gluon.py checks the PTX's ids.
    NB_BASE = gl.constexpr(8)

    @gluon.jit
    def _named_barrier(bar_id, ARRIVE: gl.constexpr):
        one: gl.constexpr = gl.BlockedLayout(size_per_thread=[1], threads_per_warp=[32], warps_per_cta=[4], order=[0])
        ids = gl.full([128], bar_id, gl.int32, layout=one)
        if ARRIVE:
            gl.inline_asm_elementwise("bar.arrive $1, 256;\n\tmov.u32 $0, 0;", "=r,r", [ids], dtype=gl.int32,
                                      is_pure=False, pack=1)
        else:
            gl.inline_asm_elementwise("bar.sync $1, 256;\n\tmov.u32 $0, 0;", "=r,r", [ids], dtype=gl.int32,
                                      is_pure=False, pack=1)

    @gluon.jit
    def _ws_block(j, base, half, q, k_ring, v_ring, k_ready, v_ready, k_empty, v_empty, acc, p_op,
                  m_i, l_i, zero_s, S, qk_scale, s_layout: gl.constexpr, o_layout: gl.constexpr,
                  p_layout: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, EVEN_N: gl.constexpr,
                  MASK_LAST: gl.constexpr, NC: gl.constexpr, PINGPONG: gl.constexpr, JOINT: gl.constexpr = False):
        """One key block j >= 1 of a consumer's tile (the overlapped step: S_j and P_{j-1} V_{j-1} in flight,
        softmax(S_j) under the second): -> (acc, p_op, m_i, l_i)."""
        dtype: gl.constexpr = p_op.dtype
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        g = base + j
        slot = g % STAGES
        prev = (g - 1) % STAGES
        mbarrier.wait(k_ready.index(slot), (g // STAGES) & 1)
        if PINGPONG:   # FA4's order (its mma_one_n_block_intrawg_overlap): K ready, my turn, S_j, V ready,
            # P_{j-1} V_{j-1}, the next consumer's turn
            _named_barrier(NB_BASE + half, False)
            s_tok = warpgroup_mma(q, k_ring.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            mbarrier.wait(v_ready.index(prev), ((g - 1) // STAGES) & 1)
            o_tok = warpgroup_mma(p_op, v_ring.index(prev), acc, is_async=True)
            _named_barrier(NB_BASE + (half + 1) % NC, True)
        else:
            s_tok = warpgroup_mma(q, k_ring.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            mbarrier.wait(v_ready.index(prev), ((g - 1) // STAGES) & 1)
            o_tok = warpgroup_mma(p_op, v_ring.index(prev), acc, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok, ))
        if not JOINT:
            mbarrier.arrive(k_empty.index(slot), count=1)
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, j * BLOCK_N, S, qk_scale, s_layout, BLOCK_N, EVEN_N,
                                           MASK_LAST)
        acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_op))
        mbarrier.arrive(v_empty.index(prev), count=1)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        return acc, p_op, m_i, l_i

    @gluon.jit
    def _ws_consumer_tile(it, tile, half, o_desc, lse_ptr, q_smem, o_smem, k_ring, v_ring, q_bar, q_empty, k_ready,
                          v_ready, k_empty, v_empty, n_m, S, n_blocks, qk_scale, HEAD_DIM: gl.constexpr,
                          BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HALF_M: gl.constexpr, STAGES: gl.constexpr,
                          EVEN_N: gl.constexpr, WRITE_LSE: gl.constexpr, MASK_LAST: gl.constexpr,
                          NC: gl.constexpr, PINGPONG: gl.constexpr, out_table, rows_per_rank, out_row_stride,
                          out_head0, FUSED: gl.constexpr, JOINT: gl.constexpr = False):
        """Consumer ``half``'s work for this CTA's it-th tile (ring and Q phases count over the CTA's
        tiles). ``o_smem``: Q's buffer (one tile per CTA) or its own (persistent: the next tile's Q lands while
        this one's output is staged)."""
        h, off_m, col = _ws_tile(tile, n_m, HEAD_DIM, BLOCK_M)
        dtype: gl.constexpr = o_desc.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HEAD_DIM, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        q = q_smem.index(half)
        zero_s = gl.zeros([HALF_M, BLOCK_N], gl.float32, layout=s_layout)
        acc = gl.zeros([HALF_M, HEAD_DIM], gl.float32, layout=o_layout)
        m_i = gl.full([HALF_M], float("-inf"), gl.float32, layout=row_s)
        l_i = gl.zeros([HALF_M], gl.float32, layout=row_s)
        base = it * n_blocks

        mbarrier.wait(q_bar, it & 1)
        mbarrier.wait(k_ready.index(base % STAGES), (base // STAGES) & 1)
        s_tok = warpgroup_mma(q, k_ring.index(base % STAGES).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok, ))
        if not JOINT:
            mbarrier.arrive(k_empty.index(base % STAGES), count=1)
        if MASK_LAST == 3:
            # -rv (FA4's order): the loader brings the key blocks last to first, so the only block with
            # keys past S is this first one, outside the overlapped loop (masked here, whatever MASK_LAST's branch
            # would do); every block of the loop is full and runs the unmasked step of S % BLOCK_N == 0
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, (n_blocks - 1) * BLOCK_N, S, qk_scale, s_layout, BLOCK_N,
                                               EVEN_N, False)
        else:
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, 0, S, qk_scale, s_layout, BLOCK_N, EVEN_N, MASK_LAST)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        # -rv: every block of the loop is full, so the loop runs the unmasked step
        LOOP_EVEN: gl.constexpr = EVEN_N or MASK_LAST == 3
        LOOP_MASK: gl.constexpr = False if MASK_LAST == 3 else MASK_LAST
        for j in range(1, n_blocks):
            acc, p_op, m_i, l_i = _ws_block(j, base, half, q, k_ring, v_ring, k_ready, v_ready, k_empty, v_empty,
                                            acc, p_op, m_i, l_i, zero_s, S, qk_scale, s_layout, o_layout, p_layout,
                                            BLOCK_N, STAGES, LOOP_EVEN, LOOP_MASK, NC, PINGPONG, JOINT)
        mbarrier.arrive(q_empty, count=1)       # every S GEMM of this tile has completed: Q's slot takes the next
        last = base + n_blocks - 1
        mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
        o_tok = warpgroup_mma(p_op, v_ring.index(last % STAGES), acc, is_async=True)
        acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_op))
        mbarrier.arrive(v_empty.index(last % STAGES), count=1)

        row0 = off_m + half * HALF_M
        o = (acc / gl.expand_dims(gl.convert_layout(l_i, row_o), 1)).to(dtype)
        if WRITE_LSE:
            offs_m = row0 + gl.arange(0, HALF_M, layout=row_s)
            gl.store(lse_ptr + h * S + offs_m, (m_i + gl.log2(l_i)) * 0.6931471805599453, mask=offs_m < S)
        if FUSED:
            # the Ulysses all-to-all in the epilogue: each row to its owner rank (row // Sl), at its local row and
            # this rank's global head, through the table of peer addresses; a tile straddling two owners splits
            # per row (as kernels/attention.py's FUSED epilogue)
            # the stores leave from a blocked layout, 16 bytes (8 elements) of one row per thread: from the wgmma
            # accumulator's layout they compile to 2-byte stores (st.global.b16, sm_90a PTX), which over PCIe to
            # host memory cost a transaction each (3.2-7.9x Gluon alone on the host link)
            st_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8],
                                                       threads_per_warp=[32 // (HEAD_DIM // 8), HEAD_DIM // 8],
                                                       warps_per_cta=[4, 1], order=[1, 0])
            o = gl.convert_layout(o, st_layout)
            offs_m = row0 + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, st_layout))
            offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, st_layout))
            row_ok = offs_m < S
            dest = offs_m // rows_per_rank
            local_row = (offs_m - dest * rows_per_rank).to(gl.int64)
            base_ptr = gl.load(out_table + dest, mask=row_ok, other=0).to(gl.pointer_type(dtype))
            row_ptr = base_ptr + local_row * out_row_stride + (out_head0 + h) * HEAD_DIM
            # every row starts 16-byte aligned (ulysses_fused checks the table's addresses and the row stride before
            # the launch): without the hint the loaded base pointer's alignment is unknown and the stores stay 2-byte
            row_ptr = gl.multiple_of(row_ptr, 16)
            gl.store(gl.expand_dims(row_ptr, 1) + gl.expand_dims(offs_d, 0), o, mask=gl.expand_dims(row_ok, 1))
        else:
            ob = o_smem.index(half)
            tma.store_wait(pendings=0)  # the last tile's store has read this buffer (persistent)
            ob.store(o)                 # this warpgroup's output half (Q's half: its last S wgmma is done)
            fence_async_shared()
            _cta_barrier()
            _tma_store(o_desc, [row0, col], ob)

    @gluon.jit
    def _ws_consumer(half, o_desc, lse_ptr, q_smem, o_smem, k_ring, v_ring, q_bar, q_empty, k_ready, v_ready,
                     k_empty, v_empty, n_m, n_tiles, S, n_blocks, qk_scale, HEAD_DIM: gl.constexpr,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HALF_M: gl.constexpr, STAGES: gl.constexpr,
                     EVEN_N: gl.constexpr, WRITE_LSE: gl.constexpr, MASK_LAST: gl.constexpr,
                     NC: gl.constexpr = 2, PINGPONG: gl.constexpr = False, out_table=None, rows_per_rank=0,
                     out_row_stride=0, out_head0=0, FUSED: gl.constexpr = False, PERSISTENT: gl.constexpr = False,
                     JOINT: gl.constexpr = False):
        if PINGPONG:
            if half == 0:   # consumer 0 takes the first turn (FA4's mma_init): its own barrier already holds 128
                _named_barrier(NB_BASE, True)
        if PERSISTENT:
            it = 0
            for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
                _ws_consumer_tile(it, tile, half, o_desc, lse_ptr, q_smem, o_smem, k_ring, v_ring, q_bar, q_empty,
                                  k_ready, v_ready, k_empty, v_empty, n_m, S, n_blocks, qk_scale, HEAD_DIM, BLOCK_M,
                                  BLOCK_N, HALF_M, STAGES, EVEN_N, WRITE_LSE, MASK_LAST, NC, PINGPONG,
                                  out_table, rows_per_rank, out_row_stride, out_head0, FUSED, JOINT)
                it += 1
        else:
            _ws_consumer_tile(0, gl.program_id(0), half, o_desc, lse_ptr, q_smem, o_smem, k_ring, v_ring, q_bar,
                              q_empty, k_ready, v_ready, k_empty, v_empty, n_m, S, n_blocks, qk_scale, HEAD_DIM,
                              BLOCK_M, BLOCK_N, HALF_M, STAGES, EVEN_N, WRITE_LSE, MASK_LAST, NC, PINGPONG,
                              out_table, rows_per_rank, out_row_stride, out_head0, FUSED, JOINT)
        if not FUSED:
            tma.store_wait(pendings=0)

    @gluon.jit
    def gluon_attention_ws_kernel(q_desc, k_desc, v_desc, o_desc, lse_ptr, S, Hl, qk_scale,
                                  out_table, rows_per_rank, out_row_stride, out_head0,
                                  HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                                  STAGES: gl.constexpr, EVEN_N: gl.constexpr, WRITE_LSE: gl.constexpr,
                                  CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr,
                                  MASK_LAST: gl.constexpr = False, PINGPONG: gl.constexpr = False,
                                  FUSED: gl.constexpr = False, PERSISTENT: gl.constexpr = False,
                                  JOINT: gl.constexpr = False):
        """Warp-specialised: NC = BLOCK_M / 64 consumer warpgroups (2 or 3) of 64 rows each: the default partition
        (4 warps) is consumer 0, workers 0 .. NC - 2 (4 warps each) the others, the last worker (1 warp) the
        loader. q/o descriptors' blocks are [64, D] (each consumer's rows). PINGPONG: the consumers issue their
        GEMMs in turn (0, 1, .., NC - 1, 0, ..), the turns in hardware named barriers NB_BASE .. NB_BASE + NC - 1, as
        FA4 does. MASK_LAST: False / True as the one-partition kernel, 3 the key blocks last to first. JOINT: one
        release per ring slot.
        FUSED: the Ulysses post-attention all-to-all in the epilogue (out_table: *int64 [P] every rank's out
        [Sl, H, D] base address; rows_per_rank Sl; out_row_stride H * D; out_head0 rank * Hl); o_desc unused.
        PERSISTENT: a grid of at most one CTA per SM, each walking tiles program_id, + num_programs,
        ...; the output is staged in its own buffer, so the loader fetches the next tile's Q (once every consumer
        is past this tile's S GEMMs) and K/V while the consumers finish the last P V and the epilogue."""
        HALF_M: gl.constexpr = 64
        NC: gl.constexpr = BLOCK_M // HALF_M
        n_m = gl.cdiv(S, BLOCK_M)
        n_tiles = n_m * Hl
        dtype: gl.constexpr = q_desc.dtype
        q_smem = gl.allocate_shared_memory(dtype, [NC, HALF_M, HEAD_DIM], q_desc.layout)
        if PERSISTENT and not FUSED:
            o_smem = gl.allocate_shared_memory(dtype, [NC, HALF_M, HEAD_DIM], q_desc.layout)
        else:
            o_smem = q_smem
        k_ring = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
        v_ring = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        mbarrier.init(q_empty, count=NC)                  # one arrival per consumer warpgroup
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=NC)     # one arrival per consumer warpgroup
            mbarrier.init(v_empty.index(i), count=NC)
        fence_async_shared()
        n_blocks = gl.cdiv(S, BLOCK_N)
        if NC == 3:
            gl.warp_specialize([(_ws_consumer, (0, o_desc, lse_ptr, q_smem, o_smem, k_ring, v_ring, q_bar, q_empty, k_ready,
                                  v_ready, k_empty, v_empty, n_m, n_tiles, S, n_blocks, qk_scale, HEAD_DIM, BLOCK_M,
                                  BLOCK_N, HALF_M, STAGES, EVEN_N, WRITE_LSE, MASK_LAST, NC, PINGPONG, out_table,
                                  rows_per_rank, out_row_stride, out_head0, FUSED, PERSISTENT, JOINT)),
                                (_ws_consumer, (1, o_desc, lse_ptr, q_smem, o_smem, k_ring, v_ring, q_bar, q_empty, k_ready,
                                  v_ready, k_empty, v_empty, n_m, n_tiles, S, n_blocks, qk_scale, HEAD_DIM, BLOCK_M,
                                  BLOCK_N, HALF_M, STAGES, EVEN_N, WRITE_LSE, MASK_LAST, NC, PINGPONG, out_table,
                                  rows_per_rank, out_row_stride, out_head0, FUSED, PERSISTENT, JOINT)),
                                (_ws_consumer, (2, o_desc, lse_ptr, q_smem, o_smem, k_ring, v_ring, q_bar, q_empty, k_ready,
                                  v_ready, k_empty, v_empty, n_m, n_tiles, S, n_blocks, qk_scale, HEAD_DIM, BLOCK_M,
                                  BLOCK_N, HALF_M, STAGES, EVEN_N, WRITE_LSE, MASK_LAST, NC, PINGPONG, out_table,
                                  rows_per_rank, out_row_stride, out_head0, FUSED, PERSISTENT, JOINT)),
                                (_ws_loader, (q_desc, k_desc, v_desc, q_smem, k_ring, v_ring, q_bar, q_empty, k_ready, v_ready,
                                  k_empty, v_empty, n_m, n_tiles, n_blocks, HEAD_DIM, BLOCK_M, BLOCK_N, HALF_M, STAGES,
                                  NC, PERSISTENT, MASK_LAST == 3, JOINT))], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, 24])
        else:
            gl.warp_specialize([(_ws_consumer, (0, o_desc, lse_ptr, q_smem, o_smem, k_ring, v_ring, q_bar, q_empty, k_ready,
                                  v_ready, k_empty, v_empty, n_m, n_tiles, S, n_blocks, qk_scale, HEAD_DIM, BLOCK_M,
                                  BLOCK_N, HALF_M, STAGES, EVEN_N, WRITE_LSE, MASK_LAST, NC, PINGPONG, out_table,
                                  rows_per_rank, out_row_stride, out_head0, FUSED, PERSISTENT, JOINT)),
                                (_ws_consumer, (1, o_desc, lse_ptr, q_smem, o_smem, k_ring, v_ring, q_bar, q_empty, k_ready,
                                  v_ready, k_empty, v_empty, n_m, n_tiles, S, n_blocks, qk_scale, HEAD_DIM, BLOCK_M,
                                  BLOCK_N, HALF_M, STAGES, EVEN_N, WRITE_LSE, MASK_LAST, NC, PINGPONG, out_table,
                                  rows_per_rank, out_row_stride, out_head0, FUSED, PERSISTENT, JOINT)),
                                (_ws_loader, (q_desc, k_desc, v_desc, q_smem, k_ring, v_ring, q_bar, q_empty, k_ready, v_ready,
                                  k_empty, v_empty, n_m, n_tiles, n_blocks, HEAD_DIM, BLOCK_M, BLOCK_N, HALF_M, STAGES,
                                  NC, PERSISTENT, MASK_LAST == 3, JOINT))], [4, 1], [CONSUMER_REGS, 24])
