"""Issue 43's measurements of ``xstage.attention`` / ``xstage.UlyssesAttention`` on ONE GPU, in one process (the
first-call part starts fresh ones):

    OUT=... [MACHINE=h100x1] [XSTAGE_GIT_COMMIT=sha] python3 scripts/attention_layer_gpu.py [--parts a,b] [--rounds 20]
        [--shapes S:H:D,...]          (on the device: scripts/attention_layer_gpu.sh, which sets up FA4 and diffusers)
    python3 scripts/attention_layer_gpu.py --smoke      # the CPU (Triton's interpreter): tiny shapes, GPU parts skipped

Parts (each's result in summary.json, its rows in <part>.csv; a part that fails records its error line and the
next part runs):
- env: card, versions, the kernel ``xstage.attention`` picks, FA4 / cuDNN / diffusers present or why not.
- bad_input: wrong dtype, mismatched heads, a layout the kernel cannot take ([B, H, S, D] transposed), head dim 96,
  a CPU tensor: each one line (the message recorded), the launch cache unchanged (nothing was built or launched).
- correctness: per shape, ours, FA4's ``flash_attn_func``, cuDNN SDPA and torch bf16 (math SDPA) against a float32
  reference on sampled query rows; ours' cache-hit launch (the CompiledKernel's launcher) bit for bit against its
  first (Triton's JIT) and against ``xstage.ulysses_gluon.attention_forward`` (the validated launcher of the studies);
  each shape's first call in this process (seconds: a compile only where Triton's specialisation is new).
- host_us: host microseconds per call (``xstage.bench.host_us``: the calls queued behind a GPU-side wait) of ours,
  ours through the validated launcher, ``flash_attn_func``, FA4's compiled kernel launched directly, cuDNN SDPA.
- timing: ``rounds`` rotated rounds of ours, ``flash_attn_func`` and cuDNN SDPA (``xstage.bench.round_robin_ms``):
  plain (GPU idle before each sample), queued (behind a GPU-side wait: ``lead``), 8 launches back to back; TFLOP/s
  and the fraction of the card's dense bf16 peak. cuDNN is timed on [B, H, S, D] inputs (its layout, copied
  before timing) with no copy back.
- first_call: a new shape's first call in a fresh process, Triton's cache folder empty (cold) and again filled by
  the cold run (warm disk cache), ours / FA4 / cuDNN.
- graphs: ``xstage.attention`` and ``UlyssesAttention`` (``OneGPUWorld(2)``: both ranks on this GPU) captured in a
  CUDA graph; replays bit for bit against eager, on the captured inputs and on new data copied into them.
- compile: ``torch.compile(fullgraph=True)`` of a function around ``xstage.attention`` (the custom op
  ``xstage::attention``): graph breaks (``torch._dynamo.explain``), the compiled output against eager.
- dit_block: a Wan 2.1 1.3B transformer block from diffusers (dim 1536, 12 heads of 128, ffn 8960, random weights,
  S = 32760: 21 x 30 x 52 latent patches, 512 text tokens) step time with ``use_xstage_attention`` against diffusers'
  default processor (SDPA), and the two outputs' difference. Needs diffusers: the GPU image has none; carry the
  pure ``pip install --target`` site (scripts/attention_layer_gpu.sh ``build`` here, ``install`` there).

Shapes: the issue's six shapes are not in the project; the default is the DiT shapes of the studies with S >= 8K
(``xstage.ulysses_ladder.FA4_SHAPES``, per-rank shapes of the one-GPU sweep included). Writes
$OUT/$MACHINE/attention_layer/ (summary.json, <part>.csv), each file written whole (atomic rename).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import pandas as pd
import torch

import xstage
from xstage import attention_api, bench, data, env, fa4, ulysses_gluon
from xstage.attention_analysis import issue_table
from xstage.attention_api import AttentionInputError
from xstage.numeric import rel_l2
from xstage.ulysses import attention_flops
from xstage.ulysses_ladder import FA4_SHAPES, attention_reference_rows, sample_rows

# diffusers carried as a `pip install --target` site (scripts/attention_layer_gpu.sh): put first on sys.path after torch
# and xstage are imported, so the modules the image already loaded (filelock, packaging, ...) stay the image's own
if os.environ.get("XSTAGE_DIFFUSERS_SITE"):
    sys.path.insert(0, os.environ["XSTAGE_DIFFUSERS_SITE"])

PEAK_TFLOPS = {"H100 PCIe": 756.0, "H100 NVL": 835.0, "H100": 989.4, "H200": 989.4}   # dense bf16, per card
FIRST_CALL_SHAPE = (12_288, 16, 128)      # used by no other part: its first call in a fresh process
CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
import xstage
method, S, H, D = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
dev = "cuda" if torch.cuda.is_available() else "cpu"
dt = torch.bfloat16 if dev == "cuda" else torch.float16
q, k, v = (torch.randn(1, S, H, D, device=dev, dtype=dt) for _ in range(3))
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
sync()
t_setup = time.perf_counter() - t0
if method == "ours":
    f = lambda: xstage.attention(q, k, v)
elif method == "fa4":
    from flash_attn.cute import flash_attn_func
    f = lambda: flash_attn_func(q, k, v, causal=False)
else:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    def f():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)))
t1 = time.perf_counter(); f(); sync(); first = time.perf_counter() - t1
t2 = time.perf_counter(); f(); sync(); second = time.perf_counter() - t2
print("FIRST_CALL " + json.dumps({"import_and_inputs_s": t_setup, "first_s": first, "second_s": second}))
"""


