"""The stage model scored on the never-fitted traffic families (xstage.traffic_families; records of
``xstage sweep families``): per train and burst the measured median program and its spread over programs (p10,
p90) against the model's (xstage.model.load_params: the parameters of a calibration or of a card's full records).
Nothing here is fitted.

The model gets each train as launched (xstage.stage_sim_programs.simulate_programs; ``inputs="launch"``): every
program its own sizes (per_program), its start delay (staggered), and the resident programs the launch's occupancy
allows (threads, and the compiled variant's registers from the record's family_kernel.json), the later programs
taking the places of those that finished; store width and warps per program are not inputs of the model (the score says whether it needs
them). The quantiles over programs are the simulated programs'. ``inputs="median_program"`` is the model's former view of the same trains:
every program the median program's sizes, all starting together, the resident wave (counted in the record: burst 0
starting within 1 us of the first program) as the grid.
Scores: |predicted / measured - 1| over bursts whose measured median is >= 1 us, median and p90, by family and P;
and of the grid's time (:func:`makespan`).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from .data import BURST_PROGRAM, load
from .model import load_params
from .stage_params import StageParams
from .stage_sim_programs import program_quantiles, resident_programs, simulate_programs
from .traffic_families import FAMILIES, KERNEL_FILE, FamilyTrain, families, kernel_key

MIN_NS = 1000.0
RESIDENT_NS = 1000.0   # a program whose first burst starts within this of the first program's was resident at launch
INPUTS = ("launch", "median_program")
# family_store_kernel's registers per thread where a record has no family_kernel.json (data/h100x1/families was
# recorded before xstage.families_sweep wrote it): the count the same kernel compiled to on the second H100's run
# (data/h100x1_second/families/family_kernel.json: 31 for 2-16 warps of 16-byte stores, 32 for 4 / 8 bytes, 37 at
# one warp; registers then bind no variant below threads and blocks).
FAMILY_KERNEL_REGS = 31


def family_of(name: str) -> str:
    """The family of a recorded train name (its tag before the seed: "width4-s0-00" -> "width")."""
    tag = name.split("-")[0].rstrip("0123456789")
    return {"perprog": "per_program"}.get(tag, tag)


def measured(pp: pd.DataFrame) -> pd.DataFrame:
    """Per (train, programs, burst): the median over runs of the programs' p10 / p50 / p90 issue time, the median
    program's size, the gap, and the programs resident at launch (``grid``)."""
    g = pp.groupby(["train", "programs", "rank", "repeat", "burst"])
    q = g.issue_ns.quantile([0.1, 0.5, 0.9]).unstack()
    q.columns = ["p10_ns", "p50_ns", "p90_ns"]
    q["burst_bytes"] = g.burst_bytes.median()
    q["gap_ns"] = g.gap_ns.first()
    first = pp[pp.burst == 0].groupby(["train", "programs", "rank", "repeat"]).start_ns
    grid = first.apply(lambda s: int((s - s.min() <= RESIDENT_NS).sum())).rename("grid")
    q = q.reset_index().merge(grid.reset_index(), on=["train", "programs", "rank", "repeat"])
    out = q.groupby(["train", "programs", "burst"], as_index=False).agg(
        p10_ns=("p10_ns", "median"), p50_ns=("p50_ns", "median"), p90_ns=("p90_ns", "median"),
        burst_bytes=("burst_bytes", "median"), gap_ns=("gap_ns", "first"), grid=("grid", "median"))
    out["family"] = out.train.map(family_of)
    return out


def launches(meta: dict) -> list[FamilyTrain]:
    """The trains a families record launched, from its sidecar's grid (xstage.traffic_families.families)."""
    grid = meta["params"]["grid"]
    out = []
    for fam in grid.get("families", FAMILIES):
        for target in grid["targets"]:
            out += families(fam, tuple(grid["programs"]), target, int(grid["count"]), int(grid["seed"]),
                            int(meta.get("sm_count", 132)), tuple(grid["kib"]))
    return out


def kernel_regs(folder) -> dict[str, int]:
    """Registers per thread of each compiled variant of the record's kernel (``family_kernel.json`` beside it, keyed
    as xstage.traffic_families.kernel_key); {} where the record has none."""
    path = Path(folder) / KERNEL_FILE
    if not path.exists():
        return {}
    return {k: int(v["n_regs"]) for k, v in json.loads(path.read_text())["variants"].items()}


def resident(tr: FamilyTrain, prm: StageParams, regs: dict[str, int] | None = None) -> int:
    """How many of ``tr``'s programs are resident at once: threads, blocks and the variant's registers
    (``regs`` from :func:`kernel_regs`; FAMILY_KERNEL_REGS where it has none)."""
    return resident_programs(tr.num_warps, prm.sm_count, (regs or {}).get(kernel_key(tr), FAMILY_KERNEL_REGS))


def predict_family(prm: StageParams, tr: FamilyTrain, inputs: str = "launch", grid: int | None = None,
                   regs: dict[str, int] | None = None) -> np.ndarray:
    """[3, n]: the model's p10 / p50 / p90 over programs of each burst's issue time of train ``tr``, free-running.
    ``inputs`` (module docstring): "launch" (the train as launched) or "median_program" (``grid`` programs, default
    tr.programs, every one the median program's sizes, all starting together)."""
    if inputs not in INPUTS:
        raise ValueError(f"inputs must be one of {', '.join(INPUTS)}, got {inputs!r}")
    if inputs == "median_program":
        P = int(grid or tr.programs)
        b = np.median(tr.sizes(), axis=0)
        return program_quantiles(simulate_programs(prm, np.tile(b, (max(P, 1), 1)), tr.gap_ns))
    times = simulate_programs(prm, tr.sizes(), tr.gap_ns, tr.delay_ns or None, resident=resident(tr, prm, regs))
    return program_quantiles(times)


