#!/usr/bin/env bash
# Issue 43 on ONE GPU: scripts/attention_layer_gpu.py (xstage.attention / UlyssesAttention beside FA4 and cuDNN, host
# us per call, first-call s, CUDA graphs, torch.compile, a Wan 2.1 1.3B block with the diffusers processor).
# The GPU machine reaches no registry and its image has no diffusers: diffusers (extra [diffusers]) travels as one xz
# tarball of a pure `pip install --target` (.whl/diffusers_site312.tar.xz, ~10.7 MB: carried with the tree), FA4 as
# scripts/fa4_one_gpu.sh describes (its parts in calls of their own, data/ out of the index).
#   here, once:   PATH=<venv>/bin:$PATH bash scripts/attention_layer_gpu.sh build          (writes .whl/diffusers_site312.tar.xz; with
#                 pip 23.2 on 2026-12-07: 10,651,456 B, sha256 9a92c80c9b994a3f888fadce8cf8344655c3e1586941b524d8b90d881c6e97ce)
#   with FA4:     first call: bash scripts/attention_layer_gpu.sh stash  (carry .whl/fa4site312.tar.xz.part-00)
#                 next call: OUT=... MACHINE=h100x1 bash scripts/attention_layer_gpu.sh install layer:480 pack
#                         (carry .whl/fa4site312.tar.xz.part-01 and .whl/diffusers_site312.tar.xz)
#   without FA4:  OUT=... MACHINE=h100x1 bash scripts/attention_layer_gpu.sh dev diffusers layer:540 pack
#                         (carry .whl/diffusers_site312.tar.xz; the FA4 rows are absent with one line)
# Stages run in the order given; each has its own time bound and a failure does not stop the next.
#   build       (the CPU machine) the diffusers site for Python 3.12 / manylinux x86_64, pinned, no .pyc, tarred
#               sorted with mtime 0 (numpy / typing_extensions / fsspec left out: the GPU image has them)
#   stash       the carried FA4 part(s) kept on the machine for the next call (scripts/fa4_one_gpu.sh stash)
#   install     FA4 from the stashed and carried parts + the editable install (scripts/fa4_one_gpu.sh install),
#               then the diffusers stage
#   dev         the editable install alone (no FA4)
#   diffusers   the carried diffusers site unpacked into $DIFFSITE (XSTAGE_DIFFUSERS_SITE for the layer stage: the
#               script puts it first on sys.path after importing torch and xstage)
#   layer:S     python3 scripts/attention_layer_gpu.py $LAYER_ARGS under a bound of S seconds
#               -> $OUT/$MACHINE/attention_layer/ (summary.json, <part>.csv)
#   pack        the logs into $OUT/logs.tgz
set -u
here=$(dirname "$0")
. "$here/fa4_env.sh"        # FA4's SITE / PYTHONPATH, the NCCL / symmetric-memory settings
DIFFSITE=${DIFFSITE:-/root/diffsite}
DIFF_TAR=.whl/diffusers_site312.tar.xz
DIFF_PINS="diffusers==0.42.1 huggingface_hub==1.33.0 safetensors==0.8.0 regex==2026.12.2 pillow==13.0.0
  importlib_metadata==10.2.0 zipp==4.1.2 filelock==4.3.2 requests==2.34.2 urllib3==2.8.0 idna==3.21
  certifi==2026.10.19.post1 charset_normalizer==3.5.3 httpx2==2.17.0 httpcore2==2.17.0 h11==0.16.0 anyio==4.16.0
  truststore==0.10.5 lazy_importer==0.1.0 packaging==26.4 pyyaml==6.0.4 tqdm==4.70.1 click==8.5.1"
MACHINE=${MACHINE:-h100x1}
[ -n "${OUT:-}" ] && mkdir -p "$OUT/logs"
for s in "$@"; do
  case $s in
    build)
      site=$(mktemp -d); mkdir -p .whl
      python3 -m pip install -q --no-deps --no-compile --target "$site" --python-version 3.12 \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --only-binary=:all: $DIFF_PINS || exit 3
      rm -rf "$site/bin"
      tar -C "$site" --sort=name --mtime=@0 --owner=0 --group=0 -cf - . | xz -9 > $DIFF_TAR
      rm -rf "$site"; ls -la $DIFF_TAR; sha256sum $DIFF_TAR ;;
    stash) bash "$here/fa4_one_gpu.sh" stash ;;
    install)
      bash "$here/fa4_one_gpu.sh" install || echo "== FA4 install failed (rc=$?): its rows will be absent"
      python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
      bash "$0" diffusers ;;
    dev) python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1; echo "== dev install: rc=$?" ;;
    diffusers)
      if [ -f $DIFF_TAR ]; then
        mkdir -p "$DIFFSITE" && xz -dc $DIFF_TAR | tar -x -C "$DIFFSITE" && sha256sum $DIFF_TAR
        python3 -c "import sys, torch; sys.path.insert(0, '$DIFFSITE'); import diffusers; print('== diffusers', diffusers.__version__)" 2>&1 | tail -1
      else
        echo "== no $DIFF_TAR carried: the dit_block part will record diffusers' absence"
      fi ;;
    layer:*)
      : "${OUT:?set OUT}"; t0=$SECONDS
      XSTAGE_DIFFUSERS_SITE=$DIFFSITE MACHINE=$MACHINE timeout --signal=INT --kill-after=15 "${s#layer:}" \
        python3 scripts/attention_layer_gpu.py ${LAYER_ARGS:-} >"$OUT/logs/attention_layer.log" 2>&1
      echo "== attention layer: rc=$? in $((SECONDS - t0))s"
      grep "^attention_layer:\|Error" "$OUT/logs/attention_layer.log" | cut -c1-900 | tail -n 40 ;;
    pack) tar -czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs" ;;
    *) echo "unknown stage $s"; exit 2 ;;
  esac
done