def shapes_from(arg: str | None, smoke: bool) -> list[tuple[str, int, int, int]]:
    if smoke:
        return [("smoke_200x2_d64", 200, 2, 64), ("smoke_130x2_d128", 130, 2, 128)]
    if arg:
        out = []
        for part in arg.split(","):
            S, H, D = (int(x) for x in part.split(":"))
            out.append((f"s{S}_h{H}_d{D}", S, H, D))
        return out
    return [(s.name, s.S, s.H, s.D) for s in FA4_SHAPES if s.S >= 8192]


def inputs(S, H, D, seed, device, dtype):
    g = torch.Generator(device=device).manual_seed(seed)
    return tuple(torch.randn(1, S, H, D, generator=g, device=device).to(dtype) for _ in range(3))


def fa4_ok() -> tuple[bool, str]:
    ok, why = fa4.available()
    return ok, why


def flash_attn_func_call(q, k, v):
    from flash_attn.cute import flash_attn_func

    return lambda: flash_attn_func(q, k, v, causal=False)


def cudnn_call(q, k, v):
    """cuDNN SDPA on its own layout: [B, H, S, D] copies made here, outside any timed call."""
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    return lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt)


def cudnn_ctx():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.CUDNN_ATTENTION)


def peak(name: str) -> float | None:
    return next((p for key, p in PEAK_TFLOPS.items() if key in name), None)


