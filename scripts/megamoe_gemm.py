"""MegaMoE's GEMM ladder / order-cost study on one GPU (xstage.moe_gemm), or (--warm) compile its kernels only.

  python3 scripts/megamoe_gemm.py --study ladder --out $OUT/h200x1/megamoe_gemm [--max-minutes 1.5]
  python3 scripts/megamoe_gemm.py --study order  --out $OUT/h200x1/megamoe_gemm [--max-minutes 1]
  python3 scripts/megamoe_gemm.py --study gemm     --out $OUT/h200x1/megamoe_round3 [--max-minutes 3]
  python3 scripts/megamoe_gemm.py --study controls --out $OUT/h200x1/megamoe_round3 [--max-minutes 2]
  python3 scripts/megamoe_gemm.py --warm [--part I --parts N]   (Triton's cache: no kernel launched)
  python3 scripts/megamoe_gemm.py --warm --defaults [--dtypes fp8]   (only the default tiles: the sweep, the tests)
"""
import argparse
import shlex
import sys

from xstage import moe_gemm


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--study", choices=moe_gemm.STUDIES, default="ladder")
    ap.add_argument("--out", help="folder of megamoe_gemm.csv / .json")
    ap.add_argument("--max-minutes", type=float, default=None)
    ap.add_argument("--cases", default=None, help="default: GEMM_CASES (ladder, order), all 84 (gemm, controls)")
    ap.add_argument("--dtypes", default="bf16,fp8")
    ap.add_argument("--warm", action="store_true")
    ap.add_argument("--part", type=int, default=0)
    ap.add_argument("--parts", type=int, default=1)
    ap.add_argument("--defaults", action="store_true", help="--warm: only the default tiles (sweep, GPU tests)")
    a = ap.parse_args(argv)
    if a.warm:
        n = moe_gemm.warm(a.dtypes.split(","), a.part, a.parts, defaults_only=a.defaults)
        print(f"warmed {n} kernel variants", file=sys.stderr)
        return
    if not a.out:
        ap.error("--out is required")
    cmd = "python3 scripts/megamoe_gemm.py " + " ".join(shlex.quote(x) for x in (argv or sys.argv[1:]))
    print(moe_gemm.run_megamoe_gemm(a.out, a.study, a.cases.split(",") if a.cases else None,
                                   a.dtypes.split(","), a.max_minutes, cmd))


if __name__ == "__main__":
    main()
