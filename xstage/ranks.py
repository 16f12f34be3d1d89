"""Ranks and symmetric memory: one interface for real GPUs and for ranks emulated on the CPU.

- ``TorchSymmWorld``: one process per GPU (started by :func:`spawn`), peer buffers from
  ``torch.distributed._symmetric_memory`` (``empty`` -> ``rendezvous`` -> ``buffer_ptrs``). A kernel reaches a
  peer's buffer through that peer's address in this process's address space.
- ``EmulatedWorld``: N ranks in one process on the CPU for Triton's interpreter. Each rank's "symmetric
  buffer" is a CPU tensor and the pointer table holds their addresses, so kernels take the same code path.
  Ranks run one after another; kernels only push (remote stores, flag releases), waits happen after.

Both expose ``world_size``, ``local_ranks`` (the ranks this process drives), ``device(rank)``,
``symmetric_empty(numel, dtype)`` -> :class:`SymmTensor`, and ``barrier()``.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Callable

import torch

from . import env


@dataclass
class SymmTensor:
    """A buffer of the same shape on every rank, plus every rank's base address (the peer-pointer table)."""

    tensors: dict[int, torch.Tensor]     # rank -> that rank's own buffer (only local ranks present)
    ptrs: list[int]                      # rank -> address usable from this process
    handle: object | None = None         # torch symmetric-memory handle (GPU only), kept alive

    def local(self, rank: int) -> torch.Tensor:
        return self.tensors[rank]

    def ptr(self, peer: int) -> int:
        return self.ptrs[peer]


class EmulatedWorld:
    """``world_size`` ranks in this process, on the CPU (Triton interpreter)."""

    def __init__(self, world_size: int):
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.world_size = world_size
        self.local_ranks = list(range(world_size))
        self.emulated = True

    def device(self, rank: int) -> torch.device:
        return torch.device("cpu")

    def symmetric_empty(self, numel: int, dtype: torch.dtype) -> SymmTensor:
        tensors = {r: torch.empty(numel, dtype=dtype) for r in self.local_ranks}
        return SymmTensor(tensors, [tensors[r].data_ptr() for r in self.local_ranks])

    def barrier(self) -> None:
        pass


class TorchSymmWorld:
    """This process is one rank of an initialised NCCL process group; one GPU per rank."""

    def __init__(self):
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError("TorchSymmWorld needs torch.distributed initialised (use xstage.ranks.spawn)")
        self.dist = dist
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.local_ranks = [self.rank]
        self.emulated = False
        self._device = torch.device("cuda", torch.cuda.current_device())

    def device(self, rank: int) -> torch.device:
        return self._device

    def symmetric_empty(self, numel: int, dtype: torch.dtype) -> SymmTensor:
        import torch.distributed._symmetric_memory as symm_mem

        buf = symm_mem.empty(numel, dtype=dtype, device=self._device)
        hdl = symm_mem.rendezvous(buf, self.dist.group.WORLD)
        return SymmTensor({self.rank: buf}, list(hdl.buffer_ptrs), hdl)

    def barrier(self) -> None:
        torch.cuda.synchronize()
        self.dist.barrier()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, fn: Callable, args: tuple) -> None:
    import torch.distributed as dist

    env.apply_safe_env()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world_size, device_id=torch.device("cuda", rank))
    try:
        fn(TorchSymmWorld(), *args)
    finally:
        dist.barrier()
        dist.destroy_process_group()


def spawn(fn: Callable, world_size: int, *args) -> None:
    """Run ``fn(world, *args)`` on ``world_size`` GPUs, one process each (users never type torchrun).

    Raises before starting anything when fewer GPUs are visible.
    """
    import torch.multiprocessing as mp

    if world_size < 2:
        raise ValueError(f"world_size must be >= 2 for remote stores, got {world_size}")
    env.require_gpus(world_size, f"a {world_size}-rank run")
    env.apply_safe_env()
    mp.spawn(_worker, args=(world_size, _free_port(), fn, args), nprocs=world_size, join=True)
