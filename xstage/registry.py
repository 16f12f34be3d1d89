"""Registries: the one table of each set of named choices (schedules, dtypes, task assignments, routings, ...).

A registry maps a name to a :class:`Choice` (its one-line description and what implements it), in table order.
The kernel path, the sweep, the CLI choices and the docs all read the same registry, so adding an entry is one
edit (as in kraken's benchmark registry). ``by_name`` is the one lookup of table rows by name (MegaMoE cases,
Ulysses shapes).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Choice:
    """One entry of a registry: its name, a one-line description (CLI help, docs) and what implements it."""

    name: str
    doc: str
    impl: Any = None


class Registry(dict):
    """name -> :class:`Choice`, in table order; ``what`` names the parameter in error messages."""

    def __init__(self, what: str, choices: Iterable[Choice]):
        super().__init__((c.name, c) for c in choices)
        self.what = what

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self)

    def check(self, name: str) -> Choice:
        """The entry ``name``; ValueError naming the parameter and the choices otherwise."""
        if name not in self:
            raise ValueError(f"{self.what} must be one of {self.names}, got {name!r}")
        return self[name]

    def help(self) -> str:
        """One line for a CLI ``help=``: every name with its description."""
        return "; ".join(f"{c.name}: {c.doc}" for c in self.values()).replace("%", "%%")


def by_name(table: Sequence[T], names: Sequence[str], what: str, name: Callable[[T], str] = lambda t: t.name
            ) -> list[T]:
    """Rows of ``table`` by name, in the order asked; an unknown name is a ValueError listing the known."""
    rows: Mapping[str, T] = {name(t): t for t in table}
    bad = [n for n in names if n not in rows]
    if bad:
        raise ValueError(f"unknown {what}(s) {bad}; known: {', '.join(rows)}")
    return [rows[n] for n in names]
