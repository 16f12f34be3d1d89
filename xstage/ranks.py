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

- ``SharedMemoryWorld``: the CPU counterpart of ``TorchSymmWorld`` (Triton's interpreter, ``XSTAGE_CPU_RANKS=1``):
  one process per rank over gloo, each rank's symmetric buffer a file in /dev/shm that every rank maps, so the
  pointer table holds addresses valid in this process (the interpreter dereferences them).

Who starts the ranks (:func:`spawn`, the one launch function of every sweep): the launcher that started this
process when its environment says so (torchrun, SLURM's srun: :func:`xstage.env.launched`; this process is then
one rank, its GPU the LOCAL_RANK-th), else xstage itself (``mp.spawn``, one process per GPU). A launched world
is checked before anything launches: its size is the one the sweep asks for, every rank runs the same plan, and
a world whose ranks reach each other through peer pointers sits on one host.

All expose ``world_size``, ``local_ranks`` (the ranks this process drives), ``device(rank)``,
``symmetric_empty(numel, dtype, destination=False)`` -> :class:`SymmTensor`, ``barrier()``, ``link``
(what a remote store crosses: "nvlink", "host", "local" or "emulated") and ``emulated`` (True when one process
drives every rank, one after another: no collectives, kernels only push, waits come after; the CPU world and
the one-GPU world). ``destination=True`` marks a buffer that peers store into (combine, outputs); only
``OneGPUWorld(link="host")`` places those differently.
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import os
import re
import shlex
import socket
import sys
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path
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


def _join_process_group(world, link: str) -> None:
    """This process as one rank of the initialised process group: ``dist``, ``rank``, ``world_size``,
    ``local_ranks`` (this rank alone), ``emulated`` False and ``link``."""
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError(f"{type(world).__name__} needs torch.distributed initialised (use xstage.ranks.spawn)")
    world.dist = dist
    world.rank = dist.get_rank()
    world.world_size = dist.get_world_size()
    world.local_ranks = [world.rank]
    world.emulated = False
    world.link = link


class TorchSymmWorld:
    """This process is one rank of an initialised NCCL process group; one GPU per rank."""

    def __init__(self):
        _join_process_group(self, "nvlink")
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


class SharedMemoryWorld:
    """This process is one rank of an initialised gloo process group on the CPU (Triton's interpreter): every
    rank's symmetric buffer is a file in ``shm_dir`` (/dev/shm) that every rank maps, so each pointer table holds
    addresses valid in this process, as :class:`TorchSymmWorld`'s peer pointers are; barriers are gloo's.
    The files are unlinked once every rank has mapped them (the mappings stay until the buffers are freed)."""

    def __init__(self, shm_dir: str | Path = "/dev/shm"):
        _join_process_group(self, "shared_memory")
        self._dir = Path(shm_dir)
        tag = [uuid.uuid4().hex[:12]]
        self.dist.broadcast_object_list(tag, src=0)   # one name for this world's files on every rank
        self._tag, self._count = tag[0], 0

    def device(self, rank: int) -> torch.device:
        return torch.device("cpu")

    def _file(self, rank: int) -> str:
        return str(self._dir / f"xstage-{self._tag}-{self._count}-r{rank}")

    def symmetric_empty(self, numel: int, dtype: torch.dtype, destination: bool = False) -> SymmTensor:
        self._count += 1
        own = torch.from_file(self._file(self.rank), shared=True, size=numel, dtype=dtype)
        self.dist.barrier()                      # every rank's file exists
        maps = {r: own if r == self.rank else torch.from_file(self._file(r), shared=True, size=numel, dtype=dtype)
                for r in range(self.world_size)}
        self.dist.barrier()                      # every rank has mapped every file
        os.unlink(self._file(self.rank))
        return SymmTensor({self.rank: own}, [maps[r].data_ptr() for r in range(self.world_size)], handle=maps)

    def barrier(self) -> None:
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
    dist.init_process_group("nccl", rank=rank, world_size=world_size, device_id=torch.device("cuda", rank),
                            **_timeout())
    try:
        fn(TorchSymmWorld(), *args)
    finally:
        dist.barrier()
        dist.destroy_process_group()


def _cpu_worker(rank: int, world_size: int, port: int, fn: Callable, args: tuple) -> None:
    """A spawned CPU rank (``XSTAGE_CPU_RANKS=1``): gloo, :class:`SharedMemoryWorld`."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            **_timeout())
    try:
        fn(SharedMemoryWorld(), *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()


RANK_TIMEOUT = "XSTAGE_RANK_TIMEOUT_S"


def _timeout() -> dict:
    """The process group's timeout: ``XSTAGE_RANK_TIMEOUT_S`` seconds where set (tests: a stopped peer is an
    error in seconds), else torch's default."""
    raw = os.environ.get(RANK_TIMEOUT)
    if not raw:
        return {}
    try:
        seconds = float(raw)
    except ValueError:
        raise ValueError(f"{RANK_TIMEOUT}={raw!r} is not a number of seconds") from None
    if seconds <= 0:
        raise ValueError(f"{RANK_TIMEOUT}={raw!r} must be > 0")
    return {"timeout": datetime.timedelta(seconds=seconds)}


