"""Ranks and symmetric memory: one interface for real GPUs and for ranks emulated on the CPU.

- ``TorchSymmWorld``: one process per GPU (started by :func:`spawn`), peer buffers from
  ``torch.distributed._symmetric_memory`` (``empty`` -> ``rendezvous`` -> ``buffer_ptrs``). A kernel reaches a
  peer's buffer through that peer's address in this process's address space.
- ``EmulatedWorld``: N ranks in one process on the CPU for Triton's interpreter. Each rank's "symmetric
  buffer" is a CPU tensor and the pointer table holds their addresses, so kernels take the same code path.
  Ranks run one after another; kernels only push (remote stores, flag releases), waits happen after.
- ``OneGPUWorld``: the same N ranks in one process on ONE GPU (compiled kernels, real timings). Every rank's
  buffer is device memory (``link="local"``), or, with ``link="host"``, the *destination* buffers of every rank
  but ``observed`` are pinned host memory, so the observed rank's remote stores cross PCIe (the host link of
  the Burst-Gap model) while everything it reads stays on the GPU.

All expose ``world_size``, ``local_ranks`` (the ranks this process drives), ``device(rank)``,
``symmetric_empty(numel, dtype, destination=False)`` -> :class:`SymmTensor`, ``barrier()``, ``link``
(what a remote store crosses: "nvlink", "host", "local" or "emulated") and ``emulated`` (True when one process
drives every rank, one after another: no collectives, kernels only push, waits come after; the CPU world and
the one-GPU world). ``destination=True`` marks a buffer that peers store into (combine, outputs); only
``OneGPUWorld(link="host")`` places those differently.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from . import env
from .kernels.sync import epoch_barrier_kernel


@dataclass
class SymmTensor:
    """A buffer of the same shape on every rank, plus every rank's base address (the peer-pointer table)."""

    tensors: dict[int, torch.Tensor]     # rank -> that rank's own buffer (only local ranks present)
    ptrs: list[int]                      # rank -> address usable from this process
    handle: object | None = None         # torch symmetric-memory handle (GPU only), kept alive
    views: dict[int, list[int]] | None = None   # local rank -> its own pointer table, where tables differ by rank
    #                                              (xstage.traffic.TrafficWorld); None: every rank's is ``ptrs``

    def local(self, rank: int) -> torch.Tensor:
        return self.tensors[rank]

    def ptr(self, peer: int) -> int:
        return self.ptrs[peer]

    def table(self, rank: int) -> list[int]:
        """The peer-pointer table local rank ``rank``'s kernels use (``ptrs``, unless the world maps ranks)."""
        return self.ptrs if self.views is None else self.views[rank]


class EmulatedWorld:
    """``world_size`` ranks in this process, on the CPU (Triton interpreter)."""

    def __init__(self, world_size: int):
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.world_size = world_size
        self.local_ranks = list(range(world_size))
        self.emulated = True
        self.link = "emulated"

    def device(self, rank: int) -> torch.device:
        return torch.device("cpu")

    def symmetric_empty(self, numel: int, dtype: torch.dtype, destination: bool = False) -> SymmTensor:
        tensors = {r: torch.empty(numel, dtype=dtype) for r in self.local_ranks}
        return SymmTensor(tensors, [tensors[r].data_ptr() for r in self.local_ranks])

    def barrier(self) -> None:
        pass


ONE_GPU_LINKS = ("local", "host")


