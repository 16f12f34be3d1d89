#!/usr/bin/env bash
# One GPU-machine session, stage by stage, every stage bounded in time and logged under $OUT/logs/.
#   scripts/device_session.sh install test-moe test-ulysses ulysses:300 megamoe:8
# Sweeps write straight into $OUT/<machine>/ (appends are atomic, so a call cut short still returns every
# finished configuration), seeded from data/<machine>/ when that already holds part of a sweep (they resume).
# On one GPU (the host link as the remote path):
#   WORLD_SIZE=1 scripts/device_session.sh install test-host bandwidth burst-gap-host:240 free-running-host:240 trains:300
#   WORLD_SIZE=1 scripts/device_session.sh install record:trains_small_bursts:300 record:drain:90
# Needs OUT. WORLD_SIZE (default 2) ranks, one per GPU; MACHINE defaults to h200x<WORLD_SIZE>; FRESH_ULYSSES=1
# starts the Ulysses sweep afresh. 8-rank traffic on 2 GPUs (nvidia-h200-x2):
#   scripts/device_session.sh install test-traffic8 ulysses-traffic8:400 megamoe-traffic8:8
# On 8 GPUs, everything the notebooks need:
#   WORLD_SIZE=8 scripts/device_session.sh install test-remote bandwidth burst-gap:300 ulysses:400 megamoe:9
# A failing stage is logged and the next one still runs. Files over 16 MiB do not come back from the device
# tool: the burst-gap CSV (~18 MB) is gzip-compressed when its stage ends (xstage.data reads .csv.gz).
set -u
: "${OUT:?set OUT to the folder that comes back}"
WORLD_SIZE=${WORLD_SIZE:-2}
MACHINE=${MACHINE:-h200x$WORLD_SIZE}
SCRATCH=$OUT/$MACHINE
mkdir -p "$OUT/logs" "$SCRATCH"
PY=${PY:-python3}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export XSTAGE_GIT_COMMIT=${XSTAGE_GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}

seed() {   # data/<machine>[/<sub>]/<name>.{csv,json} -> scratch, once (a sweep started here resumes from it)
  local sub=${2:+/$2}
  mkdir -p "$SCRATCH$sub"
  for f in "data/$MACHINE$sub/$1.csv" "data/$MACHINE$sub/$1.json"; do
    [ -e "$f" ] && [ ! -e "$SCRATCH$sub/$(basename "$f")" ] && cp "$f" "$SCRATCH$sub/"
  done
  return 0
}

stage() {  # name, seconds, command...
  local name=$1 secs=$2; shift 2
  local t0=$SECONDS
  echo "== $name (limit ${secs}s)"
  timeout --signal=INT --kill-after=20 "$secs" "$@" >"$OUT/logs/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc in $((SECONDS - t0))s; tail:"; tail -n 8 "$OUT/logs/$name.log" | sed 's/^/   | /'
}

