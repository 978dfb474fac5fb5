# Sourced by the staging scripts: the GPU image's platform (Python 3.12, x86-64 manylinux), as pip's
# download flags in the array GPU_PLATFORM. ../shared/gpu/prepare.sh spells the same list; it stages
# into its own parts and cannot source this.
GPU_PLATFORM=(--only-binary=:all: --python-version 3.12 --implementation cp)
for p in manylinux_2_35_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_28_x86_64 \
         manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  GPU_PLATFORM+=(--platform "$p")
done
