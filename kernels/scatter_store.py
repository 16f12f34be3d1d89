"""The MegaMoE combine's store pattern without the GEMMs: tiles of BM rows x one row segment, at scattered rows.

A Linear-2 tile of the fused MoE (kernels/moe.py) stores BM rows of BN2 output columns, one row segment each
(BN2 x 2 B: 512 B in bf16, 256 B in fp8's bf16 output), each at its own (slot, token) row of the source's
combine buffer (a row pitch of Hd x 2 B). This kernel stores exactly that pattern, with a payload computed in
registers instead of a GEMM, so the link's sustained rate for it can be set beside the contiguous streams of the
burst-gap harness (kernels/remote_store.py): when it drains slower than a contiguous stream, the combine's own
pattern is why the host-link combine saturates below the harness's rate.

Legend: R = destination rows, W = int32 per destination row (the pitch), BM = rows per tile, S = int32 per row
segment (W a multiple of S), NB = row blocks (R / BM), NT = tiles (NB x W / S), P = programs.

Destination ``dst[R, W]`` int32 (pinned host memory, a peer buffer or local memory: any address); tile t stores
rows ``rows[tiles[t, 0] * BM + i]`` (i < BM), columns ``tiles[t, 1] * S + j`` (j < S), element (r, c) the
payload of its global index r x W + c (``xstage.kernels.remote_store.payload``), so a list of tiles that covers
every (row block, column block) once leaves ``dst`` equal to the payload over [0, R W), checkable bit for bit
whatever the rows' order. Tiles are walked round-robin (tile t on program t % P), as the static MoE schedule.
``WIDE``: each thread stores 16 contiguous bytes (the columns are an arange the compiler sees as contiguous);
``WIDE=False``: the columns come from a table in memory (``cols[S]``, the identity), so the compiler cannot prove
contiguity and emits 4-byte stores (the width of a store is a cost on its own).
"""
import triton
import triton.language as tl

from .remote_store import payload


@triton.jit
def row_segment_store_kernel(
    dst_addr,              # int64: address of dst[R, W] int32 (16 B aligned)
    rows_ptr,              # *int32 [NB * BM]: destination row of each row of each row block
    tiles_ptr,             # *int32 [NT, 2]: (row block, column block) of each tile, in store order
    cols_ptr,              # *int32 [S]: the identity (read only with WIDE=False)
    n_tiles,               # NT
    pitch,                 # W: int32 per destination row (a multiple of S)
    seed,                  # int32 payload seed
    BM: tl.constexpr,
    S: tl.constexpr,
    WIDE: tl.constexpr,
):
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    dst = tl.multiple_of(dst_addr.to(tl.pointer_type(tl.int32)), 16)
    r = tl.arange(0, BM)                                                    # [BM]
    if WIDE:
        c = tl.max_contiguous(tl.multiple_of(tl.arange(0, S), S), S)       # [S] contiguous columns
    else:
        c = tl.load(cols_ptr + tl.arange(0, S))                            # [S] the same, opaque to the compiler
    for t in range(pid, n_tiles, n_prog):
        rb = tl.load(tiles_ptr + 2 * t)
        cb = tl.load(tiles_ptr + 2 * t + 1)
        row = tl.load(rows_ptr + rb * BM + r).to(tl.int64)                 # [BM] scattered destination rows
        idx = row[:, None] * pitch + (cb * S).to(tl.int64) + c[None, :]    # [BM, S] global element index
        tl.store(dst + idx, payload(idx, seed))
