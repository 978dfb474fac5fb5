#!/usr/bin/env bash
# Start the vLLM server, the document API and the Gradio page in the background; stop them with
# ./stop_optimized.sh.
#
#   ./start_optimized.sh                      # GPU: lightonai/LightOnOCR-2-1B; no GPU: test checkpoint on CPU
#   MODEL=/models/LightOnOCR-2-1B HOST=0.0.0.0 VLLM_API_KEY=s3cret UI_AUTH=me:pw ./start_optimized.sh
#   ./start_optimized.sh --max-num-seqs 64    # extra arguments go to start_vllm_server.py
#   ROUTER=on HOST=0.0.0.0 VLLM_API_KEY=... ROUTER_ADMIN_KEY=... UI_AUTH=me:pw ./start_optimized.sh  # head
#   JOIN=https://10.0.0.1:8000 HOST=0.0.0.0 VLLM_API_KEY=... ROUTER_ADMIN_KEY=... TLS_CERT=... ./start_optimized.sh  # a node
#
# Configuration (environment; flags for the launcher go after the script name):
#   MODEL          hub id or checkpoint folder (default: the hub model on a GPU box; without a GPU,
#                  a generated random-weight test checkpoint on vLLM's CPU backend)
#   HOST, PORT     vLLM bind address and port (default 127.0.0.1:8000)
#   UI_HOST, UI_PORT  page bind address and port (default $HOST:7860)
#   VLLM_API_KEY   key the server requires on every route but /health, /metrics, /version, /ping, and the
#                  page sends (default: none). Read from the environment only; the banner masks it
#   UI_AUTH        page login, user:password[,user2:password2] (default: none). Beyond loopback the
#                  page needs one (or UI_AUTH=none, open on purpose), and the API a key (or ALLOW_OPEN_API=1)
#   TLS_CERT, TLS_KEY, TLS_CA  this machine's certificate, its key and the cluster's CA (python3
#                  scripts/make_certs.py makes them): the API, the page and the gateway serve HTTPS, every
#                  check of this script verifies against TLS_CA, and a server behind a gateway accepts only
#                  clients with a certificate signed by TLS_CA (the gateway). Beyond loopback plain HTTP
#                  is refused unless ALLOW_PLAINTEXT=1 (a private network, on purpose)
#   UI             off (or 0, false, no): start vLLM only, no page (an API-only server; default on)
#   OCR_API        off (or 0, false, no): no document API (POST /v1/ocr, Mistral-OCR-compatible; default on)
#   OCR_API_PORT   the document API's port, on HOST (default 8090); its limits and concurrency: python -m
#                  ocr_bundle.api --help (OCR_API_MAX_PAGES, OCR_API_MAX_MB, OCR_API_CONCURRENCY, OCR_API_FETCH)
#   PYTHON         interpreter with vLLM (default: python3 if it has vLLM; without a GPU the CPU
#                  environment from scripts/setup_cpu_env.sh, built on first use)
#   RUN_DIR        PID files and logs (default ./run). One start or stop at a time per RUN_DIR: a second
#                  start is refused, saying who holds it; a stop during a start cancels the start
#   STARTUP_TIMEOUT seconds to wait for vLLM's /health, then for its warm-up page (default 900: a first GPU
#                  start builds kernels and compiles the vision encoder)
#   DATA_PARALLEL_SIZE  engine replicas on this machine (default auto: one per visible GPU,
#                  CUDA_VISIBLE_DEVICES respected; 1 keeps one GPU)
#   ROUTER         on: the head of several machines. The gateway (SMG) on HOST:PORT is the one endpoint
#                  (page and clients use it; it checks VLLM_API_KEY); this machine's own server runs on
#                  127.0.0.1:SERVER_PORT (default PORT+1), reachable by the gateway only, and joins it.
#                  only: the gateway (and page) with no server here
#   ROUTER_ADMIN_KEY  the gateway's admin key: only it adds or removes servers. Needed on the head and on
#                  every machine that joins; clients never hold it. Must differ from VLLM_API_KEY
#   JOIN           the head's endpoint, e.g. https://10.0.0.1:8000: this machine's server (HOST:PORT, no
#                  page) joins the head's gateway once it has read its warm-up page, stays joined (also
#                  across a restart of the head) and leaves it on ./stop_optimized.sh. Checked before
#                  vLLM starts: a gateway, both keys accepted, an address it can reach
#   ROUTER_REQUEST_TIMEOUT, ROUTER_METRICS_PORT  the gateway's (python -m ocr_bundle.serve.gateway --help)
#   STOP_GRACE     seconds stop_optimized.sh waits between TERM and KILL (default 30; whole seconds)
#   MAX_PAGES_IN_FLIGHT, KV_CACHE_DTYPE, GPU_MEMORY_UTILIZATION, MAX_MODEL_LEN, ...
#                  read by start_vllm_server.py (its --help lists them); e.g. MAX_PAGES_IN_FLIGHT=64
#                  sizes GPU memory for 64 pages at once instead of taking 90% of the card
#
# Secrets (VLLM_API_KEY, ROUTER_ADMIN_KEY, UI_AUTH) come from the environment and reach each service
# through its environment only, never a command line (scripts/lifecycle.sh, with_env). Arguments after
# a bare -- go to vLLM as they are, checked by vLLM's own parser first: an API key or --ssl-* there is
# refused (exit 2), whatever the spelling.
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
export DATA_PARALLEL_SIZE="${DATA_PARALLEL_SIZE:-auto}"
ROUTER="${ROUTER:-off}"
JOIN="${JOIN:-}"
OCR_API_PORT="${OCR_API_PORT:-8090}"
on_or_off() {  # on_or_off NAME VALUE: on or off, or refuse before anything starts
  case "$2" in
    on|1|true|yes) echo on ;;
    off|0|false|no) echo off ;;
    *) echo "[start] ERROR: $1 must be on or off (1/0, true/false, yes/no), not '$2'; nothing was started" >&2
       return 2 ;;
  esac
}
# This script's own numbers (bash computes PORT+1; the waits go to processes.py), refused before anything starts.
if ! problems=$(check_numbers PORT=port_number UI_PORT=port_number OCR_API_PORT=port_number SERVER_PORT=port_number \
                ROUTER_METRICS_PORT=port_number STARTUP_TIMEOUT=positive_number UI_TIMEOUT=positive_number 2>&1); then
  echo "[start] ERROR: ${problems//$'\n'/; }; nothing was started" >&2
  exit 2
