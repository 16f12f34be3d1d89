"""What a person sees, checked in a real headless Chromium (Playwright driving the system's browser).

1. The report: ``xstage reproduce --source recorded --only 01,04`` into a temporary run folder (once per module), then its ``index.html``: every exported figure is a drawn plotly plot with traces, as many
   as the manifest lists, and the page logs no error; and each notebook's HTML draws its plotly outputs.
2. The explorer, live: JupyterLab on 127.0.0.1 (free port, token) serving a copy of
   ``notebooks/00_explore_model.ipynb``; run all cells, wait for the widgets, press an arrow key on a slider's
   handle and check that the figure's traces changed.

Screenshots go to ``test-artifacts/`` at the repo root (or ``$XSTAGE_TEST_ARTIFACTS``); the path is printed.
``XSTAGE_BROWSER_RUN=<run folder>`` reuses an existing reproduce run instead of making one. Every wait is
bounded; the server and the browser are stopped in fixture teardowns.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from xstage.ranks import free_port

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = Path(os.environ.get("XSTAGE_TEST_ARTIFACTS") or ROOT / "test-artifacts")
EXPLORER_NOTEBOOK = ROOT / "notebooks" / "00_explore_model.ipynb"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
REPRODUCE_LIMIT_S = 600   # the fixture's reproduce run (REPORT_NOTEBOOKS from recorded data)
# The report is checked on two notebooks (figures of a sweep and of a fused kernel); every notebook's figures run
# under nbval in `make test`, and `make reproduce` runs them all.
REPORT_NOTEBOOKS = os.environ.get("XSTAGE_BROWSER_NOTEBOOKS", "01,04")
FIGURE = ".xstage-explorer-figure.js-plotly-plot, .xstage-explorer-figure .js-plotly-plot"

pytestmark = pytest.mark.browser

try:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright
except ImportError:  # the `test` extra brings it; in CI its absence is a failure, not a skip
    if os.environ.get("CI"):
        raise
    pytest.skip("playwright is not installed (pip install -e '.[test]')", allow_module_level=True)


def _chromium() -> str:
    return os.environ.get("XSTAGE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


def _artifacts(capsys) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with capsys.disabled():
        print(f"\nbrowser test artifacts: {ARTIFACTS}")
    return ARTIFACTS


def _severe(messages: list[tuple[str, str]]) -> list[str]:
    return [f"{kind}: {text}" for kind, text in messages if kind in ("error", "pageerror")]


@pytest.fixture(scope="module")
def browser_context(tmp_path_factory):
    """One headless Chromium for the module, fresh profile, network features off; closed on teardown."""
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile), executable_path=_chromium(), headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000}, timeout=60_000)
        try:
            yield context
        finally:
            context.close()  # the driver's exit (leaving the `with`) also ends the browser


def _page(context):
    page = context.new_page()
    page.set_default_timeout(60_000)
    messages: list[tuple[str, str]] = []
    page.on("console", lambda m: messages.append((m.type, m.text)))
    page.on("pageerror", lambda e: messages.append(("pageerror", str(e))))
    return page, messages


def _wait_drawn(page, n: int, timeout_ms: int = 45_000) -> None:
    """Until ``n`` plotly divs have been laid out by plotly.js (with or without data); the assertions after
    it say what is missing, so a timeout here is not an error by itself."""
    with contextlib.suppress(PlaywrightTimeout):
        page.wait_for_function("n => [...document.querySelectorAll('.js-plotly-plot')]"
                               ".filter(e => e._fullLayout).length >= n", arg=n, timeout=timeout_ms)


# ---------------------------------------------------------------------------------------------- the report

@pytest.fixture(scope="module")
def reproduce_run(tmp_path_factory) -> Path:
    """A reproduce run of REPORT_NOTEBOOKS from recorded data (REPRODUCE_LIMIT_S bounds it); PNG export off."""
    if os.environ.get("XSTAGE_BROWSER_RUN"):
        return Path(os.environ["XSTAGE_BROWSER_RUN"])
    run = tmp_path_factory.mktemp("reproduce") / "browser-test-run"
    env = {k: v for k, v in os.environ.items() if k not in ("XSTAGE_RUN_DIR", "XSTAGE_NOTEBOOK")}
    env["XSTAGE_NO_PNG"] = "1"  # the report is checked here; PNG export has its own test (test_reproduce.py)
    proc = subprocess.run([sys.executable, "-m", "xstage.reproduce", "--source", "recorded", "--out", str(run),
                           "--only", REPORT_NOTEBOOKS,
                           "--timeout", "600"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=REPRODUCE_LIMIT_S,
                          check=False)
    assert proc.returncode == 0, f"reproduce failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return run


@pytest.mark.timeout(REPRODUCE_LIMIT_S + 300)   # the first test of the module also runs the fixture's reproduce
def test_report_renders_every_figure(reproduce_run: Path, browser_context, capsys) -> None:
    manifest = [json.loads(line) for line in
                (reproduce_run / "figures" / "manifest.jsonl").read_text(encoding="utf-8").splitlines() if line]
    names = list(dict.fromkeys(rec["name"] for rec in manifest))  # the report shows the last export per name
    assert len(names) >= 10, f"expected the real notebooks' figures, the manifest lists {names}"

    page, messages = _page(browser_context)
    try:
        page.goto((reproduce_run / "index.html").as_uri(), wait_until="load")
        _wait_drawn(page, len(names))
        plots = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')].map(el => ({
            id: el.id, traces: (el.data || []).length,
            points: (el._fullData || []).reduce(  // data as plotly.js decoded it (numpy arrays come base64)
                (s, t) => s + (((t.x || t.z || t.y || t.values || (t.cells && t.cells.values) || []).length) || 0),
                0),
            svg: el.querySelectorAll('.main-svg').length}))""")
        summary = page.eval_on_selector_all("table.summary td.ok, table.summary td.failed",
                                            "cells => cells.map(c => c.textContent)")
        page.screenshot(path=str(_artifacts(capsys) / "report_index.png"), full_page=True)
        page.screenshot(path=str(ARTIFACTS / "report_top.png"))
    finally:
        page.close()
        (ARTIFACTS / "report_console.txt").write_text("".join(f"{k}: {t}\n" for k, t in messages),
                                                      encoding="utf-8")

    assert summary == ["ok"] * len(summary) and summary, f"summary table statuses: {summary}"
    assert len(plots) == len(names), f"{len(plots)} plotly plots on the page, {len(names)} figures in the manifest"
    assert sorted(p["id"] for p in plots) == sorted(f"fig-{n}" for n in names)
    empty = [p["id"] for p in plots if p["traces"] == 0 or p["points"] == 0 or p["svg"] == 0]
    assert not empty, f"plots drawn without data: {empty}"
    assert not _severe(messages), f"console errors on index.html: {_severe(messages)}"


