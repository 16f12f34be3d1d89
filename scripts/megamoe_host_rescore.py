"""The host-link MegaMoE record re-scored by the cost model (xstage.moe_round6.host_rescore; CPU, ~2.5 min):
the share of configurations whose predicted speedup over Expert-Wave lies within +-10 % of the measured one, per
dtype and schedule, with the record's stage parameters, optionally the drain rate replaced by the combine's
measured rate (data/h200x1/megamoe_round6_scatter) and a wait model.
  .venv/bin/python scripts/megamoe_host_rescore.py [DRAIN_GBPS|none] [positions|time|none] [OUT_PREFIX]
"""
import sys

from xstage import data
from xstage import moe_round6 as R6

df, meta = data.load("data/h200x1/megamoe_host_v2", data.MEGAMOE)
a = sys.argv[1:] + ["none"] * (2 - len(sys.argv[1:]))
drain = None if a[0] == "none" else float(a[0])
wait = None if a[1] == "none" else a[1]
per, summary = R6.host_rescore(df, meta, drain, wait)
if len(a) > 2:
    per.to_csv(a[2] + ".csv", index=False)
    summary.to_csv(a[2] + "_summary.csv", index=False)
print(summary.to_string(index=False))
