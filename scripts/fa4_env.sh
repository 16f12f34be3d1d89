# Sourced by scripts/fa4_one_gpu.sh and scripts/attention_vs_fa4.sh: where the carried FA4 stack (the extra fa4 as
# one xz tarball of `pip install --target`, split in parts; see fa4_one_gpu.sh) lives on the GPU machine.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
SITE=/root/fa4site
PARTS=/root/fa4parts
SHA=7e26b658063293bbe295537e418e26e58550e12061a6a3bef5a553fb8c94428f   # rebuilt in session 9 (3 parts of 24.1 MB; libs-core inside)
export PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
