# xstage: set up, test, reproduce.
#   make venv          .venv with torch + xstage[notebooks,test] (editable)
#   make test          pytest tests/, then nbval over notebooks/
#   make reproduce     run every notebook into runs/<UTC time>/ (ARGS="--only 02 -p n_boot 200 --source recorded")
#   make figures       README gallery: reproduce from recorded data into runs/figures/, PNGs into docs/figures/
#   make lab           JupyterLab on notebooks/
#   make wheelhouse    offline wheels for a GPU node (Python 3.12, x86_64) without torch/triton
#   make install-offline   on that node: venv from wheelhouse/ (keeps the node's CUDA torch)
#   make clean / distclean
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY = $(VENV)/bin/python
PIP_FLAGS ?=

# CPU machine: torch==2.13.0 is a CPU wheel pip finds locally (an unpinned torch resolves to a multi-GB CUDA
# build). GPU machine (nvidia-smi -L works): no torch spec, and the venv sees the system site-packages, so
# the machine's own CUDA torch/triton are kept. Override either: make venv TORCH_SPEC= VENV_FLAGS=
HAVE_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
ifeq ($(HAVE_GPU),yes)
TORCH_SPEC ?=
VENV_FLAGS ?= --system-site-packages
else
TORCH_SPEC ?= torch==2.13.0
VENV_FLAGS ?=
endif

TEST_TIMEOUT ?= 900
NBVAL_CELL_TIMEOUT ?= 600
PYTEST_ARGS ?=
ARGS ?=

.PHONY: help venv test reproduce figures lab wheelhouse install-offline clean distclean

help:
	@sed -n '2,9s/^# //p' Makefile

venv: $(VENV)/.stamp

$(VENV)/.stamp: pyproject.toml
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(if $(strip $(TORCH_SPEC)),$(PY) -m pip install $(PIP_FLAGS) "$(TORCH_SPEC)")
	$(PY) -m pip install $(PIP_FLAGS) -e ".[notebooks,test]"
	touch $@

