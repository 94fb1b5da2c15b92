#!/bin/bash
# The 831e98e run: the larger torchvision models on `openvino` alone, then `xnnpack+openvino`,
# composer beside plain, until DEADLINE (SIGINT; the JSON report is still written).
# usage: chain.sh SNAPSHOT DEADLINE_EPOCH
set -u
OUT=$(cd "$(dirname "$0")" && pwd); SNAP=$1; DEADLINE=$2
export OUT OMP_NUM_THREADS=1
LARGER="not (mnasnet1_0 or mobilenet_v2 or mobilenet_v3_small or shufflenet_v2_x1_0 or squeezenet1_1 or test_resnet50 or alexnet)"
for FLOWS in openvino xnnpack+openvino; do
  [ $(date +%s) -lt $DEADLINE ] || exit 0
  NAME=models_${FLOWS/+/_}_larger
  /work/main/bench/results/conformance_2026-11-27_336ec22/run.sh $NAME $SNAP $FLOWS models.test_torchvision -k "$LARGER" &
  PID=$!
  while kill -0 $PID 2>/dev/null; do
    [ $(date +%s) -ge $DEADLINE ] && pkill -INT -f "conformance_ini_$NAME"; sleep 15
  done
done
