#!/usr/bin/env bash
# Stage FlashInfer for the offline GPU machine, next to ../shared/gpu/prepare.sh's vLLM set.
#   bash benchmarks/stage_flashinfer.sh          # fills .gpu/pfi/flashinfer/ (keep /.gpu/ in .git/info/exclude)
# On the GPU machine: copy .gpu/pfi/* into /root/gpu/, then `bash benchmarks/gpu_bench.sh setup`
# installs it into /root/site-flashinfer, a directory of its own, so that only a server started
# with FLASHINFER=1 can import it and every other configuration runs exactly as before.
#
# flashinfer-python is the version vLLM 0.26.0 pins. Of its requirements only the small pure
# ones come along: its sampler and attention kernels are built just in time with the image's
# nvcc; nvidia-cutlass-dsl (92 MB, CuTe DSL kernels for Blackwell) and nvidia-cudnn-frontend
# (cuDNN attention) are for paths an H200 serving this model does not take, and `import
# flashinfer` and vLLM's FlashInfer backend import without them.
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/gpu_platform.sh
rm -rf .gpu/pfi
mkdir -p .gpu/pfi/flashinfer
python3 -m pip download -q --no-deps "${GPU_PLATFORM[@]}" -d .gpu/pfi/flashinfer \
  flashinfer-python==0.6.14 ninja==1.13.2 einops==0.8.2 click==8.5.1 tabulate==0.10.0 cuda-tile==1.7.0
echo "staged $(ls .gpu/pfi/flashinfer | wc -l) wheels, $(du -sh .gpu/pfi | cut -f1), in .gpu/pfi"
