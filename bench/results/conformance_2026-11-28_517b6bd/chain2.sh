#!/bin/bash
# After chain.sh: the same larger torchvision models with OpenVINO before XNNPACK, then XNNPACK
# before OpenVINO, until DEADLINE (SIGINT; the JSON report is still written).
# usage: chain2.sh SNAPSHOT DEADLINE_EPOCH
set -u
OUT=$(cd "$(dirname "$0")" && pwd); SNAP=$1; DEADLINE=$2
export OUT OMP_NUM_THREADS=1
LARGER="not (mnasnet1_0 or mobilenet_v2 or mobilenet_v3_small or shufflenet_v2_x1_0 or squeezenet1_1 or test_resnet50 or alexnet)"
while pgrep -f "conformance_2026-11-28_517b6bd/chain.sh" >/dev/null; do sleep 20; done
for FLOWS in openvino+xnnpack xnnpack+openvino; do
  [ $(date +%s) -lt $DEADLINE ] || exit 0
  NAME=models_${FLOWS/+/_}_larger
  /work/main/bench/results/conformance_2026-11-27_336ec22/run.sh $NAME $SNAP $FLOWS models.test_torchvision -k "$LARGER" &
  PID=$!
  while kill -0 $PID 2>/dev/null; do
    [ $(date +%s) -ge $DEADLINE ] && pkill -INT -f "conformance_ini_$NAME"; sleep 15
  done
done
