#!/usr/bin/env bash
# The gateway (SMG) on the lent GPU machine, through the bundle's own start/stop scripts (docs/benchmarks.md).
#   bash benchmarks/gateway_bench.sh head [MEM]       # ROUTER=on: gateway on :8000, its server on :8001 (UI off)
#   bash benchmarks/gateway_bench.sh node [MEM]       # a second server on :8002 joins the head (same GPU: MEM each)
#   bash benchmarks/gateway_bench.sh doors            # every route of both servers and the gateway, without a key
#                                                     # and with each key: the door table
#   bash benchmarks/gateway_bench.sh overhead         # stress c=256 direct, through the gateway, direct again (A-B-A)
#   bash benchmarks/gateway_bench.sh failover [S]     # 600-page batch through the gateway with the head's own server
#                                                     # SIGKILLed S s in (default 25)
#   bash benchmarks/gateway_bench.sh stop             # stop_optimized.sh on both
#   bash benchmarks/gateway_bench.sh tls-heads [MEM]  # two heads on one GPU, MEM each, started one after the other:
#                                                     # plain (gateway :8000, server :8001) and TLS (gateway :8100,
#                                                     # server :8101 requiring the gateway's client certificate),
#                                                     # certificates from scripts/make_certs.py
#   bash benchmarks/gateway_bench.sh tls-overhead     # stress c=256 through each gateway: plain, TLS, plain, TLS
#   bash benchmarks/gateway_bench.sh tls-stop         # stop_optimized.sh on both heads
# The keys are set here for every part (never on a command line: exported).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
STATE=${STATE:-/root/bench}
OUT=${OUT:-$STATE/out}
export PYTHONPATH=/root/site VLLM_USE_FLASHINFER_SAMPLER=0 PYTHON=python3 UI=off VLLM_API_KEY=bench-key \
  ROUTER_ADMIN_KEY=bench-admin-key
