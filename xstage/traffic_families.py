"""Host side of the never-fitted traffic families (``xstage.kernels.traffic_families.family_store_kernel``): what
a family train is (:class:`FamilyTrain`), the families themselves (:func:`families`), the launcher and its bit-exact
destination check. Never fitted: the stage model is scored on them (xstage.families_analysis).

Legend: P = programs, B = bursts, W = warps per program, S = store width (bytes per thread per store).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import triton

from . import env
from .kernels.traffic_families import family_store_kernel
from .remote_store import MAX_BURST_BYTES, STORE_BYTES, TARGETS, payload_reference, train_family

WARPS = (1, 2, 4, 8, 16)
FAMILIES = ("width", "warps", "staggered", "waves", "per_program")


@dataclass(frozen=True)
class FamilyTrain:
    """One free-running train of the families: per program its bursts and its start delay."""

    name: str                                 # family-train, e.g. "width4-s0-01"
    family: str                               # one of FAMILIES
    target: str
    programs: int                             # P (the grid; with "waves" more than are resident at once)
    burst_bytes: tuple[tuple[int, ...], ...]  # [P][B] bytes program p stores in burst b
    gap_ns: tuple[int, ...]                   # [B] compute gap after burst b
    store_bytes: int = 16                     # S
    num_warps: int = 4                        # W
    delay_ns: tuple[int, ...] = ()            # [P] compute before the first burst (empty: none)

    @property
    def n_bursts(self) -> int:
        return len(self.gap_ns)

    @property
    def step_bytes(self) -> int:
        return self.store_bytes * 32 * self.num_warps

    @property
    def dst_elems(self) -> int:
        return int(sum(map(sum, self.burst_bytes))) // 4

    def key(self) -> tuple:
        return (self.name, self.target, self.programs, self.store_bytes)

    def validate(self, max_programs: int | None = None) -> None:
        if self.target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}, got {self.target!r}")
        if self.store_bytes not in STORE_BYTES:
            raise ValueError(f"store_bytes must be one of {STORE_BYTES}, got {self.store_bytes}")
        if self.num_warps not in WARPS:
            raise ValueError(f"num_warps must be one of {WARPS}, got {self.num_warps}")
        if self.programs < 1 or (max_programs is not None and self.programs > max_programs):
            raise ValueError(f"programs must be in [1, {max_programs}], got {self.programs}")
        if len(self.burst_bytes) != self.programs or any(len(r) != self.n_bursts for r in self.burst_bytes):
            raise ValueError(f"train {self.name}: burst_bytes must be [programs][bursts] = [{self.programs}]"
                             f"[{self.n_bursts}]")
        for row in self.burst_bytes:
            for b in row:
                if b <= 0 or b % self.step_bytes or b > MAX_BURST_BYTES:
                    raise ValueError(f"train {self.name}: burst sizes must be positive multiples of "
                                     f"{self.step_bytes} B (S x 32 x W) up to {MAX_BURST_BYTES}, got {b}")
        if any(g < 0 for g in self.gap_ns) or any(d < 0 for d in self.delay_ns):
            raise ValueError(f"train {self.name}: gaps and delays must be >= 0")
        if self.delay_ns and len(self.delay_ns) != self.programs:
            raise ValueError(f"train {self.name}: delay_ns needs one entry per program ({self.programs})")

    def sizes(self) -> np.ndarray:
        return np.asarray(self.burst_bytes, np.int64)                            # [P, B]

    def bases(self) -> np.ndarray:
        """Element offset of program p's burst b [P, B]: burst-major (every program's burst b, then b + 1)."""
        n = self.sizes() // 4
        flat = n.T.ravel()                                                       # [B * P] in storage order
        off = np.concatenate([[0], np.cumsum(flat)[:-1]])
        return np.ascontiguousarray(off.reshape(self.n_bursts, self.programs).T)


def _round(b: float, step: int) -> int:
    return int(max(round(b / step), 1)) * step


def families(family: str, programs=(16, 66, 132, 264), target: str = "host", count: int = 3, seed: int = 31,
             sm_count: int = 132, kib=(4, 256)) -> list[FamilyTrain]:
    """The trains of one family (sizes and gaps of ``count`` seeded trains of the fitting kernel's law, 8 bursts of
    ``kib`` KiB per program, gaps 0.5-50 us, seed 31: a seed no fit saw), per program count:

    width        stores of 4 and 8 bytes per thread (the fit: 16), 4 warps
    warps        1, 2, 8 and 16 warps per program (the fit: 4), 16-byte stores
    staggered    half the programs start 20 us late, a quarter 60 us late
    waves        16 warps per program (at most 4 resident per SM) and 2 or 3 x P programs for P >= 4 x SMs
                 (default 528: 2 and 3 waves), bursts an eighth of the base trains'; its P is the grid
    per_program  every program its own sizes: program p's bursts x (0.25 .. 2, log-spaced over p)"""
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")
    base = train_family(seed, count, 8, kib, (0.5, 50), 16)
    out = []
    for name, sizes, gaps in base:
        for P in programs:
            if family != "waves" and P > 2 * sm_count:   # only the waves run grids beyond 2 per SM
                continue

            def tr(tag, s=16, w=4, grid=P, rows=None, delay=()):
                step = s * 32 * w
                rows = rows or [[_round(b, step) for b in sizes]] * grid
                return FamilyTrain(f"{tag}-{name}", family, target, grid, tuple(map(tuple, rows)), tuple(gaps), s, w,
                                   tuple(delay))
            if family == "width":
                out += [tr(f"width{s}", s=s) for s in (4, 8)]
            elif family == "warps":
                out += [tr(f"warps{w}", w=w) for w in (1, 2, 8, 16)]
            elif family == "staggered":
                delay = [0 if p % 4 < 2 else (20_000 if p % 4 == 2 else 60_000) for p in range(P)]
                out.append(tr("staggered", delay=delay))
            elif family == "waves":   # 16 warps per program (at most 4 per SM: 2048 threads), P programs per
                if P >= 4 * sm_count:   # wave of 4 per SM: 2 and 3 waves, bursts of an eighth (8 KiB steps)
                    for k in (2, 3):
                        out.append(tr(f"waves{k}", w=16, grid=k * P,
                                      rows=[[_round(b / 8, 8192) for b in sizes]] * (k * P)))
            else:
                f = np.exp(np.linspace(np.log(0.25), np.log(2.0), P))
                out.append(tr("perprog", rows=[[_round(b * f[p], 2048) for b in sizes] for p in range(P)]))
    return out


