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
    # BLOCK: attention and ulysses
    Study("ulysses", "Ulysses: the all-to-all fused into attention's epilogue", "04_ulysses_attention",
          "fused layer faster end to end than attention followed by the all-to-all"),
    Study("attention", "Our Gluon attention forward beside FA4's CuTe Hopper forward", "04_ulysses_attention",
          ">= 0.95 of FA4's TFLOP/s on every shape with S >= 8K"),
    Study("attention_clocks", "Sustained clocks of our attention, FA4 and cuDNN at the power cap",
          "04_ulysses_attention", "the ours / FA4 ratio holds when the clocks settle"),
)}

# ------------------------------------------------------------------ records (one current per study, machine, link)
RECORDS: tuple[Record, ...] = _records(
    # BLOCK: burst-gap and stage model
    # BLOCK: megamoe
    # BLOCK: attention and ulysses
    Record("ulysses", "h200x2", "nvlink", "ulysses", "ulysses", "xstage sweep ulysses --out data/h200x2/ulysses",
           "fused / serial end to end on 2 H200s over NVLink, DiT shapes and S = 4K..128K"),
    Record("ulysses", "h200x1", "host", "ulysses_host", "ulysses",
           "xstage sweep ulysses --world one-gpu --ranks P --link host --out data/h200x1/ulysses_host",
           "one-GPU world, peers' outputs (fused and copies) in pinned host memory: fused / serial"),
    Record("ulysses", "h200x1", "local", "ulysses_local", "ulysses",
           "xstage sweep ulysses --world one-gpu --ranks P --link local --out data/h200x1/ulysses_local",
           "one-GPU world, every buffer on the GPU: fused / serial"),
    Record("ulysses", "h200x1", "host", "ulysses_host_fused_outputs_on_gpu", "ulysses",
           "xstage sweep ulysses --world one-gpu --ranks P --link host --out data/h200x1/ulysses_host",
           "with the fused outputs left in device memory the host link looked faster than it is: fused outputs "
           "must be the destination buffers", current=False),
    Record("ulysses", "h200x1", "host", "ulysses_fa4_fused_host", "ulysses", "RECORD=ulysses_fa scripts/fa4_one_gpu.sh",
           "FA4's kernel with the same fused epilogue beside FA4 alone and ours, host link", current=False),
    Record("ulysses", "h200x1", "local", "ulysses_fa4_fused_local", "ulysses",
           "RECORD=ulysses_fa scripts/fa4_one_gpu.sh",
           "FA4's kernel with the same fused epilogue beside FA4 alone and ours, local link", current=False),
    Record("ulysses", "h200x1", "host", "ulysses_fa4_fused_p4_host", "ulysses", "scripts/attention_vs_fa4.sh p4:<s>",
           "the FA methods at P = 4, host link", current=False),
    Record("ulysses", "h200x1", "local", "ulysses_fa4_fused_p4_local", "ulysses", "scripts/attention_vs_fa4.sh p4:<s>",
           "the FA methods at P = 4, local link", current=False),
    Record("ulysses", "h200x1", "host", "ulysses_gluon_fused_host", "ulysses", "scripts/ulysses_gluon_one_gpu.sh",
           "the Gluon kernel's fused epilogue (16-byte stores) bit-exact and timed, host link", current=False),
    Record("ulysses", "h200x1", "host", "ulysses_gluon_fused_2byte_host", "ulysses", "scripts/ulysses_gluon_one_gpu.sh",
           "with 2-byte stores the Gluon fused epilogue cost 3.2-7.9x Gluon alone over PCIe (16-byte: 1.03-1.26x)",
           current=False),
    Record("ulysses", "h200x1", "local", "ulysses_gluon_fused_local", "ulysses", "scripts/ulysses_gluon_one_gpu.sh",
           "the Gluon kernel's fused epilogue (16-byte stores) bit-exact and timed, local link", current=False),
    Record("attention", "h100x1", "local", "attention_vs_fa4", "attention_ladder",
           "MACHINE=h100x1 STUDY=gluon scripts/attention_vs_fa4.sh",
           "ours / FA4 TFLOP/s per shape, each sample queued behind a GPU-side wait (GPU time alone)"),
    Record("attention", "h200x1", "local", "attention_vs_fa4", "attention_ladder",
           "MACHINE=h200x1 STUDY=gluon scripts/attention_vs_fa4.sh",
           "ours / FA4 TFLOP/s per shape on one H200, same rounds"),
    Record("attention", "h100x1", "local", "attention_vs_fa4_unqueued", "attention_ladder",
           "MACHINE=h100x1 STUDY=gluon scripts/attention_vs_fa4.sh",
           "the same rungs timed from an idle GPU on the same card: 2 of 7 shapes >= 0.95 (the host's launch "
           "work in the sample)",
           current=False),
    Record("attention", "h200x1", "local", "attention_triton_vs_fa4", "attention_ladder",
           "scripts/attention_vs_fa4.sh", "no Triton variant reaches 0.95 of FA4's TFLOP/s", current=False),
    Record("attention", "h200x1", "local", "attention_triton_ladder", "attention_ladder",
           "python3 scripts/attention_ladder.py", "the Triton ladder beside cuDNN: which levers help", current=False),
    Record("attention", "h200x1", "local", "attention_gluon_persistent", "attention_ladder",
           "MACHINE=h200x1 STUDY=gluon scripts/attention_vs_fa4.sh",
           "a persistent grid (one CTA per SM walking tiles) moves ours by -1.7 .. +1.2 % "
           "at S >= 8K", current=False),
    Record("attention_clocks", "h100x1", "local", "attention_clocks", "attention_clocks",
           "MACHINE=h100x1 python3 scripts/attention_clocks.py", "ours / FA4 sustained at the 700 W cap"),
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
