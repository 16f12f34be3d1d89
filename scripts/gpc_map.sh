#!/usr/bin/env bash
# Issue 11 (one H200): the chip's SM -> GPC map from thread-block clusters (scripts/gpc_map.cu), built there
# with the image's nvcc, into $OUT/h200x1/gpc_map/ (gpc_map.jsonl: the program's lines; gpc_map.json: provenance).
# Put XSTAGE_GIT_COMMIT=<local HEAD> in front (the device copy's HEAD is stale). ~15 s.
set -euo pipefail
: "${OUT:?set OUT}"
D=${GPC_MAP_DIR:-$OUT/h200x1/gpc_map}
mkdir -p "$D"
nvcc -O2 -arch=sm_90 -o /tmp/gpc_map scripts/gpc_map.cu
timeout 120 /tmp/gpc_map > "$D/gpc_map.jsonl.part"
mv "$D/gpc_map.jsonl.part" "$D/gpc_map.jsonl"
python3 - "$D" <<'PY'
import hashlib, json, subprocess, sys, datetime, os, platform
d = sys.argv[1]
raw = open(f"{d}/gpc_map.jsonl", "rb").read()
def out(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as e:
        return f"unavailable: {e}"
meta = {"kind": "gpc_map", "version": 1, "what": "SM -> GPC map from thread-block clusters (scripts/gpc_map.cu)",
        "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": os.environ.get("XSTAGE_GIT_COMMIT", "unknown"), "host": platform.node(),
        "nvidia_smi_L": out(["nvidia-smi", "-L"]), "driver": out(["nvidia-smi", "--query-gpu=driver_version",
        "--format=csv,noheader"]), "nvcc": out(["nvcc", "--version"]).splitlines()[-1:],
        "jsonl_sha256": hashlib.sha256(raw).hexdigest(), "command": "bash scripts/gpc_map.sh"}
json.dump(meta, open(f"{d}/gpc_map.json", "w"), indent=1)
print(json.dumps({k: meta[k] for k in ("nvidia_smi_L", "driver", "jsonl_sha256")}))
PY
head -c 300 "$D/gpc_map.jsonl"; echo; grep -c blocks "$D/gpc_map.jsonl"; grep error "$D/gpc_map.jsonl" || true
