# Shared by start_optimized.sh and stop_optimized.sh (sourced, not run).
# Process control lives in one place, ocr_bundle/serve/processes.py (standard library only, so the
# system python3 runs it): PID files hold PID and start time, stops signal only processes
# that are provably still ours, readiness waits watch the process while they poll.

# --help (before a bare --) prints the calling script's header comment and touches nothing.
for argument in "$@"; do
  [[ $argument == -- ]] && break
  if [[ $argument == -h || $argument == --help ]]; then
    sed -n '2,/^set -euo pipefail/{/^set -euo pipefail/d;s/^# \{0,1\}//;p}' "$0"
    exit 0
  fi
done

RUN_DIR_DEFAULT="$ROOT/run"
RUN_DIR="${RUN_DIR:-$RUN_DIR_DEFAULT}"
# check_numbers NAME=RANGE...: the variables' ranges, those of the programs' flags (ocr_bundle/settings.py);
# each one out of range said on stderr, status 2.
check_numbers() { PYTHONPATH="$ROOT" python3 -m ocr_bundle.settings check "$@"; }
STOP_GRACE="${STOP_GRACE:-30}"
if ! problem=$(check_numbers STOP_GRACE=int_at_least_zero 2>&1); then  # whole seconds: bash adds to it
  echo "ERROR: $problem (seconds); nothing was started or stopped" >&2
  exit 2
fi

pid_file() { echo "$RUN_DIR/$1.pid"; }
processes() { PYTHONPATH="$ROOT" python3 -m ocr_bundle.serve.processes "$@"; }

# service_pid NAME: prints the recorded PID if that service is alive and still ours.
service_pid() { processes running "$(pid_file "$1")"; }

# stop_service NAME: TERM the leader, then the group, then KILL; remove the PID file.
stop_service() { processes stop "$(pid_file "$1")" --name "$1" --grace "$STOP_GRACE"; }

# The command that stops what this RUN_DIR holds, as a person types it (RUN_DIR named when not the default).
stop_command() {
  if [[ "$RUN_DIR" -ef "$RUN_DIR_DEFAULT" ]]; then echo "./stop_optimized.sh"
  else echo "RUN_DIR=$(printf %q "$RUN_DIR") ./stop_optimized.sh"; fi
}

# with_env NAME=VALUE... -- COMMAND...: COMMAND (a program or a shell function) runs with these variables in
# its environment. The one way the scripts hand a secret (a key, the page's login) to a child: `env
# NAME=secret cmd` would put it on env's own command line, which every user can read (/proc/PID/cmdline,
# ps) while it runs; an exported local variable goes through execve's environment only.
with_env() {
  while [[ $# -gt 0 && $1 != -- ]]; do
    local -x "$1"
    shift
  done
  shift
  "$@"
}

# hold_run_dir WHAT: one start or stop at a time per RUN_DIR. A lock on $RUN_DIR/.lock (file descriptor 9,
# held until this script exits; the services it launches do not inherit it) from the first check to
# "ready". The file names the holder: "start 1234 <start time>".
#   - a second start, while a start or a stop holds it: says who, exits 1, touches nothing;
#   - a stop during a start: cancels the start (TERM to the start script, which stops what it had started),
#     waits for the lock, then stops whatever is recorded.
hold_run_dir() {
  local what=$1 holder
  mkdir -p "$RUN_DIR"
  exec 9<>"$RUN_DIR/.lock"
  if ! flock -n 9; then
    holder=$(head -c 200 "$RUN_DIR/.lock" 2>/dev/null || true)
    read -r kind pid _ <<<"$holder"
    holder="a ${kind:-start or stop} (PID ${pid:-?})"
    if [[ $what == stop && $kind == start ]]; then
      echo "[stop] a start (PID $pid) holds $RUN_DIR: cancelling it (it stops what it had started)"
      processes signal-holder "$RUN_DIR/.lock" TERM >/dev/null 2>&1 || true
      if ! flock -w $((STOP_GRACE + 120)) 9; then
        echo "[stop] ERROR: the start (PID $pid) still holds $RUN_DIR after $((STOP_GRACE + 120)) s" >&2
        exit 1
      fi
    else
      echo "[$what] ERROR: $RUN_DIR is held by $holder (one start or stop at a time" \
        "per RUN_DIR): wait for it to finish, or use another RUN_DIR. Nothing was done." >&2
      exit 1
    fi
  fi
  processes hold-record "$RUN_DIR/.lock" "$what" $$
}
