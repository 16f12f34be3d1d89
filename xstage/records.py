"""The one registry of studies and their recorded measurements.

Every study names, per machine and link, ONE current record: its folder under ``data/<machine>/``, its schema,
the command that records it and what it shows. Notebooks, the README, docs, figures and tests reach recorded
data only through :func:`record` / :func:`folder`, so replacing a record is one edit here. A record that was
superseded but that a finding in ``docs/findings.md`` still rests on lives under ``data/<machine>/archive/``
with ``current=False`` (listed in ``data/<machine>/archive/README.md``); everything else that was superseded
has left the tree (git keeps it).

    T = study, M = machine (h200x2: two H200 over NVLink; h200x1 / h100x1: one GPU), L = link
    (nvlink: a peer GPU, host: pinned host memory over PCIe, local: this GPU's memory)
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import data as _data
from .data import DATA_ROOT

LINKS = ("nvlink", "host", "local")
MACHINES = {"h200x2": "2x NVIDIA H200 (NV18)", "h200x1": "one NVIDIA H200", "h100x1": "one NVIDIA H100",
            "h100x1_second": "a second NVIDIA H100 chip (GPU 6bcdfff2; h100x1's is ca9bfa86)",
            "h100x1_third": "a third NVIDIA H100 chip (GPU 2fee3816)",
            "h100x1_fourth": "a fourth NVIDIA H100 chip (GPU 7c450ecd)",
            "h100x1_fifth": "a fifth NVIDIA H100 chip (GPU 95d88f70)",
            "h200x8": "8x NVIDIA H200 (NVSwitch): predicted, nothing measured"}
ARCHIVE = "archive"


@dataclass(frozen=True)
class Study:
    """A study: what it measures, its notebook, its docs page and its goal (one line each)."""

    name: str
    title: str
    notebook: str          # notebooks/<notebook>.ipynb shows it
    goal: str


@dataclass(frozen=True)
class Record:
    """One recorded measurement: ``data/<machine>/[archive/]<folder>/`` with a sealed CSV + JSON sidecar."""

    study: str
    machine: str
    link: str
    folder: str
    schema: str            # xstage.data.SCHEMAS key
    command: str           # the command that records it (on a GPU machine)
    shows: str             # one line: what it shows (for archived records: the finding it supports)
    current: bool = True

    @property
    def path(self) -> Path:
        base = _data.DATA_ROOT / self.machine   # read at call time (a test may point it elsewhere)
        return base / self.folder if self.current else base / ARCHIVE / self.folder


@dataclass(frozen=True)
class Headline:
    """One row of the README's headline table (each study's ``<study>_analysis.headline()`` returns its rows)."""

    claim: str             # the paper's claim, short ("" where the paper makes none)
    ours: str              # what we measured, short, with the rows it covers
    where: str             # link and machine, e.g. "NVLink, 2x H200"
    record: str            # data/<machine>/<folder>
    notebook: str          # "03"


def markdown_table(df, fmt: dict[str, str] | None = None) -> str:
    """A table of a generated docs page: ``fmt`` maps each column shown to its format spec ("" = as text;
    default: every column, floats to 3 decimals)."""
    fmt = fmt if fmt is not None else {c: "" for c in df.columns}
    cell = lambda v, f: format(v, f) if f else (f"{v:.3f}" if isinstance(v, float) else str(v))  # noqa: E731
    lines = ["| " + " | ".join(fmt) + " |", "|" + "---|" * len(fmt)]
    lines += ["| " + " | ".join(cell(r[c], f) for c, f in fmt.items()) + " |" for _, r in df.iterrows()]
    return "\n".join(lines)


def docs_head(title: str, module: str, note: str, rows: list["Headline"]) -> list[str]:
    """The top of a generated ``docs/<study>.md``: its title, where it comes from, and the study's headline rows."""
    return [f"# {title}", "", f"Generated from the current records (xstage/records.py) by `xstage.{module}.docs_page`; "
            f"{note}", "", "| claim | ours | where | record |", "| --- | --- | --- | --- |",
            *(f"| {h.claim} | {h.ours} | {h.where} | `{h.record}` |" for h in rows)]


def _records(*rows: Record) -> tuple[Record, ...]:
    return rows