KERNEL_FILE = "family_kernel.json"    # beside a families record: the compiled variants' registers (families_sweep)


def kernel_key(tr: FamilyTrain) -> str:
    """The compiled variant of family_store_kernel a train launches: "s" store bytes "-w" warps per program."""
    return f"s{tr.store_bytes}-w{tr.num_warps}"


def family_buffers(tr: FamilyTrain, device) -> dict[str, torch.Tensor]:
    return {"elems": torch.tensor(np.ascontiguousarray(tr.sizes() // 4), dtype=torch.int32).contiguous().to(device),
            "base": torch.tensor(tr.bases(), dtype=torch.int64).contiguous().to(device),
            "gap": torch.zeros(tr.n_bursts, dtype=torch.int64, device=device),
            "delay": torch.zeros(tr.programs, dtype=torch.int64, device=device),
            "ts": torch.empty(tr.programs * tr.n_bursts * 2, dtype=torch.int64, device=device),
            "cal": torch.empty(tr.programs * 2, dtype=torch.int64, device=device),
            "sm": torch.empty(tr.programs, dtype=torch.int32, device=device)}


def launch_family(dst_addr: int, bufs: dict[str, torch.Tensor], tr: FamilyTrain, seed: int,
                  cycles_per_ns: float = 1.0):
    """One launch of ``tr`` into the buffer at ``dst_addr`` (int32 [tr.dst_elems]); returns Triton's compiled kernel
    (its ``n_regs``: the registers per thread that bind how many programs are resident)."""
    tr.validate()
    bufs["gap"].copy_(torch.tensor([int(round(g * cycles_per_ns)) for g in tr.gap_ns], dtype=torch.int64))
    delay = tr.delay_ns or (0,) * tr.programs
    bufs["delay"].copy_(torch.tensor([int(round(d * cycles_per_ns)) for d in delay], dtype=torch.int64))
    return family_store_kernel[(tr.programs,)](
        dst_addr, bufs["elems"], bufs["base"], bufs["gap"], bufs["delay"], bufs["ts"], bufs["cal"], bufs["sm"], seed,
        N_BURSTS=tr.n_bursts, NB=triton.next_power_of_2(tr.n_bursts), V=tr.store_bytes // 4, R=32 * tr.num_warps,
        DEVICE=not env.interpreted(), num_warps=tr.num_warps)


def check_family_destination(buf: torch.Tensor, tr: FamilyTrain, seed: int) -> None:
    """Bit for bit: every element of the destination holds its payload; raises naming program, burst, element."""
    n = tr.dst_elems
    got = buf[:n].cpu()
    bad = torch.nonzero(got != payload_reference(0, n, seed))
    if bad.numel():
        i = int(bad[0])
        base, size = tr.bases(), tr.sizes() // 4
        p, b = (int(x) for x in np.argwhere((base <= i) & (i < base + size))[0])
        raise AssertionError(f"train {tr.name} (P = {tr.programs}): {bad.numel()} of {n} elements differ; first at "
                             f"program {p}, burst {b}, element {i - int(base[p, b])}: got {int(got[i])}, want "
                             f"{int(payload_reference(i, 1, seed))}")
