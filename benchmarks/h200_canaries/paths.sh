#!/bin/bash
# The second GPU canary round (issue 20, item 5): the paths the first round never reached, on TRITON_MLA of the
# lent H200, through run.sh. Two roots share the GPU and one engine-start lock:
#   $C (/tmp/h200c)  the matrix as it is: the probe's cached-context prompts reach MLA's context path (a prefill
#                    that continues context from the FP8 cache); canary triton-mla-context-dequant-x2 and an A/A run
#   $K (/tmp/h200k)  the FP8 cells compute their k/v scales from the data (calculate_kv_scales = true); the
#                    measurement patches/triton-mla-calculated-scale-div8 and an A/A run
#
#   paths.sh start      setup and base sides of both roots, then each root's heads in the background
#   paths.sh wait S     until every run of both roots ended, or S seconds; their progress
#   paths.sh gate       run.sh gate of both roots, into $OUT/context and $OUT/calculated
set -uo pipefail
here=$(dirname "$0")
export KVGATE_ENGINE_START_LOCK=/tmp/h200-engine-start.lock
C=/tmp/h200c K=/tmp/h200k

case "${1:-}" in
start)
  KVGATE_CANARY_ROOT=$C bash "$here/run.sh" setup > /tmp/setup-context.log 2>&1 || { tail -5 /tmp/setup-context.log; exit 1; }
  KVGATE_CANARY_ROOT=$K KVGATE_CANARY_CALCULATE_KV_SCALES=1 bash "$here/run.sh" setup > /tmp/setup-calculated.log 2>&1 \
    || { tail -5 /tmp/setup-calculated.log; exit 1; }
  grep -c '^calculate_kv_scales = true' $K/matrix/workloads.toml
  KVGATE_CANARY_ROOT=$C bash "$here/run.sh" base TRITON_MLA
  KVGATE_CANARY_ROOT=$K bash "$here/run.sh" base TRITON_MLA
  # the heads wait for their base side (run.sh heads), in the background
  KVGATE_CANARY_ROOT=$C setsid nohup bash "$here/run.sh" heads TRITON_MLA triton-mla-context-dequant-x2 aa1 \
    > /tmp/heads-context.log 2>&1 < /dev/null &
  KVGATE_CANARY_ROOT=$K setsid nohup bash "$here/run.sh" heads TRITON_MLA triton-mla-calculated-scale-div8 aa1 \
    > /tmp/heads-calculated.log 2>&1 < /dev/null &
  echo "started at $(date -u +%H:%M:%S)" ;;
wait)
  deadline=$(( $(date +%s) + ${2:-300} ))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    sleep 10
    running=$(pgrep -fc "kvgate run accuracy" || true)
    heads=$(pgrep -fc "run.sh heads" || true)
    [ "$running" -eq 0 ] && [ "$heads" -eq 0 ] && break
  done
  echo "running: ${running:-?} kvgate runs, ${heads:-?} head starters at $(date -u +%H:%M:%S)"
  for log in $C/logs/*.log $K/logs/*.log; do
    echo "== $log"; grep -E "^kvgate: (\[|engine start lock)|ERROR|Traceback" "$log" | tail -6
  done ;;
gate)
  mkdir -p "${OUT:-/tmp/out}/context" "${OUT:-/tmp/out}/calculated"
  KVGATE_CANARY_ROOT=$C OUT=${OUT:-/tmp/out}/context bash "$here/run.sh" gate
  KVGATE_CANARY_ROOT=$K OUT=${OUT:-/tmp/out}/calculated bash "$here/run.sh" gate ;;
*)
  sed -n '2,13p' "$0"; exit 2 ;;
esac
