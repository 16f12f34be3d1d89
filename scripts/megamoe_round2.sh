#!/usr/bin/env bash
# MegaMoE on ONE GPU, round 2 (issue 15), one device call of at most LIMIT seconds (default 320), in order:
#  1. the host-link sweep resumed (seeded from data/h200x1/megamoe_host/) toward 84/84 per dtype, time-bounded;
#     meanwhile the GEMM study's kernel variants are compiled in the background (no launch: Triton's cache);
#  2. the GEMM ladder (xstage.moe_gemm, study ladder) into $OUT/h200x1/megamoe_gemm/, time-bounded;
#  3. with the time left: the order study (every schedule x static / dynamic, compute-only), same folder.
#   scripts/megamoe_round2.sh [LIMIT] [SWEEP_MINUTES]
set -u
: "${OUT:?set OUT}"
LIMIT=${1:-320}; SWEEP_MIN=${2:-1.4}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
HOST=$OUT/h200x1/megamoe_host; GEMM=$OUT/h200x1/megamoe_gemm
mkdir -p "$OUT/logs" "$HOST" "$GEMM"
cp data/h200x1/megamoe_host/megamoe.csv data/h200x1/megamoe_host/megamoe.json "$HOST/"
for f in megamoe_gemm.csv megamoe_gemm.json; do [ -e data/h200x1/megamoe_gemm/$f ] && cp data/h200x1/megamoe_gemm/$f "$GEMM/"; done
stage() { local name=$1 secs=$2; shift 2; local t0=$SECONDS; echo "== $name (limit ${secs}s, at ${SECONDS}s)"
  timeout --signal=INT --kill-after=10 "$secs" "$@" >"$OUT/logs/$name.log" 2>&1
  echo "   rc=$? in $((SECONDS - t0))s"; tail -n 14 "$OUT/logs/$name.log" | cut -c1-400 | sed 's/^/   | /'; }
left() { echo $(( LIMIT - SECONDS )); }
nvidia-smi -L
stage install 60 python3 -m pip install -q --no-deps --no-build-isolation -e .
timeout 200 python3 scripts/megamoe_gemm.py --warm >"$OUT/logs/warm.log" 2>&1 &
WARM=$!
for d in bf16 fp8; do
  stage sweep-$d 115 python3 -m xstage sweep megamoe --world one-gpu --ranks 2 --link host --dtypes $d \
    --out "$HOST" --max-minutes "$SWEEP_MIN"
done
wait $WARM; echo "== warm rc=$? ($(grep -c 'warm:' "$OUT/logs/warm.log") variants)"; tail -n 3 "$OUT/logs/warm.log"
L=$(( $(left) * 62 / 100 ))
[ "$L" -gt 30 ] && stage gemm-ladder $L python3 scripts/megamoe_gemm.py --study ladder --out "$GEMM" \
  --max-minutes $(python3 -c "print(max(0.2, ($L - 35) / 60))")
L=$(( $(left) - 8 ))
[ "$L" -gt 25 ] && stage gemm-order $L python3 scripts/megamoe_gemm.py --study order --out "$GEMM" \
  --max-minutes $(python3 -c "print(max(0.2, ($L - 25) / 60))")
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
ls -la "$HOST" "$GEMM"; echo "total ${SECONDS}s"
