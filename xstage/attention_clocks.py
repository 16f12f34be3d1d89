"""Sustained clocks of our attention beside FA4 and cuDNN SDPA on one GPU.

Same-round ratios control for a clock that drifts under both kernels alike; they do not control for a kernel that itself
lowers the clock (a kernel that draws more power per FLOP runs at a lower clock under the card's power limit). This
study measures that: each method (ours, FA4, cuDNN SDPA) launched back to back for ``seconds`` (a window) while
``nvidia-smi`` samples the GPU's SM clock, power and temperature; windows in turn, ``windows`` times over, so a
slow drift falls on all methods alike. Per window: TFLOP/s (CUDA events around all its launches), the medians of the
samples after the first ``SETTLE_S`` seconds, and the clock-event reasons seen (power cap, thermal, ...).
Per shape, before any window, every method is checked against the float32 reference on sampled query rows
(``ulysses_ladder.check_shape``). Rows: schema ``attention_clocks`` (xstage.data), one shape at a time (resumable).
``scripts/attention_clocks.py`` runs it; ``xstage.attention_analysis.attention_clocks_table`` / ``attention_clocks_ratios`` read
it. The record is xstage.records' study ``attention_clocks``.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from . import bench, data, env, fa4
from .data import ATTENTION_CLOCKS
from .ulysses import UlyssesShape, attention_flops, default_dtype
from .ulysses_gluon import sweep_config
from .ulysses_ladder import (FA4_SHAPES, SAMPLE_ROWS, check_shape, config_record, method_fns, validate_ladder,
                             _cudnn_agrees)

SMI_FIELDS = ("timestamp", "clocks.sm", "power.draw", "temperature.gpu", "clocks_event_reasons.active")
LIMIT_FIELDS = ("power.limit", "enforced.power.limit", "power.max_limit", "clocks.max.sm")
SETTLE_S = 0.5          # the samples of a window's first half second are left out (the clock settles)
PERIOD_MS = 50          # nvidia-smi's sampling period
MIN_SAMPLES = 5         # fewer samples in a window than this: an error, not a row
# the shapes: the one that misses the goal (8192 x 24), one that meets it on both cards (32768 x 12), and D = 64's
# CogVideoX (met on one card only)
CLOCK_SHAPES = tuple(s for s in FA4_SHAPES if s.name in ("s8192_h24", "s32768_h12", "cogvideox5b_17776_p2"))


def parse_smi(text: str) -> pd.DataFrame:
    """nvidia-smi's ``--query-gpu=<SMI_FIELDS> --format=csv,noheader,nounits`` lines -> rows (t: datetime, sm_mhz,
    power_w, temp_c: float, NaN where the GPU reports none; reasons: int, 0 where none). A line that is not five
    fields, or whose time does not parse, is an error naming it (nvidia-smi printing an error instead of samples)."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        f = [x.strip() for x in line.split(",")]
        if len(f) != len(SMI_FIELDS):
            raise ValueError(f"nvidia-smi sample {line!r}: expected {len(SMI_FIELDS)} fields ({', '.join(SMI_FIELDS)})")
        try:
            t = datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f")
        except ValueError:
            raise ValueError(f"nvidia-smi sample {line!r}: no timestamp") from None

        def num(x):
            try:
                return float(x)
            except ValueError:   # [N/A], [Not Supported]
                return np.nan

        reasons = int(f[4], 16) if f[4].lower().startswith("0x") else 0
        rows.append(dict(t=t, sm_mhz=num(f[1]), power_w=num(f[2]), temp_c=num(f[3]), reasons=reasons))
    return pd.DataFrame(rows, columns=["t", "sm_mhz", "power_w", "temp_c", "reasons"])


