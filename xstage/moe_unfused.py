"""MegaMoE's unfused GPU baseline: the routed rows sent with NCCL ``all_to_all`` (or, where one process drives every
rank, copies between the ranks' tensors), the experts as ``torch._grouped_mm`` (Linear-1, SwiGLU, Linear-2 on each
expert's rows; a per-expert loop where the grouped GEMM is not available), the rows sent back and summed over the
top-k with the router weights. What the fused layer's speedup divides, and the reference its output is checked
against on GPUs. ``RankInputs``: xstage.moe.RankInputs (a rank's routed tokens, layout and weights).
"""
from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch

_GROUPED_MM_WARNED = [False]


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, offs_list: Sequence[int]) -> torch.Tensor:
    """a [M, K] @ b [G, K, N] with row groups ending at ``offs`` (int32 cumulative; torch._grouped_mm, bf16 on
    sm_90 in torch 2.11). Without it (older torch, or a dtype it rejects) a per-group loop, said once on stderr."""
    fn = getattr(torch, "_grouped_mm", None)
    if fn is not None:
        try:
            return fn(a, b, offs=offs)
        except (RuntimeError, NotImplementedError) as e:
            why = f"torch._grouped_mm failed ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
    else:
        why = f"torch {torch.__version__} has no torch._grouped_mm"
    if not _GROUPED_MM_WARNED[0]:
        print(f"megamoe: {why}; the unfused baseline uses a per-expert matmul loop", file=sys.stderr)
        _GROUPED_MM_WARNED[0] = True
    out = torch.empty(a.shape[0], b.shape[2], dtype=a.dtype, device=a.device)
    start = 0
    for g, end in enumerate(offs_list):
        if end > start:
            out[start:end] = a[start:end] @ b[g]
        start = end
    return out


@dataclass
class _UnfusedPlan:
    """One rank's index plan of the unfused layer (built once, outside every timed call): its items in send order
    (by expert, so owner-major: the block for owner d is send_start[d] .. send_start[d + 1]), the rows it receives
    in source-major order (source s at recv_start[s]), the relayouts between that order and the fused
    expert-major one, the grouped-GEMM group ends and the router weights."""

    send_counts: list[int]
    recv_counts: list[int]
    send_start: list[int]
    recv_start: list[int]
    tok: torch.Tensor          # [T*K] send position -> token
    comb_idx: torch.Tensor     # [T*K] send position -> slot * T + token
    to_fused: torch.Tensor     # [R] fused (expert-major) row -> source-major received row
    to_recv: torch.Tensor      # [R] source-major received row -> fused row
    offs: torch.Tensor         # int32 [El] cumulative rows per local expert
    offs_list: list[int]
    wk: torch.Tensor           # [K, T, 1] router weights (float32)
    w1t: torch.Tensor          # [El, Hd, 2I] (a view)
    w2t: torch.Tensor          # [El, I, Hd] (a view)