def _how_to_start(launcher: str, n: int) -> str:
    return f"torchrun --nproc-per-node {n}" if launcher == "torchrun" else f"srun --ntasks {n}"


def _local_gpu(launch: env.Launch) -> int:
    """The GPU of a launched rank: the LOCAL_RANK-th visible one, or the only one (a GPU per task)."""
    n = env.gpu_count()
    if n == 0:
        raise RuntimeError(f"{launch.describe()}: no CUDA GPU visible on this host (for CPU ranks under Triton's "
                           f"interpreter set {env.CPU_RANKS}=1)")
    if n > 1 and launch.local_rank >= n:
        raise RuntimeError(f"{launch.describe()}: local rank {launch.local_rank} but {n} GPUs visible on this host; "
                           f"start at most {n} ranks per node")
    return launch.local_rank if n > 1 else 0


def require_world(world_size: int, what: str, simulated: bool | None = None, cpu: bool = False,
                  option: str | None = None) -> None:
    """Before anything launches: the ranks ``what`` needs are there. Launched (torchrun, srun): the launcher
    started exactly ``world_size`` ranks and this one has a GPU; otherwise ``world_size`` visible GPUs
    (:func:`xstage.env.require_gpus`). ``cpu``: ``what`` also runs on CPU ranks (``XSTAGE_CPU_RANKS=1``);
    ``option``: the command line's option that sets the world size (named in the error)."""
    launch = env.launched()
    on_cpu = cpu and env.cpu_ranks()
    if launch is not None:
        if launch.world_size != world_size:
            asked = f" ({option} {world_size})" if option else ""
            raise ValueError(f"{what} runs on {world_size} rank(s){asked}, but {launch.launcher} started "
                             f"{launch.world_size} (this is {launch.describe()}): start {world_size} "
                             f"({_how_to_start(launch.launcher, world_size)})"
                             + (f", give {option} {launch.world_size}" if option else "")
                             + " or run it without a launcher")
        if not on_cpu:
            _local_gpu(launch)
        return
    if not on_cpu:
        env.require_gpus(world_size, what, simulated)


def require_one_process(what: str) -> None:
    """``what`` runs in this one process (the one-GPU world, a simulated source): refuse a launched world of
    more ranks, each of which would write the same record."""
    launch = env.launched()
    if launch is not None and launch.world_size > 1:
        raise ValueError(f"{what} runs in one process, but {launch.launcher} started {launch.world_size} (this is "
                         f"{launch.describe()}) and each would write the same record: run it without a launcher "
                         f"(or {_how_to_start(launch.launcher, 1)})")


