#!/usr/bin/env bash
# MegaMoE on ONE GPU, round 7 (issue 15, items 3-5 with tiles version 3: bf16's main loops through TMA): one device
# call of at most LIMIT seconds, in order:
#  1. install; the default kernels (bf16 TMA, fp8 pointer loops) compiled in the background (Triton's cache);
#  2. (TESTS = 1) GPU tests: tests/test_megamoe_gemm6.py -m gpu (the TMA layer beside the pointer loops, link local /
#     host), tests/test_moe_one_gpu.py -m gpu (the default path: every schedule x assignment bit-identical against
#     the float32 reference, combine poisoned, bf16 / fp8, link local / host);
#  3. study controls7 (xstage.moe_gemm: every schedule's compute-only time, dynamic, the default tiles, same rounds,
#     each list bit-identical to Expert-Wave static first) over the 84 configurations in table order, bf16 (<= CB_S)
#     then fp8 (<= CF_S), into the NEW folder $OUT/h200x1/megamoe_round7_controls/;
#  4. the host-link sweep (xstage sweep megamoe --world one-gpu --link host: every schedule's kernel beside the
#     Burst-Gap model's prediction with the host link's fitted stage model) with the time left, in the sweep's fixed
#     order, into the NEW folder $OUT/h200x1/megamoe_round7_host/.
# Both studies resume from their folders under data/h200x1/ when those hold part of them (time-bounded: what does
# not fit is resumed by the next call). Put XSTAGE_GIT_COMMIT=<local HEAD> in front (the device copy's HEAD is stale).
#   scripts/megamoe_round7.sh [LIMIT] [TESTS] [CB_S] [CF_S]
set -u
: "${OUT:?set OUT}"
LIMIT=${1:-570}; TESTS=${2:-1}; CB_S=${3:-120}; CF_S=${4:-170}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
CTRL=$OUT/h200x1/megamoe_round7_controls; HOST=$OUT/h200x1/megamoe_round7_host
mkdir -p "$OUT/logs" "$CTRL" "$HOST"
for f in megamoe_gemm.csv megamoe_gemm.json; do
  [ -e data/h200x1/megamoe_round7_controls/$f ] && cp data/h200x1/megamoe_round7_controls/$f "$CTRL/"; done
for f in megamoe.csv megamoe.json; do
  [ -e data/h200x1/megamoe_round7_host/$f ] && cp data/h200x1/megamoe_round7_host/$f "$HOST/"; done
STAGE_TAIL=${STAGE_TAIL:-12}; . "$(dirname "$0")/megamoe_stages.sh"      # stage, left, minutes
nvidia-smi -L
stage install 60 python3 -m pip install -q --no-deps --no-build-isolation -e .
for i in 0 1 2; do
  timeout 150 python3 scripts/megamoe_gemm.py --warm --dtypes bf16,fp8 --part $i --parts 3 \
    >"$OUT/logs/warm$i.log" 2>&1 &
done
if [ "$TESTS" = 1 ]; then
  stage test-tma 110 python3 -m pytest -q -x -s -p no:cacheprovider -m gpu tests/test_megamoe_gemm6.py
  stage test-one-gpu 100 python3 -m pytest -q -x -s -p no:cacheprovider -m gpu tests/test_moe_one_gpu.py
fi
for d in bf16 fp8; do
  if [ "$d" = bf16 ]; then L=$CB_S; else L=$CF_S; fi
  [ "$(left)" -lt "$L" ] && L=$(left)
  [ "$L" -gt 25 ] && stage controls7-$d $L python3 scripts/megamoe_gemm.py --study controls7 --dtypes $d \
    --out "$CTRL" --max-minutes "$(minutes "$L - 15")"
done
L=$(( $(left) - 10 ))
[ "$L" -gt 40 ] && stage host $L python3 -m xstage sweep megamoe --world one-gpu --ranks 2 --link host \
  --dtypes bf16,fp8 --out "$HOST" --max-minutes "$(minutes "$L - 25")"
wait; echo "== warm: $(cat "$OUT"/logs/warm*.log | grep -c 'warm:') variants"; grep -h failed "$OUT"/logs/warm*.log
grep -h "done in" "$OUT/logs/host.log" 2>/dev/null | tail -n 200 > "$OUT/logs/host_times.txt"
wc -l "$CTRL/megamoe_gemm.csv" "$HOST/megamoe.csv"
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
echo "total ${SECONDS}s"
