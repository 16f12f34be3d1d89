"""Host side of the X-Stage microbenchmark: validated launchers, the reference, and one measurement.

Kernel -> launcher -> reference, in that order (the kernels are in ``xstage.kernels.remote_store``).
Legend: P = programs, B = bursts per train, N = int32 elements per program per burst, W = world size.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
import triton

from . import env
from .bench import time_ms
from .kernels.remote_store import (burst_gap_store_kernel, burst_train_store_kernel, stream_store_kernel,
                                   stream_store_tma_kernel)
from .kernels.sync import GRID_MAX_POLLS as MAX_POLLS  # grid-barrier spin bound (why: kernels/sync.py)
from .kernels.sync import clock_calibration_kernel

STORE_BYTES = (4, 8, 16)
# Where the stores go (the link): "remote" a peer GPU's symmetric buffer over NVLink, "host" pinned host memory
# over PCIe (a pin_memory tensor's address, reached from the kernel like a peer pointer: one GPU suffices),
# "local" this GPU's own memory (the control).
TARGETS = ("remote", "host", "local")
LINKS = {"remote": "nvlink", "host": "host", "local": "local"}
NUM_WARPS = 4
MAX_BURST_BYTES = 64 << 20


def _check_launch_fields(target: str, store_bytes: int, programs: int, max_programs: int | None) -> None:
    """What every launch of these kernels needs: a known target and store width, a positive grid."""
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    if store_bytes not in STORE_BYTES:
        raise ValueError(f"store_bytes must be one of {STORE_BYTES}, got {store_bytes}")
    if programs < 1 or (max_programs is not None and programs > max_programs):
        raise ValueError(f"programs must be in [1, {max_programs}], got {programs}")


@dataclass(frozen=True)
class BurstGapPoint:
    """One configuration of the burst-gap microbenchmark (a row key in recorded data)."""

    target: str          # "remote": peer (rank + 1) % W through NVLink; "host": pinned host memory (PCIe);
                         # "local": this GPU's memory (control)
    programs: int        # P issuing programs (persistent CTAs)
    burst_bytes: int     # bytes each program stores per burst
    gap_ns: int          # time between one burst's end (or drain) and the next burst
    store_bytes: int     # bytes per store instruction per thread (4, 8 or 16)
    n_bursts: int        # B consecutive bursts per launch
    drain: bool          # also wait for each burst to be performed at system scope (fence), timing the drain
    sync: bool = True    # grid barrier after each burst: all programs start each gap and burst together

    def validate(self, max_programs: int | None = None) -> None:
        """Raise ValueError with the offending field before anything launches."""
        _check_launch_fields(self.target, self.store_bytes, self.programs, max_programs)
        if self.n_bursts < 1:
            raise ValueError(f"n_bursts must be >= 1, got {self.n_bursts}")
        if self.gap_ns < 0:
            raise ValueError(f"gap_ns must be >= 0, got {self.gap_ns}")
        if not (self.store_bytes <= self.burst_bytes <= MAX_BURST_BYTES):
            raise ValueError(f"burst_bytes must be in [{self.store_bytes}, {MAX_BURST_BYTES}], got {self.burst_bytes}")
        if self.burst_bytes & (self.burst_bytes - 1):
            raise ValueError(f"burst_bytes must be a power of two, got {self.burst_bytes}")

    @property
    def dst_elems(self) -> int:
        return self.n_bursts * self.programs * self.burst_bytes // 4

    def key(self) -> tuple:
        return tuple(asdict(self).values())


def _rows_per_step(burst_elems: int, v: int, num_warps: int) -> int:
    return min(32 * num_warps, burst_elems // v)


def calibrate_clock(device: torch.device, spin_ns: int = 20_000_000) -> dict:
    """SM cycles per ns (over a ``spin_ns`` spin) and the global timer's resolution; 1.0 / 0 when interpreted."""
    if env.interpreted():
        return {"cycles_per_ns": 1.0, "globaltimer_tick_ns": 0}
    out = torch.zeros(5, dtype=torch.int64, device=device)
    clock_calibration_kernel[(1,)](out, spin_ns, DEVICE=True, num_warps=1)
    g0, g1, c0, c1, tick = out.tolist()
    return {"cycles_per_ns": (c1 - c0) / (g1 - g0), "globaltimer_tick_ns": tick}




