"""``xstage`` command line: sweeps, benchmarks, fits, reproduction.

  xstage sweep burst-gap --out data/h200x2 [--burst-kib 1,2,...] [--gap-us 0,1,...] [--programs ...]
                         [--store-bytes 16,4] [--targets remote,local] [--bursts 8] [--repeats 5] [--drain]
                         [--world-size 2] [--source gpu|simulated]
  xstage sweep ulysses --out data/h200x2 [--world-size 2] [--shapes flux1_4608,seq_32k] [--repeats 10]
  xstage sweep megamoe --out data/h200x2 [--dtypes bf16,fp8] [--cases ...] [--max-minutes 8]
  xstage bench bandwidth --out data/h200x2
  xstage fit --data data/h200x2
  xstage reproduce [-p NAME VALUE] [-f params.yaml] [--only NOTEBOOK]

Sweeps start their own ranks (one process per GPU); nobody types torchrun. Parameters are checked before
anything launches; errors are one line, exit code 2.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys


def _ints(s: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in s.split(",") if x != "")
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None


def _floats(s: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in s.split(",") if x != "")
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {s!r}") from None


def _strs(s: str) -> tuple[str, ...]:
    return tuple(x for x in s.split(",") if x)


def build_parser() -> argparse.ArgumentParser:
    from .sweep import BurstGapGrid

    d = BurstGapGrid()
    ap = argparse.ArgumentParser(prog="xstage", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    sw = sub.add_parser("sweep", help="run a sweep and record it under data/<machine>/")
    swsub = sw.add_subparsers(dest="study", required=True)
    bg = swsub.add_parser("burst-gap", help="remote-store burst/gap sweep (notebook 01)")
    bg.add_argument("--out", required=True, help="output folder, e.g. data/h200x2 (resumes if it exists)")
    bg.add_argument("--burst-kib", type=_ints, default=d.burst_kib)
    bg.add_argument("--gap-us", type=_floats, default=d.gap_us)
    bg.add_argument("--programs", type=_ints, default=d.programs, help="default: 1,4,16,SMs/2,SMs,2*SMs")
    bg.add_argument("--store-bytes", type=_ints, default=d.store_bytes)
    bg.add_argument("--targets", type=_strs, default=d.targets)
    bg.add_argument("--bursts", type=int, default=d.n_bursts)
    bg.add_argument("--repeats", type=int, default=d.repeats)
    bg.add_argument("--drain", action="store_true", help="time each burst's drain (fence) instead of pure issue")
    bg.add_argument("--no-sync", action="store_true",
                    help="no grid barrier between bursts (programs drift apart: the free-running variant)")
    bg.add_argument("--world-size", type=int, default=d.world_size)
    bg.add_argument("--source", choices=("gpu", "simulated"), default="gpu")

    ul = swsub.add_parser("ulysses", help="Ulysses attention: fused vs serial vs overlapped (notebook 04)")
    ul.add_argument("--out", required=True, help="output folder, e.g. data/h200x2 (resumes if it exists)")
    ul.add_argument("--world-size", type=int, default=2)
    ul.add_argument("--shapes", type=_strs, default=(),
                    help="shape names from the DiT table / sequence sweep (default: all that fit the world size)")
    ul.add_argument("--repeats", type=int, default=10)
    ul.add_argument("--no-tune", action="store_true", help="use the first H200 config instead of timing several")

    mo = swsub.add_parser("megamoe", help="MegaMoE: schedules x 84 configurations, bf16 and FP8 (notebook 03)")
    mo.add_argument("--out", required=True, help="output folder, e.g. data/h200x2 (resumes if it exists)")
    mo.add_argument("--world-size", type=int, default=2)
    mo.add_argument("--dtypes", type=_strs, default=("bf16", "fp8"))
    mo.add_argument("--cases", type=_strs, default=(), help="case names (default: all 84)")
    mo.add_argument("--schedules", type=_strs, default=("expert_wave", "interleaved", "lag", "model_guided"))
    mo.add_argument("--repeats", type=int, default=20)
    mo.add_argument("--max-minutes", type=float, default=None,
                    help="start no new configuration after this long (run again to resume)")
    mo.add_argument("--assignment", choices=("static", "dynamic"), default="static",
                    help="tasks to programs: i %% programs (static) or claimed in list order (dynamic); "
                         "one folder per assignment, e.g. --out data/h200x2/dynamic")

    be = sub.add_parser("bench", help="benchmarks")
    besub = be.add_subparsers(dest="bench", required=True)
    bw = besub.add_parser("bandwidth", help="peak SM remote-store bandwidth vs copy-engine peer copy")
    bw.add_argument("--out", required=True)

    fi = sub.add_parser("fit", help="fit the Burst-Gap model to recorded burst-gap data")
    fi.add_argument("--data", required=True, help="folder holding burst_gap.csv/.json")
    fi.add_argument("--bootstrap", type=int, default=100)

    rp = sub.add_parser("reproduce", help="run every notebook through papermill into a run folder")
    try:  # the notebook stack is an extra: GPU nodes may run sweeps without it
        from . import reproduce
    except ImportError as e:
        rp.set_defaults(missing=str(e))
    else:
        reproduce.add_arguments(rp)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    command = "xstage " + shlex.join(argv)
    if os.environ.get("OUT"):  # the device machine's output folder: record it as $OUT, not as a local path
        command = command.replace(os.environ["OUT"].rstrip("/") + "/", "$OUT/")
    try:
        if args.cmd == "sweep" and args.study == "ulysses":
            from . import ulysses

            shapes = ulysses.shapes_by_name(args.shapes) if args.shapes else None
            print(ulysses.run_ulysses(args.out, world_size=args.world_size, repeats=args.repeats, shapes=shapes,
                                      tune=not args.no_tune, command=command))
        elif args.cmd == "sweep" and args.study == "megamoe":
            from . import moe

            cases = moe.cases_by_name(args.cases) if args.cases else None
            print(moe.run_megamoe(args.out, world_size=args.world_size, dtypes=args.dtypes, cases=cases,
                                  schedules=args.schedules, repeats=args.repeats, max_minutes=args.max_minutes,
                                  command=command, assignment=args.assignment))
        elif args.cmd == "sweep":
            from .sweep import BurstGapGrid, run_burst_gap

            grid = BurstGapGrid(burst_kib=args.burst_kib, gap_us=args.gap_us, programs=args.programs,
                                store_bytes=args.store_bytes, targets=args.targets, n_bursts=args.bursts,
                                repeats=args.repeats, drain=(True,) if args.drain else (False,),
                                sync=not args.no_sync, world_size=args.world_size)
            print(run_burst_gap(grid, args.out, source=args.source, command=command))
        elif args.cmd == "bench":
            from .bench import bandwidth_summary
            from .data import BANDWIDTH, load
            from .sweep import run_bandwidth

            run_bandwidth(args.out, command=command)
            df, _ = load(args.out, BANDWIDTH)
            print(bandwidth_summary(df).head(12).to_string(index=False))
        elif args.cmd == "fit":
            from .data import load
            from .fit import fit_burst_gap, summary_table

            df, meta = load(args.data)
            res = fit_burst_gap(df, n_bootstrap=args.bootstrap)
            print(f"{meta['machine']} ({meta['gpu_name']} x{meta['gpu_count']}):")
            print(summary_table(res).to_string(index=False))
        elif args.cmd == "reproduce":
            if getattr(args, "missing", None):
                raise RuntimeError(f"reproduce needs the notebook extra (pip install -e '.[notebooks]'): {args.missing}")
            from . import reproduce

            return reproduce.run(args)
    except (ValueError, RuntimeError, FileNotFoundError) as e:
        print(f"xstage: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