fi
UI=$(on_or_off UI "${UI:-on}") || exit 2
OCR_API=$(on_or_off OCR_API "${OCR_API:-on}") || exit 2
# Paths made absolute: the services keep them whatever their working folder.
for variable in TLS_CERT TLS_KEY TLS_CA; do
  [[ -n "${!variable:-}" ]] && declare "$variable=$(realpath -m -- "${!variable}")"
done
export TLS_CERT="${TLS_CERT:-}" TLS_KEY="${TLS_KEY:-}" TLS_CA="${TLS_CA:-}"
scheme=$(PYTHONPATH="$ROOT" python3 -m ocr_bundle.tls scheme)  # the one decision of "TLS is on" (ocr_bundle/tls.py)

say() { echo "[start] $*"; }
die() { echo "[start] ERROR: $*" >&2; exit 1; }

# ---- role: one machine (single), the head of several (gateway in front), or a machine joining a head
refuse() { echo "[start] ERROR: $*" >&2; exit 2; }  # a setting that cannot work: nothing was started
if [[ -n "${NODE_RANK:-}${HEAD_ADDRESS:-}" || "${NODES:-1}" != 1 ]]; then
  refuse "NODES/NODE_RANK/HEAD_ADDRESS (headless data-parallel nodes) are gone: each machine now runs its own server \
behind the head's gateway. Head: ROUTER=on ./start_optimized.sh; every other machine: \
JOIN=https://HEAD_ADDRESS:PORT HOST=0.0.0.0 VLLM_API_KEY=... ROUTER_ADMIN_KEY=... TLS_CERT=... ./start_optimized.sh (docs/cluster.md)"
fi
[[ "$ROUTER" =~ ^(on|only|off)$ ]] || refuse "ROUTER must be on, only or off, not '$ROUTER'"
role=single
[[ "$ROUTER" != off ]] && role=head
if [[ -n "$JOIN" ]]; then
  [[ $role == head ]] && refuse "ROUTER=$ROUTER and JOIN exclude each other: a machine is the head or joins one"
  role=join UI=off OCR_API=off  # a joining machine serves through the head: no page, no document API here
