"""Round 11's summaries (scripts/megamoe_round11.sh; CPU, from recorded folders; the rule's rows last: ~0.1-0.3 s
of walks per configuration):
  python3 scripts/megamoe_round11_summary.py LAGS_DIR [REPEAT_DIR [BEFORE_DIR]]
LAGS_DIR: study lags11 (moe_gemm.lags11_summary per dtype and lag variant, and Mixtral T512 hot's rows);
REPEAT_DIR: study gemm10 again (its variants over torch._scaled_grouped_mm and the row-block rule), beside
BEFORE_DIR's gemm10 (round 10's record): s_plus's time over the default's in each run, and on the configurations both
hold. A folder without its CSV is skipped."""
import os
import sys

import numpy as np

from xstage import data
from xstage import moe_gemm as MG

NAMES = ("default", "bm_alt", "s_plus")


def _load(d):
    return data.load(d, data.MEGAMOE_GEMM)[0] if d and os.path.exists(os.path.join(d, "megamoe_gemm.csv")) else None


def s_plus_over_default(df) -> "pd.Series":
    """Per configuration: s_plus's time / the default's (same rounds)."""
    g = MG.gemm8_ratios(df, "gemm10", NAMES).set_index("config")
    return g.s_plus_ms / g.default_ms


def main(argv) -> None:
    lags, rep, before = (argv[1:] + [None, None, None])[:3]
    df = _load(lags)
    if df is not None:                   # the timed lags first (fast); the rule's rows last (a walk per pair)
        rows = MG.lags11_rows(df, rule=False)
        print(MG.lags11_summary(rows).round(3).to_string())
        print(rows[rows.config == "mixtral_8x7b_T512_hot"].round(3).to_string(index=False), flush=True)
    r, b = _load(rep), _load(before)
    if r is not None:
        print(MG.gemm8_summary(MG.gemm8_ratios(r, "gemm10", NAMES), names=NAMES).round(3).to_string())
        print(MG.gemm10_rule_summary(MG.gemm10_rule(r)).round(3).to_string())
        now = s_plus_over_default(r)
        line = f"s_plus / default time: this run geomean {np.exp(np.log(now).mean()):.3f} over {len(now)}"
        if b is not None:
            old = s_plus_over_default(b)
            both = now.index.intersection(old.index)
            line += (f"; round 10 {np.exp(np.log(old).mean()):.3f} over {len(old)}; on the {len(both)} both hold: "
                     f"{np.exp(np.log(now[both]).mean()):.3f} / {np.exp(np.log(old[both]).mean()):.3f}, "
                     f"faster in both runs on {int(((now[both] < 1) & (old[both] < 1)).sum())}")
        print(line, flush=True)
    if df is not None:
        rule = MG.lags11_rows(df)
        print(MG.lags11_summary(rule[rule.variant == MG.LAGS11_RULE[0]]).round(3).to_string())


if __name__ == "__main__":
    main(sys.argv)
