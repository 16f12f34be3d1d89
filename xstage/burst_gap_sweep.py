"""The burst-gap study's sweeps: the synchronised / free-running grid and the irregular trains, run on GPUs
(one process per GPU; one rank for the host link) or on the model (simulated), resumable.

``run_burst_gap(grid, out, source)`` is what ``xstage sweep burst-gap`` calls; :func:`burst_gap_data` and
:func:`bandwidth_data` are what the notebooks call: the rows of ``source`` (recorded, gpu, simulated, auto), running
the sweep only for gpu / simulated. On GPUs it starts its own ranks, or runs as the ranks torchrun / srun
started (:func:`xstage.ranks.spawn`); every rank sends to its next peer ((r + 1) % W) at the same time, as in a
combine or an all-to-all, and every rank records. Rows are appended per configuration (all repeats, all
ranks) atomically; a re-run with the same output folder skips configurations already there.
"""
from __future__ import annotations

import contextlib
import random
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from . import data, env, resume
from .fluid import KIB, BurstGapParams, simulate_sweep
from .model import simulated_train_rows
from .ranks import require_one_process, require_world, spawn
from .sources import (check_variant as _check_variant, default_out as _default_out, recorded as _recorded,
                      source_data as _source_data)
from .remote_store import (bandwidth_worker, POISON, TRAIN_GAP_US, TRAIN_KIB, BurstGapPoint, BurstTrain, burst_gap_buffers, calibrate_clock,
                           check_barrier_status, check_destination, check_train_destination, destination_buffer,
                           launch_burst_gap, launch_train, summarize_timestamps, summarize_train, to_ns,
                           probe_family, probe_size_family, train_buffers, train_family, LOAD_PROBES, check_load_probe, train_stamps)



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
    release: bool = True    # the grid barrier's arrival is a release (drains the stage); False: relaxed

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
        _check_world(self.world_size, self.targets)
        for kib in self.burst_kib:
            if kib <= 0:
                raise ValueError(f"burst_kib must be positive, got {kib}")
        for p in self.points(sm_count or 132):
            p.validate(max_programs=64 * (sm_count or 132))


def _check_world(world_size: int, targets) -> None:
    """Remote stores need a peer (>= 2 ranks); the host link and local memory need one GPU."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if "remote" in targets and world_size < 2:
        raise ValueError(f"target 'remote' needs world_size >= 2 (a peer GPU over NVLink), got {world_size}; "
                         f"on one GPU use --targets host,local (pinned host memory over PCIe)")


def default_targets() -> tuple[str, ...]:
    """remote + local where two GPUs are visible (or on a CPU, whose emulated ranks have peers); host + local
    on a one-GPU machine, whose remote path is the host link."""
    return ("host", "local") if env.gpu_count() == 1 else ("remote", "local")


def world_for(targets) -> int:
    """The smallest world a set of targets needs."""
    return 2 if "remote" in targets else 1


# --------------------------------------------------------------------------------------- one config, all ranks
@dataclass
class Destinations:
    """Where each rank's stores go: the peer's symmetric buffer (remote), pinned host memory (host) or the
    rank's own memory (local). Only the targets a sweep uses are allocated."""

    symm: object | None
    host: dict
    local: dict

    def addr(self, world, rank: int, target: str) -> int:
        if target == "remote":
            return self.symm.ptr((rank + 1) % world.world_size)
        return (self.host if target == "host" else self.local)[rank].data_ptr()

    def received(self, world, rank: int, target: str):
        """(the buffer this rank's target wrote into as seen by its receiver, the seed offset of its sender)."""
        if target == "remote":
            return self.symm.local(rank), (rank - 1) % world.world_size
        return (self.host if target == "host" else self.local)[rank], rank

    def poison(self, world, elems: int) -> None:
        for r in world.local_ranks:
            for buf in ([self.symm.local(r)] if self.symm is not None else []) + [
                    d[r] for d in (self.host, self.local) if r in d]:
                buf[:elems].fill_(POISON)


