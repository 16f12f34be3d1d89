"""Reproduce the figures: run every study notebook into a fresh run folder and write its report.

    python -m xstage.reproduce                       # all notebooks/NN_*.ipynb, source=auto
    python -m xstage.reproduce --only 02 -p n_bootstrap 200
    python -m xstage.reproduce -f params.yaml --source recorded

Each run gets ``runs/<UTC timestamp>/`` (or ``--out``) holding the executed notebooks and their HTML, the
figures (see xstage.report), ``summary.csv``, ``run.json`` and ``index.html``. Overrides are checked against
every selected notebook's ``parameters`` cell before anything runs: an unknown name or a value that does not
convert to the declared type exits with status 2 and one line. A failing notebook does not stop the others;
the exit status is 1 if any failed. A notebook whose ``source`` comment lists its values (``# auto | gpu |
recorded``) and lacks the requested one is skipped with a note, not run.

Inside a notebook, the cell after ``parameters`` calls :func:`check_parameters` (the same validator), so a
direct ``papermill`` run with an unknown or ill-typed parameter also stops at once with one line naming it.
"""
from __future__ import annotations

import argparse
import ast
import datetime as _dt
import json
import os
import platform
import re
import sys
import time
from pathlib import Path
from typing import Any

from xstage.env import REPO_ROOT, SOURCES, git_commit, resolve_source
from xstage import __version__, report
from xstage.options import OneLineParser, error_line
from xstage.report import PLOTLY_JS, _ensure_plotly_js, read_manifest, write_index

NOTEBOOK_GLOB = "[0-9][0-9]_*.ipynb"
DEFAULT_SOURCE = "auto"
_PKG_PARENT = REPO_ROOT  # the repo root in a checkout / editable install


class ParameterError(ValueError):
    """A bad override: unknown name, or a value that does not fit the declared type."""

    def _render_traceback_(self) -> list[str]:  # IPython/papermill show this one line instead of a traceback
        return [f"ParameterError: {self}"]


# ------------------------------------------------------------------------------------------- discovery

def repo_root() -> Path:
    """The checkout this package lives in; the current directory when installed elsewhere."""
    return _PKG_PARENT if (_PKG_PARENT / "notebooks").is_dir() else Path.cwd()


def discover_notebooks(directory: Path | None = None, only: list[str] | None = None) -> list[Path]:
    """``notebooks/NN_*.ipynb`` sorted; ``only`` keeps those whose name contains any of the given strings."""
    directory = Path(directory) if directory else repo_root() / "notebooks"
    if not directory.is_dir():
        raise ParameterError(f"notebook folder {directory} does not exist")
    found = sorted(directory.glob(NOTEBOOK_GLOB))
    if not found:
        raise ParameterError(f"no notebooks matching {NOTEBOOK_GLOB} in {directory}")
    if only:
        wanted = [w.strip().lower() for item in only for w in item.split(",") if w.strip()]
        unmatched = [w for w in wanted if not any(w in p.stem.lower() for p in found)]
        if unmatched or not wanted:
            raise ParameterError(f"--only {','.join(unmatched) or repr('')} matches no notebook "
                                 f"(available: {', '.join(p.stem for p in found)})")
        picked = [p for p in found if any(w in p.stem.lower() for w in wanted)]
        found = picked
    return found


# ------------------------------------------------------------------------------------------- parameter types

_SIMPLE = {"int": "int", "float": "float", "bool": "bool", "str": "str", "list": "list", "tuple": "list",
           "sequence": "list", "dict": "dict", "mapping": "dict"}


def _split_optional(ann: str) -> tuple[str, bool]:
    ann = ann.strip()
    m = re.fullmatch(r"(?:typing\.)?Optional\[(.*)\]", ann)
    if m:
        return m.group(1).strip(), True
    m = re.fullmatch(r"(?:typing\.)?Union\[(.*)\]", ann)
    parts = [p.strip() for p in (m.group(1) if m else ann).split("|" if not m else ",")]
    if len(parts) > 1 and any(p in ("None", "NoneType") for p in parts):
        rest = [p for p in parts if p not in ("None", "NoneType")]
        if len(rest) == 1:
            return rest[0], True
    return ann, False


