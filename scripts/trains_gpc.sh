#!/usr/bin/env bash
# Issue 11 (one H200, ~60 s): per-program host-link trains with the SM -> GPC map read in the same process
# (scripts/trains_gpc.py), between two maps read by separate processes (scripts/gpc_map.sh), all into
# $OUT/h200x1/train_gpc/ (the separate processes' maps into $OUT/h200x1/train_gpc_process_{a,c}/: folders two levels
# under h200x1/ do not come back from the device). Put XSTAGE_GIT_COMMIT=<local HEAD> in front (the device copy's
# HEAD is stale). Arguments go to scripts/trains_gpc.py (e.g. --programs 100,132,198,264); TRAIN_GPC_NAME=<folder>
# records into $OUT/h200x1/<folder>/ (and <folder>_process_{a,c}/) instead of train_gpc/.
set -euo pipefail
: "${OUT:?set OUT}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
D=$OUT/h200x1/${TRAIN_GPC_NAME:-train_gpc}        # TRAIN_GPC_NAME=<folder> for a second record
mkdir -p "$D"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "note: pip install -e . failed"
nvcc -O2 -arch=sm_90 -shared -Xcompiler -fPIC -DGPC_MAP_LIB -o /tmp/libgpcmap.so scripts/gpc_map.cu
GPC_MAP_DIR=${D}_process_a bash scripts/gpc_map.sh >/dev/null
timeout 240 python3 scripts/trains_gpc.py /tmp/libgpcmap.so "$D" "$@" 2>&1 | tail -5
GPC_MAP_DIR=${D}_process_c bash scripts/gpc_map.sh >/dev/null
gzip -f "$D"/burst_program.csv "$D"/burst_train.csv 2>/dev/null || true
ls -la "$D" "${D}_process_a"
