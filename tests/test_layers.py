"""The layers of xstage/ (../README.md's layout map), checked on the source with the AST.

base -> kernels -> model (host-only: the Burst-Gap and stage models, fits, the MegaMoE plan) -> records (the
registry of data folders; where a study's rows come from) -> launchers (touch devices) -> sweeps -> analysis ->
figures -> app. A module imports only
its own layer and the layers before it; the reading side never imports a sweep (analysis reads records, it
does not measure; the CLI, which starts sweeps, is the one exception); no import circle (imports inside functions count too); imports
of xstage modules sit at the top of the module (the CLI's subcommands excepted: ``xstage --help`` stays fast).
"""
from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ["base", "kernels", "model", "records", "launchers", "sweeps", "analysis", "figures", "app"]
SWEEPS = LAYERS.index("sweeps")
# module name pattern -> layer (first match wins); a module no pattern matches fails the test
LAYER_OF = [
    ("*_sweep", "sweeps"), ("*_analysis", "analysis"), ("*_figures", "figures"),
    ("xstage", "base"), ("__main__", "app"), ("env", "base"), ("numeric", "base"), ("registry", "base"), ("data", "base"),
    ("options", "base"), ("resume", "base"), ("bench", "base"), ("validate", "base"), ("report", "base"),
    ("kernels.*", "kernels"),
    ("model*", "model"), ("fluid", "model"), ("stage*", "model"), ("fit*", "model"), ("moe_plan*", "model"),
    ("moe_cost*", "model"), ("moe_cases", "model"),
    ("ranks", "launchers"), ("remote_store", "launchers"), ("moe*", "launchers"), ("ulysses*", "launchers"),
    ("fa4", "launchers"), ("traffic*", "launchers"), ("attention*", "launchers"), ("diffusers_processor", "launchers"),
    ("calibrate", "sweeps"),
    ("records", "records"), ("sources", "records"),
    ("studies", "analysis"),
    ("figures", "figures"),
    ("cli", "app"), ("reproduce", "app"), ("readme", "app"), ("explorer", "app"),
]
LAZY_OK = {"cli"}   # modules whose xstage imports may sit inside functions
MEASURES_OK = {"cli"}   # reading-side modules that may start a sweep


def modules() -> dict[str, Path]:
    out = {p.stem if p.stem != "__init__" else "xstage": p for p in (ROOT / "xstage").glob("*.py")}
    out |= {f"kernels.{p.stem}": p for p in (ROOT / "kernels").glob("*.py") if p.stem != "__init__"}
    return out


def layer(mod: str) -> str | None:
    return next((lay for pat, lay in LAYER_OF if fnmatch.fnmatchcase(mod, pat)), None)


def _target(node: ast.AST, mod: str) -> list[str]:
    """xstage modules one import statement names (relative or absolute)."""
    pkg_parts = ["kernels"] if mod.startswith("kernels.") else []
    names = []
    if isinstance(node, ast.Import):
        for a in node.names:
            if a.name.startswith("xstage.kernels."):
                names.append("kernels." + a.name.split(".")[2])
            elif a.name.startswith("xstage."):
                names.append(a.name.split(".")[1])
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parts = pkg_parts[: len(pkg_parts) - (node.level - 1)] if node.level > 1 else pkg_parts
            full = ".".join(parts + ([base] if base else []))
        elif base == "xstage" or base.startswith("xstage."):
            full = base[len("xstage."):] if base != "xstage" else ""
        else:
            return []
        if full.startswith("kernels.") or full in ("", "kernels"):
            for a in node.names:   # from . import data / from xstage.kernels import moe
                sub = f"{full}.{a.name}".lstrip(".") if full else a.name
                names.append(sub if sub in modules() else full or "xstage")
        else:
            names.append(full.split(".")[0] if not full.startswith("kernels.") else ".".join(full.split(".")[:2]))
    return [n.replace("kernels.", "kernels.", 1) for n in names if n]


def imports(mod: str, path: Path) -> tuple[set[str], set[str]]:
    """(xstage modules imported at module level, those imported inside functions or classes)."""
    tree = ast.parse(path.read_text())
    top, lazy = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found = set(_target(node, mod)) & set(modules()) - {mod}
            (top if node in tree.body or _under_toplevel_guard(tree, node) else lazy).update(found)
    return top, lazy


def _under_toplevel_guard(tree: ast.Module, node: ast.AST) -> bool:
    """An import inside a module-level ``if`` / ``try`` (TYPE_CHECKING, optional libraries) counts as top level."""
    for stmt in tree.body:
        if isinstance(stmt, (ast.If, ast.Try)) and any(n is node for n in ast.walk(stmt)):
            return True
    return False


def graph() -> dict[str, set[str]]:
    return {m: set().union(*imports(m, p)) for m, p in modules().items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary circle found by a depth-first search (one per back edge)."""
    found, state, stack = [], {}, []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(g.get(m, ())):
            if state.get(n) == 1:
                found.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m)
    return found


def test_every_module_has_a_layer():
    missing = sorted(m for m in modules() if layer(m) is None)
    assert not missing, f"modules with no layer (add them to LAYER_OF): {missing}"


def test_no_import_circle():
    found = cycles(graph())
    assert not found, "import circles: " + "; ".join(" -> ".join(c) for c in found)


def test_imports_go_down_and_reading_never_measures():
    bad = []
    for m, deps in graph().items():
        lm = layer(m)
        for d in deps:
            ld = layer(d)
            if lm is None or ld is None:
                continue
            if LAYERS.index(ld) > LAYERS.index(lm):
                bad.append(f"{m} ({lm}) imports {d} ({ld}): upward")
            elif LAYERS.index(lm) > SWEEPS and LAYERS.index(ld) == SWEEPS and m not in MEASURES_OK:
                bad.append(f"{m} ({lm}) imports {d} (a sweep): the reading side never measures")
    assert not bad, "; ".join(sorted(bad))


def test_imports_at_the_top():
    bad = sorted(f"{m} imports {d} inside a function" for m, p in modules().items() if m not in LAZY_OK
                 for d in imports(m, p)[1])
    assert not bad, "; ".join(bad)


def test_the_checks_can_fail():
    """A circle and an analysis module importing a sweep are caught."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert layer("megamoe_analysis") == "analysis" and layer("megamoe_sweep") == "sweeps"
    tree = ast.parse("from .megamoe_sweep import run\nfrom . import data\nfrom xstage.kernels import moe\n")
    got = [t for n in tree.body for t in _target(n, "x_analysis")]
    assert "megamoe_sweep" in got and "data" in got


@pytest.mark.parametrize("top", ["xstage", "kernels"])
def test_module_size(top):
    """No module over ~800 lines (one job each)."""
    big = {p.name: n for p in (ROOT / top).glob("*.py") if (n := len(p.read_text().splitlines())) > 850}
    assert not big, f"modules over 850 lines: {big}"