def _unfused_plan(inp: "RankInputs", weights_hi: tuple[torch.Tensor, torch.Tensor]) -> _UnfusedPlan:
    lay = inp.layout
    r, P, El = lay.rank, lay.world_size, lay.experts_local
    T = inp.x.shape[0]
    K = inp.ids.shape[1]
    dev = inp.x.device
    w1, w2 = weights_hi
    counts = lay.counts                                                   # [P, E]
    flat = inp.ids.flatten().cpu()
    order = torch.argsort(flat, stable=True)                               # send order: by expert (owner-major)
    send_counts = counts[r].view(P, El).sum(1).tolist()
    recv_counts = counts[:, r * El:(r + 1) * El].sum(1).tolist()
    # received rows: source-major, then local expert, then the source's item order -> expert-major (fused layout)
    recv_start = [0, *itertools.accumulate(recv_counts)]
    mine = counts[:, r * El:(r + 1) * El]                                  # [P, El]
    src_expert_start = mine.cumsum(1) - mine                               # within each source's block
    to_fused = torch.cat([torch.arange(int(mine[s, le])) + recv_start[s] + int(src_expert_start[s, le])
                          for le in range(El) for s in range(P)]) if lay.rows else torch.zeros(0, dtype=torch.long)
    to_recv = torch.empty_like(to_fused)
    to_recv[to_fused] = torch.arange(to_fused.numel())
    offs_list = list(itertools.accumulate(lay.expert_rows))
    return _UnfusedPlan(send_counts, recv_counts, [0, *itertools.accumulate(send_counts)], recv_start,
                        (order // K).to(dev), ((order % K) * T + order // K).to(dev), to_fused.to(dev),
                        to_recv.to(dev), torch.tensor(offs_list, dtype=torch.int32, device=dev), offs_list,
                        inp.wts.to(dev).T.contiguous()[..., None].float(), w1.transpose(1, 2), w2.transpose(1, 2))


def _unfused_gemms(p: _UnfusedPlan, xe: torch.Tensor) -> torch.Tensor:
    """Grouped GEMM Linear-1, SwiGLU, grouped GEMM Linear-2 on expert-major rows [R, Hd] -> [R, Hd]."""
    I = p.w2t.shape[1]
    gu = grouped_mm(xe, p.w1t, p.offs, p.offs_list)                        # [R, 2I]
    return grouped_mm(torch.nn.functional.silu(gu[:, :I]) * gu[:, I:], p.w2t, p.offs, p.offs_list)


def _with_gemm(run: Callable, p: _UnfusedPlan, rows: int, hidden: int, dtype: torch.dtype, dev) -> Callable:
    xg = torch.randn(rows, hidden, device=dev).to(dtype)   # the GEMM phases alone, on this rank's rows
    #                                                        (expert-major), no communication
    run.gemm = lambda: _unfused_gemms(p, xg)
    return run


def make_unfused(world, inp: "RankInputs", weights_hi: tuple[torch.Tensor, torch.Tensor]) -> Callable[[], torch.Tensor]:
    """The unfused layer on this rank (one process per rank): all_to_all_single dispatch (rows sorted by owner
    and expert), relayout to expert-major, grouped GEMM Linear-1, SwiGLU, grouped GEMM Linear-2, relayout back,
    all_to_all_single combine, and the router-weighted top-k sum. Index plans are built here, outside the
    returned fn(). ``weights_hi``: (w1 [El, 2I, Hd], w2 [El, Hd, I]) in bf16 (fp16/fp32 on CPU)."""
    p = _unfused_plan(inp, weights_hi)
    T, Hd = inp.x.shape
    K = inp.ids.shape[1]
    dev = inp.x.device
    recv = torch.empty(inp.layout.rows, Hd, dtype=inp.x.dtype, device=dev)
    ret = torch.empty(T * K, Hd, dtype=inp.x.dtype, device=dev)
    comb = torch.empty(K * T, Hd, dtype=inp.x.dtype, device=dev)
    dist = world.dist

    def run() -> torch.Tensor:
        send = inp.x.index_select(0, p.tok)
        dist.all_to_all_single(recv, send, p.recv_counts, p.send_counts)
        y = _unfused_gemms(p, recv.index_select(0, p.to_fused))            # [R, Hd]
        dist.all_to_all_single(ret, y.index_select(0, p.to_recv), p.send_counts, p.recv_counts)
        comb.index_copy_(0, p.comb_idx, ret)
        return (comb.view(K, T, Hd).float() * p.wk).sum(0).to(inp.x.dtype)
    return _with_gemm(run, p, inp.layout.rows, Hd, inp.x.dtype, dev)


def make_unfused_one_process(world, inputs: Mapping[int, "RankInputs"],
                             weights_hi: Mapping[int, tuple[torch.Tensor, torch.Tensor]], observed: int = 0
                             ) -> Callable[[], torch.Tensor]:
    """The unfused layer of a world whose ranks one process drives (``world.emulated``: the CPU world, the one-GPU
    world), with the same index plans as :func:`make_unfused`; each all_to_all becomes copies between the ranks'
    tensors. Receiver r gathers each source's rows from that source's x (the dispatch), runs the grouped GEMMs and
    copies each source's rows back into that source's return buffer (the combine: a destination buffer of the
    world, so with ``OneGPUWorld(link="host")`` the peers' lie in pinned host memory and the copies cross PCIe);
    each source then scatters and sums its own.

    Returns ``run()``: the observed rank's share (its gather, GEMMs, return copies to every source and its own
    top-k sum; the timed baseline) -> its out [T, Hd]; ``run.full()`` -> {rank: out} (every receiver first, then
    every reduction: the correctness check); ``run.gemm()``: the observed rank's GEMM phases alone."""
    ranks = list(world.local_ranks)
    if observed not in ranks:
        raise ValueError(f"observed rank {observed} is not one of this process's ranks {ranks}")
    plans = {r: _unfused_plan(inputs[r], weights_hi[r]) for r in ranks}
    x0 = inputs[observed].x
    T, Hd = x0.shape
    K = inputs[observed].ids.shape[1]
    ret = world.symmetric_empty(K * T * Hd, x0.dtype, destination=True)
    recv = {r: torch.empty(inputs[r].layout.rows, Hd, dtype=x0.dtype, device=world.device(r)) for r in ranks}
    comb = {r: torch.empty(K * T, Hd, dtype=x0.dtype, device=world.device(r)) for r in ranks}

    def share(r: int) -> None:
        p = plans[r]
        for s in ranks:                                                    # the dispatch all_to_all, receiver r
            lo, hi = plans[s].send_start[r], plans[s].send_start[r + 1]
            if hi > lo:
                recv[r][p.recv_start[s]:p.recv_start[s + 1]] = inputs[s].x.index_select(0, plans[s].tok[lo:hi])
        back = _unfused_gemms(p, recv[r].index_select(0, p.to_fused)).index_select(0, p.to_recv)
        for s in ranks:                                                    # the combine all_to_all, sender r
            lo, hi = plans[s].send_start[r], plans[s].send_start[r + 1]
            if hi > lo:
                ret.local(s).view(K * T, Hd)[lo:hi].copy_(back[p.recv_start[s]:p.recv_start[s + 1]],
                                                          non_blocking=True)

    def reduce(s: int) -> torch.Tensor:
        p = plans[s]
        got = ret.local(s).view(K * T, Hd).to(world.device(s))
        comb[s].index_copy_(0, p.comb_idx, got)
        return (comb[s].view(K, T, Hd).float() * p.wk).sum(0).to(x0.dtype)

    def run() -> torch.Tensor:
        share(observed)
        return reduce(observed)

    def full() -> dict[int, torch.Tensor]:
        for r in ranks:
            share(r)
        return {s: reduce(s) for s in ranks}
    run.full = full
    return _with_gemm(run, plans[observed], inputs[observed].layout.rows, Hd, x0.dtype, world.device(observed))