def _timed_runs(world, repeats: int, launch, check, record) -> pd.DataFrame:
    """The one measurement loop of both studies: a warm-up run, then ``repeats`` runs; each run
    ``launch(rank)`` on every local rank between world barriers, ``check(rank)``, then (timed runs only)
    ``record(rank, repeat)`` -> that rank's rows."""
    rows = []
    for rep in range(-1, repeats):
        world.barrier()
        for r in world.local_ranks:
            launch(r)
        world.barrier()
        for r in world.local_ranks:
            check(r)
        if rep >= 0:
            rows += [record(r, rep) for r in world.local_ranks]
    return pd.concat(rows, ignore_index=True)


def _ns(bufs, programs: int, n_bursts: int, stamps: int, cycles_per_ns: float) -> np.ndarray:
    return to_ns(bufs["ts"].view(programs, n_bursts, stamps).cpu().numpy(),
                 bufs["cal"].view(programs, 2).cpu().numpy(), cycles_per_ns)


def measure_point(world, dests: Destinations, p: BurstGapPoint, repeats: int, seed: int = 0,
                  clock: dict | None = None, release: bool = True) -> pd.DataFrame:
    """Warm-up train, then ``repeats`` trains on every local rank; per-burst rows for every rank."""
    bufs = {r: burst_gap_buffers(p, world.device(r)) for r in world.local_ranks}
    cpn = {r: (clock or {}).get(r, {"cycles_per_ns": 1.0})["cycles_per_ns"] for r in world.local_ranks}

    def record(r, rep):
        ns = _ns(bufs[r], p.programs, p.n_bursts, 4, cpn[r])
        s = {k: np.round(v, 1) for k, v in summarize_timestamps(ns).items()}  # 0.1 ns; a cycle is ~0.5 ns
        return pd.DataFrame({**asdict(p), "rank": r, "repeat": rep, "burst": np.arange(p.n_bursts), **s})

    return _timed_runs(world, repeats,
                       lambda r: launch_burst_gap(dests.addr(world, r, p.target), bufs[r], p, seed + r, cpn[r],
                                                  release=release),
                       lambda r: check_barrier_status(bufs[r]["status"], p, r), record)


def _poison_run_check(world, dests: Destinations, target: str, elems: int, run, check) -> None:
    """Poison every destination, ``run(rank, addr, seed offset)`` on every rank, then ``check(rank, buffer,
    sender)`` each destination bit for bit (remote: the sender is the previous rank, with its own seed)."""
    dests.poison(world, elems)
    world.barrier()
    for r in world.local_ranks:
        run(r, dests.addr(world, r, target))
    world.barrier()
    for r in world.local_ranks:
        check(r, *dests.received(world, r, target))


def check_point(world, dests: Destinations, p: BurstGapPoint, seed: int, release: bool = True) -> None:
    """One synchronised train per rank, every destination checked (and every grid barrier's status)."""
    bufs = {r: burst_gap_buffers(p, world.device(r)) for r in world.local_ranks}

    def check(r, buf, sender):
        check_barrier_status(bufs[r]["status"], p, r)
        check_destination(buf, p, seed + sender)

    _poison_run_check(world, dests, p.target, p.dst_elems,
                      lambda r, addr: launch_burst_gap(addr, bufs[r], p, seed + r, release=release), check)


def allocate(world, elems: int, targets) -> Destinations:
    symm = world.symmetric_empty(elems, torch.int32) if "remote" in targets else None
    host = {r: destination_buffer(elems, "host", world.device(r)) for r in world.local_ranks} if "host" in targets \
        else {}
    local = {r: destination_buffer(elems, "local", world.device(r)) for r in world.local_ranks} \
        if "local" in targets else {}
    return Destinations(symm, host, local)


CPU_SMS = 4   # what the sweeps take a CPU's "SMs" for (Triton's interpreter: the default program counts)