nvidia-smi -L | tee "$OUT/logs/gpus.txt"
for s in "$@"; do
  case $s in
    install) stage install 120 $PY -m pip install -q --no-deps --no-build-isolation -e . ;;
    test-moe) stage test-moe 300 $PY -m pytest -q -x -p no:cacheprovider tests/test_moe_gpu.py ;;
    test-ulysses) stage test-ulysses 240 $PY -m pytest -q -x -p no:cacheprovider tests/test_ulysses_gpu.py ;;
    test-remote) stage test-remote 180 $PY -m pytest -q -x -p no:cacheprovider tests/test_remote_store_gpu.py ;;
    test-host) stage test-host 180 $PY -m pytest -q -x -p no:cacheprovider -m gpu tests/test_remote_store_gpu.py ;;
    # the host link on one GPU: pinned host memory over PCIe (sizes up to 1 MiB per program: it is ~7x slower)
    burst-gap-host:*) seed burst_gap; stage burst-gap-host "${s#burst-gap-host:}" $PY -m xstage sweep burst-gap \
       --out "$SCRATCH" --targets host,local --store-bytes 16 --burst-kib 1,2,4,8,16,32,64,128,256,512,1024; \
       [ -e "$SCRATCH/burst_gap.csv" ] && gzip -f "$SCRATCH/burst_gap.csv" ;;
    free-running-host:*) seed burst_gap free_running; stage free-running-host "${s#free-running-host:}" $PY -m xstage \
       sweep burst-gap --out "$SCRATCH/free_running" --no-sync --targets host,local --store-bytes 16 \
       --burst-kib 1,2,4,8,16,32,64,128,256,512,1024; \
       [ -e "$SCRATCH/free_running/burst_gap.csv" ] && gzip -f "$SCRATCH/free_running/burst_gap.csv" ;;
    trains:*) seed burst_train; stage trains "${s#trains:}" $PY -m xstage sweep trains --out "$SCRATCH" \
       ${TRAIN_TARGETS:+--targets $TRAIN_TARGETS} ;;
    # any current record of this machine, by its study name in xstage/records.py, re-recorded with the command the
    # registry names into $SCRATCH/<its folder>: record:trains_small_bursts:300
    record:*) spec=${s#record:}; study=${spec%%:*}; secs=${spec#*:}; [ "$secs" = "$spec" ] && secs=300
       while IFS=$'\t' read -r head cmd; do
         folder=${head##* }; sub=$SCRATCH/$folder
         case $cmd in xstage\ *) ;; *) echo "   $study: recorded by a script ($cmd), not a stage" >&2; continue ;; esac
         stage "record-$folder" "$secs" $PY -m ${cmd//DIR/$sub}
         for f in "$sub"/*.csv; do [ -e "$f" ] && [ "$(stat -c %s "$f")" -gt 8000000 ] && gzip -f "$f"; done
       done < <($PY -m xstage.records "$study" "$MACHINE") ;;
    bandwidth) stage bandwidth 300 $PY -m xstage bench bandwidth --out "$SCRATCH" --world-size "$WORLD_SIZE" ;;
    burst-gap:*) seed burst_gap; stage burst-gap "${s#burst-gap:}" $PY -m xstage sweep burst-gap --out "$SCRATCH" \
       --world-size "$WORLD_SIZE"; [ -e "$SCRATCH/burst_gap.csv" ] && gzip -f "$SCRATCH/burst_gap.csv" ;;
    ulysses:*) [ "${FRESH_ULYSSES:-0}" = 1 ] || seed ulysses; stage ulysses "${s#ulysses:}" $PY -m xstage sweep ulysses \
       --out "$SCRATCH" --ranks "$WORLD_SIZE" ;;
    megamoe:*) seed megamoe; m=${s#megamoe:}
       stage megamoe $(( m * 60 + 120 )) $PY -m xstage sweep megamoe --out "$SCRATCH" --max-minutes "$m" \
       --world-size "$WORLD_SIZE" ;;
    # 8-rank traffic on 2 GPUs (nvidia-h200-x2): the 2-GPU checks first, then the sweeps into traffic8/
    test-traffic8) stage test-traffic8 900 $PY -m pytest -q -x -p no:cacheprovider -m multigpu tests/test_traffic8.py \
       tests/test_traffic8_ulysses.py ;;
    megamoe-traffic8:*) seed megamoe_traffic traffic8; m=${s#megamoe-traffic8:}
       stage megamoe-traffic8 $(( m * 60 + 120 )) $PY -m xstage sweep megamoe --traffic-ranks 8 \
       --out "$SCRATCH/traffic8" --max-minutes "$m" ;;
    ulysses-traffic8:*) seed ulysses_traffic traffic8; stage ulysses-traffic8 "${s#ulysses-traffic8:}" $PY -m xstage \
       sweep ulysses --traffic-ranks 8 --out "$SCRATCH/traffic8" ;;
    *) echo "unknown stage $s" >&2 ;;
  esac
done
