"""environment.yml (conda) must list exactly pyproject.toml's dependencies, extras included, with the same
version ranges. conda cannot be run here, so this test is what keeps the two files in step."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent


def _by_name(lines: list[str], where: str) -> dict[str, SpecifierSet]:
    out: dict[str, SpecifierSet] = {}
    for line in lines:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        assert name not in out, f"{where}: {req.name} is listed twice"
        out[name] = req.specifier
    return out


def _pyproject() -> tuple[dict, dict[str, SpecifierSet]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    lines = list(project.get("dependencies", []))
    for extra, reqs in project.get("optional-dependencies", {}).items():
        # an extra that names the package itself (xstage[notebooks]) adds nothing new
        lines += [r for r in reqs if canonicalize_name(Requirement(r).name) != canonicalize_name(project["name"])]
    return project, _by_name(lines, "pyproject.toml")


def _environment() -> tuple[list, list[str], list[str]]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text(encoding="utf-8"))
    conda, pip = [], []
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            pip += dep.get("pip", [])
        else:
            conda.append(str(dep))
    options = [p for p in pip if p.startswith("-")]
    return conda, [p for p in pip if not p.startswith("-")], options


def test_same_packages_and_ranges() -> None:
    _, want = _pyproject()
    _, pip, _ = _environment()
    have = _by_name(pip, "environment.yml")
    missing = sorted(set(want) - set(have))
    extra = sorted(set(have) - set(want))
    assert not missing, f"in pyproject.toml but not in environment.yml: {missing}"
    assert not extra, f"in environment.yml but not in pyproject.toml: {extra}"
    differ = {n: (str(want[n]), str(have[n])) for n in want if want[n] != have[n]}
    assert not differ, f"version ranges differ (pyproject.toml, environment.yml): {differ}"


def test_conda_part_is_python_and_pip_only() -> None:
    project, _ = _pyproject()
    conda, _, options = _environment()
    names = {c.split("=")[0].split(">")[0].split("<")[0].strip() for c in conda}
    assert names == {"python", "pip"}, (
        f"conda-level packages {sorted(names - {'python', 'pip'})}: list them in the pip section, as in "
        "pyproject.toml, so the ranges mean the same in both files")
    (python,) = [c for c in conda if c.startswith("python")]
    version = python.split("=")[-1]
    assert Version(version) in SpecifierSet(project["requires-python"]), (
        f"environment.yml's {python} is outside requires-python {project['requires-python']}")
    assert any(o.replace(" ", "") in ("-e.", "-e.[notebooks,test]") for o in options), \
        "environment.yml must install the package itself (-e .)"
