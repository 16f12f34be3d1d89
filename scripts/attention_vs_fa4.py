"""Our Gluon attention's ladder beside FA4's CuTe Hopper forward and cuDNN SDPA on one GPU, timed round-robin in the
same rounds: every variant checked (float32, the fused layer bit for bit), every shape's methods checked against
float32 on sampled rows, then timed; each sample queued behind a GPU-side wait (``bench.time_ms(lead=True)``: the
host's launch work outside every sample).

    OUT=... [MACHINE=h100x1] python3 scripts/attention_vs_fa4.py [deadline_s] [repeats] [launches]

Records into $OUT/$MACHINE/attention_vs_fa4/ (MACHINE defaults to h200x1; the current records are
data/h100x1/attention_vs_fa4 and data/h200x1/attention_vs_fa4). The variants: ``xstage.ulysses_gluon.LADDER``;
the shapes: ``xstage.ulysses_ladder.FA4_SHAPES`` and 8192 x 24 timed again last (the first shape's same-round ratio
moves between blocks). Needs the extra fa4 for the FA4 rows (scripts/attention_vs_fa4.sh installs the carried
stack). See xstage.ulysses_ladder.run_attention_vs_fa4.
"""
import os
import sys

from xstage.ulysses import UlyssesShape
from xstage.ulysses_gluon import LADDER
from xstage.ulysses_ladder import FA4_SHAPES, LAUNCHES, run_attention_vs_fa4

RECORD = "attention_vs_fa4"
SHAPES = tuple(FA4_SHAPES) + (UlyssesShape("s8192_h24_again", 8_192, 24, 128),)

if __name__ == "__main__":
    deadline = float(sys.argv[1]) if len(sys.argv) > 1 else None
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    launches = int(sys.argv[3]) if len(sys.argv) > 3 else LAUNCHES
    skip = {v for v in os.environ.get("SKIP_VARIANTS", "").split(",") if v}    # labels left out (a failed first look)
    variants = {D: tuple(c for c in cs if c.label not in skip) for D, cs in LADDER.items()}
    out = os.path.join(os.environ["OUT"], os.environ.get("MACHINE", "h200x1"), RECORD)
    prefix = f"SKIP_VARIANTS={','.join(sorted(skip))} " if skip else ""
    csv = run_attention_vs_fa4(out, variants=variants, shapes=SHAPES, repeats=repeats, warmup=3,
                               launches=launches, deadline_s=deadline, lead=True,
                               command=prefix + "python3 scripts/attention_vs_fa4.py " + " ".join(sys.argv[1:]))
    print(f"attention_vs_fa4: wrote {csv}", file=sys.stderr)
