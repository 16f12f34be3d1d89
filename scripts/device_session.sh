#!/usr/bin/env bash
# One GPU-machine session, stage by stage, every stage bounded in time and logged under $OUT/logs/.
#   scripts/device_session.sh install test-moe test-ulysses ulysses:300 megamoe:8 megamoe-dynamic:8
# Sweeps write straight into $OUT/<machine>/ (appends are atomic, so a call cut short still returns every
# finished configuration), seeded from data/<machine>/ when that already holds part of a sweep (they resume).
# On one GPU (the host link as the remote path):
#   WORLD_SIZE=1 scripts/device_session.sh install test-host bandwidth burst-gap-host:240 free-running-host:240 trains:300
#   WORLD_SIZE=1 scripts/device_session.sh install test-host barrier-host:90 drain-host:90
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
    # the barrier-drains reading, falsifiable: the same grid with a release barrier (as recorded) and a relaxed one
    barrier-host:*) for b in release relaxed; do stage "barrier-$b" "${s#barrier-host:}" $PY -m xstage sweep burst-gap \
       --out "$SCRATCH/barrier_$b" --barrier "$b" --targets host --store-bytes 16 --programs 16,66,132,264 \
       --burst-kib 8,16,32,64,128,256 --gap-us 0,1,10,100 --bursts 8 --repeats 3; done ;;
    # the drain with few and many programs storing at once: long bursts, each followed by its drain fence
    drain-host:*) stage drain-host "${s#drain-host:}" $PY -m xstage sweep burst-gap --out "$SCRATCH/drain_programs" \
       --drain --targets host --store-bytes 16 --programs 1,2,4,8,16,32,66,132 --burst-kib 256,1024,4096 \
       --gap-us 0,10 --bursts 3 --repeats 3 ;;
    trains:*) seed burst_train; stage trains "${s#trains:}" $PY -m xstage sweep trains --out "$SCRATCH" \
       ${TRAIN_TARGETS:+--targets $TRAIN_TARGETS} ;;
    # the same trains per program, with each program's SM: who the stage favours, and whether it stays so
    trains-programs:*) stage trains-programs "${s#trains-programs:}" $PY -m xstage sweep trains \
       --out "$SCRATCH/train_programs" --targets host --per-program --repeats 3; \
       for f in burst_program burst_train; do [ -e "$SCRATCH/train_programs/$f.csv" ] && \
       gzip -f "$SCRATCH/train_programs/$f.csv"; done ;;
    # the same trains in N fresh processes on one GPU (issue 11: what a record reproduces from process to process,
    # the floor under any model's error); one folder per process, flat so that every file comes back
    trains-processes:*) for i in $(seq 0 $(( ${s#trains-processes:} - 1 ))); do
       stage trains-process-$i 150 $PY -m xstage sweep trains --out "$SCRATCH/train_processes_p$i" --targets host \
       --per-program --programs 16,66,132 --count 12 --repeats 2; \
       for f in burst_program burst_train; do [ -e "$SCRATCH/train_processes_p$i/$f.csv" ] && \
       gzip -f "$SCRATCH/train_processes_p$i/$f.csv"; done; done ;;
    # program counts never recorded before (placements the model never saw), a new seed: held out whole
    trains-new-p:*) stage trains-new-p "${s#trains-new-p:}" $PY -m xstage sweep trains --out "$SCRATCH/train_programs_new_p" \
       --targets host --per-program --programs 24,40,80,120,160,200 --seed 11 --count 6 --repeats 3; \
       for f in burst_program burst_train; do [ -e "$SCRATCH/train_programs_new_p/$f.csv" ] && \
       gzip -f "$SCRATCH/train_programs_new_p/$f.csv"; done ;;
    # small bursts on a link fed by few to all programs (issue 11, session 18): the regime the fitted models miss
    # (bursts <= 48 KiB, gaps up to 50 us), a new seed, never fitted: held out whole
    trains-small:*) stage trains-small "${s#trains-small:}" $PY -m xstage sweep trains --out "$SCRATCH/trains_small_bursts" \
       --targets host --per-program --programs 66,100,132,200 --seed 18 --count 10 --kib 2,48 --gap-us 0.5,50 \
       --repeats 3; for f in burst_program burst_train; do [ -e "$SCRATCH/trains_small_bursts/$f.csv" ] && \
       gzip -f "$SCRATCH/trains_small_bursts/$f.csv"; done ;;
    # (CLEAN_SUFFIX=_r2: the same records again, in another process, into <name>_r2: the clean records' floor)
    # every train record re-recorded with the clean kernel (session 22: the legacy kernel's per-burst reads waited
    # behind the stores at every burst, run S20-2), burst_train only (per-program rows would outgrow the 64 MiB the
    # device tool carries): the fitted seed-0 family with its local control, the four
    # held-out families (same seeds, sizes, gaps and program counts as recorded), and a new seed never recorded
    trains-clean:*) secs=${s#trains-clean:}
       for v in "train_clean_seed0|--targets host,local" \
                "independent_clean|--targets host --seed 7 --count 16 --kib 4,1024 --gap-us 1,300" \
                "train_programs_p_clean|--targets host --programs 1,2,4,8,16,32,48,66,100,132,198,264 --seed 7 --count 6" \
                "train_programs_new_p_clean|--targets host --programs 24,40,80,120,160,200 --seed 11 --count 6" \
                "train_small_clean|--targets host --programs 66,100,132,200 --seed 18 --count 10 --kib 2,48 --gap-us 0.5,50" \
                "train_seed22_clean|--targets host --seed 22"; do
         sub=${v%%|*}${CLEAN_SUFFIX:-}; stage "$sub" "$secs" $PY -m xstage sweep trains --out "$SCRATCH/$sub" --repeats 3 \
           ${v#*|}
         for f in burst_program burst_train; do [ -e "$SCRATCH/$sub/$f.csv" ] && gzip -f "$SCRATCH/$sub/$f.csv"; done
       done ;;
    # designed probe trains with the probe's size as the variable (session 22): a 32 or 128 KiB lead, 0.5 us, then
    # probes of 2 / 4 / 8 / 16 / 32 KiB, P = 66 / 132 / 264, per program: how much a program issues past a full stage
    trains-probe-size:*) stage probe_trains_sizes "${s#trains-probe-size:}" $PY -m xstage sweep trains \
       --out "$SCRATCH/probe_trains_sizes" --targets host --per-program --programs 66,132,264 --family probe_size \
       --repeats 3; for f in burst_program burst_train; do [ -e "$SCRATCH/probe_trains_sizes/$f.csv" ] && \
       gzip -f "$SCRATCH/probe_trains_sizes/$f.csv"; done ;;
    # the load-after-store test (session 22): one timed load after each burst, of a word in L1 (kind 1) or in L2
    # (kind 2), the first 8 trains of the seed-0 family per program at P = 132 / 264, host; kind 2 on the local
    # target too (the control: its stores drain at once)
    trains-load:*) secs=${s#trains-load:}
       for v in "train_load_l1_s22|--targets host --load-probe 1 --programs 132,264" \
                "trains_load_probe_l2|--targets host --load-probe 2 --programs 132,264" \
                "train_load_l2_local_s22|--targets local --load-probe 2 --programs 132"; do
         sub=${v%%|*}; stage "$sub" "$secs" $PY -m xstage sweep trains --out "$SCRATCH/$sub" --per-program \
           --repeats 3 --count 8 ${v#*|}
         for f in burst_program burst_train; do [ -e "$SCRATCH/$sub/$f.csv" ] && gzip -f "$SCRATCH/$sub/$f.csv"; done
       done ;;
    # designed probe trains (issue 11, session 19): a lead burst of 8-128 KiB per program, a gap of 0.5-20 us, then
    # 2 KiB probes 3 us apart, P = 16 / 66 / 132 / 264, per program: what holds a small burst back after a big one
    trains-probe:*) stage trains-probe "${s#trains-probe:}" $PY -m xstage sweep trains --out "$SCRATCH/probe_trains" \
       --targets host --per-program --programs 16,66,132,264 --family probe --repeats 3; \
       for f in burst_program burst_train; do [ -e "$SCRATCH/probe_trains/$f.csv" ] && \
       gzip -f "$SCRATCH/probe_trains/$f.csv"; done ;;
    # the train kernel's per-burst parameter reads, A/B in one call (session 20, runs S20-1/2): before session 20
    # the kernel read each burst's size / offset / gap at its top (--no-preload); now before the first burst
    trains-preload-ab:*) for v in probe:legacy:--no-preload probe:preload: random:preload: random:legacy:--no-preload; do
       fam=${v%%:*}; rest=${v#*:}; name=${rest%%:*}; flag=${rest#*:}; sub=train_${fam}_s20_$name
       [ "$fam" = random ] && sub=train_s20_$name
       stage "$sub" "${s#trains-preload-ab:}" $PY -m xstage sweep trains --out "$SCRATCH/$sub" --targets host \
         --per-program --programs 16,66,132,264 --family "$fam" --repeats 3 $flag
       for f in burst_program burst_train; do [ -e "$SCRATCH/$sub/$f.csv" ] && gzip -f "$SCRATCH/$sub/$f.csv"; done
     done ;;
    bandwidth) stage bandwidth 300 $PY -m xstage bench bandwidth --out "$SCRATCH" --world-size "$WORLD_SIZE" ;;
    burst-gap:*) seed burst_gap; stage burst-gap "${s#burst-gap:}" $PY -m xstage sweep burst-gap --out "$SCRATCH" \
       --world-size "$WORLD_SIZE"; [ -e "$SCRATCH/burst_gap.csv" ] && gzip -f "$SCRATCH/burst_gap.csv" ;;
    ulysses:*) [ "${FRESH_ULYSSES:-0}" = 1 ] || seed ulysses; stage ulysses "${s#ulysses:}" $PY -m xstage sweep ulysses \
       --out "$SCRATCH" --world-size "$WORLD_SIZE" ;;
    megamoe:*) seed megamoe; m=${s#megamoe:}
       stage megamoe $(( m * 60 + 120 )) $PY -m xstage sweep megamoe --out "$SCRATCH" --max-minutes "$m" \
       --world-size "$WORLD_SIZE" ;;
    megamoe-dynamic:*) seed megamoe dynamic; m=${s#megamoe-dynamic:}
       stage megamoe-dynamic $(( m * 60 + 120 )) $PY -m xstage sweep megamoe --out "$SCRATCH/dynamic" \
       --max-minutes "$m" --world-size "$WORLD_SIZE" --assignment dynamic ;;
    # 8-rank traffic on 2 GPUs (issue 13; nvidia-h200-x2): the 2-GPU checks first, then the sweeps into traffic8/
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