@pytest.mark.timeout(REPRODUCE_LIMIT_S + 300)
def test_notebook_pages_render_their_figures(reproduce_run: Path, browser_context) -> None:
    """Each executed notebook's HTML (linked from index.html) draws its plotly outputs with the run's local
    plotly.js. nbconvert's template also asks a CDN for MathJax/require.js: without a network only those
    loads fail, so only uncaught script errors count here."""
    pages = sorted(reproduce_run.glob("[0-9][0-9]_*.html"))
    assert pages, f"no notebook HTML in {reproduce_run}"
    drawn = {}
    for html_page in pages:
        page, messages = _page(browser_context)
        try:
            page.goto(html_page.as_uri(), wait_until="load")
            expected = page.evaluate("() => document.querySelectorAll('.plotly-graph-div').length")
            _wait_drawn(page, expected)
            drawn[html_page.stem] = (expected, page.evaluate(
                "() => [...document.querySelectorAll('.js-plotly-plot')].filter(e => e._fullData && "
                "e._fullData.length && e.querySelector('.main-svg')).length"))
        finally:
            page.close()
        errors = [m for m in _severe(messages) if m.startswith("pageerror")]
        assert not errors, f"{html_page.name}: uncaught script errors: {errors}"
    assert all(n == k for n, k in drawn.values()) and sum(n for n, _ in drawn.values()) > 0, (
        f"plotly outputs / drawn per page: {drawn}")


# ---------------------------------------------------------------------------------------------- the explorer

def _stop(proc: subprocess.Popen, port: int, token: str) -> None:
    """Shut JupyterLab down through its API (which also stops its kernels), then signal its process group."""
    if proc.poll() is None:
        with contextlib.suppress(OSError):
            req = urllib.request.Request(f"http://127.0.0.1:{port}/api/shutdown", method="POST",
                                         headers={"Authorization": f"token {token}"})
            urllib.request.urlopen(req, timeout=5).close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=15)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