# ------------------------------------------------------------------------------------------------------ parts
def part_env(ctx) -> dict:
    dev = ctx["device"]
    out = {"torch": torch.__version__, "triton": __import__("triton").__version__, "python": sys.version.split()[0],
           "interpreted": env.interpreted(), "device": str(dev), "disk_cache": str(attention_api.compile_cache_dir()),
           "git_commit": os.environ.get("XSTAGE_GIT_COMMIT") or _git_commit()}
    if dev.type == "cuda":
        out.update(card=torch.cuda.get_device_name(dev), capability=list(torch.cuda.get_device_capability(dev)),
                   peak_bf16_tflops=peak(torch.cuda.get_device_name(dev)), gluon=list(ulysses_gluon.available()))
    out["kernel"] = attention_api.kernel_for(dev)
    out["fa4"] = list(fa4_ok())
    try:
        import diffusers

        out["diffusers"] = diffusers.__version__
    except ImportError as e:
        out["diffusers"] = f"absent: {e}"
    return out


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def part_bad_input(ctx) -> dict:
    dev, dt = ctx["device"], ctx["dtype"]
    q, k, v = inputs(256, 4, 64, 1, dev, dt)
    wrong = torch.float16 if dev.type == "cuda" else torch.float64
    cases = {
        "wrong dtype": (q.to(wrong), k.to(wrong), v.to(wrong)),
        "mismatched heads": (q, k[:, :, :2], v[:, :, :2]),
        "[B, H, S, D] layout": (q.transpose(1, 2).contiguous().transpose(1, 2), k, v),
        "head dim 96": (torch.cat([q, q[..., :32]], -1),) * 3,
        "S differs (cross-attention)": (q, k[:, :100], v[:, :100]),
    }
    if dev.type == "cuda":
        cases["CPU tensor"] = (q.cpu(), k.cpu(), v.cpu())
    rows, before = [], attention_api.cache_info()["entries"]
    for name, args in cases.items():
        try:
            xstage.attention(*args)
            rows.append({"case": name, "error": "", "one_line": False, "raised": False})
        except AttentionInputError as e:
            rows.append({"case": name, "error": str(e), "one_line": "\n" not in str(e), "raised": True})
    ctx["rows"]["bad_input"] = rows
    return {"all_one_line": all(r["one_line"] for r in rows), "cache_unchanged":
            attention_api.cache_info()["entries"] == before, "cases": {r["case"]: r["error"] for r in rows},
            "S_not_a_tile_multiple": "supported (the kernels mask): checked in correctness (S = 30000, 17776, 32760)"}


def part_correctness(ctx) -> dict:
    dev, dt, rows = ctx["device"], ctx["dtype"], []
    fa, _ = fa4_ok()
    for i, (name, S, H, D) in enumerate(ctx["shapes"]):
        q, k, v = inputs(S, H, D, 100 + i, dev, dt)
        g = torch.Generator(device=dev).manual_seed(7 + i)
        idx = sample_rows(S, 64 if not ctx["smoke"] else 16, g)
        ref = attention_reference_rows(q[0], k[0], v[0], idx)
        sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
        sync()
        t = time.perf_counter()
        first = xstage.attention(q, k, v)                 # the key's first call: Triton's JIT launch
        sync()
        first_s = time.perf_counter() - t                 # in this process: compiles only a new specialisation
        hit = xstage.attention(q, k, v)                   # a cache hit: the compiled kernel's launcher
        row = {"shape": name, "S": S, "H": H, "D": D, "ours": rel_l2(first[0][idx], ref), "first_call_in_process_s": first_s,
               "hit_bit_identical": bool(torch.equal(first, hit)),
               "launch_paths": ",".join(attention_api.cache_info()["launch_paths"])}
        if dev.type == "cuda" and attention_api.kernel_for(dev) == "gluon":
            studied = ulysses_gluon.attention_forward(q[0], k[0], v[0], config=ulysses_gluon.sweep_config(D))
            row["studies_launcher_bit_identical"] = bool(torch.equal(first[0], studied))
        torch_dt = attention_reference_rows(q[0], k[0], v[0], idx) if dt == torch.float32 else \
            _torch_lowp_rows(q[0], k[0], v[0], idx)
        row["torch_" + str(dt).split(".")[-1]] = rel_l2(torch_dt, ref)
        if fa:
            o = flash_attn_func_call(q, k, v)()
            row["fa4"] = rel_l2((o[0] if isinstance(o, tuple) else o)[0][idx], ref)
        if dev.type == "cuda":
            with cudnn_ctx():
                row["cudnn"] = rel_l2(cudnn_call(q, k, v)().transpose(1, 2)[0][idx], ref)
        rows.append(row)
        del q, k, v, first, hit
    ctx["rows"]["correctness"] = rows
    return {"max_rel_l2_ours": max(r["ours"] for r in rows), "all_hits_bit_identical":
            all(r["hit_bit_identical"] for r in rows), "all_studies_launcher_bit_identical":
            all(r.get("studies_launcher_bit_identical", True) for r in rows)}