def _from_annotation(ann: str) -> str | None:
    """'int', 'list[int]', 'Optional[float]', 'str | None' ... -> a type spec; None if not understood."""
    base, optional = _split_optional(ann)
    base = re.sub(r"^(typing|collections\.abc)\.", "", base)
    m = re.fullmatch(r"(\w+)(?:\[(.*)\])?", base)
    if not m:
        return None
    head, inner = m.group(1).lower(), m.group(2)
    kind = _SIMPLE.get(head)
    if kind is None:
        return None
    if kind == "list" and inner:
        elem = _from_annotation(inner.split(",")[0])  # tuple[int, ...] -> int
        if elem in ("int", "float", "bool", "str"):
            kind = f"list[{elem}]"
    return f"{kind} | None" if optional else kind


def _from_default(default: str | None) -> str:
    try:
        value = ast.literal_eval(default) if default is not None else None
    except (ValueError, SyntaxError, TypeError):
        return "any"
    if value is None:
        return "any"
    for typ, name in ((bool, "bool"), (int, "int"), (float, "float"), (str, "str"), (dict, "dict")):
        if isinstance(value, typ):
            return name
    if isinstance(value, (list, tuple)):
        kinds = {_from_default(repr(v)) for v in value}
        if len(kinds) == 1 and (k := kinds.pop()) in ("int", "float", "bool", "str"):
            return f"list[{k}]"
        if kinds == {"int", "float"}:
            return "list[float]"
        return "list"
    return "any"


def declared_type(param: dict) -> str:
    """Type spec of one ``papermill.inspect_notebook`` entry: its annotation, else its default's type."""
    ann = param.get("inferred_type_name")
    if ann and ann != "None":
        spec = _from_annotation(ann)
        if spec:
            return spec
    return _from_default(param.get("default"))


_TRUE = {"true", "yes", "on", "1", "y", "t"}
_FALSE = {"false", "no", "off", "0", "n", "f"}


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError):
        try:
            import yaml

            return yaml.safe_load(text)
        except Exception:  # noqa: BLE001
            return text


def _convert(value: Any, spec: str) -> Any:
    """Convert ``value`` (a CLI string or a YAML value) to ``spec``; raise ValueError if it does not fit."""
    if spec.endswith(" | None"):
        if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null", "")):
            return None
        return _convert(value, spec[: -len(" | None")])
    if spec == "any":
        return _literal(value) if isinstance(value, str) else value
    if spec == "int":
        if isinstance(value, bool):
            raise ValueError
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            text = value.strip()
            try:
                return int(text)
            except ValueError:
                return int(text, 0)  # 0x40, 1_024
        raise ValueError
    if spec == "float":
        if isinstance(value, bool):
            raise ValueError
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            return float(value.strip())
        raise ValueError
    if spec == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise ValueError
    if spec == "str":
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ValueError
    if spec == "dict":
        if isinstance(value, str):
            value = _literal(value)
        if isinstance(value, dict):
            return value
        raise ValueError
    if spec.startswith("list"):
        elem = spec[5:-1] if spec.startswith("list[") else "any"
        if isinstance(value, str):
            text = value.strip()
            parsed = _literal(text) if text.startswith(("[", "(")) else None
            if isinstance(parsed, (list, tuple)):
                items = list(parsed)
            elif text == "":
                items = []
            else:  # "1,2,4" or a single value
                items = [t.strip() for t in text.split(",")]
        elif isinstance(value, (list, tuple)):
            items = list(value)
        elif value is not None and not isinstance(value, dict):
            items = [value]
        else:
            raise ValueError
        return [_convert(v, elem) for v in items]
    raise ValueError(f"unsupported type {spec}")