def burst_gap_buffers(p: BurstGapPoint, device) -> dict[str, torch.Tensor]:
    """Timestamps ts[P, B, 4], start calibration cal[P, 2], barrier counters bar[B], timeout status[P, 2]."""
    return {"ts": torch.empty(p.programs * p.n_bursts * 4, dtype=torch.int64, device=device),
            "cal": torch.empty(p.programs * 2, dtype=torch.int64, device=device),
            "bar": torch.zeros(p.n_bursts, dtype=torch.int32, device=device),
            "status": torch.zeros(p.programs * 2, dtype=torch.int64, device=device)}


def launch_burst_gap(dst_addr: int, bufs: dict[str, torch.Tensor], p: BurstGapPoint, seed: int,
                     cycles_per_ns: float = 1.0, max_polls: int = MAX_POLLS, planted_missing: int = 0,
                     release: bool = True) -> None:
    """Launch one train of bursts into the buffer at ``dst_addr`` (int32 [B, P, N]); ``bufs`` from
    :func:`burst_gap_buffers` (zeroes the barrier counters and status itself). ``planted_missing`` > 0
    makes every grid barrier wait for that many programs that never come (tests: a timeout, not a hang).
    ``release=False``: the grid barrier's arrival is relaxed (it does not wait for the program's stores)."""
    p.validate()
    for name, numel in (("ts", p.programs * p.n_bursts * 4), ("cal", p.programs * 2), ("bar", p.n_bursts),
                        ("status", p.programs * 2)):
        if name not in bufs or bufs[name].numel() < numel:
            raise ValueError(f"bufs[{name!r}] must hold >= {numel} elements (use burst_gap_buffers)")
    device_timers = not env.interpreted()
    if p.drain and not device_timers:
        raise ValueError("drain timing needs a GPU (fence and timers are inline PTX)")
    bufs["bar"].fill_(-planted_missing)
    bufs["status"].zero_()
    n = p.burst_bytes // 4
    v = p.store_bytes // 4
    warps = max(1, min(NUM_WARPS, n // v // 32))  # every thread stores: no replicated lanes on small bursts
    burst_gap_store_kernel[(p.programs,)](
        dst_addr, bufs["ts"], bufs["cal"], bufs["bar"], bufs["status"], n, int(round(p.gap_ns * cycles_per_ns)),
        seed, max_polls,
        N_BURSTS=p.n_bursts, V=v, R=_rows_per_step(n, v, warps), DRAIN=p.drain, SYNC=p.sync, DEVICE=device_timers,
        RELEASE=bool(release), num_warps=warps,
    )


def check_barrier_status(status: torch.Tensor, p: BurstGapPoint, rank: int) -> None:
    """Raise naming the program and burst whose grid barrier timed out (instead of having hung)."""
    st = status[: p.programs * 2].view(p.programs, 2).cpu()
    bad = torch.nonzero(st[:, 0])
    if bad.numel():
        prog = int(bad[0])
        raise RuntimeError(f"rank {rank}: program {prog} timed out at the grid barrier after burst "
                           f"{int(st[prog, 0]) - 1}: saw {int(st[prog, 1])} of {p.programs} arrivals "
                           f"({bad.numel()} programs timed out; are all {p.programs} programs resident?)")


def launch_stream(dst_addr: int, programs: int, bytes_per_program: int, store_bytes: int = 16, rows: int = 128,
                  num_warps: int = NUM_WARPS, seed: int = 0) -> None:
    """One long burst per program (peak-bandwidth measurement); ``rows`` x ``store_bytes`` per loop step."""
    v = store_bytes // 4
    if store_bytes not in STORE_BYTES or bytes_per_program % (rows * store_bytes):
        raise ValueError(f"bytes_per_program ({bytes_per_program}) must be a multiple of rows*store_bytes "
                         f"({rows}*{store_bytes}); store_bytes in {STORE_BYTES}")
    stream_store_kernel[(programs,)](dst_addr, bytes_per_program // 4, seed, V=v, R=rows, num_warps=num_warps)


def _tma_scratch(size: int, alignment: int, stream) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")


def launch_stream_tma(dst_addr: int, programs: int, bytes_per_program: int, rows: int = 32, cols: int = 64,
                      num_warps: int = NUM_WARPS, seed: int = 0) -> None:
    """One long burst per program through TMA bulk stores of [rows, cols] int32 tiles."""
    import triton

    if bytes_per_program % (rows * cols * 4) or cols * 4 % 16 or cols > 256 or rows > 256:
        raise ValueError(f"bytes_per_program ({bytes_per_program}) must be a multiple of rows*cols*4 "
                         f"({rows}*{cols}*4); cols*4 a multiple of 16; rows, cols <= 256")
    triton.set_allocator(_tma_scratch)  # device-side tensor descriptors need a little global scratch
    stream_store_tma_kernel[(programs,)](dst_addr, bytes_per_program // 4, seed, R=rows, C=cols,
                                         num_warps=num_warps)


# ----------------------------------------------------------------------------------------------- reference
def payload_reference(start: int, count: int, seed: int) -> torch.Tensor:
    """The kernel's payload for global element indices [start, start+count), exactly (int32 wraparound)."""
    idx = torch.arange(start, start + count, dtype=torch.int64)
    val = ((idx & 0xFFFFFFFF) * 0x9E3779B1 & 0xFFFFFFFF) ^ (seed & 0xFFFFFFFF)
    return torch.where(val >= 2**31, val - 2**32, val).to(torch.int32)


POISON = -0x21524111  # 0xDEADBEEF as int32: what an unwritten element still holds


def _mismatch(buf: torch.Tensor, n: int, seed: int):
    """(index of the first element that differs from the payload, count, still-poisoned count) or None."""
    got = buf[:n].cpu()
    bad = torch.nonzero(got != payload_reference(0, n, seed))
    if not bad.numel():
        return None
    return int(bad[0]), bad.numel(), int((got == POISON).sum()), int(got[int(bad[0])])


def check_destination(buf: torch.Tensor, p: BurstGapPoint, seed: int) -> None:
    """Bit-exact check of a destination buffer against the payload; raises naming the first bad element."""
    hit = _mismatch(buf, p.dst_elems, seed)
    if hit:
        i, nbad, unwritten, got = hit
        n = p.burst_bytes // 4
        b, rest = divmod(i, p.programs * n)
        prog, off = divmod(rest, n)
        want = int(payload_reference(i, 1, seed))
        raise AssertionError(f"{nbad} of {p.dst_elems} elements differ ({unwritten} still poisoned); first "
                             f"at burst {b}, program {prog}, element {off}: got {got}, want {want}")


def check_train_destination(buf: torch.Tensor, tr: "BurstTrain", seed: int) -> None:
    """Bit-exact check of a train's destination; raises naming the burst, program and element."""
    hit = _mismatch(buf, tr.dst_elems, seed)
    if hit:
        i, nbad, unwritten, got = hit
        base = np.concatenate([[0], np.cumsum(np.asarray(tr.burst_bytes) // 4 * tr.programs)])
        b = int(np.searchsorted(base, i, side="right") - 1)
        prog, off = divmod(i - int(base[b]), tr.burst_bytes[b] // 4)
        want = int(payload_reference(i, 1, seed))
        raise AssertionError(f"train {tr.name}: {nbad} of {tr.dst_elems} elements differ ({unwritten} still "
                             f"poisoned); first at burst {b}, program {prog}, element {off}: got {got}, want {want}")


def destination_buffer(elems: int, target: str, device) -> torch.Tensor:
    """A destination for the host/local targets: pinned host memory (the host link; on the CPU interpreter
    a plain CPU tensor) or device memory."""
    if target == "host":
        return torch.empty(elems, dtype=torch.int32, pin_memory=not env.interpreted() and torch.cuda.is_available())
    return torch.empty(elems, dtype=torch.int32, device=device)


# ------------------------------------------------------------------------------------------ irregular trains
TRAIN_KIB = (2, 320)        # per-program burst sizes of the seeded family (log-uniform, whole 2 KiB steps)
TRAIN_GAP_US = (0.5, 100)   # compute gaps (log-uniform), a quarter of them 0
TRAIN_BURSTS = 12


def train_step_bytes(store_bytes: int = 16) -> int:
    """Bytes one program stores per loop step of the train kernel (burst sizes are multiples of it)."""
    return store_bytes * 32 * NUM_WARPS


@dataclass(frozen=True)
class BurstTrain:
    """A free-running train as data (no grid barrier): every program runs the same bursts and gaps."""

    name: str                       # e.g. "s0-07": seed 0 of the family, train 7
    target: str                     # "remote", "host" or "local"
    programs: int                   # P
    burst_bytes: tuple[int, ...]    # bytes each program stores in burst k
    gap_ns: tuple[int, ...]         # compute gap after burst k (the kernel spins the last one too)
    store_bytes: int = 16

    def validate(self, max_programs: int | None = None) -> None:
        _check_launch_fields(self.target, self.store_bytes, self.programs, max_programs)
        if not self.burst_bytes or len(self.burst_bytes) != len(self.gap_ns):
            raise ValueError(f"train {self.name}: burst_bytes and gap_ns need the same (non-zero) length, got "
                             f"{len(self.burst_bytes)} and {len(self.gap_ns)}")
        step = train_step_bytes(self.store_bytes)
        for b in self.burst_bytes:
            if b <= 0 or b % step or b > MAX_BURST_BYTES:
                raise ValueError(f"train {self.name}: burst sizes must be positive multiples of {step} B up to "
                                 f"{MAX_BURST_BYTES}, got {b}")
        if any(g < 0 for g in self.gap_ns):
            raise ValueError(f"train {self.name}: gaps must be >= 0, got {self.gap_ns}")

    @property
    def n_bursts(self) -> int:
        return len(self.burst_bytes)

    @property
    def dst_elems(self) -> int:
        return self.programs * sum(self.burst_bytes) // 4

    def key(self) -> tuple:
        return (self.name, self.target, self.programs, self.store_bytes)


def train_family(seed: int, count: int, n_bursts: int = TRAIN_BURSTS, kib=TRAIN_KIB, gap_us=TRAIN_GAP_US,
                 store_bytes: int = 16) -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
    """``count`` seeded trains (name, bytes per program per burst, gap after each burst in ns): sizes
    log-uniform in ``kib`` KiB (whole loop steps), gaps log-uniform in ``gap_us`` us with a quarter of them 0."""
    if count < 1 or n_bursts < 1:
        raise ValueError(f"count and n_bursts must be >= 1, got {count}, {n_bursts}")
    rng = np.random.default_rng(seed)
    step = train_step_bytes(store_bytes)
    out = []
    for i in range(count):
        size = np.exp(rng.uniform(np.log(kib[0] * 1024), np.log(kib[1] * 1024), n_bursts))
        size = np.maximum(np.round(size / step), 1).astype(np.int64) * step
        gap = np.exp(rng.uniform(np.log(gap_us[0] * 1000), np.log(gap_us[1] * 1000), n_bursts))
        gap = np.where(rng.random(n_bursts) < 0.25, 0, np.round(gap, -1)).astype(np.int64)
        out.append((f"s{seed}-{i:02d}", tuple(int(x) for x in size), tuple(int(x) for x in gap)))
    return out


PROBE_LEAD_KIB = (8, 16, 32, 64, 128)   # probe family: the lead burst per program (KiB)
PROBE_GAP_US = (0.5, 5, 20)             # probe family: compute gap between the lead burst and the first probe (us)
PROBE_KIB = 2                           # probe family: each probe burst per program (KiB)
PROBE_SPACING_US = 3                    # probe family: compute gap between consecutive probes (us)


def probe_family(n_bursts: int = TRAIN_BURSTS, lead_kib=PROBE_LEAD_KIB, gap_us=PROBE_GAP_US,
                 store_bytes: int = 16) -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
    """Designed trains (issue 11): one lead burst of A KiB per program, a gap g, then n_bursts - 1
    probes of PROBE_KIB KiB PROBE_SPACING_US apart, for every A in ``lead_kib`` x g in ``gap_us``. What a probe
    costs, per program, says what still holds the link back after the program's own lead burst: a stage that
    is full (every program's probe waits alike) or the program's own stores still queued (its probe waits for
    them). Names "pA-gG" (A KiB, G us)."""
    if n_bursts < 2:
        raise ValueError(f"a probe train needs a lead burst and at least one probe, got n_bursts={n_bursts}")
    step = train_step_bytes(store_bytes)
    probe = max(int(round(PROBE_KIB * 1024 / step)), 1) * step
    out = []
    for a in lead_kib:
        lead = int(round(a * 1024 / step)) * step
        if lead <= 0:
            raise ValueError(f"probe family: lead bursts must be at least {step} B, got {a} KiB")
        for g in gap_us:
            out.append((f"p{a:g}-g{g:g}", *_lead_then_probes(lead, probe, g, n_bursts)))
    return out


def _lead_then_probes(lead: int, probe: int, gap_us: float, n_bursts: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(sizes, gaps) of a designed train: the lead burst, ``gap_us``, then n_bursts - 1 probes PROBE_SPACING_US
    apart (both probe families)."""
    gaps = (int(round(gap_us * 1000)),) + (int(PROBE_SPACING_US * 1000),) * (n_bursts - 1)
    return (lead,) + (probe,) * (n_bursts - 1), gaps


LOAD_PROBES = (0, 1, 2)   # burst_train_store_kernel's LOAD_PROBE: none, an L1-resident word, an L2 word (past L1)


def train_stamps(load_probe: int = 0) -> int:
    """Timestamps per program and burst: issue start, issue end (and, with a load probe, the probe's end)."""
    return 3 if load_probe else 2


PROBE_SIZE_LEAD_KIB = (32, 128)          # probe_size family: the lead burst per program (KiB)
PROBE_SIZE_KIB = (2, 4, 8, 16, 32)       # probe_size family: the probes' size per program (KiB), one size per train
PROBE_SIZE_GAP_US = 0.5                  # probe_size family: compute gap between the lead and the first probe (us)


def probe_size_family(n_bursts: int = TRAIN_BURSTS, lead_kib=PROBE_SIZE_LEAD_KIB, probe_kib=PROBE_SIZE_KIB,
                      gap_us: float = PROBE_SIZE_GAP_US, store_bytes: int = 16
                      ) -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
    """Designed trains (issue 11): the probe family with the probe's size as the variable. One lead
    burst of A KiB per program, a gap of ``gap_us``, then n_bursts - 1 probes of S KiB PROBE_SPACING_US apart, for
    every A in ``lead_kib`` x S in ``probe_kib``. A run found 2 KiB probes (one 16-byte store per thread) after a
    contended lead cost ~60 ns with the clean kernel, where the stage model makes them wait microseconds: how the
    first probe's cost grows with its size says how much a program may issue past a full stage without waiting.
    Names "sS-pA" (S KiB probes, A KiB lead)."""
    if n_bursts < 2:
        raise ValueError(f"a probe train needs a lead burst and at least one probe, got n_bursts={n_bursts}")
    step = train_step_bytes(store_bytes)
    out = []
    for a in lead_kib:
        lead = int(round(a * 1024 / step)) * step
        for sz in probe_kib:
            probe = int(round(sz * 1024 / step)) * step
            if lead <= 0 or probe <= 0:
                raise ValueError(f"probe_size family: bursts must be at least {step} B, got lead {a}, probe {sz} KiB")
            out.append((f"s{sz:g}-p{a:g}", *_lead_then_probes(lead, probe, gap_us, n_bursts)))
    return out


def train_buffers(tr: BurstTrain, device, load_probe: int = 0) -> dict[str, torch.Tensor]:
    """Per-burst sizes, block offsets and gaps for the kernel, timestamps ts[P, B, stamps], calibration cal[P, 2],
    the SM of every program sm[P], and the load probe's words probe[P, B, 16] (distinct values, each (program,
    burst) its own 128-byte line) and sink[P, B] (what the kernel wrote: the loaded word + 1)."""
    if load_probe not in LOAD_PROBES:
        raise ValueError(f"load_probe must be one of {LOAD_PROBES}, got {load_probe!r}")
    elems = torch.tensor([b // 4 for b in tr.burst_bytes], dtype=torch.int32)
    base = torch.zeros(tr.n_bursts, dtype=torch.int64)
    base[1:] = torch.cumsum(elems.to(torch.int64) * tr.programs, 0)[:-1]
    n_probe = tr.programs * tr.n_bursts if load_probe else 1
    return {"elems": elems.to(device), "base": base.to(device),
            "gap": torch.zeros(tr.n_bursts, dtype=torch.int64, device=device),
            "ts": torch.empty(tr.programs * tr.n_bursts * train_stamps(load_probe), dtype=torch.int64, device=device),
            "cal": torch.empty(tr.programs * 2, dtype=torch.int64, device=device),
            "sm": torch.empty(tr.programs, dtype=torch.int32, device=device),
            "probe": (torch.arange(n_probe * 16, dtype=torch.int64) * 7919 + 12345).to(device),
            "sink": torch.empty(n_probe, dtype=torch.int64, device=device)}


def check_load_probe(bufs: dict[str, torch.Tensor], tr: BurstTrain, load_probe: int) -> None:
    """Every program loaded its probe word after every burst: sink[p, b] == the word + 1 (kind 1: the program's
    one word, kind 2: the (program, burst) word). Raises naming the first program and burst that did not."""
    if not load_probe:
        return
    probe = bufs["probe"].view(tr.programs, tr.n_bursts, 16)[..., 0].cpu()
    want = (probe[:, :1].expand(-1, tr.n_bursts) if load_probe == 1 else probe) + 1
    got = bufs["sink"].view(tr.programs, tr.n_bursts).cpu()
    bad = (got != want).nonzero()
    if len(bad):
        p, b = (int(x) for x in bad[0])
        raise AssertionError(f"train {tr.name}: load probe {load_probe}: {len(bad)} of {got.numel()} sink words "
                             f"wrong; first program {p}, burst {b}: got {int(got[p, b])}, want {int(want[p, b])}")


def launch_train(dst_addr: int, bufs: dict[str, torch.Tensor], tr: BurstTrain, seed: int,
                 cycles_per_ns: float = 1.0, preload: bool = True, load_probe: int = 0) -> None:
    """Launch one free-running train into the buffer at ``dst_addr`` (int32 [sum_k P * N_k]). ``preload``: the
    kernel reads every burst's size, offset and gap before the first burst (False: at the top of each burst, as
    records before the preload; see ``burst_train_store_kernel``). ``load_probe`` (1 / 2, needs the preload and
    buffers made with the same kind): one load after each burst, timed (``burst_train_store_kernel``)."""
    tr.validate()
    if load_probe not in LOAD_PROBES:
        raise ValueError(f"load_probe must be one of {LOAD_PROBES}, got {load_probe!r}")
    if load_probe and not preload:
        raise ValueError("a load probe needs the preload (the legacy reads would wait behind the stores too)")
    if bufs["ts"].numel() != tr.programs * tr.n_bursts * train_stamps(load_probe):
        raise ValueError(f"the buffers were made for another load probe than {load_probe} (train_buffers)")
    bufs["gap"].copy_(torch.tensor([int(round(g * cycles_per_ns)) for g in tr.gap_ns], dtype=torch.int64))
    v = tr.store_bytes // 4
    burst_train_store_kernel[(tr.programs,)](
        dst_addr, bufs["elems"], bufs["base"], bufs["gap"], bufs["ts"], bufs["cal"], bufs["sm"], seed,
        bufs["probe"], bufs["sink"],
        N_BURSTS=tr.n_bursts, V=v, R=32 * NUM_WARPS, DEVICE=not env.interpreted(), PRELOAD=bool(preload),
        NB=triton.next_power_of_2(tr.n_bursts), LOAD_PROBE=int(load_probe), num_warps=NUM_WARPS)


def summarize_train(ts_ns: np.ndarray) -> dict[str, np.ndarray]:
    """ts_ns[P, B, 2] (ns: issue start, issue end of every program's bursts) -> per-burst statistics over
    programs, each an array of length B. Times are relative to the earliest program start."""
    t0, t1 = ts_ns[..., 0], ts_ns[..., 1]
    issue = t1 - t0
    q = np.percentile(issue, [10, 25, 75, 90], axis=0)
    return {"issue_ns": np.median(issue, axis=0), "issue_p10_ns": q[0], "issue_p25_ns": q[1],
            "issue_p75_ns": q[2], "issue_p90_ns": q[3], "issue_min_ns": issue.min(axis=0),
            "issue_max_ns": issue.max(axis=0), "start_ns": np.median(t0, axis=0),
            "start_skew_ns": t0.max(axis=0) - t0.min(axis=0), "end_skew_ns": t1.max(axis=0) - t1.min(axis=0),
            "span_ns": t1.max(axis=0) - t0.min(axis=0)}


# ------------------------------------------------------------------------------------ one measurement
def to_ns(ts: np.ndarray, cal: np.ndarray, cycles_per_ns: float) -> np.ndarray:
    """ts[P, B, k] cycles -> ns on the global timer's time base, using each program's start (cal[P, 2])."""
    # Subtract in int64 first: the global timer counts ns since the epoch (~1.8e18), where a float64 step is
    # 256 ns. Times are relative to the launch's earliest program start.
    g0 = (cal[:, 0] - cal[:, 0].min()).astype(np.float64)
    cycles = (ts - cal[:, 1][:, None, None]).astype(np.float64)
    return g0[:, None, None] + cycles / cycles_per_ns


def summarize_timestamps(ts_ns: np.ndarray) -> dict[str, np.ndarray]:
    """ts_ns[P, B, 4] (ns) -> per-burst statistics over programs, each an array of length B."""
    t0, t1, t2, t3 = ts_ns[..., 0], ts_ns[..., 1], ts_ns[..., 2], ts_ns[..., 3]
    issue = t1 - t0
    gap = np.full(t0.shape[1], np.nan)
    idle = np.full(t0.shape[1], np.nan)
    if t0.shape[1] > 1:  # both refer to the time before burst k (k >= 1)
        gap[1:] = np.median(t0[:, 1:] - t3[:, :-1], axis=0)
        idle[1:] = np.median(t0[:, 1:] - t1[:, :-1], axis=0)
    return {
        "issue_ns": np.median(issue, axis=0),
        "issue_ns_max": issue.max(axis=0),
        "issue_ns_min": issue.min(axis=0),
        "span_ns": t1.max(axis=0) - t0.min(axis=0),
        "drain_ns": np.median(t2 - t1, axis=0),
        "drain_ns_max": (t2 - t1).max(axis=0),
        "gap_meas_ns": gap,
        "barrier_ns": np.median(t3 - t2, axis=0),
        "idle_ns": idle,
        "start_skew_ns": t0.max(axis=0) - t0.min(axis=0),
    }


# ------------------------------------------------------------------------------------------------ bandwidth
BW_PROGRAMS_PER_SM = (1, 2, 4, 8)
BW_WARPS = (4, 8, 16)
BW_UNROLL = (1, 2, 4)
BW_TMA_ROWS = (16, 32, 64)


def bandwidth_worker(world, out_rows: list, bytes_per_program: int = 4 << 20, reps: int = 10,
                     host_bytes_per_program: int = 1 << 20) -> None:
    """Rank 0 measures; the others wait. Appends rows (schema ``bandwidth``) to ``out_rows`` on rank 0.

    Targets: ``remote`` (peer over NVLink, with >= 2 ranks) against the copy engine's peer copy; ``host``
    (pinned host memory over PCIe, ``host_bytes_per_program`` per program: the link is ~7x slower) against the
    copy engine's device-to-host copy; ``local`` (this GPU's memory) as the control."""
    rank, dev = world.local_ranks[0], world.device(0)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    max_bytes = max(BW_PROGRAMS_PER_SM) * sms * bytes_per_program
    host_bytes = max(BW_PROGRAMS_PER_SM) * sms * host_bytes_per_program
    symm = world.symmetric_empty(max_bytes // 4, torch.int32) if world.world_size > 1 else None
    local = torch.empty(max_bytes // 4, dtype=torch.int32, device=dev)
    host = destination_buffer(host_bytes // 4, "host", dev)
    world.barrier()
    if rank == 0:
        rows = []
        targets = [("host", host.data_ptr(), host_bytes_per_program), ("local", local.data_ptr(), bytes_per_program)]
        if symm is not None:
            targets.insert(0, ("remote", symm.ptr(1), bytes_per_program))
        for target, addr, per_prog in targets:
            for pps in BW_PROGRAMS_PER_SM:
                for warps in BW_WARPS:
                    for unroll in BW_UNROLL:
                        programs, r = pps * sms, 32 * warps * unroll
                        ms = time_ms(lambda: launch_stream(addr, programs, per_prog, 16, r, warps), reps=reps)
                        total = programs * per_prog
                        rows += [dict(method="sm_store", target=target, programs=programs, num_warps=warps, rows=r,
                                      store_bytes=16, bytes=total, repeat=i, ms=m, gbps=total / m / 1e6)
                                 for i, m in enumerate(ms)]
            for pps in BW_PROGRAMS_PER_SM[:3]:
                for tile_rows in BW_TMA_ROWS:
                    programs, total = pps * sms, pps * sms * per_prog
                    ms = time_ms(lambda: launch_stream_tma(addr, programs, per_prog, tile_rows, 64), reps=reps)
                    rows += [dict(method="sm_tma_store", target=target, programs=programs, num_warps=4,
                                  rows=tile_rows, store_bytes=tile_rows * 256, bytes=total, repeat=i, ms=m,
                                  gbps=total / m / 1e6) for i, m in enumerate(ms)]
        # both store paths write the payload bit for bit, into device memory and into pinned host memory
        n = sms * host_bytes_per_program // 4
        for buf in (local, host):
            for launch in (lambda: launch_stream(buf.data_ptr(), sms, host_bytes_per_program, seed=11),
                           lambda: launch_stream_tma(buf.data_ptr(), sms, host_bytes_per_program, seed=11)):
                buf.fill_(-1)
                launch()
                torch.cuda.synchronize()
                if not torch.equal(buf[:n].cpu(), payload_reference(0, n, 11)):
                    raise AssertionError(f"stream store kernel wrote wrong data into {buf.device} memory")
        # copy engine, same byte counts: a cross-device copy in this process (cudaMemcpyPeerAsync), and a
        # device-to-host copy into pinned memory (cudaMemcpyAsync D2H)
        ce = [("ce_d2h_copy", "host", host_bytes_per_program)]
        if symm is not None:
            ce.insert(0, ("ce_peer_copy", "remote", bytes_per_program))
        for method, target, per_prog in ce:
            for total in sorted({pps * sms * per_prog for pps in BW_PROGRAMS_PER_SM}):
                src = torch.randint(-2**31, 2**31 - 1, (total // 4,), dtype=torch.int32, device=dev)
                dst = (torch.empty(total // 4, dtype=torch.int32, device=torch.device("cuda", 1))
                       if target == "remote" else host[: total // 4])
                ms = time_ms(lambda: dst.copy_(src, non_blocking=True), reps=reps)
                torch.cuda.synchronize()
                if not torch.equal(dst.cpu(), src.cpu()):
                    raise AssertionError(f"copy engine ({method}) corrupted data")
                rows += [dict(method=method, target=target, programs=0, num_warps=0, rows=0, store_bytes=0,
                              bytes=total, repeat=i, ms=m, gbps=total / m / 1e6) for i, m in enumerate(ms)]
                del src, dst
        out_rows.extend(rows)
    world.barrier()
