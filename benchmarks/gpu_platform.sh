# Sourced by the staging scripts (here) and the GPU drivers (there). GPU_PLATFORM: the GPU image's platform
# (Python 3.12, x86-64 manylinux) as pip's download flags; ../shared/gpu/prepare.sh spells the same list (it
# stages into its own parts and cannot source this). site_pythonpath and serve_env: below.
GPU_PLATFORM=(--only-binary=:all: --python-version 3.12 --implementation cp)
for p in manylinux_2_35_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_28_x86_64 \
         manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  GPU_PLATFORM+=(--platform "$p")
done

# site_pythonpath SITE: the PYTHONPATH that serves a vLLM installed with `pip install --target SITE` (gpu_bench.sh
# setup). Python runs no .pth file from a PYTHONPATH folder, so the folder nvidia-cutlass-dsl's .pth would add
# (vLLM 0.34 imports `cutlass` in its kernel warm-up) is named here; absent, it costs nothing.
site_pythonpath() { echo "$1:$1/nvidia_cutlass_dsl/dsl_packages"; }

# serve_env SITE: exports what a server started from SITE's vLLM needs (gpu_bench.sh, version_bench.sh): PYTHONPATH
# (site_pythonpath, then /root/site-flashinfer when FLASHINFER=1: 0.26.0's FlashInfer, staged apart by
# stage_flashinfer.sh so that only such a server imports it). Where FlashInfer is importable (that folder, or a
# set that carries it, as 0.34.0's does) its just-in-time builds need ninja and nvcc: vLLM 0.34 turns FlashInfer
# off without them, and the launcher looks for nvcc. So ninja comes from the staged bin/ (SITE's after the
# image's own PATH: its other scripts shadow nothing) and CUDA_HOME is the image's toolkit unless set.
FLASHINFER_SITE=/root/site-flashinfer
QUALITY_SITE=/root/site-quality   # olmOCR-Bench's scorer (benchmarks/stage_quality.sh), for quality_check.py
serve_env() {
  local site=$1 pythonpath
  pythonpath=$(site_pythonpath "$site")
  if [[ ${FLASHINFER:-0} == 1 ]]; then
    pythonpath+=":$FLASHINFER_SITE"; PATH=$FLASHINFER_SITE/bin:$PATH
  fi
  if [[ ${FLASHINFER:-0} == 1 || -d $site/flashinfer ]]; then
    if [[ -d $site/bin ]]; then PATH=$PATH:$site/bin; fi
    if [[ -z ${CUDA_HOME:-} && -d /usr/local/cuda ]]; then export CUDA_HOME=/usr/local/cuda; fi
  fi
  export PYTHONPATH=$pythonpath PATH
}

# python312: prints a Python 3.12 that runs here (the GPU image's version), for rehearsing staged sets on the CPU
# (rehearse_wheels.sh, stage_quality.sh rehearse); fails when there is none.
python312() {
  local candidate
  for candidate in python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    # One that runs: a pyenv shim is on the PATH even where its version is not the selected one.
    if "$candidate" -c "" 2>/dev/null; then echo "$candidate"; return 0; fi
  done
  echo "needs a Python 3.12 (the GPU image's)" >&2; return 1
}
