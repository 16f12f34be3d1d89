#!/usr/bin/env bash
# Issue 14 item 6 on ONE GPU: the Gluon kernel's methods (gluon, gluon_serial, gluon_fused) in the Ulysses sweep beside
# ours and cuDNN, in one device call: install; the GPU tests of the sweep's Gluon methods and of the Gluon fused
# epilogue (tests/test_ulysses_gluon_sweep.py, tests/test_attention_gluon.py -k fused; <= TESTS_S seconds); then a
# time-bounded, resumable sweep (xstage sweep ulysses --world one-gpu --ranks 2 --link LINK) into
# $OUT/h200x1/ulysses_gluon_<link>/ (resumed from data/h200x1/ulysses_gluon_<link>/ when that exists).
# Put XSTAGE_GIT_COMMIT=<local HEAD> in front (the device copy's HEAD is stale). ULYSSES_GLUON_NAME=<folder> records
# into $OUT/h200x1/<folder>/ instead (a new kernel's record beside the old one's).
#   scripts/ulysses_gluon_one_gpu.sh [SWEEP_S] [TESTS_S] [LINK] [SHAPES]
set -u
: "${OUT:?set OUT}"
SWEEP_S=${1:-240}; TESTS_S=${2:-120}; LINK=${3:-host}
SHAPES=${4:-seq_8k,seq_16k,seq_32k,cogvideox5b_17776,wan21_1.3b_32760}
METHODS=fused,serial_triton,serial_cudnn,attention_only,sdpa_only,gluon,gluon_serial,gluon_fused
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
NAME=${ULYSSES_GLUON_NAME:-ulysses_gluon_$LINK}
D=$OUT/h200x1/$NAME
mkdir -p "$OUT/logs" "$D"
for f in ulysses.csv ulysses.json; do [ -e data/h200x1/$NAME/$f ] && cp data/h200x1/$NAME/$f "$D/"; done
nvidia-smi -L
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/logs/install.log" 2>&1 || tail "$OUT/logs/install.log"
t0=$SECONDS
timeout --signal=INT --kill-after=10 "$TESTS_S" python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/test_ulysses_gluon_sweep.py tests/test_attention_gluon.py -k "fused or records_gluon" >"$OUT/logs/tests.log" 2>&1
echo "== tests: rc=$? in $((SECONDS - t0))s"; tail -n 6 "$OUT/logs/tests.log"
t0=$SECONDS
timeout --signal=INT --kill-after=15 "$SWEEP_S" python3 -m xstage sweep ulysses --world one-gpu --ranks 2 \
  --link "$LINK" --shapes "$SHAPES" --methods "$METHODS" --out "$D" >"$OUT/logs/sweep.log" 2>&1
echo "== sweep ($LINK): rc=$? in $((SECONDS - t0))s"
grep -v "^ulysses: tune\|UserWarning\|exe_args" "$OUT/logs/sweep.log" | tail -n 12
timeout 30 python3 - "$D" <<'P' 2>&1 | tail -n 12
import sys
from xstage import data, studies
df, meta = data.load(sys.argv[1], data.ULYSSES)
print(meta["params"].get("gluon"), meta.get("gluon_failed"))
print(studies.ulysses_medians(df).round(4).to_string())
P
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
echo "total ${SECONDS}s"
