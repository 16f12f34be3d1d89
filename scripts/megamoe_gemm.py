"""MegaMoE's compute-only studies on one GPU (xstage.moe_gemm), or (--warm) compile their kernels only.

  python3 scripts/megamoe_gemm.py --study library  --out $OUT/h200x1/megamoe_gemm_bf16 --dtypes bf16 [--max-minutes 3]
  python3 scripts/megamoe_gemm.py --study library  --out $OUT/h200x1/megamoe_gemm_fp8 --dtypes fp8 [--max-minutes 3]
  python3 scripts/megamoe_gemm.py --study controls --out $OUT/h200x1/megamoe_controls [--max-minutes 2]
  python3 scripts/megamoe_gemm.py --warm [--part I --parts N] [--dtypes fp8]   (Triton's cache: no kernel launched)
"""
import argparse
import shlex
import sys

from xstage import moe_gemm


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--study", choices=moe_gemm.STUDIES, default="library")
    ap.add_argument("--out", help="folder of megamoe_gemm.csv / .json")
    ap.add_argument("--max-minutes", type=float, default=None)
    ap.add_argument("--cases", default=None, help="default: all 84 configurations in table order")
    ap.add_argument("--dtypes", default="bf16,fp8")
    ap.add_argument("--warm", action="store_true")
    ap.add_argument("--part", type=int, default=0)
    ap.add_argument("--parts", type=int, default=1)
    a = ap.parse_args(argv)
    if a.warm:
        n = moe_gemm.warm(a.dtypes.split(","), a.part, a.parts)
        print(f"warmed {n} kernel variants", file=sys.stderr)
        return
    if not a.out:
        ap.error("--out is required")
    cmd = "python3 scripts/megamoe_gemm.py " + " ".join(shlex.quote(x) for x in (argv or sys.argv[1:]))
    print(moe_gemm.run_megamoe_gemm(a.out, a.study, a.cases.split(",") if a.cases else None,
                                   a.dtypes.split(","), a.max_minutes, cmd))


if __name__ == "__main__":
    main()
