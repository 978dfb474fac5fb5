#!/usr/bin/env bash
# Stage a vLLM wheel set for the offline GPU machine (its image: torch 2.11.0+cu130, Python 3.12, no
# network), cut into parts that each fit one device `run` call beside the working tree (64 MiB together).
#   bash benchmarks/stage_vllm.sh VERSION [PART_MB]   # VERSION: a list in benchmarks/gpu-wheels/ (0.26.0, 0.32.0, 0.34.0)
# It fills .gpu/vllm-VERSION/p1 .. pN (keep '/.gpu/' in .git/info/exclude); the downloads stay in
# .gpu/wheels-VERSION/ for the next time. On the GPU machine, each part with its own call:
#   run(carry [".gpu/vllm-VERSION/pK"])  mkdir -p /root/gpu-vllm-VERSION && cp .gpu/vllm-VERSION/pK/* /root/gpu-vllm-VERSION/
# then `bash benchmarks/gpu_bench.sh setup` installs every staged version: 0.26.0 into /root/site (the
# README's path), any other into /root/site-VERSION; SITE=/root/site-VERSION picks one for gpu_bench.sh.
# A new version's set is rehearsed here first, at no device time: bash benchmarks/rehearse_wheels.sh VERSION.
set -euo pipefail
VERSION=${1:?VERSION, e.g. 0.26.0 or 0.32.0}
PART_MB=${2:-40}
cd "$(dirname "$0")/.."
LIST=benchmarks/gpu-wheels/vllm-$VERSION.txt
[[ -f $LIST ]] || { echo "no wheel list $LIST" >&2; exit 2; }
source benchmarks/gpu_platform.sh
WHEELS=.gpu/wheels-$VERSION
STAGE=.gpu/vllm-$VERSION
mkdir -p "$WHEELS"
python3 -m pip download -q --no-deps "${GPU_PLATFORM[@]}" -d "$WHEELS" -r "$LIST"
rm -rf "$STAGE"; mkdir -p "$STAGE"
# One tar of the wheels, cut into parts: the GPU side concatenates the pieces back in name order.
tar -C "$WHEELS" -cf - . | split -b "${PART_MB}M" -d -a 3 - "$STAGE/piece."
# The checksums of every piece go with the last part: the GPU side installs a version only once
# all its pieces are there and whole (gpu_bench.sh setup), so a version whose parts are still on
# their way, or lost one, is never half installed.
(cd "$STAGE" && sha256sum piece.*) >"$STAGE/pieces.sha256"
i=0
for piece in "$STAGE"/piece.*; do
  i=$((i + 1)); mkdir -p "$STAGE/p$i"; mv "$piece" "$STAGE/p$i/"
done
mv "$STAGE/pieces.sha256" "$STAGE/p$i/"
echo "staged vLLM $VERSION: $i parts of at most $PART_MB MiB under $STAGE ($(du -sh "$WHEELS" | cut -f1) of wheels)"
