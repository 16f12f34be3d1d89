#!/usr/bin/env bash
# Issue 40, one card (nvidia-h100-x1 or nvidia-h200; ~2-4 minutes): `xstage calibrate --link host` (the short plan,
# bit-exact destinations, then the host link's full model fitted on this machine's CPUs) and the never-fitted
# traffic families (xstage sweep families), everything under /tmp/xstage-calib/<machine>/ and packed into
# $OUT/<machine>-calibration.tar.gz (at most 8 files come back from the device: the tar, the summary, the logs).
#   OUT=... bash scripts/calibrate_check.sh            (MACHINE: h100x1 / h200x1 from the GPU's name)
#   CAL_ARGS="--start-from data/h100x1/calibration"    (the fit started from the other card's calibration; carry
#                                                       its stage_fit_host.json.gz where data/ is out of the index)
# The tracked tree (67.8 MB with five chips' records) is over the 64 MiB a device call carries: call with data/ out
# of the index (git rm -r -q --cached data; /data/ in .git/info/exclude; afterwards git reset -q -- data and that
# line removed) and carry data/h200x1/stage_fit_host.json.gz, the fit's start.
# Put XSTAGE_GIT_COMMIT=<local HEAD> in front (the device copy's HEAD is stale). Unpack with
#   tar -C data -xzf <machine>-calibration.tar.gz     -> data/<machine>/calibration/, data/<machine>/families/
set -uo pipefail
: "${OUT:?set OUT to the folder that comes back}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
export XSTAGE_GIT_COMMIT=${XSTAGE_GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
ln -sfn ../kernels xstage/kernels            # the device copy has no editable install
MACHINE=${MACHINE:-$(python3 -c "from xstage import env; print(env.machine_name())")}
ROOT=/tmp/xstage-calib
W=$ROOT/$MACHINE
rm -rf "$ROOT" && mkdir -p "$W"
nvidia-smi -L | tee "$OUT/gpus.txt"
nproc >> "$OUT/gpus.txt"
t0=$SECONDS
timeout --signal=INT --kill-after=20 420 python3 -m xstage calibrate --link host --out "$W/calibration" ${CAL_ARGS:-} \
  >"$OUT/calibrate.log" 2>&1
echo "calibrate rc=$? wall $((SECONDS - t0)) s" | tee -a "$OUT/calibrate.log"
cp "$W/calibration/calibration_summary.txt" "$OUT/" 2>/dev/null
t1=$SECONDS
timeout --signal=INT --kill-after=20 150 python3 -m xstage sweep families --out "$W/families" --targets host \
  >"$OUT/families.log" 2>&1
echo "families rc=$? wall $((SECONDS - t1)) s" | tee -a "$OUT/families.log"
for f in "$W"/*/*.csv; do [ -e "$f" ] && [ "$(stat -c %s "$f")" -gt 4000000 ] && gzip -f "$f"; done
tar -C "$ROOT" -czf "$OUT/$MACHINE-calibration.tar.gz" "$MACHINE"
ls -la "$OUT"
tail -n 40 "$OUT/calibration_summary.txt" 2>/dev/null
