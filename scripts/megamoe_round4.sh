#!/usr/bin/env bash
# MegaMoE on ONE GPU, round 4 (issue 15, items 3 and 4): one device call of at most LIMIT seconds, in order:
#  1. install;
#  2. (TESTS = 1) the one-GPU GPU tests (tests/test_moe_one_gpu.py -m gpu: the default tiles, order version 3 and
#     the tile swizzle against the float32 reference on fresh inputs, combine poisoned, every schedule x assignment
#     bit-identical, link local and host; a Pro-sized fp8 layer whose chunk is one row block; the planted
#     dependency named);
#  3. the host-link sweep with the current defaults (dynamic assignment, tiles v2, order v3, swizzle) over the 84
#     configurations x bf16 / fp8 in the sweep's fixed order (shape by shape, bf16 then fp8) into the NEW folder
#     $OUT/h200x1/megamoe_host_v2/ (never data/h200x1/megamoe_host/, the static tiles-v1 record), resumed from
#     data/h200x1/megamoe_host_v2/ when that holds part of it, until LIMIT (a configuration is appended whole).
#  4. (CTRL_S > 0, CTRL_CASES) study controls (xstage.moe_gemm: every schedule x assignment compute-only, and the
#     old row-block-major tile order beside the swizzled default, variant swizzle0, same rounds) on CTRL_CASES
#     into the NEW folder $OUT/h200x1/megamoe_round4/, fp8 then bf16, each half of CTRL_S, resumable.
#     CTRL_CASES=all: every configuration in table order (those the folder holds are skipped: resumable).
#   [CTRL_CASES=a,b,...|all] scripts/megamoe_round4.sh [LIMIT] [TESTS] [CTRL_S]
set -u
: "${OUT:?set OUT}"
LIMIT=${1:-450}; TESTS=${2:-1}; CTRL_S=${3:-0}; CTRL_CASES=${CTRL_CASES:-}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
HOST=$OUT/h200x1/megamoe_host_v2; CTRL=$OUT/h200x1/megamoe_round4
mkdir -p "$OUT/logs" "$HOST" "$CTRL"
for f in megamoe_gemm.csv megamoe_gemm.json; do [ -e data/h200x1/megamoe_round4/$f ] && cp data/h200x1/megamoe_round4/$f "$CTRL/"; done
for f in megamoe.csv megamoe.json; do [ -e data/h200x1/megamoe_host_v2/$f ] && cp data/h200x1/megamoe_host_v2/$f "$HOST/"; done
STAGE_TAIL=12; . "$(dirname "$0")/megamoe_stages.sh"      # stage, left, minutes
nvidia-smi -L
stage install 60 python3 -m pip install -q --no-deps --no-build-isolation -e .
[ "$TESTS" = 1 ] && stage test-one-gpu 120 python3 -m pytest -q -x -s -p no:cacheprovider -m gpu tests/test_moe_one_gpu.py
L=$(( $(left) - 8 - CTRL_S ))
[ "$L" -gt 30 ] && stage host $L python3 -m xstage sweep megamoe --world one-gpu --ranks 2 --link host \
  --dtypes bf16,fp8 --out "$HOST" --max-minutes "$(minutes "$L - 25")"
for d in fp8 bf16; do
  L=$(( CTRL_S / 2 )); [ "$(left)" -lt "$L" ] && L=$(left)
  [ "$CTRL_S" -gt 0 ] && [ -n "$CTRL_CASES" ] && [ "$L" -gt 25 ] && stage controls-$d $L python3 scripts/megamoe_gemm.py \
    --study controls $([ "$CTRL_CASES" = all ] || echo --cases "$CTRL_CASES") --dtypes $d --out "$CTRL" \
    --max-minutes "$(minutes "$L - 18")"
done
grep -h "done in" "$OUT/logs/host.log" | awk '{print $2, $3, $6}' | tail -n 200 > "$OUT/logs/host_times.txt"
wc -l "$HOST/megamoe.csv"
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
echo "total ${SECONDS}s"