def _sm_count(world) -> int:
    dev = world.device(0)
    return torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else CPU_SMS


def _record_clock(world, folder: str, schema: data.Schema) -> dict:
    """Every rank's SM clock calibration, appended to the sidecar (rank 0)."""
    clock = {r: calibrate_clock(world.device(r)) for r in world.local_ranks}
    if not world.emulated:
        gathered = [None] * world.world_size
        world.dist.all_gather_object(gathered, clock)
        if world.local_ranks[0] == 0:
            side = Path(folder) / f"{schema.name}.json"
            m = data.read_meta(side, schema)
            m.setdefault("clock", []).append({str(k): v for g in gathered for k, v in g.items()})
            data.write_json_atomic(side, m)
    return clock


def _append_all_ranks(world, csv: Path, schema: data.Schema, df: pd.DataFrame) -> None:
    parts = [df]
    if not world.emulated:
        parts = [None] * world.world_size
        world.dist.all_gather_object(parts, df)
    if world.local_ranks[0] == 0:
        data.append_rows(csv, schema, pd.concat(parts, ignore_index=True))


def burst_gap_job(world, grid: BurstGapGrid, folder: str, meta: dict, check: bool = True) -> None:
    """Runs on every rank (GPU) or once for an emulated world: check, then measure the points not yet done."""
    rank0 = world.local_ranks[0] == 0
    sms = _sm_count(world)
    points = grid.points(sms)
    csv, todo, seed = resume.pending(world, folder, data.BURST_GAP, {**meta, "sm_count": sms}, points,
                                     BurstGapPoint.key, payload=random.randrange(2**30))
    if not todo:
        return
    clock = _record_clock(world, folder, data.BURST_GAP)
    dests = allocate(world, max(p.dst_elems for p in todo), grid.targets)
    if check:  # bit-exact destinations before any timing: one small and one large point per target
        for t in grid.targets:
            for i, p in enumerate((todo[0], todo[-1])):
                check_point(world, dests, replace(p, target=t, drain=False), seed=seed + 7919 * i,
                            release=grid.release)
    bar = tqdm(todo, desc="burst-gap", disable=not rank0, file=sys.stderr, mininterval=2)
    for i, p in enumerate(bar):
        df = measure_point(world, dests, p, grid.repeats, seed=seed + i, clock=clock, release=grid.release)
        _append_all_ranks(world, csv, data.BURST_GAP, df)


def _check_same_harness(out: Path, grid: BurstGapGrid) -> None:
    """A folder holds one harness: refuse to append a sweep whose barrier (sync, release) differs."""
    side = data.paths(out, data.BURST_GAP)[1]
    if not side.is_file():
        return
    had = data.read_meta(side, data.BURST_GAP).get("params", {}).get("grid", {})
    for name in ("sync", "release"):
        old, new = bool(had.get(name, True)), bool(getattr(grid, name))
        if old != new:
            raise ValueError(f"{out} holds a burst-gap sweep with {name}={old}; record {name}={new} in another "
                             f"folder")


def run_burst_gap(grid: BurstGapGrid, out: str | Path, source: str = "gpu", params=None, command: str = "") -> Path:
    """Run (or resume) the burst-gap sweep into ``out``; returns the CSV path. Validates before launching."""
    out = Path(out)
    grid.validate()  # parameters first (with a nominal 132-SM GPU), then the hardware
    _check_same_harness(out, grid)
    if source == "gpu":   # GPUs, or CPU ranks under Triton's interpreter (XSTAGE_CPU_RANKS=1)
        require_world(grid.world_size, "the burst-gap sweep" + (" (remote target)" if "remote" in grid.targets
                                                                else " (host link)"), simulated=True, cpu=True,
                      option="--world-size")
        sms = CPU_SMS if env.cpu_ranks() else torch.cuda.get_device_properties(0).multi_processor_count
        grid.validate(sms)
        meta = env.provenance(command, {"grid": asdict(grid), "source": "gpu"})
        spawn(burst_gap_job, grid.world_size, grid, str(out), meta, peers="remote" in grid.targets)
    elif source == "simulated":
        require_one_process("the simulated burst-gap sweep (--source simulated)")
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
    rows: list = []
    bandwidth_worker(world, rows)
    if world.local_ranks[0] == 0:
        csv = data.start_file(folder, data.BANDWIDTH, meta)
        data.append_rows(csv, data.BANDWIDTH, pd.DataFrame(rows))


