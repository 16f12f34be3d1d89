# Sourced by scripts/fa4_one_gpu.sh and scripts/attention_vs_fa4.sh: where the carried FA4 stack (the extra fa4 as
# one xz tarball of `pip install --target`, split in parts; see fa4_one_gpu.sh) lives on the GPU machine.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
SITE=/root/fa4site
PARTS=/root/fa4parts
SHA=99d4893b028fc955677a47c11dd0913bc85fef35c03a6d6ddc3aa911cfa9af0c   # the 8 pinned wheels, pip install --no-deps
# --no-compile --target, bin/ and nvidia_cutlass_dsl/dsl_packages/iket left out, tar sorted with mtime 0, then
# xz -9e --lzma2=dict=256MiB: 58.1 MB, 3 parts of 19,364,075 B (split -b 19364075 -d), one per call
export PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
