"""The combine's store pattern on the host link (xstage.scatter_store; issue 15, item 4, session 8): row segments
of the combine's size at scattered rows beside contiguous stores, into pinned host memory and (control) device
memory, each checked bit for bit first; rows in schema ``bandwidth`` with provenance.
  python3 scripts/megamoe_scatter_store.py --out $OUT/h200x1/megamoe_round6_scatter [--targets host,local]
  python3 scripts/megamoe_scatter_store.py --out $OUT/h200x1/megamoe_round6_beside --beside [--targets host]
"""
import argparse
import shlex
import sys

from xstage import data, env
from xstage import scatter_store as SS


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--targets", default="host,local")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--beside", action="store_true", help="only the stores beside background work (measure_beside)")
    a = ap.parse_args(argv)
    cmd = "python3 scripts/megamoe_scatter_store.py " + " ".join(shlex.quote(x) for x in (argv or sys.argv[1:]))
    params = dict(targets=a.targets.split(","), reps=a.reps, programs=132, num_warps=SS.NUM_WARPS,
                  segment_bytes=list(SS.SEGMENT_BYTES), block_m=list(SS.BLOCK_M), pitch_bytes=list(SS.PITCH_BYTES),
                  footprint_bytes=list(SS.FOOTPRINT_BYTES), patterns=list(SS.PATTERNS), tile_swizzle=SS.TILE_SWIZZLE,
                  method_names="sm_store: xstage.remote_store.launch_stream (16 B, one burst per program); "
                               "row_<pattern>_p<pitch bytes>: kernels/scatter_store.py (rows = BM, store_bytes = "
                               "segment bytes, bytes = bytes one launch writes)")
    if a.beside:
        params.update(beside=list(SS.BESIDE), beside_calls=SS.BESIDE_CALLS,
                      beside_work="copy: 1 GiB device-to-device copy_ on a second stream, "
                                  "queued before each timed store launch")
    env.apply_safe_env()
    csv = data.start_file(a.out, data.BANDWIDTH, env.provenance(cmd, params))
    for t in a.targets.split(","):
        df = SS.measure_beside(t, reps=a.reps) if a.beside else SS.measure(t, reps=a.reps)
        data.append_rows(csv, data.BANDWIDTH, df)
        s = SS.summary_beside(df) if a.beside else SS.summary(df)
        print(s.to_string(index=False, float_format=lambda v: f"{v:.3f}"), flush=True)


if __name__ == "__main__":
    main()
