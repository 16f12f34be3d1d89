#!/usr/bin/env bash
# MegaMoE on ONE GPU, round 9 (issue 15, items 2 and 4 with tiles version 4: fp8 through TMA with one stage
# more): one device call of at most LIMIT seconds, in order:
#  1. install; the default tiles' kernels (fp8 and bf16, and fp8's tiles version 3 for the bit-identity test)
#     compiled in the background while the tests run;
#  2. the GPU tests of the fused layer (<= TESTS_S seconds): tests/test_megamoe_round9.py (fp8's version-4
#     default bit-identical to version 3's pointer loops, link host, both row-block classes and a Pro-sized layer)
#     and tests/test_moe_one_gpu.py (the default path against the float32 reference, combine poisoned first,
#     every schedule x assignment bit-identical, links local and host; fp8 now through TMA);
#  3. a NEW host-link sweep record (xstage sweep megamoe --world one-gpu --ranks 2 --link host) with the time
#     left, DTYPES (default fp8: only fp8's default changed) in the sweep's fixed order, into
#     $OUT/h200x1/megamoe_round9_host/ (resumed from data/h200x1/megamoe_round9_host/ when that exists;
#     time-bounded: no pair starts after the bound, and a signal during a write waits until the rows and the
#     sidecar are both written, xstage.moe_sweep.signals_held).
# Put XSTAGE_GIT_COMMIT=<local HEAD> in front (the device copy's HEAD is stale).
#   scripts/megamoe_round9.sh [LIMIT] [TESTS_S] [DTYPES]
set -u
: "${OUT:?set OUT}"
LIMIT=${1:-350}; TESTS_S=${2:-100}; DTYPES=${3:-fp8}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
HOST=$OUT/h200x1/megamoe_round9_host
mkdir -p "$OUT/logs" "$HOST"
for f in megamoe.csv megamoe.json; do
  [ -e data/h200x1/megamoe_round9_host/$f ] && cp data/h200x1/megamoe_round9_host/$f "$HOST/"; done
STAGE_TAIL=${STAGE_TAIL:-12}; . "$(dirname "$0")/megamoe_stages.sh"      # stage, left, minutes
nvidia-smi -L
stage install 60 python3 -m pip install -q --no-deps --no-build-isolation -e .
for i in 0 1 2; do
  timeout 150 python3 scripts/megamoe_gemm.py --warm --defaults --dtypes fp8,bf16 --part $i --parts 3 \
    >"$OUT/logs/warm$i.log" 2>&1 &
done
L=$(( $(left) - 120 < TESTS_S ? $(left) - 120 : TESTS_S ))
STAGE_TAIL=4 stage tests $L python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_megamoe_round9.py \
  tests/test_moe_one_gpu.py
grep -h "one GPU, link" "$OUT/logs/tests.log" | cut -c1-240
L=$(( $(left) - 12 ))
[ "$L" -gt 40 ] && stage host $L python3 -m xstage sweep megamoe --world one-gpu --ranks 2 --link host \
  --dtypes "$DTYPES" --out "$HOST" --max-minutes "$(minutes "$L - 25")"
wait; echo "== warm: $(cat "$OUT"/logs/warm*.log | grep -c 'warm:') variants"; grep -h failed "$OUT"/logs/warm*.log
grep -h "done in" "$OUT/logs/host.log" 2>/dev/null | tail -n 100 > "$OUT/logs/host_times.txt"
timeout 20 python3 -c "
from xstage import data, studies
df, _ = data.load('$HOST', data.MEGAMOE)
print(studies.megamoe_round7_host_summary(df).round(3).drop(columns=['max_config']).to_string())" 2>&1 | tail -n 8
wc -l "$HOST/megamoe.csv"
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
echo "total ${SECONDS}s"