# ------------------------------------------------------------------ studies (one line each; docs/<name>.md)
STUDIES: dict[str, Study] = {s.name: s for s in (
    # BLOCK: burst-gap and stage model
    Study("burst_gap", "Burst-Gap: synchronised stores against backpressure", "01",
          "how long P programs' bursts of stores to a peer GPU or host memory take, against burst size and gap"),
    Study("bandwidth", "Peak bandwidth of each link", "01",
          "the peak store bandwidth of SM stores and of the copy engine on NVLink and over PCIe"),
    Study("free_running", "Burst-Gap without a barrier between bursts", "01",
          "the same sweep with programs drifting apart (no grid barrier)"),
    Study("trains", "Irregular free-running trains of bursts", "02",
          "the trains the stage model is fitted on and scored on, per link"),
    Study("drain", "Drain rate measured directly", "02",
          "long bursts each followed by a system-scope fence: the link's drain rate D, not fitted"),
    Study("trains_clean", "Trains clean", "02",
          "the fitted seed-0 trains recorded with the clean kernel (no read inside a timed burst): the host full model's fit"),
    Study("trains_with_read", "Trains with read", "02",
          "the same trains recorded beside trains_clean with the legacy read inside each burst"),
    Study("trains_independent", "Trains independent", "02",
          "trains of other sizes and gaps (seed 7), never fitted: the held-out score"),
    Study("trains_independent_clean", "Trains independent clean", "02",
          "trains_independent recorded with the clean kernel"),
    Study("trains_programs", "Trains programs", "02",
          "the fitted trains per program (per-program rows)"),
    Study("trains_programs_p", "Trains programs p", "02",
          "the fitted trains at more program counts, per program"),
    Study("trains_programs_p_clean", "Trains programs p clean", "02",
          "trains_programs_p recorded with the clean kernel"),
    Study("trains_new_programs", "Trains new programs", "02",
          "trains at program counts the fit never saw, per program"),
    Study("trains_new_programs_clean", "Trains new programs clean", "02",
          "trains_new_programs recorded with the clean kernel"),
    Study("trains_small_bursts", "Trains small bursts", "02",
          "trains of small bursts (contention below the knee), per program"),
    Study("trains_small_bursts_clean", "Trains small bursts clean", "02",
          "trains_small_bursts recorded with the clean kernel"),
    Study("trains_other_seed", "Trains other seed", "02",
          "trains of another seed, clean kernel, never fitted"),
    Study("trains_process_0", "Trains process 0", "02",
          "the fitted trains recorded in a separate process (placement draw 0)"),
    Study("trains_process_1", "Trains process 1", "02",
          "the fitted trains recorded in a separate process (placement draw 1)"),
    Study("trains_process_2", "Trains process 2", "02",
          "the fitted trains recorded in a separate process (placement draw 2)"),
    Study("probe_trains", "Probe trains", "02",
          "designed probe trains after a contended lead, per program"),
    Study("probe_trains_with_read", "Probe trains with read", "02",
          "the probe trains with the legacy read inside each burst"),
    Study("probe_trains_clean", "Probe trains clean", "02",
          "the probe trains recorded with the clean kernel"),
    Study("probe_trains_sizes", "Probe trains sizes", "02",
          "probes of several sizes after a contended lead, per program"),
    Study("trains_load_probe_l2", "Trains load probe l2", "02",
          "a load probe of kind 2 inside the fitted trains at P = 132 / 264"),
    Study("gpc_map", "The SM -> GPC map of an H200", "02",
          "which GPC each SM sits in (thread-block clusters), the placement the stage model's GPC drain uses"),
    Study("trains_gpc", "Trains gpc", "02",
          "trains with the GPC map of each program recorded before and after"),
    Study("trains_gpc_full", "Trains gpc full", "02",
          "trains on the full chip with the GPC map before and after"),
    Study("barrier_relaxed", "Barrier relaxed", "02",
          "the synchronised sweep with a relaxed grid barrier (barrier cost)"),
    Study("barrier_release", "Barrier release", "02",
          "the synchronised sweep with a release barrier (barrier cost)"),
    Study("calibration", "xstage calibrate: the short plan's synchronised points", "02",
          "a card's own parameters in <= 3 min of GPU and <= 2 min of fit (xstage.calibrate); its fit is "
          "data/<machine>/calibration/stage_fit_<link>.json.gz"),
    Study("calibration_free_running", "xstage calibrate: the short plan's free-running points", "02",
          "the capacities and the stall of the card's full model"),
    Study("calibration_drain", "xstage calibrate: the drain measured directly", "02",
          "the card's drain rate D, fixed in its fit"),
    Study("calibration_trains", "xstage calibrate: the short plan's seeded trains", "02",
          "the per-program slots, the spread and the free entries of the card's full model"),
    Study("families", "Never-fitted traffic families", "02",
          "store widths, block sizes, staggered starts, waves and per-program bursts the model never saw "
          "(xstage.families_analysis scores it), data/<machine>/families"),
    # BLOCK: megamoe
    Study("megamoe", "MegaMoE: fused dispatch, grouped GEMMs and combine; each schedule / Expert-Wave, 84 configurations",
          "03_megamoe_84", "each schedule's kernel time / Expert-Wave's per configuration and dtype, beside the model"),
    Study("megamoe_controls", "MegaMoE compute only: each schedule's time / Expert-Wave's with every store local",
          "03_megamoe_84", "the schedules' compute-only cost: geomean <= 1.02, worst <= 1.05 of Expert-Wave's"),
    Study("megamoe_gemm_bf16", "MegaMoE's bf16 GEMM phases / torch._grouped_mm, same rounds",
          "03_megamoe_84", "geomean >= 0.95; >= 0.9 on each configuration with >= 2048 rows"),
    Study("megamoe_gemm_fp8", "MegaMoE's fp8 GEMM phases / torch._scaled_grouped_mm, same rounds",
          "03_megamoe_84", "geomean >= 0.95; >= 0.9 on each configuration with >= 2048 rows"),
    # BLOCK: attention and ulysses
    Study("ulysses", "Ulysses: the all-to-all fused into attention's epilogue", "04_ulysses_attention",
          "fused layer faster end to end than attention followed by the all-to-all"),
    Study("attention", "Our Gluon attention forward beside FA4's CuTe Hopper forward", "04_ulysses_attention",
          ">= 0.95 of FA4's TFLOP/s on every shape with S >= 8K"),
    Study("attention_clocks", "Sustained clocks of our attention, FA4 and cuDNN at the power cap",
          "04_ulysses_attention", "the ours / FA4 ratio holds when the clocks settle"),
    Study("attention_layer", "The attention call for a DiT", "04",
          "xstage.attention on one GPU: host us per call, first call, CUDA graphs, torch.compile, bad input, "
          "ours / cuDNN (and / FA4 where installed)"),
    # BLOCK: launchers
    Study("launch_plain", "The host-link sweep started by xstage", "01",
          "the burst-gap sweep (host, local) with xstage's own rank: the reference of the launcher check"),
    Study("launch_plain_again", "The same sweep again", "01", "its run-to-run spread"),
    Study("launch_torchrun", "The same sweep under torchrun", "01",
          "torchrun --nproc-per-node 1 -m xstage: the same rows, timings within the plain runs' spread"),
    Study("launch_resumed", "One record, two launchers", "01",
          "started under torchrun on part of the grid, finished by the plain command"),
    # BLOCK: predictions
    Study("scale_prediction", "The paper's 8-GPU figures, predicted", "03_megamoe_84",
          "the MegaMoE and Ulysses speedups at 8 GPUs from the NVLink model and the one-GPU compute, sealed before "
          "any 8-GPU or 8-rank measurement"),
)}