def _torch_lowp_rows(q, k, v, idx):
    """Plain PyTorch in the inputs' dtype (scores and probabilities rounded to it) on the sampled rows."""
    from xstage.ulysses import attention_reference

    return attention_reference(q[idx], k, v, upcast=False).float()


def part_host_us(ctx) -> dict:
    dev, dt, rows = ctx["device"], ctx["dtype"], []
    fa, _ = fa4_ok()
    for i, (name, S, H, D) in enumerate(ctx["shapes"]):
        q, k, v = inputs(S, H, D, 200 + i, dev, dt)
        fns = {"ours": lambda: xstage.attention(q, k, v),
               "ours_validated_launcher": lambda: ulysses_gluon.attention_forward(q[0], k[0], v[0],
                                                                                  config=ulysses_gluon.sweep_config(D))}
        if fa:
            out = torch.empty_like(q[0])
            fns["flash_attn_func"] = flash_attn_func_call(q, k, v)
            fns["fa4_kernel_direct"] = lambda: fa4.attention_kernel(q[0], k[0], v[0], out=out)
        row = {"shape": name, "S": S, "H": H, "D": D}
        for m, fn in fns.items():
            r = bench.host_us(fn, calls=20, rounds=7)
            row[m], row[m + "_covered"] = r["us"], r["covered"]
        with cudnn_ctx():
            r = bench.host_us(cudnn_call(q, k, v), calls=20, rounds=7)
        row["cudnn"], row["cudnn_covered"] = r["us"], r["covered"]
        rows.append(row)
        del q, k, v
    ctx["rows"]["host_us"] = rows
    return {m: [min(r[m] for r in rows), max(r[m] for r in rows)] for m in rows[0]
            if m not in ("shape", "S", "H", "D") and not m.endswith("_covered")} | \
        {"all_covered": all(v for r in rows for m, v in r.items() if m.endswith("_covered"))}


def part_timing(ctx) -> dict:
    dev, dt, rows = ctx["device"], ctx["dtype"], []
    fa, _ = fa4_ok()
    pk = peak(torch.cuda.get_device_name(dev))
    for i, (name, S, H, D) in enumerate(ctx["shapes"]):
        q, k, v = inputs(S, H, D, 300 + i, dev, dt)
        fns = {"ours": lambda: xstage.attention(q, k, v), "cudnn": cudnn_call(q, k, v)}
        if fa:
            fns["fa4"] = flash_attn_func_call(q, k, v)
        with cudnn_ctx():
            for mode, lead, launches in (("plain", False, 1), ("queued", True, 1), ("back_to_back", False, 8)):
                ms = {m: [] for m in fns}
                for r in range(ctx["rounds"]):     # rotated: each round starts with the next method
                    names = list(fns)[r % len(fns):] + list(fns)[:r % len(fns)]
                    got = bench.round_robin_ms({m: (lambda f=fns[m]: [f() for _ in range(launches)]) for m in names},
                                               repeats=1, warmup=1 if r == 0 else 0, lead=lead)
                    for m, t in got.items():
                        ms[m] += [x / launches for x in t]
                flops = attention_flops(S, H, D)
                row = {"shape": name, "S": S, "H": H, "D": D, "mode": mode}
                for m, t in ms.items():
                    row[f"{m}_ms"] = bench.median(t)
                    row[f"{m}_tflops"] = flops / (bench.median(t) * 1e-3) / 1e12
                    if pk:
                        row[f"{m}_of_peak"] = row[f"{m}_tflops"] / pk
                row["ours_over_cudnn"] = row["cudnn_ms"] / row["ours_ms"]
                if fa:
                    row["ours_over_fa4"] = row["fa4_ms"] / row["ours_ms"]
                rows.append(row)
        del q, k, v
    ctx["rows"]["timing"] = rows
    out = {}
    for mode in ("plain", "queued", "back_to_back"):
        sel = [r for r in rows if r["mode"] == mode]
        for key in ("ours_over_fa4", "ours_over_cudnn"):
            if sel and key in sel[0]:
                out[f"{mode}_{key}"] = [min(r[key] for r in sel), max(r[key] for r in sel)]
    return out


