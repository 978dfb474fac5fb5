#!/usr/bin/env bash
# Stop what ./start_optimized.sh started (recorded PIDs only): the page and the document API; then, when this server
# serves through a gateway, its membership (it leaves the gateway and waits for the server's
# requests, so none fails); the gateway; then vLLM.
#   RUN_DIR   where the PID files are (default ./run). A start still in progress there is cancelled
#             first (it stops what it had started), then whatever is recorded is stopped
#   STOP_GRACE  seconds between TERM and escalation (default 30)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/lifecycle.sh
source "$ROOT/scripts/lifecycle.sh"
hold_run_dir stop  # one start or stop at a time; a start in progress is cancelled first

rc=0
stop_service ui || rc=1
stop_service ocr-api || rc=1
if [[ -f "$(pid_file membership)" ]]; then
  # Its drain takes up to 60 s (ocr_bundle/serve/membership.py): do not escalate before.
  processes stop "$(pid_file membership)" --name membership --grace "$(( STOP_GRACE > 75 ? STOP_GRACE : 75 ))" || rc=1
fi
[[ -f "$(pid_file gateway)" ]] && { stop_service gateway || rc=1; }
stop_service vllm || rc=1
exit $rc