def window_stats(samples: pd.DataFrame, start: datetime, end: datetime, settle_s: float = SETTLE_S) -> dict:
    """The medians of the samples in [start + settle_s, end] (sm_mhz, power_w, temp_c), their count and the OR of
    their clock-event reasons (hex). ValueError when fewer than MIN_SAMPLES fall in it."""
    lo = pd.Timestamp(start) + pd.Timedelta(seconds=settle_s)
    w = samples[(samples.t >= lo) & (samples.t <= pd.Timestamp(end))]
    if len(w) < MIN_SAMPLES:
        raise ValueError(f"{len(w)} nvidia-smi samples in the window {start:%H:%M:%S.%f}-{end:%H:%M:%S.%f} "
                         f"(after {settle_s} s settling); need >= {MIN_SAMPLES}: a longer window, or a GPU nvidia-smi "
                         f"can sample")
    reasons = 0
    for r in w.reasons:
        reasons |= int(r)
    return dict(sm_mhz=float(w.sm_mhz.median()), power_w=float(w.power_w.median()),
                temp_c=float(w.temp_c.median()), samples=int(len(w)), reasons=f"0x{reasons:x}")


def _smi_id() -> str:
    """This process's GPU as nvidia-smi names it (its UUID: CUDA's and nvidia-smi's orders may differ)."""
    uuid = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", None)
    return f"GPU-{uuid}" if uuid is not None else "0"


