#!/usr/bin/env bash
# MegaMoE on ONE GPU, round 5 (issue 15, items 2 and 3, and round 4's A/B finished): one device call of at most
# LIMIT seconds, in order:
#  1. install; (WARM = 1, the default) the round-5 bf16 tile variants compiled in the background (Triton's cache, no
#     launch, 3 processes);
#  2. (TESTS = 1) the one-GPU GPU tests (tests/test_moe_one_gpu.py -m gpu: the fused layer against the float32
#     reference on fresh inputs, combine poisoned, every schedule x assignment bit-identical, link local / host);
#  3. (CTRL_S > 0) round 4's controls A/B (the swizzled default beside swizzle0, same rounds) resumed over every
#     configuration in table order into $OUT/h200x1/megamoe_round4/ (copied from data/h200x1/megamoe_round4/:
#     the same folder's record), fp8 (3/4 of CTRL_S) then bf16 (the rest);
#  4. (LISTS_S > 0) study lists (xstage.moe_gemm.LISTS5: lag's row blocks released 1 / 8 at a time beside the
#     default chunks, compute only, dynamic, same rounds) on LISTS5_CASES, bf16 then fp8, into the NEW folder
#     $OUT/h200x1/megamoe_round5/;
#  5. study tiles (bf16 tile variants beside the default and torch._grouped_mm, every configuration with >= 2048
#     rows on rank 0, table order) with the time left, into the same new folder.
# Every study resumes from its folder under data/h200x1/ when that holds part of it.
#   [WARM=0|1] scripts/megamoe_round5.sh [LIMIT] [TESTS] [CTRL_S] [LISTS_S]
set -u
: "${OUT:?set OUT}"
LIMIT=${1:-420}; TESTS=${2:-1}; CTRL_S=${3:-165}; LISTS_S=${4:-75}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
CTRL=$OUT/h200x1/megamoe_round4; R5=$OUT/h200x1/megamoe_round5
mkdir -p "$OUT/logs" "$CTRL" "$R5"
for f in megamoe_gemm.csv megamoe_gemm.json; do
  [ -e data/h200x1/megamoe_round4/$f ] && cp data/h200x1/megamoe_round4/$f "$CTRL/"
  [ -e data/h200x1/megamoe_round5/$f ] && cp data/h200x1/megamoe_round5/$f "$R5/"; done
STAGE_TAIL=12; . "$(dirname "$0")/megamoe_stages.sh"      # stage, left, minutes
nvidia-smi -L
stage install 60 python3 -m pip install -q --no-deps --no-build-isolation -e .
[ "${WARM:-1}" = 1 ] && for i in 0 1 2; do
  timeout 200 python3 scripts/megamoe_gemm.py --warm --dtypes bf16 --part $i --parts 3 >"$OUT/logs/warm$i.log" 2>&1 &
done
[ "$TESTS" = 1 ] && stage test-one-gpu 120 python3 -m pytest -q -x -s -p no:cacheprovider -m gpu tests/test_moe_one_gpu.py
CTRL_END=$(( SECONDS + CTRL_S ))
for d in fp8 bf16; do
  if [ "$d" = fp8 ]; then L=$(( CTRL_S * 3 / 4 )); else L=$(( CTRL_END - SECONDS )); fi
  [ "$(left)" -lt "$L" ] && L=$(left)
  [ "$CTRL_S" -gt 0 ] && [ "$L" -gt 25 ] && stage controls-$d $L python3 scripts/megamoe_gemm.py --study controls \
    --dtypes $d --out "$CTRL" --max-minutes "$(minutes "$L - 18")"
done
L=$LISTS_S; [ "$(left)" -lt "$L" ] && L=$(left)
[ "$LISTS_S" -gt 0 ] && [ "$L" -gt 30 ] && stage lists $L python3 scripts/megamoe_gemm.py --study lists \
  --dtypes bf16,fp8 --out "$R5" --max-minutes "$(minutes "$L - 20")"
wait; echo "== warm: $(cat "$OUT"/logs/warm*.log | grep -c 'warm:') variants"; grep -h failed "$OUT"/logs/warm*.log
L=$(( $(left) - 10 ))
[ "$L" -gt 30 ] && stage tiles $L python3 scripts/megamoe_gemm.py --study tiles --dtypes bf16 --out "$R5" \
  --max-minutes "$(minutes "$L - 22")"
ls -la "$CTRL" "$R5"
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
echo "total ${SECONDS}s"
