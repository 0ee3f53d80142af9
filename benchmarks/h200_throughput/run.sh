#!/bin/bash
# Throughput at the shape GPU runners declare, on the lent H200 (issue 30): the repository's own matrix (no matrix
# folder of its own: DeepSeek-V2-Lite-Chat's and Llama-3.1-8B-Instruct's architectures with dummy weights, 8192 in /
# 1024 out, 100 prompts, CUDA graphs; one engine a side: warm-up then 3 repeats), through the real CLI and gate.
# Assumes .gpu/h200_unpack.sh unpacked vLLM 0.26.0 + lm-eval + FlashInfer into /tmp/site. From the repository root:
#
#   run.sh setup              the GPU and the planned cells
#   run.sh start JOB...       the jobs, one after another in the background (one engine on the GPU at a time):
#                             aa             flashmla fp8 + auto cells, --vllm release --base-vllm release (A/A)
#                             slower-N       the same two cells, --vllm patch:patches/flashmla-fp8-decode-slower-N.patch
#                                            --base-vllm release (an A/B of a throughput canary)
#                             slower-N-fp8   the fp8 cell alone, the same A/B
#                             llama          flash_attn fp8 + auto cells, one side (the release)
#                             llama-fp8-aa   the flash_attn fp8 cell, --vllm release --base-vllm release (A/A)
#                             llama-auto     the flash_attn auto cell alone, one side (the release): a further engine
#   run.sh wait SECONDS       until the queue ended or failed, or SECONDS; prints what each engine measured, and
#                             leaves what the queue wrote so far in $OUT/partial.tar.xz (a session's device time
#                             may end before `collect`)
#   run.sh collect            kvgate gate on every run (--require-baseline for the A/B ones), the figures
#                             (figures.py) and the raw results to $OUT
set -uo pipefail
H=${KVGATE_THROUGHPUT_ROOT:-/tmp/h200t}
HERE=benchmarks/h200_throughput
export PYTHONPATH=${KVGATE_H200_SITE:-/tmp/site}:$PWD/src PYTHONUNBUFFERED=1 KVGATE_MODEL_DIR=$H/models
export OMP_NUM_THREADS=4 FLASHINFER_WORKSPACE_BASE=$H/flashinfer TOKENIZERS_PARALLELISM=false
mkdir -p "$H/logs" "$H/runs" "$FLASHINFER_WORKSPACE_BASE"

job_args() {  # JOB -> the arguments of its `kvgate run throughput`
  local fp8="--cell flashmla-fp8-sm90" auto="--cell flashmla-auto-sm90"
  case "$1" in
    aa) echo "$fp8 $auto --vllm release --base-vllm release" ;;
    slower-*-fp8) n=${1#slower-}; n=${n%-fp8}
                  echo "$fp8 --vllm patch:$HERE/patches/flashmla-fp8-decode-slower-$n.patch --base-vllm release" ;;
    slower-*) echo "$fp8 $auto --vllm patch:$HERE/patches/flashmla-fp8-decode-slower-${1#slower-}.patch --base-vllm release" ;;
    llama) echo "--cell flash_attn-fp8-sm90 --cell flash_attn-auto-sm90 --vllm release" ;;
    llama-auto) echo "--cell flash_attn-auto-sm90 --vllm release" ;;
    llama-fp8-aa) echo "--cell flash_attn-fp8-sm90 --vllm release --base-vllm release" ;;
    *) echo "unknown job $1" >&2; return 2 ;;
  esac
}

case "${1:-}" in
setup)
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm,power.limit --format=csv
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv
  python3 -m kvgate matrix --arch sm90 | grep -E "flashmla|flash_attn-" ;;
start)
  shift
  for job in "$@"; do job_args "$job" > /dev/null || exit 2; done
  printf '%s\n' "$@" > "$H/queue"
  touch "$H/queue.status"  # the queue exists from now on: a `wait` in the same call must not call this a fresh machine
  # the queue runs from a frozen copy of the checkout: later calls re-send the working tree, which must not change
  # the code of the jobs still waiting
  rm -rf "$H/tree"; mkdir -p "$H/tree"; cp -r src matrix benchmarks canaries pyproject.toml "$H/tree/"
  git rev-parse HEAD > "$H/tree/COMMIT" 2>/dev/null; git status --short > "$H/tree/CHANGES" 2>/dev/null
  cd "$H/tree" || exit 2
  export PYTHONPATH=${KVGATE_H200_SITE:-/tmp/site}:$H/tree/src
  setsid nohup bash -c '
    for job in $(cat "$0/queue"); do
      echo "$job started $(date -u +%s)" >> "$0/queue.status"
      # shellcheck disable=SC2046
      python3 -m kvgate run throughput --run-dir "$0/runs/$job" $(bash "$1" args "$job") > "$0/logs/$job.log" 2>&1
      echo "$job exit $? $(date -u +%s)" >> "$0/queue.status"
    done
    echo "queue done $(date -u +%s)" >> "$0/queue.status"' "$H" "$H/tree/$HERE/run.sh" < /dev/null > "$H/logs/queue.log" 2>&1 &
  echo "started the queue: $* (pid $!) at $(date -u +%H:%M:%S)" ;;
args)
  job_args "$2" ;;
wait)
  # no queue on this machine (a fresh one: the lent machine went back between calls): say so at once, never wait
  [ -f "$H/queue.status" ] || { echo "no queue here ($H/queue.status is missing): this is a fresh machine"; exit 2; }
  end=$((SECONDS + ${2:-300}))
  failed_before=$(grep -c " exit [1-9]" "$H/queue.status" 2>/dev/null)
  while [ $SECONDS -lt $end ]; do
    grep -q "^queue done" "$H/queue.status" 2>/dev/null && break
    # a job that ended badly while this call waited: stop waiting, say so (the queue goes on with the next job)
    if [ "$(grep -c " exit [1-9]" "$H/queue.status" 2>/dev/null)" -gt "${failed_before:-0}" ]; then
      last=$(grep " exit [1-9]" "$H/queue.status" | tail -1); echo "a job ended badly: $last"; break
    fi
    sleep 5
  done
  cat "$H/queue.status" 2>/dev/null
  for log in "$H"/logs/*.log; do
    [ "$(basename "$log")" = queue.log ] && continue
    echo "== $(basename "$log")"
    grep -E "^kvgate: (\[|.*repeat [0-9]+: Throughput|engine started|warm-up of)|^kvgate-(infrastructure|machine)|Error|error:" "$log" | tail -14
  done
  [ -n "${OUT:-}" ] && tar cf - -C "$H" runs logs queue.status 2>/dev/null | xz -T8 -6 > "$OUT/partial.tar.xz" ;;
collect)
  for dir in "$H"/runs/*/; do
    job=$(basename "$dir")
    case "$job" in llama|llama-auto*) req=() ;; *) req=(--require-baseline) ;; esac
    python3 -m kvgate gate "$dir" "${req[@]}" > "$dir/gate.out" 2>&1
    echo "$job: exit $? $(head -1 "$dir/gate.out")"
  done
  python3 "$HERE/figures.py" "$H/runs" | tee "${OUT:-$H}/figures.md"
  tar cf - -C "$H" runs logs queue.status | xz -T8 -6 > "${OUT:-$H}/runs.tar.xz"
  ls -la "${OUT:-$H}" ;;
*)
  sed -n '2,18p' "$0"; exit 2 ;;
esac
