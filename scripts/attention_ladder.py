"""The attention speed ladder on one GPU (issue 14, item 3): every variant checked, then timed beside cuDNN.

    OUT=... python3 scripts/attention_ladder.py [deadline_s] [repeats]
Records into $OUT/h200x1/attention_ladder/ (copy into data/h200x1/attention_ladder/). See xstage.ulysses_ladder.
"""
import os
import sys

from xstage.ulysses_ladder import run_attention_ladder

if __name__ == "__main__":
    deadline = float(sys.argv[1]) if len(sys.argv) > 1 else None
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    out = os.path.join(os.environ["OUT"], "h200x1", "attention_ladder")
    csv = run_attention_ladder(out, repeats=repeats, warmup=3, deadline_s=deadline,
                               command="python3 scripts/attention_ladder.py " + " ".join(sys.argv[1:]))
    print(f"ladder: wrote {csv}", file=sys.stderr)
