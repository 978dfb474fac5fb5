#!/usr/bin/env bash
# Start the vLLM server and the Gradio page in the background; stop them with ./stop_optimized.sh.
#
#   ./start_optimized.sh                      # GPU: lightonai/LightOnOCR-2-1B; no GPU: test checkpoint on CPU
#   MODEL=/models/LightOnOCR-2-1B HOST=0.0.0.0 VLLM_API_KEY=s3cret UI_AUTH=me:pw ./start_optimized.sh
#   ./start_optimized.sh --max-num-seqs 64    # extra arguments go to start_vllm_server.py
#   NODES=2 NODE_RANK=0 HEAD_ADDRESS=10.0.0.1 ./start_optimized.sh   # head of two machines (API + page)
#   NODES=2 NODE_RANK=1 HEAD_ADDRESS=10.0.0.1 ./start_optimized.sh   # the other: headless engine replicas
#
# Configuration (environment; flags for the launcher go after the script name):
#   MODEL          hub id or checkpoint folder (default: the hub model on a GPU box; without a GPU,
#                  a generated random-weight test checkpoint on vLLM's CPU backend)
#   HOST, PORT     vLLM bind address and port (default 127.0.0.1:8000)
#   UI_HOST, UI_PORT  page bind address and port (default $HOST:7860)
#   VLLM_API_KEY   key the server requires and the page sends (default: none)
#   UI_AUTH        page login, user:password[,user2:password2] (default: none). Beyond loopback the
#                  page needs one (or UI_AUTH=none, open on purpose), and the API a key (or ALLOW_OPEN_API=1)
#   UI             off: start vLLM only, no page (an API-only server; default on)
#   PYTHON         interpreter with vLLM (default: python3 if it has vLLM; without a GPU the CPU
#                  environment from scripts/setup_cpu_env.sh, built on first use)
#   RUN_DIR        PID files and logs (default ./run)
#   STARTUP_TIMEOUT seconds to wait for vLLM's /health, then for its warm-up page (default 900: a first GPU
#                  start builds kernels and compiles the vision encoder)
#   DATA_PARALLEL_SIZE  engine replicas on this machine (default auto: one per visible GPU,
#                  CUDA_VISIBLE_DEVICES respected; 1 keeps one GPU)
#   NODES, NODE_RANK, HEAD_ADDRESS  several machines behind the head's one endpoint (vLLM data
#                  parallelism; node 0 is the head; the others start headless replicas, no page)
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
export DATA_PARALLEL_SIZE="${DATA_PARALLEL_SIZE:-auto}" NODES="${NODES:-1}" NODE_RANK="${NODE_RANK:-0}"
export HEAD_ADDRESS="${HEAD_ADDRESS:-}"
role=head; [[ "$NODE_RANK" != 0 ]] && role=worker  # a worker runs headless engines only: no API server, no page
UI="${UI:-on}"

say() { echo "[start] $*"; }
die() { echo "[start] ERROR: $*" >&2; exit 1; }

mkdir -p "$RUN_DIR"

# ---- refuse to start twice
for service in vllm ui; do
  if pid=$(service_pid "$service"); then
    die "$service is already running (PID $pid). Stop it first: ./stop_optimized.sh"
  fi
done

# ---- exposure: beyond loopback, the API needs a key and the page a login (or an explicit opt-out)
if [[ $role == head ]]; then
  exposure_args=(--api-host "$HOST")
  [[ -n "$VLLM_API_KEY" ]] && exposure_args+=(--api-key-set)
  [[ "${ALLOW_OPEN_API:-}" =~ ^(1|true|yes)$ ]] && exposure_args+=(--allow-open-api)
  [[ $UI != off ]] && exposure_args+=(--page-host "$UI_HOST" --page-auth "$UI_AUTH")
  PYTHONPATH="$ROOT" python3 -m ocr_bundle.exposure "${exposure_args[@]}" || exit 2
fi

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

checks=("$HOST:$PORT:vLLM:PORT")
[[ $UI == off ]] || checks+=("$UI_HOST:$UI_PORT:page:UI_PORT")
[[ $role == worker ]] && checks=()
for check in "${checks[@]}"; do
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
        stop_service "$name" >&2 || true
      fi
    done
    echo "[start] failed; nothing left running." >&2
  fi
}
trap on_exit EXIT

# wait_ready NAME URL SECONDS [CODES]: until URL answers (default 200), while the service lives.
wait_ready() {
  processes wait-ready "$2" --pid-file "$(pid_file "$1")" --timeout "$3" --accept "${4:-200}" --name "$1" >/dev/null \
    || die "$1 is not ready (see above)"
}

launch() {  # launch NAME COMMAND...: own process group, log, PID file with start time
  local name=$1; shift
  setsid "$@" >"$RUN_DIR/$name.log" 2>&1 </dev/null &
  started+=("$name")
  processes record "$(pid_file "$name")" $! || die "$name exited at once"
}

