"""What costs model_guided's half-round lag (issue 15, point 3; CPU only, round 5): Linear-2 waits under dynamic
claims, an event model beside the cost model's wait term, against study lists' measured rows.

For every row of study ``lists`` (data/h200x1/megamoe_round5/: dynamic assignment, compute only, each list's
measured time over Expert-Wave's and the share of its Linear-2 tiles whose dependency wait polled), the list is
rebuilt from its param (xstage.moe_plan.schedule_of_param, rank 0's seeded routing) and walked twice:
- ``event`` (xstage.moe_plan.claim_walk): programs claim tasks in list order when they become free (as the
  kernel's atomic ticket); a Linear-1 tile takes t1, a Linear-2 tile starts when claimed, spins until its row
  block's last Linear-1 tile has ended, then takes t2 (t1, t2: the measured median tile times of the configuration's Expert-Wave row, same launch
  kind); the makespan and the share of Linear-2 tiles that spun;
- ``cost model``: moe_plan.predict_kernel_ns without remote bytes (its wait term: a consumer d < n list positions
  behind its producer spins c1 (1 - d / n)), as model_guided uses it.
A model, computed; nothing measured is changed.   Run: .venv/bin/python scripts/megamoe_wait_model.py
"""
import numpy as np
import pandas as pd

from xstage import data, studies
from xstage.model import BurstGapParams
from xstage.moe_plan import (CASES, CostModel, TileGrid, claim_walk, predict_kernel_ns, routing_of,
                             schedule_of_param, tiles_of_row)
from xstage.numeric import geomean

N_SMS = 132


df, _ = data.load("data/h200x1/megamoe_round5", data.MEGAMOE_GEMM)
per = studies.megamoe_round5_lists(df)
rows = df[df.study == "lists"].assign(config=lambda x: x["shape"] + "_T" + x.tokens.astype(str) + "_" + x.routing)
cases = {c.name: c for c in CASES}
out = []
for (cfg, dtype), g in rows.groupby(["config", "dtype"], sort=False):
    c = cases[cfg]
    s = c.shape
    tiles = tiles_of_row(g.iloc[0])
    grid = TileGrid.of(routing_of(c, 2)[2][0], s.hidden, s.intermediate, tiles)
    ew = g[g.variant == "expert_wave"].iloc[0]
    t1, t2 = float(ew.task_l1_us), float(ew.task_l2_us)
    unit = CostModel(BurstGapParams.reference(), 1.0, N_SMS, assignment="dynamic")
    none = np.zeros(max(grid.n_pool, 1), dtype=np.int64)
    base = None
    for x in g.itertuples():
        tl_ = schedule_of_param("expert_wave" if x.variant == "expert_wave" else x.schedule,
                                "" if x.note == "-" else x.note, grid, N_SMS)
        span, w = claim_walk(tl_.tasks, t1, t2, N_SMS)
        m = predict_kernel_ns(tl_, none, unit, s.hidden, s.intermediate, tiles)
        if x.variant == "expert_wave":
            base = (span, m["total_ns"])
        out.append(dict(config=cfg, dtype=dtype, variant=x.variant, param=x.note, measured=x.ms,
                        waited=x.task_waited, event_span=span, event_waited=w, model_ns=m["total_ns"],
                        model_wait_share=m["wait_ns"] / m["total_ns"]))
t = pd.DataFrame(out)
for (cfg, dt), g in t.groupby(["config", "dtype"], sort=False):
    e = g[g.variant == "expert_wave"].iloc[0]
    t.loc[g.index, "measured_over_ew"] = g.measured / e.measured
    t.loc[g.index, "event_over_ew"] = g.event_span / e.event_span
    t.loc[g.index, "model_over_ew"] = g.model_ns / e.model_ns
pd.set_option("display.width", 250)
half = t.param.str.startswith("lag=66")
print("lists with lag = 66 (half a round; model_guided's choice where it lost most):")
print(t[half][["config", "dtype", "variant", "param", "measured_over_ew", "waited", "event_over_ew", "event_waited",
               "model_over_ew", "model_wait_share"]].round(3).to_string(index=False))
for name, m in (("lag = 66", half), ("every other list", ~half)):
    x = t[m & (t.variant != "expert_wave")]
    print(f"{name}: {len(x)} rows; measured over Expert-Wave geomean {geomean(x.measured_over_ew):.3f}, share of "
          f"Linear-2 tiles that waited (median) measured {x.waited.median():.3f}, event model "
          f"{x.event_waited.median():.3f}; over Expert-Wave event model {geomean(x.event_over_ew):.3f}, cost model "
          f"{geomean(x.model_over_ew):.3f}; correlation of logs measured vs event "
          f"{np.corrcoef(np.log(x.measured_over_ew), np.log(x.event_over_ew))[0, 1]:.2f}")
