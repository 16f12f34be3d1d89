"""Names say what a thing is, never when it was made: no round / session / version tags in the product.

Scans file and folder names (tracked files, data folders), Python identifiers and text of xstage/, kernels/,
tests/, scripts/, notebook headings and cell ids, README.md and docs/ (docs/findings.md's history lines, which
name the commits that held what was retired, are the one exception).
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A history tag: "round 7", "session_12", "call2", "s20", "v6", "final3", "gemm9", "tiles v3", "N12" ...
HISTORY = re.compile(
    r"(?ix)(?<![a-z0-9])(?:"
    r"(?:session|round|call[\s_-]?n?|gemm|lists|tiles?|order|lag|rung)[\s_-]?\d+"
    r"|s\d{2}(?!_h\d)|(?<![-.])(?<!deepseek_)v\d{1,2}|final(?:\d+|_q)|gluon_final"
    r")(?![a-z0-9])"
)
# Words the pattern would catch that are not history: hardware, formats, library versions.
ALLOWED: set[str] = set()
FINDINGS = ROOT / "docs" / "findings.md"


def tags(text: str) -> list[str]:
    """The history tags in ``text``."""
    return [m.group(0) for m in HISTORY.finditer(text) if m.group(0).lower() not in ALLOWED]


def tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / p for p in out.splitlines() if (ROOT / p).exists()]


def test_pattern_catches_history_and_spares_concepts():
    for bad in ("megamoe_round11_lags", "session 24", "call N12", "train_probe_s20_call2", "tiles v3",
                "gluon_final3", "gemm9", "round7", "ulysses_host_v2", "megamoe_s17_runs"):
        assert tags(bad), bad
    for good in ("expert_wave", "interleaved", "bf16", "fp8", "H200", "sm_90a", "torch 2.11", "seq_128k",
                 "round_shared", "Gen 5 x16", "NV18", "python3", "x16", "cu13", "block_n1", "lag_2n",
                 "final store", "DeepSeek-V4", "nbformat.v4", "vnd.plotly.v1+json", "deepseek_v4_flash", "st.global.v4.b32",
                 "S64_H8_D64"):
        assert not tags(good), good


def test_no_history_in_file_names():
    bad = [str(p.relative_to(ROOT)) for p in tracked() for part in p.relative_to(ROOT).parts if tags(part)]
    assert not bad, f"history tags in tracked file/folder names: {sorted(set(bad))[:20]}"


@pytest.mark.parametrize("top", ["xstage", "kernels", "tests", "scripts", "docs"])
def test_no_history_in_sources(top):
    hits = []
    for p in tracked():
        rel = p.relative_to(ROOT)
        if rel.parts[0] != top or p.suffix not in {".py", ".md", ".sh", ".cu", ".cfg", ".txt"}:
            continue
        if p == Path(__file__).resolve() or p == FINDINGS:
            continue
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            hits += [f"{rel}:{i}: {t}" for t in tags(line)]
    assert not hits, f"{len(hits)} history tags, e.g. {hits[:15]}"


def test_no_history_in_readme_and_notebooks():
    hits = [f"README.md: {t}" for t in tags((ROOT / "README.md").read_text())]
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(nb.read_text())["cells"]:
            src = "".join(cell["source"])
            heads = [ln for ln in src.splitlines() if cell["cell_type"] == "markdown" or ln.startswith("#")]
            hits += [f"{nb.name}: {t}" for ln in heads for t in tags(ln)]
            hits += [f"{nb.name} id: {t}" for t in tags(cell.get("id", ""))]
    assert not hits, f"{len(hits)} history tags, e.g. {hits[:15]}"


def test_findings_history_lines_only():
    """docs/findings.md may name the past only on lines that say where it lives in git."""
    if not FINDINGS.exists():
        pytest.skip("no docs/findings.md")
    bad = [ln for ln in FINDINGS.read_text().splitlines() if tags(ln) and "commit" not in ln.lower()]
    assert not bad, f"history tags outside history lines: {bad[:10]}"
