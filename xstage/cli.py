"""``xstage`` command line: sweeps, benchmarks, fits, reproduction.

  xstage sweep burst-gap --out data/h200x2 [--burst-kib 1,2,...] [--gap-us 0,1,...] [--programs ...]
                         [--store-bytes 16,4] [--targets remote,local] [--bursts 8] [--repeats 5] [--drain]
                         [--world-size 2] [--source gpu|simulated]
  xstage sweep ulysses --out data/h200x2 [--ranks 2] [--shapes flux1_4608,seq_32k] [--repeats 10] [--chunks 4]
                       [--world one-gpu --ranks 2 --link local|host]   (every rank on one GPU, rank 0 timed)
                       [--traffic-ranks 8 --out data/h200x2/traffic8]   (8-rank traffic on 2 GPUs)
  xstage sweep megamoe --out data/h200x2 [--dtypes bf16,fp8] [--cases ...] [--max-minutes 8]
                       [--world one-gpu --ranks 2 --link local|host]   (every rank on one GPU, rank 0 timed)
                       [--traffic-ranks 8 --out data/h200x2/traffic8]   (8-rank traffic on 2 GPUs)
  xstage sweep families --out data/h100x1/families [--families width,warps,staggered,waves,per_program]
  xstage sweep trains --out data/h200x1 [--targets host,local] [--programs 16,66,132,264] [--seed 0]
                      [--burst-kib-range 1,1024] [--gap-us-range 0.5,300]
  xstage bench bandwidth --out data/h200x2 [--world-size 1]
  xstage fit --data data/h200x2 [--link nvlink|host] [--write]
  xstage predict --data data/h200x1 [--link host] --programs 132 --burst-kib 64,8 --gap-us 10,0
  xstage calibrate --link host|nvlink|local [--out data/<machine>/calibration] [--source gpu|simulated]
                   [--params-from data/h200x1] [--workers N]   (the short plan, then the link's full model)
  xstage reproduce [-p NAME VALUE] [-f params.yaml] [--only NOTEBOOK]
  xstage --version;  xstage <command> --help  (every option with its default)

Sweeps start their own ranks (one process per GPU) or run as the ranks torchrun or srun started (the same
command after `torchrun --nproc-per-node N -m`, or under srun). Parameters are checked before
anything launches; errors are one line on stderr, exit code 2 (XSTAGE_DEBUG=1 shows the traceback).
"""
from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import warnings
from pathlib import Path

from .options import HelpFormatter, OneLineParser, error_line


def _nonempty(s: str, items: tuple, what: str) -> tuple:
    if not items:
        raise argparse.ArgumentTypeError(f"expected a non-empty comma-separated list of {what}, got {s!r}")
    return items


def _ints(s: str) -> tuple[int, ...]:
    try:
        items = tuple(int(x) for x in s.split(",") if x.strip() != "")
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None
    return _nonempty(s, items, "integers")


def _floats(s: str) -> tuple[float, ...]:
    try:
        items = tuple(float(x) for x in s.split(",") if x.strip() != "")
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {s!r}") from None
    if not all(math.isfinite(x) for x in items):
        raise argparse.ArgumentTypeError(f"expected finite numbers, got {s!r}")
    return _nonempty(s, items, "numbers")


def _nonneg_floats(s: str) -> tuple[float, ...]:
    items = _floats(s)
    if any(x < 0 for x in items):
        raise argparse.ArgumentTypeError(f"expected numbers >= 0, got {s!r}")
    return items


def _positive_floats(s: str) -> tuple[float, ...]:
    items = _floats(s)
    if any(x <= 0 for x in items):
        raise argparse.ArgumentTypeError(f"expected numbers > 0, got {s!r}")
    return items


def _fitted_link(folder: str) -> str:
    """The one link whose full stage model is written in ``folder`` (``stage_fit_<link>.json.gz``)."""
    have = [link for link in ("nvlink", "host") if any(Path(folder).glob(f"stage_fit_{link}.json*"))]
    if len(have) != 1:
        raise ValueError(f"{folder} holds the fits of {', '.join(have) or 'no link'}: name one with --link "
                         "(write one with xstage fit --data DIR --write)")
    return have[0]