# ------------------------------------------------------------------ records (one current per study, machine, link)
def _chip_calibration(machine: str, command: str, chip: str) -> tuple["Record", ...]:
    """Another chip's calibration (``scripts/calibrate_check.sh``): the plan's four records and the families."""
    plan = (("calibration", "backpressure_sweep", "burst_gap", "the plan's synchronised points"),
            ("calibration_free_running", "free_running", "burst_gap", "the plan's free-running points"),
            ("calibration_drain", "drain_programs", "burst_gap", "the plan's drain points"),
            ("calibration_trains", "trains", "burst_train", "the plan's trains"))
    return (*(Record(study, machine, "host", f"calibration/{sub}", schema, command, f"{chip}: {shows}")
              for study, sub, schema, shows in plan),
            Record("families", machine, "host", "families", "burst_program", command,
                   f"the families on {chip}, with the kernel's registers (family_kernel.json)"))


RECORDS: tuple[Record, ...] = _records(
    # BLOCK: burst-gap and stage model
    Record("burst_gap", "h200x2", "nvlink", "backpressure_sweep", "burst_gap",
           "xstage sweep burst-gap --out DIR", "synchronised burst-gap sweep to a peer GPU (and local)"),
    Record("burst_gap", "h200x1", "host", "backpressure_sweep", "burst_gap",
           "xstage sweep burst-gap --out DIR --targets host,local", "synchronised burst-gap sweep to pinned host memory"),
    Record("bandwidth", "h200x2", "nvlink", "bandwidth", "bandwidth",
           "xstage bench bandwidth --out DIR", "peak store and copy-engine bandwidth to a peer GPU"),
    Record("bandwidth", "h200x1", "host", "bandwidth", "bandwidth",
           "xstage bench bandwidth --out DIR", "peak store and copy-engine bandwidth to host memory"),
    Record("free_running", "h200x2", "nvlink", "free_running", "burst_gap",
           "xstage sweep burst-gap --out DIR/free_running --no-sync", "free-running sweep to a peer GPU"),
    Record("free_running", "h200x1", "host", "free_running", "burst_gap",
           "xstage sweep burst-gap --out DIR/free_running --no-sync --targets host,local",
           "free-running sweep to host memory"),
    Record("trains", "h200x1", "host", "trains", "burst_train",
           "xstage sweep trains --out DIR --targets host", "the irregular trains the host stage model is fitted on"),
    Record("drain", "h200x1", "host", "drain_programs", "burst_gap",
           "xstage sweep burst-gap --out DIR/drain_programs --drain --targets host",
           "the host link's drain rate per program count (fixed in the fit)"),
    Record("trains_clean", "h200x1", "host", "trains_clean", "burst_train",
           "xstage sweep trains --out DIR --targets host --per-program --programs 16,66,132,264 --family random --repeats 3",
           "the fitted seed-0 trains recorded with the clean kernel (no read inside a timed burst): the host full model's fit"),
    Record("trains_with_read", "h200x1", "host", "trains_with_read", "burst_train",
           "xstage sweep trains --out DIR --targets host --per-program --programs 16,66,132,264 --family random --repeats 3 --no-preload",
           "the same trains recorded beside trains_clean with the legacy read inside each burst"),
    Record("trains_independent", "h200x1", "host", "independent", "burst_train",
           "xstage sweep trains --out DIR --seed 7 --count 16 --burst-kib-range 4,1024 --gap-us-range 1,300 --targets host",
           "trains of other sizes and gaps (seed 7), never fitted: the held-out score"),
    Record("trains_independent_clean", "h200x1", "host", "independent_clean", "burst_train",
           "xstage sweep trains --out DIR --repeats 3 --targets host --seed 7 --count 16 --burst-kib-range 4,1024 --gap-us-range 1,300",
           "trains_independent recorded with the clean kernel"),
    Record("trains_programs", "h200x1", "host", "train_programs", "burst_train",
           "xstage sweep trains --out DIR --targets host --per-program --repeats 3",
           "the fitted trains per program (per-program rows)"),
    Record("trains_programs_p", "h200x1", "host", "train_programs_p", "burst_train",
           "xstage sweep trains --out DIR --targets host --per-program --programs 1,2,4,8,16,32,48,66,100,132,198,264 --seed 7 --count 6 --repeats 3",
           "the fitted trains at more program counts, per program"),
    Record("trains_programs_p_clean", "h200x1", "host", "train_programs_p_clean", "burst_train",
           "xstage sweep trains --out DIR --repeats 3 --targets host --programs 1,2,4,8,16,32,48,66,100,132,198,264 --seed 7 --count 6",
           "trains_programs_p recorded with the clean kernel"),
    Record("trains_new_programs", "h200x1", "host", "train_programs_new_p", "burst_train",
           "xstage sweep trains --out DIR --targets host --per-program --programs 24,40,80,120,160,200 --seed 11 --count 6 --repeats 3",
           "trains at program counts the fit never saw, per program"),
    Record("trains_new_programs_clean", "h200x1", "host", "train_programs_new_p_clean", "burst_train",
           "xstage sweep trains --out DIR --repeats 3 --targets host --programs 24,40,80,120,160,200 --seed 11 --count 6",
           "trains_new_programs recorded with the clean kernel"),
    Record("trains_small_bursts", "h200x1", "host", "trains_small_bursts", "burst_train",
           "xstage sweep trains --out DIR --targets host --per-program --programs 66,100,132,200 --seed 18 --count 10 --burst-kib-range 2,48 --gap-us-range 0.5,50 --repeats 3",
           "trains of small bursts (contention below the knee), per program"),
    Record("trains_small_bursts_clean", "h200x1", "host", "train_small_clean", "burst_train",
           "xstage sweep trains --out DIR --repeats 3 --targets host --programs 66,100,132,200 --seed 18 --count 10 --burst-kib-range 2,48 --gap-us-range 0.5,50",
           "trains_small_bursts recorded with the clean kernel"),
    Record("trains_other_seed", "h200x1", "host", "train_seed22_clean", "burst_train",
           "xstage sweep trains --out DIR --repeats 3 --targets host --seed 22",
           "trains of another seed, clean kernel, never fitted"),
    Record("trains_process_0", "h200x1", "host", "train_processes_p0", "burst_train",
           "xstage sweep trains --out DIR --targets host --per-program --programs 16,66,132 --count 12 --repeats 2",
           "the fitted trains recorded in a separate process (placement draw 0)"),
    Record("trains_process_1", "h200x1", "host", "train_processes_p1", "burst_train",
           "xstage sweep trains --out DIR --targets host --per-program --programs 16,66,132 --count 12 --repeats 2",
           "the fitted trains recorded in a separate process (placement draw 1)"),
    Record("trains_process_2", "h200x1", "host", "train_processes_p2", "burst_train",
           "xstage sweep trains --out DIR --targets host --per-program --programs 16,66,132 --count 12 --repeats 2",
           "the fitted trains recorded in a separate process (placement draw 2)"),
    Record("probe_trains", "h200x1", "host", "probe_trains", "burst_train",
           "xstage sweep trains --out DIR --targets host --per-program --programs 16,66,132,264 --family probe --repeats 3",
           "designed probe trains after a contended lead, per program"),
    Record("probe_trains_with_read", "h200x1", "host", "probe_trains_with_read", "burst_train",
           "xstage sweep trains --out DIR --targets host --per-program --programs 16,66,132,264 --family probe --repeats 3 --no-preload",
           "the probe trains with the legacy read inside each burst"),
    Record("probe_trains_clean", "h200x1", "host", "probe_trains_clean", "burst_train",
           "xstage sweep trains --out DIR --targets host --per-program --programs 16,66,132,264 --family probe --repeats 3",
           "the probe trains recorded with the clean kernel"),
    Record("probe_trains_sizes", "h200x1", "host", "probe_trains_sizes", "burst_train",
           "xstage sweep trains --out DIR --targets host --per-program --programs 66,132,264 --family probe_size --repeats 3",
           "probes of several sizes after a contended lead, per program"),
    Record("trains_load_probe_l2", "h200x1", "host", "trains_load_probe_l2", "burst_train",
           "xstage sweep trains --out DIR --per-program --repeats 3 --count 8 --targets host --load-probe 2 --programs 132,264",
           "a load probe of kind 2 inside the fitted trains at P = 132 / 264"),
    Record("gpc_map", "h200x1", "local", "gpc_map", "gpc_map", "bash scripts/gpc_map.sh",
           "the SM -> GPC map (xstage.stage_params.GPC_OF_SM reads it so)"),
    Record("gpc_map", "h200x1", "local", "gpc_map_second_chip", "gpc_map", "bash scripts/gpc_map.sh",
           "the same SM -> GPC map on a second H200 chip, in another process: identical", current=False),
    Record("trains_gpc", "h200x1", "host", "train_gpc", "burst_train",
           "python3 scripts/trains_gpc.py /tmp/libgpcmap.so /root/out/h200x1/train_gpc",
           "trains with the GPC map of each program recorded before and after"),
    Record("trains_gpc_full", "h200x1", "host", "train_gpc_full", "burst_train",
           "python3 scripts/trains_gpc.py /tmp/libgpcmap.so /root/out/h200x1/train_gpc_full --programs 100,132,198,264",
           "trains on the full chip with the GPC map before and after"),
    Record("barrier_relaxed", "h200x1", "host", "barrier_relaxed", "burst_gap",
           "xstage sweep burst-gap --out DIR --barrier relaxed --targets host --store-bytes 16 --programs 16,66,132,264 --burst-kib 8,16,32,64,128,256 --gap-us 0,1,10,100 --bursts 8 --repeats 3",
           "the synchronised sweep with a relaxed grid barrier (barrier cost)"),
    Record("barrier_release", "h200x1", "host", "barrier_release", "burst_gap",
           "xstage sweep burst-gap --out DIR --barrier release --targets host --store-bytes 16 --programs 16,66,132,264 --burst-kib 8,16,32,64,128,256 --gap-us 0,1,10,100 --bursts 8 --repeats 3",
           "the synchronised sweep with a release barrier (barrier cost)"),
    Record("trains", "h200x1", "host", "trains_clean_fitted_family", "burst_train",
           "xstage sweep trains --out DIR --repeats 3 --targets host,local",
           "the fitted seed-0 family recorded with the clean kernel: each rung scored on clean trains",
           current=False),
    Record("trains", "h200x1", "host", "trains_load_probe_l1", "burst_train",
           "xstage sweep trains --out DIR --per-program --repeats 3 --count 8 --targets host --load-probe 1 "
           "--programs 132,264",
           "a load probe of kind 1 inside the fitted trains at P = 132 / 264 (host)", current=False),
    Record("trains", "h200x1", "host", "trains_load_probe_l2_local", "burst_train",
           "xstage sweep trains --out DIR --per-program --repeats 3 --count 8 --targets local --load-probe 2 "
           "--programs 132",
           "the control of the load probe: kind 2 on the local target at P = 132", current=False),
    Record("trains", "h200x1", "host", "probe_trains_replicate", "burst_train",
           "xstage sweep trains --out DIR --targets host --per-program --programs 16,66,132,264 --family probe "
           "--repeats 3",
           "the probe trains re-recorded straight after in another call: the between-call spread", current=False),
    # BLOCK: megamoe
    Record("megamoe", "h200x2", "nvlink", "megamoe", "megamoe",
           "xstage sweep megamoe --assignment static --out data/h200x2/megamoe",
           "the first kernels over NVLink: interleaved / Expert-Wave geomean 0.84x (bf16), 0.82x (fp8), 84 each"),
    Record("megamoe", "h200x1", "host", "megamoe_pcie", "megamoe",
           "xstage sweep megamoe --world one-gpu --ranks 2 --link host --out data/h200x1/megamoe_pcie",
           "one H200, combine over PCIe: interleaved / Expert-Wave geomean 1.025 (bf16), 1.062 (fp8), model beside"),
    Record("megamoe_controls", "h200x1", "local", "megamoe_controls", "megamoe_gemm",
           "python3 scripts/megamoe_gemm.py --study controls --out data/h200x1/megamoe_controls",
           "compute only: each schedule's time / Expert-Wave's, dynamic assignment, 84 configurations per dtype"),
    Record("megamoe_gemm_bf16", "h200x1", "local", "megamoe_gemm_bf16", "megamoe_gemm",
           "python3 scripts/megamoe_gemm.py --study library --dtypes bf16 --out data/h200x1/megamoe_gemm_bf16",
           "bf16 GEMM phases / torch._grouped_mm: geomean 1.181, min 0.882 (0.952 at >= 2048 rows)"),
    Record("megamoe_gemm_fp8", "h200x1", "local", "megamoe_gemm_fp8", "megamoe_gemm",
           "python3 scripts/megamoe_gemm.py --study library --dtypes fp8 --out data/h200x1/megamoe_gemm_fp8",
           "fp8 GEMM phases / torch._scaled_grouped_mm: geomean 1.228, min 0.999"),
    Record("megamoe_controls", "h200x1", "local", "megamoe_controls_repeat", "megamoe_gemm",
           "python3 scripts/megamoe_gemm.py --study controls --out DIR",
           "the compute-only controls repeated in a new process: every pair within the goal but one", current=False),
    *(Record("megamoe_controls", "h200x1", "local", f"megamoe_pair_processes/p{i}", "megamoe_gemm",
             "python3 scripts/megamoe_gemm.py --study controls --cases deepseek_v4_pro_T8192_uniform --out DIR",
             f"that one pair (fp8 lag, DeepSeek-V4-Pro T8192 uniform) alone in process {i} of 5: 0.994-1.009",
             current=False) for i in range(1, 6)),
    Record("megamoe", "h200x1", "host", "megamoe_host_pointer_loops", "megamoe",
           "xstage sweep megamoe --world one-gpu --ranks 2 --link host --out DIR",
           "Expert-Wave's kernel / its compute-only control over PCIe: 1.11 / 1.09 (bf16 / fp8)", current=False),
    Record("megamoe", "h200x1", "host", "megamoe_scatter_store", "bandwidth",
           "python3 scripts/megamoe_scatter_store.py --out DIR (the script is at commit 8ed668e)",
           "the combine's store pattern drains pinned host memory at 0.96-1.01 of a contiguous stream",
           current=False),
    # BLOCK: attention and ulysses
    Record("ulysses", "h200x2", "nvlink", "ulysses", "ulysses", "xstage sweep ulysses --out data/h200x2/ulysses",
           "fused / serial end to end on 2 H200s over NVLink, DiT shapes and S = 4K..128K"),
    Record("ulysses", "h200x1", "host", "ulysses_host", "ulysses",
           "xstage sweep ulysses --world one-gpu --ranks P --link host --out data/h200x1/ulysses_host",
           "one-GPU world, peers' outputs (fused and copies) in pinned host memory: fused / serial"),
    Record("ulysses", "h200x1", "local", "ulysses_local", "ulysses",
           "xstage sweep ulysses --world one-gpu --ranks P --link local --out data/h200x1/ulysses_local",
           "one-GPU world, every buffer on the GPU: fused / serial"),
    Record("ulysses", "h200x1", "host", "ulysses_host_fused_outputs_on_gpu", "ulysses",
           "xstage sweep ulysses --world one-gpu --ranks P --link host --out data/h200x1/ulysses_host",
           "with the fused outputs left in device memory the host link looked faster than it is: fused outputs "
           "must be the destination buffers", current=False),
    Record("ulysses", "h200x1", "host", "ulysses_fa4_fused_host", "ulysses", "RECORD=ulysses_fa scripts/fa4_one_gpu.sh",
           "FA4's kernel with the same fused epilogue beside FA4 alone and ours, host link", current=False),
    Record("ulysses", "h200x1", "local", "ulysses_fa4_fused_local", "ulysses",
           "RECORD=ulysses_fa scripts/fa4_one_gpu.sh",
           "FA4's kernel with the same fused epilogue beside FA4 alone and ours, local link", current=False),
    Record("ulysses", "h200x1", "host", "ulysses_fa4_fused_p4_host", "ulysses", "scripts/attention_vs_fa4.sh p4:<s>",
           "the FA methods at P = 4, host link", current=False),
    Record("ulysses", "h200x1", "local", "ulysses_fa4_fused_p4_local", "ulysses", "scripts/attention_vs_fa4.sh p4:<s>",
           "the FA methods at P = 4, local link", current=False),
    Record("ulysses", "h200x1", "host", "ulysses_gluon_fused_host", "ulysses", "scripts/ulysses_gluon_one_gpu.sh",
           "the Gluon kernel's fused epilogue (16-byte stores) bit-exact and timed, host link", current=False),
    Record("ulysses", "h200x1", "host", "ulysses_gluon_fused_2byte_host", "ulysses", "scripts/ulysses_gluon_one_gpu.sh",
           "with 2-byte stores the Gluon fused epilogue cost 3.2-7.9x Gluon alone over PCIe (16-byte: 1.03-1.26x)",
           current=False),
    Record("ulysses", "h200x1", "local", "ulysses_gluon_fused_local", "ulysses", "scripts/ulysses_gluon_one_gpu.sh",
           "the Gluon kernel's fused epilogue (16-byte stores) bit-exact and timed, local link", current=False),
    Record("attention", "h100x1", "local", "attention_vs_fa4", "attention_ladder",
           "MACHINE=h100x1 scripts/attention_vs_fa4.sh study:<s>",
           "ours / FA4 TFLOP/s per shape, each sample queued behind a GPU-side wait (GPU time alone)"),
    Record("attention", "h200x1", "local", "attention_vs_fa4", "attention_ladder",
           "MACHINE=h200x1 scripts/attention_vs_fa4.sh study:<s>",
           "ours / FA4 TFLOP/s per shape on one H200, same rounds"),
    Record("attention", "h100x1", "local", "attention_vs_fa4_unqueued", "attention_ladder",
           "MACHINE=h100x1 STUDY=gluon scripts/attention_vs_fa4.sh",
           "the same rungs timed from an idle GPU on the same card: 2 of 7 shapes >= 0.95 (the host's launch "
           "work in the sample)",
           current=False),
    Record("attention", "h200x1", "local", "attention_triton_vs_fa4", "attention_ladder",
           "scripts/attention_vs_fa4.sh", "no Triton variant reaches 0.95 of FA4's TFLOP/s", current=False),
    Record("attention", "h200x1", "local", "attention_triton_ladder", "attention_ladder",
           "python3 scripts/attention_ladder.py", "the Triton ladder beside cuDNN: which levers help", current=False),
    Record("attention", "h200x1", "local", "attention_gluon_persistent", "attention_ladder",
           "MACHINE=h200x1 STUDY=gluon scripts/attention_vs_fa4.sh",
           "a persistent grid (one CTA per SM walking tiles) moves ours by -1.7 .. +1.2 % "
           "at S >= 8K", current=False),
    Record("attention_clocks", "h100x1", "local", "attention_clocks", "attention_clocks",
           "MACHINE=h100x1 python3 scripts/attention_clocks.py", "ours / FA4 sustained at the 700 W cap"),
    Record("attention_layer", "h100x1", "local", "attention_layer", "attention_layer",
           "scripts/fa4_one_gpu.sh stash install, then MACHINE=h100x1 bash scripts/attention_layer_gpu.sh dev "
           "diffusers layer:540 pack",
           "xstage.attention beside FA4 and cuDNN: ours / flash_attn_func 0.97-1.07 plain, host 66-76 us per call "
           "(FA4's kernel direct 58-64), graphs bit-identical, fullgraph compile, Wan 2.1 block 1.08x SDPA"),
    # BLOCK: calibration
    Record("calibration", "h100x1", "host", "calibration/backpressure_sweep", "burst_gap",
           "xstage calibrate --link host --out data/h100x1/calibration", "the calibration plan's synchronised points"),
    Record("calibration_free_running", "h100x1", "host", "calibration/free_running", "burst_gap",
           "xstage calibrate --link host --out data/h100x1/calibration", "the plan's free-running points"),
    Record("calibration_drain", "h100x1", "host", "calibration/drain_programs", "burst_gap",
           "xstage calibrate --link host --out data/h100x1/calibration", "the plan's drain points"),
    Record("calibration_trains", "h100x1", "host", "calibration/trains", "burst_train",
           "xstage calibrate --link host --out data/h100x1/calibration", "the plan's trains"),
    Record("families", "h100x1", "host", "families", "burst_program",
           "xstage sweep families --out data/h100x1/families --targets host",
           "never-fitted traffic: store widths, warps, staggered starts, waves, per-program sizes"),
    *_chip_calibration("h100x1_second", "CAL_ARGS='--start-from data/h100x1/calibration' bash scripts/calibrate_check.sh",
                       "a second H100 chip"),
    *_chip_calibration("h100x1_third", "bash scripts/calibrate_check.sh (fit started from data/h200x1's)",
                       "a third H100 chip"),
    *_chip_calibration("h100x1_fourth", "bash scripts/calibrate_check.sh (fit started from data/h200x1's)",
                       "a fourth H100 chip"),
    *_chip_calibration("h100x1_fifth", "xstage calibrate --link host, then xstage sweep families --targets host "
                       "(the steps of scripts/calibrate_check.sh; fit started from data/h200x1's)", "a fifth H100 chip"),
    # BLOCK: launchers
    Record("launch_plain", "h100x1", "host", "launch_check/plain", "burst_gap", "OUT=... XSTAGE_GIT_COMMIT=<sha> bash scripts/launch_check.sh",
           "the plain command"),
    Record("launch_plain_again", "h100x1", "host", "launch_check/plain_again", "burst_gap", "OUT=... XSTAGE_GIT_COMMIT=<sha> bash scripts/launch_check.sh",
           "the plain command again"),
    Record("launch_torchrun", "h100x1", "host", "launch_check/torchrun", "burst_gap", "OUT=... XSTAGE_GIT_COMMIT=<sha> bash scripts/launch_check.sh",
           "under torchrun --nproc-per-node 1"),
    Record("launch_resumed", "h100x1", "host", "launch_check/resumed", "burst_gap", "OUT=... XSTAGE_GIT_COMMIT=<sha> bash scripts/launch_check.sh",
           "torchrun on part of the grid, then the plain command"),
    # BLOCK: predictions
    Record("scale_prediction", "h200x8", "nvlink", "prediction", "scale_prediction",
           "python -m xstage.scale_analysis --write",
           "PREDICTED, not measured: MegaMoE interleaved / Expert-Wave and Ulysses fused / serial at 8 GPUs, sealed "
           "with its commit before any 8-GPU or 8-rank measurement"),
)