def run_bandwidth(out: str | Path, command: str = "", world_size: int | None = None) -> Path:
    """Peak bandwidth per link: remote (with 2 GPUs), host and local. ``world_size`` None: 2 when two GPUs are
    visible, else 1 (the host link only)."""
    world_size = world_size or (2 if env.gpu_count() >= 2 else 1)
    if world_size not in (1, 2):
        raise ValueError(f"the bandwidth benchmark runs on 1 or 2 GPUs, got world_size={world_size}")
    require_world(world_size, "the bandwidth benchmark", simulated=False, option="--world-size")
    spawn(bandwidth_job, world_size, str(out), env.provenance(command, {"world_size": world_size}))
    return Path(out) / f"{data.BANDWIDTH.name}.csv"


def check_job(world, points: list[BurstGapPoint], seed: int) -> None:
    """Bit-exact destinations for each point (raises on the first mismatch, naming burst/program/element)."""
    dests = allocate(world, max(p.dst_elems for p in points), {p.target for p in points})
    for i, p in enumerate(points):
        check_point(world, dests, p, seed + 1000 * i)


# ------------------------------------------------------------------------------------ free-running trains
TRAIN_FAMILIES = ("random", "probe", "probe_size")   # TrainGrid.family


@dataclass(frozen=True)
class TrainGrid:
    """The irregular-train study: a seeded family of trains x program counts x targets (no grid barrier)."""

    seed: int = 0
    count: int = 24                                   # trains in the family
    n_bursts: int = 12
    programs: tuple[int, ...] = (16, 66, 132, 264)
    targets: tuple[str, ...] = ("host", "local")
    repeats: int = 5
    world_size: int = 1
    store_bytes: int = 16
    per_program: bool = False                         # also record every program's every burst (burst_program)
    kib: tuple[float, float] = TRAIN_KIB              # burst sizes per program (log-uniform), KiB
    gap_us: tuple[float, float] = TRAIN_GAP_US        # compute gaps (log-uniform, a quarter 0), us
    family: str = "random"                            # "random": train_family(seed, ...); "probe": probe_family;
                                                      # "probe_size": probe_size_family
                                                      # (designed: a lead burst, then 2 KiB probes; seed, count,
                                                      # kib and gap_us unused)
    preload: bool = True                              # the kernel reads every burst's parameters before the first
                                                      # (False: at each burst's top, as records before the preload,
                                                      # whose sidecars lack the key: docs/findings.md)
    load_probe: int = 0                               # 1 / 2: one timed load after each burst (an L1-resident /
                                                      # an L2 word; burst_train_store_kernel), per program only:
                                                      # burst_program's load_ns

    def trains(self) -> list[BurstTrain]:
        if self.family == "probe":
            fam = probe_family(self.n_bursts, store_bytes=self.store_bytes)
        elif self.family == "probe_size":
            fam = probe_size_family(self.n_bursts, store_bytes=self.store_bytes)
        else:
            fam = train_family(self.seed, self.count, self.n_bursts, self.kib, self.gap_us, self.store_bytes)
        return [BurstTrain(name, t, p, sizes, gaps, self.store_bytes)
                for t in self.targets for p in self.programs for name, sizes, gaps in fam]

    def validate(self, sm_count: int | None = None) -> None:
        if self.family not in TRAIN_FAMILIES:
            raise ValueError(f"family must be one of {', '.join(TRAIN_FAMILIES)}, got {self.family!r}")
        if self.load_probe not in LOAD_PROBES:
            raise ValueError(f"load_probe must be one of {LOAD_PROBES}, got {self.load_probe!r}")
        if self.load_probe and not (self.per_program and self.preload):
            raise ValueError("a load probe is recorded per program (per_program=True) with the preload kernel")
        if not (0 < self.kib[0] <= self.kib[1]) or not (0 < self.gap_us[0] <= self.gap_us[1]):
            raise ValueError(f"kib and gap_us must be ranges (low <= high, both > 0), got {self.kib}, {self.gap_us}")
        if self.repeats < 1 or self.count < 1 or self.n_bursts < 1:
            raise ValueError(f"repeats, count and n_bursts must be >= 1, got {self.repeats}, {self.count}, "
                             f"{self.n_bursts}")
        _check_world(self.world_size, self.targets)
        for tr in self.trains():
            tr.validate(max_programs=64 * (sm_count or 132))


