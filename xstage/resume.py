"""The resume step every sweep job starts with (burst-gap, MegaMoE, Ulysses): one skeleton, one place.

Rank 0 creates (or continues) ``<folder>/<schema>.csv`` with its provenance sidecar (:func:`xstage.data.start_file`)
and drops the configurations already recorded there (:func:`xstage.data.done_keys`); every rank then learns the
same to-do list (a broadcast from rank 0; an emulated world has one process and needs none). Rows are appended
one configuration at a time (:func:`xstage.data.append_rows`), so a re-run after an interruption resumes.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence, TypeVar

from . import data

T = TypeVar("T")


def pending(world, folder: str | Path, schema: data.Schema, meta: dict, items: Sequence[T],
            key: Callable[[T], tuple], payload=None) -> tuple[Path, list[T], object]:
    """(the CSV path, the ``items`` whose ``key(item)`` is not yet recorded in ``folder``, in order, rank 0's
    ``payload``). Every rank must call it with the same ``items``; ``payload`` (e.g. a random seed drawn on
    each rank) is rank 0's on every rank."""
    csv = Path(folder) / f"{schema.name}.csv"
    msg = [None]
    if world.local_ranks[0] == 0:
        data.start_file(folder, schema, meta)
        done = data.done_keys(csv, schema)
        msg = [([key(x) not in done for x in items], payload)]
    if not world.emulated:
        world.dist.broadcast_object_list(msg, src=0)
    flags, payload = msg[0]
    return csv, [x for x, todo in zip(items, flags) if todo], payload
