#!/usr/bin/env bash
# Stage what the GPU image lacks beyond vLLM for the offline GPU machine: py-spy, for `gpu_bench.sh
# hostprofile`, and SMG, the gateway (requirements.txt pins it), with grpcio, grpcio-health-checking
# and protobuf, the dependencies vLLM's wheel set does not bring (pyyaml and setproctitle it does),
# for the gateway measurements (benchmarks/gateway_bench.sh), and cryptography (with cffi and pycparser)
# for scripts/make_certs.py, which makes the TLS measurement's certificates.
#   bash benchmarks/stage_tools.sh          # fills .gpu/ptools/{tools,extra}/ (keep /.gpu/ in .git/info/exclude)
# On the GPU machine: copy .gpu/ptools/* into /root/gpu/, then `bash benchmarks/gpu_bench.sh setup`
# installs extra/ into /root/site beside vLLM, and py-spy into /root/site-tools, apart from vLLM's /root/site: pip --target does not merge
# into a bin/ that already exists there, so py-spy's binary would be dropped (2026-11-30 block-size run).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu/ptools
mkdir -p .gpu/ptools/tools .gpu/ptools/extra
# A static binary in a py2.py3 wheel: one file for the GPU image's Python 3.12.
python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 --python-version 3.12 \
  -d .gpu/ptools/tools py-spy==0.4.3
python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
  --python-version 3.12 --implementation cp -d .gpu/ptools/extra "$(grep -E '^smg==' requirements.txt)" \
  grpcio==1.85.3 grpcio-health-checking==1.85.1 protobuf==7.36.2 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12
echo "staged $(ls .gpu/ptools/extra)"
echo "staged $(ls .gpu/ptools/tools), $(du -sh .gpu/ptools | cut -f1), in .gpu/ptools"
