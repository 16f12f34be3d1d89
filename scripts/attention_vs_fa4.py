"""Our attention's variants beside FA4's CuTe Hopper forward and cuDNN SDPA, same rounds, on one GPU (issue 14,
round 3): every variant checked (float32, the fused layer bit for bit), every shape's methods checked against
float32 on sampled rows, then timed round-robin.

    [STUDY=gluon] OUT=... python3 scripts/attention_vs_fa4.py [deadline_s] [repeats] [launches]
Records into $OUT/$MACHINE/attention_vs_fa4/ (MACHINE defaults to h200x1; copy into data/h200x1/attention_vs_fa4/); with STUDY=gluon (issue 14,
round 4) the Gluon rungs beside the Triton base rung (xstage.ulysses_ladder.FA4_GLUON_VARIANTS) into
$OUT/h200x1/attention_vs_fa4_gluon/. Needs the extra fa4 for the
FA4 rows (scripts/attention_vs_fa4.sh installs the carried stack). See xstage.ulysses_ladder.run_attention_vs_fa4.
"""
import os
import sys

from xstage.ulysses_gluon import (LADDER, JOINT_RUNGS, NAMED_RUNGS, NEXT_RUNGS, PEEL_RUNGS, PERSISTENT_RUNGS,
                                   REVERSE_RUNGS, SWEEP_CONFIGS)
from xstage.ulysses import UlyssesShape
from xstage.ulysses_ladder import (FA4_GLUON_NEXT_VARIANTS, FA4_GLUON_VARIANTS, FA4_SHAPES, FA4_VARIANTS, LAUNCHES,
                                   run_attention_vs_fa4)

# gluon_next (session 8): the last-block mask beside C3's fastest Gluon rungs, then the ping-pong and 3-consumer
# rungs (xstage.ulysses_gluon.NEXT_RUNGS)
GLUON_NEXT = {D: tuple(cs) + NEXT_RUNGS.get(D, ()) for D, cs in FA4_GLUON_NEXT_VARIANTS.items()}
# gluon_best (session 8, call U4): the base rungs and the fastest rungs of the gluon_next record beside FA4
_BEST = {"128x128w8s3-tma-pers", "gluon-ws-128x128s2r232-ml", "gluon-ws-128x128s2r232-ml-pp", "128x128w4s3-tma",
         "gluon-ws-192x128s2r160-ml-pp", "gluon-ws-192x128s2r160-ml"}
# gluon_pe (session 9): the persistent ws grid beside the same rungs one CTA per tile, and beside FA4
_PE_BASE = {"128x128w8s3-tma-pers", "128x128w4s3-tma", "gluon-ws-128x128s2r232-ml", "gluon-ws-192x128s2r160-ml-pp"}
STUDIES = {"": ("attention_vs_fa4", FA4_VARIANTS), "gluon": ("attention_vs_fa4_gluon", FA4_GLUON_VARIANTS),
           "gluon_next": ("attention_vs_fa4_gluon_next", GLUON_NEXT),
           "gluon_best": ("attention_vs_fa4_gluon_best",
                          {D: tuple(c for c in cs if c.label in _BEST) for D, cs in GLUON_NEXT.items()}),
           "gluon_pe": ("attention_vs_fa4_gluon_pe",
                        {D: tuple(c for c in cs if c.label in _PE_BASE) + PERSISTENT_RUNGS[D]
                         for D, cs in GLUON_NEXT.items()}),
           # gluon_lp (session 10): the last key block peeled (-lp) beside the same rungs with the in-loop branch
           # (-ml), one CTA per tile and persistent; 8192 x 24 timed again after every other shape (the first
           # shape's same-round ratio moved by 3 % between blocks in call U4)
           "gluon_lp": ("attention_vs_fa4_gluon_lp",
                        {D: tuple(c for c in cs if c.label in _PE_BASE) + PERSISTENT_RUNGS[D][:1] + PEEL_RUNGS[D]
                         for D, cs in GLUON_NEXT.items()})}
# gluon_shape (session 15): where the 8K x 24 and Wan gaps come from, without FA4 (ours beside cuDNN): the same
# ws rung one CTA per tile and persistent on shapes that separate the key blocks per tile (S) from the tile count
# (S / 128 x H: 8192 x 24 and 16384 x 12 both 1536 tiles, 8192 x 48 and 16384 x 24 both 3072) and, for Wan
# (32760 x 6), the mask (S % 128 != 0) from the head count (32768 x 6, 32640 x 6 = 255 x 128, 32768 x 12)
STUDIES["gluon_shape"] = ("attention_gluon_shape",
                          {128: tuple(c for c in GLUON_NEXT[128] if c.label == "gluon-ws-128x128s2r232-ml")
                           + PERSISTENT_RUNGS[128][:1]})
# gluon_nb (session 25): the ping-pong's turns in named barriers (-nb, FA4's warp-scheduler barriers) beside the same
# turns in mbarriers (-pp), the fastest rungs without turns (ws -ml one CTA per tile and persistent; D = 64: 192 rows
# -pp one CTA per tile and persistent) and the Triton base rungs; 8192 x 24 again last, as in gluon_lp
_NB_BASE = _PE_BASE | {"gluon-ws-128x128s2r232-ml-pp"}
STUDIES["gluon_nb"] = ("attention_vs_fa4_gluon_nb",
                       {D: tuple(c for c in cs if c.label in _NB_BASE) + PERSISTENT_RUNGS[D][:1] + NAMED_RUNGS[D]
                        for D, cs in GLUON_NEXT.items()})
