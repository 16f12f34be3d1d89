"""Figure export and the run folder's report.

A notebook makes a plotly figure and hands it to :func:`export_figure`, which returns it unchanged so the
cell still displays it. When ``XSTAGE_RUN_DIR`` is set (``xstage reproduce`` / ``make reproduce`` set it),
the figure is also written into the run folder::

    <run>/figures/plotly.min.js     one copy of plotly.js shared by every page (no network needed to view)
    <run>/figures/<name>.html       the interactive figure
    <run>/figures/<name>.json       the figure itself (index.html inlines it)
    <run>/figures/<name>.png        static image, when a Chrome/Chromium is there for kaleido (screen size)
    <run>/figures/<name>.print.png  the same at print resolution (XSTAGE_PNG_SCALE, default 3x: ~300 dpi at 7 in)
    <run>/figures/<name>.svg, .pdf  vector copies for papers (XSTAGE_FIGURE_FORMATS picks: png,print,svg,pdf)
    <run>/figures/manifest.jsonl    one JSON line per exported figure: caption, notebook, provenance, paper

:func:`write_index` then writes ``<run>/index.html``: the notebooks' summary table and every figure with its
caption, its provenance and the paper's number beside ours. Outside a run nothing is written.

:func:`write_gallery` (``make figures``: ``python -m xstage.report gallery RUN_DIR``) copies the PNGs of the
main figures (:data:`GALLERY_FIGURES`) into ``docs/figures/`` and rewrites the README's block between
:data:`GALLERY_START` and :data:`GALLERY_END` with each image and its caption from the manifest.
"""
from __future__ import annotations

import datetime as _dt
import html
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from . import env
from .options import error_line

RUN_DIR_ENV = "XSTAGE_RUN_DIR"
NOTEBOOK_ENV = "XSTAGE_NOTEBOOK"
PLOTLY_JS = "plotly.min.js"
MANIFEST = "manifest.jsonl"
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# provenance keys shown first, in this order, under each figure (the rest follow)
_PROVENANCE_ORDER = ("machine", "gpu_name", "gpu_count", "driver", "cuda", "torch", "triton", "python",
                     "git_commit", "date_utc", "source", "command")

STATIC_FORMATS = ("png", "print", "svg", "pdf")  # what XSTAGE_FIGURE_FORMATS may list (default: all)
DEFAULT_PRINT_SCALE = 3.0

_png_note_printed = False
_kaleido_server_started = False


def run_dir() -> Path | None:
    """The run folder from ``XSTAGE_RUN_DIR``, or None outside a reproduce run."""
    value = os.environ.get(RUN_DIR_ENV, "").strip()
    return Path(value) if value else None


def find_chrome() -> str | None:
    """Path of a Chrome/Chromium that kaleido can drive for PNG export, or None."""
    if os.environ.get("BROWSER_PATH"):
        return os.environ["BROWSER_PATH"]
    for exe in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"):
        path = shutil.which(exe)
        if path:
            return path
    try:  # kaleido's own search (typical install locations, a browser it downloaded itself)
        from choreographer.browsers.chromium import Chromium

        return Chromium.find_browser(skip_local=False)
    except Exception:  # noqa: BLE001 - any failure just means "no browser"
        return None


def _note(msg: str) -> None:
    print(f"note: {msg}", file=sys.stderr)