def score(pp: pd.DataFrame, prm: StageParams, trains: list[FamilyTrain], inputs: str = "launch",
          regs: dict[str, int] | None = None) -> pd.DataFrame:
    """Per (train, programs, burst): measured and predicted p10 / p50 / p90 over programs and the relative errors.
    ``trains``: the launched trains (:func:`launches`), whose sizes must be the record's."""
    by_key = {(tr.name, tr.programs): tr for tr in trains}
    m = measured(pp)
    parts = []
    for (train, P), g in m.groupby(["train", "programs"], sort=False):
        g = g.sort_values("burst")
        tr = by_key.get((train, int(P)))
        if tr is None:
            raise ValueError(f"train {train} (P = {P}) of the record is not one of the launched trains")
        if not np.array_equal(np.median(tr.sizes(), axis=0), g.burst_bytes.to_numpy()):
            raise ValueError(f"train {train} (P = {P}): the record's sizes are not the launched train's")
        grid = int(g.grid.iloc[0]) if tr.family == "waves" else int(P)
        pred = predict_family(prm, tr, inputs, grid, regs)
        model_programs = grid if inputs == "median_program" else min(int(P), resident(tr, prm, regs))
        g = g.assign(model_programs=model_programs, pred_p10_ns=pred[0], pred_p50_ns=pred[1], pred_p90_ns=pred[2])
        parts.append(g)
    out = pd.concat(parts, ignore_index=True)
    for q in ("p10", "p50", "p90"):
        out[f"{q}_rel_error"] = out[f"pred_{q}_ns"] / out[f"{q}_ns"] - 1
    return out


def makespan(pp: pd.DataFrame, prm: StageParams, trains: list[FamilyTrain],
             regs: dict[str, int] | None = None) -> pd.DataFrame:
    """Per family and P: the grid's time from its first program's first burst to its last burst's end, measured
    (median over runs) against the model's (the trains as launched), median |relative error| and signed median."""
    by_key = {(tr.name, tr.programs): tr for tr in trains}
    t = pp.assign(end_ns=pp.start_ns + pp.issue_ns).groupby(["train", "programs", "rank", "repeat"])
    span = (t.end_ns.max() - t.start_ns.min()).groupby(["train", "programs"]).median()
    rows = []
    for (train, P), ns in span.items():
        tr = by_key[(train, int(P))]
        times = simulate_programs(prm, tr.sizes(), tr.gap_ns, tr.delay_ns or None, resident=resident(tr, prm, regs))
        rows.append(dict(family=tr.family, programs=int(P), measured_us=ns / 1e3,
                         rel_error=(np.nanmax(times.end) - np.nanmin(times.start)) / ns - 1))
    d = pd.DataFrame(rows)
    return d.groupby(["family", "programs"], as_index=False).agg(
        trains=("rel_error", "size"), measured_us=("measured_us", "median"),
        median_abs_error=("rel_error", lambda x: x.abs().median()), signed_median=("rel_error", "median"))


def summary(scored: pd.DataFrame, min_ns: float = MIN_NS) -> pd.DataFrame:
    """Median and p90 |relative error| of the median program (and of the programs' p10 / p90) over bursts whose
    measured median is >= ``min_ns``, by family and P, then every family and P together ("all")."""
    t = scored[scored.p50_ns >= min_ns]
    rows = []
    for key, g in [*t.groupby(["family", "programs"]), *((("all", "all"), t),)]:
        a = g.p50_rel_error.abs()
        rows.append(dict(family=key[0], programs=key[1], bursts=len(g), median_abs_error=a.median(),
                         p90_abs_error=a.quantile(0.9), signed_median=g.p50_rel_error.median(),
                         p10_median_abs_error=g.p10_rel_error.abs().median(),
                         p90_median_abs_error=g.p90_rel_error.abs().median()))
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    """``python -m xstage.families_analysis FAMILIES_DIR PARAMS_DIR [LINK] [--inputs launch|median_program]``: the
    summary of the model whose fit PARAMS_DIR holds (e.g. a calibration folder) on the families recorded in
    FAMILIES_DIR."""
    args = list(sys.argv[1:] if argv is None else argv)
    inputs = "launch"
    if "--inputs" in args:
        i = args.index("--inputs")
        inputs = args[i + 1] if i + 1 < len(args) else ""
        del args[i:i + 2]
    if len(args) not in (2, 3) or inputs not in INPUTS:
        print("usage: python -m xstage.families_analysis FAMILIES_DIR PARAMS_DIR [LINK] "
              "[--inputs launch|median_program]", file=sys.stderr)
        return 2
    pp, meta = load(args[0], BURST_PROGRAM)
    prm = load_params(args[1], args[2] if len(args) == 3 else "host")
    trains, regs = launches(meta), kernel_regs(args[0])
    print(f"registers per thread: {regs or f'not recorded ({FAMILY_KERNEL_REGS} assumed)'}")
    fmt = dict(index=False, float_format=lambda x: f"{x:.3f}")
    print(summary(score(pp, prm, trains, inputs, regs)).to_string(**fmt))
    if inputs == "launch":
        print("\nthe grid's time (first burst's start to the last burst's end):")
        print(makespan(pp, prm, trains, regs).to_string(**fmt))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
