"""First contact of the Gluon attention (kernels/attention_gluon.py) with a Hopper GPU, smallest pieces first: compile
and check against a float32 reference (fresh random inputs; the lse too) on small shapes of both head dims, masked
and unmasked key tails; then, only if every check passed, a short side-by-side timing with our Triton base rung
(round-robin, medians) on two shapes. Prints; writes $OUT/h200x1/attention_gluon_check.json when OUT is set
(a first look, not a record: the record is scripts/attention_vs_fa4.sh's study with the gluon methods).

    python3 scripts/attention_gluon_check.py [repeats]
"""
import json
import os
import random
import sys
import time

import torch

from xstage import bench, env
from xstage.numeric import rel_l2
from xstage.ulysses import AttnConfig, attention_flops, attention_forward
from xstage.ulysses_gluon import CONFIGS, NEXT_RUNGS, GluonConfig, available
from xstage.ulysses_gluon import attention_forward as gluon_forward
from xstage.ulysses_ladder import attention_reference

CHECKS = [(128, 100, 1), (128, 256, 2), (128, 3000, 3), (128, 4096, 2), (64, 100, 1), (64, 256, 2), (64, 3000, 3),
          (64, 4100, 2)]
TIMED = [(8192, 24, 128), (30000, 20, 64)]
BASE = {128: AttnConfig(128, 128, 8, 3, True, persistent=True), 64: AttnConfig(128, 128, 4, 3, True)}
EXTRA = {128: (GluonConfig(128, 128, 4, 2, ws=True), GluonConfig(128, 128, 4, 2, ws=True, mask_last=True),
               GluonConfig(64, 64, 4, 3)) + NEXT_RUNGS[128],
         64: (GluonConfig(128, 128, 4, 3, ws=True), GluonConfig(128, 128, 4, 3, ws=True, mask_last=True),
              GluonConfig(64, 128, 4, 3), GluonConfig(64, 128, 4, 3, mask_last=True)) + NEXT_RUNGS[64]}


def main() -> int:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    ok, why = available()
    print("gluon available:", ok, why, flush=True)
    if not ok:
        return 2
    out = {"checks": [], "timed": [], "failed": []}
    seed = random.randrange(2**30)
    g = torch.Generator(device="cuda").manual_seed(seed)
    out["seed"] = seed
    cfgs = {D: CONFIGS[D] + EXTRA[D] for D in CONFIGS}
    good = {D: [] for D in cfgs}
    for D, cl in cfgs.items():
        for cfg in cl:
            try:
                for d, S, H in CHECKS:
                    if d != D:
                        continue
                    q, k, v = (torch.randn(S, H, D, generator=g, device="cuda").bfloat16() for _ in range(3))
                    lse = torch.full((H, S), float("nan"), device="cuda")
                    o = torch.full_like(q, float("nan"))
                    t = time.time()
                    gluon_forward(q, k, v, config=cfg, out=o, lse=lse)
                    torch.cuda.synchronize()
                    ref = attention_reference(q, k, v)
                    qf, kf = q.float().transpose(0, 1), k.float().transpose(0, 1)
                    lse_ref = torch.logsumexp(qf @ kf.transpose(1, 2) * D ** -0.5, dim=-1)    # [H, S]
                    e, el = rel_l2(o, ref), float((lse - lse_ref).abs().max())
                    row = dict(config=cfg.label, D=D, S=S, H=H, rel_l2=e, lse_max_abs=el, first_s=time.time() - t)
                    print("check", row, flush=True)
                    out["checks"].append(row)
                    if not (e < 1e-2 and el < 1e-2):
                        raise AssertionError(f"{cfg.label} D={D} S={S}: rel L2 {e:.3g}, lse {el:.3g}")
                good[D].append(cfg)
            except Exception as ex:  # noqa: BLE001 (compile errors, resources, failed checks: printed, not timed)
                msg = f"{cfg.label} D={D}: {type(ex).__name__}: {str(ex).splitlines()[0] if str(ex) else ''}"[:400]
                print("FAILED", msg, flush=True)
                out["failed"].append(msg)
    for S, H, D in TIMED:
        q, k, v = (torch.randn(S, H, D, generator=g, device="cuda").bfloat16() for _ in range(3))
        fns = {"triton:" + BASE[D].label: lambda: [attention_forward(q, k, v, config=BASE[D]) for _ in range(2)]}
        for cfg in good[D]:
            fns[cfg.label] = (lambda c: lambda: [gluon_forward(q, k, v, config=c) for _ in range(2)])(cfg)
        ms = bench.round_robin_ms(fns, repeats, warmup=3)
        fl = attention_flops(S, H, D)
        med = {m: sorted(t)[len(t) // 2] / 2 for m, t in ms.items()}
        for m, t in med.items():
            row = dict(method=m, S=S, H=H, D=D, ms=t, tflops=fl / t / 1e9)
            print("timed", row, flush=True)
            out["timed"].append(row)
    if os.environ.get("OUT"):
        os.makedirs(os.path.join(os.environ["OUT"], "h200x1"), exist_ok=True)
        with open(os.path.join(os.environ["OUT"], "h200x1", "attention_gluon_check.json"), "w") as f:
            json.dump(dict(out, provenance=env.provenance("python3 scripts/attention_gluon_check.py", {})), f,
                      indent=1, default=str)
    return 1 if out["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