def part_first_call(ctx) -> dict:
    S, H, D = (256, 2, 64) if ctx["smoke"] else FIRST_CALL_SHAPE
    fa, _ = fa4_ok()
    methods = ["ours"] + (["fa4"] if fa else []) + (["cudnn"] if ctx["device"].type == "cuda" else [])
    rows = []
    with tempfile.TemporaryDirectory(prefix="xstage_triton_cache_") as cache:
        for method in methods:
            for state in ("cold", "warm"):
                envv = dict(os.environ, TRITON_CACHE_DIR=cache) if method == "ours" else dict(os.environ)
                t = time.perf_counter()
                p = subprocess.run([sys.executable, "-c", CHILD, method, str(S), str(H), str(D)], env=envv,
                                   capture_output=True, text=True, timeout=600)
                wall = time.perf_counter() - t
                line = next((x for x in p.stdout.splitlines() if x.startswith("FIRST_CALL ")), None)
                row = {"method": method, "cache": state, "S": S, "H": H, "D": D, "process_s": wall, "rc": p.returncode}
                if line:
                    row.update(json.loads(line[len("FIRST_CALL "):]))
                else:
                    row["error"] = (p.stderr.strip().splitlines() or ["no output"])[-1]
                rows.append(row)
    ctx["rows"]["first_call"] = rows
    return {f"{r['method']}_{r['cache']}_first_s": r.get("first_s") for r in rows} | \
        {"note": "cold: a fresh process with TRITON_CACHE_DIR an empty folder (ours); warm: a fresh process with the "
                 "folder the cold run filled; FA4 and cuDNN keep no cache under TRITON_CACHE_DIR (both rows in a fresh "
                 "process each)"}


def part_graphs(ctx) -> dict:
    from xstage.ranks import OneGPUWorld
    from xstage.ulysses_layer import UlyssesAttention

    dev, dt = ctx["device"], ctx["dtype"]
    S, H, D = 8192, 12, 128
    out = {}
    world = OneGPUWorld(2, "local")
    layer = UlyssesAttention(world, heads=H, head_dim=D, seq_len=S)
    for what, fn in (("attention", lambda q, k, v: xstage.attention(q, k, v)), ("ulysses_p2", layer)):
        q, k, v = inputs(S, H, D, 400, dev, dt)
        eager = fn(q, k, v).clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn(q, k, v)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static = fn(q, k, v)
        same = []
        for _ in range(3):
            static.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            same.append(bool(torch.equal(static, eager)))
        new = inputs(S, H, D, 401, dev, dt)
        for t, n in zip((q, k, v), new):
            t.copy_(n)
        eager_new = fn(q, k, v).clone()
        static.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        out[what] = {"replays_bit_identical": same, "new_data_bit_identical": bool(torch.equal(static, eager_new))}
        if what == "ulysses_p2":
            out[what]["equals_attention_bits"] = bool(torch.equal(eager_new, xstage.attention(q, k, v)))
            layer.check()
        del graph, static
    return out


def part_compile(ctx) -> dict:
    dev, dt = ctx["device"], ctx["dtype"]
    S, H, D = (200, 2, 64) if ctx["smoke"] else (8192, 12, 128)
    q, k, v = inputs(S, H, D, 500, dev, dt)

    def f(q, k, v):
        return xstage.attention(q * 1.0, k, v).float().sum(-1)

    torch._dynamo.reset()
    ex = torch._dynamo.explain(f)(q, k, v)
    backend = "aot_eager" if dev.type == "cpu" else "inductor"
    t = time.perf_counter()
    got = torch.compile(f, fullgraph=True, backend=backend)(q, k, v)
    compile_s = time.perf_counter() - t
    want = f(q, k, v)
    out = {"graph_breaks": ex.graph_break_count, "graphs": ex.graph_count, "fullgraph_compiled": True,
           "backend": backend, "compile_s": compile_s, "bit_identical": bool(torch.equal(got, want)),
           "rel_l2": rel_l2(got, want)}
    # the fused layer (two ranks in this process: EmulatedWorld on the CPU, OneGPUWorld on the GPU)
    from xstage.ranks import EmulatedWorld, OneGPUWorld
    from xstage.ulysses_layer import UlyssesAttention

    world = OneGPUWorld(2, "local") if dev.type == "cuda" else EmulatedWorld(2)
    layer = UlyssesAttention(world, heads=H, head_dim=D, seq_len=S)

    def g(q, k, v):
        return layer(q * 1.0, k, v).float().sum(-1)

    torch._dynamo.reset()
    ex = torch._dynamo.explain(g)(q, k, v)
    got = torch.compile(g, fullgraph=True, backend=backend)(q, k, v)
    want = g(q, k, v)
    out["ulysses_p2"] = {"graph_breaks": ex.graph_break_count, "graphs": ex.graph_count, "fullgraph_compiled": True,
                         "bit_identical": bool(torch.equal(got, want)), "rel_l2": rel_l2(got, want)}
    layer.check()
    return out