fi
has_server=true; [[ "$ROUTER" == only ]] && has_server=false
# Where this machine's vLLM server listens: on the head, behind the gateway, reachable from here only.
if [[ $role == head ]]; then SERVER_HOST=127.0.0.1 SERVER_PORT="${SERVER_PORT:-$((PORT + 1))}"
else SERVER_HOST=$HOST SERVER_PORT=$PORT; fi

# ---- one start at a time per RUN_DIR (held until this script exits), and refuse to start twice
hold_run_dir start
for service in vllm ui ocr-api gateway membership; do
  if pid=$(service_pid "$service"); then
    die "$service is already running (PID $pid). Stop it first: $(stop_command)"
  fi
done

membership() { PYTHONPATH="$ROOT" python3 -m ocr_bundle.serve.membership "$@"; }

# ---- exposure: beyond loopback, the API needs a key and the page a login (or an explicit opt-out), and
# both HTTPS (or ALLOW_PLAINTEXT=1); the gateway's pool needs its own admin key. Keys and login are read
# from the environment, never argv. The certificate must name every address this script and the gateway use.
exposure_args=(--role "$role" --api-host "$HOST")
if [[ $role == join ]]; then
  exposure_args+=(--join "$JOIN")
  # The address the gateway will reach this server at (its certificate must name it).
  if server_url=$(membership advertise --bind "$HOST" --port "$PORT" --gateway "${JOIN%/}" 2>/dev/null); then
    exposure_args+=(--tls-name "$(PYTHONPATH="$ROOT" python3 -c 'import sys, urllib.parse as u; print(u.urlsplit(sys.argv[1]).hostname)' "$server_url")")
  fi
fi
[[ $UI != off ]] && exposure_args+=(--page-host "$UI_HOST")
PYTHONPATH="$ROOT" python3 -m ocr_bundle.exposure "${exposure_args[@]}" || exit 2
if [[ $role == join ]]; then
  # Before vLLM spends minutes starting: is JOIN a gateway that takes both keys, and can it reach us?
  PYTHONPATH="$ROOT" python3 -m ocr_bundle.serve.membership preflight --gateway "${JOIN%/}" --bind "$HOST" \
    --port "$PORT" | sed 's/^/[start] /' || {
    case ${PIPESTATUS[0]} in
      3) say "the gateway at $JOIN does not answer yet: this server joins it as soon as it does" ;;
      *) exit 2 ;;
    esac; }
fi

# Address the readiness checks (and the page) use to reach a service bound to $1, and one a person can open.
local_address() { PYTHONPATH="$ROOT" python3 -m ocr_bundle.exposure local-address "$1"; }
public_address() { PYTHONPATH="$ROOT" python3 -m ocr_bundle.exposure public-address "$1"; }
port_in_use() { (exec 3<>"/dev/tcp/$(local_address "$1")/$2") 2>/dev/null; }

checks=()
if [[ $role == head ]]; then
  ROUTER_METRICS_PORT="${ROUTER_METRICS_PORT:-$(PYTHONPATH="$ROOT" python3 -c 'from ocr_bundle.settings import ROUTER_METRICS_PORT; print(ROUTER_METRICS_PORT)')}"
  export ROUTER_METRICS_PORT
  checks+=("$HOST:$PORT:gateway:PORT" "127.0.0.1:$ROUTER_METRICS_PORT:gateway metrics:ROUTER_METRICS_PORT")
fi
[[ $has_server == true ]] && checks+=("$SERVER_HOST:$SERVER_PORT:vLLM:$([[ $role == head ]] && echo SERVER_PORT || echo PORT)")
[[ $UI == off ]] || checks+=("$UI_HOST:$UI_PORT:page:UI_PORT")
[[ $OCR_API == off ]] || checks+=("$HOST:$OCR_API_PORT:document API:OCR_API_PORT")
# Two of this script's own services given one port (OCR_API_PORT=8001 beside a head's server on PORT+1)
# would only collide once both start: refused now, before anything starts.
for check in "${checks[@]}"; do
  IFS=: read -r h p what variable <<<"$check"
  for other in "${checks[@]}"; do
    IFS=: read -r h2 p2 what2 variable2 <<<"$other"
    [[ $variable2 != "$variable" && $p2 == "$p" ]] || continue
    [[ $h == "$h2" || $h == 0.0.0.0 || $h2 == 0.0.0.0 || $h == :: || $h2 == :: ]] || continue
    refuse "port $p is set for both $what ($variable) and $what2 ($variable2): give one of them another port"
  done
