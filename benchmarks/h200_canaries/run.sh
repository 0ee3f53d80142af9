#!/bin/bash
# The GPU canary table on the lent H200 (issue 20): small patches to vLLM 0.26.0's FP8 paths, each A/B against the
# release through the real CLI and gate, plus A/A runs (release against release) for the false alarms. Assumes
# .gpu/h200_unpack.sh unpacked vLLM 0.26.0 + lm-eval + FlashInfer into /tmp/site. Run from the repository root:
#
#   run.sh setup                        the matrix folder: the repository's matrix/ with the tiny models' workloads
#                                       (benchmarks/h200_engine/workloads.toml), as KVGATE_MATRIX_DIR; with
#                                       KVGATE_CANARY_CALCULATE_KV_SCALES=1 their FP8 cells compute the k/v scales
#                                       from the data (workloads' calculate_kv_scales = true; use another
#                                       KVGATE_CANARY_ROOT for it); with KVGATE_CANARY_GRAPHS=1 they capture CUDA
#                                       graphs (enforce_eager = false, as matrix/workloads.toml runs every GPU cell)
#   run.sh base BACKEND                 the base side once: the release, each of the backend's cells (auto, fp8) in a
#                                       process of its own (--powered: the policy's questions), into $H/base-BACKEND
#   run.sh heads BACKEND NAME...        one A/B run per NAME, at once: a canary of canaries/canaries.toml or a
#                                       measurement of patches/ (its patch as --vllm patch:), or aaN (the release
#                                       again: an A/A run); each reuses the
#                                       base side (--base-from) and runs its head cells, auto then fp8, in one process
#                                       (a canary's cells are those it declares; the others' are the base side's;
#                                       KVGATE_CANARY_CELLS="cell ..." names them instead)
#
# KVGATE_CANARY_FEATURES="spec_decode ..." adds each backend's cells of those features (matrix/axes.toml) to the base
# side and to the heads that are not canaries.
#   run.sh wait SECONDS                 until every started run has ended, or SECONDS; prints each cell's stages
#   run.sh gate                         kvgate gate --require-baseline on every A/B run; the table (table.py), the
#                                       verdicts and the raw results (logs left out) to $OUT
#
# Engines share the GPU (gpu_memory_utilization 0.08 each): their starts take turns through
# KVGATE_ENGINE_START_LOCK, so none profiles its memory while another frees some (vLLM refuses to start then), and
# a start that still meets that race is made once more by the accuracy stage.
set -uo pipefail
H=${KVGATE_CANARY_ROOT:-/tmp/h200c}
M=$H/matrix
ARCH=${KVGATE_CANARY_ARCH:-sm90}  # cpu: the same flow on the CPU default, to try the script where no GPU is
export PYTHONPATH=${KVGATE_H200_SITE:-/tmp/site}:$PWD/src PYTHONUNBUFFERED=1 KVGATE_MATRIX_DIR=$M
export OMP_NUM_THREADS=2 FLASHINFER_WORKSPACE_BASE=$H/flashinfer TOKENIZERS_PARALLELISM=false
export KVGATE_ENGINE_START_LOCK=${KVGATE_ENGINE_START_LOCK:-$H/engine-start.lock}  # one lock for every root on this GPU
mkdir -p "$H/logs" "$H/ab" "$M" "$FLASHINFER_WORKSPACE_BASE"
# shellcheck source=../wait_for_pids.sh
. "$(dirname "$0")/../wait_for_pids.sh"

cells_of() {  # BACKEND -> --cell flags of its auto and fp8 cells on sm90, and of their feature variants
  local b f; b=$(echo "$1" | tr 'A-Z' 'a-z')
  echo "--cell ${b}-auto-$ARCH --cell ${b}-fp8-$ARCH"
  for f in ${KVGATE_CANARY_FEATURES:-}; do echo "--cell ${b}-auto-$ARCH-$f --cell ${b}-fp8-$ARCH-$f"; done
}

canary_cells() {  # NAME -> --cell flags of the cells a canary of canaries/canaries.toml declares (nothing otherwise)
  python3 - "$1" <<'PY'
import sys, tomllib
from pathlib import Path
doc = tomllib.loads(Path("canaries/canaries.toml").read_text())
print(" ".join(f"--cell {cell}" for cell in doc.get(sys.argv[1], {}).get("cells", [])))
PY
}

