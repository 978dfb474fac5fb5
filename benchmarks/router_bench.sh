#!/usr/bin/env bash
# The router on the lent GPU machine, through the bundle's own start/stop scripts (docs/benchmarks.md).
#   bash benchmarks/router_bench.sh head [MEM]        # ROUTER=on: router on :8000, its server on :8001 (UI off)
#   bash benchmarks/router_bench.sh node [MEM]        # a second server on :8002 joins the head (same GPU: MEM each)
#   bash benchmarks/router_bench.sh overhead          # stress c=256 direct, through the router, direct again (A-B-A)
#   bash benchmarks/router_bench.sh failover          # 300-page batch through the router, then again with the node
#                                                     # SIGKILLed 15 s in; then the node restarted and rejoining
#   bash benchmarks/router_bench.sh stop              # stop_optimized.sh on both
# The servers need a key (a joining server always does): VLLM_API_KEY is set here for every part.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
STATE=${STATE:-/root/bench}
OUT=${OUT:-$STATE/out}
export PYTHONPATH=/root/site VLLM_USE_FLASHINFER_SAMPLER=0 PYTHON=python3 UI=off VLLM_API_KEY=bench-key
export MODEL=${MODEL_DIR:-/root/models/lightonocr-full} STARTUP_TIMEOUT=600
HEAD=(env RUN_DIR="$STATE/run-head" ROUTER=on PORT=8000 SERVER_PORT=8001)
NODE=(env RUN_DIR="$STATE/run-node" JOIN=http://127.0.0.1:8000 PORT=8002)
mkdir -p "$OUT" "$STATE/reports"
cd "$ROOT"

stress() {  # stress NAME URL: the A4 page, 1,000 tokens forced, saturation, with the router's CPU
  local name=$1 url=$2
  python3 benchmarks/server_cpu.py snapshot "$STATE/run-head/router.pid" "$STATE/$name-router-before.json"
  python3 stress_test.py --url "$url" --images samples/english_a4_document.png --ignore-eos --max-tokens 1000 \
    --no-stream --concurrency 256 --requests 384 --warmup 16 --quiet --out "$STATE/reports/$name" --label "$name" \
    | grep -E "^concurrency|behind a router" || true
  python3 benchmarks/server_cpu.py snapshot "$STATE/run-head/router.pid" "$STATE/$name-router-after.json"
  python3 benchmarks/server_cpu.py diff "$STATE/$name-router-before.json" "$STATE/$name-router-after.json" \
    --pages 384 >"$STATE/reports/$name/router-cpu.json" || true
  cp -r "$STATE/reports/$name" "$OUT/"
}

batch() {  # batch NAME: 300 A4 pages through the router
  local name=$1 pdf=$STATE/a4-300.pdf
  [[ -f $pdf ]] || python3 scripts/make_pdf.py --pages 300 --out "$pdf"
  rm -rf "$STATE/batch-$name"
  local start=$SECONDS
  python3 batch_ocr.py "$pdf" --url http://127.0.0.1:8000 --out "$STATE/batch-$name" --max-tokens 1000 \
    --max-attempts 1 --concurrency 256 --quiet >"$OUT/batch-$name.txt" 2>&1; echo "exit $? after $((SECONDS - start)) s"
  grep -E "pages:|time:" "$OUT/batch-$name.txt" || tail -5 "$OUT/batch-$name.txt"
}

router_metric() { curl -s http://127.0.0.1:29000/metrics | grep -E "^vllm_router_(retries_total|cb_state_transitions_total|processed_requests_total)" || true; }

case "${1:?phase}" in
  head)
    GPU_MEMORY_UTILIZATION=${2:-0.9} "${HEAD[@]}" ./start_optimized.sh 2>&1 | tee "$OUT/head-start-${2:-0.9}.txt" | grep -E "ready|ERROR|Router:" ;;
  node)
    start=$SECONDS
    GPU_MEMORY_UTILIZATION=${2:-0.45} "${NODE[@]}" ./start_optimized.sh 2>&1 | tee "$OUT/node-start.txt" | grep -E "ready|ERROR|joined|joining"
    echo "node start to joined: $((SECONDS - start)) s" | tee -a "$OUT/node-start.txt" ;;
  overhead)
    stress direct-a http://127.0.0.1:8001
    stress router http://127.0.0.1:8000
    stress direct-b http://127.0.0.1:8001
    cat "$STATE/reports/router/router-cpu.json" ;;
  failover)
    batch both
    router_metric >"$OUT/router-metrics-before-kill.txt"
    ( sleep 15; pgid=$(cut -d' ' -f1 "$STATE/run-node/vllm.pid"); echo "killing node group $pgid at $(date +%T)";
      kill -KILL -- "-$pgid" ) &
    batch killed
    wait
    router_metric >"$OUT/router-metrics-after-kill.txt"
    sleep 6  # the node's membership keeper notices within one interval (5 s)
    PYTHONPATH="$ROOT" python3 -m ocr_bundle.serve.membership members --router http://127.0.0.1:8000 ;;
  stop)
    "${NODE[@]}" ./stop_optimized.sh || true
    "${HEAD[@]}" ./stop_optimized.sh || true ;;
  *) echo "unknown phase $1" >&2; exit 2 ;;
esac