def train_rows(tr: BurstTrain, rank: int, repeat: int, stats: dict[str, np.ndarray]) -> pd.DataFrame:
    return pd.DataFrame({"train": tr.name, "target": tr.target, "programs": tr.programs,
                         "store_bytes": tr.store_bytes, "n_bursts": tr.n_bursts, "rank": rank, "repeat": repeat,
                         "burst": np.arange(tr.n_bursts), "burst_bytes": np.asarray(tr.burst_bytes),
                         "gap_ns": np.asarray(tr.gap_ns), **{k: np.round(v, 1) for k, v in stats.items()}})


def program_rows(tr: BurstTrain, rank: int, repeat: int, ts_ns: np.ndarray, sm: np.ndarray) -> pd.DataFrame:
    """burst_program rows of one run: ts_ns[P, B, 2 or 3] (issue start, issue end, and with a load probe the
    probe's end: load_ns, else NaN) and each program's SM sm[P]."""
    P, B = tr.programs, tr.n_bursts
    load = (np.round(ts_ns[..., 2] - ts_ns[..., 1], 1).ravel() if ts_ns.shape[-1] > 2
            else np.full(P * B, np.nan))
    return pd.DataFrame({"train": tr.name, "target": tr.target, "programs": P, "store_bytes": tr.store_bytes,
                         "n_bursts": B, "rank": rank, "repeat": repeat, "program": np.repeat(np.arange(P), B),
                         "smid": np.repeat(np.asarray(sm, np.int64), B), "burst": np.tile(np.arange(B), P),
                         "burst_bytes": np.tile(np.asarray(tr.burst_bytes), P),
                         "gap_ns": np.tile(np.asarray(tr.gap_ns), P),
                         "start_ns": np.round(ts_ns[..., 0], 1).ravel(),
                         "issue_ns": np.round(ts_ns[..., 1] - ts_ns[..., 0], 1).ravel(), "load_ns": load})


def rows_from_programs(tr: BurstTrain, pp: pd.DataFrame) -> pd.DataFrame:
    """burst_train rows summarised from one train's burst_program rows (every rank and repeat)."""
    out = []
    for (r, rep), g in pp.groupby(["rank", "repeat"], sort=True):
        g = g.sort_values(["program", "burst"])
        if len(g) != tr.programs * tr.n_bursts:
            raise data.DataError(f"burst_program: train {tr.name} (P = {tr.programs}) rank {r} repeat {rep} has "
                                 f"{len(g)} rows, expected {tr.programs * tr.n_bursts}")
        t0 = g.start_ns.to_numpy(np.float64).reshape(tr.programs, tr.n_bursts)
        t1 = t0 + g.issue_ns.to_numpy(np.float64).reshape(tr.programs, tr.n_bursts)
        out.append(train_rows(tr, int(r), int(rep), summarize_train(np.stack([t0, t1], axis=-1))))
    return pd.concat(out, ignore_index=True)


