#!/usr/bin/env bash
# Drive the GPU benchmark on the lent H200, one phase per call (see docs/benchmarks.md).
#   bash benchmarks/gpu_bench.sh setup                      # install staged vLLM(s) + extras, make the full checkpoint
#   bash benchmarks/gpu_bench.sh serve NAME [launcher args] # (re)start vLLM through start_vllm_server.py
#   bash benchmarks/gpu_bench.sh stress NAME [stress args]  # stress_test.py on the A4 sample, 1,000 tokens forced
#   bash benchmarks/gpu_bench.sh encoder [--compile]        # packed vs dense-mask encoder attention (parity, speed)
#   bash benchmarks/gpu_bench.sh sampler                    # vLLM's top-p sampler vs FlashInfer's (builds its kernels)
#   bash benchmarks/gpu_bench.sh hf                         # plain transformers baseline (batch 1)
#   bash benchmarks/gpu_bench.sh batch NAME [batch args]    # batch_ocr.py on a generated 300-page A4 PDF
#   bash benchmarks/gpu_bench.sh corpus NAME [batch args]   # ten 300-page PDFs: one converter, then 3 shards at once
#   bash benchmarks/gpu_bench.sh profile NAME [tokens]       # vLLM's torch profiler over one request
#   bash benchmarks/gpu_bench.sh hostprofile NAME [stress args]  # py-spy on the engine core and API server, c=1
#   bash benchmarks/gpu_bench.sh docapi NAME                # a 300-page PDF through the document API (POST /v1/ocr),
#                                                           # then the stress test with as many pages at its concurrency
#   bash benchmarks/gpu_bench.sh stop
# SERVER_PID_FILE points at a server started otherwise (a server lost under load, through the gateway:
# benchmarks/gateway_bench.sh). Two one-GPU servers side by side (one
# configuration per GPU, started together, measured one after the other):
#   CUDA_VISIBLE_DEVICES=1 PORT=8001 SERVER_PID_FILE=/root/bench/server1.pid bash benchmarks/gpu_bench.sh ...
# `profile` needs a server started with PROFILE_DIR set (serve adds vLLM's --profiler-config).
# FLASHINFER=1 makes FlashInfer importable, from /root/site-flashinfer (staged by
# benchmarks/stage_flashinfer.sh), and serves with its sampler unless FLASHINFER_SAMPLER=0;
# without it FlashInfer is not importable at all. Its attention is then the launcher's choice
# (ocr_bundle/serve/attention.py: auto takes it for --kv-cache-dtype fp8 on Hopper), or asked for:
#   FLASHINFER=1 FLASHINFER_SAMPLER=0 bash benchmarks/gpu_bench.sh serve NAME --attention-backend flashinfer
# (the 2026-11-30 FlashInfer-attention run asked through vLLM's own flag after --, and this script then exported the
# XQA gate, VLLM_HAS_FLASHINFER_CUBIN=1, itself; since the seventh the launcher sets it.)
# serve starts the launcher's defaults: since the 2026-11-30 compiled-encoder run, on an H200 with a bf16 KV cache, the
# compiled encoder and 128-token KV blocks (ocr_bundle/serve/tuning.py). vLLM's own defaults, the
# earlier runs' baseline: serve NAME --compile-encoder off -- --block-size 16
# READY_TIMEOUT (seconds, default 540) bounds serve's wait for /health. hostprofile reads PYSPY
# (default /root/site-tools/bin/py-spy, staged by benchmarks/stage_tools.sh), REQUESTS (8),
# PROFILE_DELAY (6 s after the client starts) and PROFILE_S (10 s of recording).
# State that must outlive one call (server PID, reports) lives in $STATE; results go to $OUT.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
STATE=${STATE:-/root/bench}
MODEL_DIR=${MODEL_DIR:-/root/models/lightonocr-full}
OUT=${OUT:-$STATE/out}
PORT=${PORT:-8000}
SERVER_PID_FILE=${SERVER_PID_FILE:-$STATE/server.pid}
SERVER_LOG_NOTE=$SERVER_PID_FILE.log   # which log belongs to the server of SERVER_PID_FILE
SITE=${SITE:-/root/site}   # which vLLM: /root/site (0.26.0) or /root/site-VERSION (benchmarks/stage_vllm.sh)
source "$ROOT/benchmarks/gpu_platform.sh"   # serve_env, FLASHINFER_SITE
serve_env "$SITE"
if [[ ${FLASHINFER:-0} == 1 ]]; then
  export VLLM_USE_FLASHINFER_SAMPLER=${FLASHINFER_SAMPLER:-1}
