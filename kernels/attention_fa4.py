"""The Ulysses post-attention all-to-all fused into FA4's Hopper forward kernel (CuTe DSL).

``UlyssesFusedSm90`` subclasses ``flash_attn.cute.flash_fwd_sm90.FlashAttentionForwardSm90`` (flash-attn-4
4.0.0b36, the optional extra ``fa4``) and overrides two methods, nothing else of FA's code is repeated here:

- ``mma`` (a plain Python wrapper, run while the kernel is traced): keeps the kernel's ``aux_data`` (FA's channel
  for extra tensors) on the instance so that the epilogue can read the peer table, then calls FA's ``mma``.
- ``epilogue``: FA's tile is staged through shared memory as FA does (registers -> ``sO`` with FA's store atom),
  then every row of the tile is stored to the rank that owns it: global row ``s`` of local head ``h`` goes to
  rank ``j = s // Sl``, row ``s - j * Sl``, head ``head0 + h`` of that rank's output ``out[j] [Sl, H, D]``. A tile
  whose rows belong to two ranks (``Sl % tile_m != 0``) is split per row (as ``kernels/attention.py``'s fused
  epilogue does); rows past ``S`` are not stored. FA's TMA store of ``O`` is not used (the output is not one
  tensor); each thread stores 16-byte pieces of its rows through pointers built from the table.

The peer table (int64, on the launching rank's device): ``[Sl, H * D, head0 * D, ptr_0, ..., ptr_{P-1}]``
(``TABLE_HEADER`` leading entries; ``ptr_j`` = rank j's output base address as seen from this process: device
memory, or pinned host memory for a host-link peer of ``xstage.ranks.OneGPUWorld``). The end-of-layer barrier /
completion is the project's (``xstage.ulysses.end_barrier``), launched after this kernel.

The module imports everywhere: flash-attn-4 and the CUTLASS DSL are optional, imported under a guard, and the class
is defined only where they load (``AVAILABLE``; else ``WHY``, one line; ``xstage.fa4.available`` adds the GPU checks).
"""
from __future__ import annotations

import importlib
import inspect
import os
import sys

TABLE_HEADER = 3          # Sl, H * D (a row of out[j], elements), head0 * D (this rank's first head, elements)


def _dsl_path() -> None:
    """nvidia-cutlass-dsl puts its packages on sys.path with a .pth file; an install with ``pip --target``
    (the GPU machine's carried wheels) skips .pth files, so do what it would."""
    try:
        importlib.import_module("cutlass")
        return
    except ImportError:
        pass
    try:
        import nvidia_cutlass_dsl
    except ImportError:
        return
    p = os.path.join(nvidia_cutlass_dsl.__path__[0], "dsl_packages")
    if os.path.isdir(p) and p not in sys.path:
        sys.path.insert(0, p)


_dsl_path()
try:  # the optional extra fa4
    import cutlass
    import cutlass.cute as cute
    from cutlass import Int32, Int64
    from flash_attn.cute import utils as fa_utils
    from flash_attn.cute.flash_fwd_sm90 import FlashAttentionForwardSm90
    from flash_attn.cute.named_barrier import NamedBarrierFwd
    AVAILABLE, WHY = True, ""
except Exception as _e:  # noqa: BLE001 (ImportError, or a DSL that fails to load its libraries)
    AVAILABLE, WHY = False, f"{type(_e).__name__}: {_e}"


if AVAILABLE:
    _MMA_PARAMS = list(inspect.signature(FlashAttentionForwardSm90.mma).parameters)

    class UlyssesFusedSm90(FlashAttentionForwardSm90):
        """FA4's SM90 forward with an epilogue that stores each row to its owner rank (see the module docstring)."""

        def mma(self, *args, **kwargs):
            # plain Python (not @cute.jit): runs once while the kernel is traced; aux_data.tensors[0] is the table
            if "aux_data" in kwargs:
                aux = kwargs["aux_data"]
            else:
                i = _MMA_PARAMS.index("aux_data") - 1           # minus self
                if len(args) <= i:
                    raise TypeError("UlyssesFusedSm90: FA's kernel called mma without aux_data (the peer table)")
                aux = args[i]
            if aux is None or aux.tensors is None or len(aux.tensors) < 1:
                raise TypeError("UlyssesFusedSm90 needs the peer table as aux_data.tensors[0]")
            self._peer_table = aux.tensors[0]
            return FlashAttentionForwardSm90.mma(self, *args, **kwargs)

        @cute.jit
        def epilogue(self, acc_O: cute.Tensor, lse: cute.Tensor, mO: cute.Tensor, mLSE, sO: cute.Tensor, seqlen,
                     gmem_tiled_copy_O: cute.TiledCopy, tma_atom_O, tiled_mma: cute.TiledMma, tidx: Int32,
                     m_block: Int32, head_idx: Int32, batch_idx: Int32):
            table = self._peer_table
            # the tile in the output dtype, staged through shared memory (FA's own atoms), as FA's epilogue does
            rO = cute.make_fragment_like(acc_O, self.dtype)
            rO.store(acc_O.load().to(self.dtype))
            cute.arch.barrier(barrier_id=int(NamedBarrierFwd.Epilogue), number_of_threads=self.num_epilogue_threads)
            st_atom = fa_utils.get_smem_store_atom(self.arch.major * 10 + self.arch.minor, self.dtype)
            st_thr = cute.make_tiled_copy_C(st_atom, tiled_mma).get_slice(tidx)
            cute.copy(st_atom, st_thr.retile(rO), st_thr.partition_D(sO))
            cute.arch.barrier(barrier_id=int(NamedBarrierFwd.Epilogue), number_of_threads=self.num_epilogue_threads)
            thr = gmem_tiled_copy_O.get_slice(tidx)
            tOsO = thr.partition_S(sO)
            tOrO = cute.make_fragment_like(tOsO, self.dtype)
            cute.autovec_copy(tOsO, tOrO)
            tOcO = thr.partition_S(cute.make_identity_tensor((self.tile_m, self.tile_hdimv)))
            Sl = Int32(table[0])
            row_elems = Int64(table[1])
            col0 = Int64(table[2]) + Int64(head_idx) * self.tile_hdimv
            elem_bytes = self.dtype.width // 8
            for rest_m in cutlass.range_constexpr(cute.size(tOrO.shape[1])):
                row = m_block * self.tile_m + tOcO[0, rest_m, 0][0]
                if row < seqlen.seqlen_q:
                    owner = row // Sl                                   # the rank that owns this row
                    base = Int64(table[TABLE_HEADER + owner]) + (Int64(row - owner * Sl) * row_elems + col0) * elem_bytes
                    for rest_k in cutlass.range_constexpr(cute.size(tOrO.shape[2])):
                        src = tOrO[None, rest_m, rest_k]
                        col = tOcO[0, rest_m, rest_k][1]
                        ptr = cute.make_ptr(self.dtype, base + Int64(col) * elem_bytes, cute.AddressSpace.gmem,
                                            assumed_align=16)
                        cute.autovec_copy(src, cute.make_tensor(ptr, cute.make_layout(src.shape)))
