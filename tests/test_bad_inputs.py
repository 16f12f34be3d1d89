"""Bad inputs, one table: data files, the command line, notebook parameters and API calls. Every row must end in
one clear line (a specific message), never be accepted silently, never hang (a timeout on every test).

Rows are (id, setup, expected message regex). Data rows break a copy of recorded data in a temporary folder
and load it; CLI rows run ``xstage ...`` in-process (argparse errors and validation errors both exit 2 with one
line on stderr); notebook rows call the validator the notebooks' first cell calls (xstage.reproduce.
check_parameters) on a namespace as papermill leaves it; API rows call xstage functions directly.
"""
from __future__ import annotations

import gzip
import lzma
import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

from xstage import burst_gap_sweep as sweep
from xstage import burst_gap_sweep, cli, data, moe_sweep, records, report, reproduce, sources, ulysses_sweep
from xstage.model import BurstGapParams

pytestmark = pytest.mark.timeout(120)
NO_GPUS = torch.cuda.device_count() < 2
needs_no_gpus = pytest.mark.skipif(not NO_GPUS, reason="GPUs present: this would run a real sweep")
REPO = Path(__file__).resolve().parent.parent


def one_line(text: str) -> str:
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line, got {len(lines)}:\n{text}"
    return lines[0]


# ------------------------------------------------------------------------------------------------ data files
RECORDED = {"bandwidth": "bandwidth", "burst_gap": "burst_gap", "megamoe": "megamoe"}   # schema -> the study recording it on h200x2


def _copy(tmp: Path, schema: data.Schema, src: Path | None = None) -> Path:
    if src is None:
        if schema is data.ULYSSES:
            src = records.folder("ulysses", "h200x2", "nvlink")
        else:
            src = records.folder(RECORDED[schema.name], "h200x2")
    csv, side = data.paths(src, schema)
    dst = tmp / "m"
    dst.mkdir(exist_ok=True)
    shutil.copy(csv, dst)
    shutil.copy(side, dst)
    return dst


def _edit_csv(folder: Path, schema: data.Schema, edit, reseal: bool) -> None:
    """Rewrite the CSV through pandas; ``reseal``: record the edited file's rows/sha256 (so the value checks,
    not the integrity check, must catch it)."""
    csv = data.paths(folder, schema)[0]
    edit(pd.read_csv(csv)).to_csv(csv, index=False)
    if reseal:
        data.seal(folder, schema)


def _edit_bytes(folder: Path, schema: data.Schema, edit) -> None:
    csv = data.paths(folder, schema)[0]
    csv.write_bytes(edit(csv.read_bytes()))


def _edit_meta(folder: Path, schema: data.Schema, edit) -> None:
    side = data.paths(folder, schema)[1]
    meta = json.loads(side.read_text())
    side.write_text(json.dumps(edit(meta) or meta))


def _at(df: pd.DataFrame, col: str, value, row: int = 3) -> pd.DataFrame:
    df = df.copy()
    df.loc[row, col] = value
    return df


def _gzip(folder: Path, schema: data.Schema, cut: int | None = None, garbage: bool = False, xz: bool = False) -> None:
    csv = data.paths(folder, schema)[0]
    packed = lzma.compress(csv.read_bytes()) if xz else gzip.compress(csv.read_bytes())
    csv.unlink()
    gz = csv.with_suffix(".csv.xz" if xz else ".csv.gz")
    gz.write_bytes(b"this is not gzip at all\n" * 10 if garbage else packed[:cut] if cut else packed)


@pytest.fixture(scope="module")
def simulated_burst_gap(tmp_path_factory) -> Path:
    """A small simulated burst-gap record (its own sidecar with csv_rows / csv_sha256)."""
    folder = tmp_path_factory.mktemp("sim")
    grid = sweep.BurstGapGrid(burst_kib=(4, 64), gap_us=(0, 10), programs=(4, 66), store_bytes=(16,),
                              targets=("remote",), n_bursts=4, repeats=2)
    sweep.run_burst_gap(grid, folder, source="simulated", params=BurstGapParams.reference())
    return folder


BW, MOE, ULY, BG = data.BANDWIDTH, data.MEGAMOE, data.ULYSSES, data.BURST_GAP