@pytest.fixture
def jupyter_lab(tmp_path: Path):
    """JupyterLab on 127.0.0.1 with a token, serving a copy of the explorer notebook (the original is never
    written to), with its own config, settings, workspace and runtime folders; stopped on teardown."""
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    shutil.copy(EXPLORER_NOTEBOOK, nbdir)
    settings = tmp_path / "lab-settings"
    notif = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notif.parent.mkdir(parents=True)
    notif.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}), encoding="utf-8")
    for d in ("config", "runtime", "workspaces", "ipython"):
        (tmp_path / d).mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("XSTAGE_RUN_DIR", "XSTAGE_NOTEBOOK")}
    env.update(JUPYTER_CONFIG_DIR=str(tmp_path / "config"), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               IPYTHONDIR=str(tmp_path / "ipython"))
    port, token = free_port(), secrets.token_hex(16)
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={nbdir}",
           "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           f"--LabApp.user_settings_dir={settings}", f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    log_path = tmp_path / "jupyterlab.log"
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, cwd=nbdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited ({proc.returncode}):\n{log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not answer within 60 s:\n{log_path.read_text()[-3000:]}")
                time.sleep(0.3)
        yield {"url": f"http://127.0.0.1:{port}/lab/tree/{EXPLORER_NOTEBOOK.name}?token={token}",
               "log": log_path}
    finally:
        _stop(proc, port, token)


def _figure_state(page) -> dict:
    return page.evaluate("""sel => {
        const el = document.querySelector(sel);
        if (!el || !el.data) return null;
        return {traces: el.data.length,
                data: JSON.stringify(el.data.map(t => [Array.from(t.x || []), Array.from(t.y || [])])),
                title: (el.layout && el.layout.title && el.layout.title.text) || ''};
    }""", FIGURE)


@pytest.mark.timeout(300)
def test_explorer_slider_updates_figure(jupyter_lab, browser_context, capsys) -> None:
    out = _artifacts(capsys)
    page, messages = _page(browser_context)
    page.set_viewport_size({"width": 1400, "height": 1800})  # the whole explorer box in one screenshot
    step, run_all_tries = "open JupyterLab", 0
    try:
        page.goto(jupyter_lab["url"], wait_until="domcontentloaded")
        page.wait_for_selector(".jp-Notebook", timeout=90_000)
        step = "wait for the kernel"  # the status bar says "<kernel> | Idle" once it is connected
        page.get_by_text(re.compile(r"\(ipykernel\) \| Idle")).first.wait_for(timeout=90_000)
        step = "run all cells"
        for run_all_tries in range(1, 4):  # a Run All that races the kernel's connection runs nothing: again
            page.get_by_role("menuitem", name="Run", exact=True).click()
            page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
            with contextlib.suppress(PlaywrightTimeout):
                page.wait_for_function("() => [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]"
                                       ".some(p => /\\[(\\*|\\d+)\\]/.test(p.textContent))", timeout=15_000)
                break
        else:
            raise PlaywrightTimeout("Run All Cells did not start any cell (3 tries)")
        step = "wait for the explorer's widgets"
        page.wait_for_selector(FIGURE, timeout=120_000)
        page.wait_for_selector(".xstage-slider-programs .noUi-handle", timeout=30_000)
        page.wait_for_function("sel => { const el = document.querySelector(sel); return el && el.data && "
                               "el.data.length > 0; }", arg=FIGURE, timeout=30_000)
        step = "wait for the last cell"  # it exports the static copy; nothing runs while we move the slider
        page.wait_for_function("() => [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]"
                               ".every(p => /\\[\\d+\\]/.test(p.textContent))", timeout=120_000)
        box = page.locator(".xstage-explorer")
        box.scroll_into_view_if_needed()
        before = _figure_state(page)
        box.screenshot(path=str(out / "explorer_before.png"))
        readout = page.locator(".xstage-slider-programs .widget-readout")
        programs_before = readout.inner_text().strip()

        step = "move the programs slider"
        handle = page.locator(".xstage-slider-programs .noUi-handle")
        handle.focus()
        for _ in range(4):
            handle.press("ArrowRight")
        with contextlib.suppress(PlaywrightTimeout):  # the assertions below say what did not happen
            page.wait_for_function(
                "([sel, old]) => { const el = document.querySelector(sel); return el && el.data && JSON.stringify("
                "el.data.map(t => [Array.from(t.x || []), Array.from(t.y || [])])) !== old; }",
                arg=[FIGURE, before["data"]], timeout=30_000)
        page.wait_for_timeout(500)  # let the last update land before the screenshot
        after = _figure_state(page)
        programs_after = readout.inner_text().strip()
        box.screenshot(path=str(out / "explorer_after.png"))
        page.screenshot(path=str(out / "explorer_lab.png"))
    except PlaywrightTimeout as exc:
        with contextlib.suppress(Exception):
            page.screenshot(path=str(out / "explorer_failure.png"))
        log = jupyter_lab["log"].read_text(encoding="utf-8", errors="replace")[-3000:]
        pytest.fail(f"explorer: timed out at step '{step}' ({str(exc).splitlines()[0]}); screenshot "
                    f"{out / 'explorer_failure.png'}; JupyterLab log tail:\n{log}")
    finally:
        page.close()
        (out / "explorer_console.txt").write_text(f"Run All Cells clicked {run_all_tries} time(s)\n"
                                                  + "".join(f"{k}: {t}\n" for k, t in messages), encoding="utf-8")

    assert before and before["traces"] >= 4, f"explorer figure before the move: {before}"
    assert programs_after != programs_before, f"the slider did not move (programs {programs_before})"
    assert after["data"] != before["data"], (
        f"the figure's data did not change after programs {programs_before} -> {programs_after}")
    assert after["title"] != before["title"] and f"{programs_after} ×" in after["title"], (before["title"],
                                                                                         after["title"])
    assert not _severe(messages), f"console errors in JupyterLab: {_severe(messages)}"
