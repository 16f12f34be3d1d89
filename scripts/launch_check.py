"""Compare burst-gap records of one grid run under different launchers (scripts/launch_check.sh).

  python scripts/launch_check.py PLAIN PLAIN_AGAIN LAUNCHED [RESUMED] [--csv OUT.csv]

PLAIN and PLAIN_AGAIN: the plain command twice (xstage's own ranks), whose difference is the run-to-run spread;
LAUNCHED: the same command under torchrun; RESUMED (optional): a record started under one launcher and finished
under another. Per configuration: the median over repeats of each repeat's median grid span per burst (span_ns,
rank 0); LAUNCHED is "within" where its median lies inside the range of PLAIN's and PLAIN_AGAIN's repeats. The
records must hold the same configurations, ranks, repeats and bursts (else exit 1); the timing verdict is
reported, not enforced (timings are measurements).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from xstage import data

KEY = list(data.BURST_GAP.key)


def per_repeat(folder: Path) -> pd.DataFrame:
    """One row per (configuration, rank, repeat): the median span per burst of that train (ns)."""
    df = data.read_rows(folder / "burst_gap.csv", data.BURST_GAP)
    return df.groupby(KEY + ["rank", "repeat"], as_index=False)["span_ns"].median()


def layout(folder: Path) -> pd.DataFrame:
    """What a record holds besides its timings: every row's key, rank, repeat and burst, sorted."""
    df = data.read_rows(folder / "burst_gap.csv", data.BURST_GAP)
    return df[KEY + ["rank", "repeat", "burst"]].sort_values(KEY + ["rank", "repeat", "burst"]).reset_index(drop=True)


def compare(plain: Path, again: Path, launched: Path) -> pd.DataFrame:
    """Per configuration (rank 0): the plain, plain-again and launched medians, the plain repeats' range, and
    whether the launched median lies inside it."""
    runs = {name: per_repeat(f) for name, f in (("plain", plain), ("again", again), ("launched", launched))}
    runs = {k: v[v["rank"] == 0] for k, v in runs.items()}
    med = {k: v.groupby(KEY)["span_ns"].median().rename(f"{k}_ns") for k, v in runs.items()}
    both = pd.concat([runs["plain"], runs["again"]]).groupby(KEY)["span_ns"]
    out = pd.concat([med["plain"], med["again"], med["launched"], both.min().rename("plain_min_ns"),
                     both.max().rename("plain_max_ns")], axis=1).reset_index()
    out["within"] = (out.launched_ns >= out.plain_min_ns) & (out.launched_ns <= out.plain_max_ns)
    out["launched_vs_plain"] = out.launched_ns / out.plain_ns
    out["again_vs_plain"] = out.again_ns / out.plain_ns
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="launch_check", description=__doc__.split("\n")[0])
    ap.add_argument("plain", type=Path)
    ap.add_argument("again", type=Path)
    ap.add_argument("launched", type=Path)
    ap.add_argument("resumed", type=Path, nargs="?")
    ap.add_argument("--csv", type=Path, default=None, help="write the per-configuration table here")
    a = ap.parse_args(argv)
    want = layout(a.plain)
    same = {name: layout(f).equals(want) for name, f in (("plain again", a.again), ("launched", a.launched),
                                                        ("resumed", a.resumed)) if f is not None}
    for name, ok in same.items():
        print(f"{name}: {'the same' if ok else 'NOT the same'} configurations, ranks, repeats and bursts as plain "
              f"({len(want)} rows)")
    table = compare(a.plain, a.again, a.launched)
    if a.csv:
        table.to_csv(a.csv, index=False)
    with pd.option_context("display.width", 200, "display.max_rows", 200):
        print(table.drop(columns=["store_bytes", "n_bursts", "drain", "sync"]).round(3).to_string(index=False))
    gm = lambda x: float(np.exp(np.log(x).mean()))  # noqa: E731
    print(f"launched within the plain runs' repeat range: {int(table.within.sum())} of {len(table)} configurations; "
          f"geomean launched/plain {gm(table.launched_vs_plain):.3f}, "
          f"plain again/plain {gm(table.again_vs_plain):.3f}; "
          f"median |launched/plain - 1| {float((table.launched_vs_plain - 1).abs().median()):.3f}, "
          f"|again/plain - 1| {float((table.again_vs_plain - 1).abs().median()):.3f}")
    return 0 if all(same.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
