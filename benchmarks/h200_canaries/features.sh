#!/bin/bash
# The GPU canary rounds of the feature axes (issue 31; third to fifth round): on the lent H200, through run.sh, the
# real CLI and gate.
# Roots share the GPU and one engine-start lock:
#   $G (/tmp/h200g)  CUDA graphs (enforce_eager = false, as matrix/workloads.toml runs every GPU cell), FLASHMLA on the
#                    tiny DeepSeek-V2, plain and spec_decode cells (ngram speculative decoding, matrix/axes.toml):
#                    canary flashmla-spec-verify-only-k-x09 on its four cells and an A/A run. Rounds 3 to 5 ran
#                    flashmla-cuda-graph-k-x09, flashmla-spec-verify-k-x09, the verify-only canary's first version
#                    with its x0.8 measurement (patches/) and A/A runs of both cell kinds here.
#   $L (/tmp/h200l)  long context: FLASH_ATTN with CUDA graphs, gsm8k on tiny-llama and the passkey task at 4k-16k in
#                    an engine of the shipped long-position model (benchmarks/h200_engine/workloads.toml
#                    long_context.model): canary flash-attn-long-context-k-x05 and an A/A run
#   $E (/tmp/h200e)  eager (enforce_eager = true): flashmla-cuda-graph-k-x09 again, which must pass there
#   $P (/tmp/h200p)  tensor parallel, on nvidia-h200-x2 only: FLASHMLA and FLASH_ATTN with CUDA graphs, plain and tp2
#                    cells (tensor_parallel_size 2, matrix/axes.toml); heads: canary flashmla-rank-heads-k-x09 on
#                    FLASHMLA's four cells (its FP8 decode at 0.9 times its scale where a rank holds one query head,
#                    as the tiny DeepSeek-V2's 2 heads leave each of 2 ranks: its tp2 FP8 cell must fail and its
#                    plain cells pass; on one GPU its kernel tests fail it) and an A/A run of each backend. Not run
#                    yet: the two-GPU kind has not been lent
#
#   features.sh start [graphs] [long] [eager] [train] [tp2]
#                          the named chains in the background (graphs and long when none is named): $G's base side
#                          and heads, $L's, $E's; train: three long-position models at once into $L/models/ (no
#                          engine; never beside engine starts: their memory swings failed three starts on 2026-12-03);
#                          tp2: $P's, which refuses to start on a machine of fewer than two GPUs
#   features.sh eager      $E's base side and head, in the background
#   features.sh wait S     until every chain and run ended, or S seconds; their progress, and what the roots
#                          hold so far (the trained model included) in $OUT/partial.tar.xz
#   features.sh gate       run.sh gate of each root into $OUT/graphs, $OUT/long, $OUT/eager, $OUT/tp2, plus the
#                          training log
#
# Everything runs from a frozen copy of the checkout ($T): later device calls send the working tree again, which must
# not change the code of runs still going.
set -uo pipefail
self=$(realpath "$0")  # its usage, from the checkout it was called in (the frozen copy may be an older one)
here=benchmarks/h200_canaries
G=/tmp/h200g L=/tmp/h200l E=/tmp/h200e P=/tmp/h200p T=/tmp/h200f/tree
if [ "${1:-}" = start ]; then
  rm -rf "$T"; mkdir -p "$T"; cp -r src matrix benchmarks canaries pyproject.toml "$T/"
  git rev-parse HEAD > "$T/COMMIT" 2>/dev/null; git status --short > "$T/CHANGES" 2>/dev/null
fi
[ -d "$T" ] && cd "$T"
export KVGATE_ENGINE_START_LOCK=/tmp/h200-engine-start.lock PYTHONPATH=${KVGATE_H200_SITE:-/tmp/site}:$PWD/src

graphs_chain() {  # base, then the heads: their starts take turns through the lock
  export KVGATE_CANARY_ROOT=$G KVGATE_CANARY_FEATURES=spec_decode
  bash "$here/run.sh" base FLASHMLA
  # the verify-only spec canary on the four cells it declares (its plain FP8 cell must pass, probe included); its
  # first version and the same break at x0.8 ran in the fifth round (README.md); and an A/A run of the four cells,
  # judged on the device by today's probe_ab rule
  bash "$here/run.sh" heads FLASHMLA flashmla-spec-verify-only-k-x09 aa1
  echo "graphs chain: heads started at $(date -u +%H:%M:%S)"
}

