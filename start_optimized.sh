#!/usr/bin/env bash
# Start the vLLM server and the Gradio page in the background; stop them with ./stop_optimized.sh.
#
#   ./start_optimized.sh                      # GPU: lightonai/LightOnOCR-2-1B; no GPU: test checkpoint on CPU
#   MODEL=/models/LightOnOCR-2-1B HOST=0.0.0.0 VLLM_API_KEY=s3cret UI_AUTH=me:pw ./start_optimized.sh
#   ./start_optimized.sh --max-num-seqs 64    # extra arguments go to start_vllm_server.py
#
# Configuration (environment; flags for the launcher go after the script name):
#   MODEL          hub id or checkpoint folder (default: the hub model on a GPU box; without a GPU,
#                  a generated random-weight test checkpoint on vLLM's CPU backend)
#   HOST, PORT     vLLM bind address and port (default 127.0.0.1:8000)
#   UI_HOST, UI_PORT  page bind address and port (default $HOST:7860)
#   VLLM_API_KEY   key the server requires and the page sends (default: none)
#   UI_AUTH        page login, user:password[,user2:password2] (default: none)
#   PYTHON         interpreter with vLLM (default: python3 if it has vLLM; without a GPU the CPU
#                  environment from scripts/setup_cpu_env.sh, built on first use)
#   RUN_DIR        PID files and logs (default ./run)
#   STARTUP_TIMEOUT seconds to wait for vLLM's /health (default 900: first GPU start compiles)
#   MAX_PAGES_IN_FLIGHT, KV_CACHE_DTYPE, GPU_MEMORY_UTILIZATION, MAX_MODEL_LEN, ...
#                  read by start_vllm_server.py (its --help lists them); e.g. MAX_PAGES_IN_FLIGHT=64
#                  sizes GPU memory for 64 pages at once instead of taking 90% of the card
set -euo pipefail
ROOT=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/lifecycle.sh
source "$ROOT/scripts/lifecycle.sh"

HOST="${HOST:-127.0.0.1}"
PORT="${PORT:-8000}"
UI_HOST="${UI_HOST:-$HOST}"
UI_PORT="${UI_PORT:-7860}"
MODEL="${MODEL:-}"
VLLM_API_KEY="${VLLM_API_KEY:-}"
UI_AUTH="${UI_AUTH:-}"
PYTHON="${PYTHON:-}"
STARTUP_TIMEOUT="${STARTUP_TIMEOUT:-900}"
UI_TIMEOUT="${UI_TIMEOUT:-120}"
TINY_CHECKPOINT="$ROOT/models/lightonocr-tiny"

say() { echo "[start] $*"; }
die() { echo "[start] ERROR: $*" >&2; exit 1; }

command -v curl >/dev/null || die "curl is needed for the readiness checks (apt-get install curl)"
mkdir -p "$RUN_DIR"

# ---- refuse to start twice
for service in vllm:"$VLLM_MARKER" ui:"$UI_MARKER"; do
  if pid=$(service_pid "${service%%:*}" "${service#*:}"); then
    die "${service%%:*} is already running (PID $pid). Stop it first: ./stop_optimized.sh"
  fi
done

is_all_interfaces() { [[ "$1" == "0.0.0.0" || "$1" == "::" ]]; }
# Address the readiness checks (and the page) use to reach a service bound to $1.
local_address() {
  if is_all_interfaces "$1" || [[ "$1" == "localhost" ]]; then echo 127.0.0.1; else echo "$1"; fi
}
# Address a person can open: the machine's first address when bound to all interfaces.
public_address() {
  local address=""
  if is_all_interfaces "$1"; then address=$(hostname -I 2>/dev/null | awk '{print $1}'); echo "${address:-$(hostname)}"
  else echo "$1"; fi
}
port_in_use() { (exec 3<>"/dev/tcp/$(local_address "$1")/$2") 2>/dev/null; }

for check in "$HOST:$PORT:vLLM:PORT" "$UI_HOST:$UI_PORT:page:UI_PORT"; do
  IFS=: read -r h p what variable <<<"$check"
  if port_in_use "$h" "$p"; then
    die "port $p ($what) is already in use by another program; set $variable to a free port"
  fi
done

# ---- GPU or CPU, interpreter and model
has_gpu=false
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then has_gpu=true; fi
if [[ -z "$PYTHON" ]]; then
  if python3 -c "import vllm" >/dev/null 2>&1; then
    PYTHON=python3
  elif [[ $has_gpu == false ]]; then
    say "no GPU and no vLLM in python3: using vLLM's CPU build (scripts/setup_cpu_env.sh; first run installs it)"
    PYTHON="$("$ROOT/scripts/setup_cpu_env.sh" | tail -n 1)/bin/python"
  else
    die "vLLM is not installed for python3. On this GPU box: pip install -r requirements.txt (or set PYTHON)"
  fi