def spawn(fn: Callable, world_size: int, *args, peers: bool = True, plan=None) -> None:
    """Run ``fn(world, *args)`` on ``world_size`` ranks, one process each.

    Launched (torchrun, srun; :func:`xstage.env.launched`): this process runs ``fn`` as its rank, in a process
    group met through the launcher's rendezvous (torchrun's ``env://``; srun's MASTER_ADDR:MASTER_PORT), after
    checking on every rank that the launcher started ``world_size`` ranks, that every rank runs the same ``plan``
    (default ``args``; provenance dates excluded) and, with ``peers`` (the ranks store into each other's
    buffers), that they sit on one host. Otherwise xstage starts them (``mp.spawn``: one process per GPU;
    nothing to type but the command), CPU processes over gloo where ``XSTAGE_CPU_RANKS=1``. Raises before
    starting anything when fewer GPUs are visible. One rank is a world too: the host link and local memory need
    no peer (callers that send to a peer check for >= 2 themselves).
    """
    import torch.multiprocessing as mp

    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    require_world(world_size, f"a {world_size}-rank run", cpu=True)
    _timeout()                    # a bad XSTAGE_RANK_TIMEOUT_S is one error here, not one per started rank
    launch = env.launched()
    if launch is not None:
        _run_launched(launch, fn, args, args if plan is None else plan, peers)
        return
    env.apply_safe_env()
    worker = _cpu_worker if env.cpu_ranks() else _worker
    mp.spawn(worker, args=(world_size, free_port(), fn, args), nprocs=world_size, join=True)


# ------------------------------------------------------------------------------------- a launched world
PER_RANK_KEYS = ("date_utc",)   # provenance a plan's ranks may differ in (each rank dates its own)


