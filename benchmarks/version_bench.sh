#!/usr/bin/env bash
# One vLLM version against another on the lent GPU machine, through the README's path: start_optimized.sh
# (its warm-up page included in the time to ready), the stress test on the A4 page with 1,000 tokens
# forced, stop_optimized.sh. One round per call; rounds run one after the other on one machine.
#   bash benchmarks/version_bench.sh bf16 NAME SITE [start_optimized args]  # c=256, then a lone page sampled and greedy
#   bash benchmarks/version_bench.sh fp8 NAME SITE [start_optimized args]   # KV_CACHE_DTYPE=fp8, c=512
# LONE=0 skips the lone-page runs of a bf16 round (a repeat round, where only saturation is compared).
# SUSTAINED=1 adds a longer run at the same concurrency with its first sends spread over about one page's
# latency (stress_test.py --ramp): its sustained pages/s is the rate with every slot busy, without the waves and
# the drain of the 1.5-wave run the figures have always come from (benchmarks/waves.py). ~2 minutes more.
# BURST=0 (with SUSTAINED=1) leaves out that 1.5-wave run: a round compared with others by its sustained rate.
# FLASHINFER=1 makes FlashInfer importable from /root/site-flashinfer (benchmarks/stage_flashinfer.sh:
# the version vLLM 0.26.0 pins), with its just-in-time builds' ninja and nvcc: the launcher then picks
# it for an fp8 KV cache on Hopper, as on a box where `pip install -r requirements.txt` brought it. A set
# that carries its own FlashInfer (0.34.0's) needs no FLASHINFER=1 (gpu_platform.sh's serve_env).
# QUALITY=1 replaces the speed runs with the issue's quality gate for a version: the trained reader
# (tests/fixtures/lightonocr-reader, carried with the tree) served by this version with the launcher's profile for
# KIND, and quality_check.py on scripts/make_bench.py's mini-bench (24 one-line PDFs, made once in $STATE), scored
# by olmOCR-Bench's scorer from /root/site-quality (benchmarks/stage_quality.sh). QUALITY_COMPARE=NAME compares
# with an earlier round's run (its verdict per category; the round fails when this one reads worse).
# QUALITY_TEMPERATURE (default 0: greedy, so two versions are compared on the same pages' most likely reading).
# DOORS=1 serves with an API key (exported here, never on a command line) and, after the round's runs, knocks on
# every route the server listed at start (benchmarks/doors.py --verdict): the round fails when one breaks the
# bundle's key rule. How a version goes into route_keys.VERIFIED on the GPU.
# SITE: the vLLM install (/root/site: 0.26.0; /root/site-0.32.0 ...: benchmarks/stage_vllm.sh, gpu_bench.sh setup).
# Each round leaves NAME-start.txt (time to ready, the launcher's choices), NAME-*/ reports (pages/s,
# latency, GPU memory) and NAME-engine.txt (vLLM's throughput lines) in $OUT.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
STATE=${STATE:-/root/bench}
OUT=${OUT:-$STATE/out}
kind=${1:?bf16 or fp8}; name=${2:?name}; site=${3:?site}; shift 3
source "$ROOT/benchmarks/gpu_platform.sh"   # serve_env
serve_env "$site"
export VLLM_USE_FLASHINFER_SAMPLER=0 PYTHON=python3 UI=off OCR_API=off RUN_DIR=$STATE/run-$name
export MODEL=${MODEL_DIR:-/root/models/lightonocr-full} STARTUP_TIMEOUT=${STARTUP_TIMEOUT:-600}
[[ ${QUALITY:-0} == 1 ]] && export MODEL=$ROOT/tests/fixtures/lightonocr-reader
[[ $kind == fp8 ]] && export KV_CACHE_DTYPE=fp8
[[ ${DOORS:-0} == 1 ]] && export VLLM_API_KEY=bench-key-$RANDOM$RANDOM
mkdir -p "$OUT" "$STATE/reports"
cd "$ROOT"

stress() {  # stress LABEL ARGS...: the report, with the server's CPU by role per page (server-cpu.json)
  local label=$name-$1; shift
  python3 benchmarks/server_cpu.py around "$RUN_DIR/vllm.pid" "$STATE/reports/$label" -- \
    python3 stress_test.py --images samples/english_a4_document.png --ignore-eos --max-tokens 1000 --no-stream \
    --quiet --out "$STATE/reports/$label" --label "$label" "$@" | grep -E "^concurrency|GPU|cpu_ms_per_page|VLLM" || true
  cp -r "$STATE/reports/$label" "$OUT/"
}

