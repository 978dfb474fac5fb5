#!/usr/bin/env bash
# Stage the benchmark's own tools for the offline GPU machine: py-spy, for `gpu_bench.sh hostprofile`.
#   bash benchmarks/stage_tools.sh          # fills .gpu/ptools/tools/ (keep /.gpu/ in .git/info/exclude)
# On the GPU machine: copy .gpu/ptools/* into /root/gpu/, then `bash benchmarks/gpu_bench.sh setup`
# installs it into /root/site-tools, apart from vLLM's /root/site: pip --target does not merge
# into a bin/ that already exists there, so py-spy's binary would be dropped (seventh session).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu/ptools
mkdir -p .gpu/ptools/tools
# A static binary in a py2.py3 wheel: one file for the GPU image's Python 3.12.
python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 --python-version 3.12 \
  -d .gpu/ptools/tools py-spy==0.4.3
echo "staged $(ls .gpu/ptools/tools), $(du -sh .gpu/ptools | cut -f1), in .gpu/ptools"
