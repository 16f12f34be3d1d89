#!/usr/bin/env bash
# MegaMoE on ONE GPU, round 11 (issue 15 item 3, "schedules free in compute": lag's lag; and a repeat of study
# gemm10): one device call of at most LIMIT seconds (default 420), in order:
#  1. install; the studies' kernels compiled in the background (3 processes) while the tests run;
#  2. the GPU tests (<= TESTS_S seconds): tests/test_moe_one_gpu.py's default path against the float32 reference
#     (every schedule x assignment bit-identical, links local and host, bf16 and fp8; no kernel changed this round);
#  3. study lags11 (xstage.moe_gemm: Expert-Wave beside lag at 1, 1.5, 2 x n_sms and lag version 2's rule, every
#     list bit-identical to Expert-Wave static first, compute only, dynamic, tiles version 5) for LAG_DTYPES
#     (default fp8,bf16) into the NEW folder $OUT/h200x1/megamoe_round11_lags/;
#  4. study gemm10 again (fp8, all 84: the version-5 default beside bm_alt and s_plus, and torch._scaled_grouped_mm;
#     whether s_plus's 0.977x of round 10 repeats) into the NEW folder $OUT/h200x1/megamoe_round11_gemm_repeat/;
#  5. the summaries (lags11_summary; gemm10's variants and rule, beside round 10's record).
# A stage given 0 seconds is skipped. Each folder is resumed from data/h200x1/<same name>/ when that exists
# (time-bounded: no configuration starts after its bound; run the script again to go on). Files that come back:
# 2 per folder + logs.tgz = 5 (of at most 8). Put XSTAGE_GIT_COMMIT=<local HEAD> in front (the device copy's HEAD
# is stale).
#   scripts/megamoe_round11.sh [LIMIT] [TESTS_S] [LAGS_S] [GEMM_S] [LAG_DTYPES]
set -u
: "${OUT:?set OUT}"
LIMIT=${1:-420}; TESTS_S=${2:-45}; LAGS_S=${3:-230}; GEMM_S=${4:-100}; LAG_DTYPES=${5:-fp8,bf16}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
LAGS=$OUT/h200x1/megamoe_round11_lags; REP=$OUT/h200x1/megamoe_round11_gemm_repeat
mkdir -p "$OUT/logs" "$LAGS" "$REP"
for d in "$LAGS" "$REP"; do
  for f in megamoe_gemm.csv megamoe_gemm.json; do
    [ -e "data/h200x1/$(basename "$d")/$f" ] && cp "data/h200x1/$(basename "$d")/$f" "$d/"; done; done
STAGE_TAIL=${STAGE_TAIL:-12}; . "$(dirname "$0")/megamoe_stages.sh"      # stage, left, minutes
nvidia-smi -L
stage install 60 python3 -m pip install -q --no-deps --no-build-isolation -e .
WARM=$(python3 -c "print(','.join(sorted(set('$LAG_DTYPES'.split(',')) | {'fp8'})))")   # gemm10 is fp8
for i in 0 1 2; do
  timeout 200 python3 scripts/megamoe_gemm.py --warm --dtypes "$WARM" --part $i --parts 3 >"$OUT/logs/warm$i.log" 2>&1 &
done
L=$(( $(left) - 300 < TESTS_S ? $(left) - 300 : TESTS_S ))
[ "$L" -gt 20 ] && STAGE_TAIL=4 stage tests $L python3 -m pytest -q -s -p no:cacheprovider -m gpu \
  tests/test_moe_one_gpu.py -k fused_layer_against_reference
[ -e "$OUT/logs/tests.log" ] && grep -h "one GPU, link" "$OUT/logs/tests.log" | cut -c1-240
R=$([ "$GEMM_S" -gt 0 ] && echo 60 || echo 15)             # what gemm10 keeps at least
L=$(( $(left) - R < LAGS_S ? $(left) - R : LAGS_S ))
[ "$L" -gt 40 ] && stage lags11 $L python3 scripts/megamoe_gemm.py --study lags11 --dtypes "$LAG_DTYPES" --out "$LAGS" \
  --max-minutes "$(minutes "$L - 20")"
L=$(( $(left) - 50 < GEMM_S ? $(left) - 50 : GEMM_S ))              # 50 s kept: the summaries, the tar
[ "$L" -gt 40 ] && stage gemm10 $L python3 scripts/megamoe_gemm.py --study gemm10 --dtypes fp8 --out "$REP" \
  --max-minutes "$(minutes "$L - 20")"
wait; echo "== warm: $(cat "$OUT"/logs/warm*.log | grep -c 'warm:') variants"; grep -h failed "$OUT"/logs/warm*.log
wc -l "$LAGS"/*.csv "$REP"/*.csv 2>/dev/null
timeout 45 python3 scripts/megamoe_round11_summary.py "$LAGS" "$REP" data/h200x1/megamoe_round10_gemm 2>&1 | tail -n 40
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
echo "total ${SECONDS}s"