fi
if [[ -z "$MODEL" ]]; then
  if [[ $has_gpu == true ]]; then
    MODEL="lightonai/LightOnOCR-2-1B"
  else
    if [[ ! -f "$TINY_CHECKPOINT/config.json" ]]; then
      say "generating the tiny random-weight test checkpoint in $TINY_CHECKPOINT"
      "$PYTHON" "$ROOT/scripts/make_checkpoint.py" --preset tiny --out "$TINY_CHECKPOINT" >/dev/null
    fi
    MODEL="$TINY_CHECKPOINT"
    say "no GPU: serving the generated test checkpoint on vLLM's CPU backend."
  fi
fi
if [[ -f "$MODEL/random_weights.json" ]]; then
  say "$MODEL has random weights: it answers with random text."
  say "Real OCR needs the real weights (MODEL=lightonai/LightOnOCR-2-1B or a local copy), best on a GPU."
fi

# ---- security warnings
if is_all_interfaces "$HOST" && [[ -z "$VLLM_API_KEY" ]]; then
  echo "################################################################################" >&2
  echo "WARNING: vLLM listens on all interfaces WITHOUT an API key: anyone who can reach" >&2
  echo "this machine can use it. Set VLLM_API_KEY=... (the page sends it automatically)." >&2
  echo "################################################################################" >&2
fi
if is_all_interfaces "$UI_HOST" && [[ -z "$UI_AUTH" ]]; then
  echo "################################################################################" >&2
  echo "WARNING: the page listens on all interfaces WITHOUT a login. Set UI_AUTH=user:password." >&2
  echo "################################################################################" >&2
fi

# ---- on any failure from here: show why, stop what was started, exit non-zero
started=()
on_exit() {
  local rc=$?
  if (( rc != 0 )); then
    for name in "${started[@]}"; do
      echo "---- last lines of $RUN_DIR/$name.log ----" >&2
      tail -n 40 "$RUN_DIR/$name.log" >&2 || true
    done
    for name in ui vllm; do
      if [[ " ${started[*]} " == *" $name "* ]]; then
        marker=$VLLM_MARKER; [[ $name == ui ]] && marker=$UI_MARKER
        stop_service "$name" "$marker" >&2 || true
      fi
    done
    echo "[start] failed; nothing left running." >&2
  fi
}
trap on_exit EXIT

# wait_ready NAME PID URL SECONDS: until URL answers 200, while the process lives.
wait_ready() {
  local name=$1 pid=$2 url=$3 deadline=$((SECONDS + $4))
  until curl -fsS -o /dev/null -m 2 "$url" 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || die "$name exited during start-up"
    (( SECONDS < deadline )) || die "$name did not answer $url within $4 s"
    sleep 1
  done
}

launch() {  # launch NAME COMMAND...: own process group, log, PID file
  local name=$1; shift
  setsid "$@" >"$RUN_DIR/$name.log" 2>&1 </dev/null &
  echo $! >"$(pid_file "$name")"
  started+=("$name")
}

export VLLM_API_KEY  # the launcher and the page read it from the environment, never argv
say "starting vLLM ($MODEL) on $HOST:$PORT; log: $RUN_DIR/vllm.log"
launch vllm "$PYTHON" "$ROOT/start_vllm_server.py" --model "$MODEL" --host "$HOST" --port "$PORT" "$@"
vllm_pid=$(<"$(pid_file vllm)")
wait_ready vLLM "$vllm_pid" "http://$(local_address "$HOST"):$PORT/health" "$STARTUP_TIMEOUT"
say "vLLM is ready (PID $vllm_pid)"

say "starting the page on $UI_HOST:$UI_PORT; log: $RUN_DIR/ui.log"
launch ui env VLLM_URL="http://$(local_address "$HOST"):$PORT" UI_HOST="$UI_HOST" UI_PORT="$UI_PORT" \
  UI_AUTH="$UI_AUTH" "$PYTHON" "$ROOT/app_vllm.py"
ui_pid=$(<"$(pid_file ui)")
ui_deadline=$((SECONDS + UI_TIMEOUT))
# Gradio serves /config once the app is up (also behind a login: then it answers 401, still "up").
until [[ $(curl -s -o /dev/null -w '%{http_code}' -m 2 "http://$(local_address "$UI_HOST"):$UI_PORT/config" || true) =~ ^(200|401)$ ]]; do
  kill -0 "$ui_pid" 2>/dev/null || die "the page exited during start-up"
  (( SECONDS < ui_deadline )) || die "the page did not answer within $UI_TIMEOUT s"
  sleep 0.5
done
say "page is ready (PID $ui_pid)"

api="http://$(public_address "$HOST"):$PORT"
key_header=""; [[ -n "$VLLM_API_KEY" ]] && key_header=' -H "Authorization: Bearer $VLLM_API_KEY"'
cat <<MSG

  Page:      http://$(public_address "$UI_HOST"):$UI_PORT
  vLLM API:  $api/v1   (try: curl$key_header $api/v1/models)
  Logs:      $RUN_DIR/vllm.log, $RUN_DIR/ui.log
  Stop:      ./stop_optimized.sh
MSG
