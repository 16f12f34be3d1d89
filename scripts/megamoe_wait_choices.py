"""Which configurations model_guided's choice changes with the wait model (issue 15, item 3, session 8; CPU only).

For every configuration x dtype of round 4's A/B (data/h200x1/megamoe_round4/: dynamic assignment, compute only,
the default tiles and order), rank 0's model_guided list is chosen twice, with the cost model's wait term in list
positions (``positions``, what every record so far ran) and with the event walk in time (``time``,
``moe_plan.wait_walk``), each with the per-program rate calibrated on the recorded Expert-Wave compute-only time
under its own wait model, and the host link's stage model (``studies.recorded_params('h200x1')``, what the lists
and host sweeps choose with). Prints the choices that differ and writes them as CSV (a model, computed).
  .venv/bin/python scripts/megamoe_wait_choices.py [OUT.csv] [--cases a,b,...]
"""
import sys

import numpy as np
import pandas as pd

from xstage import data, studies
from xstage.moe_plan import (CASES, OUT_DTYPES, TILE_SWIZZLE, CostModel, TileGrid, build_schedule, calibrate_rate,
                             routing_of, tiles_of_row)

N_SMS = 132
WAITS = ("positions", "time")


def choices(case, dtype: str, ms_ew: float, prm, tiles) -> dict:
    s = case.shape
    layouts = routing_of(case, 2)[2]
    grid = TileGrid.of(layouts[0], s.hidden, s.intermediate, tiles, TILE_SWIZZLE)
    ew = build_schedule("expert_wave", grid, N_SMS)
    remote = grid.remote_rows_per_block(layouts[0])
    out = {}
    for w in WAITS:
        rate = calibrate_rate(ew, s.hidden, s.intermediate, tiles, N_SMS, ms_ew, "dynamic", w)
        cost = CostModel(prm, rate, N_SMS, OUT_DTYPES[dtype].itemsize, "dynamic", w)
        out[w] = build_schedule("model_guided", grid, N_SMS,
                                model=(cost, remote, s.hidden, s.intermediate, tiles)).param
    return out


def main(argv) -> None:
    only = None
    if "--cases" in argv:
        only = set(argv[argv.index("--cases") + 1].split(","))
        argv = argv[:argv.index("--cases")] + argv[argv.index("--cases") + 2:]
    df, _ = data.load("data/h200x1/megamoe_round4", data.MEGAMOE_GEMM)
    base = df[(df.schedule == "expert_wave") & (df.assignment == "dynamic") & (df.variant == "default")]
    mg = df[(df.schedule == "model_guided") & (df.assignment == "dynamic") & (df.variant == "default")]
    prm = studies.recorded_params("h200x1")
    rows = []
    for c in CASES:
        if only and c.name not in only:
            continue
        for dtype in ("bf16", "fp8"):
            k = (base["shape"] == c.shape.name) & (base.tokens == c.tokens) & (base.routing == c.routing) & \
                (base.dtype == dtype)
            if not k.any():
                continue
            ms = float(base[k].ms.iloc[0])
            ch = choices(c, dtype, ms, prm, tiles_of_row(base[k].iloc[0]))   # the tiles the row ran
            km = (mg["shape"] == c.shape.name) & (mg.tokens == c.tokens) & (mg.routing == c.routing) & \
                (mg.dtype == dtype)
            rec = str(mg[km].note.iloc[0]) if km.any() else ""
            rows.append(dict(config=c.name, dtype=dtype, recorded=rec, **ch, changed=ch["positions"] != ch["time"]))
            if rows[-1]["changed"] or rec != ch["positions"]:
                print(f"{c.name} {dtype}: recorded {rec}; positions {ch['positions']}; time {ch['time']}", flush=True)
    t = pd.DataFrame(rows)
    print(f"{int(t.changed.sum())} of {len(t)} choices change; the positional choice reproduces the recorded one in "
          f"{int((t.recorded == t.positions).sum())}")
    if argv[1:]:
        t.to_csv(argv[1], index=False)


if __name__ == "__main__":
    main(sys.argv)
