#!/usr/bin/env bash
# The Ulysses study on ONE GPU (issue 14): every rank of the layer on this GPU, run one after another;
# link local (every buffer in device memory) and host (the peers' outputs in pinned host memory: PCIe).
#   OUT=... scripts/ulysses_one_gpu.sh [local_secs] [host_secs] [test_secs] [p4_secs]
# Records into $OUT/h200x1/ulysses_<link>$SUFFIX/ (copy them into data/h200x1/); logs in $OUT/logs/.
# LINKS (default "local host") picks the links; SUFFIX names a new record, e.g. the host link after the fused
# outputs became destination buffers (commit 9b3934c; a host-link folder recorded before it is refused):
#   LINKS=host SUFFIX=_rerun OUT=... scripts/ulysses_one_gpu.sh 0 150 60 60   -> $OUT/h200x1/ulysses_host_rerun/
set -u
: "${OUT:?set OUT to the folder that comes back}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
SHAPES=${SHAPES:-seq_4k,seq_8k,seq_16k,seq_32k,cogvideox5b_17776,wan21_1.3b_32760}
SHAPES4=${SHAPES4:-seq_8k,seq_32k}   # also at P = 4 (empty: none)
RANKS=${RANKS:-2}
LINKS=${LINKS:-local host}
SUFFIX=${SUFFIX:-}
METHODS=${METHODS:-}   # e.g. fused,serial_triton,serial_cudnn,overlapped,attention_only,sdpa_only (default: all)
MARGS=(); [ -n "$METHODS" ] && MARGS=(--methods "$METHODS")
mkdir -p "$OUT/logs" "$OUT/h200x1"
nvidia-smi -L
for link in $LINKS; do
  secs=${1:-150}; [ "$link" = host ] && secs=${2:-150}
  t0=$SECONDS
  timeout --signal=INT --kill-after=15 "$secs" python3 -m xstage sweep ulysses --world one-gpu --ranks "$RANKS" \
    --link "$link" --shapes "$SHAPES" "${MARGS[@]}" --out "$OUT/h200x1/ulysses_$link$SUFFIX" >"$OUT/logs/ulysses_$link.log" 2>&1
  echo "== ulysses $link: rc=$? in $((SECONDS - t0))s"; grep -v "^ulysses: tune" "$OUT/logs/ulysses_$link.log" | tail -n 12
  if [ -n "$SHAPES4" ]; then
    t0=$SECONDS
    timeout --signal=INT --kill-after=15 "${4:-60}" python3 -m xstage sweep ulysses --world one-gpu --ranks 4 \
      --link "$link" --shapes "$SHAPES4" "${MARGS[@]}" --out "$OUT/h200x1/ulysses_$link$SUFFIX" >>"$OUT/logs/ulysses_$link.log" 2>&1
    echo "== ulysses $link P=4: rc=$? in $((SECONDS - t0))s"; grep -v "^ulysses: tune" "$OUT/logs/ulysses_$link.log" | tail -n 3
  fi
done
t0=$SECONDS
timeout --signal=INT --kill-after=15 "${3:-120}" python3 -m pytest -q -x -p no:cacheprovider -m gpu \
  tests/test_ulysses_gpu.py >"$OUT/logs/test_one_gpu.log" 2>&1
echo "== pytest -m gpu tests/test_ulysses_gpu.py: rc=$? in $((SECONDS - t0))s"; tail -n 12 "$OUT/logs/test_one_gpu.log"
