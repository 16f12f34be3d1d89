#!/usr/bin/env bash
# MegaMoE on ONE GPU, round 8 (issue 15, items 2 and 4 with tiles version 3): one device call of at most LIMIT
# seconds, in order:
#  1. install; the studies' kernels (bf16 TMA, fp8 pointer loops, fp8 through TMA) compiled in the background;
#  2. the round-7 host-link sweep resumed (xstage sweep megamoe --world one-gpu --link host, <= HOST_S seconds):
#     data/h200x1/megamoe_round7_host/ copied to $OUT/h200x1/megamoe_round7_host/ and appended, the sweep's fixed
#     order (what is recorded is skipped);
#  3. study gemm8 (xstage.moe_gemm: the default's Expert-Wave compute-only time beside torch._grouped_mm and, for
#     fp8, torch._scaled_grouped_mm, same rounds; fp8 also through TMA, checked bit-identical to the pointer loops
#     on every rank before timing) over the 84 configurations, bf16 then fp8, with the time left, into the NEW
#     folder $OUT/h200x1/megamoe_round8_gemm/ (resumes from data/h200x1/megamoe_round8_gemm/ when that exists).
# Put XSTAGE_GIT_COMMIT=<local HEAD> in front (the device copy's HEAD is stale).
#   scripts/megamoe_round8.sh [LIMIT] [HOST_S]
set -u
: "${OUT:?set OUT}"
LIMIT=${1:-480}; HOST_S=${2:-170}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
HOST=$OUT/h200x1/megamoe_round7_host; GEMM=$OUT/h200x1/megamoe_round8_gemm
mkdir -p "$OUT/logs" "$HOST" "$GEMM"
for f in megamoe.csv megamoe.json; do
  [ -e data/h200x1/megamoe_round7_host/$f ] && cp data/h200x1/megamoe_round7_host/$f "$HOST/"; done
for f in megamoe_gemm.csv megamoe_gemm.json; do
  [ -e data/h200x1/megamoe_round8_gemm/$f ] && cp data/h200x1/megamoe_round8_gemm/$f "$GEMM/"; done
STAGE_TAIL=${STAGE_TAIL:-12}; . "$(dirname "$0")/megamoe_stages.sh"      # stage, left, minutes
nvidia-smi -L
stage install 60 python3 -m pip install -q --no-deps --no-build-isolation -e .
for i in 0 1 2; do
  timeout 200 python3 scripts/megamoe_gemm.py --warm --dtypes bf16,fp8 --part $i --parts 3 \
    >"$OUT/logs/warm$i.log" 2>&1 &
done
L=$(( $(left) - 60 < HOST_S ? $(left) - 60 : HOST_S ))
[ "$L" -gt 40 ] && stage host $L python3 -m xstage sweep megamoe --world one-gpu --ranks 2 --link host \
  --dtypes bf16,fp8 --out "$HOST" --max-minutes "$(minutes "$L - 25")"
L=$(( $(left) - 10 ))
[ "$L" -gt 40 ] && stage gemm8 $L python3 scripts/megamoe_gemm.py --study gemm8 --out "$GEMM" \
  --max-minutes "$(minutes "$L - 20")"
wait; echo "== warm: $(cat "$OUT"/logs/warm*.log | grep -c 'warm:') variants"; grep -h failed "$OUT"/logs/warm*.log
grep -h "done in" "$OUT/logs/host.log" 2>/dev/null | tail -n 40 > "$OUT/logs/host_times.txt"
grep -h "megamoe-gemm (gemm8)" "$OUT/logs/gemm8.log" 2>/dev/null | grep -v weights | cut -c1-400 | tail -n 12
wc -l "$HOST/megamoe.csv" "$GEMM/megamoe_gemm.csv"
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
echo "total ${SECONDS}s"
