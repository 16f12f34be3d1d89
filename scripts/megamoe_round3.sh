#!/usr/bin/env bash
# MegaMoE on ONE GPU, round 3 (issue 15, items 2, 3, 5): one device call of at most LIMIT seconds, in order:
#  1. install; the kernel variants of round 3 compiled in the background (no launch: Triton's cache, 4 processes);
#  2. the one-GPU GPU tests (tests/test_moe_one_gpu.py -m gpu: the new default tiles and orders against the float32
#     reference on fresh inputs, combine poisoned, every schedule x assignment bit-identical, link local and host);
#  3. study gemm: all 84 configurations x bf16 / fp8 in table order (xstage.moe_gemm._pairs), our GEMM phases with
#     the default tiles beside torch._grouped_mm / torch._scaled_grouped_mm in the same rounds, time-bounded;
#  4. study controls with the time left: every schedule x static / dynamic compute-only, same order, resumable.
#  5. (HOST_SECONDS > 0) the host-link sweep with the new defaults (dynamic, tiles v2, order v2) into the NEW folder
#     $OUT/h200x1/megamoe_host_v2/ (never data/h200x1/megamoe_host/, the static tiles-v1 record), bf16 then fp8.
# Every study resumes from its folder under data/h200x1/ when that holds part of it.
#   scripts/megamoe_round3.sh [LIMIT] [GEMM_SECONDS] [HOST_SECONDS]
set -u
: "${OUT:?set OUT}"
LIMIT=${1:-430}; GEMM_S=${2:-230}; HOST_S=${3:-0}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
DEST=$OUT/h200x1/megamoe_round3; HOST=$OUT/h200x1/megamoe_host_v2
mkdir -p "$OUT/logs" "$DEST" "$HOST"
for f in megamoe.csv megamoe.json; do [ -e data/h200x1/megamoe_host_v2/$f ] && cp data/h200x1/megamoe_host_v2/$f "$HOST/"; done
for f in megamoe_gemm.csv megamoe_gemm.json; do
  [ -e data/h200x1/megamoe_round3/$f ] && cp data/h200x1/megamoe_round3/$f "$DEST/"; done
STAGE_TAIL=16; . "$(dirname "$0")/megamoe_stages.sh"      # stage, left, minutes
nvidia-smi -L
stage install 60 python3 -m pip install -q --no-deps --no-build-isolation -e .
for i in 0 1 2 3; do
  timeout 150 python3 scripts/megamoe_gemm.py --warm --part $i --parts 4 >"$OUT/logs/warm$i.log" 2>&1 &
done
stage test-one-gpu 150 python3 -m pytest -q -x -s -p no:cacheprovider -m gpu tests/test_moe_one_gpu.py
wait; echo "== warm: $(cat "$OUT"/logs/warm*.log | grep -c 'warm:') variants"; grep -h failed "$OUT"/logs/warm*.log
L=$(( $(left) < GEMM_S ? $(left) : GEMM_S ))
[ "$L" -gt 40 ] && stage gemm $L python3 scripts/megamoe_gemm.py --study gemm --out "$DEST" \
  --max-minutes "$(minutes "$L - 25")"
L=$(( $(left) - 12 - HOST_S ))
[ "$L" -gt 30 ] && stage controls $L python3 scripts/megamoe_gemm.py --study controls --out "$DEST" \
  --max-minutes "$(minutes "$L - 20")"
for d in bf16 fp8; do
  div=1; [ "$d" = bf16 ] && div=2                          # bf16 gets half of what is left, fp8 the rest
  L=$(( ($(left) - 10) / div ))
  [ "$HOST_S" -gt 0 ] && [ "$L" -gt 40 ] && stage host-$d $L python3 -m xstage sweep megamoe --world one-gpu --ranks 2 \
    --link host --dtypes $d --out "$HOST" --max-minutes "$(minutes "$L - 30")"
done
ls -la "$DEST" "$HOST"
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
echo "total ${SECONDS}s"
