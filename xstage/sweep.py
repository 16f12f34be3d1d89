"""Sweeps: the burst-gap grid, run on GPUs (one process per GPU), on the model (simulated), resumable.

``run_burst_gap(grid, out, source)`` is what ``xstage sweep burst-gap`` calls. On GPUs it starts its own ranks
(:func:`xstage.ranks.spawn`); every rank sends to its next peer ((r + 1) % W) at the same time, as in a
combine or an all-to-all, and every rank records. Rows are appended per configuration (all repeats, all
ranks) atomically; a re-run with the same output folder skips configurations already there.
"""
from __future__ import annotations

import random
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from . import data, env
from .remote_store import (POISON, BurstGapPoint, burst_gap_buffers, calibrate_clock, check_barrier_status,
                           check_destination, launch_burst_gap, summarize_timestamps, to_ns)

KIB = 1024


@dataclass(frozen=True)
class BurstGapGrid:
    """The sweep's axes. ``programs=()`` means (1, 4, 16, SMs/2, SMs, 2*SMs) of the GPU it runs on."""

    burst_kib: tuple[int, ...] = tuple(2**i for i in range(13))          # 1 KiB .. 4 MiB per program
    gap_us: tuple[float, ...] = (0, 1, 3, 10, 30, 100)
    programs: tuple[int, ...] = ()
    store_bytes: tuple[int, ...] = (16, 4)
    targets: tuple[str, ...] = ("remote", "local")
    n_bursts: int = 8
    repeats: int = 5
    drain: tuple[bool, ...] = (False,)
    sync: bool = True
    world_size: int = 2

    def program_counts(self, sm_count: int) -> tuple[int, ...]:
        return self.programs or (1, 4, 16, sm_count // 2, sm_count, 2 * sm_count)

    def points(self, sm_count: int) -> list[BurstGapPoint]:
        pts = [BurstGapPoint(t, p, kib * KIB, int(round(g * 1000)), w, self.n_bursts, d, self.sync)
               for d in self.drain for t in self.targets for w in self.store_bytes
               for p in self.program_counts(sm_count) for g in self.gap_us for kib in self.burst_kib]
        return pts

    def validate(self, sm_count: int | None = None) -> None:
        """Every point checked before anything launches."""
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if self.world_size < 2:
            raise ValueError(f"world_size must be >= 2 (remote stores need a peer), got {self.world_size}")
        for kib in self.burst_kib:
            if kib <= 0:
                raise ValueError(f"burst_kib must be positive, got {kib}")
        for p in self.points(sm_count or 132):
            p.validate(max_programs=64 * (sm_count or 132))


# --------------------------------------------------------------------------------------- one config, all ranks
def _dst_addr(world, symm, local, rank: int, target: str) -> int:
    return symm.ptr((rank + 1) % world.world_size) if target == "remote" else local[rank].data_ptr()


def measure_point(world, symm, local, p: BurstGapPoint, repeats: int, seed: int = 0,
                  clock: dict | None = None) -> pd.DataFrame:
    """Warm-up train, then ``repeats`` trains on every local rank; per-burst rows for every rank."""
    bufs = {r: burst_gap_buffers(p, world.device(r)) for r in world.local_ranks}
    cpn = {r: (clock or {}).get(r, {"cycles_per_ns": 1.0})["cycles_per_ns"] for r in world.local_ranks}
    rows = []
    for rep in range(-1, repeats):
        world.barrier()
        for r in world.local_ranks:
            launch_burst_gap(_dst_addr(world, symm, local, r, p.target), bufs[r], p, seed + r, cpn[r])
        world.barrier()
        for r in world.local_ranks:
            check_barrier_status(bufs[r]["status"], p, r)
        if rep < 0:
            continue
        for r in world.local_ranks:
            ns = to_ns(bufs[r]["ts"].view(p.programs, p.n_bursts, 4).cpu().numpy(),
                       bufs[r]["cal"].view(p.programs, 2).cpu().numpy(), cpn[r])
            s = {k: np.round(v, 1) for k, v in summarize_timestamps(ns).items()}  # 0.1 ns; a cycle is ~0.5 ns
            rows.append(pd.DataFrame({**asdict(p), "rank": r, "repeat": rep, "burst": np.arange(p.n_bursts), **s}))
    return pd.concat(rows, ignore_index=True)


def check_point(world, symm, local, p: BurstGapPoint, seed: int) -> None:
    """Poison every destination, run one train, check each destination bit for bit (remote: the sender is
    the previous rank, with its own seed)."""
    for r in world.local_ranks:
        symm.local(r)[: p.dst_elems].fill_(POISON)
        local[r][: p.dst_elems].fill_(POISON)
    world.barrier()
    bufs = {r: burst_gap_buffers(p, world.device(r)) for r in world.local_ranks}
    for r in world.local_ranks:
        launch_burst_gap(_dst_addr(world, symm, local, r, p.target), bufs[r], p, seed + r)
    world.barrier()
    for r in world.local_ranks:
        check_barrier_status(bufs[r]["status"], p, r)
        if p.target == "remote":
            check_destination(symm.local(r), p, seed + (r - 1) % world.world_size)
        else:
            check_destination(local[r], p, seed + r)


def allocate(world, points: list[BurstGapPoint]):
    elems = max(p.dst_elems for p in points)
    symm = world.symmetric_empty(elems, torch.int32)
    local = {r: torch.empty(elems, dtype=torch.int32, device=world.device(r)) for r in world.local_ranks}
    return symm, local


def burst_gap_job(world, grid: BurstGapGrid, folder: str, meta: dict, check: bool = True) -> None:
    """Runs on every rank (GPU) or once for an emulated world: check, then measure the points not yet done."""
    rank0 = world.local_ranks[0] == 0
    sms = torch.cuda.get_device_properties(world.device(0)).multi_processor_count if not world.emulated else 4
    points = grid.points(sms)
    csv = Path(folder) / f"{data.BURST_GAP.name}.csv"
    todo_flags, seed = [None], random.randrange(2**30)
    if rank0:
        meta = {**meta, "sm_count": sms}
        data.start_file(folder, data.BURST_GAP, meta)
        done = data.done_keys(csv, data.BURST_GAP)
        todo_flags = [([p.key() not in done for p in points], seed)]
    if not world.emulated:  # every rank needs the same todo list and seeds (receivers check senders' payloads)
        world.dist.broadcast_object_list(todo_flags, src=0)
    flags, seed = todo_flags[0]
    todo = [p for p, t in zip(points, flags) if t]
    if not todo:
        return
    clock = {r: calibrate_clock(world.device(r)) for r in world.local_ranks}
    if not world.emulated:
        gathered = [None] * world.world_size
        world.dist.all_gather_object(gathered, clock)
        if rank0:
            side = Path(folder) / f"{data.BURST_GAP.name}.json"
            m = data.read_meta(side, data.BURST_GAP)
            m.setdefault("clock", []).append({str(k): v for g in gathered for k, v in g.items()})
            data.write_json_atomic(side, m)
    symm, local = allocate(world, todo)
    if check:  # bit-exact destinations before any timing: one small and one large point per target
        for t in grid.targets:
            for i, p in enumerate((todo[0], todo[-1])):
                check_point(world, symm, local, replace(p, target=t, drain=False), seed=seed + 7919 * i)
    bar = tqdm(todo, desc="burst-gap", disable=not rank0, file=sys.stderr, mininterval=2)
    for i, p in enumerate(bar):
        df = measure_point(world, symm, local, p, grid.repeats, seed=seed + i, clock=clock)
        parts = [df]
        if not world.emulated:
            parts = [None] * world.world_size
            world.dist.all_gather_object(parts, df)
        if rank0:
            data.append_rows(csv, data.BURST_GAP, pd.concat(parts, ignore_index=True))


def run_burst_gap(grid: BurstGapGrid, out: str | Path, source: str = "gpu", params=None, command: str = "") -> Path:
    """Run (or resume) the burst-gap sweep into ``out``; returns the CSV path. Validates before launching."""
    out = Path(out)
    grid.validate()  # parameters first (with a nominal 132-SM GPU), then the hardware
    if source == "gpu":
        env.require_gpus(grid.world_size, "the burst-gap sweep")
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        grid.validate(sms)
        from .ranks import spawn
        meta = env.provenance(command, {"grid": asdict(grid), "source": "gpu"})
        spawn(burst_gap_job, grid.world_size, grid, str(out), meta)
    elif source == "simulated":
        from .model import BurstGapParams, simulate_sweep

        grid.validate(132)
        prm = params or BurstGapParams.reference()
        df = simulate_sweep(grid, prm, sm_count=132, seed=0)
        meta = env.provenance(command, {"grid": asdict(grid), "source": "simulated", "model": asdict(prm)})
        meta["machine"] = "simulated"
        csv = data.start_file(out, data.BURST_GAP, meta)
        done = data.done_keys(csv, data.BURST_GAP)
        df = df[[k not in done for k in df[list(data.BURST_GAP.key)].itertuples(index=False, name=None)]]
        if len(df):
            data.append_rows(csv, data.BURST_GAP, df)
    else:
        raise ValueError(f"source for a sweep must be 'gpu' or 'simulated', got {source!r}")
    return out / f"{data.BURST_GAP.name}.csv"


def bandwidth_job(world, folder: str, meta: dict) -> None:
    from .bench import bandwidth_worker

    rows: list = []
    bandwidth_worker(world, rows)
    if world.local_ranks[0] == 0:
        csv = data.start_file(folder, data.BANDWIDTH, meta)
        data.append_rows(csv, data.BANDWIDTH, pd.DataFrame(rows))


def run_bandwidth(out: str | Path, command: str = "") -> Path:
    env.require_gpus(2, "the bandwidth benchmark")
    from .ranks import spawn

    spawn(bandwidth_job, 2, str(out), env.provenance(command, {}))
    return Path(out) / f"{data.BANDWIDTH.name}.csv"


def check_job(world, points: list[BurstGapPoint], seed: int) -> None:
    """Bit-exact destinations for each point (raises on the first mismatch, naming burst/program/element)."""
    symm, local = allocate(world, points)
    for i, p in enumerate(points):
        check_point(world, symm, local, p, seed + 1000 * i)
