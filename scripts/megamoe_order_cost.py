"""What costs the interleaved order compute? (issue 15, point 3; CPU only, from the recorded one-GPU host record)

Rank 0's measured compute-only order cost (its interleaved kernel with every combine store local / Expert-Wave's,
``compute_sched_ms``, data/h200x1/megamoe_host/) against the cost model's compute-only prediction for the same
task lists (xstage.moe_plan.predict_kernel_ns with no remote rows: the busiest program's compute + waits), with
static assignment (how the record ran) and with dynamic assignment (what balancing alone would leave). A model,
computed; nothing measured is changed.   Run: .venv/bin/python scripts/megamoe_order_cost.py
"""
import numpy as np
import pandas as pd

from xstage import studies
from xstage.model import BurstGapParams
from xstage.moe_plan import (CASES, OUT_DTYPES, CostModel, TileGrid, build_schedule, calibrate_rate,
                             predict_kernel_ns, routing_of, schedule_of_param, tiles_of_row)
from xstage.numeric import geomean

d, m = studies.megamoe_world_data("one-gpu", "host")
n_sms = int(m.get("sm_count") or 132)
cases = {(c.shape.name, c.tokens, c.routing): c for c in CASES}
out = []
for (name, T, routing, P, dtype), g in d.groupby(["shape", "tokens", "routing", "P", "dtype"], sort=False):
    c = cases[(name, T, routing)]
    s = c.shape
    rows = g.set_index("schedule")
    tiles = tiles_of_row(rows.iloc[0])                     # the tiles the record ran with (version 1)
    lay = routing_of(c, int(P))[2][0]                      # rank 0: the observed rank
    grid = TileGrid.of(lay, s.hidden, s.intermediate, tiles)
    ew = build_schedule("expert_wave", grid, n_sms)
    il = schedule_of_param("interleaved", rows.schedule_param["interleaved"], grid, n_sms)   # its recorded order
    rate = calibrate_rate(ew, s.hidden, s.intermediate, tiles, n_sms, float(rows.compute_sched_ms["expert_wave"]))
    zero = np.zeros(grid.n_pool)
    res = {}
    for a in ("static", "dynamic"):
        cost = CostModel(BurstGapParams.reference(), rate, n_sms, OUT_DTYPES[dtype].itemsize, a)
        for key, tl in (("ew", ew), ("il", il)):
            p = predict_kernel_ns(tl, zero, cost, s.hidden, s.intermediate, tiles)
            res[(a, key)] = (p["compute_ns"] + p["wait_ns"], p["wait_ns"], p["imbalance"])
    out.append(dict(config=f"{name}_T{T}_{routing}", shape=name, dtype=dtype,
                    measured=rows.compute_sched_ms["interleaved"] / rows.compute_sched_ms["expert_wave"],
                    static_model=res[("static", "il")][0] / res[("static", "ew")][0],
                    dynamic_model=res[("dynamic", "il")][0] / res[("dynamic", "ew")][0],
                    wait_share=res[("static", "il")][1] / res[("static", "il")][0],
                    imb_il=res[("static", "il")][2], imb_ew=res[("static", "ew")][2]))
t = pd.DataFrame(out)
for dt, g in t.groupby("dtype"):
    r = np.corrcoef(np.log(g.measured), np.log(g.static_model))[0, 1]
    resid = g.measured / g.static_model
    print(f"{dt}: {len(g)} configurations; measured interleaved / Expert-Wave compute-only: geomean "
          f"{geomean(g.measured):.3f}, worst {g.measured.max():.3f}; static model (busiest program) "
          f"{geomean(g.static_model):.3f} (correlation of logs {r:.2f}); measured / static model geomean "
          f"{geomean(resid):.3f} ({resid.min():.3f}-{resid.max():.3f}); waits in the static interleaved busiest "
          f"program {g.wait_share.median():.1%} (median); load imbalance (busiest / mean) interleaved "
          f"{geomean(g.imb_il):.3f} vs Expert-Wave {geomean(g.imb_ew):.3f}; dynamic-assignment model "
          f"{geomean(g.dynamic_model):.3f}")
    print(g.groupby("shape", sort=False)[["measured", "static_model", "dynamic_model", "imb_il", "imb_ew"]]
          .agg(geomean).round(3).to_string())
