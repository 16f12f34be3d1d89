#!/usr/bin/env bash
# On ONE GPU: our attention beside FA4's CuTe Hopper forward (same run, same rounds), the GPU tests of both fused
# layers, the sustained clocks, and the one-GPU Ulysses sweep at P = 4 with the FA methods. The FA4 stack travels
# as scripts/fa4_one_gpu.sh describes (three parts, three consecutive calls on the same machine):
#   first, second: scripts/attention_vs_fa4.sh stash [dev ...]              (carry .whl/fa4site312.tar.xz.part-00, -01)
#   third:   XSTAGE_GIT_COMMIT=<sha> OUT=... scripts/attention_vs_fa4.sh install tests:<s> study:<s> p4:<s> pack
#                                                                                (carry .whl/fa4site312.tar.xz.part-02)
#   dev       the editable install alone (no FA4): for GPU work in the stash calls
# Stages run in the order given; each has its own time bound and a failure does not stop the next.
#   tests:S   pytest -m gpu $TESTS (default tests/test_ulysses_gpu.py tests/test_fa4_gpu.py; 2-GPU ones skip)
#   study:S   scripts/attention_vs_fa4.py: the ladder checked, then timed beside FA4 and cuDNN (REPEATS a block,
#             default 30); no new variant starts after S - 40 s -> $OUT/$MACHINE/attention_vs_fa4/
#   clocks:S  scripts/attention_clocks.py (CLOCK_ARGS): sustained windows with nvidia-smi's clock and power
#   p4:S      xstage sweep ulysses --world one-gpu --ranks 4, links host then local, S / 2 each, with the FA
#             methods -> $OUT/h200x1/${P4_RECORD:-ulysses_fa_p4}_<link>/
# MACHINE=h100x1 where the card is an H100. Logs: $OUT/logs.tgz (pack).
set -u
. "$(dirname "$0")/fa4_env.sh"
[ -n "${OUT:-}" ] && mkdir -p "$OUT/logs" "$OUT/h200x1"
SHAPES4=${SHAPES4:-seq_8k,seq_32k,cogvideox5b_17776,wan21_1.3b_32760}
METHODS4=${METHODS4:-fused,serial_triton,serial_cudnn,attention_only,sdpa_only,fa,fa_kernel,fa_serial,fa_fused}
TESTS=${TESTS:-tests/test_ulysses_gpu.py tests/test_fa4_gpu.py}
P4_RECORD=${P4_RECORD:-ulysses_fa_p4}
for s in "$@"; do
  case $s in
    stash|install) bash "$(dirname "$0")/fa4_one_gpu.sh" "$s" ;;
    dev) python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1; echo "== dev install: rc=$?" ;;
    tests:*)
      t0=$SECONDS
      timeout --signal=INT --kill-after=10 "${s#tests:}" python3 -m pytest -q -p no:cacheprovider -m gpu \
        $TESTS >"$OUT/logs/tests_gpu.log" 2>&1
      echo "== pytest -m gpu $TESTS: rc=$? in $((SECONDS - t0))s"
      tail -n 15 "$OUT/logs/tests_gpu.log" ;;
    study:*)
      t0=$SECONDS; lim=${s#study:}
      timeout --signal=INT --kill-after=15 "$lim" python3 scripts/attention_vs_fa4.py $((lim - 40)) "${REPEATS:-30}" 2 \
        >"$OUT/logs/attention_vs_fa4.log" 2>&1
      echo "== attention beside FA4: rc=$? in $((SECONDS - t0))s"
      grep "^ladder:" "$OUT/logs/attention_vs_fa4.log" | tail -n 80 ;;
    clocks:*)
      t0=$SECONDS
      timeout --signal=INT --kill-after=15 "${s#clocks:}" python3 scripts/attention_clocks.py ${CLOCK_ARGS:-} \
        >"$OUT/logs/attention_clocks.log" 2>&1
      echo "== attention clocks: rc=$? in $((SECONDS - t0))s"
      grep "^clocks:\|Error" "$OUT/logs/attention_clocks.log" | tail -n 40 ;;
    p4:*)
      lim=$(( ${s#p4:} / 2 ))
      for link in host local; do
        t0=$SECONDS
        timeout --signal=INT --kill-after=15 "$lim" python3 -m xstage sweep ulysses --world one-gpu --ranks 4 \
          --link $link --shapes "$SHAPES4" --methods "$METHODS4" --out "$OUT/h200x1/${P4_RECORD}_$link" \
          >"$OUT/logs/${P4_RECORD}_$link.log" 2>&1
        echo "== ulysses P=4 $link: rc=$? in $((SECONDS - t0))s"
        grep -v "^ulysses: tune\|UserWarning\|exe_args" "$OUT/logs/${P4_RECORD}_$link.log" | tail -n 8
      done ;;
    pack) tar -czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs" ;;
    *) echo "unknown stage $s"; exit 2 ;;
  esac
done
