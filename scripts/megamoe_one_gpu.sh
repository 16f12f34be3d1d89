#!/usr/bin/env bash
# MegaMoE on ONE GPU: install, the one-GPU bit-exact tests, then the host-link sweep (time-bounded, resumable) into
# $OUT/h200x1/megamoe_pcie/ (LINK local: megamoe_local/), seeded from data/h200x1/<that folder>/ when it holds part of it.
#   scripts/megamoe_one_gpu.sh TEST_SECS BF16_MINUTES FP8_MINUTES [LINK]   (LINK: host (default) or local)
set -u
: "${OUT:?set OUT}"
TEST_SECS=${1:-180}; BF16_MIN=${2:-2}; FP8_MIN=${3:-2}; LINK=${4:-host}
SUB=$([ "$LINK" = host ] && echo megamoe_pcie || echo "megamoe_$LINK")
DEST=$OUT/h200x1/$SUB
mkdir -p "$OUT/logs" "$DEST"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
for f in data/h200x1/$SUB/megamoe.csv data/h200x1/$SUB/megamoe.json; do [ -e "$f" ] && cp "$f" "$DEST/"; done
[ -e data/h200x1/$SUB/megamoe.csv.gz ] && gunzip -c data/h200x1/$SUB/megamoe.csv.gz > "$DEST/megamoe.csv"
stage() { local name=$1 secs=$2; shift 2; local t0=$SECONDS; echo "== $name (limit ${secs}s)"
  timeout --signal=INT --kill-after=20 "$secs" "$@" >"$OUT/logs/$name.log" 2>&1
  echo "   rc=$? in $((SECONDS - t0))s"; tail -n 12 "$OUT/logs/$name.log" | sed 's/^/   | /'; }
nvidia-smi -L
stage install 120 python3 -m pip install -q --no-deps --no-build-isolation -e .
[ "$TEST_SECS" -gt 0 ] && stage test-one-gpu "$TEST_SECS" python3 -m pytest -q -x -s -p no:cacheprovider -m gpu \
  tests/test_moe_one_gpu.py
[ "$BF16_MIN" != 0 ] && stage sweep-bf16 $(( ${BF16_MIN%.*} * 60 + 150 )) python3 -m xstage sweep megamoe --world one-gpu \
  --ranks 2 --link "$LINK" --dtypes bf16 --out "$DEST" --max-minutes "$BF16_MIN"
[ "$FP8_MIN" != 0 ] && stage sweep-fp8 $(( ${FP8_MIN%.*} * 60 + 150 )) python3 -m xstage sweep megamoe --world one-gpu \
  --ranks 2 --link "$LINK" --dtypes fp8 --out "$DEST" --max-minutes "$FP8_MIN"
ls -la "$DEST"
