"""scripts/trains_gpc.py: bad input is one clear line before anything launches (the GPU run is its own record)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_missing_library_is_named_before_anything_runs(tmp_path):
    lib = tmp_path / "absent.so"
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "trains_gpc.py"), str(lib), str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode != 0
    assert f"trains_gpc: no library {lib}" in p.stderr
    assert not (tmp_path / "out").exists()          # nothing written


def test_the_shell_wrapper_parses():
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / "trains_gpc.sh")]).returncode == 0
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / "gpc_map.sh")]).returncode == 0
