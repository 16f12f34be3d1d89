"""``xstage sweep families``: the never-fitted traffic families (xstage.traffic_families) recorded per program on
this machine's GPU (host link: one GPU), resumable; every train's destination checked bit for bit before it is
timed. Rows: schema ``burst_program`` (every program's every burst: its start, its issue time, its size), one
record per folder; the family, store width, warps and delays are in each train's name and the sidecar's grid.
Scored, never fitted: xstage.families_analysis.
"""
from __future__ import annotations

import json
import random
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from . import data, env, resume
from .burst_gap_sweep import _append_all_ranks, _ns, _poison_run_check, _record_clock, _sm_count, _timed_runs, allocate
from .ranks import spawn
from .traffic_families import (FAMILIES, KERNEL_FILE, FamilyTrain, check_family_destination, families,
                               family_buffers, kernel_key, launch_family)


@dataclass(frozen=True)
class FamiliesGrid:
    """Which families, program counts and targets; ``count`` seeded base trains (seed ``seed``) per family."""

    families: tuple[str, ...] = FAMILIES
    programs: tuple[int, ...] = (16, 66, 132, 264, 528)   # 528: the waves' wave (4 per SM); the others skip it
    targets: tuple[str, ...] = ("host",)
    count: int = 3
    seed: int = 31
    repeats: int = 3
    world_size: int = 1
    kib: tuple[float, float] = (4, 256)           # the base trains' burst sizes per program (log-uniform), KiB

    def trains(self, sm_count: int = 132) -> list[FamilyTrain]:
        return [tr for f in self.families for t in self.targets
                for tr in families(f, self.programs, t, self.count, self.seed, sm_count, self.kib)]

    def validate(self, sm_count: int | None = None) -> None:
        bad = [f for f in self.families if f not in FAMILIES]
        if bad:
            raise ValueError(f"--families: unknown {', '.join(bad)}; families: {', '.join(FAMILIES)}")
        if self.repeats < 1 or self.count < 1:
            raise ValueError(f"repeats and count must be >= 1, got {self.repeats}, {self.count}")
        if "remote" in self.targets and self.world_size < 2:
            raise ValueError("target 'remote' needs two GPUs (world_size 2); on one GPU use --targets host")
        for tr in self.trains(sm_count or 132):
            tr.validate(max_programs=64 * (sm_count or 132))


def family_rows(tr: FamilyTrain, rank: int, repeat: int, ts_ns: np.ndarray, sm: np.ndarray) -> pd.DataFrame:
    """burst_program rows of one run: ts_ns[P, B, 2] (issue start, issue end; ns from the earliest program's start)."""
    P, B = tr.programs, tr.n_bursts
    return pd.DataFrame({"train": tr.name, "target": tr.target, "programs": P, "store_bytes": tr.store_bytes,
                         "n_bursts": B, "rank": rank, "repeat": repeat, "program": np.repeat(np.arange(P), B),
                         "smid": np.repeat(np.asarray(sm, np.int64), B), "burst": np.tile(np.arange(B), P),
                         "burst_bytes": tr.sizes().ravel(), "gap_ns": np.tile(np.asarray(tr.gap_ns), P),
                         "start_ns": np.round(ts_ns[..., 0], 1).ravel(),
                         "issue_ns": np.round(ts_ns[..., 1] - ts_ns[..., 0], 1).ravel(), "load_ns": np.nan})


def families_job(world, grid: FamiliesGrid, folder: str, meta: dict) -> None:
    rank0 = world.local_ranks[0] == 0
    sms = _sm_count(world)
    csv, todo, seed = resume.pending(world, folder, data.BURST_PROGRAM, {**meta, "sm_count": sms},
                                     grid.trains(sms), FamilyTrain.key, payload=random.randrange(2**30))
    if not todo:
        return
    clock = _record_clock(world, folder, data.BURST_PROGRAM)
    dests = allocate(world, max(t.dst_elems for t in todo), grid.targets)
    seen = set()       # the compiled variants whose registers are written (once each)

    def first_run(r, addr, tr, bufs, seed):
        k = launch_family(addr, bufs, tr, seed)
        if rank0 and kernel_key(tr) not in seen:
            seen.add(kernel_key(tr))
            write_kernel_regs(folder, {kernel_key(tr): k})

    for i, tr in enumerate(tqdm(todo, desc="families", disable=not rank0, file=sys.stderr, mininterval=2)):
        bufs = {r: family_buffers(tr, world.device(r)) for r in world.local_ranks}
        cpn = {r: clock[r]["cycles_per_ns"] for r in world.local_ranks}
        _poison_run_check(world, dests, tr.target, tr.dst_elems,   # bit for bit, before it is timed
                          lambda r, addr: first_run(r, addr, tr, bufs[r], seed + i + r),
                          lambda r, buf, sender: check_family_destination(buf, tr, seed + i + sender))
        rows = _timed_runs(world, grid.repeats,
                           lambda r: launch_family(dests.addr(world, r, tr.target), bufs[r], tr, seed + i + r, cpn[r]),
                           lambda r: None,
                           lambda r, rep: family_rows(tr, r, rep, _ns(bufs[r], tr.programs, tr.n_bursts, 2, cpn[r]),
                                                      bufs[r]["sm"].cpu().numpy()))
        _append_all_ranks(world, csv, data.BURST_PROGRAM, rows)


def write_kernel_regs(folder, compiled: dict) -> None:
    """``family_kernel.json`` beside the record: per compiled variant (:func:`kernel_key`) the registers per thread,
    spills and shared bytes Triton compiled it with (the analysis reads the resident programs off them), merged
    with an earlier run's (resume)."""
    path = Path(folder) / KERNEL_FILE
    old = json.loads(path.read_text()).get("variants", {}) if path.exists() else {}
    new = {k: {"n_regs": int(c.n_regs), "n_spills": int(getattr(c, "n_spills", 0)),
               "shared_bytes": int(getattr(getattr(c, "metadata", None), "shared", 0))}
           for k, c in compiled.items() if getattr(c, "n_regs", None)}   # the interpreter compiles nothing
    if new:
        data.write_json_atomic(path, {"kernel": "family_store_kernel", "variants": {**old, **new}})


def run_families(grid: FamiliesGrid, out, command: str = "") -> Path:
    """Record (or resume) the families into ``out``; returns the CSV path. GPU only (the families are measured
    traffic; the interpreter runs families_job with an emulated world for the tests)."""
    grid.validate()
    env.require_gpus(grid.world_size, "the traffic families", simulated=False)
    spawn(families_job, grid.world_size, grid, str(out), env.provenance(command, {"grid": asdict(grid),
                                                                                  "source": "gpu"}))
    return Path(out) / f"{data.BURST_PROGRAM.name}.csv"