done
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
if [[ $role == head ]] && ! "$PYTHON" -c "import smg" >/dev/null 2>&1; then
  die "smg (the gateway) is not installed for $PYTHON: pip install -r requirements.txt (it pins smg)"
fi
if [[ $has_server == false ]]; then
  :  # ROUTER=only: no model here
elif [[ -z "$MODEL" ]]; then
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
if [[ -n "$MODEL" && -f "$MODEL/random_weights.json" ]]; then
  say "$MODEL has random weights: it answers with random text."
  say "Real OCR needs the real weights (MODEL=lightonai/LightOnOCR-2-1B or a local copy), best on a GPU."
fi

# ---- arguments after a bare --: what vLLM's own parser makes of them, before anything starts
for argument in "$@"; do
  if [[ $argument == -- && $has_server == true ]]; then
    if ! said=$("$PYTHON" "$ROOT/start_vllm_server.py" --model "$MODEL" --host "$SERVER_HOST" --port "$SERVER_PORT" \
                  --dry-run "$@" 2>&1 >/dev/null); then
      reason=$(grep -m1 '^error:' <<<"$said" | cut -c8-)
      refuse "${reason:-$(tail -n 3 <<<"$said")}"
    fi
    break
  fi
done

# ---- on any failure from here: show why, stop what was started, exit non-zero
started=()
waiting=""  # the check this script waits for (in the background, so that a stop's TERM is handled at once)
# A stop during this start sends TERM: exit, and the EXIT trap stops what was started.
trap 'echo "[start] cancelled (a stop, or Ctrl-C): stopping what was started" >&2; exit 143' TERM
trap 'exit 130' INT
on_exit() {
  local rc=$?
  [[ -n $waiting ]] && kill "$waiting" 2>/dev/null
  if (( rc != 0 )); then
    for name in "${started[@]}"; do
      echo "---- last lines of $RUN_DIR/$name.log ----" >&2
      tail -n 40 "$RUN_DIR/$name.log" >&2 || true
    done
    for name in ui ocr-api membership vllm gateway; do
      if [[ " ${started[*]} " == *" $name "* ]]; then
        stop_service "$name" >&2 || true
      fi
    done
    echo "[start] failed; nothing left running." >&2
  fi
}
trap on_exit EXIT

# interruptible COMMAND...: run it in the background and wait for it: bash runs a trap (a stop's TERM) only
# once a foreground command ends, but interrupts `wait` at once.
interruptible() {
  "$@" &
  waiting=$!
  local rc=0
  wait "$waiting" || rc=$?
  waiting=""
  return $rc
}

# wait_ready NAME URL SECONDS [CODES]: until URL answers (default 200), while the service lives.
wait_ready() {
  interruptible processes wait-ready "$2" --pid-file "$(pid_file "$1")" --timeout "$3" --accept "${4:-200}" \
    --name "$1" >/dev/null || die "$1 is not ready (see above)"
}

launch() {  # launch NAME COMMAND...: own process group, log, PID file with start time; not the RUN_DIR lock
  local name=$1; shift
  setsid "$@" >"$RUN_DIR/$name.log" 2>&1 </dev/null 9>&- &
  started+=("$name")
  processes record "$(pid_file "$name")" $! || die "$name exited at once"
}

# The launcher, the gateway, the membership keeper and the page read the client key from the environment;
# only the gateway and the keeper get the admin key, only the page its login (with_env: never an argv).
export VLLM_API_KEY
ADMIN_KEY="${ROUTER_ADMIN_KEY:-}" PAGE_AUTH="$UI_AUTH"
unset ROUTER_ADMIN_KEY UI_AUTH
with_admin_key() { with_env ROUTER_ADMIN_KEY="$ADMIN_KEY" -- "$@"; }
api_local="$scheme://$(local_address "$HOST"):$PORT"   # what the page and the readiness checks use
if [[ $role == head ]]; then
  say "starting the gateway (SMG) on $HOST:$PORT; log: $RUN_DIR/gateway.log"
  with_admin_key with_env PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" -- \
    launch gateway "$PYTHON" -m ocr_bundle.serve.gateway --host "$HOST" --port "$PORT"
  wait_ready gateway "$api_local/liveness" 120
  say "gateway is ready (PID $(service_pid gateway)); servers join it as they become ready"