def _plan_view(x):
    """A plan as plain values (what :func:`plan_digest` hashes): dataclasses by fields, mappings without
    :data:`PER_RANK_KEYS`, functions by name."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return (type(x).__qualname__,) + tuple((f.name, _plan_view(getattr(x, f.name))) for f in dataclasses.fields(x))
    if isinstance(x, dict):
        return tuple((str(k), _plan_view(v)) for k, v in x.items() if k not in PER_RANK_KEYS)
    if isinstance(x, (list, tuple)):
        return tuple(_plan_view(v) for v in x)
    if isinstance(x, (set, frozenset)):
        return tuple(sorted(repr(_plan_view(v)) for v in x))
    if x is None or isinstance(x, (str, int, float, bool)):
        return x
    if isinstance(x, Path):
        return str(x)
    return getattr(x, "__qualname__", type(x).__qualname__)


def plan_digest(fn: Callable, world_size: int, plan) -> str:
    """What every rank of a launched world must agree on: the job, the world size and its plan (12 hex)."""
    view = (getattr(fn, "__module__", ""), getattr(fn, "__qualname__", repr(fn)), world_size, _plan_view(plan))
    return hashlib.sha256(repr(view).encode()).hexdigest()[:12]


def _spans(ranks: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out, ranks = [], sorted(ranks)
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ", ".join(out)


PEER_POINTERS = ("its ranks store into each other's buffers through peer pointers (NVLink, torch symmetric memory), "
                 "which do not cross hosts: run every rank on one node (torchrun --nnodes 1, srun --nodes 1)")


def check_one_node(launch: env.Launch) -> None:
    """Before any rendezvous: refuse a world the launcher says spans nodes (torchrun's GROUP_WORLD_SIZE or
    LOCAL_WORLD_SIZE, srun's SLURM_STEP_NUM_NODES); :func:`check_one_host` checks the gathered hosts after it."""
    if launch.nodes is not None and launch.nodes > 1:
        raise RuntimeError(f"{launch.describe()}: the world spans {launch.nodes} nodes ({launch.nodes_var}), but "
                           + PEER_POINTERS)


def check_one_host(hosts: Sequence[str]) -> None:
    """Refuse a world whose ranks (``hosts[r]``: rank r's host) sit on more than one host: its ranks store into
    each other's buffers through peer pointers (NVLink, torch symmetric memory; /dev/shm for CPU ranks),
    which do not cross hosts."""
    by_host: dict[str, list[int]] = {}
    for r, h in enumerate(hosts):
        by_host.setdefault(h, []).append(r)
    if len(by_host) > 1:
        where = "; ".join(f"rank{'s' if len(rs) > 1 else ''} {_spans(rs)} on {h}" for h, rs in by_host.items())
        raise RuntimeError(f"the world spans {len(by_host)} hosts ({where}), but " + PEER_POINTERS)


def check_same_plan(plans: Sequence[str], commands: Sequence[str]) -> None:
    """Refuse a world whose ranks run different plans (``plans[r]``: rank r's :func:`plan_digest`)."""
    bad = [r for r, p in enumerate(plans) if p != plans[0]]
    if bad:
        r = bad[0]
        raise ValueError(f"{'ranks' if len(bad) > 1 else 'rank'} {_spans(bad)} {'run' if len(bad) > 1 else 'runs'} "
                         f"another plan than rank 0 (plan "
                         f"{plans[r]}, rank 0's {plans[0]}): every rank must run the same command with the same "
                         f"options and defaults; rank 0 ran `{commands[0]}`, rank {r} `{commands[r]}`")


def _collective_failed(e: BaseException) -> bool:
    """Whether ``e`` was raised inside torch.distributed (a peer that stopped, a timeout, a lost connection)."""
    import torch.distributed as dist

    if isinstance(e, getattr(dist, "DistError", ())):
        return True
    frames = traceback.extract_tb(e.__traceback__)
    return bool(frames) and f"torch{os.sep}distributed" in frames[-1].filename


def _first_line(e: BaseException) -> str:
    """The gist of a torch.distributed error: its first sentence, without gloo's source location."""
    first = re.sub(r"^\[[^\]]*\]\s*", "", (str(e).strip().splitlines() or [type(e).__name__])[0])
    return first.split(". ")[0][:200]    # gloo: "[pair.cc:553] Connection closed by peer [addr]:port. ..."


_STORES: dict = {}   # (rendezvous, rank, world size, timeout) -> [its store, process groups made on it]


def _launch_store(launch: env.Launch, timeout):
    """The rendezvous of this launch, made once per process: torchrun's ``env://`` (its agent's store), or for
    srun tasks rank 0's TCPStore at MASTER_ADDR:MASTER_PORT (``tcp://``; this process's environment is left as
    SLURM set it). Each process group gets a fresh prefix in it: a sweep that spawns twice (or a test session
    under torchrun) initialises a group again without reading the keys of the one before."""
    import torch.distributed as dist

    url = "env://" if launch.launcher == "torchrun" else f"tcp://{launch.master_addr}:{launch.master_port}"
    key = (url, launch.rank, launch.world_size, timeout)
    if key not in _STORES:
        store, _, _ = next(dist.rendezvous(url, launch.rank, launch.world_size,
                                           **({} if timeout is None else {"timeout": timeout})))
        _STORES[key] = [store, 0]
    _STORES[key][1] += 1
    return dist.PrefixStore(f"xstage-{_STORES[key][1]}", _STORES[key][0])


def _run_launched(launch: env.Launch, fn: Callable, args: tuple, plan, peers: bool) -> None:
    """``fn(world, *args)`` as rank ``launch.rank`` of the launcher's world (see :func:`spawn`)."""
    import torch.distributed as dist

    if peers:
        check_one_node(launch)
    env.apply_safe_env()
    cpu = env.cpu_ranks()
    kw = _timeout()
    if not cpu:
        gpu = _local_gpu(launch)
        torch.cuda.set_device(gpu)
        kw["device_id"] = torch.device("cuda", gpu)
    try:
        dist.init_process_group("gloo" if cpu else "nccl", store=_launch_store(launch, kw.get("timeout")),
                                rank=launch.rank, world_size=launch.world_size, **kw)
    except Exception as e:
        if not _collective_failed(e):
            raise
        raise RuntimeError(f"{launch.describe()}: the ranks did not meet at {launch.master_addr}:"
                           f"{launch.master_port} ({_first_line(e)}): did all {launch.world_size} start, and can "
                           f"they reach rank 0's host?") from e
    try:
        every = [None] * launch.world_size
        command = shlex.join(["xstage"] + sys.argv[1:])
        dist.all_gather_object(every, (launch.host, plan_digest(fn, launch.world_size, plan), command))
        if peers:
            check_one_host([h for h, _, _ in every])
        check_same_plan([p for _, p, _ in every], [c for _, _, c in every])
        fn(SharedMemoryWorld() if cpu else TorchSymmWorld(), *args)
        if not cpu:
            torch.cuda.synchronize()
        dist.barrier()
    except Exception as e:
        if _collective_failed(e):
            raise RuntimeError(f"{launch.describe()}: a collective failed: a peer rank stopped or cannot be reached "
                               f"({_first_line(e)}); the configurations finished so far are recorded: run the same "
                               f"command again to resume") from e
        raise
    finally:
        dist.destroy_process_group()


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