train_variant() {  # NAME ARGS...: one trainer into $L/models/NAME, which exits holding the engine-start lock
  local name=$1; shift
  local out=$L/models/$name
  python3 benchmarks/train_long_passkey.py --out "$out" "$@" > "$L/train-$name.log" 2>&1 &
  local trainer=$!
  # its exit frees GiBs: an engine profiling its memory then refuses to start (measured 2026-12-03)
  while kill -0 "$trainer" 2>/dev/null && [ ! -f "$out/training_log.json" ]; do sleep 2; done
  flock "$KVGATE_ENGINE_START_LOCK" bash -c "while kill -0 $trainer 2>/dev/null; do sleep 0.5; done; sleep 3"
  wait "$trainer"; echo "$name: exit $? at $(date -u +%H:%M:%S): $(grep -E 'greedy' "$L/train-$name.log")"
}

train_chain() {  # three long-position models at once: the recipe that learned on 2026-12-03, another seed, 8k
  mkdir -p "$L/models"
  local common="--curriculum 0.7 --batch 16 --lr 2e-3 --minutes 11 --max-positions 33792 --eval-per-length 10
    --eval-lengths 1024,2048,4096,8192,16384,32768"
  echo "training from $(date -u +%H:%M:%S)"
  # shellcheck disable=SC2086
  train_variant s31-16k --train-tokens 16384 --steps 2000 $common &
  # shellcheck disable=SC2086
  train_variant s32-16k --seed 32 --train-tokens 16384 --steps 2500 $common &
  # shellcheck disable=SC2086
  train_variant s31-8k --train-tokens 8192 --steps 2000 $common &
  wait
  echo "training ended at $(date -u +%H:%M:%S)"
}

long_chain() {  # FLASH_ATTN with CUDA graphs: gsm8k on tiny-llama, the passkey task on tiny-llama-long (shipped)
  export KVGATE_CANARY_ROOT=$L
  KVGATE_CANARY_GRAPHS=1 bash "$here/run.sh" setup > "$L/setup.log" 2>&1 \
    || { echo "setup failed"; tail -5 "$L/setup.log"; return 1; }
  grep -E "flash_attn" "$L/setup.log"
  bash "$here/run.sh" base FLASH_ATTN
  bash "$here/run.sh" heads FLASH_ATTN flash-attn-long-context-k-x05 aa1
  echo "long chain: heads started at $(date -u +%H:%M:%S)"
}

eager_chain() {  # enforce_eager = true: the CUDA-graph canary must pass there
  export KVGATE_CANARY_ROOT=$E
  bash "$here/run.sh" setup > /tmp/setup-eager.log 2>&1 || { tail -5 /tmp/setup-eager.log; return 1; }
  grep -c "enforce_eager = true" $E/matrix/workloads.toml
  bash "$here/run.sh" base FLASHMLA
  bash "$here/run.sh" heads FLASHMLA flashmla-cuda-graph-k-x09
  echo "eager chain: heads started at $(date -u +%H:%M:%S)"
}

tp2_chain() {  # tensor parallel over the machine's two GPUs: base sides of both backends at once, then the heads
  export KVGATE_CANARY_ROOT=$P KVGATE_CANARY_FEATURES=tp2
  bash "$here/run.sh" base FLASHMLA
  bash "$here/run.sh" base FLASH_ATTN
  # the canary declares the kernels stage of the plain cells (one GPU); here it runs gsm8k on the four cells
  KVGATE_CANARY_CELLS="flashmla-auto-sm90 flashmla-fp8-sm90 flashmla-auto-sm90-tp2 flashmla-fp8-sm90-tp2" \
    bash "$here/run.sh" heads FLASHMLA flashmla-rank-heads-k-x09 aa1
  bash "$here/run.sh" heads FLASH_ATTN aa1
  echo "tp2 chain: heads started at $(date -u +%H:%M:%S)"
}