def check_train(world, dests: Destinations, tr: BurstTrain, seed: int, preload: bool = True,
                load_probe: int = 0) -> None:
    """One free-running train per rank, every destination checked bit for bit (and every load probe's sink)."""
    bufs = {r: train_buffers(tr, world.device(r), load_probe) for r in world.local_ranks}
    _poison_run_check(world, dests, tr.target, tr.dst_elems,
                      lambda r, addr: launch_train(addr, bufs[r], tr, seed + r, preload=preload,
                                                   load_probe=load_probe),
                      lambda r, buf, sender: check_train_destination(buf, tr, seed + sender))
    for r in world.local_ranks:
        check_load_probe(bufs[r], tr, load_probe)


def measure_train(world, dests: Destinations, tr: BurstTrain, repeats: int, seed: int, clock: dict,
                  per_program: bool = False, preload: bool = True, load_probe: int = 0):
    """A warm-up run, then ``repeats`` runs on every local rank; per-burst rows for every rank. With
    ``per_program``: (burst_program rows, the burst_train rows summarised from them), so both agree exactly."""
    if load_probe and not per_program:
        raise ValueError("a load probe is recorded per program")
    bufs = {r: train_buffers(tr, world.device(r), load_probe) for r in world.local_ranks}
    cpn = {r: clock[r]["cycles_per_ns"] for r in world.local_ranks}
    stamps = train_stamps(load_probe)
    launch = lambda r: launch_train(dests.addr(world, r, tr.target), bufs[r], tr, seed + r, cpn[r],  # noqa: E731
                                    preload=preload, load_probe=load_probe)
    if per_program:
        pp = _timed_runs(world, repeats, launch, lambda r: None,
                         lambda r, rep: program_rows(tr, r, rep, _ns(bufs[r], tr.programs, tr.n_bursts, stamps,
                                                                     cpn[r]),
                                                     bufs[r]["sm"].cpu().numpy()))
        return pp, rows_from_programs(tr, pp)
    return _timed_runs(world, repeats, launch, lambda r: None,
                       lambda r, rep: train_rows(tr, r, rep, summarize_train(_ns(bufs[r], tr.programs,
                                                                                 tr.n_bursts, 2, cpn[r]))))


def train_job(world, grid: TrainGrid, folder: str, meta: dict) -> None:
    rank0 = world.local_ranks[0] == 0
    trains = grid.trains()
    csv, todo, seed = resume.pending(world, folder, data.BURST_TRAIN, {**meta, "sm_count": _sm_count(world)},
                                     trains, BurstTrain.key, payload=random.randrange(2**30))
    if not todo:
        return
    clock = _record_clock(world, folder, data.BURST_TRAIN)
    # per program: its rows are appended first; a train whose burst_program rows exist but whose burst_train rows
    # do not (stopped in between) gets its summary from the recorded rows, never a second measurement
    pp_csv, pp_done = None, {}
    if grid.per_program:
        pp_csv, pp_todo, _ = resume.pending(world, folder, data.BURST_PROGRAM,
                                            {**meta, "sm_count": _sm_count(world)}, todo, BurstTrain.key)
        if rank0:
            have = {tr.key() for tr in todo} - {tr.key() for tr in pp_todo}
            if have:
                rec = data.read_rows(pp_csv, data.BURST_PROGRAM)
                for tr in todo:
                    if tr.key() in have:
                        sel = (rec.train == tr.name) & (rec.target == tr.target) & (rec.programs == tr.programs) \
                            & (rec.store_bytes == tr.store_bytes)
                        pp_done[tr.key()] = rows_from_programs(tr, rec[sel])
        if not world.emulated:
            msg = [sorted(pp_done)]
            world.dist.broadcast_object_list(msg, src=0)
            pp_done = {k: pp_done.get(k) for k in msg[0]}
    dests = allocate(world, max(t.dst_elems for t in todo), grid.targets)
    for t in grid.targets:  # bit-exact before timing: the largest train of each target
        mine = [x for x in todo if x.target == t and x.key() not in pp_done]
        if mine:
            check_train(world, dests, max(mine, key=lambda x: x.dst_elems), seed + 104729, grid.preload,
                        grid.load_probe)
    for i, tr in enumerate(tqdm(todo, desc="trains", disable=not rank0, file=sys.stderr, mininterval=2)):
        if tr.key() in pp_done:
            if rank0:
                data.append_rows(csv, data.BURST_TRAIN, pp_done[tr.key()])
            continue
        rows = measure_train(world, dests, tr, grid.repeats, seed + i, clock, per_program=grid.per_program,
                             preload=grid.preload, load_probe=grid.load_probe)
        if grid.per_program:
            _append_all_ranks(world, pp_csv, data.BURST_PROGRAM, rows[0])
            rows = rows[1]
        _append_all_ranks(world, csv, data.BURST_TRAIN, rows)