else
  export VLLM_USE_FLASHINFER_SAMPLER=0
fi
mkdir -p "$STATE" "$OUT"
cd "$ROOT"

# Process control and readiness: the bundle's one implementation (ocr_bundle/serve/processes.py).
processes() { PYTHONPATH="$ROOT" python3 -m ocr_bundle.serve.processes "$@"; }
stop_server() { processes stop "$SERVER_PID_FILE" --name vllm --grace 30; }
# stress_run NAME ARGS...: stress_test.py on the A4 sample, 1,000 tokens forced, with the server's CPU by role.
stress_run() {
  local name=$1; shift
  python3 benchmarks/server_cpu.py around "$SERVER_PID_FILE" "$STATE/reports/$name" -- \
    python3 stress_test.py --url "http://127.0.0.1:$PORT" --images samples/english_a4_document.png \
    --ignore-eos --max-tokens 1000 --out "$STATE/reports/$name" --label "$name" "$@" || true
  cp -r "$STATE/reports/$name" "$OUT/"
}

case "${1:?phase}" in
  setup)
    [[ -d /root/site/vllm || ! -f /root/gpu/install.sh ]] || bash /root/gpu/install.sh   # ../shared/gpu/prepare.sh
    for staged in /root/gpu-vllm-*/; do   # benchmarks/stage_vllm.sh: the pieces of one tar of wheels
      [[ -d $staged ]] || continue
      version=$(basename "$staged"); version=${version#gpu-vllm-}
      target=/root/site-$version; [[ $version != 0.26.0 ]] || target=/root/site
      [[ -d $target/vllm ]] && continue
      if ! [[ -f $staged/pieces.sha256 ]] || ! (cd "$staged" && sha256sum --check --quiet --status pieces.sha256); then
        echo "vLLM $version: not every staged piece is here and whole yet; not installed"; continue
      fi
      mkdir -p "$staged/wheels"; cat "$staged"/piece.* | tar -C "$staged/wheels" -xf -
      start=$SECONDS
      # One pip call per version: a second --target install would replace the whole nvidia/ folder.
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$target" \
        "$staged"/wheels/*.whl
      echo "vLLM $version into $target in $((SECONDS - start)) s" | tee -a "$OUT/install.txt"
    done
    if compgen -G "/root/gpu/extra/*.whl" >/dev/null; then
      python3 -m pip install -q --no-index --no-deps --no-compile --target /root/site /root/gpu/extra/*.whl
    fi
    if compgen -G "/root/gpu/tools/*.whl" >/dev/null; then   # py-spy (benchmarks/stage_tools.sh)
      python3 -m pip install -q --no-index --no-deps --no-compile --target /root/site-tools /root/gpu/tools/*.whl
    fi
    if compgen -G "/root/gpu/quality/*.whl" >/dev/null; then   # olmOCR-Bench's scorer (benchmarks/stage_quality.sh)
      python3 -m pip install -q --no-index --no-deps --no-compile --target "$QUALITY_SITE" /root/gpu/quality/*.whl
    fi
    if compgen -G "/root/gpu/flashinfer/*.whl" >/dev/null; then
      python3 -m pip install -q --no-index --no-deps --no-compile --target "$FLASHINFER_SITE" /root/gpu/flashinfer/*.whl
    fi
    if [[ ! -f $MODEL_DIR/config.json ]]; then
      start=$SECONDS
      python3 scripts/make_checkpoint.py --preset full --out "$MODEL_DIR" 2>&1 | grep -E "wrote|Error" | tee "$OUT/checkpoint.txt"
      echo "generated in $((SECONDS - start)) s" | tee -a "$OUT/checkpoint.txt"
    fi
    du -sh "$MODEL_DIR" | tee -a "$OUT/checkpoint.txt"
    nvidia-smi | tee "$OUT/nvidia-smi.txt"
    for site in /root/site /root/site-*; do
      [[ -d $site/vllm ]] || continue
      PYTHONPATH=$site python3 -c "import vllm, transformers, torch, pynvml, matplotlib, prometheus_client, tqdm, pypdfium2; import importlib.metadata as md; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__, 'pypdfium2', md.version('pypdfium2'))" | tee -a "$OUT/versions.txt"
    done
    ;;
  serve)
    name=${2:?name}; shift 2
    stop_server
    extra=()
    if [[ -n ${PROFILE_DIR:-} ]]; then
      mkdir -p "$PROFILE_DIR"
      extra=(--profiler-config "{\"profiler\": \"torch\", \"torch_profiler_dir\": \"$PROFILE_DIR\", \"torch_profiler_with_stack\": false}")
      [[ " $* " == *" -- "* ]] || extra=(-- "${extra[@]}")   # vLLM's own flags follow the launcher's --
    fi
    setsid python3 start_vllm_server.py --model "$MODEL_DIR" --served-model-name lightonocr --port "$PORT" "$@" \
      "${extra[@]}" >"$STATE/$name-server.log" 2>&1 </dev/null &
    processes record "$SERVER_PID_FILE" $!
    echo "$STATE/$name-server.log" >"$SERVER_LOG_NOTE"
    if ! processes wait-ready "http://127.0.0.1:$PORT/health" --pid-file "$SERVER_PID_FILE" --timeout "${READY_TIMEOUT:-540}" \
         --name "server $name" | tee "$OUT/$name-ready.txt"; then
      tail -n 60 "$STATE/$name-server.log"; cp "$STATE/$name-server.log" "$OUT/"; stop_server; exit 1
    fi
    grep -E "start_vllm_server|LightOnOCR bundle patch|MMEncoderAttention|Asynchronous scheduling|KV cache|Maximum concurrency|model weights took|graph capturing|torch.compile takes|cudagraph_mode|attention backend|FlashInfer resolved|TRTLLM" \
      "$STATE/$name-server.log" | awk '!seen[$0]++' | tail -n 24 | tee -a "$OUT/$name-ready.txt"
    ;;
  stress)
    name=${2:?name}; shift 2
    stress_run "$name" "$@"
    # vLLM's own throughput log lines (prompt vs generation tokens/s) tell what limited each level;
    # the bundle's lines say what its patch did once pages arrived (a compiled encoder compiles then).
    server_log=$(cat "$SERVER_LOG_NOTE")
    grep -E "throughput|OutOfMemory|Error|LightOnOCR bundle patch" "$server_log" | tail -n 80 >"$OUT/$name-engine.txt" || true
    tail -n 3 "$OUT/$name-engine.txt"
    ;;
  encoder)
    shift
    stop_server
    # ENCODER_TIMEOUT bounds the run (seconds, default 900): torch.compile's first build is long.
    timeout "${ENCODER_TIMEOUT:-900}" python3 benchmarks/encoder_check.py --model "$MODEL_DIR" \
      --out "$OUT/encoder-check.json" "$@" 2>&1 \
      | grep -vE "^\s*$" | tail -n 30
    ;;
  sampler)
    [[ ${FLASHINFER:-0} == 1 ]] || { echo "sampler: run with FLASHINFER=1" >&2; exit 2; }
    python3 benchmarks/sampler_check.py --out "$OUT/sampler-check.json" 2>&1 | grep -vE "^\s*$" | tail -n 30
    ;;
  hf)
    stop_server
    python3 benchmarks/transformers_baseline.py --model "$MODEL_DIR" --image samples/english_a4_document.png \
      --pages "${2:-3}" --max-new-tokens 1000 --out "$OUT/hf-baseline.json"
    ;;
  batch)
    name=${2:?name}; shift 2
    pdf=$STATE/a4-300.pdf
    [[ -f $pdf ]] || python3 scripts/make_pdf.py --pages 300 --out "$pdf"
    rm -rf "$STATE/batch-$name"
    python3 batch_ocr.py "$pdf" --url "http://127.0.0.1:$PORT" --out "$STATE/batch-$name" \
      --max-tokens 1000 --max-attempts 1 --quiet "$@" >"$OUT/batch-$name.txt" 2>&1 || true
    cp "$STATE/batch-$name/run-summary.json" "$OUT/batch-$name-summary.json" || true
    grep -E "pages:|time:|client:" "$OUT/batch-$name.txt"
    ;;
  corpus)
    # A corpus of ten PDFs of CORPUS_PAGES pages (default 300: 3,000 pages) through one server: one
    # converter over all of it, then three converters at once (--shard 1/3, 2/3, 3/3) into one output
    # tree; each side's pages/s is its pages over the wall time from the first start to the last end,
    # and --status must say done.
    name=${2:?name}; shift 2
    each=${CORPUS_PAGES:-300}; total=$((each * 10))
    corpus=$STATE/corpus-$total
    [[ -f $corpus/doc10.pdf ]] || { mkdir -p "$corpus"; python3 scripts/make_pdf.py --pages "$each" --out "$corpus/doc1.pdf"
      for n in 2 3 4 5 6 7 8 9 10; do cp "$corpus/doc1.pdf" "$corpus/doc$n.pdf"; done; }
    rm -rf "$STATE/corpus-$name-one" "$STATE/corpus-$name-shards"
    common=(--url "http://127.0.0.1:$PORT" --max-tokens 1000 --max-attempts 1 --quiet "$@")
    start=$(date +%s.%N)
    python3 batch_ocr.py "$corpus" --out "$STATE/corpus-$name-one" "${common[@]}" >"$OUT/corpus-$name-one.txt" 2>&1 || true
    one_s=$(python3 -c "import sys, time; print(time.time() - float(sys.argv[1]))" "$start")
    start=$(date +%s.%N); pids=()
    for k in 1 2 3; do
      python3 batch_ocr.py "$corpus" --shard "$k/3" --out "$STATE/corpus-$name-shards" "${common[@]}" \
        >"$OUT/corpus-$name-shard$k.txt" 2>&1 & pids+=($!)
    done
    wait "${pids[@]}" || true
    shards_s=$(python3 -c "import sys, time; print(time.time() - float(sys.argv[1]))" "$start")
    python3 batch_ocr.py --status "$STATE/corpus-$name-shards" >"$OUT/corpus-$name-status.txt" 2>&1 \
      && echo "status: complete" || echo "status: NOT complete (exit $?)"
    tail -n 2 "$OUT/corpus-$name-status.txt"
    cp "$STATE/corpus-$name-one/run-summary.json" "$OUT/corpus-$name-one-summary.json" || true
    cp "$STATE"/corpus-"$name"-shards/run-summary.shard-*.json "$OUT/" || true
    python3 -c "
import sys
one_s, shards_s, total = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
print(f'one converter: {total} pages in {one_s:.0f} s = {total / one_s:.2f} pages/s (wall, start to end)')
print(f'three shards at once: {total} pages in {shards_s:.0f} s = {total / shards_s:.2f} pages/s; ratio {one_s / shards_s:.3f}')
" "$one_s" "$shards_s" "$total" | tee "$OUT/corpus-$name.txt"
    ;;
  profile)
    # One request under vLLM's torch profiler: where the time of a lone page goes (GPU kernels
    # against the wall clock). The table is sorted by self CUDA time.
    name=${2:?name}; tokens=${3:-200}
    post() { python3 -c "import sys, urllib.request; urllib.request.urlopen(urllib.request.Request(sys.argv[1], data=b'', method='POST'), timeout=600).read()" "http://127.0.0.1:$PORT/$1"; }
    post start_profile
    python3 stress_test.py --url "http://127.0.0.1:$PORT" --images samples/english_a4_document.png \
      --ignore-eos --max-tokens "$tokens" --concurrency 1 --requests 1 --out "$STATE/reports/$name" \
      --label "$name" --warmup 0 >"$OUT/$name-request.txt" 2>&1 || true
    post stop_profile
    cp "${PROFILE_DIR:?the PROFILE_DIR the server was started with}"/profiler_out_0.txt "$OUT/$name-profile.txt" \
      || ls -la "$PROFILE_DIR"
    grep -E "pages/s|latency|TTFT" "$OUT/$name-request.txt" | head -n 5
    head -n 30 "$OUT/$name-profile.txt" || true
    ;;
  hostprofile)
    # py-spy over lone streamed pages: where the host's time per decode step goes (the 2026-11-30
    # roofline run's torch profile: of each ~2.7 ms step, the GPU kernels take ~1.6 ms). Recordings
    # of one stretch: the engine core's CPU and its wall time (--idle: also where it waits, on
    # the GPU or a queue), the same for a worker process where vLLM runs the model in one (its
    # multiprocessing executor), and the API server's CPU; benchmarks/stack_top.py sums them.
    name=${2:?name}; shift 2
    pyspy=${PYSPY:-/root/site-tools/bin/py-spy}
    engine=$(python3 benchmarks/server_cpu.py pids "$SERVER_PID_FILE" --role VLLM::EngineCore | head -n 1)
    worker=$(python3 benchmarks/server_cpu.py pids "$SERVER_PID_FILE" --role VLLM::Worker | head -n 1) || true
    api=$(cut -d' ' -f1 "$SERVER_PID_FILE")   # the launcher execs vLLM's API server
    stress_run "$name" --concurrency 1 --requests "${REQUESTS:-8}" --warmup 1 "$@" >"$OUT/$name-request.txt" 2>&1 &
    # A fixed offset, not a readiness wait: past the client's start and its warm-up page (~3 s
    # on an H200), into the measured pages (8 x ~2.5 s), which outlast the recording.
    sleep "${PROFILE_DELAY:-6}"
    record() { "$pyspy" record --pid "$1" --rate 500 --duration "${PROFILE_S:-10}" --format raw --threads \
                 --nonblocking --output "$OUT/$name-$2.txt" "${@:3}" >"$OUT/$name-$2.log" 2>&1 || tail -n 5 "$OUT/$name-$2.log"; }
    parts=(engine-wall engine-cpu api-cpu)
    record "$engine" engine-cpu & record "$engine" engine-wall --idle & record "$api" api-cpu &
    if [[ -n $worker ]]; then
      parts+=(worker-wall worker-cpu)
      record "$worker" worker-cpu & record "$worker" worker-wall --idle &
    fi
    wait
    for part in "${parts[@]}"; do
      python3 benchmarks/stack_top.py "$OUT/$name-$part.txt" >"$OUT/$name-$part-top.txt" || true
    done
    grep -E "latency|TTFT" "$OUT/$name-request.txt" | head -n 4
    awk '/^thread MainThread/ {shown = 1} shown' "$OUT/$name-engine-wall-top.txt" | head -n 45   # the busy loop
    ;;
  docapi)
    # The document API (python -m ocr_bundle.api) in front of the running server, as start_optimized.sh runs it:
    # one 300-page A4 PDF through POST /v1/ocr (1,000 tokens a page at most, one attempt; OCR_API_CONCURRENCY
    # pages at once, default 256), with the API's CPU (its render workers included), then stress_test.py
    # with the same pages at the same concurrency, for the ratio.
    name=${2:?name}
    pdf=$STATE/a4-300.pdf
    [[ -f $pdf ]] || python3 scripts/make_pdf.py --pages 300 --out "$pdf"
    concurrency=${OCR_API_CONCURRENCY:-256}
    processes stop "$STATE/api.pid" --name ocr-api --grace 10 || true
    OCR_API_CONCURRENCY=$concurrency OCR_API_MAX_TOKENS=1000 OCR_API_MAX_ATTEMPTS=1 \
      setsid python3 -m ocr_bundle.api --url "http://127.0.0.1:$PORT" --port 8090 --render-workers 4 \
      >"$STATE/$name-api.log" 2>&1 </dev/null &
    processes record "$STATE/api.pid" $!
    processes wait-ready http://127.0.0.1:8090/health --pid-file "$STATE/api.pid" --timeout 120 --name "document API"
    python3 benchmarks/server_cpu.py snapshot "$STATE/api.pid" "$STATE/$name-api-before.json"
    python3 - "$pdf" "$OUT/$name-docapi.json" <<'PY'
import base64, json, sys, time, urllib.request
pdf = open(sys.argv[1], "rb").read()
body = json.dumps({"document": {"type": "document_url",
                                "document_url": "data:application/pdf;base64," + base64.b64encode(pdf).decode()}}).encode()
start = time.perf_counter()
request = urllib.request.Request("http://127.0.0.1:8090/v1/ocr", data=body, headers={"Content-Type": "application/json"})
answer = json.load(urllib.request.urlopen(request, timeout=3600))
wall = time.perf_counter() - start
pages = len(answer["pages"])
result = {"pages": pages, "seconds": round(wall, 2), "pages_per_s": round(pages / wall, 3),
          "flagged": sum(1 for page in answer["pages"] if page.get("flag"))}
json.dump(result, open(sys.argv[2], "w"), indent=1)
print("document API:", result)
PY
    python3 benchmarks/server_cpu.py snapshot "$STATE/api.pid" "$STATE/$name-api-after.json"
    python3 benchmarks/server_cpu.py diff "$STATE/$name-api-before.json" "$STATE/$name-api-after.json" --pages 300 \
      | tee "$OUT/$name-docapi-cpu.json"
    processes stop "$STATE/api.pid" --name ocr-api --grace 10
    stress_run "$name-stress" --concurrency "$concurrency" --requests 300 --warmup 8 --no-stream >/dev/null 2>&1
    python3 - "$OUT/$name-docapi.json" "$OUT/$name-stress/results.json" <<'PY'
import json, sys
api, stress = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
rate = stress["levels"][-1]["pages_per_s"]
print(f"document API {api['pages_per_s']:.2f} pages/s; stress test {rate:.2f} pages/s; ratio {api['pages_per_s'] / rate:.3f}")
PY
    ;;
  stop)
    stop_server
    ;;
  *) echo "unknown phase $1" >&2; exit 2 ;;
esac
