"""Issue 11, one H200: per-program host-link trains and the chip's SM -> GPC map recorded in ONE process.

The per-program records (data/h200x1/train_programs_p) show three classes of SMs at P = 16 (the drain's share of
a program 0.5x, 2.3x and 12x the median's); the hypothesis is a drain shared per GPC first. docs/findings.md warns
that the %smid numbering may move between processes, so the map is read inside the process that records the
trains (scripts/gpc_map.cu built as a library, called through ctypes on the same CUDA context), before and after
the trains. Usage (on the GPU machine; see scripts/trains_gpc.sh):

    python3 scripts/trains_gpc.py LIB OUT_FOLDER [--programs 16,32,48,66] [--seed 7] [--count 6] [--repeats 3]

Writes OUT_FOLDER/{burst_train,burst_program}.{csv,json} (xstage sweep trains --per-program, resumable) and
OUT_FOLDER/gpc_map_{before,after}.jsonl (gpc_map.cu's lines).
"""
from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path


def _map(lib: str, path: Path) -> None:
    import torch

    torch.zeros(1, device="cuda")                      # the process's CUDA context exists before the map runs
    rc = ctypes.CDLL(lib).gpc_map_run(str(path).encode())
    if rc != 0:
        raise RuntimeError(f"gpc_map_run returned {rc} (its CUDA error is on stderr)")


def job(world, grid, folder: str, meta: dict, lib: str) -> None:
    from xstage.burst_gap_sweep import train_job

    _map(lib, Path(folder) / "gpc_map_before.jsonl.part")
    (Path(folder) / "gpc_map_before.jsonl.part").replace(Path(folder) / "gpc_map_before.jsonl")
    train_job(world, grid, folder, meta)
    _map(lib, Path(folder) / "gpc_map_after.jsonl.part")
    (Path(folder) / "gpc_map_after.jsonl.part").replace(Path(folder) / "gpc_map_after.jsonl")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lib")
    ap.add_argument("out")
    ap.add_argument("--programs", default="16,32,48,66")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--count", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    if not Path(a.lib).is_file():
        raise SystemExit(f"trains_gpc: no library {a.lib} (build scripts/gpc_map.cu with -shared -DGPC_MAP_LIB)")
    from dataclasses import asdict

    from xstage import env
    from xstage.burst_gap_sweep import TrainGrid
    from xstage.ranks import spawn

    programs = tuple(int(x) for x in a.programs.split(","))
    grid = TrainGrid(seed=a.seed, count=a.count, programs=programs, per_program=True, targets=("host",),
                     repeats=a.repeats, world_size=1)
    grid.validate()
    Path(a.out).mkdir(parents=True, exist_ok=True)
    command = "python3 scripts/trains_gpc.py " + " ".join(sys.argv[1:] if argv is None else argv)
    meta = env.provenance(command, {"grid": asdict(grid), "source": "gpu", "gpc_map": "gpc_map_{before,after}.jsonl"})
    spawn(job, 1, grid, a.out, meta, a.lib)
    return 0


if __name__ == "__main__":
    sys.exit(main())
