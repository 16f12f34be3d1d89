"""Where the warp-specialised Gluon kernel's per-tile cost comes from (session 9, after call U4): our ws -ml rung
(one CTA per tile) and its persistent grid (-pe) beside cuDNN SDPA, round-robin in the same rounds, on pairs of
shapes that hold either the key blocks per tile (S / 128) or the number of tiles (S / 128 x H) fixed. If the cost is
per tile (a + b n per tile of n key blocks), TFLOP/s follows S alone; if it follows the heads in flight (L2), H.
A diagnostic for the lab notebook, not a figure's record (FA4 is not installed in this call). Prints; writes
$OUT/h200x1/attention_gluon_tiles.json with provenance when OUT is set.

    python3 scripts/attention_gluon_tiles.py [repeats]
"""
import json
import os
import random
import sys

import torch

from xstage import bench, env
from xstage.ulysses import attention_flops, sdpa_cudnn
from xstage.ulysses_gluon import GluonConfig, available
from xstage.ulysses_gluon import attention_forward as gluon_forward

SHAPES = [(4096, 48), (8192, 24), (8192, 48), (16384, 12), (16384, 24), (32768, 12), (32768, 6), (65536, 6)]
CONFIGS = (GluonConfig(128, 128, 4, 2, ws=True, mask_last=True),
           GluonConfig(128, 128, 4, 2, ws=True, mask_last=True, persistent=True))


def main() -> int:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    ok, why = available()
    print("gluon available:", ok, why, flush=True)
    if not ok:
        return 2
    seed = random.randrange(2**30)
    g = torch.Generator(device="cuda").manual_seed(seed)
    rows = []
    D = 128
    for S, H in SHAPES:
        q, k, v = (torch.randn(S, H, D, generator=g, device="cuda").bfloat16() for _ in range(3))
        fns = {c.label: (lambda c: lambda: [gluon_forward(q, k, v, config=c) for _ in range(2)])(c) for c in CONFIGS}
        fns["cudnn"] = lambda: [sdpa_cudnn(q, k, v) for _ in range(2)]     # as the ladder times it
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            ms = bench.round_robin_ms(fns, repeats, warmup=3)
        fl = attention_flops(S, H, D)
        for m, t in ms.items():
            med = sorted(t)[len(t) // 2] / 2
            row = dict(method=m, S=S, H=H, D=D, blocks_per_tile=S // 128, tiles=S // 128 * H, ms=med,
                       tflops=fl / med / 1e9)
            print("timed", row, flush=True)
            rows.append(row)
    if os.environ.get("OUT"):
        os.makedirs(os.path.join(os.environ["OUT"], "h200x1"), exist_ok=True)
        with open(os.path.join(os.environ["OUT"], "h200x1", "attention_gluon_tiles.json"), "w") as f:
            json.dump(dict(rows=rows, seed=seed, repeats=repeats,
                           provenance=env.provenance("python3 scripts/attention_gluon_tiles.py", {})), f, indent=1,
                      default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