fi
if [[ $has_server == true ]]; then
  server_local="$scheme://$(local_address "$SERVER_HOST"):$SERVER_PORT"
  say "starting vLLM ($MODEL) on $SERVER_HOST:$SERVER_PORT; log: $RUN_DIR/vllm.log"
  launch vllm "$PYTHON" "$ROOT/start_vllm_server.py" --model "$MODEL" --host "$SERVER_HOST" --port "$SERVER_PORT" \
    $([[ $role == head ]] && echo --behind-gateway) "$@"
  wait_ready vllm "$server_local/health" "$STARTUP_TIMEOUT"
  # /health answers before the engines have read a page; a first page pays one-time costs (on a
  # GPU, compiling the vision encoder: 15-45 s). Pay them now, one page per engine, before any
  # client (or the gateway) sends work here.
  say "warming up: one page per engine$([[ $has_gpu == true ]] && echo ' (on a GPU this compiles the vision encoder)')"
  warm_up() {
    PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m ocr_bundle.serve.warmup --url "$server_local" \
      --timeout "$STARTUP_TIMEOUT" | sed 's/^/[start] /'
  }
  interruptible warm_up || die "vLLM answers /health but cannot read a page (see above)"
  say "vLLM is ready (PID $(service_pid vllm)); $(grep -m1 -oE 'serving on [0-9]+ GPUs?: [a-z ]+[0-9]*' "$RUN_DIR/vllm.log" || echo 'one engine')"
  # The launcher's own line: which model family, with its context and sampling (ocr_bundle/families.py).
  say "$(grep -m1 -oE 'model family: .*' "$RUN_DIR/vllm.log" || echo 'model family: unknown')"
fi

if [[ $role != single && $has_server == true ]]; then
  if [[ $role == head ]]; then gateway_url=$api_local; server_url=$server_local
  else gateway_url=${JOIN%/}; server_url=$(membership advertise --bind "$HOST" --port "$PORT" --gateway "$gateway_url"); fi
  joined=true
  with_admin_key membership join --gateway "$gateway_url" --server "$server_url" | sed 's/^/[start] /' || {
    case ${PIPESTATUS[0]} in
      3) joined=false; say "the gateway at $gateway_url has not added this server yet: the keeper goes on trying" ;;
      *) die "the gateway at $gateway_url refused this server (see above)" ;;
    esac; }
  # Stays joined (a restarted head gets it back), leaves on ./stop_optimized.sh.
  with_admin_key with_env PYTHONPATH="$ROOT" -- launch membership python3 -m ocr_bundle.serve.membership keep \
    --gateway "$gateway_url" --server "$server_url" --pid-file "$(pid_file vllm)"
fi

if [[ $role == join ]]; then
  cat <<MSG

  This machine's server: $server_url, $([[ $joined == true ]] && echo "joined" || echo "joining") the gateway at $gateway_url
  Clients and the page use the head's endpoint: $gateway_url/v1
  Logs:      $RUN_DIR/vllm.log, $RUN_DIR/membership.log
  Stop:      $(stop_command)   (leaves the gateway first; no request fails)
MSG
  exit 0
fi

ocr_api_line="off (OCR_API=off)" ocr_api_local=""
if [[ $OCR_API != off ]]; then
  # On HOST, beside the API: the same key and TLS, and the same exposure rules (checked above for HOST).
  say "starting the document API (POST /v1/ocr) on $HOST:$OCR_API_PORT; log: $RUN_DIR/ocr-api.log"
  with_env VLLM_URL="$api_local" VLLM_CA_CERT="$TLS_CA" OCR_API_HOST="$HOST" OCR_API_PORT="$OCR_API_PORT" \
    PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" -- launch ocr-api "$PYTHON" -m ocr_bundle.api
  ocr_api_local="$scheme://$(local_address "$HOST"):$OCR_API_PORT"
  wait_ready ocr-api "$ocr_api_local/health" "$UI_TIMEOUT"
  say "document API is ready (PID $(service_pid ocr-api))"
  ocr_api_line="$scheme://$(public_address "$HOST"):$OCR_API_PORT/v1/ocr   (Mistral-OCR-compatible; same key)"
fi

page_line="off (UI=off)"
if [[ $UI != off ]]; then
  say "starting the page on $UI_HOST:$UI_PORT; log: $RUN_DIR/ui.log"
  with_env VLLM_URL="$api_local" VLLM_CA_CERT="$TLS_CA" UI_HOST="$UI_HOST" UI_PORT="$UI_PORT" UI_AUTH="$PAGE_AUTH" \
    OCR_API_URL="$ocr_api_local" -- launch ui "$PYTHON" "$ROOT/app_vllm.py"
  # Gradio serves /config once the app is up (also behind a login: then it answers 401, still "up").
  wait_ready ui "$scheme://$(local_address "$UI_HOST"):$UI_PORT/config" "$UI_TIMEOUT" 200,401
  say "page is ready (PID $(service_pid ui))"
  page_line="$scheme://$(public_address "$UI_HOST"):$UI_PORT"
