"""Where a new shape's first call of ``xstage.attention`` spends its time (issue 43: cold 3.00 s against FA4's
1.80 s): a fresh process per state, Triton's cache folder empty (cold) and then filled by the cold run (warm),
cProfile over the first call, the top entries by cumulative time.
    python3 scripts/first_call_profile.py child <cache_dir>     (one fresh process)
    OUT=... python3 scripts/first_call_profile.py               (cold, then warm; writes $OUT/first_call_profile.txt)"""
import os
import subprocess
import sys
import tempfile
import time

SHAPE = (12_288, 16, 128)


def child(cache):
    os.environ["TRITON_CACHE_DIR"] = cache
    import cProfile
    import io
    import pstats
    t0 = time.perf_counter()
    import torch
    import xstage
    S, H, D = SHAPE
    q, k, v = (torch.randn(1, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    pr = cProfile.Profile()
    pr.enable()
    xstage.attention(q, k, v)
    torch.cuda.synchronize()
    pr.disable()
    t2 = time.perf_counter()
    xstage.attention(q, k, v)
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    print(f"import+inputs {t1 - t0:.3f} s, first call {t2 - t1:.3f} s (under cProfile), second {t3 - t2:.4f} s")
    s = io.StringIO()
    st = pstats.Stats(pr, stream=s).sort_stats("cumulative")
    st.print_stats(45)
    print(s.getvalue())
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
    print(s.getvalue())


def main():
    out = os.environ.get("OUT", ".")
    cache = tempfile.mkdtemp(prefix="tcache-")
    lines = []
    for state in ("cold", "warm", "warm-again"):
        t = time.perf_counter()
        p = subprocess.run([sys.executable, __file__, "child", cache], capture_output=True, text=True)
        lines.append(f"===== {state}: process {time.perf_counter() - t:.2f} s rc {p.returncode}\n{p.stdout}\n{p.stderr[-3000:]}")
    # ptxas alone on the cached PTX, the way Triton calls it
    for root, _, files in os.walk(cache):
        for f in files:
            if f.endswith(".ptx"):
                ptx = os.path.join(root, f)
                try:
                    from triton.backends.nvidia.compiler import get_ptxas
                    ptxas = get_ptxas().path
                except Exception as e:   # noqa: BLE001
                    ptxas = "ptxas"
                for opt in ([], ["-O1"], ["-O0"]):
                    t = time.perf_counter()
                    r = subprocess.run([ptxas, "-lineinfo", "-v", "--gpu-name=sm_90a", *opt, ptx, "-o", "/tmp/x.cubin"],
                                       capture_output=True, text=True)
                    lines.append(f"ptxas {opt} {f}: {time.perf_counter() - t:.3f} s rc {r.returncode} {r.stderr[-600:]}")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(out, "first_call_profile.txt"), "w") as fh:
        fh.write(text)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "child":
        child(sys.argv[2])
    else:
        main()
