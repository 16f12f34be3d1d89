"""xstage reproduce: parameter checks before anything runs, and one end-to-end run on tiny notebooks."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import nbformat
import pytest

from xstage import reproduce
from xstage.env import resolve_source
from xstage.report import export_figure, find_chrome, write_index

PARAMS = '''source: str = "auto"  # gpu | recorded | simulated | auto
burst_kib: int = 64  # burst size
gap_us = 2.5
sizes = [1, 2, 4]
verbose = False
label: str | None = None
'''

FIGURE_CELL = '''import plotly.graph_objects as go
from xstage.report import export_figure
fig = go.Figure(go.Scatter(x=sizes, y=[burst_kib * s for s in sizes]))
print("burst_kib", burst_kib, "source", source)
export_figure(fig, "tiny", "A tiny figure.", provenance={"machine": "testbox"}, paper="1.18x", ours="1.20x")
'''


def make_notebook(path: Path, parameters: str, *cells: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    pcell = nbformat.v4.new_code_cell(parameters)
    pcell.metadata["tags"] = ["parameters"]
    nb.cells = [pcell] + [nbformat.v4.new_code_cell(c) for c in cells]
    nbformat.write(nb, str(path))
    return path


@pytest.fixture
def nbdir(tmp_path: Path) -> Path:
    d = tmp_path / "notebooks"
    d.mkdir()
    make_notebook(d / "01_tiny.ipynb", PARAMS, "x = burst_kib * 2")
    make_notebook(d / "02_other.ipynb", "n_boot = 10\n", "y = n_boot")
    (d / "scratch.ipynb").write_text("not a study notebook: not NN_*", encoding="utf-8")
    return d


def test_declared_types(nbdir: Path) -> None:
    params = reproduce.inspect_parameters(nbdir / "01_tiny.ipynb")
    assert {k: v["type"] for k, v in params.items()} == {
        "source": "str", "burst_kib": "int", "gap_us": "float", "sizes": "list[int]", "verbose": "bool",
        "label": "str | None"}


def test_discovery_sorted_and_filtered(nbdir: Path) -> None:
    assert [p.name for p in reproduce.discover_notebooks(nbdir)] == ["01_tiny.ipynb", "02_other.ipynb"]
    assert [p.name for p in reproduce.discover_notebooks(nbdir, ["02"])] == ["02_other.ipynb"]
    with pytest.raises(reproduce.ParameterError, match="matches no notebook"):
        reproduce.discover_notebooks(nbdir, ["nope"])


def test_unknown_parameter_is_rejected_before_running(nbdir: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    rc = reproduce.main(["--notebooks", str(nbdir), "--out", str(out), "-p", "burst_kb", "64"])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "unknown parameter 'burst_kb'" in err
    assert "burst_kib" in err and "n_boot" in err  # lists the valid names
    assert not out.exists()


def test_ill_typed_value_is_rejected(nbdir: Path, tmp_path: Path, capsys) -> None:
    rc = reproduce.main(["--notebooks", str(nbdir), "--out", str(tmp_path / "run"), "-p", "burst_kib", "banana"])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err == "xstage reproduce: error: parameter 'burst_kib' expects int, got 'banana'"
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name, value, message", [
    ("gap_us", "fast", "parameter 'gap_us' expects float, got 'fast'"),
    ("verbose", "maybe", "parameter 'verbose' expects bool, got 'maybe'"),
    ("sizes", "1,two", "parameter 'sizes' expects list[int], got '1,two'"),
    ("source", "cloud", "parameter 'source' expects one of auto, gpu, recorded, simulated, got 'cloud'"),
])
def test_ill_typed_values(nbdir: Path, name: str, value: str, message: str) -> None:
    with pytest.raises(reproduce.ParameterError) as exc:
        reproduce.resolve_parameters(reproduce.discover_notebooks(nbdir), {name: value})
    assert str(exc.value) == message


def test_values_convert_to_declared_types(nbdir: Path, tmp_path: Path) -> None:
    yaml_file = tmp_path / "params.yaml"
    yaml_file.write_text("gap_us: 3\nsizes: [8, 16]\nn_boot: 200\n", encoding="utf-8")
    args = reproduce.argparse.ArgumentParser()
    reproduce.add_arguments(args)
    ns = args.parse_args(["--notebooks", str(nbdir), "-f", str(yaml_file), "-p", "n_boot", "50",
                          "-p", "verbose", "true", "-p", "label", "none", "--source", "simulated"])
    notebooks = reproduce.discover_notebooks(nbdir)
    resolved = reproduce.resolve_parameters(notebooks, reproduce._overrides(ns))
    assert resolved[notebooks[0]] == {"gap_us": 3.0, "sizes": [8, 16], "verbose": True, "label": None,
                                      "source": "simulated"}
    assert resolved[notebooks[1]] == {"n_boot": 50}  # -p wins over -f; only declared names are injected
    # source defaults to "auto", injected only where declared
    resolved = reproduce.resolve_parameters(notebooks, {"sizes": "1,2,4"})
    assert resolved[notebooks[0]] == {"source": "auto", "sizes": [1, 2, 4]}
    assert resolved[notebooks[1]] == {}


def test_bad_parameters_file(nbdir: Path, tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n", encoding="utf-8")
    assert reproduce.main(["--notebooks", str(nbdir), "-f", str(bad)]) == 2
    assert "must be a mapping" in capsys.readouterr().err


def test_export_figure_outside_a_run_writes_nothing(monkeypatch, tmp_path: Path) -> None:
    go = pytest.importorskip("plotly.graph_objects")
    monkeypatch.delenv("XSTAGE_RUN_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    fig = go.Figure()
    assert export_figure(fig, "nothing", "caption") is fig
    assert list(tmp_path.iterdir()) == []


@pytest.mark.browser
@pytest.mark.skipif(find_chrome() is None, reason="no Chrome/Chromium for kaleido")
def test_export_figure_png(monkeypatch, tmp_path: Path) -> None:
    go = pytest.importorskip("plotly.graph_objects")
    monkeypatch.setenv("XSTAGE_RUN_DIR", str(tmp_path))
    monkeypatch.delenv("XSTAGE_NO_PNG", raising=False)
    export_figure(go.Figure(go.Bar(y=[1, 3, 2])), "bars", "Bars.", paper="3")
    png = tmp_path / "figures" / "bars.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rec = json.loads((tmp_path / "figures" / "manifest.jsonl").read_text().splitlines()[-1])
    assert rec["png"] == "figures/bars.png"
    assert "bars.png" in write_index(tmp_path).read_text()


def test_reproduce_end_to_end(tmp_path: Path, monkeypatch, capsys) -> None:
    pytest.importorskip("papermill")
    monkeypatch.setenv("XSTAGE_NO_PNG", "1")  # PNG export has its own (browser) test; keep this one fast
    d = tmp_path / "notebooks"
    d.mkdir()
    make_notebook(d / "01_figure.ipynb", PARAMS, FIGURE_CELL)
    make_notebook(d / "02_broken.ipynb", "n_boot = 10\n", "raise ValueError('deliberate failure')")
    run = tmp_path / "run"

    rc = reproduce.main(["--notebooks", str(d), "--out", str(run), "-p", "burst_kib", "128",
                         "--timeout", "120"])
    out = capsys.readouterr().out
    assert rc == 1  # 02 failed ...

    for name in ("01_figure.ipynb", "01_figure.html", "02_broken.ipynb", "02_broken.html", "summary.csv",
                 "run.json", "index.html", "figures/tiny.html", "figures/tiny.json", "figures/plotly.min.js",
                 "figures/manifest.jsonl"):
        assert (run / name).is_file(), name
    rows = list(csv.DictReader((run / "summary.csv").open()))
    auto = f"auto ({resolve_source('auto')})"   # the summary says what auto resolved to here
    assert [(r["notebook"], r["source"], r["status"]) for r in rows] == [
        ("01_figure", auto, "ok"), ("02_broken", auto, "failed")]  # ... and 01 still ran
    assert "deliberate failure" in rows[1]["error"]
    assert "01_figure" in out and "failed" in out

    executed = nbformat.read(str(run / "01_figure.ipynb"), as_version=4)
    outputs = "".join(o.get("text", "") for c in executed.cells if c.cell_type == "code" for o in c.outputs)
    assert "burst_kib 128 source auto" in outputs
    nb_html = (run / "01_figure.html").read_text()  # the displayed figure, drawn offline by the run's plotly.js
    assert "plotly-graph-div" in nb_html and 'src="figures/plotly.min.js"' in nb_html

    (rec,) = [json.loads(line) for line in (run / "figures" / "manifest.jsonl").read_text().splitlines()]
    assert rec["name"] == "tiny" and rec["notebook"] == "01_figure" and rec["paper"] == "1.18x"
    assert rec["provenance"]["machine"] == "testbox" and "date_utc" in rec["provenance"]
    fig_html = (run / "figures" / "tiny.html").read_text()
    assert 'src="plotly.min.js"' in fig_html and "cdn.plot.ly" not in fig_html
    index = (run / "index.html").read_text()
    assert "A tiny figure." in index and "1.18x" in index and "1.20x" in index and "testbox" in index
    assert "figures/plotly.min.js" in index and "02_broken.html" in index


def test_png_note(monkeypatch) -> None:
    from xstage import report

    monkeypatch.delenv("XSTAGE_NO_PNG", raising=False)
    monkeypatch.setattr(report, "find_chrome", lambda: None)
    assert "no Chrome/Chromium found" in reproduce.png_note()
    monkeypatch.setattr(report, "find_chrome", lambda: "/usr/bin/chromium")
    assert reproduce.png_note() is None
    monkeypatch.setenv("XSTAGE_NO_PNG", "1")
    assert "XSTAGE_NO_PNG" in reproduce.png_note()


def _fake_run(run: Path, names: list[str], png: bool = True) -> Path:
    figdir = run / "figures"
    figdir.mkdir(parents=True)
    with open(figdir / "manifest.jsonl", "w", encoding="utf-8") as fh:
        for name in names:
            if png:
                (figdir / f"{name}.png").write_bytes(b"\x89PNG\r\n\x1a\n" + name.encode())
            fh.write(json.dumps({"name": name, "caption": f"Caption of {name}: a*b <x>.", "notebook": "01_x",
                                 "provenance": {"machine": "h200x2", "source": "recorded"}, "paper": None,
                                 "ours": "0.94" if name == "b" else None,
                                 "png": f"figures/{name}.png" if png else None}) + "\n")
    return run


def test_gallery_rewrites_readme_block(tmp_path: Path) -> None:
    from xstage import report

    run = _fake_run(tmp_path / "run", ["a", "b", "c"])
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nbefore\n\n{report.GALLERY_START}\n\n## Running\n\nafter\n", encoding="utf-8")
    dest = tmp_path / "docs" / "figures"
    dest.mkdir(parents=True)
    (dest / "old.png").write_bytes(b"stale")
    written = report.write_gallery(run, readme, dest, ["b", "a"])
    assert [p.name for p in written] == ["b.png", "a.png"]
    assert sorted(p.name for p in dest.iterdir()) == ["a.png", "b.png"]  # the stale one is gone
    text = readme.read_text(encoding="utf-8")
    assert text.index("![b](docs/figures/b.png)") < text.index("![a](docs/figures/a.png)")
    assert r"Caption of b: a\*b \<x\>." in text and "ours: 0.94" in text and "c.png" not in text
    assert text.index(report.GALLERY_START) < text.index(report.GALLERY_END) < text.index("## Running")
    assert text.startswith("# x\n\nbefore\n") and text.endswith("## Running\n\nafter\n")
    report.write_gallery(run, readme, dest, ["b", "a"])
    assert readme.read_text(encoding="utf-8") == text  # regenerating changes nothing
    report.write_gallery(run, readme, dest, ["c"])
    text = readme.read_text(encoding="utf-8")
    assert "c.png" in text and "b.png" not in text and text.count(report.GALLERY_END) == 1


def test_gallery_errors_name_the_figure(tmp_path: Path, capsys) -> None:
    from xstage import report

    run = _fake_run(tmp_path / "run", ["a"], png=False)
    readme = tmp_path / "README.md"
    readme.write_text(f"{report.GALLERY_START}\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no PNG for a .*Chromium"):
        report.write_gallery(run, readme, tmp_path / "figs", ["a"])
    assert readme.read_text(encoding="utf-8") == f"{report.GALLERY_START}\n" and not (tmp_path / "figs").exists()
    assert report.main(["gallery", str(run), "--readme", str(readme), "--dest", str(tmp_path / "f"),
                        "--figures", "a,zz"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("xstage report: error: figures not in") and "zz" in err and len(err.splitlines()) == 1
    with pytest.raises(ValueError, match="README has no line"):
        report.replace_gallery("no marker\n", "x")


def test_every_notebook_is_valid_nbformat_with_cell_ids():
    """nbformat 4.5 wants an id on every cell (missing ones are a warning today, an error in later nbformat)."""
    for nb_path in sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb")):
        raw = json.loads(nb_path.read_text())            # as stored: nbformat.read fills in missing ids itself
        assert all("id" in c for c in raw["cells"]), nb_path.name
        ids = [c["id"] for c in raw["cells"]]
        assert len(ids) == len(set(ids)), nb_path.name
        nb = nbformat.read(nb_path, as_version=4)
        nbformat.validate(nb)