export VLLM_API_KEY  # the launcher and the page read it from the environment, never argv
if [[ $role == worker ]]; then
  [[ -n "$HEAD_ADDRESS" ]] || die "NODE_RANK=$NODE_RANK needs HEAD_ADDRESS (the head node's private address)"
  say "starting headless vLLM engines (node $NODE_RANK of $NODES, joining $HEAD_ADDRESS); log: $RUN_DIR/vllm.log"
  launch vllm "$PYTHON" "$ROOT/start_vllm_server.py" --model "$MODEL" "$@"
  # The head serves once every node's replicas have joined: its /health is this node's readiness too.
  wait_ready vllm "http://$HEAD_ADDRESS:$PORT/health" "$STARTUP_TIMEOUT"
  say "node $NODE_RANK joined: the head at http://$HEAD_ADDRESS:$PORT serves with its replicas (PID $(service_pid vllm))"
  grep -m1 "WARNING: the data-parallel RPC port" "$RUN_DIR/vllm.log" >&2 || true
  echo "  Logs: $RUN_DIR/vllm.log    Stop: ./stop_optimized.sh (on this node)"
  exit 0
fi
say "starting vLLM ($MODEL) on $HOST:$PORT; log: $RUN_DIR/vllm.log"
launch vllm "$PYTHON" "$ROOT/start_vllm_server.py" --model "$MODEL" --host "$HOST" --port "$PORT" "$@"
(( NODES > 1 )) && say "waiting for the replicas of all $NODES nodes to join (start the others with NODE_RANK=1..)"
wait_ready vllm "http://$(local_address "$HOST"):$PORT/health" "$STARTUP_TIMEOUT"
# /health answers before the engines have read a page; a first page pays one-time costs (on a
# GPU, compiling the vision encoder: 15-45 s). Pay them now, one page per engine.
say "warming up: one page per engine$([[ $has_gpu == true ]] && echo ' (on a GPU this compiles the vision encoder)')"
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m ocr_bundle.serve.warmup --url "http://$(local_address "$HOST"):$PORT" \
  --timeout "$STARTUP_TIMEOUT" | sed 's/^/[start] /' || die "vLLM answers /health but cannot read a page (see above)"
say "vLLM is ready (PID $(service_pid vllm)); $(grep -m1 -oE 'serving on [0-9]+ GPUs?: [a-z ]+[0-9]*|node 0 of [0-9]+.*' "$RUN_DIR/vllm.log" || echo 'one engine')"
grep -m1 "WARNING: the data-parallel RPC port" "$RUN_DIR/vllm.log" >&2 || true

page_line="off (UI=off)"
if [[ $UI != off ]]; then
  say "starting the page on $UI_HOST:$UI_PORT; log: $RUN_DIR/ui.log"
  launch ui env VLLM_URL="http://$(local_address "$HOST"):$PORT" UI_HOST="$UI_HOST" UI_PORT="$UI_PORT" \
    UI_AUTH="$UI_AUTH" "$PYTHON" "$ROOT/app_vllm.py"
  # Gradio serves /config once the app is up (also behind a login: then it answers 401, still "up").
  wait_ready ui "http://$(local_address "$UI_HOST"):$UI_PORT/config" "$UI_TIMEOUT" 200,401
  say "page is ready (PID $(service_pid ui))"
  page_line="http://$(public_address "$UI_HOST"):$UI_PORT"
fi

api="http://$(public_address "$HOST"):$PORT"
# The name requests must use: the hub id on a GPU box, the folder name for a local checkpoint.
served_model=$(python3 - "http://$(local_address "$HOST"):$PORT/v1/models" <<'PY' || echo "MODEL-NAME"
import json, os, sys, urllib.request
key = os.environ.get("VLLM_API_KEY")
request = urllib.request.Request(sys.argv[1], headers={"Authorization": f"Bearer {key}"} if key else {})
print(json.load(urllib.request.urlopen(request, timeout=10))["data"][0]["id"])
PY
)
key_header=""; [[ -n "$VLLM_API_KEY" ]] && key_header=' -H "Authorization: Bearer $VLLM_API_KEY"'
cat <<MSG

  Page:      $page_line
  vLLM API:  $api/v1   (model "$served_model"; try: curl$key_header $api/v1/models)
  Logs:      $RUN_DIR/vllm.log, $RUN_DIR/ui.log
  Stop:      ./stop_optimized.sh

  Clients, with the Python that has what they need$([[ -n "$VLLM_API_KEY" ]] && echo ' (export VLLM_API_KEY first)'):
    $PYTHON $ROOT/stress_test.py --url $api$([[ $has_gpu == true ]] || echo ' --max-tokens 64')
    $PYTHON $ROOT/batch_ocr.py scans/ --url $api$([[ $has_gpu == true ]] || echo ' --max-tokens 64 --max-attempts 1')

  Read a page through the API (paste into a shell):
    IMG=\$(base64 -w0 '$ROOT/samples/table_screenshot.png')
    curl -s $api/v1/chat/completions -H 'Content-Type: application/json'$key_header -d '{"model": "$served_model", "max_tokens": 1024, "temperature": 0.2, "top_p": 0.9, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,'"\$IMG"'"}}]}]}'
MSG
