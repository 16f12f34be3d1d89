#!/usr/bin/env bash
# MegaMoE on ONE GPU, round 6 (issue 15, item 2: bf16 GEMM phases at library speed): one device call of at most
# LIMIT seconds, in order:
#  1. install; the bf16 kernel variants (round 6's TMA main loops among them) compiled in the background
#     (Triton's cache, no launch, 3 processes);
#  2. (TESTS = 1) GPU tests: tests/test_megamoe_gemm6.py -m gpu (the fused layer with the TMA main loops against the
#     float32 reference on fresh inputs, combine poisoned, every schedule x assignment bit-identical, link local /
#     host; beside the pointer loops), then tests/test_moe_one_gpu.py -m gpu (the default path, unchanged);
#  3. study tiles6 (xstage.moe_gemm.TILES6_VARIANTS: TMA main loops beside the default pointer loops, swizzle 16 and
#     torch._grouped_mm, same rounds, the 56 configurations with >= 2048 rows on rank 0, table order) with the time
#     left, into the NEW folder $OUT/h200x1/megamoe_round6_gemm/ (resumed from data/h200x1/megamoe_round6_gemm/).
#  4. (REST = 1) study tiles6 on the other 28 of the 84 configurations (< 2048 rows on rank 0) into the same folder:
#     the geomean over the 84; then the 56 again into $OUT/h200x1/megamoe_round6_gemm_repeat/ with the time left
#     (run to run: the same study, a second run).
# Put XSTAGE_GIT_COMMIT=<local HEAD> in front (the device copy's HEAD is stale).
#   scripts/megamoe_round6_gemm.sh [LIMIT] [TESTS] [REST]   (REST = 1 skips stage 3's 56, done in the first call)
set -u
: "${OUT:?set OUT}"
LIMIT=${1:-300}; TESTS=${2:-1}; REST=${3:-0}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
R6=$OUT/h200x1/megamoe_round6_gemm; R6R=$OUT/h200x1/megamoe_round6_gemm_repeat
mkdir -p "$OUT/logs" "$R6"
for f in megamoe_gemm.csv megamoe_gemm.json; do
  [ -e data/h200x1/megamoe_round6_gemm/$f ] && cp data/h200x1/megamoe_round6_gemm/$f "$R6/"; done
STAGE_TAIL=14; . "$(dirname "$0")/megamoe_stages.sh"      # stage, left, minutes
nvidia-smi -L
stage install 60 python3 -m pip install -q --no-deps --no-build-isolation -e .
for i in 0 1 2; do
  timeout 200 python3 scripts/megamoe_gemm.py --warm --dtypes bf16 --part $i --parts 3 >"$OUT/logs/warm$i.log" 2>&1 &
done
if [ "$TESTS" = 1 ]; then
  stage test-tma 150 python3 -m pytest -q -x -s -p no:cacheprovider -m gpu tests/test_megamoe_gemm6.py
  stage test-one-gpu 90 python3 -m pytest -q -x -s -p no:cacheprovider -m gpu tests/test_moe_one_gpu.py
fi
wait; echo "== warm: $(cat "$OUT"/logs/warm*.log | grep -c 'warm:') variants"; grep -h failed "$OUT"/logs/warm*.log
if [ "$REST" = 1 ]; then
  SMALL=$(python3 -c "from xstage import moe_gemm as G, moe_plan as P; big = set(G.tiles5_cases()); \
print(','.join(c.name for c in P.CASES if c.name not in big))")
  L=$(( $(left) - 10 )); [ "$L" -gt 100 ] && L=100
  [ "$L" -gt 30 ] && stage tiles6-rest $L python3 scripts/megamoe_gemm.py --study tiles6 --dtypes bf16 --out "$R6" \
    --cases "$SMALL" --max-minutes "$(minutes "$L - 22")"
  R6=$R6R; mkdir -p "$R6"
fi
L=$(( $(left) - 10 ))
[ "$L" -gt 30 ] && stage tiles6 $L python3 scripts/megamoe_gemm.py --study tiles6 --dtypes bf16 --out "$R6" \
  --max-minutes "$(minutes "$L - 22")"
ls -la "$OUT"/h200x1/*
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
echo "total ${SECONDS}s"
