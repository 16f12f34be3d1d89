#!/usr/bin/env bash
# MegaMoE on ONE GPU, round 6 (issue 15, items 3 and 4; session 8): one device call of at most LIMIT seconds:
#  1. install; the kernels study lists6 launches compiled in the background (Triton's cache, no launch);
#  2. (SCATTER = 1) the combine's store pattern (xstage.scatter_store: row segments at scattered rows beside
#     contiguous stores, host and local, each bit-exact first) into $OUT/h200x1/megamoe_round6_scatter/;
#  3. study lists6 (xstage.moe_round6: model_guided under the positional and the time wait model beside
#     Expert-Wave, compute only, dynamic, same rounds) on LISTS6_CASES, bf16 (<= BF16_S) then fp8 (the rest),
#     into $OUT/h200x1/megamoe_round6_lists/ (resumed from data/h200x1/megamoe_round6_lists/ when there).
#   scripts/megamoe_round6.sh [LIMIT] [SCATTER] [BF16_S]
set -u
: "${OUT:?set OUT}"
LIMIT=${1:-330}; SCATTER=${2:-1}; BF16_S=${3:-130}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
R6=$OUT/h200x1/megamoe_round6_lists; SC=$OUT/h200x1/megamoe_round6_scatter
mkdir -p "$OUT/logs" "$R6" "$SC"
for f in megamoe_gemm.csv megamoe_gemm.json; do
  [ -e data/h200x1/megamoe_round6_lists/$f ] && cp data/h200x1/megamoe_round6_lists/$f "$R6/"; done
STAGE_TAIL=${STAGE_TAIL:-14}; . "$(dirname "$0")/megamoe_stages.sh"      # stage, left, minutes
nvidia-smi -L
stage install 60 python3 -m pip install -q --no-deps --no-build-isolation -e .
for i in 0 1 2; do
  timeout 150 python3 scripts/megamoe_gemm.py --warm --dtypes bf16,fp8 --part $i --parts 3 >"$OUT/logs/warm$i.log" 2>&1 &
done
[ "$SCATTER" = 1 ] && stage scatter 90 python3 scripts/megamoe_scatter_store.py --out "$SC"
for d in bf16 fp8; do
  if [ "$d" = bf16 ]; then L=$BF16_S; else L=$(( $(left) - 12 )); fi
  [ "$(left)" -lt "$L" ] && L=$(left)
  C=$(python3 -c "from xstage.moe_round6 import LISTS6_CASES as C; print(','.join(C['$d']))")
  [ "$L" -gt 25 ] && stage lists6-$d $L python3 scripts/megamoe_lists6.py --out "$R6" --dtypes $d --cases "$C" \
    --max-minutes "$(minutes "$L - 15")"
done
wait; echo "== warm: $(cat "$OUT"/logs/warm*.log | grep -c 'warm:') variants"
ls -la "$R6" "$SC"
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
echo "total ${SECONDS}s"
