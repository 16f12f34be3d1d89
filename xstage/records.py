"""The one registry of studies and their recorded measurements.

Every study names, per machine and link, ONE current record: its folder under ``data/<machine>/``, its schema,
the command that records it and what it shows. Notebooks, the README, docs, figures and tests reach recorded
data only through :func:`record` / :func:`folder`, so replacing a record is one edit here. A record that was
superseded but that a finding in ``docs/findings.md`` still rests on lives under ``data/<machine>/archive/``
with ``current=False`` (listed in ``data/<machine>/archive/README.md``); everything else that was superseded
has left the tree (git keeps it).

    T = study, M = machine (h200x2: two H200 over NVLink; h200x1 / h100x1: one GPU), L = link
    (nvlink: a peer GPU, host: pinned host memory over PCIe, local: this GPU's memory)
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .data import DATA_ROOT

LINKS = ("nvlink", "host", "local")
MACHINES = {"h200x2": "2x NVIDIA H200 (NV18)", "h200x1": "one NVIDIA H200", "h100x1": "one NVIDIA H100"}
ARCHIVE = "archive"


@dataclass(frozen=True)
class Study:
    """A study: what it measures, its notebook, its docs page and its goal (one line each)."""

    name: str
    title: str
    notebook: str          # notebooks/<notebook>.ipynb shows it
    goal: str


@dataclass(frozen=True)
class Record:
    """One recorded measurement: ``data/<machine>/[archive/]<folder>/`` with a sealed CSV + JSON sidecar."""

    study: str
    machine: str
    link: str
    folder: str
    schema: str            # xstage.data.SCHEMAS key
    command: str           # the command that records it (on a GPU machine)
    shows: str             # one line: what it shows (for archived records: the finding it supports)
    current: bool = True

    @property
    def path(self) -> Path:
        base = DATA_ROOT / self.machine
        return base / self.folder if self.current else base / ARCHIVE / self.folder


@dataclass(frozen=True)
class Headline:
    """One row of the README's headline table (each study's ``<study>_analysis.headline()`` returns its rows)."""

    claim: str             # the paper's claim, short ("" where the paper makes none)
    ours: str              # what we measured, short, with the rows it covers
    where: str             # link and machine, e.g. "NVLink, 2x H200"
    record: str            # data/<machine>/<folder>
    notebook: str          # "03"


def _records(*rows: Record) -> tuple[Record, ...]:
    return rows


# ------------------------------------------------------------------ studies (one line each; docs/<name>.md)
STUDIES: dict[str, Study] = {s.name: s for s in (
    # BLOCK: burst-gap and stage model
    # BLOCK: megamoe
    Study("megamoe", "MegaMoE: fused dispatch, grouped GEMMs and combine; each schedule / Expert-Wave, 84 configurations",
          "03_megamoe_84", "each schedule's kernel time / Expert-Wave's per configuration and dtype, beside the model"),
    Study("megamoe_controls", "MegaMoE compute only: each schedule's time / Expert-Wave's with every store local",
          "03_megamoe_84", "the schedules' compute-only cost: geomean <= 1.02, worst <= 1.05 of Expert-Wave's"),
    Study("megamoe_gemm_bf16", "MegaMoE's bf16 GEMM phases / torch._grouped_mm, same rounds",
          "03_megamoe_84", "geomean >= 0.95; >= 0.9 on each configuration with >= 2048 rows"),
    Study("megamoe_gemm_fp8", "MegaMoE's fp8 GEMM phases / torch._scaled_grouped_mm, same rounds",
          "03_megamoe_84", "geomean >= 0.95; >= 0.9 on each configuration with >= 2048 rows"),
    # BLOCK: attention and ulysses
)}

# ------------------------------------------------------------------ records (one current per study, machine, link)
RECORDS: tuple[Record, ...] = _records(
    # BLOCK: burst-gap and stage model
    # BLOCK: megamoe
    Record("megamoe", "h200x2", "nvlink", "megamoe", "megamoe",
           "xstage sweep megamoe --assignment static --out data/h200x2/megamoe",
           "the first kernels over NVLink: interleaved / Expert-Wave geomean 0.84x (bf16), 0.82x (fp8), 84 each"),
    Record("megamoe", "h200x1", "host", "megamoe_pcie", "megamoe",
           "xstage sweep megamoe --world one-gpu --ranks 2 --link host --out data/h200x1/megamoe_pcie",
           "one H200, combine over PCIe: interleaved / Expert-Wave geomean 1.025 (bf16), 1.062 (fp8), model beside"),
    Record("megamoe_controls", "h200x1", "local", "megamoe_controls", "megamoe_gemm",
           "python3 scripts/megamoe_gemm.py --study controls7 --out data/h200x1/megamoe_controls",
           "compute only: each schedule's time / Expert-Wave's, dynamic assignment, 84 configurations per dtype"),
    Record("megamoe_gemm_bf16", "h200x1", "local", "megamoe_gemm_bf16", "megamoe_gemm",
           "python3 scripts/megamoe_gemm.py --study gemm8 --out data/h200x1/megamoe_gemm_bf16",
           "bf16 GEMM phases / torch._grouped_mm: geomean 1.181, min 0.882 (0.952 at >= 2048 rows)"),
    Record("megamoe_gemm_fp8", "h200x1", "local", "megamoe_gemm_fp8", "megamoe_gemm",
           "python3 scripts/megamoe_gemm.py --study gemm10 --out data/h200x1/megamoe_gemm_fp8",
           "fp8 GEMM phases / torch._scaled_grouped_mm: geomean 1.228, min 0.999"),
    # BLOCK: attention and ulysses
)


class UnknownRecord(LookupError):
    """No record registered for the study / machine / link asked."""


def records(study: str | None = None, machine: str | None = None, link: str | None = None,
            current: bool | None = True) -> list[Record]:
    """Registered records matching every given field, in registry order (``current=None``: archived too)."""
    return [r for r in RECORDS if (study is None or r.study == study) and (machine is None or r.machine == machine)
            and (link is None or r.link == link) and (current is None or r.current == current)]


def record(study: str, machine: str | None = None, link: str | None = None) -> Record:
    """The one current record of ``study`` on ``machine`` and ``link`` (either may be left out when unique)."""
    if study not in STUDIES:
        raise UnknownRecord(f"unknown study {study!r}; studies: {', '.join(STUDIES)}")
    found = records(study, machine, link)
    if len(found) != 1:
        where = ", ".join(f"{r.machine}/{r.link}" for r in records(study)) or "none"
        raise UnknownRecord(f"study {study!r} has {len(found)} current records for machine={machine} "
                            f"link={link}; registered: {where}")
    return found[0]


def folder(study: str, machine: str | None = None, link: str | None = None) -> Path:
    """``data/<machine>/<folder>`` of the current record (see :func:`record`)."""
    return record(study, machine, link).path


def archived(machine: str) -> list[Record]:
    """The archived records of ``machine`` (each with the finding it supports)."""
    return records(machine=machine, current=False)


def archive_index(machine: str) -> str:
    """``data/<machine>/archive/README.md``: one line per archived record (generated; a test keeps it current)."""
    lines = [f"# Archived records of {MACHINES.get(machine, machine)}", "",
             "Superseded records a finding in docs/findings.md rests on; generated from xstage/records.py.", ""]
    lines += [f"- `{r.folder}/` ({r.study}, {r.link}): {r.shows}" for r in archived(machine)]
    return "\n".join(lines) + "\n"
