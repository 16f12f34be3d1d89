#!/usr/bin/env bash
# MegaMoE on ONE GPU, round 9's GEMM question (issue 15, item 2: fp8 >= 0.9 of torch._scaled_grouped_mm on every
# configuration with >= 2048 rows) and a repeat of controls8 (item 3: the worst schedule / Expert-Wave, one run so
# far), in one device call of at most LIMIT seconds, in order:
#  1. install; fp8's kernels compiled in the background (3 processes);
#  2. study gemm9 (xstage.moe_gemm: fp8's default tiles, version 4, beside gemm9_variants and
#     torch._scaled_grouped_mm, same rounds, the 56 configurations with >= 2048 rows) into the NEW folder
#     $OUT/h200x1/megamoe_round9_gemm/ (resumed from data/h200x1/megamoe_round9_gemm/ when that exists);
#  3. study controls8 for fp8 again (its tiles are version 4's fp8 default) into $OUT/h200x1/megamoe_round8_controls_repeat/
#     (resumed likewise) with the time left.
# Put XSTAGE_GIT_COMMIT=<local HEAD> in front (the device copy's HEAD is stale).
#   scripts/megamoe_gemm9.sh [LIMIT] [GEMM_S]
set -u
: "${OUT:?set OUT}"
LIMIT=${1:-420}; GEMM_S=${2:-200}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
GEMM=$OUT/h200x1/megamoe_round9_gemm; CTRL=$OUT/h200x1/megamoe_round8_controls_repeat
mkdir -p "$OUT/logs" "$GEMM" "$CTRL"
for f in megamoe_gemm.csv megamoe_gemm.json; do
  [ -e data/h200x1/megamoe_round9_gemm/$f ] && cp data/h200x1/megamoe_round9_gemm/$f "$GEMM/"
  [ -e data/h200x1/megamoe_round8_controls_repeat/$f ] && cp data/h200x1/megamoe_round8_controls_repeat/$f "$CTRL/"
done
STAGE_TAIL=${STAGE_TAIL:-12}; . "$(dirname "$0")/megamoe_stages.sh"      # stage, left, minutes
nvidia-smi -L
stage install 60 python3 -m pip install -q --no-deps --no-build-isolation -e .
for i in 0 1 2; do
  timeout 200 python3 scripts/megamoe_gemm.py --warm --dtypes fp8 --part $i --parts 3 >"$OUT/logs/warm$i.log" 2>&1 &
done
L=$(( $(left) - 60 < GEMM_S ? $(left) - 60 : GEMM_S ))
[ "$L" -gt 40 ] && stage gemm9 $L python3 scripts/megamoe_gemm.py --study gemm9 --dtypes fp8 --out "$GEMM" \
  --max-minutes "$(minutes "$L - 20")"
L=$(( $(left) - 10 ))
[ "$L" -gt 40 ] && stage controls8 $L python3 scripts/megamoe_gemm.py --study controls8 --dtypes fp8 --out "$CTRL" \
  --max-minutes "$(minutes "$L - 20")"
wait; echo "== warm: $(cat "$OUT"/logs/warm*.log | grep -c 'warm:') variants"; grep -h failed "$OUT"/logs/warm*.log
wc -l "$GEMM/megamoe_gemm.csv" "$CTRL/megamoe_gemm.csv"
timeout 30 python3 - "$GEMM" <<'P' 2>&1 | tail -n 12
import sys
from xstage import data, moe_gemm as MG
df, _ = data.load(sys.argv[1], data.MEGAMOE_GEMM)
g = MG.gemm8_ratios(df, study="gemm9", names=MG.GEMM9_NAMES)
print(MG.gemm8_summary(g, names=MG.GEMM9_NAMES).round(3).to_string())
P
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
echo "total ${SECONDS}s"
