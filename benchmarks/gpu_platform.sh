# Sourced by the staging scripts (here) and the GPU drivers (there). GPU_PLATFORM: the GPU image's platform
# (Python 3.12, x86-64 manylinux) as pip's download flags; ../shared/gpu/prepare.sh spells the same list (it
# stages into its own parts and cannot source this). site_pythonpath: below.
GPU_PLATFORM=(--only-binary=:all: --python-version 3.12 --implementation cp)
for p in manylinux_2_35_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_28_x86_64 \
         manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  GPU_PLATFORM+=(--platform "$p")
done

# site_pythonpath SITE: the PYTHONPATH that serves a vLLM installed with `pip install --target SITE` (gpu_bench.sh
# setup). Python runs no .pth file from a PYTHONPATH folder, so the folder nvidia-cutlass-dsl's .pth would add
# (vLLM 0.34 imports `cutlass` in its kernel warm-up) is named here; absent, it costs nothing.
site_pythonpath() { echo "$1:$1/nvidia_cutlass_dsl/dsl_packages"; }
