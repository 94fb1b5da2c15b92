#!/bin/bash
# The d2f270f run, on this machine: the suite's torchvision model tests of the larger models with
# composer's xnnpack flow beside plain's, until DEADLINE (SIGINT; the JSON report is still
# written). One thread a worker, two workers.
# usage: chain.sh SNAPSHOT DEADLINE_EPOCH
set -u
OUT=$(cd "$(dirname "$0")" && pwd); SNAP=$1; DEADLINE=$2
export OUT OMP_NUM_THREADS=1
/work/main/bench/results/conformance_2026-11-27_336ec22/run.sh models_xnnpack_larger $SNAP xnnpack \
  models.test_torchvision -k "not (mnasnet1_0 or mobilenet_v2 or mobilenet_v3_small or shufflenet_v2_x1_0 or squeezenet1_1 or test_resnet50 or alexnet)" &
PID=$!
while kill -0 $PID 2>/dev/null; do
  [ $(date +%s) -ge $DEADLINE ] && pkill -INT -f "conformance_ini_models_xnnpack_larger"; sleep 15
done
