"""The sealed 8-GPU prediction (issue 41): write it once, before any 8-GPU or 8-rank measurement, read it, show it.

``python -m xstage.prediction_analysis --write`` computes the prediction of :mod:`xstage.scale_analysis` (how it
is made: that module's docstring) and seals it into data/h200x8/prediction/: ``scale_prediction.jsonl`` (one JSON
line per summary, MegaMoE configuration and Ulysses shape) and its sidecar ``scale_prediction.json`` (the commit,
the date, the inputs' sha256, the assumptions, the model's checks where it is measured, the sha256 of the lines).
Writing is refused once data/ holds an 8-GPU or 8-rank measurement (:func:`scale_measurements`), while the code has
uncommitted changes, and over a sealed prediction without ``--force``. A model output, never a measurement: every
label says "predicted". Notebooks 03 and 04 show it beside the paper's numbers (:func:`beside_paper`); the README's
rows and docs/scale-prediction.md come from :func:`headline` and :func:`docs_page`.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from . import data, env, records
from .scale_analysis import (ASSIGNMENT, KIND, MACHINE, N_DRAWS, N_SMS, NOTE, NVSWITCH, SCHEDULES, SEED, STALL, WORLD,
                             _fit, attention_rule_check, compute_records, compute_sigma, megamoe_prediction,
                             NIC, NIC_QUEUE_MIB, order_error, two_node_megamoe, two_node_ulysses, ulysses_p2_check,
                             ulysses_prediction)
from .numeric import geomean
from .sources import LINK_MACHINES, NoRecordedData

DOCS_PAGE = "scale-prediction.md"
NOTEBOOKS = {"megamoe": "03", "ulysses": "04"}
FOLDER = "prediction"

# ------------------------------------------------------------------------------------------ the sealed file
INPUTS = (("megamoe_controls", "h200x1", "local"), ("megamoe", "h200x1", "host"), ("ulysses", "h200x1", "local"),
          ("ulysses", "h200x2", "nvlink"))
SCALE_SCHEMAS = ("megamoe_traffic", "ulysses_traffic")     # 8-rank traffic on 2 GPUs: measured at 8 ranks


def prediction_folder() -> Path:
    """data/h200x8/prediction: where the sealed prediction lives (xstage/records.py registers it)."""
    return data.DATA_ROOT / MACHINE / FOLDER


def scale_measurements(root: Path | None = None) -> list[str]:
    """Every record under data/ measured at 8 GPUs or 8 ranks (sidecars with gpu_count >= 8, world_size or
    traffic_ranks >= 8, a traffic schema, or MegaMoE / Ulysses rows at P >= 8), as paths relative to data/; the
    prediction's own folder and the paper's numbers are no measurement."""
    root = Path(root) if root is not None else data.DATA_ROOT
    found = []
    for side in sorted(root.rglob("*.json")):
        rel = side.relative_to(root)
        if rel.parts[0] == "paper" or rel.parent == Path(MACHINE) / FOLDER:
            continue
        try:
            meta = json.loads(side.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(meta, dict):
            continue
        p = meta.get("params") if isinstance(meta.get("params"), dict) else {}
        big = (int(meta.get("gpu_count") or 0) >= WORLD or meta.get("schema") in SCALE_SCHEMAS
               or int(p.get("world_size") or 0) >= WORLD or int(p.get("traffic_ranks") or 0) >= WORLD)
        if not big and meta.get("schema") in ("megamoe", "ulysses"):
            try:
                df, _ = data.load(side.parent, data.SCHEMAS[meta["schema"]])
                big = bool(len(df)) and int(df.P.max()) >= WORLD
            except data.DataError:
                big = False
        if big:
            found.append(str(rel.parent))
    return found


def input_hashes() -> dict:
    """The sha256 of every input: each record's CSV (its sidecar's csv_sha256) and the NVLink stage fit's file."""
    out = {}
    for study, machine, link in INPUTS:
        rec = records.record(study, machine, link)
        _, side = data.paths(rec.path, data.SCHEMAS[rec.schema])
        out[str(rec.path.relative_to(data.DATA_ROOT))] = json.loads(side.read_text())["csv_sha256"]
    fit = data.machine_dir(LINK_MACHINES["nvlink"]) / "stage_fit_nvlink.json.gz"
    out[str(fit.relative_to(data.DATA_ROOT))] = hashlib.sha256(fit.read_bytes()).hexdigest()
    return out


