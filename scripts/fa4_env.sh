# Sourced by scripts/fa4_one_gpu.sh and scripts/attention_vs_fa4.sh: where the carried FA4 stack (the extra fa4 as
# one xz tarball of `pip install --target`, split in parts; see fa4_one_gpu.sh) lives on the GPU machine.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
SITE=/root/fa4site
PARTS=/root/fa4parts
SHA=c227d0e33c301023bca2370c36556aece7eb7cbcd05a5f7fdca52722c71694db   # the 8 pinned wheels, pip install --no-deps
# --no-compile --target, bin/ and nvidia_cutlass_dsl/dsl_packages/iket left out, tar sorted with mtime 0, then
# xz -9e --lzma2=dict=256MiB (pip 23.2, 2026-12-07): 58,095,044 B, split -b 19364075 -d: 3 parts and a 2,819 B tail
export PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
