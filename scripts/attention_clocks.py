"""Sustained clocks of our attention beside FA4 and cuDNN on one GPU (xstage.attention_clocks).

    OUT=... [MACHINE=h100x1] python3 scripts/attention_clocks.py [seconds] [windows]
Records into $OUT/$MACHINE/attention_clocks/ (MACHINE defaults to h200x1; copy into data/<machine>/). Needs the extra
fa4 for FA4's windows (scripts/attention_vs_fa4.sh installs the carried stack; stage ``clocks:<s>``).
"""
import os
import sys

from xstage.attention_clocks import run_attention_clocks

if __name__ == "__main__":
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    windows = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    out = os.path.join(os.environ["OUT"], os.environ.get("MACHINE", "h200x1"), "attention_clocks")
    csv = run_attention_clocks(out, seconds=seconds, windows=windows,
                               command="python3 scripts/attention_clocks.py " + " ".join(sys.argv[1:]))
    print(f"attention_clocks: wrote {csv}", file=sys.stderr)
