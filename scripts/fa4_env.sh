# Sourced by scripts/fa4_one_gpu.sh and scripts/attention_vs_fa4.sh: where the carried FA4 stack (the extra fa4 as
# one xz tarball of `pip install --target`, split in two parts; see fa4_one_gpu.sh) lives on the GPU machine.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
SITE=/root/fa4site
PARTS=/root/fa4parts
SHA=1442127dc9ca7f401da205a8d814964adadea2e160e9d20a553d7ffbdb5b9179
export PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
