#!/usr/bin/env bash
# MegaMoE on ONE GPU, round 10 (issue 15, items 2-5 with tiles version 5: fp8's BM 128 from 96 rows per expert on
# average, read off study gemm9): one device call of at most LIMIT seconds, in order:
#  1. install; fp8's kernels compiled in the background (3 processes) while the tests run;
#  2. the GPU tests (<= TESTS_S seconds): tests/test_moe_one_gpu.py (the default path, now version 5, against the
#     float32 reference, combine poisoned first, every schedule x assignment bit-identical, links local and host)
#     and tests/test_megamoe_round9.py (fp8 through TMA bit-identical to the pointer loops);
#  3. study gemm10 (xstage.moe_gemm: fp8's version-5 default beside the other row block and one stage more, and
#     torch._scaled_grouped_mm, all 84 configurations) into the NEW folder $OUT/h200x1/megamoe_round10_gemm/;
#  4. study controls7 for CTRL_DTYPES (default fp8,bf16: every schedule's compute-only time / Expert-Wave's under
#     the version-5 default and model_guided choosing with the time wait model) into $OUT/h200x1/megamoe_round10_controls/;
#  5. the host-link sweep of HOST_DTYPES (default fp8; xstage sweep megamoe --world one-gpu --ranks 2 --link host)
#     with the time left into $OUT/h200x1/megamoe_round10_host/ (folders: ${ROUND}_gemm / _controls / _host).
# A stage given 0 seconds (TESTS_S, GEMM_S, CTRL_S) or no dtypes (HOST_DTYPES=-) is skipped.
# Each folder is resumed from data/h200x1/<same name>/ when that exists (time-bounded studies and sweep: no
# configuration starts after its bound; run the script again to go on). Put XSTAGE_GIT_COMMIT=<local HEAD> in front
# (the device copy's HEAD is stale).
#   scripts/megamoe_round10.sh [LIMIT] [TESTS_S] [GEMM_S] [CTRL_S] [CTRL_DTYPES] [HOST_DTYPES]
set -u
: "${OUT:?set OUT}"
LIMIT=${1:-580}; TESTS_S=${2:-80}; GEMM_S=${3:-160}; CTRL_S=${4:-120}; CTRL_DTYPES=${5:-fp8,bf16}; HOST_DTYPES=${6:-fp8}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
# ROUND (session 15): the folders' prefix, default megamoe_round10 (round 12: tiles version 6 and lag version 2,
# ROUND=megamoe_round12 with GEMM_S=0: the tests, controls7 and the host sweep under the new defaults)
ROUND=${ROUND:-megamoe_round10}
GEMM=$OUT/h200x1/${ROUND}_gemm; CTRL=$OUT/h200x1/${ROUND}_controls; HOST=$OUT/h200x1/${ROUND}_host
mkdir -p "$OUT/logs" "$GEMM" "$CTRL" "$HOST"
for d in "$GEMM" "$CTRL" "$HOST"; do
  for f in megamoe_gemm.csv megamoe_gemm.json megamoe.csv megamoe.json; do
    [ -e "data/h200x1/$(basename "$d")/$f" ] && cp "data/h200x1/$(basename "$d")/$f" "$d/"; done; done
STAGE_TAIL=${STAGE_TAIL:-12}; . "$(dirname "$0")/megamoe_stages.sh"      # stage, left, minutes
nvidia-smi -L
stage install 60 python3 -m pip install -q --no-deps --no-build-isolation -e .
for i in 0 1 2; do
  timeout 240 python3 scripts/megamoe_gemm.py --warm --dtypes "$CTRL_DTYPES" --part $i --parts 3 >"$OUT/logs/warm$i.log" 2>&1 &
done
L=$(( $(left) - 300 < TESTS_S ? $(left) - 300 : TESTS_S ))
[ "$L" -gt 20 ] && STAGE_TAIL=4 stage tests $L python3 -m pytest -q -s -p no:cacheprovider -m gpu \
  tests/test_moe_one_gpu.py tests/test_megamoe_round9.py
grep -h "one GPU, link" "$OUT/logs/tests.log" | cut -c1-240
L=$(( $(left) - 200 < GEMM_S ? $(left) - 200 : GEMM_S ))
[ "$L" -gt 40 ] && stage gemm10 $L python3 scripts/megamoe_gemm.py --study gemm10 --dtypes fp8 --out "$GEMM" \
  --max-minutes "$(minutes "$L - 20")"
R=$([ "$HOST_DTYPES" = - ] && echo 15 || echo 100)         # what the host sweep keeps
L=$(( $(left) - R < CTRL_S ? $(left) - R : CTRL_S ))
[ "$L" -gt 40 ] && stage controls7 $L python3 scripts/megamoe_gemm.py --study controls7 --dtypes "$CTRL_DTYPES" --out "$CTRL" \
  --max-minutes "$(minutes "$L - 20")"
L=$(( $(left) - 12 ))
[ "$L" -gt 40 ] && [ "$HOST_DTYPES" != - ] && stage host $L python3 -m xstage sweep megamoe --world one-gpu --ranks 2 --link host \
  --dtypes "$HOST_DTYPES" --out "$HOST" --max-minutes "$(minutes "$L - 25")"
wait; echo "== warm: $(cat "$OUT"/logs/warm*.log | grep -c 'warm:') variants"; grep -h failed "$OUT"/logs/warm*.log
wc -l "$GEMM"/*.csv "$CTRL"/*.csv "$HOST"/*.csv 2>/dev/null
timeout 40 python3 - "$GEMM" "$CTRL" "$HOST" <<'P' 2>&1 | tail -n 40
import os, sys
from xstage import data, moe_gemm as MG, studies
have = lambda d, f: os.path.exists(os.path.join(d, f))
if have(sys.argv[1], "megamoe_gemm.csv"):
  df, _ = data.load(sys.argv[1], data.MEGAMOE_GEMM)
  print(MG.gemm8_summary(MG.gemm8_ratios(df, "gemm10", ("default", "bm_alt", "s_plus")),
                         names=("default", "bm_alt", "s_plus")).round(3).to_string())
  print(MG.gemm10_rule_summary(MG.gemm10_rule(df)).round(3).to_string())
if have(sys.argv[2], "megamoe_gemm.csv"):
  c, _ = data.load(sys.argv[2], data.MEGAMOE_GEMM)
  print(studies.megamoe_round7_controls_summary(studies.megamoe_round7_controls(c)).round(3).to_string())
if have(sys.argv[3], "megamoe.csv"):
  h, _ = data.load(sys.argv[3], data.MEGAMOE)
  print(studies.megamoe_round7_host_summary(h).round(3).drop(columns=["max_config"]).to_string())
P
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
echo "total ${SECONDS}s"
