#!/usr/bin/env bash
# Rehearse a staged vLLM wheel set here, on the CPU, before it costs device time: every module a GPU start
# imports must import over the GPU image's packages.
#   bash benchmarks/rehearse_wheels.sh VERSION     # after benchmarks/stage_vllm.sh VERSION
# It builds (once) ~/.cache/lightonocr-bundle/gpu-image-py312, a Python 3.12 venv with the image's own torch
# 2.11.0 (CUDA 13 wheels, so its NVIDIA libraries: cuDNN 9.19, NCCL 2.28, ...) and the versions
# /work/.library/device/KINDS.md lists, installs .gpu/wheels-VERSION into a --target folder in one pip call as
# `gpu_bench.sh setup` does, and imports, with gpu_platform.sh's PYTHONPATH: torch, vLLM's serve entry point,
# its engine core and GPU worker, the LightOnOCR model, and every module of vLLM's kernel warm-up (a vLLM
# 0.34 start stopped on an H200 at `import cutlass` there, which this finds in a minute); in a set with
# FlashInfer, its attention modules and vLLM's own test that it would use it. What it cannot
# find: anything that needs a GPU to run (CUDA kernels, NCCL calls), and imports inside functions.
set -euo pipefail
VERSION=${1:?VERSION, e.g. 0.34.0}
cd "$(dirname "$0")/.."
source benchmarks/gpu_platform.sh
WHEELS=.gpu/wheels-$VERSION
[[ -d $WHEELS ]] || { echo "no $WHEELS: run benchmarks/stage_vllm.sh $VERSION first" >&2; exit 2; }
PY312=$(python312) || exit 2
IMAGE=${IMAGE_VENV:-$HOME/.cache/lightonocr-bundle/gpu-image-py312}
if [[ ! -x $IMAGE/bin/python ]]; then
  "$PY312" -m venv "$IMAGE.tmp"
  "$IMAGE.tmp/bin/pip" install -q torch==2.11.0 torchvision==0.26.0 torchaudio==2.11.0 triton==3.6.0 \
    transformers==5.17.0 numpy==2.5.2 huggingface_hub==1.33.0 tokenizers==0.23.2 safetensors==0.8.0 \
    sentencepiece==0.2.2 tiktoken==0.14.0 pillow opencv-python-headless numba aiohttp pyyaml psutil regex \
    requests einops cloudpickle ninja prometheus-client protobuf py-cpuinfo msgpack filelock jinja2 setuptools \
    matplotlib tqdm nvidia-ml-py uvloop httpx rich typer cuda-bindings cuda-core
  mv "$IMAGE.tmp" "$IMAGE"
fi
SITE=$(mktemp -d /tmp/rehearse-vllm-$VERSION.XXXX)
trap 'rm -rf "$SITE"' EXIT
"$IMAGE/bin/python" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$WHEELS"/*.whl
serve_env "$SITE"   # PYTHONPATH, and for a set with FlashInfer its ninja, as on the GPU machine
"$IMAGE/bin/python" - <<'PY'
import importlib, importlib.util, pkgutil, sys
modules = ["torch", "vllm", "vllm.entrypoints.cli.main", "vllm.v1.engine.core", "vllm.v1.worker.gpu_worker",
           "vllm.v1.attention.backends.flash_attn", "vllm.model_executor.models.lightonocr"]
import vllm.model_executor.warmup as warmup  # kernel_warmup and every module it may import on a CUDA start
modules += [f"vllm.model_executor.warmup.{m.name}" for m in pkgutil.iter_modules(warmup.__path__)]
with_flashinfer = importlib.util.find_spec("flashinfer") is not None
if with_flashinfer:  # what an fp8 KV cache on Hopper runs: the launcher picks FlashInfer where it imports
    modules += ["flashinfer", "flashinfer.decode", "flashinfer.prefill", "vllm.v1.attention.backends.flashinfer"]
failed = []
for name in modules:
    try:
        importlib.import_module(name)
    except Exception as error:  # what a GPU start would have stopped on
        failed.append(f"{name}: {type(error).__name__}: {error}")
if with_flashinfer:
    from vllm.utils.flashinfer import has_flashinfer  # vLLM's own test: importable, and nvcc and ninja found
    if not has_flashinfer():
        failed.append("vllm.utils.flashinfer.has_flashinfer(): False (nvcc or ninja not found: vLLM would not use it)")
import torch, vllm
print(f"vLLM {vllm.__version__} over torch {torch.__version__}: {len(modules) - len(failed)} of {len(modules)} modules import"
      + (f", FlashInfer {importlib.import_module('flashinfer').__version__} usable" if with_flashinfer and not failed else ""))
print("\n".join(failed))
sys.exit(1 if failed else 0)
PY