def run_trains(grid: TrainGrid, out: str | Path, source: str = "gpu", params=None, command: str = "") -> Path:
    """Run (or resume) the irregular-train study into ``out``; returns the CSV path. ``simulated`` runs the
    stage model (``params``: :class:`xstage.model.StageParams`) with lognormal timing noise."""
    out = Path(out)
    grid.validate()
    meta = {"grid": asdict(grid), "source": source}
    if source == "gpu":
        require_world(grid.world_size, "the train study", simulated=True, cpu=True, option="--world-size")
        spawn(train_job, grid.world_size, grid, str(out), env.provenance(command, meta),
              peers="remote" in grid.targets)
    elif source == "simulated":
        require_one_process("the simulated train study (--source simulated)")
        if grid.per_program:
            raise ValueError("per_program records the GPU's programs (their SMs and timestamps): the simulated "
                             "source has none; run it with source='gpu'")
        if params is None:
            raise ValueError("a simulated train study needs params (xstage.model.StageParams)")
        m = env.provenance(command, {**meta, "model": params.as_dict()})
        m["machine"] = "simulated"
        csv, todo, _ = resume.pending(_ONE, out, data.BURST_TRAIN, m, grid.trains(), BurstTrain.key)
        if todo:
            data.append_rows(csv, data.BURST_TRAIN, simulated_train_rows(todo, params, grid.repeats))
    else:
        raise ValueError(f"source for a sweep must be 'gpu' or 'simulated', got {source!r}")
    return out / f"{data.BURST_TRAIN.name}.csv"


class _OneProcess:
    """The world of a host-only job (simulated rows): one rank, nothing to broadcast."""

    local_ranks = [0]
    emulated = True


_ONE = _OneProcess()


# ------------------------------------------------------------------------------- the notebooks' data
# The simulated source: small enough for a slow CPU (~2 s), wide enough for every panel (P=1 is the
# backpressure-free reference of the slowdown map).
SIMULATED_GRID = dict(burst_kib=(1, 4, 16, 64, 256, 1024, 4096), gap_us=(0, 10, 100), programs=(1, 4, 66, 264),
                      store_bytes=(16,), targets=("remote", "local"), n_bursts=8, repeats=2)
# The host link is ~7x slower than NVLink: its sweep stops at 1 MiB per program (as recorded in data/h200x1).
HOST_BURST_KIB = tuple(2**i for i in range(11))
# The recorded drain runs (a second pass over the same folder): fence after every burst, two gaps, 16 B stores.
DRAIN_GRID = dict(drain=(True,), gap_us=(0, 10), store_bytes=(16,))


