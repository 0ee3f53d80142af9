#!/bin/bash
# Starts training kvgate's tiny DeepSeek-V2 on the lent H200 in a process of its own session (setsid), so it runs on
# between device calls while the machine stays warm; run_cells.sh `install-mla` picks the result up.
# Configuration D6 of issue 10 (hidden 256, 6 layers, 2 MLA heads, kv_lora 512 / rope 64 / nope 128 / v 128, MoE 4
# routed + 1 shared, 9.28 M parameters), lr 1.5e-3, with a fixed step count: a time budget would be calibrated on
# a quiet GPU and then cut short once the engine cells share it.
# Run from the repository root:  STEPS=2200 bash benchmarks/h200_engine/start_training.sh
set -eu
STEPS=${STEPS:-2200}
mkdir -p /tmp/tr
rm -rf /tmp/tr/D9 /tmp/tr-D9.done
SPEC='{"tiny-deepseek-v2": {"hidden": 256, "layers": 6, "intermediate": 768, "moe_intermediate": 256}}'
setsid nohup bash -c "PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false timeout 1000 python3 benchmarks/train_tiny_models.py \
  --out /tmp/tr/D9 --models tiny-deepseek-v2 --spec '$SPEC' --lr 1.5e-3 --problems 100000 --drill-rows 50000 \
  --tokens-per-batch 65536 --steps $STEPS --time-limit 600 --eval 240 --dev 200 --monitor-every 1000000 --threads 3; \
  echo \$? > /tmp/tr-D9.done" > /tmp/tr-D9.log 2>&1 < /dev/null &
sleep 2
echo "training started (steps $STEPS): $(pgrep -f train_tiny_models | head -3 | tr '\n' ' ')"