def _clean(rec: dict) -> dict:
    """One JSON line: numpy scalars as Python's, and no NaN (a column another kind of line has is left out)."""
    out = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in rec.items()}
    return {k: v for k, v in out.items() if not (isinstance(v, float) and np.isnan(v))}


def prediction_lines(n_draws: int = N_DRAWS, seed: int = SEED) -> list[dict]:
    """Every line of the sealed file: the summaries (kind ``summary``: study, dtype, metric, central, p5, p95,
    paper), then per MegaMoE configuration (``megamoe_config``) and per Ulysses shape (``ulysses_shape``), then
    docs/scale-out.md's two-node figures from the NIC's public numbers (``two_node_megamoe``, ``two_node_ulysses``:
    not fitted, not part of the 8-GPU prediction)."""
    mm_per, mm_sum = megamoe_prediction(n_draws, seed)
    u_per, u_sum = ulysses_prediction(n_draws, seed)
    lines = [_clean({"kind": "summary", **r}) for r in pd.concat([mm_sum, u_sum]).to_dict("records")]
    lines += [_clean({"kind": "megamoe_config", **r}) for r in mm_per.to_dict("records")]
    lines += [_clean({"kind": "ulysses_shape", **r}) for r in u_per.to_dict("records")]
    # docs/scale-out.md's two-node figures: the NIC's public numbers, not fitted (labelled in every line)
    lines += [_clean({"kind": "two_node_megamoe", "source": "public numbers, not fitted", **r})
              for r in two_node_megamoe().to_dict("records")]
    lines += [_clean({"kind": "two_node_ulysses", "source": "public numbers, not fitted", "queue_mib": q, **r})
              for q in NIC_QUEUE_MIB for r in two_node_ulysses(q).to_dict("records")]
    return lines


def checks() -> dict:
    """The model where it is measured (none of it an input of the prediction): the attention wave rule on the
    one-GPU P = 4 rows, the Ulysses model at P = 2 against the 2x H200 record (end to end), MegaMoE's tile-order
    error on the compute-only controls, and the stage fit's held-out error."""
    rule, p2, order = attention_rule_check(), ulysses_p2_check(), order_error()
    return {
        "ulysses_attention_rule_p4_error": {r.shape: float(r.error) for r in rule.itertuples()},
        "ulysses_model_p2_vs_measured_end_to_end": {r.shape: {"measured": float(r.measured), "model": float(r.model)}
                                                    for r in p2.itertuples()},
        "megamoe_order_log_error": {d: {"mean": float(g.log_error.mean()), "sd": float(g.log_error.std())}
                                    for d, g in order.groupby("dtype")},
        "stage_fit_heldout": _fit("nvlink")["heldout"],
        "megamoe_compute_sigma": compute_sigma(compute_records()),
    }