# (id, schema, breakage(folder), message). The folder holds a copy of the record of that schema.
DATA_CASES = [
    ("csv-cut-mid-row", BW, lambda f: _edit_bytes(f, BW, lambda b: b[: len(b) // 2]), r"ends mid-row"),
    ("csv-cut-at-row", BW, lambda f: _edit_bytes(f, BW, lambda b: b"".join(b.splitlines(True)[:-10])),
     r"has 930 rows, its sidecar records 940: the file was truncated or edited"),
    ("csv-one-value-edited", BW, lambda f: _edit_csv(f, BW, lambda d: _at(d, "gbps", 999.0), reseal=False),
     r"does not match the sha256 its sidecar records"),
    ("csv-rows-appended", BW, lambda f: _edit_bytes(f, BW, lambda b: b + b.splitlines(True)[-1]),
     r"has 941 rows, its sidecar records 940"),
    ("sidecar-rows-edited", BW, lambda f: _edit_meta(f, BW, lambda m: m.update(csv_rows=10)),
     r"its sidecar records 10"),
    ("sidecar-sha-edited", BW, lambda f: _edit_meta(f, BW, lambda m: m.update(csv_sha256="0" * 64)),
     r"does not match the sha256"),
    ("negative-time", BW, lambda f: _edit_csv(f, BW, lambda d: _at(d, "ms", -0.5), reseal=True),
     r"ms must be finite and > 0; 1 row\(s\) are not \(first: line 5, ms=-0.5\)"),
    ("zero-time", BW, lambda f: _edit_csv(f, BW, lambda d: _at(d, "ms", 0.0), reseal=True),
     r"ms must be finite and > 0"),
    ("nan-time", BW, lambda f: _edit_csv(f, BW, lambda d: _at(d, "ms", float("nan")), reseal=True),
     r"ms must be finite and > 0.*ms=nan"),
    ("inf-rate", BW, lambda f: _edit_csv(f, BW, lambda d: _at(d, "gbps", float("inf")), reseal=True),
     r"gbps must be finite and > 0"),
    ("duplicate-row", BW, lambda f: _edit_csv(f, BW, lambda d: pd.concat([d, d.iloc[[7]]]), reseal=True),
     r"1 duplicate row\(s\) \(same method/target/programs/num_warps/rows/store_bytes/bytes/repeat\)"),
    ("megamoe-negative-kernel", MOE, lambda f: _edit_csv(f, MOE, lambda d: _at(d, "kernel_ms", -1.0), reseal=True),
     r"kernel_ms must be finite and > 0"),
    ("megamoe-negative-optional", MOE,
     lambda f: _edit_csv(f, MOE, lambda d: _at(d, "grouped_mm_ms", -2.0), reseal=True),
     r"grouped_mm_ms must be NaN \(not measured\) or finite and >= 0"),
    ("megamoe-duplicate", MOE, lambda f: _edit_csv(f, MOE, lambda d: pd.concat([d.iloc[[0]], d]), reseal=True),
     r"duplicate row\(s\) \(same shape/tokens/routing/P/dtype/schedule/schedule_param\)"),
    ("ulysses-nan-end-to-end", ULY,
     lambda f: _edit_csv(f, ULY, lambda d: _at(d, "end_to_end_ms", float("nan")), reseal=True),
     r"end_to_end_ms must be finite and > 0"),
    ("ulysses-negative-sender-visible", ULY,
     lambda f: _edit_csv(f, ULY, lambda d: _at(d, "sender_visible_ms", -0.1), reseal=True),
     r"sender_visible_ms must be NaN \(not measured\) or finite and >= 0"),
    ("ulysses-duplicate", ULY, lambda f: _edit_csv(f, ULY, lambda d: pd.concat([d, d.iloc[[2]]]), reseal=True),
     r"duplicate row\(s\) \(same shape/S/H/D/P/method/repeat\)"),
    ("gzip-truncated", BW, lambda f: _gzip(f, BW, cut=2000), r"bandwidth.csv.gz is a truncated gzip file"),
    ("gzip-garbage", BW, lambda f: _gzip(f, BW, garbage=True), r"bandwidth.csv.gz is not a valid gzip file"),
    ("xz-truncated", BW, lambda f: _gzip(f, BW, cut=200, xz=True), r"bandwidth.csv.xz is a truncated xz file"),
    ("xz-garbage", BW, lambda f: _gzip(f, BW, garbage=True, xz=True), r"bandwidth.csv.xz is not a valid xz file"),
    ("csv-empty", BW, lambda f: _edit_bytes(f, BW, lambda b: b""), r"is not a readable CSV"),
    ("csv-binary", BW, lambda f: _edit_bytes(f, BW, lambda b: b"\xff\xfe\x00\x81garbage\x00\n" * 5),
     r"is not a readable CSV|lacks columns"),
    ("csv-missing-column", BW, lambda f: _edit_csv(f, BW, lambda d: d.drop(columns=["gbps"]), reseal=True),
     r"lacks columns \['gbps'\]"),
    ("csv-malformed-int", BW, lambda f: _edit_csv(f, BW, lambda d: d.assign(programs="many"), reseal=True),
     r"has a malformed value"),
    ("csv-missing", BW, lambda f: data.paths(f, BW)[0].unlink(), r"missing data file .*bandwidth.csv"),
    ("sidecar-missing", BW, lambda f: data.paths(f, BW)[1].unlink(), r"missing provenance sidecar .*bandwidth.json"),
    ("sidecar-not-json", BW, lambda f: data.paths(f, BW)[1].write_text("{machine: h200"), r"is not valid JSON"),
    ("sidecar-a-list", BW, lambda f: data.paths(f, BW)[1].write_text("[1, 2]"), r"is not a JSON object"),
    ("sidecar-lacks-driver", BW, lambda f: _edit_meta(f, BW, lambda m: m.pop("driver") and None),
     r"lacks provenance fields \['driver'\]"),
    ("sidecar-other-version", BW, lambda f: _edit_meta(f, BW, lambda m: m.update(schema_version=99)),
     r"holds schema 'bandwidth' version 99, expected 'bandwidth' version 1"),
]


@pytest.mark.parametrize("case,schema,breakage,match", DATA_CASES, ids=[c[0] for c in DATA_CASES])
def test_bad_data_file(tmp_path, case, schema, breakage, match):
    folder = _copy(tmp_path, schema)
    breakage(folder)
    with pytest.raises(data.DataError) as e:
        data.load(folder, schema)
    line = one_line(e.value)
    assert re.search(match, line), line
    assert str(folder) in line  # the message names the file


SIM_CASES = [
    ("burst-gap-negative-span", lambda d: _at(d, "span_ns", -10.0), r"span_ns must be finite and > 0"),
    ("burst-gap-nan-issue", lambda d: _at(d, "issue_ns", float("nan")), r"issue_ns must be finite and > 0"),
    ("burst-gap-negative-drain", lambda d: _at(d, "drain_ns", -1.0),
     r"drain_ns must be NaN \(not measured\) or finite and >= 0"),
    ("burst-gap-duplicate", lambda d: pd.concat([d, d.iloc[[5]]]),
     r"duplicate row\(s\) \(same target/programs/burst_bytes/gap_ns/store_bytes/n_bursts/drain/sync/rank/repeat/"
     r"burst\)"),
]


@pytest.mark.parametrize("case,edit,match", SIM_CASES, ids=[c[0] for c in SIM_CASES])
def test_bad_burst_gap_values(tmp_path, simulated_burst_gap, case, edit, match):
    folder = _copy(tmp_path, BG, simulated_burst_gap)
    assert len(data.load(folder)[0]) == 2 * 2 * 2 * 2 * 4  # the copy itself loads
    _edit_csv(folder, BG, edit, reseal=True)
    with pytest.raises(data.DataError) as e:
        data.load(folder)
    assert re.search(match, one_line(e.value)), str(e.value)


def test_files_under_data_need_integrity_fields(tmp_path, monkeypatch):
    folder = _copy(tmp_path, BW)
    _edit_meta(folder, BW, lambda m: [m.pop(k) for k in data.INTEGRITY_FIELDS] and None)
    data.load(folder, BW)  # outside data/: no fields, no check
    monkeypatch.setattr(data, "DATA_ROOT", tmp_path)
    with pytest.raises(data.DataError, match=r"records no csv_rows / csv_sha256: every recorded file under data/"):
        data.load(folder, BW)


def test_every_committed_record_is_sealed():
    sides = sorted(p for p in data.DATA_ROOT.rglob("*.json") if p.parent.name != "paper")
    assert sides
    for side in sides:
        meta = json.loads(side.read_text())
        if "schema" in meta and meta["schema"] in data.SCHEMAS:
            assert all(k in meta for k in data.INTEGRITY_FIELDS), side
            data.load(side.parent, data.SCHEMAS[meta["schema"]])


def test_appends_keep_the_sidecar_sealed(tmp_path, simulated_burst_gap):
    folder = _copy(tmp_path, BG, simulated_burst_gap)
    df, meta = data.load(folder)
    csv = data.start_file(folder, BG, meta)  # continue the record: fields recomputed from the file
    more = df[df.programs == 4].assign(gap_ns=df.gap_ns + 7)  # new configurations
    data.append_rows(csv, BG, more)
    data.append_rows(csv, BG, more.assign(gap_ns=more.gap_ns + 1))
    again, meta2 = data.load(folder)
    assert len(again) == len(df) + 2 * len(more) == meta2["csv_rows"]


# ------------------------------------------------------------------------------------------------ CLI
def _cli(argv: list[str], capsys) -> str:
    try:
        rc = cli.main(argv)
    except SystemExit as e:
        rc = e.code
    captured = capsys.readouterr()
    assert rc == 2, f"exit {rc}: {captured.err}"
    return one_line(captured.err)


OUT_FILE = "/etc/passwd" if Path("/etc/passwd").is_file() else __file__
CLI_CASES = [
    ("out-is-a-file-burst-gap", ["sweep", "burst-gap", "--out", OUT_FILE], r"is an existing file, not a folder"),
    ("out-is-a-file-ulysses", ["sweep", "ulysses", "--out", OUT_FILE], r"is an existing file, not a folder"),
    ("out-is-a-file-megamoe", ["sweep", "megamoe", "--out", OUT_FILE], r"is an existing file, not a folder"),
    ("out-is-a-file-bench", ["bench", "bandwidth", "--out", OUT_FILE], r"is an existing file, not a folder"),
    ("burst-kib-empty-list", ["sweep", "burst-gap", "--out", "{tmp}", "--burst-kib", ","],
     r"argument --burst-kib: expected a non-empty comma-separated list of integers, got ','"),
    ("burst-kib-not-numbers", ["sweep", "burst-gap", "--out", "{tmp}", "--burst-kib", "banana"],
     r"expected comma-separated integers, got 'banana'"),
    ("gap-negative", ["sweep", "burst-gap", "--out", "{tmp}", "--gap-us", "0,-1"], r"expected numbers >= 0"),
    ("gap-nan", ["sweep", "burst-gap", "--out", "{tmp}", "--gap-us", "nan"], r"expected finite numbers"),
    ("programs-empty", ["sweep", "burst-gap", "--out", "{tmp}", "--programs", ",,"], r"non-empty"),
    ("targets-empty", ["sweep", "burst-gap", "--out", "{tmp}", "--targets", ","], r"non-empty comma-separated list"),
    ("bursts-zero", ["sweep", "burst-gap", "--out", "{tmp}", "--bursts", "0"], r"expected an integer >= 1, got 0"),
    ("source-unknown", ["sweep", "burst-gap", "--out", "{tmp}", "--source", "moon"], r"invalid choice: 'moon'"),
    ("megamoe-max-minutes-negative", ["sweep", "megamoe", "--out", "{tmp}", "--max-minutes", "-5"],
     r"expected a positive number of minutes"),
    ("megamoe-dtypes-empty", ["sweep", "megamoe", "--out", "{tmp}", "--dtypes", ","], r"non-empty"),
    ("fit-data-missing", ["fit", "--data", "/nonexistent/xstage"], r"/nonexistent/xstage does not exist"),
    ("fit-data-a-file", ["fit", "--data", OUT_FILE], r"is not a folder"),
    ("fit-bootstrap-negative", ["fit", "--data", "{tmp}", "--bootstrap", "-1"], r"expected an integer >= 0"),
    ("reproduce-timeout-negative", ["reproduce", "--timeout", "-5"], r"must be a positive number of seconds"),
    ("reproduce-timeout-text", ["reproduce", "--timeout", "soon"], r"expected a positive integer, got 'soon'"),
    ("reproduce-out-a-file", ["reproduce", "--only", "04", "--out", OUT_FILE], r"is an existing file, not a folder"),
    ("reproduce-unknown-parameter", ["reproduce", "--only", "04", "-p", "bogus", "1"],
     r"unknown parameter 'bogus': no selected notebook declares it"),
    ("reproduce-bad-source", ["reproduce", "--only", "04", "-p", "source", "moon"],
     r"parameter 'source' expects one of auto, gpu, recorded, simulated, got 'moon'"),
    ("reproduce-only-nothing", ["reproduce", "--only", "zzz_none"], r"--only zzz_none matches no notebook"),
    ("reproduce-yaml-broken", ["reproduce", "--only", "04", "-f", "{tmp}/bad.yaml"], r"is not valid YAML"),
    ("reproduce-yaml-a-list", ["reproduce", "--only", "04", "-f", "{tmp}/list.yaml"],
     r"must be a mapping of parameter name to value"),
    ("predict-kib-zero", ["predict", "--data", "{h200x1}", "--programs", "66", "--burst-kib", "0", "--gap-us", "0"],
     r"argument --burst-kib: expected numbers > 0, got '0'"),
    ("predict-gap-negative", ["predict", "--data", "{h200x1}", "--programs", "66", "--burst-kib", "8",
                              "--gap-us", "-1"], r"argument --gap-us: expected numbers >= 0, got '-1'"),
    ("predict-counts-differ", ["predict", "--data", "{h200x1}", "--programs", "66", "--burst-kib", "8,8",
                               "--gap-us", "1"], r"--burst-kib has 2 bursts and --gap-us 1 gaps"),
    ("predict-no-fit", ["predict", "--data", "{tmp}", "--programs", "66", "--burst-kib", "8", "--gap-us", "1"],
     r"holds the fits of no link: name one with --link"),
    ("predict-programs-zero", ["predict", "--data", "{tmp}", "--programs", "0", "--burst-kib", "8", "--gap-us", "1"],
     r"argument --programs: expected an integer >= 1, got 0"),
    ("trains-range-one-number", ["sweep", "trains", "--out", "{tmp}", "--burst-kib-range", "4"],
     r"--burst-kib-range takes LOW,HIGH with 0 < LOW <= HIGH, got 4"),
    ("trains-range-reversed", ["sweep", "trains", "--out", "{tmp}", "--gap-us-range", "50,1"],
     r"--gap-us-range takes LOW,HIGH with 0 <= LOW <= HIGH, got 50,1"),
    ("ulysses-ranks-zero", ["sweep", "ulysses", "--out", "{tmp}", "--ranks", "0"], r"expected an integer >= 1, got 0"),
    ("no-command", [], r"the following arguments are required: COMMAND"),
    ("unknown-command", ["sweeep"], r"invalid choice: 'sweeep'"),
    ("unknown-option", ["fit", "--data", "{tmp}", "--bogus"], r"unrecognized arguments: --bogus"),
    pytest.param("ulysses-without-gpus", ["sweep", "ulysses", "--out", "{tmp}/u"],
                 r"the Ulysses sweep needs 2 CUDA GPU\(s\).*no simulated source", marks=needs_no_gpus),
    pytest.param("megamoe-without-gpus", ["sweep", "megamoe", "--out", "{tmp}/m"],
                 r"the MegaMoE sweep needs 2 CUDA GPU\(s\).*no simulated source", marks=needs_no_gpus),
    pytest.param("bench-without-gpus", ["bench", "bandwidth", "--out", "{tmp}/b"],
                 r"the bandwidth benchmark needs \d CUDA GPU\(s\).*no simulated source", marks=needs_no_gpus),
    pytest.param("burst-gap-without-gpus", ["sweep", "burst-gap", "--out", "{tmp}/g"],
                 r"the burst-gap sweep.*needs 2 CUDA GPU\(s\).*source='simulated' runs the model",
                 marks=needs_no_gpus),
]


def _ids(cases):
    return [c.values[0] if hasattr(c, "values") else c[0] for c in cases]


@pytest.mark.parametrize("case,argv,match", CLI_CASES, ids=_ids(CLI_CASES))
def test_bad_cli_input(tmp_path, capsys, case, argv, match):
    (tmp_path / "bad.yaml").write_text("a: [1, 2\n")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    line = _cli([a.replace("{tmp}", str(tmp_path)).replace("{h200x1}", str(data.machine_dir("h200x1")))
                 for a in argv], capsys)
    assert re.search(match, line), line
    if "without-gpus" in case and "burst-gap" not in case:
        assert "source='simulated'" not in line
    assert not (tmp_path / "u").exists() and not (tmp_path / "m").exists()  # nothing written or launched


def test_predict_warns_outside_the_fitted_program_counts(capsys):
    """A prediction for more programs than any fitted record ran: the numbers, and one warning line naming the
    option and the fitted range; inside the range no warning."""
    argv = ["predict", "--data", str(data.machine_dir("h200x1")), "--burst-kib", "8,8", "--gap-us", "1,1"]
    assert cli.main(argv + ["--programs", "132"]) == 0
    assert capsys.readouterr().err == ""
    assert cli.main(argv + ["--programs", "4096"]) == 0
    got = capsys.readouterr()
    assert len(got.out.splitlines()) == 2
    assert re.fullmatch(r"xstage: warning: --programs 4096 is outside the program counts the host fit was made on "
                        r"\(\d+-\d+\): the prediction extrapolates", one_line(got.err)), got.err


def test_cli_version_and_help(capsys):
    from xstage import __version__

    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"xstage {__version__}"
    import argparse

    def walk(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    yield from walk(child, path + [name])
            elif action.option_strings and action.dest != "help":
                yield " ".join(path), action
    seen = 0
    for where, action in walk(cli.build_parser(), ["xstage"]):
        seen += 1
        assert action.help, f"{where} {action.option_strings[0]} has no help text"
    assert seen > 30
    with pytest.raises(SystemExit):
        cli.main(["sweep", "burst-gap", "--help"])
    text = capsys.readouterr().out
    assert "(default: 8)" in text and "(default: gpu)" in text


# ------------------------------------------------------------------------------------------- notebook params
def _namespace(stem: str, **injected) -> dict:
    """What a kernel holds after papermill ran the parameters cell and its injected ``# Parameters`` cell."""
    declared = reproduce.inspect_parameters(REPO / "notebooks" / f"{stem}.ipynb")
    ns = {name: eval(p["default"]) for name, p in declared.items()}  # noqa: S307 - our own literal defaults
    cell = "# Parameters\n" + "".join(f"{k} = {v!r}\n" for k, v in injected.items())
    ns.update(injected)
    ns["In"] = ["", "source = 'auto'\n", cell]
    return ns


NB_CASES = [
    ("unknown-name-04", "04_ulysses_attention", {"bogus": 1},
     r"unknown parameter 'bogus' for 04_ulysses_attention \(valid: source, machine"),
    ("unknown-name-03", "03_megamoe_84", {"n_bootstrap": 5}, r"unknown parameter 'n_bootstrap' for 03_megamoe_84"),
    ("no-simulated-04", "04_ulysses_attention", {"source": "simulated"},
     r"parameter 'source' of 04_ulysses_attention expects one of auto, gpu, recorded, got 'simulated'"),
    ("no-simulated-03", "03_megamoe_84", {"source": "simulated"},
     r"parameter 'source' of 03_megamoe_84 expects one of auto, gpu, recorded, got 'simulated'"),
    ("unknown-source", "04_ulysses_attention", {"source": "moon"}, r"parameter 'source' expects one of"),
    ("dtypes-a-dict", "03_megamoe_84", {"dtypes": {"a": 1}}, r"parameter 'dtypes' expects list\[str\], got \{'a': 1\}"),
    ("machine-a-list", "04_ulysses_attention", {"machine": [1, 2]}, r"parameter 'machine' expects str, got \[1, 2\]"),
    ("assignment-none", "03_megamoe_84", {"assignment": None}, r"parameter 'assignment' expects str, got None"),
    ("shapes-a-bool", "03_megamoe_84", {"shapes": True}, r"parameter 'shapes' expects list\[str\], got True"),
]


@pytest.mark.parametrize("case,stem,injected,match", NB_CASES, ids=[c[0] for c in NB_CASES])
def test_bad_notebook_parameter(case, stem, injected, match):
    with pytest.raises(reproduce.ParameterError) as e:
        reproduce.check_parameters(_namespace(stem, **injected), stem)
    assert re.search(match, one_line(e.value)), str(e.value)
    assert e.value._render_traceback_() == [f"ParameterError: {e.value}"]  # what the notebook shows


def test_notebook_validator_converts_and_accepts_good_values():
    ns = _namespace("03_megamoe_84", dtypes="bf16", source="recorded")
    reproduce.check_parameters(ns, "03_megamoe_84")
    assert ns["dtypes"] == ["bf16"] and ns["source"] == "recorded"
    with pytest.raises(reproduce.ParameterError, match="notebook 'nope' not found"):
        reproduce.check_parameters({}, "nope")


@pytest.mark.timeout(300)
def test_papermill_run_stops_at_the_validator(tmp_path):
    papermill = pytest.importorskip("papermill")
    with pytest.raises(papermill.PapermillExecutionError) as e:
        papermill.execute_notebook(str(REPO / "notebooks" / "04_ulysses_attention.ipynb"), str(tmp_path / "o.ipynb"),
                                   parameters={"bogus": 1}, kernel_name="python3", progress_bar=False,
                                   execution_timeout=120, cwd=str(REPO / "notebooks"))
    assert e.value.ename == "ParameterError"
    assert one_line(e.value.evalue).startswith("unknown parameter 'bogus' for 04_ulysses_attention")
    assert e.value.exec_count <= 3  # stopped at the validator cell, before any data was read


# ------------------------------------------------------------------------------------------------ API
def _env(monkeypatch, **kv):
    for k, v in kv.items():
        monkeypatch.setenv(k, v)


API_CASES = [
    ("source-unknown", lambda mp: burst_gap_sweep.burst_gap_data("moon"), r"source must be one of"),
    ("machine-unknown", lambda mp: burst_gap_sweep.burst_gap_data("recorded", machine="nope"),
     r"machine 'nope' has no recorded burst_gap data"),
    ("variant-unknown", lambda mp: burst_gap_sweep.burst_gap_data("recorded", variant="sideways"),
     r"variant must be one of sync, free_running"),
    ("ulysses-simulated", lambda mp: ulysses_sweep.ulysses_data("simulated"), r"no simulated source"),
    ("megamoe-simulated", lambda mp: moe_sweep.megamoe_data("simulated"), r"no simulated source"),
    ("megamoe-assignment", lambda mp: moe_sweep.megamoe_data("recorded", assignment="random"),
     r"assignment must be one of"),
    ("bandwidth-simulated", lambda mp: burst_gap_sweep.bandwidth_data(source="simulated"), r"has no bandwidth benchmark"),
    ("paper-number-unknown", lambda mp: sources.paper_number("megamoe", "nope"), r"no paper number megamoe/nope"),
    ("convert-int", lambda mp: reproduce.convert_value("n_bootstrap", "lots", "int"),
     r"parameter 'n_bootstrap' expects int, got 'lots'"),
    ("convert-bool", lambda mp: reproduce.convert_value("drain", "maybe", "bool"), r"expects bool, got 'maybe'"),
    ("convert-list-int", lambda mp: reproduce.convert_value("programs", "1,x", "list[int]"),
     r"expects list\[int\], got '1,x'"),
    ("parameters-file-missing", lambda mp: reproduce.load_parameters_file(Path("/nonexistent/p.yaml")),
     r"cannot read parameters file /nonexistent/p.yaml"),
    ("figure-formats-unknown", lambda mp: (_env(mp, XSTAGE_FIGURE_FORMATS="png,gif"), report.static_formats()),
     r"XSTAGE_FIGURE_FORMATS: unknown format\(s\) \['gif'\]"),
    ("png-scale-negative", lambda mp: (_env(mp, XSTAGE_PNG_SCALE="-2"), report.print_scale()),
     r"XSTAGE_PNG_SCALE must be a number in \(0, 10\], got '-2'"),
    ("png-scale-text", lambda mp: (_env(mp, XSTAGE_PNG_SCALE="big"), report.print_scale()),
     r"XSTAGE_PNG_SCALE must be a number"),
    ("resume-compressed", lambda mp: data.start_file(records.folder("burst_gap", "h200x2"), data.BURST_GAP, {}),
     r"is compressed: decompress it to resume"),
]


@pytest.mark.parametrize("case,call,match", API_CASES, ids=[c[0] for c in API_CASES])
def test_bad_api_call(monkeypatch, case, call, match):
    with pytest.raises((ValueError, RuntimeError)) as e:
        call(monkeypatch)
    assert re.search(match, one_line(e.value)), str(e.value)


def test_the_table_has_fifty_rows():
    rows = len(DATA_CASES) + len(SIM_CASES) + len(CLI_CASES) + len(NB_CASES) + len(API_CASES)
    assert rows >= 50, rows


# ------------------------------------------------------------------------------------------------ hygiene
def test_license_citation_and_paper_copy_are_in_the_repository():
    assert "Apache License" in (REPO / "LICENSE").read_text() and "Version 2.0" in (REPO / "LICENSE").read_text()
    import yaml

    cff = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert cff["license"] == "Apache-2.0" and cff["references"][0]["title"] == "X-Stage"
    assert len(cff["references"][0]["authors"]) == 11
    meta = json.loads((REPO / "data" / "paper" / "headline.json").read_text())
    named = re.findall(r"[\w./-]+\.txt", meta["copy"])
    assert named and all((REPO / n).is_file() for n in named), meta["copy"]
    assert "shared/" not in json.dumps(meta)


# ------------------------------------------------------------------------------------------------ the report
def test_static_exports_goals_and_errors_reach_index_html(tmp_path, monkeypatch):
    go = pytest.importorskip("plotly.graph_objects")
    written = []

    def fake_write(fig, path, scale=None):  # kaleido needs a browser; the export plan is what is tested here
        written.append((Path(path).name, scale))
        Path(path).write_bytes(b"x")
        return True

    monkeypatch.setattr(report, "_write_png", fake_write)
    monkeypatch.setenv("XSTAGE_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("XSTAGE_NOTEBOOK", "03_megamoe_84")
    monkeypatch.delenv("XSTAGE_FIGURE_FORMATS", raising=False)
    monkeypatch.delenv("XSTAGE_PNG_SCALE", raising=False)
    report.export_figure(go.Figure(go.Bar(y=[1, 2])), "bars", "Bars.")
    assert written == [("bars.png", None), ("bars.print.png", 3.0), ("bars.svg", None), ("bars.pdf", None)]
    monkeypatch.setenv("XSTAGE_FIGURE_FORMATS", "svg")
    written.clear()
    report.export_figure(go.Figure(), "only_svg", "SVG only.")
    assert written == [("only_svg.svg", None)]

    goals = pd.DataFrame([
        {"quantity": "geomean speedup over Expert-Wave (paper, 8 GPUs)", "dtype": "bf16", "schedule": "interleaved",
         "ours": 0.84, "target": 1.18, "met": None},
        {"quantity": "fused layer / unfused baseline (geomean)", "dtype": "bf16", "schedule": "interleaved",
         "ours": 0.97, "target": 1.3, "met": False}])
    assert report.export_goals(goals) is goals
    pd.DataFrame([{"notebook": "03_megamoe_84", "source": "recorded", "seconds": 1.0, "status": "failed",
                   "error": "KeyError: 'kernel_ms'", "note": ""},
                  {"notebook": "04_ulysses_attention", "source": "simulated", "seconds": 0.0, "status": "skipped",
                   "error": "", "note": "skipped: no simulated source"}]).to_csv(tmp_path / "summary.csv", index=False)
    page = report.write_index(tmp_path).read_text()
    assert "png (print)" in page and "figures/bars.pdf" in page and "figures/only_svg.svg" in page
    assert "<h2>Goals</h2>" in page and "&gt;= 1.3" in page and "<td class='failed'>no</td>" in page
    assert "<td>1.18</td><td>0.84</td><td>—</td>" in page  # the paper's number is a comparison, not a goal
    assert "KeyError: &#x27;kernel_ms&#x27;" in page and "skipped: no simulated source" in page
