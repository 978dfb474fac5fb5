# Shared by start_optimized.sh and stop_optimized.sh (sourced, not run).
# Process control lives in one place, ocr_bundle/serve/processes.py (standard library only, so the
# system python3 runs it): PID files hold PID and start time, stops signal only processes
# that are provably still ours, readiness waits watch the process while they poll.

RUN_DIR="${RUN_DIR:-$ROOT/run}"
STOP_GRACE="${STOP_GRACE:-30}"
if [[ ! "$STOP_GRACE" =~ ^[0-9]+$ ]]; then
  echo "ERROR: STOP_GRACE must be whole seconds (like 30), not '$STOP_GRACE'; nothing was started or stopped" >&2
  exit 2
fi

pid_file() { echo "$RUN_DIR/$1.pid"; }
processes() { PYTHONPATH="$ROOT" python3 -m ocr_bundle.serve.processes "$@"; }

# service_pid NAME: prints the recorded PID if that service is alive and still ours.
service_pid() { processes running "$(pid_file "$1")"; }

# stop_service NAME: TERM the leader, then the group, then KILL; remove the PID file.
stop_service() { processes stop "$(pid_file "$1")" --name "$1" --grace "$STOP_GRACE"; }