case "${1:-}" in
start)
  chains=${*:2}; chains=${chains:-graphs long}
  for chain in $chains; do
    case "$chain" in graphs|long|eager|train|tp2) ;; *) echo "features.sh start: no chain '$chain' (graphs, long, eager, train, tp2)"; exit 2 ;; esac
  done
  export -f graphs_chain long_chain eager_chain train_chain train_variant tp2_chain; export here G L E P
  if [[ " $chains " == *" tp2 "* ]]; then  # said up front: tp2 cells need two GPUs of one host
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
    [ "$gpus" -ge 2 ] || { echo "features.sh start tp2: this machine has $gpus GPU(s); the tp2 cells need 2 (nvidia-h200-x2)"; exit 2; }
    mkdir -p $P
    KVGATE_CANARY_ROOT=$P KVGATE_CANARY_GRAPHS=1 KVGATE_CANARY_FEATURES=tp2 bash "$here/run.sh" setup \
      > /tmp/setup-tp2.log 2>&1 || { tail -5 /tmp/setup-tp2.log; exit 1; }
    grep -E "^[0-9]+$|tp2" /tmp/setup-tp2.log
    setsid nohup bash -c tp2_chain > /tmp/chain-tp2.log 2>&1 < /dev/null &
  fi
  if [[ " $chains " == *" graphs "* ]]; then
    KVGATE_CANARY_ROOT=$G KVGATE_CANARY_GRAPHS=1 KVGATE_CANARY_FEATURES=spec_decode bash "$here/run.sh" setup \
      > /tmp/setup-graphs.log 2>&1 || { tail -5 /tmp/setup-graphs.log; exit 1; }
    grep -E "^[0-9]+$|flashmla" /tmp/setup-graphs.log
    setsid nohup bash -c graphs_chain > /tmp/chain-graphs.log 2>&1 < /dev/null &
  fi
  for chain in long eager train; do
    [[ " $chains " == *" $chain "* ]] || continue
    mkdir -p $L
    setsid nohup bash -c ${chain}_chain > /tmp/chain-$chain.log 2>&1 < /dev/null &
  done
  echo "started $chains at $(date -u +%H:%M:%S)" ;;
eager)
  export -f eager_chain; export here E
  setsid nohup bash -c eager_chain > /tmp/chain-eager.log 2>&1 < /dev/null &
  echo "started at $(date -u +%H:%M:%S)" ;;
wait)
  # what the roots hold so far (engine logs left out), in case the session's device time ends before `gate`:
  # written every minute, so that a call cut short still brings the last one back
  partial() {
    mkdir -p "${OUT:-/tmp/out}"
    tar cf - -C /tmp --exclude=logs --exclude=.kvgate-tasks --exclude='*.lock' --exclude=flashinfer \
      $(cd /tmp && ls -d h200g h200l h200e h200p chain-*.log 2>/dev/null) | xz -T8 -3 > /tmp/partial.tar.xz.new \
      && mv /tmp/partial.tar.xz.new "${OUT:-/tmp/out}/partial.tar.xz"
  }
  deadline=$(( $(date +%s) + ${2:-300} )) written=$(date +%s)
  while [ "$(date +%s)" -lt "$deadline" ]; do
    sleep 10
    running=$(pgrep -fc "kvgate run accuracy|train_long_passkey|run.sh (heads|base)|_chain" || true)
    [ "$running" -eq 0 ] && break
    [ $(( $(date +%s) - written )) -ge 60 ] && { partial; written=$(date +%s); }
  done
  echo "running: $running at $(date -u +%H:%M:%S)"
  for f in /tmp/chain-*.log; do echo "== $f"; tail -6 "$f"; done
  for f in "$L"/train*.log; do [ -f "$f" ] && { echo "== $f"; grep -E "^step [0-9]+ .*(00|50) s$|stopping|greedy" "$f" | tail -3; }; done
  for log in $G/logs/*.log $L/logs/*.log $E/logs/*.log $P/logs/*.log; do
    [ -f "$log" ] || continue
    echo "== $log"; grep -E "^kvgate: (\[|look at)|ERROR|Traceback" "$log" | tail -4
  done
  partial ;;
gate)
  for root in graphs:$G long:$L eager:$E tp2:$P; do
    name=${root%%:*} dir=${root#*:}
    [ -d "$dir/ab" ] || continue
    mkdir -p "${OUT:-/tmp/out}/$name"
    KVGATE_CANARY_ROOT=$dir OUT=${OUT:-/tmp/out}/$name bash "$here/run.sh" gate
  done
  [ -d "$L/models" ] && mkdir -p "${OUT:-/tmp/out}/long" \
    && tar cf - -C "$L" models $(cd "$L" && ls train-*.log 2>/dev/null) | xz -T8 -6 > "${OUT:-/tmp/out}/long/models.tar.xz"
  cp /tmp/chain-*.log "$T/COMMIT" "$T/CHANGES" "${OUT:-/tmp/out}/" 2>/dev/null; true ;;
*)
  sed -n '2,32p' "$self"; exit 2 ;;
esac
