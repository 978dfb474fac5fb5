#!/usr/bin/env bash
# Rounds of benchmarks/version_bench.sh one after the other in the background on the lent GPU machine, so that
# the device time spent sending the next vLLM version's parts (one `run` per part) overlaps the rounds that can
# already run, and no round waits on the caller between two calls.
#   bash benchmarks/rounds.sh start FILE   # returns at once; FILE: one round a line,
#                                          # `[VAR=value ...] VERSION KIND NAME [args]`
#   bash benchmarks/rounds.sh wait [S]     # until the rounds end or S seconds pass (default 560); results into $OUT
# A line such as `FLASHINFER=1 0.26.0 fp8 v026-fp8 --compile-encoder on` runs
# `FLASHINFER=1 version_bench.sh fp8 v026-fp8 /root/site --compile-encoder on`; # starts a comment.
# Before a round of a version not installed yet, it waits (up to STAGE_WAIT s, default 900) until
# gpu_bench.sh setup finds every piece of it there and whole, and installs it. A failed round is logged and
# the next one runs. `wait` leaves rounds.tgz (every round's reports and logs so far) in $OUT each time, so
# a machine lost later loses only the rounds after the last call.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
STATE=${STATE:-/root/bench}
RUNS=$STATE/rounds   # the background run: its own copy of the bundle, log, progress and results

SITES=${SITES:-/root}   # where gpu_bench.sh setup installs: site (0.26.0), site-VERSION (any other)
site_of() { [[ $1 == 0.26.0 ]] && echo "$SITES/site" || echo "$SITES/site-$1"; }
QUALITY_VERDICT='^quality_check.py exit'   # the line version_bench.sh QUALITY=1 ends a round with

run_rounds() {  # in the background, from the copy
  local file=$1 line words vars version kind name site deadline said
  cd "$RUNS/bundle"
  export STARTUP_TIMEOUT=${STARTUP_TIMEOUT:-420}  # a round that cannot start costs minutes, not ten
  OUT=$RUNS/out bash benchmarks/gpu_bench.sh setup >"$RUNS/setup.txt" 2>&1 \
    || echo "setup failed (see setup.txt)" >>"$RUNS/progress"
  while IFS= read -r line || [[ -n $line ]]; do
    line=${line%%#*}; read -r -a words <<<"$line"; (( ${#words[@]} )) || continue
    vars=()
    while [[ ${words[0]} == *=* ]]; do vars+=("${words[0]}"); words=("${words[@]:1}"); done
    version=${words[0]} kind=${words[1]} name=${words[2]}; site=$(site_of "$version")
    deadline=$((SECONDS + ${STAGE_WAIT:-900}))
    while [[ ! -d $site/vllm ]] && (( SECONDS < deadline )); do
      OUT=$RUNS/out bash benchmarks/gpu_bench.sh setup >>"$RUNS/setup.txt" 2>&1 || true
      [[ -d $site/vllm ]] || sleep 10
    done
    if [[ ! -d $site/vllm ]]; then
      echo "$(date +%T) $name: vLLM $version never fully staged; skipped" >>"$RUNS/progress"; continue
    fi
    echo "$(date +%T) $name: started" >>"$RUNS/progress"
    if env "${vars[@]}" OUT="$RUNS/out" bash benchmarks/version_bench.sh "$kind" "$name" "$site" "${words[@]:3}" \
         >"$RUNS/out/$name-round.txt" 2>&1; then
      echo "$(date +%T) $name: done: $(grep -h "^concurrency\|ready in\|^doors:\|$QUALITY_VERDICT" "$RUNS/out/$name-round.txt" | tr '\n' ' ')" \
        >>"$RUNS/progress"
    else
      said=$(grep -h "^doors:\|$QUALITY_VERDICT" "$RUNS/out/$name-round.txt" | paste -sd ' ' || true)  # the verdicts
      echo "$(date +%T) $name: FAILED (see $name-round.txt)${said:+ $said}" >>"$RUNS/progress"
    fi
  done <"$file"
  touch "$RUNS/done"
}

case ${1:?start, wait or run} in
  start)
    file=${2:?rounds file}
    [[ -f $file ]] || { echo "no rounds file $file" >&2; exit 2; }
    rm -rf "$RUNS"; mkdir -p "$RUNS/bundle" "$RUNS/out"
    # A copy of the bundle: each device call re-syncs the working tree under rounds still running.
    tar -C "$ROOT" --exclude=./.gpu -cf - . | tar -C "$RUNS/bundle" -xf -
    cp "$file" "$RUNS/rounds.txt"
    setsid bash "$RUNS/bundle/benchmarks/rounds.sh" run "$RUNS/rounds.txt" >"$RUNS/log" 2>&1 </dev/null &
    echo "rounds started (pid $!): $(grep -cvE '^\s*(#|$)' "$file") round(s) from $file"
    ;;
  run)
    run_rounds "${2:?rounds file}"
    ;;
  wait)
    deadline=$((SECONDS + ${2:-560}))
    while [[ ! -f $RUNS/done ]] && (( SECONDS < deadline )); do sleep 5; done
    [[ -f $RUNS/done ]] && echo "all rounds ended" || echo "rounds still running"
    cat "$RUNS/progress" 2>/dev/null || true
    tail -n 5 "$RUNS/log" 2>/dev/null || true
    tar -czf "${OUT:?}/rounds.tgz" -C "$RUNS" out progress setup.txt log rounds.txt 2>/dev/null || true
    ;;
  *)
    echo "usage: rounds.sh start FILE | wait [SECONDS]" >&2; exit 2
    ;;
esac