def part_dit_block(ctx) -> dict:
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed, WanTransformerBlock

    from xstage.diffusers_processor import restore_processors, use_xstage_attention

    dev, dt = ctx["device"], ctx["dtype"]
    if ctx["smoke"]:
        dim, heads, ffn, latent, text = 128, 2, 256, (1, 16, 2, 6, 10), 8
    else:   # Wan 2.1 1.3B: 480 x 832, 81 frames -> a 21 x 60 x 104 latent, 1 x 2 x 2 patches: 32760 tokens
        dim, heads, ffn, latent, text = 1536, 12, 8960, (1, 16, 21, 60, 104), 512
    torch.manual_seed(0)
    block = WanTransformerBlock(dim, ffn, heads, qk_norm="rms_norm_across_heads", cross_attn_norm=True,
                                eps=1e-6).to(dev, dt).eval()
    rope = WanRotaryPosEmbed(dim // heads, (1, 2, 2), 1024).to(dev)
    with torch.no_grad():
        rotary = rope(torch.empty(latent, device=dev))
        S = latent[2] * (latent[3] // 2) * (latent[4] // 2)
        g = torch.Generator(device=dev).manual_seed(1)
        hidden = torch.randn(1, S, dim, generator=g, device=dev).to(dt)
        enc = torch.randn(1, text, dim, generator=g, device=dev).to(dt)
        temb = torch.randn(1, 6, dim, generator=g, device=dev).to(dt)

        def step():
            return block(hidden, enc, temb, rotary)

        base = step().float()
        times = {}
        if dev.type == "cuda":
            times["diffusers_sdpa_ms"] = bench.median(bench.time_ms(step, warmup=2, reps=ctx["rounds"]))
        procs = use_xstage_attention(block)
        ours = step().float()
        if dev.type == "cuda":
            times["xstage_ms"] = bench.median(bench.time_ms(step, warmup=2, reps=ctx["rounds"]))
            # again in the other order, so a clock drift falls on both
            restore_processors(block)
            times["diffusers_sdpa_ms_again"] = bench.median(bench.time_ms(step, warmup=1, reps=ctx["rounds"]))
    out = {"S": S, "dim": dim, "heads": heads, "ffn": ffn, "text_tokens": text, "rel_l2_ours_vs_sdpa": rel_l2(ours, base),
           "routed": {n: p.calls for n, p in procs.items()}, **times}
    if "xstage_ms" in times:
        out["speedup"] = min(times["diffusers_sdpa_ms"], times["diffusers_sdpa_ms_again"]) / times["xstage_ms"]
    return out


PARTS = {"env": part_env, "bad_input": part_bad_input, "correctness": part_correctness, "graphs": part_graphs,
         "compile": part_compile, "host_us": part_host_us, "timing": part_timing, "dit_block": part_dit_block,
         "first_call": part_first_call}
GPU_ONLY = {"host_us", "timing", "graphs"}


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {list(PARTS)}")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--shapes", default=None, help="S:H:D,... (default: the studies' DiT shapes with S >= 8K)")
    ap.add_argument("--smoke", action="store_true", help="the CPU: tiny shapes, the GPU-only parts skipped")
    ap.add_argument("--out", default=None, help="default $OUT/$MACHINE/attention_layer")
    ap.add_argument("--record", default=None, metavar="DIR",
                    help="seal an output folder (summary.json + part CSVs) as the JSON-lines record "
                         "attention_layer.jsonl beside them, and stop (no GPU needed)")
    a = ap.parse_args(argv)
    if a.record:
        return {"record": str(record(Path(a.record)))}
    parts = [p for p in a.parts.split(",") if p]
    bad = [p for p in parts if p not in PARTS]
    if bad:
        ap.error(f"unknown parts {bad}; known: {list(PARTS)}")
    gpu = torch.cuda.is_available() and not env.interpreted()
    if not gpu and not a.smoke:
        ap.error("no CUDA GPU here (or Triton's interpreter is on): pass --smoke for the CPU run")
    out = Path(a.out or Path(os.environ.get("OUT", "runs")) / os.environ.get("MACHINE", "h100x1") / "attention_layer")
    out.mkdir(parents=True, exist_ok=True)
    ctx = {"device": torch.device("cuda" if gpu else "cpu"), "dtype": torch.bfloat16, "smoke": a.smoke,
           "shapes": shapes_from(a.shapes, a.smoke), "rounds": 3 if a.smoke else a.rounds, "rows": {}}
    summary = {"command": "python3 scripts/attention_layer_gpu.py " + " ".join(argv if argv is not None else
                                                                               sys.argv[1:]),
               "shapes": ctx["shapes"], "shapes_note": "the issue's six shapes are not in the project: the studies' "
               "DiT shapes with S >= 8K (xstage.ulysses_ladder.FA4_SHAPES)", "parts": {}}
    for p in parts:
        if p in GPU_ONLY and not gpu:
            summary["parts"][p] = {"skipped": "needs a CUDA GPU"}
            continue
        t = time.perf_counter()
        try:
            summary["parts"][p] = PARTS[p](ctx)
        except Exception as e:  # noqa: BLE001 (one part's failure is recorded; the next part runs)
            summary["parts"][p] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                                   "traceback": traceback.format_exc(limit=6)}
        summary["parts"][p]["seconds"] = time.perf_counter() - t
        print(f"attention_layer: {p}: {json.dumps(summary['parts'][p], default=str)[:1500]}", flush=True)
        for name, rows in ctx["rows"].items():
            _write(out / f"{name}.csv", pd.DataFrame(rows).to_csv(index=False))
        _write(out / "summary.json", json.dumps(summary, indent=1, default=str))
    summary["cache"] = attention_api.cache_info()
    _write(out / "summary.json", json.dumps(summary, indent=1, default=str))
    _write(out / "table.md", issue_table(summary))
    print(issue_table(summary), flush=True)
    if not a.smoke:
        record(out)
    print(f"attention_layer: wrote {out}", file=sys.stderr)
    return summary


def record(out: Path) -> Path:
    """The output folder as one sealed JSON-lines record (xstage.data.write_jsonl): a line per part with its summary,
    then a line per CSV row with its part; the sidecar holds the run's provenance (the env part)."""
    summary = json.loads((out / "summary.json").read_text())
    lines = [{"part": p, "summary": v} for p, v in summary["parts"].items()]
    for csv in sorted(out.glob("*.csv")):
        lines += [{"part": csv.stem, **row} for row in pd.read_csv(csv).to_dict("records")]
    envp = summary["parts"].get("env", {})
    meta = {"command": summary["command"], "shapes_note": summary.get("shapes_note"), "cache": summary.get("cache"),
            "machine": os.environ.get("MACHINE", out.parent.name), **{k: envp.get(k) for k in (
                "card", "capability", "torch", "triton", "python", "git_commit", "kernel", "fa4", "diffusers",
                "peak_bf16_tflops")}}
    return data.write_jsonl(out, "attention_layer", lines, meta)


if __name__ == "__main__":
    main()
