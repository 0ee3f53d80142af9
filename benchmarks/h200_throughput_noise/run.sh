#!/bin/bash
# Throughput noise on the lent H200 (issue 23): `kvgate run throughput` of one MLA and one non-MLA FP8 cell through
# the real CLI, each measured repeat its own fresh engine (`vllm bench throughput` starts one per repeat). Assumes
# .gpu/h200_unpack.sh unpacked vLLM 0.26.0 + lm-eval + FlashInfer into /tmp/site. Run from the repository root:
#
#   run.sh setup        the matrix folder: the repository's matrix/ with the tiny models' GPU workloads
#                       (benchmarks/h200_engine/workloads.toml), throughput runs long enough to time
#                       (NOISE_PROMPTS prompts of 512 in / 128 out, default 1000) and NOISE_REPEATS measured repeats
#                       (default 5) after one warm-up
#   run.sh start        one `kvgate run throughput` of the two cells, in the background (one engine at a time)
#   run.sh wait SECONDS until it ended, or SECONDS; prints each repeat's figure so far
#   run.sh collect      the figures (figures.py) and the raw results to $OUT
set -uo pipefail
H=${KVGATE_NOISE_ROOT:-/tmp/h200n}
M=$H/matrix
CELLS=${NOISE_CELLS:-"triton_mla-fp8-sm90 flash_attn-fp8-sm90"}
export PYTHONPATH=${KVGATE_H200_SITE:-/tmp/site}:$PWD/src PYTHONUNBUFFERED=1 KVGATE_MATRIX_DIR=$M
export OMP_NUM_THREADS=2 FLASHINFER_WORKSPACE_BASE=$H/flashinfer TOKENIZERS_PARALLELISM=false
mkdir -p "$H/logs" "$M" "$FLASHINFER_WORKSPACE_BASE"
# shellcheck source=../wait_for_pids.sh
. "$(dirname "$0")/../wait_for_pids.sh"

case "${1:-}" in
setup)
  cp matrix/*.toml "$M/"
  cp benchmarks/h200_engine/workloads.toml "$M/workloads.toml"
  sed -i '/^"deepseek-ai\/DeepSeek-V2-Lite-Chat" = /d' "$M/policy.toml"
  sed -i -e "s/^num_prompts = 200$/num_prompts = ${NOISE_PROMPTS:-1000}/" \
         -e "s/^repeats = 1 /repeats = ${NOISE_REPEATS:-5} /" -e 's/^warmup_output_len = 0 /warmup_output_len = 16 /' \
         -e 's/^throughput = 1200$/throughput = 3000/' "$M/workloads.toml"
  sed -n '/^\[defaults.throughput\]/,/^throughput = /p' "$M/workloads.toml"
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm --format=csv
  python3 -m kvgate matrix --arch sm90 --matrix-dir "$M" | grep -E "$(echo "$CELLS" | tr ' ' '|')" ;;
start)
  args=(); for cell in $CELLS; do args+=(--cell "$cell"); done
  setsid nohup python3 -m kvgate run throughput --run-dir "$H/run" "${args[@]}" --matrix-dir "$M" \
    > "$H/logs/run.log" 2>&1 < /dev/null &
  echo "$!" > "$H/pids"; echo "started (pid $!) at $(date -u +%H:%M:%S)" ;;
wait)
  wait_for_pids "$H/pids" "${2:-300}"
  echo "alive: $alive at $(date -u +%H:%M:%S)"
  grep -E "^kvgate: " "$H/logs/run.log" | tail -12
  python3 "$(dirname "$0")/figures.py" "$H/run" || true ;;
collect)
  python3 "$(dirname "$0")/figures.py" "$H/run" | tee "${OUT:-$H}/figures.md"
  tar cf - -C "$H" run logs | xz -T8 -6 > "${OUT:-$H}/runs.tar.xz"
  ls -la "${OUT:-$H}" ;;
*)
  sed -n '2,15p' "$0"; exit 2 ;;
esac
