"""Where the Ulysses study's rows are recorded and which world and link they were measured in.

Shared by the sweep (``xstage.ulysses_sweep.ulysses_data``, whose ``recorded`` source reads these folders) and the
analysis (``xstage.ulysses_analysis``): both name a record the same way and label its rows the same way
(``df.attrs["world"]``, which every Ulysses figure's title shows). Needs no torch.

Records (xstage.records, study ``ulysses``): the two-GPU world over NVLink (``data/<machine>/ulysses``) and the
one-GPU world per link (:data:`ULYSSES_ONE_GPU_RECORDS`). The host link's record was made with the fused outputs as
destination buffers in pinned host memory (``xstage.data.ulysses_fused_outputs``); the archived record
:data:`ULYSSES_HOST_BEFORE_FIX` kept them in device memory and is read only by name, labelled so.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import data, records

ULYSSES_ONE_GPU_LINKS = ("local", "host")   # xstage.ranks.ONE_GPU_LINKS (not imported: this module needs no torch)
ULYSSES_ONE_GPU_RECORDS = {"local": "ulysses_local", "host": "ulysses_host"}   # the folder under data/<machine>/
ULYSSES_HOST_BEFORE_FIX = "archive/ulysses_host_fused_outputs_on_gpu"


def check_link(link: str | None, record: str | None = None, source: str = "recorded") -> None:
    """``link``: None (one process per GPU) or a one-GPU link; ``record`` only with a link and the recorded source."""
    if link is not None and link not in ULYSSES_ONE_GPU_LINKS:
        raise ValueError(f"link must be None (one process per GPU) or one of {', '.join(ULYSSES_ONE_GPU_LINKS)} "
                         f"(the one-GPU world), got {link!r}")
    if record is not None and (link is None or source != "recorded"):
        raise ValueError(f"record {record!r} names a recorded one-GPU folder: give link= and source='recorded'")


def recorded_folder(machine: str, link: str | None = None, record: str | None = None) -> Path:
    """The folder of the Ulysses record on ``machine``: the NVLink record (link None), the one-GPU record of
    ``link``, or ``record`` (another folder under data/<machine>/), with a clear line where there is none."""
    check_link(link, record)
    if link is None:
        have = sorted({r.machine for r in records.records("ulysses", link="nvlink")})
        if machine not in have:
            raise ValueError(f"machine {machine!r} has no recorded ulysses data; recorded machines: "
                             f"{', '.join(have) or 'none'}")
        return records.folder("ulysses", machine, "nvlink")
    folder = data.machine_dir(machine) / (record or ULYSSES_ONE_GPU_RECORDS[link])
    if not data.paths(folder, data.ULYSSES)[0].is_file():
        raise ValueError(f"machine {machine!r} has no recorded one-GPU Ulysses data for link {link!r} "
                         f"({folder} has no ulysses.csv); record it: xstage sweep ulysses --world one-gpu "
                         f"--link {link} --out {folder}")
    return folder


def label_world(df: pd.DataFrame, meta: dict) -> pd.DataFrame:
    """Set ``df.attrs["world"]`` from the sidecar and the rank counts the rows hold; returns ``df``."""
    df.attrs["world"] = ulysses_world(meta, sorted(int(p) for p in set(df.P)))
    return df


def recorded(machine: str, link: str | None = None, record: str | None = None) -> tuple[pd.DataFrame, dict]:
    """A Ulysses record's rows (schema xstage.data.ULYSSES, verified, ``attrs["world"]`` set) and its sidecar with
    ``source`` = recorded; see :func:`recorded_folder`."""
    df, meta = data.load(recorded_folder(machine, link, record), data.ULYSSES)
    return label_world(df, meta), {**meta, "source": "recorded"}


def ulysses_world(meta: dict, ranks=None) -> str:
    """Which world and link a Ulysses record was measured in, in words (from its sidecar's params; ``ranks``:
    the rank counts its rows hold, default the first run's)."""
    p = meta.get("params", {})
    ranks = list(ranks or [int(p.get("world_size", meta.get("gpu_count", 0)) or 0)])
    n = " / ".join(str(r) for r in ranks)
    if p.get("world") == "one-gpu":
        where = {"host": "peers' outputs in pinned host memory (host link, PCIe)",
                 "local": "every buffer in device memory (local control)"}.get(p.get("link"), p.get("link"))
        if p.get("link") == "host" and data.ulysses_fused_outputs(meta) != data.ULYSSES_FUSED_OUTPUTS:
            where = ("host link: peers' receive buffers in pinned host memory, fused outputs in device memory "
                     "(before the fix)")
        return f"one GPU, {n} ranks one after another, rank 0 timed; {where}; all-to-all by copies"
    return f"{n} GPUs, one process each (NVLink peers); all-to-all by NCCL"
