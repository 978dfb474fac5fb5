#!/usr/bin/env bash
# Stop what ./start_optimized.sh started: the page, then vLLM (recorded PIDs only).
#   RUN_DIR   where the PID files are (default ./run)
#   STOP_GRACE  seconds between TERM and escalation (default 30)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/lifecycle.sh
source "$ROOT/scripts/lifecycle.sh"

rc=0
stop_service ui || rc=1
stop_service vllm || rc=1
exit $rc