fi

api="$scheme://$(public_address "$HOST"):$PORT"
# The name requests must use: the hub id on a GPU box, the folder name for a local checkpoint.
served_model=$(python3 - "$api_local/v1/models" <<'PY' 2>/dev/null || echo "MODEL-NAME"
import json, os, ssl, sys, urllib.request
key = os.environ.get("VLLM_API_KEY")
request = urllib.request.Request(sys.argv[1], headers={"Authorization": f"Bearer {key}"} if key else {})
context = ssl.create_default_context(cafile=os.environ["TLS_CA"]) if os.environ.get("TLS_CA") else None
print(json.load(urllib.request.urlopen(request, timeout=10, context=context))["data"][0]["id"])
PY
)
# The served family's sampling in the curl line (the launcher's "model family:" line), generation 2's otherwise.
family_line=$(grep -m1 -oE 'model family: .*' "$RUN_DIR/vllm.log" 2>/dev/null || true)
temperature=$(sed -nE 's/.*sampling temperature ([0-9.]+) top_p ([0-9.]+).*/\1/p' <<<"$family_line")
top_p=$(sed -nE 's/.*sampling temperature ([0-9.]+) top_p ([0-9.]+).*/\2/p' <<<"$family_line")
grounding_hint=""
[[ $family_line == *"grounding (layout blocks)"* ]] && grounding_hint="
    (layout blocks with boxes: add {\"type\": \"text\", \"text\": \"grounding\"} after the image_url part)"
key_header=""; [[ -n "$VLLM_API_KEY" ]] && key_header=' -H "Authorization: Bearer $VLLM_API_KEY"'
ca_flag="" curl_ca="" join_tls=""
if [[ -n "$TLS_CERT" ]]; then
  ca_flag=" --ca-cert $TLS_CA" curl_ca=" --cacert $TLS_CA"
  join_tls=" TLS_CERT=<its cert.pem> TLS_KEY=<its key.pem> TLS_CA=<ca.pem>"
fi
logs="$RUN_DIR/vllm.log, $RUN_DIR/ocr-api.log, $RUN_DIR/ui.log"
head_lines=""
if [[ $role == head ]]; then
  logs="$RUN_DIR/gateway.log, $([[ $has_server == false ]] || echo "$RUN_DIR/vllm.log, $RUN_DIR/membership.log, ")$RUN_DIR/ocr-api.log, $RUN_DIR/ui.log"
  head_lines="
  Gateway:   the endpoint above is SMG (it checks the key); servers now: $(with_admin_key membership members --gateway "$api_local" 2>/dev/null || echo '?')
  Join:      on another machine: JOIN=$api HOST=0.0.0.0 VLLM_API_KEY=<this key> ROUTER_ADMIN_KEY=<the admin key>$join_tls ./start_optimized.sh"
fi
cat <<MSG

  Page:      $page_line
  vLLM API:  $api/v1   (model "$served_model"; try: curl$curl_ca$key_header $api/v1/models)$head_lines
  Documents: $ocr_api_line
  Logs:      $logs
  Stop:      $(stop_command)

  Clients, with the Python that has what they need$([[ -n "$VLLM_API_KEY" ]] && echo ' (export VLLM_API_KEY first)'):
    $PYTHON $ROOT/stress_test.py --url $api$ca_flag$([[ $has_gpu == true ]] || echo ' --max-tokens 64')
    $PYTHON $ROOT/batch_ocr.py scans/ --url $api$ca_flag$([[ $has_gpu == true ]] || echo ' --max-tokens 64 --max-attempts 1')

  Read a page through the API (paste into a shell):
    IMG=\$(base64 -w0 '$ROOT/samples/table_screenshot.png')
    curl -s$curl_ca $api/v1/chat/completions -H 'Content-Type: application/json'$key_header -d '{"model": "$served_model", "max_tokens": 1024, "temperature": ${temperature:-0.2}, "top_p": ${top_p:-0.9}, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,'"\$IMG"'"}}]}]}'$grounding_hint
MSG
