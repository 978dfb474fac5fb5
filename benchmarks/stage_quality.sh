#!/usr/bin/env bash
# Stage olmOCR-Bench's scorer for the offline GPU machine, so that quality_check.py scores there what a vLLM
# version reads (version_bench.sh QUALITY=1: the trained reader on scripts/make_bench.py's mini-bench).
#   bash benchmarks/stage_quality.sh         # fills .gpu/pquality/quality/ (keep /.gpu/ in .git/info/exclude)
# On the GPU machine: copy .gpu/pquality/* into /root/gpu/ (one `run`, ~58 MB), then `bash
# benchmarks/gpu_bench.sh setup` installs it into /root/site-quality, a directory of its own beside the vLLM sets.
#
# Not requirements-quality.txt's ~120 packages (olmocr[bench]: its hosted models' clients, lingua, ...): what
# the scorer imports (olmocr.bench.benchmark, .tests, .utils; ocr_bundle/quality/scoring.py), at the versions
# the CPU environment resolves for requirements-quality.txt. Playwright is its Python package alone (53 MB,
# imported by olmocr's tests module): its Chromium renders only the math tests, which the mini-bench has none
# of. numpy, tqdm, pillow and typing_extensions are the GPU image's. Rehearsed on the CPU with Python 3.12:
# the three modules import over those four (benchmarks/stage_quality.sh rehearse).
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/gpu_platform.sh
WHEELS=.gpu/pquality/quality
case ${1:-stage} in
  stage)
    rm -rf .gpu/pquality
    mkdir -p "$WHEELS"
    python3 -m pip download -q --no-deps "${GPU_PLATFORM[@]}" -d "$WHEELS" \
      "$(grep -oE '^olmocr[^ ]*==[0-9.]+' requirements-quality.txt | sed 's/\[bench\]//')" \
      beautifulsoup4==4.15.0 soupsieve==4.1.4 fuzzysearch==0.8.1 rapidfuzz==3.14.6 pypdf==7.1.1 \
      playwright==1.65.2 greenlet==3.5.6 pyee==16.1.0 attrs==26.1.0
    echo "staged $(ls "$WHEELS" | wc -l) wheels, $(du -sh .gpu/pquality | cut -f1), in .gpu/pquality"
    ;;
  rehearse)  # the three modules import in a Python 3.12 with only the image's share of their needs
    [[ -d $WHEELS ]] || { echo "no $WHEELS: run benchmarks/stage_quality.sh first" >&2; exit 2; }
    PY312=$(python312) || exit 2
    work=$(mktemp -d /tmp/rehearse-quality.XXXX)
    trap 'rm -rf "$work"' EXIT
    "$PY312" -m venv "$work/image"
    "$work/image/bin/pip" install -q numpy tqdm pillow typing_extensions
    "$work/image/bin/python" -m pip install -q --no-index --no-deps --no-compile --target "$work/site" "$WHEELS"/*.whl
    PYTHONPATH=$work/site "$work/image/bin/python" -c "
import importlib
for name in ('olmocr.bench.benchmark', 'olmocr.bench.tests', 'olmocr.bench.utils'):
    importlib.import_module(name)
print('the scorer imports: olmocr.bench.benchmark, .tests, .utils')"
    ;;
  *) echo "usage: stage_quality.sh [stage|rehearse]" >&2; exit 2 ;;
esac