# gluon_rv (session 25): the key blocks last to first (-rv, FA4's order: the masked block first, outside the loop)
# beside the same rungs in order (call N2's fastest: ws -ml, -ml-pe; D = 64: 192 -ml-pp and -ml-pp-nb)
_RV_BASE = {"128x128w8s3-tma-pers", "128x128w4s3-tma", "gluon-ws-128x128s2r232-ml", "gluon-ws-192x128s2r160-ml-pp"}
STUDIES["gluon_rv"] = ("attention_vs_fa4_gluon_rv",
                       {D: tuple(c for c in cs if c.label in _RV_BASE) + PERSISTENT_RUNGS[D][:1] * (D == 128)
                        + NAMED_RUNGS[D][:1] * (D == 64) + REVERSE_RUNGS[D] for D, cs in GLUON_NEXT.items()})
# gluon_jr (session 25): one release per ring slot (-jr, three slots) beside the same rung releasing K and V apart
# (three slots) and the sweep's tiles (two slots: ws -ml-rv; D = 64: 192 -ml-pp-nb-rv)
STUDIES["gluon_jr"] = ("attention_vs_fa4_gluon_jr", {D: (SWEEP_CONFIGS[D],) + JOINT_RUNGS[D] for D in (128, 64)})
SHAPES = {"gluon_lp": tuple(FA4_SHAPES) + (UlyssesShape("s8192_h24_again", 8_192, 24, 128),),
          "gluon_shape": (UlyssesShape("s8192_h24", 8_192, 24, 128), UlyssesShape("s8192_h48", 8_192, 48, 128),
                          UlyssesShape("s16384_h12", 16_384, 12, 128), UlyssesShape("s16384_h24", 16_384, 24, 128),
                          UlyssesShape("s32768_h6", 32_768, 6, 128), UlyssesShape("s32760_h6", 32_760, 6, 128),
                          UlyssesShape("s32640_h6", 32_640, 6, 128), UlyssesShape("s32768_h12", 32_768, 12, 128),
                          UlyssesShape("s8192_h24_again", 8_192, 24, 128))}
# gluon_final (session 26): the goal judged in one record, the best rungs of both head dims side by side
# (ulysses_gluon.LADDER), run with REPEATS=30 (scripts/attention_vs_fa4.sh)
STUDIES["gluon_final"] = ("attention_vs_fa4_gluon_final", LADDER)
SHAPES["gluon_nb"] = SHAPES["gluon_rv"] = SHAPES["gluon_jr"] = SHAPES["gluon_final"] = SHAPES["gluon_lp"]
# gluon_8k (session 27): the one shape the goal missed in call N8 (8192 x 24, 0.943 by the fastest rung), four blocks a
# rung: the sweep's tile (ws -ml-rv) beside the persistent rungs that led the same-round ratio there in the gluon_nb
# and gluon_rv records (-ml-pe, -pp-nb-pe, -pe-rv): chosen on those records, judged on this one (REPEATS=30)
STUDIES["gluon_8k"] = ("attention_vs_fa4_gluon_8k",
                       {128: (SWEEP_CONFIGS[128], PERSISTENT_RUNGS[128][0], NAMED_RUNGS[128][1], REVERSE_RUNGS[128][1])})
# gluon_final2 (session 27): gluon_final again on another train (a second record of the same rungs and shapes)
STUDIES["gluon_final2"] = ("attention_vs_fa4_gluon_final2", LADDER)
SHAPES["gluon_final2"] = SHAPES["gluon_final"]
# gluon_final3 / gluon_final_q (session 27, one call, one card): gluon_final again as recorded so far, then with each
# sample queued behind a GPU-side wait (LEAD: the host's launch work outside every sample; bench.time_ms)
STUDIES["gluon_final3"] = ("attention_vs_fa4_gluon_final3", LADDER)
STUDIES["gluon_final_q"] = ("attention_vs_fa4_gluon_final_q", LADDER)
SHAPES["gluon_final3"] = SHAPES["gluon_final_q"] = SHAPES["gluon_final"]
LEAD = {"gluon_final_q"}
SHAPES["gluon_8k"] = tuple(UlyssesShape(f"s8192_h24{tag}", 8_192, 24, 128) for tag in ("", "_again", "_b3", "_b4"))

if __name__ == "__main__":
    deadline = float(sys.argv[1]) if len(sys.argv) > 1 else None
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    launches = int(sys.argv[3]) if len(sys.argv) > 3 else LAUNCHES
    study = os.environ.get("STUDY", "")
    if study not in STUDIES:
        sys.exit(f"STUDY must be one of {sorted(STUDIES)} (empty: round 3's levers), got {study!r}")
    record, variants = STUDIES[study]
    skip = {v for v in os.environ.get("SKIP_VARIANTS", "").split(",") if v}    # labels left out (a failed first look)
    variants = {D: tuple(c for c in cs if c.label not in skip) for D, cs in variants.items()}
    # the machine's folder: h200x1 unless MACHINE names another (session 25: an H100 is lent as well)
    out = os.path.join(os.environ["OUT"], os.environ.get("MACHINE", "h200x1"), record)
    prefix = (f"STUDY={study} " if study else "") + (f"SKIP_VARIANTS={','.join(sorted(skip))} " if skip else "")
    csv = run_attention_vs_fa4(out, variants=variants, shapes=SHAPES.get(study), repeats=repeats, warmup=3,
                               launches=launches, deadline_s=deadline, lead=study in LEAD,
                               command=prefix + "python3 scripts/attention_vs_fa4.py " + " ".join(sys.argv[1:]))
    print(f"attention_vs_fa4: wrote {csv}", file=sys.stderr)