export MODEL=${MODEL_DIR:-/root/models/lightonocr-full} STARTUP_TIMEOUT=600
HEAD=(env RUN_DIR="$STATE/run-head" ROUTER=on PORT=8000 SERVER_PORT=8001)
NODE=(env RUN_DIR="$STATE/run-node" JOIN=http://127.0.0.1:8000 PORT=8002)
CERTS=$STATE/certs/bench
TLS_HEAD=(env RUN_DIR="$STATE/run-tls" ROUTER=on PORT=8100 SERVER_PORT=8101 ROUTER_METRICS_PORT=29100
          TLS_CERT="$CERTS/cert.pem" TLS_KEY="$CERTS/key.pem" TLS_CA="$CERTS/ca.pem")
mkdir -p "$OUT" "$STATE/reports"
cd "$ROOT"

stress() {  # stress NAME URL [RUN_DIR [stress args]]: the A4 page, 1,000 tokens forced, saturation, with the CPU
  # of that head's gateway and of its server (which also does the TLS of its side)
  local name=$1 url=$2 run=${3:-$STATE/run-head} service; shift $(( $# < 3 ? $# : 3 ))
  for service in gateway vllm; do
    python3 benchmarks/server_cpu.py snapshot "$run/$service.pid" "$STATE/$name-$service-before.json"
  done
  python3 stress_test.py --url "$url" --images samples/english_a4_document.png --ignore-eos --max-tokens 1000 \
    --no-stream --concurrency 256 --requests 384 --warmup 16 --quiet --out "$STATE/reports/$name" --label "$name" \
    "$@" | grep -E "^concurrency|behind a gateway" || true
  for service in gateway vllm; do
    python3 benchmarks/server_cpu.py snapshot "$run/$service.pid" "$STATE/$name-$service-after.json"
    python3 benchmarks/server_cpu.py diff "$STATE/$name-$service-before.json" "$STATE/$name-$service-after.json" \
      --pages 384 >"$STATE/reports/$name/$service-cpu.json" || true
  done
  cp -r "$STATE/reports/$name" "$OUT/"
}

batch() {  # batch NAME: 600 A4 pages through the gateway
  local name=$1 pdf=$STATE/a4-600.pdf
  [[ -f $pdf ]] || python3 scripts/make_pdf.py --pages 600 --out "$pdf"
  rm -rf "$STATE/batch-$name"
  local start=$SECONDS
  python3 batch_ocr.py "$pdf" --url http://127.0.0.1:8000 --out "$STATE/batch-$name" --max-tokens 1000 \
    --max-attempts 1 --concurrency 256 --quiet >"$OUT/batch-$name.txt" 2>&1; echo "exit $? after $((SECONDS - start)) s"
  grep -E "pages:|time:" "$OUT/batch-$name.txt" || tail -5 "$OUT/batch-$name.txt"
}

gateway_metric() { curl -s http://127.0.0.1:29000/metrics | grep -E "^smg_worker_(retries_total|cb_transitions_total|requests_total)" | grep -v " 0$" || true; }

doors() {  # doors PORT_NAME URL [LOG]: every route the server logged at start (else the gateway's main ones),
  # without a key, with a wrong one, the client key, the admin key (keys from the environment, never argv)
  python3 benchmarks/doors.py "$1" "$2" ${3:+--log "$3" --verdict} || true
}

case "${1:?phase}" in
  head)
    GPU_MEMORY_UTILIZATION=${2:-0.9} "${HEAD[@]}" ./start_optimized.sh 2>&1 | tee "$OUT/head-start-${2:-0.9}.txt" | grep -E "ready|ERROR|Gateway:" ;;
  node)
    start=$SECONDS
    GPU_MEMORY_UTILIZATION=${2:-0.45} "${NODE[@]}" ./start_optimized.sh 2>&1 | tee "$OUT/node-start.txt" | grep -E "ready|ERROR|joined|joining"
    echo "node start to joined: $((SECONDS - start)) s" | tee -a "$OUT/node-start.txt" ;;
  doors)
    { echo "port method path | no key, wrong key, client key, admin key"
      doors head-server http://127.0.0.1:8001 "$STATE/run-head/vllm.log"
      doors node-server http://127.0.0.1:8002 "$STATE/run-node/vllm.log"
      doors gateway http://127.0.0.1:8000 ""; } | tee "$OUT/doors.txt" ;;
  overhead)
    stress direct-a http://127.0.0.1:8001
    stress gateway http://127.0.0.1:8000
    stress direct-b http://127.0.0.1:8001
    cat "$STATE/reports/gateway/gateway-cpu.json" ;;
  failover)
    gateway_metric >"$OUT/gateway-metrics-before-kill.txt"
    ( sleep "${2:-25}"; pgid=$(cut -d' ' -f1 "$STATE/run-head/vllm.pid"); echo "killing the head's server group $pgid at $(date +%T)";
      kill -KILL -- "-$pgid" ) &
    batch killed
    wait
    gateway_metric >"$OUT/gateway-metrics-after-kill.txt"
    cat "$OUT/gateway-metrics-after-kill.txt"
    sleep 6  # the membership keeper notices within one interval (5 s)
    PYTHONPATH="$ROOT" python3 -m ocr_bundle.serve.membership members --gateway http://127.0.0.1:8000 ;;
  stop)
    "${NODE[@]}" ./stop_optimized.sh || true
    "${HEAD[@]}" ./stop_optimized.sh || true ;;
  tls-heads)
    [[ -f $CERTS/cert.pem ]] || python3 scripts/make_certs.py --out "$STATE/certs" bench=127.0.0.1 >"$OUT/make-certs.txt"
    GPU_MEMORY_UTILIZATION=${2:-0.42} "${HEAD[@]}" ./start_optimized.sh 2>&1 | tee "$OUT/plain-head-start.txt" \
      | grep -E "ready|ERROR|Gateway:"
    GPU_MEMORY_UTILIZATION=${2:-0.42} "${TLS_HEAD[@]}" ./start_optimized.sh 2>&1 | tee "$OUT/tls-head-start.txt" \
      | grep -E "ready|ERROR|Gateway:" ;;
  tls-overhead)
    tls=("$STATE/run-tls" --ca-cert "$CERTS/ca.pem" --router-metrics http://127.0.0.1:29100/metrics)
    stress gateway-plain-a http://127.0.0.1:8000
    stress gateway-tls-a https://127.0.0.1:8100 "${tls[@]}"
    stress gateway-plain-b http://127.0.0.1:8000
    stress gateway-tls-b https://127.0.0.1:8100 "${tls[@]}"
    python3 - "$STATE/reports" <<'PY' | tee "$OUT/tls-overhead.txt"
import json, sys
for name in ("gateway-plain-a", "gateway-tls-a", "gateway-plain-b", "gateway-tls-b"):
    level = json.load(open(f"{sys.argv[1]}/{name}/results.json"))["levels"][0]
    print(f"{name:16} {level['ok']}/{level['requests']} ok  {level['pages_per_s']:.2f} pages/s  p50 "
          f"{level['latency_p50_s']:.1f} s")
    for service in ("gateway", "vllm"):
        try:
            print(f"    {service} CPU: {open(f'{sys.argv[1]}/{name}/{service}-cpu.json').read().strip()[:400]}")
        except OSError:
            pass
PY
    ;;
  tls-stop)
    "${TLS_HEAD[@]}" ./stop_optimized.sh || true
    "${HEAD[@]}" ./stop_optimized.sh || true ;;
  *) echo "unknown phase $1" >&2; exit 2 ;;
esac
