#!/bin/bash
# After chain.sh: the larger torchvision models on `openvino+xnnpack` again, on the run's
# memory fixes (the d2f270f run's run lost vgg11 to the OOM killer), until DEADLINE.
# usage: chain2.sh SNAPSHOT DEADLINE_EPOCH
set -u
OUT=$(cd "$(dirname "$0")" && pwd); SNAP=$1; DEADLINE=$2
export OUT OMP_NUM_THREADS=1
LARGER="not (mnasnet1_0 or mobilenet_v2 or mobilenet_v3_small or shufflenet_v2_x1_0 or squeezenet1_1 or test_resnet50 or alexnet)"
while pgrep -f "conformance_2026-11-28_979a087/chain.sh" >/dev/null; do sleep 20; done  # (the 831e98e run: run alone at 13:11)
NAME=models_openvino_xnnpack_larger
/work/main/bench/results/conformance_2026-11-27_336ec22/run.sh $NAME $SNAP openvino+xnnpack models.test_torchvision -k "$LARGER" &
PID=$!
while kill -0 $PID 2>/dev/null; do
  [ $(date +%s) -ge $DEADLINE ] && pkill -INT -f "conformance_ini_$NAME"; sleep 15
done