def _strs(s: str) -> tuple[str, ...]:
    return _nonempty(s, tuple(x.strip() for x in s.split(",") if x.strip()), "names")


def _count(s: str, minimum: int = 1) -> int:
    try:
        value = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
    return value


def _nonneg_int(s: str) -> int:
    return _count(s, 0)


def _minutes(s: str) -> float:
    try:
        value = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of minutes, got {s!r}") from None
    if not (0 < value < math.inf):
        raise argparse.ArgumentTypeError(f"expected a positive number of minutes, got {s!r}")
    return value


def _out_folder(s: str) -> str:
    """An output folder: it may not exist yet (it is created), it must not be a file."""
    if Path(s).exists() and not Path(s).is_dir():
        raise argparse.ArgumentTypeError(f"{s} is an existing file, not a folder")
    return s


def _data_folder(s: str) -> str:
    if not Path(s).is_dir():
        raise argparse.ArgumentTypeError(f"{s} is not a folder" if Path(s).exists() else f"{s} does not exist")
    return s


def build_parser() -> argparse.ArgumentParser:
    from .burst_gap_sweep import BurstGapGrid

    d = BurstGapGrid()
    from . import __version__

    ap = OneLineParser(prog="xstage", description=__doc__.split("\n")[0], formatter_class=HelpFormatter)
    ap.add_argument("--version", action="version", version=f"xstage {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    sw = sub.add_parser("sweep", help="run a sweep and record it under data/<machine>/")
    swsub = sw.add_subparsers(dest="study", required=True)
    bg = swsub.add_parser("burst-gap", help="remote-store burst/gap sweep (notebook 01)")
    bg.add_argument("--out", required=True, type=_out_folder, help="output folder, e.g. data/h200x2 (resumes if it exists)")
    bg.add_argument("--burst-kib", type=_ints, default=d.burst_kib, help="burst sizes per program (KiB)")
    bg.add_argument("--gap-us", type=_nonneg_floats, default=d.gap_us, help="compute gaps between bursts (us)")
    bg.add_argument("--programs", type=_ints, default=d.programs,
                    help="issuing program counts (default: 1,4,16,SMs/2,SMs,2*SMs of the GPU)")
    bg.add_argument("--store-bytes", type=_ints, default=d.store_bytes, help="store widths (bytes)")
    bg.add_argument("--targets", "--target", dest="targets", type=_strs, default=None,
                    help="remote (peer GPU over NVLink), host (pinned host memory over PCIe), local (control); "
                         "default: remote,local with 2 GPUs, host,local with one")
    bg.add_argument("--bursts", type=_count, default=d.n_bursts, help="bursts per train")
    bg.add_argument("--repeats", type=int, default=d.repeats, help="timed trains per configuration")
    bg.add_argument("--drain", action="store_true", help="time each burst's drain (fence) instead of pure issue")
    bg.add_argument("--no-sync", action="store_true",
                    help="no grid barrier between bursts (programs drift apart: the free-running variant)")
    bg.add_argument("--barrier", choices=("release", "relaxed"), default="release",
                    help="release: the grid barrier's arrival waits for the program's stores (the stage drains "
                         "at every barrier; the recorded sweeps); relaxed: it does not")
    bg.add_argument("--world-size", type=int, default=None, help="default: 2 with a remote target, else 1")
    bg.add_argument("--source", choices=("gpu", "simulated"), default="gpu",
                    help="gpu: run the kernels; simulated: the Burst-Gap event simulation (no GPU)")

    from .burst_gap_sweep import TRAIN_FAMILIES, TrainGrid

    t = TrainGrid()
    tr = swsub.add_parser("trains", help="free-running irregular trains, sizes and gaps as data (notebooks 01/02)")
    tr.add_argument("--out", required=True, type=_out_folder, help="output folder, e.g. data/h200x1 (resumes if it exists)")
    tr.add_argument("--targets", "--target", dest="targets", type=_strs, default=None,
                    help="remote, host, local; default: remote,local with 2 GPUs, host,local with one")
    tr.add_argument("--programs", type=_ints, default=t.programs, help="issuing program counts")
    tr.add_argument("--seed", type=int, default=t.seed, help="the family's seed (a new seed: new trains)")
    tr.add_argument("--count", type=int, default=t.count, help="trains in the family")
    tr.add_argument("--bursts", type=_count, default=t.n_bursts, help="bursts per train")
    tr.add_argument("--burst-kib-range", type=_floats, default=t.kib, metavar="LOW,HIGH",
                    help="burst sizes per program, KiB (log-uniform between LOW and HIGH)")
    tr.add_argument("--gap-us-range", type=_nonneg_floats, default=t.gap_us, metavar="LOW,HIGH",
                    help="compute gaps, us (log-uniform between LOW and HIGH; a quarter of them 0)")
    tr.add_argument("--repeats", type=int, default=t.repeats, help="timed repeats per train")
    tr.add_argument("--family", choices=TRAIN_FAMILIES, default=t.family,
                    help="random: the seeded family; probe: designed trains (a lead burst, then 2 KiB probes); "
                         "probe_size: a lead burst, then probes of 2-32 KiB (one size per train)")
    tr.add_argument("--per-program", action="store_true",
                    help="also record every program's every burst and its SM (burst_program, beside burst_train)")
    tr.add_argument("--no-preload", dest="preload", action="store_false",
                    help="read each burst's parameters at its top (the legacy train kernel: its loads at bursts 4 and 8 "
                         "wait behind the program's outstanding stores; docs/findings.md)")
    tr.add_argument("--load-probe", type=int, choices=(0, 1, 2), default=t.load_probe,
                    help="one timed load after each burst (with --per-program): 1 a word in L1, 2 a word in L2 "
                         "(burst_program's load_ns: what a fused kernel's next load waits behind its stores)")
    tr.add_argument("--world-size", type=int, default=None, help="default: 2 with a remote target, else 1")
    tr.add_argument("--source", choices=("gpu", "simulated"), default="gpu",
                    help="simulated: the stage model with the parameters fitted to --params-from")
    tr.add_argument("--params-from", default=None, help="data folder whose fit drives the simulated source")
    tr.add_argument("--link", choices=("nvlink", "host"), default="host", help="which fit --params-from gives")

    from .traffic_families import FAMILIES

    fa = swsub.add_parser("families", help="never-fitted traffic families, per program (xstage.families_analysis "
                                           "scores the stage model on them)")
    fa.add_argument("--out", required=True, type=_out_folder, help="output folder, e.g. data/h100x1/families (resumes)")
    fa.add_argument("--families", type=_strs, default=FAMILIES,
                    help="width (4 / 8-byte stores), warps (1, 2, 8, 16 per program), staggered (programs starting "
                         "20 / 60 us late), waves (more programs than are resident), per_program (every program its "
                         "own sizes)")
    fa.add_argument("--programs", type=_ints, default=(16, 66, 132, 264, 528),
                    help="program counts (528: the waves' resident wave; the other families skip counts > 2 x SMs)")
    fa.add_argument("--targets", "--target", dest="targets", type=_strs, default=("host",), help="host, local or remote")
    fa.add_argument("--count", type=_count, default=3, help="seeded base trains per family")
    fa.add_argument("--repeats", type=_count, default=3, help="timed repeats per train")

    ul = swsub.add_parser("ulysses", help="Ulysses attention: fused vs serial vs overlapped (notebook 04)")
    ul.add_argument("--out", required=True, type=_out_folder, help="output folder, e.g. data/h200x2 (resumes if it exists)")
    ul.add_argument("--ranks", "--world-size", dest="ranks", type=_count, default=2,
                    help="ranks of the layer (--world gpus: one process per GPU; one-gpu: every rank on one GPU)")
    ul.add_argument("--shapes", type=_strs, default=(),
                    help="shape names from the DiT table / sequence sweep (default: all that fit the world size)")
    ul.add_argument("--repeats", type=int, default=10, help="timed repeats per shape and method")
    ul.add_argument("--no-tune", action="store_true", help="use the first H200 config instead of timing several")
    ul.add_argument("--world", choices=("gpus", "one-gpu"), default="gpus",
                    help="gpus: one process per GPU, NCCL all-to-alls (--ranks GPUs); one-gpu: --ranks ranks on "
                         "one GPU, run one after another, all-to-alls by copies (no NCCL)")
    ul.add_argument("--link", choices=("local", "host"), default=None,
                    help="one-gpu only: where the peers' outputs live: local (device memory, a compute-only "
                         "control) or host (pinned host memory: the observed rank's remote stores cross PCIe; "
                         "default)")
    ul.add_argument("--chunks", type=int, default=None,
                    help="head chunks of the overlapped baseline (default: timed per shape over 1, 2, 3, 4, 6, 8, "
                         "12 and the fastest kept)")
    ul.add_argument("--methods", type=_strs, default=(),
                    help="methods to time (default: all; FA4's fa, fa_kernel, fa_serial, fa_fused are skipped, recorded as "
                         "absent, where the extra fa4 or a Hopper GPU is missing; the Gluon kernel's gluon, "
                         "gluon_serial, gluon_fused where Gluon cannot run)")
    ul.add_argument("--traffic-ranks", type=int, default=None,
                    help="8-rank traffic on 2 GPUs (xstage.traffic_ulysses): each of the 2 GPUs plays one rank of a "
                         "layer of this many ranks (H/8 heads over the full sequence: 7/8 of its output crosses "
                         "NVLink); --world gpus --ranks 2 only, into a folder named traffic<N> (e.g. "
                         "data/h200x2/traffic8); methods fused, serial_bytes, attention_only")

    from .moe_plan import ASSIGNMENT_REGISTRY, DTYPE_REGISTRY, DTYPES_GPU, SCHEDULE_REGISTRY, SCHEDULES

    mo = swsub.add_parser("megamoe", help="MegaMoE: schedules x 84 configurations, bf16 and FP8 (notebook 03)")
    mo.add_argument("--out", required=True, type=_out_folder,
                    help="output folder, e.g. data/h200x2 (resumes if it exists)")
    mo.add_argument("--ranks", "--world-size", dest="ranks", type=_count, default=2,
                    help="EP ranks of the layer (--world gpus: one process per GPU; one-gpu: all on one GPU)")
    mo.add_argument("--world", choices=("gpus", "one-gpu"), default="gpus",
                    help="gpus: one process per GPU, combine over NVLink; one-gpu: every rank in one process on one "
                         "GPU, run one after another, times of rank 0 (needs --link)")
    mo.add_argument("--link", choices=("local", "host"), default=None,
                    help="--world one-gpu only: local (every buffer in GPU memory: compute-only) or host (the peers' "
                         "combine buffers in pinned host memory: rank 0's remote combine stores cross PCIe)")
    mo.add_argument("--dtypes", type=_strs, default=DTYPES_GPU,
                    help="; ".join(f"{d}: {DTYPE_REGISTRY[d].doc}" for d in DTYPES_GPU))
    mo.add_argument("--cases", type=_strs, default=(), help="case names (default: all 84)")
    mo.add_argument("--schedules", type=_strs, default=SCHEDULES, help=SCHEDULE_REGISTRY.help())
    mo.add_argument("--repeats", type=int, default=20, help="timed repeats per configuration")
    mo.add_argument("--max-minutes", type=_minutes, default=None,
                    help="start no new configuration after this long (run again to resume; default: no limit)")
    mo.add_argument("--traffic-ranks", type=int, default=None,
                    help="8-rank traffic on 2 GPUs (xstage.traffic): each of the 2 GPUs plays one rank of a layer of "
                         "this many ranks (its experts, rows and egress: 7/8 of its combine crosses NVLink); --world "
                         "gpus --ranks 2 only, into a folder named traffic<N> (e.g. data/h200x2/traffic8)")
    mo.add_argument("--assignment", choices=ASSIGNMENT_REGISTRY.names, default="dynamic",
                    help=f"tasks to programs: {ASSIGNMENT_REGISTRY.help()}; one folder per assignment")

    be = sub.add_parser("bench", help="benchmarks")
    besub = be.add_subparsers(dest="bench", required=True)
    bw = besub.add_parser("bandwidth", help="peak SM remote-store bandwidth vs copy-engine peer copy")
    bw.add_argument("--out", required=True, type=_out_folder, help="output folder, e.g. data/h200x2")
    bw.add_argument("--world-size", type=int, default=None,
                    help="2: NVLink peer, host and local; 1: host link and local (default: 2 if two GPUs)")

    fi = sub.add_parser("fit", help="fit the stage model of one link to a machine's records")
    fi.add_argument("--data", required=True, type=_data_folder,
                    help="folder holding burst_gap (+ free_running/, burst_train) records")
    fi.add_argument("--link", choices=("nvlink", "host"), default=None,
                    help="nvlink: the remote target; host: pinned host memory (default: the one recorded)")
    fi.add_argument("--write", action="store_true",
                    help="write the fit to <data>/stage_fit_<link>[_<rung>].json.gz (the full model's: what load_params and "
                         "notebooks read)")
    fi.add_argument("--rung", choices=("fluid", "capacity(P)", "shares", "pool", "stage", "free_store"), default=None,
                    help="default: the link's full model (xstage.stage_fit.FULL_RUNG: NVLink stage, host free_store), "
                         "written as stage_fit_<link>.json.gz; every other rung as stage_fit_<link>_<rung>.json.gz. "
                         "The ladder: fluid (the paper's three parameters, constant capacity, equal shares), "
                         "capacity(P) (+ capacity growing with the programs), shares (+ unequal drain shares), "
                         "pool (+ the stall: a filled stage keeps part of its capacity until it empties), "
                         "stage (every program's own store slots beside a shared part; NVLink's full model), "
                         "free_store (the drain shared per GPC holding stores and the first f KiB of every burst "
                         "entering the stage at once, fitted on the clean trains; the host link's full model)")
    fi.add_argument("--folds", type=int, default=5, help="held-out folds (by train)")
    fi.add_argument("--fluid", action="store_true", help="the landed fluid fit of the synchronised sweep only")
    fi.add_argument("--bootstrap", type=_nonneg_int, default=100, help="bootstrap draws (--fluid only)")

    pr = sub.add_parser("predict", help="per-burst times of a train from a link's fitted stage model")
    pr.add_argument("--data", required=True, type=_data_folder, help="folder with the link's fit (xstage fit --write)")
    pr.add_argument("--link", choices=("nvlink", "host"), default=None,
                    help="which fitted link (default: the one whose fit is in --data)")
    pr.add_argument("--programs", type=_count, required=True, help="issuing programs")
    pr.add_argument("--burst-kib", type=_positive_floats, required=True, help="KiB per program per burst, e.g. 64,8,320")
    pr.add_argument("--gap-us", type=_nonneg_floats, required=True, help="compute gap after each burst (us), e.g. 10,0,100")
    pr.add_argument("--sync", action="store_true", help="grid barrier between bursts: the grid's span per burst")
    pr.add_argument("--read-fence", type=_ints, default=(),
                    help="bursts (0-based, e.g. 4,8) whose start holds a read that waits for the program's own stores "
                         "to drain, as in the legacy train kernel (data.legacy_read_bursts); default none")

    ca = sub.add_parser("calibrate", help="measure the short calibration plan on this GPU and fit the link's full "
                                          "stage model (xstage.calibrate)")
    ca.add_argument("--link", choices=("host", "nvlink", "local"), default="host",
                    help="host: pinned host memory over PCIe (one GPU); nvlink: a peer GPU (two); local: this GPU's "
                         "memory")
    ca.add_argument("--out", type=_out_folder, default=None,
                    help="folder of the plan's records and the fit (default: data/<this machine>/calibration; resumes)")
    ca.add_argument("--source", choices=("gpu", "simulated"), default="gpu",
                    help="simulated: the stage model with the parameters written in --params-from (no GPU)")
    ca.add_argument("--params-from", type=_data_folder, default=None,
                    help="folder whose fit of the link drives --source simulated, e.g. data/h200x1")
    ca.add_argument("--start-from", default="auto",
                    help="folder whose fit of the link starts the fit (auto: the reference card's, data/h200x1 or "
                         "data/h200x2; none: the read-off values and a coarse prescan)")
    ca.add_argument("--workers", type=_count, default=None, help="fit processes (default: every CPU)")

    rp = sub.add_parser("reproduce", help="run every notebook through papermill into a run folder")
    try:  # the notebook stack is an extra: GPU nodes may run sweeps without it
        from . import reproduce
    except ImportError as e:
        rp.set_defaults(missing=str(e))
    else:
        reproduce.add_arguments(rp)
    _every_parser(ap)
    return ap


def _every_parser(parser: argparse.ArgumentParser) -> None:
    """Each subcommand: its help as description, defaults in its help (HelpFormatter), one-line errors."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, child in action.choices.items():
                child.formatter_class = HelpFormatter
                child.description = child.description or helps.get(name)
                _every_parser(child)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    command = "xstage " + shlex.join(argv)
    if os.environ.get("OUT"):  # the device machine's output folder: record it as $OUT, not as a local path
        command = command.replace(os.environ["OUT"].rstrip("/") + "/", "$OUT/")
    try:
        if args.cmd == "sweep" and args.study == "ulysses":
            from .ulysses import shapes_by_name
            from .ulysses_sweep import run_ulysses

            shapes = shapes_by_name(args.shapes) if args.shapes else None
            one = args.world == "one-gpu"
            if args.traffic_ranks is not None:   # 8-rank traffic on 2 GPUs: its own sweep and schema
                from .traffic_ulysses import run as run_traffic

                if args.chunks is not None:
                    raise ValueError("--chunks is for the overlapped baseline, which --traffic-ranks does not run")
                print(run_traffic(args.out, args.traffic_ranks, world_size=args.ranks,
                                  shapes=shapes, repeats=args.repeats, tune=not args.no_tune, command=command,
                                  world=args.world, link=args.link,
                                  **({"methods": list(args.methods)} if args.methods else {})))
                return 0
            if not one and args.link is not None:
                raise ValueError(f"--link {args.link} is for --world one-gpu (the gpus world's peers are NVLink peers)")
            print(run_ulysses(args.out, world_size=args.ranks, repeats=args.repeats,
                              shapes=shapes, tune=not args.no_tune, command=command, chunks=args.chunks,
                              world=args.world, link=args.link,
                              **({"methods": list(args.methods)} if args.methods else {})))
        elif args.cmd == "sweep" and args.study == "megamoe":
            from .moe_plan import cases_by_name
            from .moe_sweep import run_megamoe
            from .sources import recorded_params

            cases = cases_by_name(args.cases) if args.cases else None
            if args.world == "gpus" and args.link is not None:
                raise ValueError("--link is for --world one-gpu (the gpus world's combine crosses NVLink)")
            if args.world == "one-gpu" and args.link is None:
                raise ValueError("--world one-gpu needs --link local or --link host")
            # predictions: the stage model of the link the combine crosses (one GPU: its host link's fit)
            prm = recorded_params if args.world == "gpus" else (lambda: recorded_params("h200x1"))
            print(run_megamoe(args.out, prm, world_size=args.ranks, dtypes=args.dtypes,
                              cases=cases, schedules=args.schedules, repeats=args.repeats,
                              max_minutes=args.max_minutes, command=command, assignment=args.assignment,
                              world=args.world, link=args.link, traffic_ranks=args.traffic_ranks))
        elif args.cmd == "sweep" and args.study == "families":
            from .families_sweep import FamiliesGrid, run_families

            grid = FamiliesGrid(families=args.families, programs=args.programs, targets=args.targets, count=args.count,
                                repeats=args.repeats, world_size=2 if "remote" in args.targets else 1)
            print(run_families(grid, args.out, command=command))
        elif args.cmd == "sweep" and args.study == "trains":
            from .burst_gap_sweep import TrainGrid, default_targets, run_trains, world_for

            targets = args.targets or default_targets()
            for opt, rng in (("--burst-kib-range", args.burst_kib_range), ("--gap-us-range", args.gap_us_range)):
                if len(rng) != 2 or rng[0] > rng[1] or (opt == "--burst-kib-range" and rng[0] <= 0):
                    raise ValueError(f"{opt} takes LOW,HIGH with {'0 < ' if opt == '--burst-kib-range' else '0 <= '}"
                                     f"LOW <= HIGH, got {','.join(f'{x:g}' for x in rng)}")
            grid = TrainGrid(seed=args.seed, count=args.count, n_bursts=args.bursts, programs=args.programs,
                             kib=args.burst_kib_range, gap_us=args.gap_us_range, per_program=args.per_program, family=args.family,
                             preload=args.preload, load_probe=args.load_probe,
                             targets=targets, repeats=args.repeats, world_size=world_for(targets) if args.world_size is None else args.world_size)
            params = None
            if args.source == "simulated":
                from .model import load_params

                if not args.params_from:
                    raise ValueError("--source simulated needs --params-from DIR (a folder with a stage fit)")
                params = load_params(args.params_from, args.link)
            print(run_trains(grid, args.out, source=args.source, params=params, command=command))
        elif args.cmd == "sweep":
            from .burst_gap_sweep import BurstGapGrid, default_targets, run_burst_gap, world_for

            targets = args.targets or default_targets()
            grid = BurstGapGrid(burst_kib=args.burst_kib, gap_us=args.gap_us, programs=args.programs,
                                store_bytes=args.store_bytes, targets=targets, n_bursts=args.bursts,
                                repeats=args.repeats, drain=(True,) if args.drain else (False,),
                                sync=not args.no_sync, world_size=world_for(targets) if args.world_size is None else args.world_size,
                                release=args.barrier == "release")
            print(run_burst_gap(grid, args.out, source=args.source, command=command))
        elif args.cmd == "bench":
            from .data import BANDWIDTH, load
            from .burst_gap_analysis import bandwidth_summary
            from .burst_gap_sweep import run_bandwidth

            run_bandwidth(args.out, command=command, world_size=args.world_size)
            df, _ = load(args.out, BANDWIDTH)
            print(bandwidth_summary(df).to_string(index=False))
        elif args.cmd == "fit" and args.fluid:
            from .data import load
            from .fit import fit_burst_gap, fluid_summary

            df, meta = load(args.data)
            res = fit_burst_gap(df, n_bootstrap=args.bootstrap)
            print(f"{meta['machine']} ({meta['gpu_name']} x{meta['gpu_count']}):")
            print(fluid_summary(res).to_string(index=False))
        elif args.cmd == "fit":
            from .stage_fit import fit_link, recorded_links, stage_summary, write_stage_fit

            link = args.link or recorded_links(args.data)[0]
            res = fit_link(args.data, link, rung=args.rung, k_folds=args.folds)
            print(stage_summary(res).to_string(index=False))
            if args.write:
                print(write_stage_fit(res, args.data, command=command))
        elif args.cmd == "predict":
            from .fluid import KIB
            from .model import OutsideFitWarning, load_params, predict_train

            link = args.link or _fitted_link(args.data)
            if len(args.burst_kib) != len(args.gap_us):
                raise ValueError(f"--burst-kib has {len(args.burst_kib)} bursts and --gap-us {len(args.gap_us)} gaps: "
                                 "give one gap per burst")
            prm = load_params(args.data, link)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", OutsideFitWarning)
                t = predict_train(prm, args.programs, [b * KIB for b in args.burst_kib],
                                  [g * 1e3 for g in args.gap_us], sync=args.sync, read_fence=args.read_fence)
            for w in caught:   # one line each, in the option's words
                print(f"xstage: warning: --{str(w.message)}", file=sys.stderr)
            what = "grid span" if args.sync else "median program's issue time"
            print(f"{link}, {args.programs} programs, {what} per burst (ns):")
            print(" ".join(f"{x:.1f}" for x in t))
        elif args.cmd == "calibrate":
            from . import calibrate, env
            from .data import DATA_ROOT

            out = args.out or str(DATA_ROOT / (env.machine_name() if args.source == "gpu" else "simulated") / "calibration")
            start = None if args.start_from == "none" else args.start_from
            c = calibrate.run(args.link, out, source=args.source, params_from=args.params_from, start_from=start,
                              workers=args.workers, command=command)
            print(c.summary, end="")
            print(c.path)
        elif args.cmd == "reproduce":
            if getattr(args, "missing", None):
                raise RuntimeError(f"reproduce needs the notebook extra (pip install -e '.[notebooks]'): {args.missing}")
            from . import reproduce

            return reproduce.run(args)
    except Exception as e:  # noqa: BLE001 - every error is one line (XSTAGE_DEBUG=1: the traceback)
        if os.environ.get("XSTAGE_DEBUG"):
            raise
        known = isinstance(e, (ValueError, RuntimeError, OSError))
        text = " ".join(str(e).split()) or type(e).__name__
        return error_line("xstage", text if known else f"{type(e).__name__}: {text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
