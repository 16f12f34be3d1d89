#!/usr/bin/env bash
# FA4 (flash-attn-4's CuTe DSL Hopper kernel) in the Ulysses study on ONE GPU.
# The GPU machine reaches no registry: the extra fa4 travels as one xz tarball of `pip install --target` of the
# pinned wheels (pyproject.toml's [fa4]), split in two parts (a call carries at most 64 MiB with the tree):
#   here, once:  pip download the pinned wheels (cp312, manylinux) into .whl/, pip install --no-deps --target
#                <site> --python-version 3.12 --platform manylinux_2_28_x86_64 --only-binary=:all: .whl/*.whl,
#                tar -C <site> -cf - . | xz -9 > fa4site312.tar.xz, split -b 22390000 -d ... .whl/fa4site312.tar.xz.part-
#                (three parts of 22.4 MB, as the tracked tree is ~37 MB; fa4_env.sh's SHA is the whole)
#   first, second: scripts/fa4_one_gpu.sh stash              (carry .whl/fa4site312.tar.xz.part-00, then part-01)
#   third:       (each within 30 s of the last's end, the same machine) OUT=... scripts/fa4_one_gpu.sh install gate \
#                  sweep:<local_s>:<host_s> test:<s> pack   (carry the last part, .whl/fa4site312.tar.xz.part-02)
#   stash copies whichever parts the call carried; install joins every stashed and carried part in name order.
#   A carried nvidia-cutlass-dsl-libs-core==4.8.1 wheel is unzipped into the site. The tarball holds all 8 wheels (flash-attn-4,
#   nvidia-cutlass-dsl, -libs-base, -libs-cu13, -libs-core, quack-kernels, apache-tvm-ffi, torch-c-dlpack-ext:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 ...):
#   72.3 MB of xz, three parts of 24,115,134 B (split -b 24115134); no separate wheel needed.
#   (pip install --target of several wheels sharing nvidia_cutlass_dsl/ keeps them all: list every one.)
#   Built (the same 8 wheels) with: pip install --no-deps --no-compile --target <site> ..., then
#   tar -C <site> --sort=name --mtime=@0 --owner=0 --group=0 -cf - . | xz -9: 67.4 MB, 2 parts of 33,710,204 B. The
#   tracked tree is ~51 MB now (data/ ~47 MB), so those calls ran with data/ out of the index (git rm -r --cached
#   data, /data/ in .git/info/exclude; restored with git reset -- data after): 4 MB of tree + a part per call.
# Records: $OUT/h200x1/ulysses_fa_<link>/ (copy into data/h200x1/); logs: $OUT/logs/.
set -u
. "$(dirname "$0")/fa4_env.sh"     # SITE, PARTS, SHA, PYTHONPATH, NCCL / symmetric-memory settings
SHAPES=${SHAPES:-seq_4k,seq_8k,seq_16k,seq_32k,cogvideox5b_17776,wan21_1.3b_32760}
METHODS=${METHODS:-fused,serial_triton,serial_cudnn,attention_only,sdpa_only,fa,fa_serial,fa_fused}
RECORD=${RECORD:-ulysses_fa}          # records: $OUT/h200x1/${RECORD}_<link>/
SWEEP_ARGS=${SWEEP_ARGS:-}           # e.g. --no-tune (a run that times no method of ours)
FUSED_OK=1
for s in "$@"; do
  case $s in
    stash)
      mkdir -p $PARTS && cp .whl/fa4site312.tar.xz.part-* $PARTS/ && ls -la $PARTS && nvidia-smi -L ;;
    install)
      : "${OUT:?set OUT}"; mkdir -p "$OUT/logs" "$OUT/h200x1"
      t0=$SECONDS
      mkdir -p $PARTS && cp .whl/fa4site312.tar.xz.part-* $PARTS/ && ls $PARTS
      cat $PARTS/fa4site312.tar.xz.part-* >/root/fa4site312.tar.xz || exit 3
      echo "$SHA  /root/fa4site312.tar.xz" | sha256sum -c - || exit 3
      mkdir -p $SITE && xz -dc /root/fa4site312.tar.xz | tar -x -C $SITE || exit 3
      # an older tarball lacks nvidia-cutlass-dsl-libs-core (the python package cutlass, libs-base's dependency;
      # one found `No module named 'cutlass.cute'`): carry its wheel beside the last part, unzipped here
      for w in .whl/nvidia_cutlass_dsl_libs_core-*.whl; do [ -f "$w" ] && python3 -m zipfile -e "$w" $SITE; done
      python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/logs/install.log" 2>&1 || { tail "$OUT/logs/install.log"; exit 3; }
      timeout 120 python3 -c "import xstage.fa4 as f; print('fa4.available:', f.available()); print(f.versions())" 2>&1 | tail -5
      echo "== install: $((SECONDS - t0))s" ;;
    gate)   # the fused kernel bit for bit on small shapes first; a failure drops fa_fused from the sweep
      t0=$SECONDS
      timeout --signal=INT --kill-after=10 120 python3 -m pytest -q -x -p no:cacheprovider tests/test_fa4_gpu.py \
        -k "bit_exact or close" >"$OUT/logs/gate.log" 2>&1
      rc=$?; echo "== gate (fused bit-exact, P=2/4, local/host): rc=$rc in $((SECONDS - t0))s"; tail -n 25 "$OUT/logs/gate.log"
      [ $rc -ne 0 ] && FUSED_OK=0 ;;
    sweep:*)
      secs=${s#sweep:}; lsec=${secs%%:*}; hsec=${secs##*:}
      m=$METHODS; [ $FUSED_OK = 0 ] && m=${METHODS/,fa_fused/}
      for link in host local; do
        t0=$SECONDS; lim=$lsec; [ $link = host ] && lim=$hsec
        timeout --signal=INT --kill-after=15 "$lim" python3 -m xstage sweep ulysses --world one-gpu --ranks 2 \
          --link $link --shapes "$SHAPES" --methods "$m" --out "$OUT/h200x1/${RECORD}_$link" $SWEEP_ARGS \
          >"$OUT/logs/${RECORD}_$link.log" 2>&1
        echo "== ulysses fa $link ($m): rc=$? in $((SECONDS - t0))s"
        grep -v "^ulysses: tune\|UserWarning\|exe_args" "$OUT/logs/${RECORD}_$link.log" | tail -n 10
      done ;;
    test:*)
      t0=$SECONDS
      timeout --signal=INT --kill-after=10 "${s#test:}" python3 -m pytest -q -p no:cacheprovider tests/test_fa4_gpu.py \
        -k "not bit_exact and not close" >"$OUT/logs/test_fa4_gpu.log" 2>&1    # the gate ran the others
      echo "== pytest tests/test_fa4_gpu.py (the rest): rc=$? in $((SECONDS - t0))s"; tail -n 15 "$OUT/logs/test_fa4_gpu.log" ;;
    pack)   # at most 8 files come back: the logs as one archive
      tar -czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs" ;;
    *) echo "unknown stage $s"; exit 2 ;;
  esac
done
