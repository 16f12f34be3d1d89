#!/usr/bin/env bash
# One GPU, ~2-3 minutes (at most 120 s install + 5 x 90 s): the burst-gap sweep of the host link (targets
# host,local; one rank) run by the plain command twice (xstage's own ranks: the run-to-run spread), under
# `torchrun --nproc-per-node 1`, and once started under torchrun on part of the grid and finished by the plain
# command (one record, two launchers); then scripts/launch_check.py compares them. Everything under
# $OUT/launch_check/ (logs in $OUT/logs/).
#   OUT=... scripts/launch_check.sh            (GRID="--burst-kib 1 ..." replaces the grid; PY=python3)
# On a CPU (a dry run of the script itself): TRITON_INTERPRET=1 XSTAGE_CPU_RANKS=1 GRID="--burst-kib 1,2
#   --gap-us 0 --programs 1,2 --store-bytes 16 --bursts 2 --repeats 2" OUT=/tmp/x scripts/launch_check.sh
set -u
: "${OUT:?set OUT}"
PY=${PY:-python3}
D=$OUT/launch_check
mkdir -p "$OUT/logs" "$D"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
export XSTAGE_GIT_COMMIT=${XSTAGE_GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
GRID=${GRID:---burst-kib 1,16,256 --gap-us 0,10 --programs 1,16,132 --store-bytes 16 --bursts 8 --repeats 5}
# the part of the grid the torchrun-started record holds before the plain command finishes it
PART=$(echo "$GRID" | sed -E 's/--burst-kib ([0-9]+)[^ ]*/--burst-kib \1/')
SWEEP=(sweep burst-gap --targets host,local)
TORCHRUN=("$PY" -m torch.distributed.run --standalone --nproc-per-node 1 -m xstage)
stage() {  # name, seconds, command...
  local name=$1 secs=$2; shift 2; local t0=$SECONDS; echo "== $name (limit ${secs}s)"
  timeout --signal=INT --kill-after=20 "$secs" "$@" >"$OUT/logs/$name.log" 2>&1
  echo "   rc=$? in $((SECONDS - t0))s"; tail -n 4 "$OUT/logs/$name.log" | sed 's/^/   | /'; }
[ -n "${TRITON_INTERPRET:-}" ] || { nvidia-smi -L; stage install 120 "$PY" -m pip install -q --no-deps --no-build-isolation -e .; }
rm -rf "$D"/plain "$D"/plain_again "$D"/torchrun "$D"/resumed
# shellcheck disable=SC2086  # GRID is a list of options
stage plain 90 "$PY" -m xstage "${SWEEP[@]}" --out "$D/plain" $GRID
# shellcheck disable=SC2086
stage torchrun 90 "${TORCHRUN[@]}" "${SWEEP[@]}" --out "$D/torchrun" $GRID
# shellcheck disable=SC2086
stage plain-again 90 "$PY" -m xstage "${SWEEP[@]}" --out "$D/plain_again" $GRID
# shellcheck disable=SC2086
stage resumed-torchrun-part 90 "${TORCHRUN[@]}" "${SWEEP[@]}" --out "$D/resumed" $PART
# shellcheck disable=SC2086
stage resumed-plain-rest 90 "$PY" -m xstage "${SWEEP[@]}" --out "$D/resumed" $GRID
"$PY" -c "import json, sys; m = json.load(open(sys.argv[1])); print('resumed record, launchers:', [m.get('launcher')] + [r.get('launcher') for r in m['runs']])" "$D/resumed/burst_gap.json"
"$PY" scripts/launch_check.py "$D/plain" "$D/plain_again" "$D/torchrun" "$D/resumed" --csv "$D/compare.csv" \
  2>&1 | tee "$D/compare.txt"