quality() {  # the mini-bench through the reader's server, scored; compared with QUALITY_COMPARE's run if given
  local compare=() status=0
  [[ -f $STATE/mini-bench/lines_text.jsonl ]] || python3 scripts/make_bench.py --out "$STATE/mini-bench"
  [[ -n ${QUALITY_COMPARE:-} ]] && compare=(--compare "$STATE/quality-out/$QUALITY_COMPARE")
  PYTHONPATH=$PYTHONPATH:$QUALITY_SITE python3 quality_check.py "$STATE/mini-bench" --out "$STATE/quality-out" \
    --label "$name" --max-tokens 32 --temperature "${QUALITY_TEMPERATURE:-0}" --quiet "${compare[@]}" \
    >"$OUT/$name-quality.txt" 2>&1 || status=$?
  tail -n 30 "$OUT/$name-quality.txt"
  cp -r "$STATE/quality-out/$name" "$OUT/$name-quality" 2>/dev/null || true
  if [[ ${#compare[@]} -gt 0 && -f $STATE/quality-out/comparison.md ]]; then
    mv "$STATE/quality-out/comparison.md" "$OUT/$name-comparison.md"
    mv "$STATE/quality-out/comparison.json" "$OUT/$name-comparison.json"
  fi
  echo "quality_check.py exit status $status (0 scored and no category worse; 1 worse; 2 not run or not comparable)"
  return "$status"
}

start=$SECONDS
if ! ./start_optimized.sh "$@" >"$OUT/$name-start.txt" 2>&1; then
  tail -n 40 "$OUT/$name-start.txt"; tail -n 60 "$RUN_DIR/vllm.log"; ./stop_optimized.sh || true; exit 1
fi
echo "ready in $((SECONDS - start)) s (start_optimized.sh, warm-up page included)" | tee -a "$OUT/$name-start.txt"
# What the launcher chose and what vLLM then used (attention backends, the patch), from the server's log.
grep -E "^\[start_vllm_server\]|LightOnOCR bundle patch|[Aa]ttention backend|Using .*backend|FlashInfer|XQA" \
  "$RUN_DIR/vllm.log" | cut -c1-300 | awk '!seen[$0]++' | head -n 24 | tee -a "$OUT/$name-start.txt" || true

if [[ ${QUALITY:-0} == 1 ]]; then
  quality_status=0; quality || quality_status=$?
elif [[ $kind == fp8 ]]; then
  if [[ ${BURST:-1} == 1 ]]; then stress c512 --concurrency 512 --requests 768 --warmup 16; fi
  if [[ ${SUSTAINED:-0} == 1 ]]; then stress c512-sustained --concurrency 512 --requests 1536 --ramp 60 --warmup 0; fi
else
  if [[ ${BURST:-1} == 1 ]]; then stress c256 --concurrency 256 --requests 384 --warmup 16; fi
  if [[ ${SUSTAINED:-0} == 1 ]]; then stress c256-sustained --concurrency 256 --requests 1024 --ramp 40 --warmup 0; fi
  if [[ ${LONE:-1} == 1 ]]; then
    stress c1 --concurrency 1 --requests 6 --warmup 1
    stress c1-greedy --concurrency 1 --requests 6 --warmup 1 --temperature 0
  fi
fi
if [[ ${DOORS:-0} == 1 ]]; then
  python3 benchmarks/doors.py "$name" "http://127.0.0.1:${PORT:-8000}" --log "$RUN_DIR/vllm.log" --verdict \
    >"$OUT/$name-doors.txt" 2>&1 || doors_status=$?
  tail -n 1 "$OUT/$name-doors.txt"
fi
# vLLM 0.34 logs each compiled encoder block's cache load (three lines a block): kept out, or they crowd out the rest.
grep -E "throughput|Error|LightOnOCR bundle patch|compile" "$RUN_DIR/vllm.log" \
  | grep -vE "Directly load AOT compilation|reconstructed serializable fn|\[PixtralHFTransformerBlock\] torch\.compile took" \
  | tail -n 60 >"$OUT/$name-engine.txt" || true
./stop_optimized.sh >"$OUT/$name-stop.txt" 2>&1 || tail -n 5 "$OUT/$name-stop.txt"
status=${quality_status:-0}
(( status == 0 )) && status=${doors_status:-0}
exit "$status"