def convert_value(name: str, value: Any, spec: str) -> Any:
    """``_convert`` with the user-facing message: ``parameter 'x' expects int, got 'banana'``."""
    try:
        out = _convert(value, spec)
    except (ValueError, TypeError, OverflowError):
        raise ParameterError(f"parameter {name!r} expects {spec}, got {value!r}") from None
    if name == "source" and out not in SOURCES:
        raise ParameterError(f"parameter 'source' expects one of {', '.join(SOURCES)}, got {value!r}")
    return out


def _ast_parameters(notebook: Path) -> dict[str, dict]:
    """Top-level assignments of the ``parameters`` cell, in papermill's entry format (a fallback)."""
    import nbformat

    nb = nbformat.read(str(notebook), as_version=4)
    cell = next((c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])), None)
    if cell is None:
        return {}
    try:
        tree = ast.parse(cell.source)
    except SyntaxError:  # magics etc.: papermill's answer stands
        return {}
    found = {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            name, ann = node.target.id, ast.unparse(node.annotation)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, ann = node.targets[0].id, "None"
        else:
            continue
        found[name] = {"name": name, "inferred_type_name": ann, "help": "",
                       "default": ast.get_source_segment(cell.source, node.value)}
    return found


def inspect_parameters(notebook: Path) -> dict[str, dict]:
    """Declared parameters of a notebook: name -> papermill's entry plus ``type`` (our type spec)."""
    import papermill

    params = papermill.inspect_notebook(str(notebook))
    for name, entry in _ast_parameters(notebook).items():
        params.setdefault(name, entry)  # papermill skips e.g. `x: int | None = None`
    for entry in params.values():
        entry["type"] = declared_type(entry)
    return params


def resolve_parameters(notebooks: list[Path], overrides: dict[str, Any],
                       declared: dict[Path, dict[str, dict]] | None = None) -> dict[Path, dict[str, Any]]:
    """Per-notebook parameters to inject, validated before anything runs.

    Each override goes to the notebooks that declare it, converted to that notebook's declared type;
    ``source`` is injected as ``auto`` into notebooks that declare it unless overridden.
    Raises ParameterError for a name no selected notebook declares or a value that does not convert.
    """
    declared = declared if declared is not None else {nb: inspect_parameters(nb) for nb in notebooks}
    valid = sorted({name for params in declared.values() for name in params})
    for name in overrides:
        if name not in valid:
            raise ParameterError(f"unknown parameter {name!r}: no selected notebook declares it "
                                 f"(valid: {', '.join(valid) or 'none'})")
    resolved: dict[Path, dict[str, Any]] = {}
    for nb in notebooks:
        params = declared[nb]
        inject = {}
        if "source" in params and "source" not in overrides:
            inject["source"] = DEFAULT_SOURCE
        for name, value in overrides.items():
            if name in params:
                inject[name] = convert_value(name, value, params[name]["type"])
        resolved[nb] = inject
    return resolved


def source_choices(entry: dict | None) -> tuple[str, ...] | None:
    """The values a notebook's ``source`` takes, from its comment (``# auto | gpu | recorded (...)``); None
    when the comment does not list them (then every source is allowed)."""
    if not entry:
        return None
    head = re.split(r"[:(]", entry.get("help") or "", maxsplit=1)[0]
    values = tuple(v.strip() for v in head.split("|"))
    return values if len(values) > 1 and all(v in SOURCES for v in values) else None


def skip_reasons(notebooks: list[Path], params: dict[Path, dict[str, Any]],
                 declared: dict[Path, dict[str, dict]]) -> dict[Path, str]:
    """Notebooks that do not take the requested ``source`` (e.g. no simulated source): notebook -> a note."""
    out = {}
    for nb in notebooks:
        choices = source_choices(declared[nb].get("source"))
        value = params[nb].get("source")
        if choices and value is not None and value not in choices:
            out[nb] = f"skipped: no {value} source (source: {' | '.join(choices)})"
    return out


def _injected_names(namespace: dict) -> list[str] | None:
    """Names papermill injected (its ``# Parameters`` cell, found in IPython's input history), or None."""
    history = namespace.get("In") or namespace.get("_ih") or []
    for source in reversed(list(history)):
        if isinstance(source, str) and source.lstrip().startswith("# Parameters"):
            try:
                tree = ast.parse(source)
            except SyntaxError:
                return None
            return [t.id for node in tree.body if isinstance(node, ast.Assign)
                    for t in node.targets if isinstance(t, ast.Name)]
    return None


def check_parameters(namespace: dict, notebook: str | Path) -> None:
    """Validate a notebook's parameters from inside it (the cell after ``parameters``), as ``xstage
    reproduce`` does before running it: an injected name the notebook does not declare, a value that does not
    convert to the declared type, or a ``source`` the notebook does not take raises ParameterError with one
    line naming the parameter. Converted values are written back (``-r n 200`` gives the int 200).

    notebook: the notebook's name (``"03_megamoe_84"``) or path; by name it is looked up in the working
    folder (where papermill runs it), then in the checkout's notebooks/.
    """
    path = Path(notebook)
    if path.suffix != ".ipynb":
        path = path.with_suffix(".ipynb")
    if not path.is_file():
        candidates = [Path.cwd() / path.name, repo_root() / "notebooks" / path.name]
        path = next((c for c in candidates if c.is_file()), candidates[-1])
    if not path.is_file():
        raise ParameterError(f"notebook {notebook!r} not found (looked in {Path.cwd()} and "
                             f"{repo_root() / 'notebooks'})")
    declared = inspect_parameters(path)
    injected = _injected_names(namespace) or []  # none: not run by papermill (JupyterLab), nothing injected
    unknown = [n for n in injected if n not in declared]
    if unknown:
        raise ParameterError(f"unknown parameter {unknown[0]!r} for {path.stem} "
                             f"(valid: {', '.join(declared) or 'none'})")
    for name, entry in declared.items():
        if name not in namespace or entry["type"] == "any":
            continue
        value = convert_value(name, namespace[name], entry["type"])
        choices = source_choices(entry) if name == "source" else None
        if choices and value not in choices:
            raise ParameterError(f"parameter 'source' of {path.stem} expects one of {', '.join(choices)}, "
                                 f"got {value!r}")
        namespace[name] = value


def load_parameters_file(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ParameterError(f"cannot read parameters file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ParameterError(f"parameters file {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise ParameterError(f"parameters file {path} must be a mapping of parameter name to value")
    return data


# ------------------------------------------------------------------------------------------- running

def _new_run_dir(base: Path) -> Path:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    run = base / stamp
    i = 1
    while run.exists():
        run = base / f"{stamp}-{i}"
        i += 1
    run.mkdir(parents=True)
    return run


PLOTLY_MIME = "application/vnd.plotly.v1+json"


def _plotly_outputs_as_html(nb) -> bool:
    """Give plotly's mimetype-only outputs an HTML rendering (nbconvert cannot draw the mimetype)."""
    import plotly.io as pio

    found = False
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if PLOTLY_MIME in data and "text/html" not in data:
                data["text/html"] = pio.to_html(dict(data[PLOTLY_MIME]), include_plotlyjs=False,
                                                full_html=False, validate=False, default_height=525)
                found = True
    return found


def slim(nb) -> bool:
    """Drop the saved widget state (``metadata.widgets``: ~10 MB of plotly.js per widget notebook) from an
    executed notebook; the run folder keeps each figure as its own HTML beside one shared plotly.js."""
    return nb.metadata.pop("widgets", None) is not None


def _to_html(executed: Path) -> None:
    """``<run>/<notebook>.html``; plotly figures use the run's one ``figures/plotly.min.js`` (works offline).
    The executed notebook is slimmed first (:func:`slim`), so a run folder stays small."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(executed), as_version=4)
    if slim(nb):
        nbformat.write(nb, str(executed))
    has_plotly = _plotly_outputs_as_html(nb)
    body, _ = HTMLExporter().from_notebook_node(nb)
    if has_plotly:
        figdir = executed.parent / "figures"
        figdir.mkdir(exist_ok=True)
        _ensure_plotly_js(figdir)
        body = body.replace("</head>", f'<script src="figures/{PLOTLY_JS}"></script>\n</head>', 1)
    executed.with_suffix(".html").write_text(body, encoding="utf-8")


def _error_line(exc: BaseException) -> str:
    ename, evalue = getattr(exc, "ename", None), getattr(exc, "evalue", None)
    if ename:  # papermill.PapermillExecutionError: the notebook's own exception
        return f"{ename}: {evalue}".strip().splitlines()[0]
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def execute(notebooks: list[Path], params: dict[Path, dict[str, Any]], run: Path, timeout: int) -> list[dict]:
    """Run each notebook with papermill into ``run``; never stops on a failure. Returns the summary rows."""
    import papermill
    from tqdm.auto import tqdm

    rows = []
    saved = {k: os.environ.get(k) for k in ("XSTAGE_RUN_DIR", "XSTAGE_NOTEBOOK", "PYTHONPATH")}
    os.environ["XSTAGE_RUN_DIR"] = str(run.resolve())
    # the kernel imports the same xstage as this process, installed or not
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(_PKG_PARENT), saved["PYTHONPATH"]) if p)
    try:
        bar = tqdm(notebooks, desc="notebooks", unit="nb", file=sys.stderr)
        for nb in bar:
            bar.set_postfix_str(nb.stem)
            os.environ["XSTAGE_NOTEBOOK"] = nb.stem
            out = run / nb.name
            t0 = time.perf_counter()
            status, error = "ok", ""
            try:
                papermill.execute_notebook(str(nb), str(out), parameters=params[nb], kernel_name="python3",
                                           execution_timeout=timeout, progress_bar=False, cwd=str(nb.parent))
            except Exception as exc:  # noqa: BLE001 - one failing notebook must not stop the others
                status, error = "failed", _error_line(exc)
            seconds = round(time.perf_counter() - t0, 1)
            if out.exists():
                try:
                    _to_html(out)
                except Exception as exc:  # noqa: BLE001
                    tqdm.write(f"note: HTML of {out.name} not written: {_error_line(exc)}", file=sys.stderr)
            src = params[nb].get("source", DEFAULT_SOURCE)
            if src == "auto":  # what it resolved to on this machine (every study needs >= 2 GPUs)
                src = f"auto ({resolve_source('auto')})"
            rows.append({"notebook": nb.stem, "source": src,
                         "seconds": seconds, "status": status, "error": error})
            tqdm.write(f"{nb.stem}: {status} in {seconds:.1f} s" + (f" - {error}" if error else ""),
                       file=sys.stderr)
        bar.close()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return rows


def png_note() -> str | None:
    """One line saying why no PNG will be written in this run, or None when kaleido has a browser."""
    if os.environ.get("XSTAGE_NO_PNG"):
        return "PNG export is off (XSTAGE_NO_PNG is set); the figures are written as HTML."
    if report.find_chrome() is None:
        return ("PNG export skipped: no Chrome/Chromium found for kaleido (install Debian's 'chromium' or set "
                "BROWSER_PATH); the figures are written as HTML.")
    return None


def missing_pngs(run: Path) -> list[str]:
    """Figures of the run's manifest that have no PNG."""
    return [rec["name"] for rec in read_manifest(run)
            if not (rec.get("png") and (Path(run) / rec["png"]).is_file())]


def package_versions() -> dict[str, str]:
    """Every installed distribution and its version (what this run's numbers were computed with)."""
    from importlib import metadata

    found = {}
    for dist in metadata.distributions():
        name = dist.metadata.get("Name")
        if name:
            found.setdefault(name.lower(), dist.version)
    return dict(sorted(found.items()))


# ------------------------------------------------------------------------------------------- CLI

def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--notebooks", type=Path, metavar="DIR",
                        help="folder of NN_*.ipynb notebooks (default: the checkout's notebooks/)")
    parser.add_argument("--only", action="append", metavar="NAME",
                        help="run only notebooks whose name contains NAME, e.g. 01 or fit (repeatable, or a,b)")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="run folder (default: runs/<UTC timestamp>/ in the checkout)")
    parser.add_argument("--source", choices=SOURCES,
                        help="data source for every notebook that declares `source` (default: auto)")
    parser.add_argument("-p", "--parameter", nargs=2, action="append", dest="parameters", default=[],
                        metavar=("NAME", "VALUE"), help="override a notebook parameter (repeatable)")
    parser.add_argument("-f", "--parameters-file", type=Path, metavar="YAML",
                        help="overrides from a YAML mapping; -p and --source win over it")
    parser.add_argument("--timeout", type=_positive_int, default=600, metavar="S",
                        help="per-cell execution timeout in seconds (default: 600)")
    parser.add_argument("--list", action="store_true",
                        help="list the selected notebooks and their parameters, run nothing")


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    if args.parameters_file:
        overrides.update(load_parameters_file(args.parameters_file))
    if args.source:
        overrides["source"] = args.source
    for name, value in args.parameters:
        overrides[name] = value
    return overrides


def run(args: argparse.Namespace) -> int:
    try:
        notebooks = discover_notebooks(args.notebooks, args.only)
        declared = {nb: inspect_parameters(nb) for nb in notebooks}
        if args.list:
            for nb in notebooks:
                print(nb.stem)
                for name, p in declared[nb].items():
                    print(f"    {name}: {p['type']} = {p['default']}" + (f"  # {p['help']}" if p["help"] else ""))
            return 0
        overrides = _overrides(args)
        params = resolve_parameters(notebooks, overrides, declared)
        if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
            raise ParameterError(f"--out {args.out} is an existing file, not a folder")
    except ParameterError as exc:
        return error_line("xstage reproduce", exc)

    root = repo_root()
    try:
        if args.out:
            run_folder = Path(args.out)
            run_folder.mkdir(parents=True, exist_ok=True)
        else:
            run_folder = _new_run_dir(root / "runs")
    except OSError as exc:
        return error_line("xstage reproduce", f"cannot create the run folder {args.out or root / 'runs'}: "
                                              f"{exc.strerror or exc}")
    skipped = skip_reasons(notebooks, params, declared)
    meta = {
        "started_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "git_commit": git_commit(root),
        "only": args.only,
        "parameters": dict(overrides),
        "notebooks": [nb.stem for nb in notebooks],
        "skipped": {nb.stem: why for nb, why in skipped.items()},
        "xstage": _version(),
        "packages": package_versions(),
    }
    (run_folder / "run.json").write_text(json.dumps(meta, indent=2, default=str), encoding="utf-8")
    print(f"run folder: {run_folder}", file=sys.stderr)
    note = png_note()
    if note:
        print(f"note: {note}", file=sys.stderr)

    for nb, why in skipped.items():
        print(f"note: {nb.stem} {why}", file=sys.stderr)
    ran = execute([nb for nb in notebooks if nb not in skipped], params, run_folder, args.timeout)
    by_name = {r["notebook"]: r for r in ran}
    rows = [by_name.get(nb.stem) or {"notebook": nb.stem, "source": params[nb].get("source", ""), "seconds": 0.0,
                                     "status": "skipped", "error": "", "note": skipped[nb]}
            for nb in notebooks]

    import pandas as pd

    table = pd.DataFrame(rows, columns=["notebook", "source", "seconds", "status", "error", "note"])
    table.to_csv(run_folder / "summary.csv", index=False)
    print(table[["notebook", "source", "seconds", "status"]].to_string(index=False))
    for row in rows:
        if row["status"] == "failed":
            print(f"{row['notebook']} failed: {row['error']} (see {run_folder / (row['notebook'] + '.html')})")
    index = write_index(run_folder)
    missing = missing_pngs(run_folder) if not note else []
    if missing:
        print(f"note: {len(missing)} figure(s) have no PNG (kaleido failed; the notebooks' output says why): "
              f"{', '.join(missing)}", file=sys.stderr)
    print(f"report: {index}")
    return 1 if any(r["status"] == "failed" for r in rows) else 0


def _version() -> str:
    return __version__


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="xstage reproduce", description=__doc__.split("\n\n")[0],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