def _dirty(folder: Path) -> list[str]:
    """Uncommitted changes to the code or data (the prediction's own folder excepted): git status lines."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", "xstage", "kernels",
                              "data"], cwd=env.REPO_ROOT,
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    rel = str(folder.resolve().relative_to(env.REPO_ROOT.resolve())) if folder.resolve().is_relative_to(
        env.REPO_ROOT.resolve()) else None
    return [ln for ln in out.splitlines() if ln.strip() and not (rel and ln[3:].startswith(rel))]


def write_prediction(folder: Path | None = None, n_draws: int = N_DRAWS, seed: int = SEED, force: bool = False,
                     command: str = "python -m xstage.prediction_analysis --write") -> Path:
    """Compute and seal the prediction into ``folder`` (default :func:`prediction_folder`): the JSON lines and a
    sidecar naming the commit, the date, the inputs' sha256, the assumptions and the checks. Refused (ValueError,
    before anything is computed) once data/ holds an 8-GPU or 8-rank measurement (:func:`scale_measurements`: the
    prediction must come first), where a sealed prediction exists and ``force`` is not given, and where the code or
    data have uncommitted changes (the sidecar's commit must name the code that made it)."""
    folder = Path(folder) if folder is not None else prediction_folder()
    found = scale_measurements()
    if found:
        raise ValueError(f"data/ holds an 8-GPU or 8-rank measurement ({', '.join(found)}): a prediction written now "
                         "would not precede it; the sealed one stands")
    lines_path = folder / f"{KIND}.jsonl"
    if lines_path.exists() and not force:
        raise ValueError(f"{lines_path} is sealed already; pass --force to replace it (only while no 8-GPU or 8-rank "
                         "measurement exists)")
    dirty = _dirty(folder)
    if dirty:
        raise ValueError(f"uncommitted changes ({dirty[0].strip()} ...): commit first, so that the sidecar's commit "
                         "names the code that made the prediction")
    if n_draws < 20:
        raise ValueError(f"draws must be >= 20 for a p5-p95 interval, got {n_draws}")
    lines = prediction_lines(n_draws, seed)
    meta = {
        "note": NOTE, "git_commit": env.git_commit() or "unknown",
        "date_utc": pd.Timestamp.now(tz="UTC").isoformat(timespec="seconds"),
        "command": command, "machine": MACHINE, "world_gpus": WORLD, "measured": False,
        "params": {"world": WORLD, "n_sms": N_SMS, "n_draws": n_draws, "seed": seed, "assignment": ASSIGNMENT,
                   "stall": STALL, "schedules": list(SCHEDULES), "link": "nvlink"},
        "inputs": input_hashes(), "assumptions": {"nvswitch": NVSWITCH}, "checks": checks(),
        "versions": {"numpy": np.__version__, "pandas": pd.__version__, "python": sys.version.split()[0]},
    }
    return data.write_jsonl(folder, KIND, lines, meta)


def read_prediction(folder: Path | None = None) -> tuple[list[dict], dict]:
    """The sealed prediction's lines and sidecar, checked against its sha256 (xstage.data.load_jsonl);
    :class:`xstage.sources.NoRecordedData` where none is sealed (a notebook says so in one line)."""
    folder = Path(folder) if folder is not None else prediction_folder()
    if not (folder / f"{KIND}.jsonl").is_file():
        raise NoRecordedData(f"no sealed 8-GPU prediction in {folder}; `python -m xstage.prediction_analysis --write` "
                             "seals one")
    return data.load_jsonl(folder, KIND)


def prediction_tables(folder: Path | None = None) -> dict[str, pd.DataFrame]:
    """The sealed prediction as tables: ``summary``, ``megamoe_config``, ``ulysses_shape``."""
    lines, _ = read_prediction(folder)
    df = pd.DataFrame(lines)
    out = {}
    for k in ("summary", "megamoe_config", "ulysses_shape", "two_node_megamoe", "two_node_ulysses"):
        t = df[df.kind == k].dropna(axis=1, how="all").drop(columns="kind").reset_index(drop=True)
        whole = [c for c in t.columns if t[c].dtype == float and np.all(t[c] == np.round(t[c]))]
        out[k] = t.astype({c: "int64" for c in whole})     # counts and shapes as written (the lines hold ints)
    return out


def beside_paper(study: str, folder: Path | None = None) -> pd.DataFrame:
    """The notebooks' table: the sealed prediction's summaries of ``study`` beside the paper's numbers."""
    s = prediction_tables(folder)["summary"]
    s = s[s.study == study]
    out = s.assign(predicted=s.central.map("{:.3f}x".format),
                   interval=[f"{a:.3f}-{b:.3f}x" for a, b in zip(s.p5, s.p95)],
                   paper=s.paper.map("{:.2f}x".format))
    cols = ["dtype", "metric", "configs", "predicted", "interval", "paper"]
    if "central_stall_issuers" in out and out.central_stall_issuers.notna().any():   # MegaMoE: the stall model's
        # sensitivity (central, not in the interval)
        out["stall_issuers"] = out.central_stall_issuers.map("{:.3f}x".format)
        cols.insert(5, "stall_issuers")
    return out[cols].reset_index(drop=True)


# ------------------------------------------------------------------------ the README's rows and the docs page
def _where() -> str:
    return "NVLink, 8x H200 (NVSwitch): predicted"


def _rel() -> str:
    return str(prediction_folder().relative_to(data.DATA_ROOT.parent))


def headline() -> list[records.Headline]:
    """The README's rows: the sealed prediction (a model output, labelled so) beside the paper's 8-GPU numbers."""
    s = prediction_tables()["summary"]
    pick = lambda st, d, m: s[(s.study == st) & (s.dtype == d) & (s.metric == m)].iloc[0]  # noqa: E731
    cell = lambda r: f"{r.central:.3f}x ({r.p5:.3f}-{r.p95:.3f})"  # noqa: E731
    mm = "; ".join(f"{d} geomean **{cell(pick('megamoe', d, 'geomean_speedup'))}**, max "
                   f"{cell(pick('megamoe', d, 'max_speedup'))}" for d in ("bf16", "fp8"))
    if "central_stall_issuers" in s:
        mm += " (the other stall model: geomean " + " / ".join(
            f"{pick('megamoe', d, 'geomean_speedup').central_stall_issuers:.3f}" for d in ("bf16", "fp8")) + ")"
    u = pick("ulysses", "bf16", "fa3_max_sender_visible_speedup")
    return [records.Headline("", f"PREDICTED before any 8-GPU run (model, p5-p95), interleaved / Expert-Wave, 84 "
                                 f"configurations: {mm}", _where(), _rel(), NOTEBOOKS["megamoe"]),
            records.Headline("", f"PREDICTED (model, p5-p95), Ulysses fused (sender-visible) / serial, our attention, "
                                 f"max over {int(u.configs)} shapes: **{cell(u)}**", _where(), _rel(),
                             NOTEBOOKS["ulysses"])]


def docs_page() -> str:
    """docs/scale-prediction.md: the sealed prediction, its assumptions and checks (generated)."""
    t = prediction_tables()
    lines, meta = read_prediction()
    parts = records.docs_head("The paper's 8-GPU figures, predicted", "prediction_analysis",
                              f"a model prediction sealed at commit `{meta['git_commit'][:12]}` on {meta['date_utc']}, "
                              "before any 8-GPU or 8-rank measurement (`python -m xstage.prediction_analysis --write`); "
                              "how it is made: `xstage.scale_analysis`'s docstring. Scale-out on paper: "
                              "[scale-out.md](scale-out.md).", headline())
    s = t["summary"].assign(predicted=lambda x: x.central)
    s = s[["study", "dtype", "metric", "configs", "predicted", "p5", "p95", "paper"]
          + (["central_stall_issuers"] if "central_stall_issuers" in s else [])]
    if "central_stall_issuers" in s:
        s = s.assign(central_stall_issuers=[f"{v:.3f}" if v == v else "-" for v in s.central_stall_issuers])
    parts += ["", "## Beside the paper", "", records.markdown_table(s), "",
              "p5 / p95 of the draws (fitted intervals, compute spread, each model's error where it is measured); a "
              "maximum's draws sit above its central value, the maximum of noisy values being biased up. "
              "central_stall_issuers: MegaMoE's central value under the cost model's other stall model (issuers: the "
              "stage drains throughout the issuers' stall, into phi C(b); the prediction's is round_shared, within "
              "10 % on 503 of 504 host-link speedups): the model's structural sensitivity, not in the interval.", "",
              f"Assumed 8-GPU world: {NVSWITCH['assumed']} ({NVSWITCH['source']}).", "",
              "8-rank traffic on 2 GPUs (`xstage sweep megamoe|ulysses --traffic-ranks 8`, data/h200x2/traffic8: none "
              "recorded when this was sealed) is no 8-GPU measurement: each GPU carries one rank's layer and its 8-rank "
              "egress, all of it to the one peer, so it checks the per-rank compute and egress volume of this "
              "prediction, not the NVSwitch fan-out to 7 peers with 8 GPUs sending at once; it was no input.", "",
              "## Ulysses per shape", "",
              records.markdown_table(t["ulysses_shape"][["shape", "S", "H", "D", "attention_ms", "alltoall_ms",
                                                         "fused_extra_ms", "speedup", "p5", "p95"]]), "",
              "## MegaMoE: the ten largest predicted speedups", "",
              records.markdown_table(t["megamoe_config"].sort_values("speedup", ascending=False).head(10)[
                  ["config", "dtype", "expert_wave_ms", "interleaved_ms", "combine_remote_mb", "speedup", "p5",
                   "p95"]])]
    two = t["two_node_megamoe"]
    if len(two):
        q = [c for c in two.columns if c.startswith("speedup_q")]
        parts += ["", "## Two nodes (docs/scale-out.md): public numbers, not fitted", "",
                  f"16 ranks, one NIC per GPU: {NIC['name']}, drain {NIC['measured_gbps']:g} GB/s ({NIC['source']}); "
                  f"send queue {' or '.join(f'{x:g}' for x in NIC_QUEUE_MIB)} MiB in flight (assumed). MegaMoE "
                  f"interleaved / Expert-Wave ({two.dtype.iloc[0]}), {len(two)} configurations whose experts divide "
                  "by 16: " + "; ".join(f"queue {c[9:]} MiB: geomean {geomean(two[c]):.3f}x, max {two[c].max():.3f}x"
                                        for c in q) + ".", "",
                  records.markdown_table(two.sort_values(q[0], ascending=False).head(10)[
                      ["config", "cross_node_mb", "compute_ms", *[c for c in two.columns if "_ms_q" in c], *q]]),
                  "", "Ulysses at P = 16 (heads divisible by 16):", "",
                  records.markdown_table(t["two_node_ulysses"][["shape", "queue_mib", "attention_ms", "cross_node_mb",
                                                                "alltoall_ms", "fused_extra_ms", "speedup"]])]
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m xstage.prediction_analysis [--write [--force] [--draws N]]``: print the sealed prediction beside the
    paper's numbers, or compute and seal it."""
    ap = argparse.ArgumentParser(prog="python -m xstage.prediction_analysis", description=main.__doc__)
    ap.add_argument("--write", action="store_true", help="compute the prediction and seal it into "
                    "data/h200x8/prediction (refused once an 8-GPU or 8-rank measurement exists)")
    ap.add_argument("--force", action="store_true", help="replace a sealed prediction (only before any measurement)")
    ap.add_argument("--draws", type=int, default=N_DRAWS, help=f"uncertainty draws (default {N_DRAWS})")
    a = ap.parse_args(argv)
    try:
        if a.write:
            path = write_prediction(n_draws=a.draws, force=a.force,
                                    command="python -m xstage.prediction_analysis --write"
                                    + (f" --draws {a.draws}" if a.draws != N_DRAWS else ""))
            print(f"wrote {path}")
        for study in ("megamoe", "ulysses"):
            print(beside_paper(study).to_string(index=False))
    except (ValueError, data.DataError) as e:
        print(f"xstage.prediction_analysis: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def sealed_line(folder: Path | None = None) -> str:
    """One line saying what the sealed prediction is: a model output, its commit and date, the draws."""
    _, meta = read_prediction(folder)
    return (f"PREDICTED (a model, not a measurement) at commit {meta['git_commit'][:12]} on {meta['date_utc']}, "
            f"before any 8-GPU or 8-rank measurement; interval p5-p95 of {meta['params']['n_draws']} draws; "
            f"{len(scale_measurements())} 8-GPU / 8-rank record(s) in data/ now")