def burst_gap_data(source: str, machine: str = "h200x2", variant: str = "sync", out: str | Path | None = None,
                   grid=None) -> tuple[pd.DataFrame, dict]:
    """Burst-gap rows (schema xstage.data.BURST_GAP) and provenance for ``source``:

    recorded   data/<machine>/ (committed measurements; ``variant="free_running"`` -> its free_running record)
    gpu        a fresh sweep on this machine's GPUs (default grid, plus the drain runs), written to ``out``
    simulated  the Burst-Gap event simulation with reference parameters on a small grid (seconds on a CPU)
    auto       gpu when GPUs are visible (one GPU measures the host link, two NVLink), else recorded

    ``meta["source"]`` says which one was used.

    machine: the folder under data/ (recorded); gpu/simulated ignore it (a gpu sweep's default folder is named
             after this machine's GPUs, xstage.env.machine_name).
    variant: ``sync`` (grid barrier between bursts) or ``free_running`` (none: programs drift apart).
    out:     where a gpu sweep writes (default: see :func:`_default_out`); a folder already holding a sweep
             resumes it. Simulated data goes to a temporary folder unless ``out`` is given.
    grid:    a :class:`xstage.burst_gap_sweep.BurstGapGrid` replacing the default one (gpu/simulated).
    """
    _check_variant(variant)
    src = env.resolve_source(source, gpus_needed=1)   # one GPU measures the host link
    if src == "recorded":
        folder = _recorded("burst_gap" if variant == "sync" else "free_running", machine)
        df, meta = data.load(folder)
        return df, {**meta, "source": "recorded"}

    sync = variant == "sync"
    if src == "simulated":
        grid = replace(grid or BurstGapGrid(**SIMULATED_GRID), sync=sync)
        tmp = tempfile.TemporaryDirectory(prefix="xstage-sim-") if out is None else None
        with tmp or contextlib.nullcontext():  # a temporary folder is removed once the rows are loaded
            folder = Path(tmp.name if tmp else out)
            if not sync:
                folder = folder / "free_running"
            run_burst_gap(grid, folder, source="simulated", params=BurstGapParams.reference(),
                          command=f"xstage.burst_gap_sweep.burst_gap_data('simulated', variant={variant!r})")
            df, meta = data.load(folder)
        return df, {**meta, "source": "simulated",
                    "note": "Burst-Gap event simulation with BurstGapParams.reference(); it models no drift, so "
                            "the free-running variant looks like the synchronised one."}

    # gpu: the default grid, then the drain runs, into one folder (each resumes what is already there)
    folder = Path(out) if out is not None else _default_out(env.machine_name())
    if not sync:
        folder = folder / "free_running"
    targets = default_targets()   # one GPU: the host link (pinned host memory) and local; two: NVLink and local
    grid = replace(grid or BurstGapGrid(targets=targets, world_size=world_for(targets),
                                        burst_kib=HOST_BURST_KIB if "host" in targets else BurstGapGrid.burst_kib),
                   sync=sync)
    command = f"xstage.burst_gap_sweep.burst_gap_data('gpu', variant={variant!r})"
    run_burst_gap(grid, folder, source="gpu", command=command)
    if grid.drain == (False,):
        run_burst_gap(replace(grid, **DRAIN_GRID), folder, source="gpu", command=command + " [drain runs]")
    df, meta = data.load(folder)
    return df, {**meta, "source": "gpu"}


def bandwidth_data(source: str = "recorded", machine: str = "h200x2",
                   out: str | Path | None = None) -> tuple[pd.DataFrame, dict]:
    """Peak-bandwidth rows (schema xstage.data.BANDWIDTH): SM stores (remote, host, local) and the copy engine
    on each link (peer copy, device-to-host copy). Arguments in the order of every ``*_data`` function.

    source: recorded (data/<machine>/bandwidth/), gpu (run the benchmark into ``out``), or auto. There is
    no simulated bandwidth benchmark: pass ``recorded`` to show a machine's measurements beside simulated data.
    """
    def run(folder: Path) -> None:
        if not data.paths(folder, data.BANDWIDTH)[0].is_file():
            run_bandwidth(folder, command="xstage.burst_gap_sweep.bandwidth_data('gpu')")

    df, meta, _ = _source_data(source, data.BANDWIDTH, "the bandwidth benchmark",
                               lambda: _recorded("bandwidth", machine), run, out,
                               no_simulated="source 'simulated' has no bandwidth benchmark; use 'recorded' (or 'gpu')")
    return df, meta
