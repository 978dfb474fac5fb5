#!/usr/bin/env bash
# Two "nodes" on one host through the bundle's own start/stop scripts: the head on GPU 0 (API
# server, no page: the GPU image has no Gradio), a headless worker on GPU 1, joined over 127.0.0.1.
#   bash benchmarks/two_nodes.sh start                 # both roles; returns once the head serves with both
#   bash benchmarks/two_nodes.sh stress NAME [args]    # gpu_bench.sh stress against the head
#   bash benchmarks/two_nodes.sh kill-worker NAME [args]  # the worker dies mid-run: what head and clients see
#   bash benchmarks/two_nodes.sh stop                  # stop_optimized.sh on both
# The documented way back after a node dies: stop both, start both (the timing is in $OUT/restart.txt).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
STATE=${STATE:-/root/bench}
OUT=${OUT:-$STATE/out}
export PYTHONPATH=/root/site VLLM_USE_FLASHINFER_SAMPLER=0 PYTHON=python3 UI=off
export MODEL=${MODEL_DIR:-/root/models/lightonocr-full} NODES=2 HEAD_ADDRESS=127.0.0.1
HEAD=(env RUN_DIR="$STATE/run-head" CUDA_VISIBLE_DEVICES=0 NODE_RANK=0)
WORKER=(env RUN_DIR="$STATE/run-worker" CUDA_VISIBLE_DEVICES=1 NODE_RANK=1)
mkdir -p "$OUT"
cd "$ROOT"

start_both() {
  "${WORKER[@]}" ./start_optimized.sh --served-model-name lightonocr >"$OUT/worker-start.txt" 2>&1 &
  local worker=$!
  "${HEAD[@]}" ./start_optimized.sh --served-model-name lightonocr 2>&1 | tee "$OUT/head-start.txt"
  wait "$worker" || { cat "$OUT/worker-start.txt"; return 1; }
  cat "$OUT/worker-start.txt"
}

case "${1:?phase}" in
  start)
    start=$SECONDS
    start_both
    echo "both nodes serving after $((SECONDS - start)) s" | tee -a "$OUT/head-start.txt"
    ;;
  stress)
    SERVER_PID_FILE="$STATE/run-head/vllm.pid" bash benchmarks/gpu_bench.sh stress "${@:2}"
    ;;
  kill-worker)
    SERVER_PID_FILE="$STATE/run-head/vllm.pid" WORKER_PID_FILE="$STATE/run-worker/vllm.pid" \
      bash benchmarks/gpu_bench.sh kill-worker-during "${@:2}"
    "${WORKER[@]}" ./stop_optimized.sh || true
    "${HEAD[@]}" ./stop_optimized.sh || true
    start=$SECONDS
    start_both >/dev/null
    echo "way back (stop both, start both): serving again after $((SECONDS - start)) s" | tee "$OUT/restart.txt"
    ;;
  stop)
    "${HEAD[@]}" ./stop_optimized.sh || true
    "${WORKER[@]}" ./stop_optimized.sh || true
    ;;
  *) echo "unknown phase $1" >&2; exit 2 ;;
esac
