# Sourced by scripts/fa4_one_gpu.sh and scripts/attention_vs_fa4.sh: where the carried FA4 stack (the extra fa4 as
# one xz tarball of `pip install --target`, split in parts; see fa4_one_gpu.sh) lives on the GPU machine.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
SITE=/root/fa4site
PARTS=/root/fa4parts
SHA=53abc8851540f3b5a454c9c3881fce39111a3ee210df89121b06a1839886f17d   # rebuilt in session 8 (3 parts)
export PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