class UnknownRecord(LookupError):
    """No record registered for the study / machine / link asked."""


def records(study: str | None = None, machine: str | None = None, link: str | None = None,
            current: bool | None = True) -> list[Record]:
    """Registered records matching every given field, in registry order (``current=None``: archived too)."""
    return [r for r in RECORDS if (study is None or r.study == study) and (machine is None or r.machine == machine)
            and (link is None or r.link == link) and (current is None or r.current == current)]


def record(study: str, machine: str | None = None, link: str | None = None) -> Record:
    """The one current record of ``study`` on ``machine`` and ``link`` (either may be left out when unique)."""
    if study not in STUDIES:
        raise UnknownRecord(f"unknown study {study!r}; studies: {', '.join(STUDIES)}")
    found = records(study, machine, link)
    if len(found) != 1:
        where = ", ".join(f"{r.machine}/{r.link}" for r in records(study)) or "none"
        raise UnknownRecord(f"study {study!r} has {len(found)} current records for machine={machine} "
                            f"link={link}; registered: {where}")
    return found[0]


def folder(study: str, machine: str | None = None, link: str | None = None) -> Path:
    """``data/<machine>/<folder>`` of the current record (see :func:`record`)."""
    return record(study, machine, link).path


def archived(machine: str) -> list[Record]:
    """The archived records of ``machine`` (each with the finding it supports)."""
    return records(machine=machine, current=False)


