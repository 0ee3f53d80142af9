#!/bin/bash
# kvgate's sm90 cells on the lent H200 with the tiny models (issue 12), over several device calls while the machine
# stays warm. Assumes .gpu/h200_unpack.sh unpacked vLLM 0.26.0 + lm-eval + FlashInfer into /tmp/site. Run from the
# repository root:
#   run_cells.sh start GROUP...    start `kvgate run cell` (every stage) for each GROUP (comma-separated backends
#                                  or cell ids). Groups run at once; on ONE GPU that races vLLM's memory profiling
#                                  ("Error in memory profiling ... other processes sharing the same container release
#                                  GPU memory": 11 of 42 stages failed so on 2026-12-01), so give one GPU one group
#                                  (all its cells in one comma list), or each group its own CUDA_VISIBLE_DEVICES
#                                  in a process of its own session, all into one results folder (/tmp/h200/run)
#   run_cells.sh install-mla [S]   wait up to S s for start_training.sh's DeepSeek-V2, make it the MLA workload's
#                                  model (/tmp/h200/models/tiny-deepseek-v2, outside the tree that each call
#                                  re-sends), copy it to $OUT
#   run_cells.sh wait S            wait up to S s for every started group, printing each cell's stages
#   run_cells.sh gate              kvgate gate on the folder; the report, verdict, logs and folder to $OUT
set -uo pipefail
H=/tmp/h200
RUN=$H/run
M=$H/matrix
export PYTHONPATH=${KVGATE_H200_SITE:-/tmp/site}:$PWD/src PYTHONUNBUFFERED=1 KVGATE_MATRIX_DIR=$M
export OMP_NUM_THREADS=2 FLASHINFER_WORKSPACE_BASE=$H/flashinfer TOKENIZERS_PARALLELISM=false
mkdir -p "$H/logs" "$M" "$FLASHINFER_WORKSPACE_BASE"
if [ ! -f "$M/workloads.toml" ]; then
  cp matrix/*.toml "$M/" && cp benchmarks/h200_engine/workloads.toml "$M/workloads.toml"
  # the per-model FP8 tax names the runners' models, which this matrix does not hold
  sed -i '/^"deepseek-ai\/DeepSeek-V2-Lite-Chat" = /d' "$M/policy.toml"
fi

progress() {
  python3 - "$RUN" <<'PY'
import json, sys
from pathlib import Path
run = Path(sys.argv[1])
for cell in sorted(p for p in run.iterdir() if p.is_dir() and not p.name.startswith(".")) if run.is_dir() else []:
    try:
        status = json.loads((cell / "status.json").read_text())
    except (OSError, ValueError):
        status = {}
    stages = " ".join(f"{k}={v.get('status')}" + (f"({v.get('elapsed_s')}s)" if v.get("elapsed_s") else "")
                      for k, v in status.items() if isinstance(v, dict))
    kv = status.get("accuracy", {}).get("kv_cache") if isinstance(status.get("accuracy"), dict) else None
    print(f"  {cell.name:27s} {stages}" + (f"  kv {kv}" if kv else ""))
PY
}

case "${1:-}" in
start)
  shift
  for group in "$@"; do
    args=()
    IFS=, read -ra backends <<< "$group"
    for b in "${backends[@]}"; do
      case "$b" in *-*) args+=(--cell "$b") ;; *) args+=(--backend "$b") ;; esac
    done
    log="$H/logs/group-${backends[0]}.log"
    [ -e "$log" ] && log="$H/logs/group-${backends[0]}-$$.log"
    setsid nohup python3 -m kvgate run cell --run-dir "$RUN" --arch sm90 "${args[@]}" > "$log" 2>&1 < /dev/null &
    echo "$!" >> "$H/pids"
    echo "started $group (pid $!, log $log)"
  done ;;
install-mla)
  deadline=$(( $(date +%s) + ${2:-300} ))
  while [ ! -f /tmp/tr-D9.done ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
  grep -E "params|steps|trained|HF greedy|dev_strict|Error|Traceback" /tmp/tr-D9.log | cut -c1-300 | tail -15
  folder=/tmp/tr/D9/tiny-deepseek-v2
  if [ ! -f /tmp/tr-D9.done ] || [ ! -f "$folder/model.safetensors" ]; then
    echo "training not finished (rc file: $(cat /tmp/tr-D9.done 2>/dev/null || echo none))"; tail -5 /tmp/tr-D9.log; exit 1
  fi
  dest=$H/models/tiny-deepseek-v2
  mkdir -p "$dest" && cp "$folder"/* "$dest"/
  sed -i "s|^model = \"kvgate:tiny-deepseek-v2\"|model = \"$dest\"|" "$M/workloads.toml"
  grep -n "^model" "$M/workloads.toml"
  tar cf - -C /tmp/tr/D9 tiny-deepseek-v2 run_summary.json -C /tmp tr-D9.log | xz -T4 -3 > "$H/deepseek.tar.xz"
  split -b 15M -d "$H/deepseek.tar.xz" "$OUT/deepseek.tar.xz.p"
  sha256sum "$H/deepseek.tar.xz" | tee "$OUT/deepseek.sha256"
  echo "installed the trained tiny-deepseek-v2 into $dest" ;;
wait)
  # shellcheck source=../wait_for_pids.sh
  . "$(dirname "$0")/../wait_for_pids.sh"
  wait_for_pids "$H/pids" "${2:-300}" 10
  echo "groups still running: $alive"
  progress ;;
gate)
  progress
  python3 -m kvgate gate "$RUN" --out "$H/gate" --matrix-dir "$M" > "$H/logs/gate.log" 2>&1
  echo "gate exit $?"; tail -5 "$H/logs/gate.log"
  cp "$H/gate/report.md" "$OUT/" 2>/dev/null; cp "$H/gate/verdict.json" "$OUT/" 2>/dev/null
  tar cf - --exclude='*.safetensors' -C "$H" run logs gate | xz -T4 -6 > "$OUT/h200-run.tar.xz"
  ls -la "$OUT" ;;
*) echo "usage: run_cells.sh start GROUP... | install-mla [S] | wait S | gate" >&2; exit 2 ;;
esac