def _default_provenance() -> dict[str, Any]:
    """Where the figure was rendered: machine, GPUs, versions, commit, date (xstage.env.provenance)."""
    try:
        prov = env.provenance(command=f"notebook {os.environ.get(NOTEBOOK_ENV, '?')}", params={})
        prov.pop("params", None)
        return prov
    except Exception as exc:  # noqa: BLE001 - provenance must never break a figure
        import platform

        return {"python": platform.python_version(),
                "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "provenance_error": f"{type(exc).__name__}: {exc}"}


def _jsonable(obj: Any) -> Any:
    try:
        json.dumps(obj)
        return obj
    except TypeError:
        if isinstance(obj, dict):
            return {str(k): _jsonable(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple, set)):
            return [_jsonable(v) for v in obj]
        if hasattr(obj, "item"):  # numpy / torch scalars
            try:
                return obj.item()
            except Exception:  # noqa: BLE001
                pass
        return str(obj)


def _ensure_plotly_js(figdir: Path) -> None:
    target = figdir / PLOTLY_JS
    if target.exists():
        return
    from plotly.offline import get_plotlyjs

    tmp = figdir / f".{PLOTLY_JS}.{os.getpid()}.tmp"
    tmp.write_text(get_plotlyjs(), encoding="utf-8")
    os.replace(tmp, target)  # atomic: two notebooks may race here


def static_formats() -> tuple[str, ...]:
    """The static exports of this run (``XSTAGE_FIGURE_FORMATS``, comma-separated; unknown names are an error)."""
    text = os.environ.get("XSTAGE_FIGURE_FORMATS")
    if text is None:
        return STATIC_FORMATS
    picked = tuple(f.strip().lower() for f in text.split(",") if f.strip())
    bad = [f for f in picked if f not in STATIC_FORMATS]
    if bad:
        raise ValueError(f"XSTAGE_FIGURE_FORMATS: unknown format(s) {bad}; use some of {', '.join(STATIC_FORMATS)}")
    return picked


def print_scale() -> float:
    """PNG scale of ``<name>.print.png`` (``XSTAGE_PNG_SCALE``, a number in (0, 10])."""
    text = os.environ.get("XSTAGE_PNG_SCALE", "").strip()
    if not text:
        return DEFAULT_PRINT_SCALE
    try:
        scale = float(text)
    except ValueError:
        scale = float("nan")
    if not 0 < scale <= 10:
        raise ValueError(f"XSTAGE_PNG_SCALE must be a number in (0, 10], got {text!r}")
    return scale


def _write_png(fig, path: Path, scale: float | None = None) -> bool:
    """A static image through kaleido (format from the suffix: .png, .svg, .pdf); False (with one note line)
    when no browser or export fails."""
    global _png_note_printed, _kaleido_server_started
    if os.environ.get("XSTAGE_NO_PNG"):
        return False
    chrome = find_chrome()
    if not chrome:
        if not _png_note_printed:
            _note("PNG export skipped: no Chrome/Chromium found for kaleido (install Debian's 'chromium' or set "
                  "BROWSER_PATH); the HTML figures are written anyway.")
            _png_note_printed = True
        return False
    os.environ.setdefault("BROWSER_PATH", chrome)
    try:
        if not _kaleido_server_started:
            try:
                import kaleido

                kaleido.start_sync_server(silence_warnings=True)  # one browser for all figures: ~0.2 s each
            except Exception:  # noqa: BLE001 - fall back to a browser per image
                pass
            _kaleido_server_started = True
        import warnings

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The kopts argument is ignored")  # plotly+kaleido server
            fig.write_image(str(path), **({} if scale is None else {"scale": scale}))
        return True
    except Exception as exc:  # noqa: BLE001
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        _note(f"export of {path.name} skipped: {type(exc).__name__}: {first}")
        return False


def export_figure(fig, name: str, caption: str, provenance: dict | None = None, paper: str | None = None,
                  *, ours: str | None = None):
    """Write ``fig`` into the run folder (if any) and return it, so a cell can end with this call.

    name:       file stem, e.g. ``"fig3_backpressure"`` (letters, digits, ``_ . -``).
    caption:    one or two sentences shown under the figure in index.html.
    provenance: where the numbers came from, e.g. the JSON sidecar of the recorded data; its keys override
                the rendering machine's (machine, GPU, versions, commit, date) collected here.
    paper:      the paper's number for this figure, e.g. ``"1.18x geomean, 1.62x max (84 configs)"``.
    ours:       our number for the same quantity, shown beside the paper's.
    """
    run = run_dir()
    if run is None:
        return fig
    if not _NAME_RE.fullmatch(name):
        raise ValueError(f"figure name {name!r}: use letters, digits, '_', '.', '-' (it becomes a file name)")
    figdir = run / "figures"
    figdir.mkdir(parents=True, exist_ok=True)
    _ensure_plotly_js(figdir)
    fig.write_html(str(figdir / f"{name}.html"), include_plotlyjs=PLOTLY_JS, full_html=True,
                   div_id=f"fig-{name}")
    (figdir / f"{name}.json").write_text(fig.to_json(), encoding="utf-8")
    formats = static_formats()
    scale = print_scale()
    png = "png" in formats and _write_png(fig, figdir / f"{name}.png")
    static = {}
    for key, fname, kw in (("png_print", f"{name}.print.png", {"scale": scale}), ("svg", f"{name}.svg", {}),
                           ("pdf", f"{name}.pdf", {})):
        wanted = ("print" if key == "png_print" else key) in formats
        static[key] = f"figures/{fname}" if wanted and _write_png(fig, figdir / fname, **kw) else None

    prov = _default_provenance()
    prov.update(provenance or {})
    record = {
        "name": name,
        "caption": caption,
        "notebook": os.environ.get(NOTEBOOK_ENV) or None,
        "provenance": _jsonable(prov),
        "paper": None if paper is None else str(paper),
        "ours": None if ours is None else str(ours),
        "html": f"figures/{name}.html",
        "json": f"figures/{name}.json",
        "png": f"figures/{name}.png" if png else None,
        **static,
        "exported_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    with open(figdir / MANIFEST, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, sort_keys=False) + "\n")
    return fig


def export_goals(goals, notebook: str | None = None):
    """Record a study's goals for index.html's goals table and return ``goals`` unchanged (a cell can display
    it). Rows (a DataFrame or a list of dicts) carry ``quantity``, ``ours`` and any of ``paper`` (the paper's
    number, a comparison), ``goal`` (e.g. ``">= 1.3"``) and ``met`` (True / False / None: no value). The table
    of :func:`xstage.megamoe_analysis.goals` (``target``) is read as: the paper's number where the quantity
    says "paper", else a goal ``ours >= target``; its dtype and schedule go into the quantity. Outside a run
    nothing is written; a notebook's later export replaces its earlier one.
    """
    run = run_dir()
    if run is None:
        return goals
    records = goals.to_dict("records") if hasattr(goals, "to_dict") else [dict(r) for r in goals]
    rows = []
    for r in records:
        quantity = str(r.get("quantity", ""))
        detail = ", ".join(str(r[k]) for k in ("dtype", "schedule") if r.get(k) is not None)
        paper, goal = r.get("paper"), r.get("goal")
        if "target" in r and paper is None and goal is None:
            if "paper" in quantity:
                paper = r["target"]
            elif r["target"] is not None:
                goal = f">= {float(r['target']):g}"
        met = r.get("met")
        rows.append({"quantity": quantity + (f" [{detail}]" if detail else ""), "paper": _jsonable(paper),
                     "ours": _jsonable(r.get("ours")), "goal": _jsonable(goal),
                     "met": None if met is None or met != met else bool(met)})
    nb = notebook or os.environ.get(NOTEBOOK_ENV) or "notebook"
    figdir = run / "figures"
    figdir.mkdir(parents=True, exist_ok=True)
    (figdir / f"goals-{nb}.json").write_text(json.dumps({"notebook": nb, "rows": rows}, indent=1),
                                            encoding="utf-8")
    return goals


def read_goals(run: Path) -> list[dict]:
    """Every notebook's goal rows of a run (``figures/goals-*.json``), each with its notebook."""
    out = []
    for path in sorted((Path(run) / "figures").glob("goals-*.json")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            continue
        out += [{"notebook": doc.get("notebook"), **row} for row in doc.get("rows", [])]
    return out


def _number(x: Any) -> str:
    if isinstance(x, float):
        return "—" if x != x else f"{x:.3g}"
    return "—" if x is None else str(x)


def _goals_html(rows: list[dict]) -> str:
    head = "".join(f"<th>{c}</th>" for c in ("notebook", "quantity", "paper", "ours", "goal", "met"))
    body = []
    for r in rows:
        met = {True: ("yes", "ok"), False: ("no", "failed")}.get(r.get("met"), ("—", ""))
        body.append(f"<tr><td>{_e(r.get('notebook'))}</td><td>{_e(r.get('quantity'))}</td>"
                    f"<td>{_e(_number(r.get('paper')))}</td><td>{_e(_number(r.get('ours')))}</td>"
                    f"<td>{_e(_number(r.get('goal')))}</td><td class='{met[1]}'>{met[0]}</td></tr>")
    return f"<table class='goals'><tr>{head}</tr>{''.join(body)}</table>"


# ---------------------------------------------------------------------------------------------- index.html

def read_manifest(run: Path) -> list[dict]:
    """Figures of a run, last export of each name wins, in first-export order."""
    path = Path(run) / "figures" / MANIFEST
    if not path.exists():
        return []
    records: dict[str, dict] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            rec = json.loads(line)
            records[rec["name"]] = rec
    return list(records.values())


def _read_summary(run: Path) -> list[dict]:
    path = Path(run) / "summary.csv"
    if not path.exists():
        return []
    import csv

    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def _provenance_html(prov: dict) -> str:
    if not prov:
        return ""
    keys = [k for k in _PROVENANCE_ORDER if k in prov] + [k for k in prov if k not in _PROVENANCE_ORDER]
    def cell(v: Any) -> str:
        return _e(json.dumps(v) if isinstance(v, (dict, list)) else v)

    rows = "".join(f"<tr><th>{_e(k)}</th><td>{cell(prov[k])}</td></tr>" for k in keys)
    gpu = prov.get("gpu_name")
    short = " · ".join(_e(x) for x in (
        prov.get("machine"),
        f"{gpu} x{prov.get('gpu_count')}" if gpu and gpu != "none" else None,
        f"torch {prov['torch']}" if prov.get("torch") else None,
        f"triton {prov['triton']}" if prov.get("triton") else None,
        prov.get("date_utc"),
    ) if x)
    return f"<details class='prov'><summary>provenance: {short}</summary><table>{rows}</table></details>"


def _figure_html(run: Path, rec: dict) -> str:
    name = rec["name"]
    body = ""
    jpath = run / rec.get("json", f"figures/{name}.json")
    if jpath.exists():
        try:
            import plotly.io as pio

            fig = pio.from_json(jpath.read_text(encoding="utf-8"))
            body = pio.to_html(fig, include_plotlyjs=False, full_html=False, div_id=f"fig-{name}")
        except Exception:  # noqa: BLE001 - fall back to the standalone page
            body = ""
    if not body:
        body = f"<iframe src='{_e(rec.get('html'))}' loading='lazy'></iframe>"
    links = [f"<a href='{_e(rec.get('html'))}'>html</a>"]
    for key, label in (("png", "png"), ("png_print", "png (print)"), ("svg", "svg"), ("pdf", "pdf")):
        if rec.get(key):
            links.append(f"<a href='{_e(rec[key])}'>{label}</a>")
    numbers = ""
    if rec.get("paper") or rec.get("ours"):
        numbers = ("<table class='numbers'><tr><th>paper</th><th>ours</th></tr>"
                   f"<tr><td>{_e(rec.get('paper') or '—')}</td><td>{_e(rec.get('ours') or '(see figure)')}</td></tr>"
                   "</table>")
    nb = f" <span class='nb'>from {_e(rec['notebook'])}</span>" if rec.get("notebook") else ""
    return (f"<section class='figure' id='{_e(name)}'><h3>{_e(name)}{nb}</h3>{body}"
            f"<p class='caption'>{_e(rec.get('caption'))}</p>{numbers}"
            f"{_provenance_html(rec.get('provenance') or {})}<p class='links'>{' · '.join(links)}</p></section>")


_CSS = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0}th,td{border:1px solid #ccc;padding:3px 8px;text-align:left}
.summary td.failed,.goals td.failed{color:#b00;font-weight:bold}.summary td.ok,.goals td.ok{color:#070}
.summary td.skipped{color:#777}.summary td.error{color:#b00;font-family:monospace;font-size:.85em}
.figure{border-top:1px solid #ddd;margin-top:1.5em;padding-top:.5em}.nb{font-weight:normal;color:#666;font-size:.8em}
.caption{font-style:italic}.prov{font-size:.85em;color:#444}.numbers td{font-weight:bold}
iframe{width:100%;height:520px;border:0}
"""


def write_index(run: Path) -> Path:
    """Write ``<run>/index.html``: the notebooks' summary table, then every exported figure."""
    run = Path(run)
    run.mkdir(parents=True, exist_ok=True)
    figures = read_manifest(run)
    summary = _read_summary(run)
    meta = {}
    if (run / "run.json").exists():
        try:
            meta = json.loads((run / "run.json").read_text(encoding="utf-8"))
        except ValueError:
            meta = {}

    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>xstage run {_e(run.name)}</title>"
             f"<style>{_CSS}</style>"]
    if figures and (run / "figures" / PLOTLY_JS).exists():
        parts.append(f"<script src='figures/{PLOTLY_JS}'></script>")
    parts.append(f"</head><body><h1>xstage run {_e(run.name)}</h1>")
    if meta:
        keys = ("started_utc", "host", "python", "git_commit", "only")
        bits = [f"{_e(k)}: {_e(meta[k])}" for k in keys if meta.get(k)]
        if meta.get("parameters"):
            bits.append(f"parameters: {_e(json.dumps(meta['parameters']))}")
        parts.append("<p>" + "<br>".join(bits) + "</p>")

    parts.append("<h2>Notebooks</h2>")
    if summary:
        cols = [c for c in ("notebook", "source", "seconds", "status") if c in summary[0]]
        parts.append("<table class='summary'><tr>" + "".join(f"<th>{_e(c)}</th>" for c in cols)
                     + "<th>error / note</th></tr>")
        for row in summary:
            cells = []
            for c in cols:
                val = row.get(c, "")
                if c == "notebook" and (run / f"{val}.html").exists():
                    cells.append(f"<td><a href='{_e(val)}.html'>{_e(val)}</a></td>")
                elif c == "status":
                    cls = val if val in ("ok", "skipped") else "failed"
                    title = f" title='{_e(row.get('error'))}'" if row.get("error") else ""
                    cells.append(f"<td class='{cls}'{title}>{_e(val)}</td>")
                else:
                    cells.append(f"<td>{_e(val)}</td>")
            if row.get("error"):  # a failed notebook's error, in full (its HTML page has the traceback)
                cells.append(f"<td class='error'>{_e(row['error'])}</td>")
            else:
                cells.append(f"<td>{_e(row.get('note') or '')}</td>")
            parts.append("<tr>" + "".join(cells) + "</tr>")
        parts.append("</table>")
    else:
        parts.append("<p>(no summary.csv in this run)</p>")

    goals = read_goals(run)
    if goals:
        parts.append("<h2>Goals</h2><p>Per study: the paper's number (a comparison: eight GPUs), ours, the "
                     "goal we hold ourselves to and whether it is met (— where there is no goal or no value).</p>")
        parts.append(_goals_html(goals))

    parts.append(f"<h2>Figures ({len(figures)})</h2>")
    if not figures:
        parts.append("<p>No figure was exported in this run.</p>")
    parts.extend(_figure_html(run, rec) for rec in figures)
    parts.append("</body></html>")
    out = run / "index.html"
    out.write_text("\n".join(parts), encoding="utf-8")
    return out


# ---------------------------------------------------------------------------------------------- README gallery

GALLERY_START = "<!-- gallery: regenerated by `make figures`, never edited by hand -->"
GALLERY_END = "<!-- /gallery -->"
# the README's main figures, in this order (names as exported by the notebooks)
GALLERY_FIGURES = ("00_model_train", "01_issue_vs_burst", "01_burst_train", "01_bandwidth", "02_parity", "02_onset",
                   "03_pcie_speedup", "03_pcie_model", "03_speedup", "04_speedup", "04_tflops")
GALLERY_MAX_BYTES = 300_000


def _md(text: Any) -> str:
    """Plain text for Markdown: characters that would start markup are escaped."""
    return re.sub(r"([\\`*\[\]<>])", r"\\\1", "" if text is None else " ".join(str(text).split()))


def gallery_markdown(records: list[dict], dest_rel: str) -> str:
    """The README block between the gallery markers: each figure's PNG under ``dest_rel`` and its caption."""
    machines = sorted({str(r.get("provenance", {}).get("machine")) for r in records
                       if r.get("provenance", {}).get("machine")})
    sources = sorted({str(r.get("provenance", {}).get("source")) for r in records
                      if r.get("provenance", {}).get("source")})
    where = ", ".join(f"`data/{m}/`" for m in machines) or "the recorded data"
    lines = ["## Figures", "",
             f"The main figures of `make reproduce`, made from {where}"
             + (f" (source: {', '.join(sources)})" if sources else "")
             + ". Every figure, interactive, with its provenance is in a run's `index.html`.", ""]
    for rec in records:
        name = rec["name"]
        lines.append(f"**{_md(name)}** ({_md(rec.get('notebook') or '')}): {_md(rec.get('caption'))}")
        numbers = [f"{label}: {_md(rec[key])}" for key, label in (("ours", "ours"), ("paper", "paper"))
                   if rec.get(key)]
        if numbers:
            lines[-1] += " — " + "; ".join(numbers)
        lines += ["", f"![{name}]({dest_rel}/{name}.png)", ""]
    return "\n".join(lines).rstrip() + "\n"


def replace_gallery(readme_text: str, block: str) -> str:
    """``readme_text`` with the lines between GALLERY_START and GALLERY_END replaced by ``block``; the end
    marker is added after the start marker when missing. ValueError when the start marker is not there."""
    lines = readme_text.splitlines(keepends=True)
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == GALLERY_START)
    except StopIteration:
        raise ValueError(f"README has no line {GALLERY_START!r}: add it where the gallery goes") from None
    end = next((i for i in range(start + 1, len(lines)) if lines[i].strip() == GALLERY_END), None)
    tail = lines[end + 1:] if end is not None else lines[start + 1:]
    body = "\n" + block.strip("\n") + "\n\n"
    return "".join(lines[: start + 1]) + body + GALLERY_END + "\n" + "".join(tail)


def write_gallery(run: Path, readme: Path, dest: Path, names: tuple[str, ...] | list[str] = GALLERY_FIGURES,
                  max_bytes: int = GALLERY_MAX_BYTES) -> list[Path]:
    """Copy the PNGs of ``names`` from a run into ``dest`` and rewrite the README's gallery block.

    Other ``*.png`` in ``dest`` are removed (the folder holds only the gallery). Raises ValueError, before
    anything is written, when a figure is not in the run, has no PNG (no Chrome/Chromium for kaleido) or is
    larger than ``max_bytes``.
    """
    run, readme, dest = Path(run), Path(readme), Path(dest)
    by_name = {rec["name"]: rec for rec in read_manifest(run)}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise ValueError(f"figures not in {run / 'figures' / MANIFEST}: {', '.join(missing)} "
                         f"(exported: {', '.join(by_name) or 'none'})")
    no_png = [n for n in names if not (by_name[n].get("png") and (run / by_name[n]["png"]).is_file())]
    if no_png:
        raise ValueError(f"no PNG for {', '.join(no_png)} in {run}: PNG export needs a Chrome/Chromium for "
                         "kaleido (Debian: apt-get install chromium)")
    big = {n: (run / by_name[n]["png"]).stat().st_size for n in names}
    big = {n: b for n, b in big.items() if b > max_bytes}
    if big:
        raise ValueError(f"PNGs over {max_bytes} bytes: " + ", ".join(f"{n} ({b})" for n, b in big.items()))
    records = [by_name[n] for n in names]
    try:
        dest_rel = dest.resolve().relative_to(readme.resolve().parent).as_posix()
    except ValueError:
        raise ValueError(f"{dest} is not inside {readme.parent}: the README needs relative paths") from None
    text = replace_gallery(readme.read_text(encoding="utf-8"), gallery_markdown(records, dest_rel))

    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for rec in records:
        target = dest / f"{rec['name']}.png"
        shutil.copyfile(run / rec["png"], target)
        written.append(target)
    for stale in dest.glob("*.png"):
        if stale not in written:
            stale.unlink()
    readme.write_text(text, encoding="utf-8")
    return written


def main(argv: list[str] | None = None) -> int:
    import argparse

    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] != "gallery" and not argv[0].startswith("-"):
        argv = ["index", *argv]  # python -m xstage.report RUN_DIR (the old form)
    ap = argparse.ArgumentParser(prog="python -m xstage.report", description="Rewrite a run's index.html, or "
                                 "copy its main figures into the README's gallery.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    ix = sub.add_parser("index", help="(re)write RUN_DIR/index.html")
    ix.add_argument("run", type=Path, metavar="RUN_DIR")
    ga = sub.add_parser("gallery", help="copy RUN_DIR's main PNGs into DEST and rewrite README's gallery block")
    ga.add_argument("run", type=Path, metavar="RUN_DIR")
    ga.add_argument("--readme", type=Path, default=Path("README.md"))
    ga.add_argument("--dest", type=Path, default=Path("docs/figures"))
    ga.add_argument("--figures", default=",".join(GALLERY_FIGURES),
                    help="comma-separated figure names, in order (default: %(default)s)")
    args = ap.parse_args(argv)
    if args.cmd == "index":
        print(write_index(args.run))
        return 0
    try:
        names = [n.strip() for n in args.figures.split(",") if n.strip()]
        written = write_gallery(args.run, args.readme, args.dest, names)
    except (ValueError, OSError) as exc:
        return error_line("xstage report", exc)
    for path in written:
        print(f"{path}  {path.stat().st_size // 1024} KiB")
    print(f"{args.readme}: gallery block rewritten ({len(written)} figures)")
    return 0


if __name__ == "__main__":  # python -m xstage.report RUN_DIR | gallery RUN_DIR [--readme R] [--dest D]
    raise SystemExit(main())