def gpu_limits() -> dict:
    """The GPU's power limits and top SM clock as nvidia-smi reports them (for the sidecar)."""
    out = subprocess.run(["nvidia-smi", "-i", _smi_id(), f"--query-gpu={','.join(LIMIT_FIELDS)}",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30)
    vals = out.stdout.strip().split(",") if out.returncode == 0 else []
    return {k: v.strip() for k, v in zip(LIMIT_FIELDS, vals)} or {"error": out.stderr.strip()[:200]}


class Sampler:
    """nvidia-smi sampling this GPU every PERIOD_MS into a temporary file while the block runs; ``samples`` after."""

    def __enter__(self):
        self._file = tempfile.TemporaryFile(mode="w+")
        self._proc = subprocess.Popen(["nvidia-smi", "-i", _smi_id(), f"--query-gpu={','.join(SMI_FIELDS)}",
                                       "--format=csv,noheader,nounits", f"--loop-ms={PERIOD_MS}"],
                                      stdout=self._file, stderr=subprocess.STDOUT, text=True)
        time.sleep(1.0)   # nvidia-smi's start
        if self._proc.poll() is not None:
            self._file.seek(0)
            raise RuntimeError(f"nvidia-smi could not sample: {self._file.read()[:300]!r}")
        return self

    def __exit__(self, *exc):
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        self._file.seek(0)
        text = self._file.read()
        self._file.close()
        if exc[0] is None:
            self.samples = parse_smi(text)
        return False


def sustained(fn, seconds: float, ms_hint: float) -> tuple[int, float, datetime, datetime]:
    """``bench.sustained_ms`` with the window's wall start and end in the local time nvidia-smi stamps its samples
    with: (launches, ms per launch, start, end)."""
    t0 = datetime.now()
    n, ms = bench.sustained_ms(fn, seconds, ms_hint)
    return n, ms, t0, datetime.now()


def validate(shapes: Sequence[UlyssesShape], seconds: float, windows: int) -> None:
    """One clear error before anything runs."""
    if not seconds > SETTLE_S + MIN_SAMPLES * PERIOD_MS / 1000:
        raise ValueError(f"seconds must exceed {SETTLE_S + MIN_SAMPLES * PERIOD_MS / 1000:g} (settling and "
                         f"{MIN_SAMPLES} samples), got {seconds}")
    if windows < 1:
        raise ValueError(f"windows must be >= 1, got {windows}")
    validate_ladder({s.D: (sweep_config(s.D),) for s in shapes}, shapes, 1, 0)


def run_attention_clocks(out: str | Path, shapes: Sequence[UlyssesShape] = CLOCK_SHAPES, seconds: float = 3.0,
                         windows: int = 2, seed: int = 0, command: str = "") -> Path:
    """The study (module docstring) with the sweep's Gluon tile of each head dim (``sweep_config``) into
    ``out``/attention_clocks.csv. Needs one GPU, nvidia-smi and the extra fa4 (FA4's rows absent otherwise, one line
    in the sidecar)."""

    validate(shapes, seconds, windows)
    env.require_gpus(1, "the attention clocks study")
    env.apply_safe_env()
    ok, why = fa4.available()
    configs = {s.D: sweep_config(s.D) for s in shapes}
    params = dict(variants={str(D): [config_record(c)] for D, c in configs.items()}, shapes=[asdict(s) for s in shapes],
                  seconds=seconds, windows=windows, seed=seed, settle_s=SETTLE_S, period_ms=PERIOD_MS,
                  smi_fields=list(SMI_FIELDS), gpu_limits=gpu_limits(), sample_rows=SAMPLE_ROWS, source="gpu",
                  fa4=dict(available=ok, why=why, versions=fa4.versions()),
                  timing=f"per window one method launched back to back for {seconds} s (CUDA events around all its "
                         f"launches); windows in turn ours, cuDNN, FA4, {windows} times over; nvidia-smi every "
                         f"{PERIOD_MS} ms")
    meta = env.provenance(command, params)
    csv = data.start_file(out, ATTENTION_CLOCKS, meta)
    side = data.paths(out, ATTENTION_CLOCKS)[1]
    done = data.done_keys(csv, ATTENTION_CLOCKS)
    dtype = default_dtype()
    for s in shapes:
        cfg = configs[s.D]
        if (cfg.label, s.name, s.S, s.H, s.D) in done:
            continue
        g = torch.Generator(device="cuda").manual_seed(seed + s.S + s.H)
        q, k, v = (torch.randn(s.S, s.H, s.D, generator=g, device="cuda").to(dtype) for _ in range(3))
        cudnn_why = _cudnn_agrees(q, k, v, cfg)
        errs = check_shape(q, k, v, cfg, seed + 7 * s.S + s.H, cudnn_why is None, ok)
        m = data.read_meta(side, ATTENTION_CLOCKS)
        m.setdefault("shape_checks", {})[s.name] = errs
        if cudnn_why:
            m.setdefault("cudnn_absent", {})[s.name] = cudnn_why
        data.write_json_atomic(side, m)
        fns, ctx = method_fns(q, k, v, cfg, cudnn_why is None, ok)
        flops = attention_flops(s.S, s.H, s.D)
        rows = []
        with ctx:
            # compiled and warm; the per-launch time sizes the batches
            hint = {meth: bench.time_ms(fn, warmup=3, reps=1)[0] for meth, fn in fns.items()}
            with Sampler() as smp:
                spans = []
                for w in range(windows):
                    for meth, fn in fns.items():
                        n, ms, t0, t1 = sustained(fn, seconds, hint[meth])
                        spans.append((meth, w, n, ms, t0, t1))
            for meth, w, n, ms, t0, t1 in spans:
                rows.append(dict(variant=cfg.label, shape=s.name, S=s.S, H=s.H, D=s.D, method=meth, window=w,
                                 launches=n, seconds=(t1 - t0).total_seconds(), ms=ms,
                                 tflops=flops / (ms * 1e-3) / 1e12, **window_stats(smp.samples, t0, t1)))
        data.append_rows(csv, ATTENTION_CLOCKS, pd.DataFrame(rows))
        for r in rows:
            print(f"clocks: {s.name} {r['method']} w{r['window']}: {r['tflops']:.0f} TFLOP/s at {r['sm_mhz']:.0f} MHz, "
                  f"{r['power_w']:.0f} W, {r['temp_c']:.0f} C, reasons {r['reasons']} ({r['samples']} samples)",
                  file=sys.stderr, flush=True)
        del q, k, v
    return csv
