"""Device code for xstage: Triton kernels, one kernel family per file (installed as ``xstage.kernels``).

- ``remote_store``: the X-Stage microbenchmark (bursts of stores to a peer or local buffer, gaps between them,
  device timestamps around each burst's issue and drain).
- ``attention``: FlashAttention forward whose epilogue stores each output tile to the rank that owns its rows
  (Ulysses post-attention all-to-all fused tile by tile).
- ``moe``: MegaMoE — Linear-1 -> SwiGLU -> Linear-2 with the combine as remote stores from the Linear-2
  epilogue, walking a host-built task list (the schedule), bf16 and FP8; and the dispatch push kernel.
- ``sync``: small device-side helpers everything reuses: the global timer, the system-scope fence, flags,
  bounded waits, the end-of-layer epoch barrier.
"""
