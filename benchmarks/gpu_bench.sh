#!/usr/bin/env bash
# Drive the GPU benchmark on the lent H200, one phase per call (see docs/benchmarks.md).
#   bash benchmarks/gpu_bench.sh setup                      # install staged vLLM + extras, make the full checkpoint
#   bash benchmarks/gpu_bench.sh serve NAME [launcher args] # (re)start vLLM through start_vllm_server.py
#   bash benchmarks/gpu_bench.sh stress NAME [stress args]  # stress_test.py on the A4 sample, 1,000 tokens forced
#   bash benchmarks/gpu_bench.sh encoder                    # packed vs dense-mask encoder attention (parity, speed)
#   bash benchmarks/gpu_bench.sh hf                         # plain transformers baseline (batch 1)
#   bash benchmarks/gpu_bench.sh stop
# State that must outlive one call (server PID, reports) lives in $STATE; results go to $OUT.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
STATE=${STATE:-/root/bench}
MODEL_DIR=${MODEL_DIR:-/root/models/lightonocr-full}
OUT=${OUT:-$STATE/out}
PORT=${PORT:-8000}
export PYTHONPATH=/root/site VLLM_USE_FLASHINFER_SAMPLER=0
mkdir -p "$STATE" "$OUT"
cd "$ROOT"

healthy() { python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" 2>/dev/null; }

stop_server() {
  [[ -f $STATE/server.pid ]] || return 0
  local pid; pid=$(<"$STATE/server.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" || true
    for _ in $(seq 150); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  rm -f "$STATE/server.pid"
}

case "${1:?phase}" in
  setup)
    [[ -d /root/site/vllm ]] || bash /root/gpu/install.sh
    python3 -m pip install -q --no-index --no-deps --no-compile --target /root/site /root/gpu/extra/*.whl
    if [[ ! -f $MODEL_DIR/config.json ]]; then
      start=$SECONDS
      python3 scripts/make_checkpoint.py --preset full --out "$MODEL_DIR" 2>&1 | grep -E "wrote|Error" | tee "$OUT/checkpoint.txt"
      echo "generated in $((SECONDS - start)) s" | tee -a "$OUT/checkpoint.txt"
    fi
    du -sh "$MODEL_DIR" | tee -a "$OUT/checkpoint.txt"
    nvidia-smi | tee "$OUT/nvidia-smi.txt"
    python3 -c "import vllm, transformers, torch, pynvml, matplotlib; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)" | tee "$OUT/versions.txt"
    ;;
  serve)
    name=${2:?name}; shift 2
    stop_server
    setsid python3 start_vllm_server.py --model "$MODEL_DIR" --served-model-name lightonocr --port "$PORT" "$@" \
      >"$STATE/$name-server.log" 2>&1 </dev/null &
    echo $! >"$STATE/server.pid"
    start=$SECONDS
    until healthy; do
      if ! kill -0 "$(<"$STATE/server.pid")" 2>/dev/null; then
        tail -n 60 "$STATE/$name-server.log"; cp "$STATE/$name-server.log" "$OUT/"; exit 1
      fi
      (( SECONDS - start < 540 )) || { tail -n 30 "$STATE/$name-server.log"; exit 1; }
      sleep 1
    done
    echo "server $name ready after $((SECONDS - start)) s" | tee "$OUT/$name-ready.txt"
    grep -E "start_vllm_server|LightOnOCR bundle patch|MMEncoderAttention|Asynchronous scheduling|KV cache|Maximum concurrency|model weights took|graph capturing|torch.compile takes|cudagraph_mode" \
      "$STATE/$name-server.log" | awk '!seen[$0]++' | tail -n 24 | tee -a "$OUT/$name-ready.txt"
    ;;
  stress)
    name=${2:?name}; shift 2
    python3 stress_test.py --url "http://127.0.0.1:$PORT" --images samples/english_a4_document.png \
      --ignore-eos --max-tokens 1000 --out "$STATE/reports/$name" --label "$name" "$@" || true
    cp -r "$STATE/reports/$name" "$OUT/"
    # vLLM's own throughput log lines (prompt vs generation tokens/s) tell what limited each level.
    server_log=$(ls -t "$STATE"/*-server.log | head -n 1)
    grep -E "throughput|OutOfMemory|Error" "$server_log" | tail -n 80 >"$OUT/$name-engine.txt" || true
    tail -n 3 "$OUT/$name-engine.txt"
    ;;
  encoder)
    stop_server
    python3 benchmarks/encoder_check.py --model "$MODEL_DIR" --out "$OUT/encoder-check.json" 2>&1 \
      | grep -vE "^\s*$" | tail -n 30
    ;;
  hf)
    stop_server
    python3 benchmarks/transformers_baseline.py --model "$MODEL_DIR" --image samples/english_a4_document.png \
      --pages "${2:-3}" --max-new-tokens 1000 --out "$OUT/hf-baseline.json"
    ;;
  stop)
    stop_server
    ;;
  *) echo "unknown phase $1" >&2; exit 2 ;;
esac
