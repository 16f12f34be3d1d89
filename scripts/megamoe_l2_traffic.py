"""What still costs the mixing schedules on DeepSeek-V4-Pro (issue 15, point 3; CPU only, round 4): the L2 model.

For every dynamic-assignment row of round 3's controls (data/h200x1/megamoe_round3/, study controls: the
compute-only time of each list over Expert-Wave's, same rounds, row-block-major tiles) the modelled DRAM bytes of
the list that ran over Expert-Wave's (xstage.moe_plan.l2_traffic: an LRU L2 walked in list order), and the
correlation of the logs per dtype and shape; then, for the worst configurations, the same model for the tile
swizzle (groups of G row blocks, the weight column blocks outer) the round-4 default uses. A model, computed;
nothing measured is changed.   Run: .venv/bin/python scripts/megamoe_l2_traffic.py [--shapes deepseek_v4_pro]
"""
import argparse
from dataclasses import replace

import numpy as np
import pandas as pd

from xstage import data
from xstage.moe_plan import (CASES, TileGrid, build_schedule, l2_traffic, routing_of, schedule_of_param,
                             tiles_of_row)
from xstage.numeric import geomean

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--shapes", default="deepseek_v4_pro", help="comma-separated, or 'all' (all 84: a few minutes)")
ap.add_argument("--swizzles", default="0,4,8,16")
a = ap.parse_args()
N_SMS = 132
df, _ = data.load("data/h200x1/megamoe_round3", data.MEGAMOE_GEMM)
c = df[(df.study == "controls") & (df.assignment == "dynamic")]
if a.shapes != "all":
    c = c[c["shape"].isin(a.shapes.split(","))]
cases = {(x.shape.name, x.tokens, x.routing): x for x in CASES}
out, worst = [], []
for (name, T, routing, dtype), g in c.groupby(["shape", "tokens", "routing", "dtype"], sort=False):
    cs = cases[(name, T, routing)]
    s = cs.shape
    tiles = tiles_of_row(g.iloc[0])
    grid = TileGrid.of(routing_of(cs, 2)[2][0], s.hidden, s.intermediate, tiles)    # rank 0, row-block-major
    act = 1 if dtype == "fp8" else 2
    ew = g[g.schedule == "expert_wave"].iloc[0]
    base = l2_traffic(build_schedule("expert_wave", grid, N_SMS), s.hidden, s.intermediate, tiles, act)["bytes"]
    for x in g[g.schedule != "expert_wave"].itertuples():
        note = "" if x.note == "-" else x.note
        tl_ = (build_schedule("expert_wave", grid, N_SMS) if note == "expert_wave"
               else schedule_of_param(x.schedule, note, grid, N_SMS))
        b = l2_traffic(tl_, s.hidden, s.intermediate, tiles, act)["bytes"]
        out.append(dict(shape=name, T=T, routing=routing, dtype=dtype, schedule=x.schedule, variant=x.variant,
                        measured=x.ms / ew.ms, modelled=b / base))
    if T >= 2048 and ew.variant == "default":
        row = dict(config=f"{name}_T{T}_{routing}", dtype=dtype, ew_gb=base / 1e9)
        for G in map(int, a.swizzles.split(",")):
            gg = replace(grid, swizzle=G)
            eb = l2_traffic(build_schedule("expert_wave", gg, N_SMS), s.hidden, s.intermediate, tiles, act)["bytes"]
            row[f"G{G}:expert_wave"] = eb / base
            for sch in ("interleaved", "lag"):
                row[f"G{G}:{sch}"] = l2_traffic(build_schedule(sch, gg, N_SMS), s.hidden, s.intermediate, tiles,
                                                act)["bytes"] / base
        worst.append(row)
t = pd.DataFrame(out)
for (d, sh), g in t.groupby(["dtype", "shape"]):
    r = np.corrcoef(np.log(g.measured), np.log(g.modelled))[0, 1]
    print(f"{d} {sh}: {len(g)} rows (every mixing list, dynamic); measured order cost geomean "
          f"{geomean(g.measured):.3f} (max {g.measured.max():.3f}), modelled DRAM bytes / Expert-Wave's geomean "
          f"{geomean(g.modelled):.3f} (max {g.modelled.max():.3f}); correlation of logs {r:.2f}")
pd.set_option("display.width", 250)
print("\nmodelled DRAM bytes / row-block-major Expert-Wave's, T >= 2048, by tile swizzle G (0: row-block-major):")
print(pd.DataFrame(worst).round(2).to_string(index=False))
