"""Study lists6 (xstage.moe_round6): model_guided under the positional and the time wait model, compute only.
  python3 scripts/megamoe_lists6.py --out $OUT/h200x1/megamoe_round6_lists --cases a,b,... [--dtypes bf16,fp8]
      [--max-minutes M]
"""
import argparse
import shlex
import sys

from xstage import moe_round6


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", required=True, help="comma-separated configuration names, or @FILE (one a line)")
    ap.add_argument("--dtypes", default="bf16,fp8")
    ap.add_argument("--max-minutes", type=float, default=None)
    a = ap.parse_args(argv)
    cases = open(a.cases[1:]).read().split() if a.cases.startswith("@") else a.cases.split(",")
    cmd = "python3 scripts/megamoe_lists6.py " + " ".join(shlex.quote(x) for x in (argv or sys.argv[1:]))
    print(moe_round6.run(a.out, cases, a.dtypes.split(","), a.max_minutes, cmd))


if __name__ == "__main__":
    main()