# pytest exit 5 ("no tests collected") counts as success. GPU tests skip themselves (markers, tests/conftest.py).
# nbval runs in lax mode: only cells marked `# NBVAL_CHECK_OUTPUT` have their outputs compared, after the
# sanitizers in tests/nbval_sanitize.cfg (plotly's HTML output, whose div ids are random, is replaced whole,
# so it never takes part in a comparison). Notebooks run without XSTAGE_RUN_DIR, so they export nothing.
test: venv
	@rc=0; \
	$(PY) -m pytest -q --timeout=$(TEST_TIMEOUT) $(PYTEST_ARGS) tests; r=$$?; \
	if [ $$r -eq 5 ]; then echo "tests/: no tests collected"; r=0; fi; [ $$r -eq 0 ] || rc=$$r; \
	if ls notebooks/*.ipynb >/dev/null 2>&1; then \
	  env -u XSTAGE_RUN_DIR -u XSTAGE_NOTEBOOK $(PY) -m pytest -q --nbval-lax --nbval-current-env \
	    --nbval-cell-timeout=$(NBVAL_CELL_TIMEOUT) --nbval-sanitize-with tests/nbval_sanitize.cfg \
	    -p no:cacheprovider $(PYTEST_ARGS) notebooks/; r=$$?; \
	  if [ $$r -eq 5 ]; then echo "notebooks/: no cells collected"; r=0; fi; [ $$r -eq 0 ] || rc=$$r; \
	else echo "notebooks/: no notebooks to check"; fi; \
	exit $$rc

reproduce: venv
	$(PY) -m xstage.reproduce $(ARGS)

# The README's gallery: a reproduce run from recorded data (PNG export needs Chromium for kaleido), then the
# main figures' PNGs copied into docs/figures/ and the README block between the gallery markers rewritten
# with each figure's caption (xstage.report.write_gallery; the figure list is GALLERY_FIGURES there).
FIGURES_RUN ?= runs/figures
figures: venv
	rm -rf $(FIGURES_RUN)
	env -u XSTAGE_NO_PNG $(PY) -m xstage.reproduce --source recorded --out $(FIGURES_RUN)
	$(PY) -m xstage.report gallery $(FIGURES_RUN) --readme README.md --dest docs/figures

lab: venv
	$(PY) -m jupyter lab --notebook-dir=notebooks --ip=127.0.0.1 $(if $(filter 0,$(shell id -u)),--allow-root)

# ---------------------------------------------------------------------------------------------- offline
# Wheels for a GPU node with no network: Python $(WHEEL_PYTHON), x86_64 manylinux. torch, triton and nvidia-*
# are left out (the node has its own CUDA builds); setuptools + wheel are in (to build the editable install),
# and pip (to bootstrap a venv where ensurepip is missing).
WHEELHOUSE ?= wheelhouse
WHEEL_PYTHON ?= 3.12
WHEEL_PLATFORMS ?= manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 any

# pip download evaluates environment markers for the interpreter running it, not for --python-version, so
# a dependency only for Python 3.12 (papermill -> aiohttp; python_version == "3.12") would be missed: after
# each download the closure is re-walked with a 3.12 / Linux x86_64 marker environment and what is missing
# is downloaded too, until nothing is.
define WHEELHOUSE_PY
import email.parser, re, subprocess, sys, tomllib, zipfile
from pathlib import Path
try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name
wh, pyver, platforms = Path(sys.argv[1]), sys.argv[2], sys.argv[3].split()
meta = tomllib.load(open("pyproject.toml", "rb"))
project = meta["project"]
reqs = list(project.get("dependencies", []))
for extra in ("notebooks", "test"):
    reqs += project.get("optional-dependencies", {}).get(extra, [])
reqs += meta.get("build-system", {}).get("requires", [])
skip = re.compile(r"^(torch|triton|nvidia-.*)$$")
reqs = [r for r in reqs if not skip.match(canonicalize_name(Requirement(r).name))]
wh.mkdir(parents=True, exist_ok=True)
(wh / "requirements.txt").write_text("\n".join(reqs) + "\n")
env = {"python_version": pyver, "python_full_version": pyver + ".0", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
       "platform_machine": "x86_64", "os_name": "posix", "extra": ""}
cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--python-version", pyver,
       "--implementation", "cp", "-d", str(wh), "-r", str(wh / "requirements.txt"), "pip"]
for p in platforms:
    cmd[5:5] = ["--platform", p]
extra_reqs = []
for _ in range(6):
    subprocess.run(cmd + extra_reqs, check=True)
    have = {}
    for whl in wh.glob("*.whl"):
        with zipfile.ZipFile(whl) as z:
            name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            md = email.parser.Parser().parsestr(z.read(name).decode())
        have[canonicalize_name(md["Name"])] = md.get_all("Requires-Dist") or []
    missing, seen = {}, set()
    todo = [(Requirement(r), "") for r in reqs]
    while todo:
        req, extra = todo.pop()
        if req.marker and not req.marker.evaluate({**env, "extra": extra}):
            continue
        name = canonicalize_name(req.name)
        for ex in [""] + sorted(req.extras):
            if (name, ex) in seen:
                continue
            seen.add((name, ex))
            if name not in have:
                missing[name] = str(req).split(";")[0]
                continue
            todo += [(Requirement(d), ex) for d in have[name]]
    missing = [r for n, r in missing.items() if not skip.match(n)]
    if not missing:
        break
    print("wheelhouse: also needed on Python", pyver, ":", ", ".join(missing))
    extra_reqs = sorted(set(extra_reqs) | set(missing))
else:
    sys.exit("wheelhouse: dependency closure did not settle")
bad = sorted(w.name for w in wh.glob("*.whl") if skip.match(canonicalize_name(w.name.split("-")[0])))
if bad:
    sys.exit(f"wheelhouse: torch/triton/nvidia wheels were pulled in, they must not be: {bad}")
endef
export WHEELHOUSE_PY

define INSTALL_SH
#!/usr/bin/env bash
# Offline install of xstage's notebook + test stack from this wheelhouse, on a GPU node that already has its
# CUDA torch and triton (they are not in the wheelhouse). Run from anywhere: bash wheelhouse/install.sh
# Env: PYTHON (default python3), VENV (default .venv, relative to the repo root).
set -euo pipefail
wh="$$(cd "$$(dirname "$${BASH_SOURCE[0]}")" && pwd)"
cd "$$wh/.."
PYTHON="$${PYTHON:-python3}"
VENV="$${VENV:-.venv}"
if [ ! -x "$$VENV/bin/python" ]; then
  # --system-site-packages: the node's CUDA torch/triton stay visible inside the venv
  if ! "$$PYTHON" -m venv --system-site-packages "$$VENV" 2>/dev/null; then
    rm -rf "$$VENV"
    "$$PYTHON" -m venv --system-site-packages --without-pip "$$VENV"
    pipwhl="$$(ls "$$wh"/pip-*.whl | head -n1)"
    "$$VENV/bin/python" "$$pipwhl/pip" install --no-index --find-links "$$wh" pip
  fi
fi
py="$$VENV/bin/python"
"$$py" -c "import torch, triton" 2>/dev/null \
  || echo "install.sh: warning: torch/triton not importable from $$py; install the node's CUDA build (not in the wheelhouse)" >&2
"$$py" -m pip install --no-index --find-links "$$wh" -r "$$wh/requirements.txt"
"$$py" -m pip install --no-index --find-links "$$wh" --no-deps -e .
touch "$$VENV/.stamp"
echo "install.sh: done; run: make test  /  $$py -m xstage.reproduce"
endef
export INSTALL_SH

wheelhouse:
	$(PYTHON) -c "$$WHEELHOUSE_PY" $(WHEELHOUSE) $(WHEEL_PYTHON) "$(WHEEL_PLATFORMS)"
	printf '%s\n' "$$INSTALL_SH" > $(WHEELHOUSE)/install.sh
	chmod +x $(WHEELHOUSE)/install.sh
	@echo "wheelhouse: $$(ls $(WHEELHOUSE)/*.whl | wc -l) wheels, $$(du -sh $(WHEELHOUSE) | cut -f1); copy the repo with $(WHEELHOUSE)/ to the node and run: bash $(WHEELHOUSE)/install.sh"

install-offline:
	PYTHON=$(PYTHON) VENV=$(VENV) bash $(WHEELHOUSE)/install.sh

clean:
	rm -rf build dist *.egg-info .pytest_cache
	find . -path ./$(VENV) -prune -o \( -name __pycache__ -o -name .ipynb_checkpoints \) -type d -prune -exec rm -rf {} +
	@echo "runs/ (results) is kept; make distclean also removes $(VENV) and $(WHEELHOUSE)/"

distclean: clean
	rm -rf $(VENV) $(WHEELHOUSE)
