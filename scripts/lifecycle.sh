# Shared by start_optimized.sh and stop_optimized.sh (sourced, not run).
# Services are started with setsid, so each one leads its own process group and its PID
# is the group id: stopping the group also stops the engine processes vLLM forks.
# Only PIDs recorded in $RUN_DIR are ever signalled, and only while their command line
# still names the program we started (a recycled PID is left alone).

RUN_DIR="${RUN_DIR:-$ROOT/run}"
STOP_GRACE="${STOP_GRACE:-30}"

pid_file() { echo "$RUN_DIR/$1.pid"; }

# service_pid NAME MARKER: prints the recorded PID if that process is alive and still ours.
service_pid() {
  local file pid
  file=$(pid_file "$1")
  [[ -f "$file" ]] || return 1
  pid=$(<"$file")
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qE -- "$2" || return 1
  echo "$pid"
}

group_alive() { kill -0 -- "-$1" 2>/dev/null; }

# wait_group_gone PGID SECONDS: 0 once no process of the group is left.
wait_group_gone() {
  local pgid=$1 deadline=$((SECONDS + $2))
  while group_alive "$pgid"; do
    (( SECONDS >= deadline )) && return 1
    sleep 0.2
  done
  return 0
}

# stop_service NAME MARKER: TERM the leader (vLLM then stops its engine cleanly, ~2 s),
# then TERM the group, then KILL the group; remove the PID file. Harmless when stopped.
stop_service() {
  local name=$1 marker=$2 pid
  if ! pid=$(service_pid "$name" "$marker"); then
    if [[ -f $(pid_file "$name") ]]; then
      echo "$name: not running (removing stale PID file)"
      rm -f "$(pid_file "$name")"
    else
      echo "$name: not running"
    fi
    return 0
  fi
  echo "$name: stopping process group $pid (TERM)"
  kill -TERM "$pid" 2>/dev/null || true
  if ! wait_group_gone "$pid" "$STOP_GRACE"; then
    echo "$name: still running after ${STOP_GRACE}s, sending TERM to the whole group"
    kill -TERM -- "-$pid" 2>/dev/null || true
    if ! wait_group_gone "$pid" 5; then
      echo "$name: sending KILL to the group"
      kill -KILL -- "-$pid" 2>/dev/null || true
      wait_group_gone "$pid" 5 || echo "$name: WARNING: processes of group $pid survived KILL" >&2
    fi
  fi
  rm -f "$(pid_file "$name")"
  echo "$name: stopped"
}

# Extended regexps over the command line: the launcher (before it execs vLLM), then vLLM itself
# (cli.main serve on GPUs, openai.api_server on the CPU backend).
VLLM_MARKER='start_vllm_server\.py|vllm\.entrypoints'
UI_MARKER='app_vllm\.py'
