"""The MegaMoE sweep: every (configuration, dtype) checked, then each schedule timed on GPUs; resumable.

``run_megamoe`` is what ``xstage sweep megamoe`` calls: it validates, starts one process per GPU
(:func:`xstage.ranks.spawn`) and runs ``megamoe_job`` on each, or (``world="one-gpu"``) runs ``megamoe_job``
once in this process on a :class:`xstage.ranks.OneGPUWorld`: every rank of the layer on one GPU, each with its
own buffers and task list, the ranks run one after another (the same job and kernels; dispatch, experts and
barrier phases ordered so that no rank waits on one not yet launched), and every time is the observed rank's
(rank 0) alone: its kernel, its layer, its unfused share. ``link="host"`` puts the peers' combine buffers in
pinned host memory, so rank 0's remote combine stores cross PCIe; its compute-only controls (every store local)
are measured in the same run. Per (case, dtype) the job builds the problem
(``xstage.moe``), checks the fused layer against the unfused baseline and every schedule bit for bit against
Expert-Wave, times the experts kernel, its compute-only control, the whole layer, the dispatch and the unfused
baseline, predicts each schedule's kernel time with the Burst-Gap parameters it was given
(``xstage.moe_plan.predict_kernel_ns``), and appends one row per schedule (schema ``megamoe``, xstage.data).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from . import bench, data, env
from .bench import median
from .data import MEGAMOE
from .model import BurstGapParams, params_from_dict
from .moe import (MoEBuffers, Problem, agree_on_checks, build_tasks, check_task_status, dispatch, hi_weights,
                  make_problem, megamoe_layer, moe_buffers, poison_combine, run_experts, world_label)
from .moe_reference import (rank_weights, topk_reduce)
from .moe_plan import (ASSIGNMENT_REGISTRY, ASSIGNMENTS, CASES, DTYPES_GPU, HOT_FRACTION, LAG_VERSION, ORDER_VERSION,
                       OUT_DTYPES, SCHEDULES, STALL_DEFAULT, TILE_SWIZZLE, TILES_VERSION, UNFUSED_REL_L2, WAIT_DEFAULT,
                       ZIPF_EXPONENT, CostModel, MoECase, TileConfig, calibrate_rate, default_tiles, gemm_flops,
                       predict_kernel_ns, remote_combine_bytes, routing_of, selection)
from .moe_unfused import make_unfused, make_unfused_one_process
from .numeric import check_bit_identical, rel_l2
from .ranks import ONE_GPU_LINKS, OneGPUWorld, require_one_process, require_world, spawn
from .resume import pending
from .sources import NoRecordedData, recorded_params, source_data
from .traffic import TrafficWorld, check_schedules, validate_traffic

CALLS_TARGET_MS = 2.0       # back-to-back calls per timed run so that a run lasts >= ~2 ms ...
CALLS_MAX = 16              # ... at most this many (CUDA events around one short call include its launch)
WORLDS = ("gpus", "one-gpu")   # one process per GPU (NVLink peers) | every rank in this process on one GPU


@contextlib.contextmanager
def signals_held():
    """SIGINT / SIGTERM held while a configuration's rows and the sidecar are written: a time limit's signal
    (``timeout --signal=INT``) is recorded by a stand-in handler and handed to the previous handler on leaving,
    so an interrupted sweep keeps every configuration it finished and never leaves the CSV and its sidecar's row
    count and sha256 disagreeing. (Python runs signal handlers in the main thread whichever thread the signal hit,
    so a handler swap holds it where a thread's signal mask would not.) Outside the main thread a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    old = {n: signal.signal(n, lambda num, frame: got.append(num)) for n in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for n, h in old.items():
            signal.signal(n, h)
        if got:
            h = old[got[0]]
            if callable(h):
                h(got[0], None)                 # SIGINT: KeyboardInterrupt, now
            elif h == signal.SIG_DFL:
                signal.raise_signal(got[0])     # SIGTERM: its default action


TIMING = "round_robin"             # how the schedules are timed (sidecar params.timing; records without it: "blocks",
                                   # each schedule's runs one after another)
RUNS_ENV = "XSTAGE_MEGAMOE_RUNS"   # set (to anything): _measure_case prints every timed run's ms per schedule (stderr,
                                   # one "megamoe-runs {json}" line each); the records keep the median and the fastest


def _measure_case(world, prob: Problem, bufs: MoEBuffers, schedules: Sequence[str], repeats: int, warmup: int,
                  prm: BurstGapParams, unfused_cache: dict, assignment: str = "static",
                  weight_seed: int | None = None) -> dict:
    """On this rank: check, then time every schedule's kernel and layer, dispatch, the compute-only control and
    the unfused baseline. Returns per-rank lists and predictions (gathered by the job)."""
    def calls_of(fn, inner):  # one timed run: ``inner`` back-to-back calls (launch latency hidden)
        def calls():
            for _ in range(inner):
                fn()
        return calls

    def timed(fn, inner):    # ms per call
        return [ms / inner for ms in bench.time_ms(calls_of(fn, inner), warmup=warmup, reps=repeats)]

    one = world.emulated                 # one process drives every rank (OneGPUWorld): time the observed rank alone
    rank = getattr(world, "observed", 0) if one else world.local_ranks[0]
    me = [rank]                          # the ranks whose launches are timed (barriers take every rank)
    dyn = assignment == "dynamic"
    c, s, t = prob.case, prob.case.shape, prob.tiles
    dev = world.device(rank)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    inp = prob.inputs[rank]
    clock = [time.perf_counter()]
    phases: dict[str, float] = {}

    def lap(name: str) -> None:   # host seconds per phase (the sweep's log says where a configuration's time goes)
        now = time.perf_counter()
        phases[name] = round(now - clock[0], 2)
        clock[0] = now
    ew = {r: build_tasks(prob, "expert_wave", sms, r) for r in world.local_ranks}
    base = {rank: ew[rank]}
    # compile everything before the first barrier (no rank spins on a peer's compiler), then the local control
    dispatch(world, bufs, prob.inputs, barrier=False)
    run_experts(world, bufs, prob.inputs, ew, t, barrier=False, check=False, dynamic=dyn)
    run_experts(world, bufs, prob.inputs, ew, t, barrier=False, check=False, local_combine=True, dynamic=dyn)
    world.barrier()
    lap("compile")
    probe = median(bench.time_ms(lambda: run_experts(world, bufs, prob.inputs, base, t, barrier=False, check=False,
                                                dynamic=dyn, ranks=me), warmup=1, reps=3))
    inner = min(CALLS_MAX, max(1, math.ceil(CALLS_TARGET_MS / max(probe, 1e-3))))
    if not one:
        inners = [None] * world.world_size   # every rank the same (the layer and the baseline are collective)
        world.dist.all_gather_object(inners, inner)
        inner = max(inners)
    compute = timed(lambda: run_experts(world, bufs, prob.inputs, base, t, barrier=False, check=False,
                                        local_combine=True, dynamic=dyn, ranks=me), inner)
    rate = calibrate_rate(base[rank], s.hidden, s.intermediate, t, sms, median(compute), assignment)
    cost = CostModel(prm, rate, sms, OUT_DTYPES[prob.dtype].itemsize, assignment)
    remote = prob.grid(rank).remote_rows_per_block(prob.layouts[rank])
    lap("probe+compute")
    # every rank's lists (a one-process world runs every rank's layer in the checks; each rank's model_guided from
    # the observed rank's calibrated rate); only the observed rank's are timed
    lists_of = {r: {name: (ew[r] if name == "expert_wave" else build_tasks(prob, name, sms, r, cost=cost))
                    for name in schedules} for r in world.local_ranks}
    lists = lists_of[rank]
    lap("schedules")
    # correctness before timing: expert_wave's output close to the unfused baseline; every schedule bit-identical
    if c.name not in unfused_cache:
        unfused_cache.clear()
        unfused_cache[c.name] = (make_unfused_one_process(world, prob.inputs, {r: hi_weights(prob.inputs[r].weights)
                                                                               for r in world.local_ranks}, rank)
                                 if one else make_unfused(world, inp, hi_weights(inp.weights)))
    unfused = unfused_cache[c.name]
    traffic = getattr(world, "traffic_ranks", None)
    if traffic:   # 8-rank traffic on 2 GPUs: where every combine row lands, the reference, bit-identical schedules
        check_schedules(world, prob, bufs, lists_of, schedules, t, dyn, weight_seed)
    want = {}
    for name in ([] if traffic else schedules):
        poison_combine(world, bufs, c.tokens)
        outs = megamoe_layer(world, bufs, prob.inputs, {r: lists_of[r][name] for r in world.local_ranks}, t,
                             dynamic=dyn)
        torch.cuda.synchronize()
        unf = (unfused.full() if one else {rank: unfused()}) if not want else None   # collective: every rank

        def check():
            for r in world.local_ranks:
                comb = bufs.combine_view(r, c.tokens).to(world.device(r))   # (a peer's may be in host memory)
                what = f"{c.name} {prob.dtype} rank {r}{world_label(world)}"
                if r in want:
                    check_bit_identical(comb, want[r], f"{what}: {name} vs {schedules[0]}")
                    continue
                if torch.isnan(comb).any():
                    raise AssertionError(f"{what}: combine buffer not fully written (NaN left)")
                err = rel_l2(unf[r], outs[r])
                if not err <= UNFUSED_REL_L2[prob.dtype]:
                    raise AssertionError(f"{what}: fused vs unfused relative L2 {err:.3g}")
                want[r] = comb.clone()
        agree_on_checks(world, check)
        world.barrier()
    del want
    lap("check")
    res = {"compute": compute, "sched": {}, "inner": inner, "phases": phases}
    fns = {}
    for name in schedules:
        tasks = {rank: lists[name]}
        fns[name, "kernel"] = calls_of(lambda tasks=tasks: run_experts(
            world, bufs, prob.inputs, tasks, t, barrier=False, check=False, dynamic=dyn, ranks=me), inner)
        fns[name, "local"] = calls_of(lambda tasks=tasks: run_experts(   # no remote stores
            world, bufs, prob.inputs, tasks, t, barrier=False, check=False, local_combine=True, dynamic=dyn,
            ranks=me), inner)
        # the layer: this rank's dispatch push, kernel and top-k sum; both barriers (in a one-process world every
        # rank's signal and wait launches: 2P tiny kernels per barrier where a rank of the real world runs one)
        fns[name, "layer"] = calls_of(lambda tasks=tasks: (
            dispatch(world, bufs, prob.inputs, check=False, ranks=me),
            run_experts(world, bufs, prob.inputs, tasks, t, check=False, dynamic=dyn, ranks=me),
            topk_reduce(bufs.combine_view(rank, c.tokens))), inner)
    # TIMING: every schedule's kernel, compute-only and layer runs in rounds, one run of each per round, so that a
    # drift of the machine over the configuration falls on every schedule alike (timed one schedule after another,
    # the kernel's runs rose ~10 % from first to last on the host link: docs/findings.md)
    world.barrier()
    ms = bench.round_robin_ms(fns, repeats, warmup=warmup, before=world.barrier)
    for name in schedules:
        agree_on_checks(world, lambda: check_task_status(lists[name], rank, prob.layouts[rank],
                                                         s.intermediate // t.block_n1, dev))
        kern, local, layer = ([x / inner for x in ms[name, what]] for what in ("kernel", "local", "layer"))
        pred = predict_kernel_ns(lists[name], remote, cost, s.hidden, s.intermediate, t)["total_ns"] / 1e6
        res["sched"][name] = dict(kernel=kern, layer=layer, pred=pred, param=lists[name].param or "",
                                  n_tasks=lists[name].n_tasks, local=local)
        if os.environ.get(RUNS_ENV):   # a diagnostic: every timed run, not only the median and the fastest
            print("megamoe-runs " + json.dumps(dict(config=c.name, dtype=prob.dtype, schedule=name, inner=inner,
                                                    kernel_ms=kern, local_ms=local, layer_ms=layer)),
                  file=sys.stderr, flush=True)
    world.barrier()
    res["dispatch"] = timed(lambda: dispatch(world, bufs, prob.inputs, check=False, ranks=me), inner)
    world.barrier()
    res["unfused"] = [float("nan")] * repeats if traffic else timed(unfused, inner)   # (traffic: no 2-GPU all_to_all)
    world.barrier()
    res["grouped_mm"] = timed(unfused.gemm, inner)
    world.barrier()
    lap("timing")
    return res


def _rows_for(prob: Problem, P: int, parts: list[dict], repeats: int, observed: int | None = None) -> pd.DataFrame:
    """The rows of one (case, dtype): times over ``parts`` (one per timed rank). ``observed``: a one-process world
    timed that rank alone, so rows, remote bytes and TFLOP/s are its own (else the busiest rank's, and all
    ranks' FLOPs / P; a list of ranks: those ranks', e.g. the ranks a traffic world's GPUs play)."""
    c, s = prob.case, prob.case.shape
    lays = prob.layouts if observed is None else [prob.layouts[o] for o in np.atleast_1d(observed)]

    def agg(get):                        # per repeat the max over ranks, then the median (and the minimum)
        per = np.max(np.array([get(p) for p in parts], dtype=np.float64), axis=0)
        return float(np.median(per)), float(per.min())

    flops = sum(gemm_flops(lay.rows, s.hidden, s.intermediate) for lay in lays) / len(lays)
    remote = max(remote_combine_bytes(lay.remote_rows, s.hidden, OUT_DTYPES[prob.dtype].itemsize) for lay in lays)
    compute, _ = agg(lambda p: p["compute"])
    dispatch_ms, _ = agg(lambda p: p["dispatch"])
    unfused_ms, _ = agg(lambda p: p["unfused"])
    grouped_ms, _ = agg(lambda p: p["grouped_mm"])
    pred = {n: max(p["sched"][n]["pred"] for p in parts) for n in parts[0]["sched"]}
    rows = []
    for name in parts[0]["sched"]:
        kern, kern_min = agg(lambda p: p["sched"][name]["kernel"])
        local, _ = agg(lambda p: p["sched"][name]["local"])
        layer, _ = agg(lambda p: p["sched"][name]["layer"])
        rows.append(dict(shape=s.name, hidden=s.hidden, intermediate=s.intermediate, experts=s.experts,
                         topk=s.topk, tokens=c.tokens, routing=c.routing, seed=c.seed, P=P, dtype=prob.dtype,
                         schedule=name, block_m=prob.tiles.block_m, block_n1=prob.tiles.block_n1,
                         block_n2=prob.tiles.block_n2, block_k=prob.tiles.block_k, num_warps=prob.tiles.num_warps,
                         num_stages=prob.tiles.num_stages, tma=prob.tiles.tma,
                         schedule_param="|".join(dict.fromkeys(p["sched"][name]["param"] for p in parts)),
                         n_tasks=max(p["sched"][name]["n_tasks"] for p in parts),
                         rows=max(lay.rows for lay in lays), remote_bytes=remote, kernel_ms=kern,
                         kernel_ms_min=kern_min, n_timed=repeats, calls_per_run=parts[0]["inner"],
                         tflops=flops / (kern * 1e-3) / 1e12,
                         compute_ms=compute, dispatch_ms=dispatch_ms, layer_ms=layer, unfused_ms=unfused_ms,
                         grouped_mm_ms=grouped_ms, compute_sched_ms=local,
                         predicted_ms=pred[name],
                         predicted_speedup=pred.get("expert_wave", float("nan")) / pred[name]))
    return pd.DataFrame(rows)


def megamoe_job(world, cases: Sequence[MoECase], folder: str, meta: dict, dtypes: Sequence[str],
                schedules: Sequence[str], repeats: int, warmup: int, prm: dict, seed: int,
                deadline: float | None, assignment: str = "static") -> None:
    """Runs on every rank: (case, dtype) pairs not yet in ``folder`` are checked, timed and appended one at a
    time (shape by shape: weights are generated once per shape and dtype). Stops starting new pairs after
    ``deadline`` (time.time()); a re-run resumes."""
    rank, P = world.local_ranks[0], world.world_size
    one = world.emulated      # one process drives every rank (OneGPUWorld, EmulatedWorld): no collectives
    schema = data.MEGAMOE_TRAFFIC if getattr(world, "traffic_ranks", None) else MEGAMOE   # (xstage.traffic)
    csv, todo, _ = pending(world, folder, schema, meta, [(c, d) for c in cases for d in dtypes],
                           lambda cd: cd[0].key(P, cd[1]))
    params = params_from_dict(prm)
    unfused_cache: dict = {}

    def out_of_time() -> bool:
        """Rank 0's clock decides for every rank (a collective: all ranks stop at the same configuration)."""
        go = [deadline is None or time.time() < deadline]
        if not one:
            world.dist.broadcast_object_list(go, src=0)
        if not go[0] and rank == 0:
            print("megamoe: time budget reached; run again to resume", file=sys.stderr, flush=True)
        return not go[0]

    for shape in dict.fromkeys(c.shape for c, _ in todo):
        for dtype in [d for d in dtypes if any(c.shape == shape and dd == d for c, dd in todo)]:
            mine = [c for c, d in todo if c.shape == shape and d == dtype]
            if out_of_time():
                return
            t0 = time.perf_counter()
            w = {r: rank_weights(shape.hidden, shape.intermediate, shape.experts, P, r, seed, world.device(r), dtype)
                 for r in world.local_ranks}
            cap = max(lay.rows for c in mine for lay in routing_of(c, P)[2])
            tiles = {c.name: default_tiles(dtype, c.tokens * P * shape.topk / shape.experts) for c in mine}
            bufs = moe_buffers(world, max(cap, 1), max(c.tokens for c in mine), shape.hidden, shape.intermediate,
                               shape.topk, shape.experts // P, dtype,
                               min_block_m=min(t.block_m for t in tiles.values()))
            if rank == 0:
                print(f"megamoe: {shape.name} {dtype} weights and buffers in {time.perf_counter() - t0:.1f} s",
                      file=sys.stderr, flush=True)
            for c in mine:
                if out_of_time():
                    return
                t0 = time.perf_counter()
                prob = make_problem(world, c, dtype, tiles[c.name], weights=w, weight_seed=seed)
                t_setup = time.perf_counter() - t0
                res = _measure_case(world, prob, bufs, schedules, repeats, warmup, params, unfused_cache,
                                    assignment, weight_seed=seed)
                parts = [res]            # one process: the observed rank's times (ranks run one after another)
                if not one:
                    parts = [None] * P
                    world.dist.all_gather_object(parts, res)
                if rank == 0:
                    rows = _rows_for(prob, P, parts, repeats, getattr(world, "observed", 0) if one else
                                     getattr(world, "played", None))
                    if schema is not MEGAMOE:   # 8-rank traffic on 2 GPUs
                        rows = rows.assign(traffic_ranks=world.traffic_ranks, gpus=world.gpus)
                    with signals_held():           # the rows and the sidecar, or neither
                        data.append_rows(csv, schema, rows)
                    ph = " ".join(f"{k} {v:.1f}" for k, v in res["phases"].items())
                    print(f"megamoe: {c.name} {dtype} done in {time.perf_counter() - t0:.1f} s (setup "
                          f"{t_setup:.1f} {ph}; inner {res['inner']})", file=sys.stderr, flush=True)
                del prob
            del w, bufs
            unfused_cache.clear()
            torch.cuda.empty_cache()


def traffic_sweep_job(world, traffic_ranks: int, *args) -> None:
    """:func:`megamoe_job` on the traffic world over this process's GPU (what ``spawn`` runs)."""
    megamoe_job(TrafficWorld(world, traffic_ranks), *args)


def run_megamoe(out: str | Path, prm: BurstGapParams | Callable[[], BurstGapParams], world_size: int = 2,
                dtypes: Sequence[str] = DTYPES_GPU, cases: Sequence[MoECase] | None = None,
                schedules: Sequence[str] = SCHEDULES, repeats: int = 20, warmup: int = 3, seed: int = 0,
                max_minutes: float | None = None, command: str = "", assignment: str = "dynamic",
                world: str = "gpus", link: str | None = None, traffic_ranks: int | None = None) -> Path:
    """Run (or resume) the MegaMoE sweep on ``world_size`` GPUs into ``out``/megamoe.csv; returns its path.
    ``prm``: Burst-Gap parameters of the predictions, or a function that returns them, called once the parameters
    and the GPUs have been checked (e.g. ``xstage.sources.recorded_params``: fitted to a machine's recorded
    burst-gap sweep). ``max_minutes``: start no new (case, dtype) after that long (a re-run resumes).
    ``assignment``: how the kernel's programs take tasks (``ASSIGNMENT_REGISTRY``); one folder holds one
    assignment (recorded in the sidecar's params). Parameters are validated before the GPUs are checked and
    anything launches.

    ``world``: ``gpus`` (one process per GPU, NVLink peers; ``link`` must be None or ``nvlink``) or ``one-gpu``
    (:class:`xstage.ranks.OneGPUWorld`: ``world_size`` ranks in this process on one GPU, rank 0 observed;
    ``link`` ``local``, every buffer in device memory, or ``host``, the peers' combine buffers in pinned host
    memory). One folder holds one world and link (recorded in the sidecar's params).

    ``traffic_ranks`` (``xstage.traffic``): 8-rank traffic on 2 GPUs, each GPU playing one rank of a
    ``traffic_ranks``-rank layer (its experts, rows and egress); the gpus world of 2 ranks only, into a folder of
    its own named ``traffic<N>`` (e.g. data/h200x2/traffic8), schema ``megamoe_traffic``."""
    if world not in WORLDS:
        raise ValueError(f"world must be one of {', '.join(WORLDS)}, got {world!r}")
    links = ONE_GPU_LINKS if world == "one-gpu" else ("nvlink",)
    if link is None and world == "gpus":
        link = "nvlink"
    if link not in links:
        raise ValueError(f"the {world} world's link must be one of {', '.join(links)}, got {link!r}")
    if world_size < 2:
        raise ValueError(f"world_size must be >= 2 (the combine needs peers), got {world_size}")
    if repeats < 20 or warmup < 1:
        raise ValueError(f"repeats must be >= 20 and warmup >= 1, got {repeats}, {warmup}")
    if not dtypes or any(d not in DTYPES_GPU for d in dtypes):
        raise ValueError(f"dtypes must be a non-empty subset of {DTYPES_GPU}, got {list(dtypes)}")
    if not schedules or any(s not in SCHEDULES for s in schedules) or schedules[0] != "expert_wave":
        raise ValueError(f"schedules must be a subset of {SCHEDULES} starting with expert_wave, got {list(schedules)}")
    cases = list(CASES if cases is None else cases)
    if not cases:
        raise ValueError("no cases")
    if len({c.name for c in cases}) != len(cases):
        raise ValueError("case names must be unique")
    if traffic_ranks is not None:   # 8-rank traffic on 2 GPUs (xstage.traffic)
        if world != "gpus":
            raise ValueError(f"traffic ranks are for the gpus world (2 GPUs, NVLink peers), got world {world!r}")
        validate_traffic(traffic_ranks, world_size, [c.shape.experts for c in cases])
        if Path(out).name != f"traffic{traffic_ranks}":
            raise ValueError(f"record {traffic_ranks}-rank traffic in a folder of its own named traffic{traffic_ranks} "
                             f"(e.g. data/h200x2/traffic{traffic_ranks}), got {out}")
    for c in cases:
        s = c.shape
        if s.experts % world_size:
            raise ValueError(f"{c.name}: experts ({s.experts}) must be a positive multiple of the number of ranks "
                             f"({world_size})")
        for d in dtypes:
            t = TileConfig(64, 128, 128, 128 if d == "fp8" else 64)
            t.validate(d)
            for what, n, b in (("hidden", s.hidden, 128), ("intermediate", s.intermediate, 128)):
                if n % b:
                    raise ValueError(f"{c.name}: {what} ({n}) is not tile-aligned (a multiple of {b})")
    if max_minutes is not None and max_minutes <= 0:
        raise ValueError(f"max_minutes must be > 0, got {max_minutes}")
    ASSIGNMENT_REGISTRY.check(assignment)
    schema = MEGAMOE if traffic_ranks is None else data.MEGAMOE_TRAFFIC
    for other in (MEGAMOE, data.MEGAMOE_TRAFFIC):
        if other is not schema and (Path(out) / f"{other.name}.json").exists():
            raise ValueError(f"{out} holds a {other.name} sweep; record the {schema.name} one in another folder")
    side = Path(out) / f"{schema.name}.json"
    if side.exists():
        had_params = data.read_meta(side, schema).get("params", {})
        if had_params.get("traffic_ranks") != traffic_ranks:
            raise ValueError(f"{side.parent} holds a sweep of traffic ranks {had_params.get('traffic_ranks')}; "
                             f"record traffic ranks {traffic_ranks} in another folder")
        had = had_params.get("assignment", "static")
        if had != assignment:
            raise ValueError(f"{side.parent} holds a {had}-assignment sweep; record the {assignment} one in another "
                             f"folder (e.g. {Path(out) / assignment})")
        had_world = (had_params.get("world", "gpus"), had_params.get("link", "nvlink"))
        if had_world != (world, link):
            raise ValueError(f"{side.parent} holds a sweep of world {had_world[0]}, link {had_world[1]}; record the "
                             f"{world} / {link} one in another folder")
        if had_params.get("timing", "blocks") != TIMING:
            raise ValueError(f"{side.parent} holds a sweep timed as {had_params.get('timing', 'blocks')!r}; record "
                             f"the {TIMING!r} one in another folder")
    if world == "one-gpu":
        require_one_process("the one-GPU MegaMoE sweep (--world one-gpu)")
        env.require_gpus(1, "the MegaMoE sweep")
    else:
        require_world(world_size, "the MegaMoE sweep", option="--ranks")
    prm = prm() if callable(prm) else prm
    params = dict(world_size=world_size, dtypes=list(dtypes), cases=[c.name for c in cases],
                  schedules=list(schedules), repeats=repeats, warmup=warmup, prm=prm.as_dict(), seed=seed,
                  zipf_exponent=ZIPF_EXPONENT, hot_fraction=HOT_FRACTION, source="gpu", assignment=assignment,
                  world=world, link=link, observed_rank=0 if world == "one-gpu" else None,
                  tiles_version=TILES_VERSION, order_version=ORDER_VERSION, tile_swizzle=TILE_SWIZZLE,
                  wait_default=dict(WAIT_DEFAULT), stall_default=STALL_DEFAULT, lag_version=LAG_VERSION, timing=TIMING,
                  **({} if traffic_ranks is None else dict(traffic_ranks=traffic_ranks, gpus=world_size)))
    meta = env.provenance(command, params)
    deadline = None if max_minutes is None else time.time() + 60 * max_minutes
    args = (cases, str(out), meta, list(dtypes), list(schedules), repeats, warmup, prm.as_dict(), seed, deadline,
            assignment)
    if world == "one-gpu":
        env.apply_safe_env()
        megamoe_job(OneGPUWorld(world_size, link=link, observed=0), *args)
    elif traffic_ranks is not None:   # the ranks' plan: every argument but the deadline (rank 0's clock decides)
        spawn(traffic_sweep_job, world_size, traffic_ranks, *args, plan=(traffic_ranks,) + args[:9] + args[10:])
    else:
        spawn(megamoe_job, world_size, *args, plan=args[:9] + args[10:])
    return Path(out) / f"{MEGAMOE.name}.csv"


def megamoe_data(source: str = "auto", machine: str = "h200x2", out: str | Path | None = None,
                 dtypes=None, shapes=None, assignment: str = "static") -> tuple[pd.DataFrame, dict]:
    """MegaMoE rows (schema xstage.data.MEGAMOE: per configuration, dtype, schedule) and provenance.

    source:  recorded (data/<machine>/megamoe.csv or .csv.gz), gpu (run or resume the sweep on every visible
             GPU into ``out``), or auto (gpu when two GPUs are visible, else recorded). No simulated source.
    machine: the folder under data/ (recorded); gpu ignores it (the default folder is named after this
             machine's GPUs, ``xstage.sources.default_out``).
    out:     where a gpu sweep writes; a folder already holding a sweep resumes it.
    dtypes, shapes: the selection (``xstage.moe_plan.selection``; None = all): what a gpu sweep runs and which
             recorded rows are returned.
    assignment: static (data/<machine>/megamoe/) or dynamic (data/<machine>/dynamic/): how the kernel's programs
             took tasks (``xstage.moe_plan.ASSIGNMENTS``); a gpu sweep runs with it.
    Recorded data that is not there (no file, or no row of the selection) raises
    :class:`xstage.sources.NoRecordedData`.
    """
    if assignment not in ASSIGNMENTS:
        raise ValueError(f"assignment must be one of {', '.join(ASSIGNMENTS)}, got {assignment!r}")
    sel = selection(dtypes=dtypes, shapes=shapes)
    sub = "dynamic" if assignment == "dynamic" else ""

    def recorded() -> Path:
        folder = data.machine_dir(machine) / (sub or "megamoe")
        if not data.paths(folder, MEGAMOE)[0].is_file():
            have = sorted(p.name for p in data.DATA_ROOT.iterdir() if data.paths(p / "megamoe", MEGAMOE)[0].is_file()) \
                if data.DATA_ROOT.is_dir() else []
            what = "" if assignment == "static" else " with dynamic assignment"
            how = "" if assignment == "static" else f" --assignment dynamic --out data/{machine}/dynamic"
            raise NoRecordedData(f"no recorded MegaMoE data{what} for machine {machine}; run `xstage sweep megamoe"
                                 f"{how}` on 2 GPUs" + (f" (recorded machines: {', '.join(have)})" if have else ""))
        return folder

    def run(folder: Path) -> None:
        cases = [c for c in CASES if c.shape.name in sel["shapes"]]
        run_megamoe(folder, recorded_params, world_size=torch.cuda.device_count(), dtypes=sel["dtypes"],
                    cases=cases, assignment=assignment,
                    command=f"xstage.moe_sweep.megamoe_data('gpu', dtypes={sel['dtypes']}, shapes={sel['shapes']}, "
                            f"assignment={assignment!r})")

    df, meta, folder = source_data(source, MEGAMOE, "the MegaMoE study", recorded, run, out,
                                   gpu_folder=lambda f: f / sub if sub else f)
    keep = df.dtype.isin(sel["dtypes"]) & df["shape"].isin(sel["shapes"])
    if not keep.any():
        raise NoRecordedData(f"{data.paths(folder, MEGAMOE)[0]} has no rows of dtypes {sel['dtypes']} and shapes "
                             f"{sel['shapes']} yet ({len(df)} rows of others)")
    return df[keep].reset_index(drop=True), meta