def archive_index(machine: str) -> str:
    """``data/<machine>/archive/README.md``: one line per archived record (generated; a test keeps it current)."""
    lines = [f"# Archived records of {MACHINES.get(machine, machine)}", "",
             "Superseded records a finding in docs/findings.md rests on; generated from xstage/records.py.", ""]
    lines += [f"- `{r.folder}/` ({r.study}, {r.link}): {r.shows}" for r in archived(machine)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m xstage.records [STUDY [MACHINE [LINK]]]``: the current records, one per line, as
    ``study machine link folder<TAB>command`` (scripts/device_session.sh's ``record:`` stage reads it)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) > 3 or any(a.startswith("-") for a in args):
        print("usage: python -m xstage.records [STUDY [MACHINE [LINK]]]", file=sys.stderr)
        return 2
    study, machine, link = (list(args) + [None] * 3)[:3]
    if study is not None and study not in STUDIES:
        print(f"xstage.records: error: unknown study {study!r}; studies: {', '.join(STUDIES)}", file=sys.stderr)
        return 2
    found = records(study, machine, link)
    if not found:
        print(f"xstage.records: error: no current record of {study} on {machine or 'any machine'}", file=sys.stderr)
        return 2
    for r in found:
        print(f"{r.study} {r.machine} {r.link} {r.folder}\t{r.command}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