class OneGPUWorld:
    """``world_size`` ranks in this process on one GPU, run one after another (like :class:`EmulatedWorld`, but
    compiled and timed). ``link="local"``: every buffer in device memory (a compute-only control: remote stores
    are local ones). ``link="host"``: destination buffers of the ranks other than ``observed`` live in pinned
    host memory (the GPU reaches them over PCIe through their unified addresses), so the observed rank's
    stores to its peers take the host link; its own buffers and every buffer it reads stay on the GPU."""

    def __init__(self, world_size: int, link: str = "local", observed: int = 0, device: int | str = 0):
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if link not in ONE_GPU_LINKS:
            raise ValueError(f"link must be one of {ONE_GPU_LINKS}, got {link!r}")
        if not 0 <= observed < world_size:
            raise ValueError(f"observed rank must be in [0, {world_size}), got {observed}")
        env.require_gpus(1, f"a one-GPU world of {world_size} ranks")
        self.world_size = world_size
        self.local_ranks = list(range(world_size))
        self.emulated = True
        self.link = link
        self.observed = observed
        self._device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)

    def device(self, rank: int) -> torch.device:
        return self._device

    def on_host(self, rank: int, destination: bool) -> bool:
        """Whether rank ``rank``'s buffer of this kind lives in pinned host memory."""
        return self.link == "host" and destination and rank != self.observed

    def symmetric_empty(self, numel: int, dtype: torch.dtype, destination: bool = False) -> SymmTensor:
        tensors = {r: (torch.empty(numel, dtype=dtype, pin_memory=True) if self.on_host(r, destination)
                       else torch.empty(numel, dtype=dtype, device=self._device)) for r in self.local_ranks}
        return SymmTensor(tensors, [tensors[r].data_ptr() for r in self.local_ranks])

    def barrier(self) -> None:
        torch.cuda.synchronize(self._device)


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
        self.link = "nvlink"
        self._device = torch.device("cuda", torch.cuda.current_device())

    def device(self, rank: int) -> torch.device:
        return self._device

    def symmetric_empty(self, numel: int, dtype: torch.dtype, destination: bool = False) -> SymmTensor:
        import torch.distributed._symmetric_memory as symm_mem

        buf = symm_mem.empty(numel, dtype=dtype, device=self._device)
        hdl = symm_mem.rendezvous(buf, self.dist.group.WORLD)
        return SymmTensor({self.rank: buf}, list(hdl.buffer_ptrs), hdl)

    def barrier(self) -> None:
        torch.cuda.synchronize()
        self.dist.barrier()


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (rendezvous of spawned ranks; servers in tests)."""
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

    Raises before starting anything when fewer GPUs are visible. One rank is a world too: the host link and
    local memory need no peer (callers that send to a peer check for >= 2 themselves).
    """
    import torch.multiprocessing as mp

    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    env.require_gpus(world_size, f"a {world_size}-rank run")
    env.apply_safe_env()
    mp.spawn(_worker, args=(world_size, free_port(), fn, args), nprocs=world_size, join=True)


def epoch_barrier(world, flag_table: dict[int, torch.Tensor], flags: SymmTensor, status: dict[int, torch.Tensor],
                  epoch: int, what: str, max_polls: int, check: bool = True, silent_ranks: Sequence[int] = ()) -> None:
    """End-of-layer barrier (``kernels.sync.epoch_barrier_kernel``): every rank releases ``epoch`` into every
    peer's flags (after a system-scope fence) and waits, bounded, for all peers'. ``flag_table[r]`` holds every
    rank's flags address as seen from rank r; ``status[r]`` is int64 [P, 6]. Emulated ranks signal first, then
    wait (kernels only push). ``silent_ranks`` never signal (tests: a missing peer ends in an error)."""
    if max_polls < 1:
        raise ValueError(f"max_polls must be >= 1, got {max_polls}")
    hook = getattr(world, "epoch_barrier", None)
    if hook is not None:   # a world whose ranks are not its processes' ranks (xstage.traffic.TrafficWorld)
        return hook(flag_table, flags, status, epoch, what, max_polls, check, silent_ranks)
    device = not env.interpreted()

    def launch(r, signal, wait):
        epoch_barrier_kernel[(1,)](flag_table[r], flags.local(r), status[r], r, world.world_size, epoch, max_polls,
                                   SIGNAL=signal, WAIT=wait, DEVICE=device, num_warps=1)

    present = [r for r in world.local_ranks if r not in silent_ranks]
    if world.emulated:
        for r in present:
            launch(r, True, False)
        for r in present:
            launch(r, False, True)
    else:
        for r in present:
            launch(r, True, True)
    if check:
        for r in present:
            raise_on_barrier_timeout(status[r], what)


def raise_on_barrier_timeout(status: torch.Tensor, what: str) -> None:
    """Raise RuntimeError naming the waiting rank and the first peer that never arrived (instead of a hang)."""
    st = status.cpu()
    bad = torch.nonzero(st[:, 5]).flatten()
    if bad.numel():
        waiter, peer, expected, seen, polls, _ = (int(x) for x in st[int(bad[0])])
        raise RuntimeError(f"{what}: rank {waiter} timed out waiting for rank {peer} (expected epoch {expected}, "
                           f"saw {seen} after {polls} polls; {bad.numel()} peer(s) missing: {bad.tolist()})")