patch_of() {  # name -> its patch: a canary of canaries/canaries.toml, else benchmarks/h200_canaries/patches/NAME.patch
  python3 - "$1" <<'PY'
import sys, tomllib
from pathlib import Path
doc = tomllib.loads(Path("canaries/canaries.toml").read_text())
name = sys.argv[1]
print(Path("canaries") / doc[name]["patch"] if name in doc else Path("benchmarks/h200_canaries/patches") / f"{name}.patch")
PY
}

case "${1:-}" in
setup)
  cp matrix/*.toml "$M/"
  if [ "$ARCH" != cpu ]; then
    cp benchmarks/h200_engine/workloads.toml "$M/workloads.toml"
    sed -i '/^"deepseek-ai\/DeepSeek-V2-Lite-Chat" = /d' "$M/policy.toml"
    if [ "${KVGATE_CANARY_CALCULATE_KV_SCALES:-0}" = 1 ]; then
      sed -i 's/^\(\[workloads\.tiny-[a-z0-9-]*-any\]\)$/\1\ncalculate_kv_scales = true/' "$M/workloads.toml"
      grep -B1 '^calculate_kv_scales' "$M/workloads.toml"
    fi
    if [ "${KVGATE_CANARY_GRAPHS:-0}" = 1 ]; then
      sed -i 's/enforce_eager = true/enforce_eager = false/' "$M/workloads.toml"
      grep -c 'enforce_eager = false' "$M/workloads.toml"
    fi
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
  fi
  python3 -m kvgate matrix --arch "$ARCH" --matrix-dir "$M" | head -30 ;;
base)
  b=$2; dir=$H/base-$b
  for cell in $(cells_of "$b" | sed 's/--cell //g'); do  # every cell in a process of its own
    setsid nohup python3 -m kvgate run accuracy --run-dir "$dir" --cell "$cell" --vllm release --powered \
      --matrix-dir "$M" > "$H/logs/base-$cell.log" 2>&1 < /dev/null &
    echo "$!" | tee -a "$H/pids" >> "$H/pids-base-$b"; echo "started base $cell (pid $!)"
  done ;;
heads)
  b=$2; shift 2
  wait_for_pids "$H/pids-base-$b" "${KVGATE_CANARY_BASE_WAIT:-1200}"  # the base side first: --base-from checks that it is complete
  for name in "$@"; do
    case "$name" in aa*) spec=release ;; *) spec="patch:$(patch_of "$name")" ;; esac
    cells=$(canary_cells "$name"); [ -n "$cells" ] || cells=$(cells_of "$b")
    [ -z "${KVGATE_CANARY_CELLS:-}" ] || cells=$(printf -- '--cell %s ' $KVGATE_CANARY_CELLS)
    # shellcheck disable=SC2086
    setsid nohup python3 -m kvgate run accuracy --run-dir "$H/ab/$b-$name" $cells --vllm "$spec" \
      --base-vllm release --base-from "$H/base-$b" --matrix-dir "$M" > "$H/logs/$b-$name.log" 2>&1 < /dev/null &
    echo "$!" >> "$H/pids"; echo "started $b-$name: --vllm $spec (pid $!)"
  done ;;
wait)
  wait_for_pids "$H/pids" "${2:-300}"
  echo "alive: $alive at $(date -u +%H:%M:%S)"
  for log in "$H"/logs/*.log; do echo "== $(basename "$log")"; grep -E "^kvgate: (\[|look at|engine start lock)" "$log" | tail -8; done ;;
gate)
  for dir in "$H"/ab/*/; do
    python3 -m kvgate gate "$dir" --require-baseline --matrix-dir "$M" > "$dir/gate.out" 2>&1
    rc=$?
    echo "$(basename "$dir"): exit $rc $(head -1 "$dir/gate.out")"
  done
  python3 benchmarks/h200_canaries/table.py "$H" | tee "${OUT:-$H}/table.md"
  tar cf - -C "$H" --exclude=logs --exclude=.kvgate-tasks --exclude='*.lock' ab $(cd "$H" && ls -d base-* 2>/dev/null) \
    | xz -T8 -6 > "${OUT:-$H}/runs.tar.xz"
  tar cf - -C "$H" logs $(cd "$H" && ls -d ab/*/*/logs base-*/*/logs 2>/dev/null) | xz -T8 -6 > "${OUT:-$H}/logs.tar.xz"
  ls -la "${OUT:-$H}" ;;
*)
  sed -n '2,31p' "$0"; exit 2 ;;
esac
