#!/bin/bash
# The ecf140e run's CPU runs, one after another, each composer beside plain at nice 19, each xdist
# worker on one thread (records here).
# usage: chain.sh SNAPSHOT DEADLINE_EPOCH   (a run under way at the deadline is stopped with
# SIGINT; its JSON report is still written)
set -u
OUT=$(cd "$(dirname "$0")" && pwd); SNAP=$1; DEADLINE=$2
RUN=/work/main/bench/results/conformance_2026-11-27_336ec22/run.sh
export OUT OMP_NUM_THREADS=1
until_deadline() {  # NAME: wait for the run, stopping it at the deadline
  while kill -0 $PID 2>/dev/null; do
    [ $(date +%s) -ge $DEADLINE ] && pkill -INT -f "conformance_ini_$1"; sleep 15
  done
}
# 0. the d689e35 run's 22 int8 conv3d/convtranspose3d cases composer "failed" (plain skipped), again
if [ ! -f $OUT/ops_xnnpack_static_int8_per_channel_3d.json ]; then
  $RUN ops_xnnpack_static_int8_per_channel_3d $SNAP xnnpack_static_int8_per_channel operators \
    -k "test_conv3d or test_convtranspose3d" &
  PID=$!; until_deadline ops_xnnpack_static_int8_per_channel_3d
fi
MOBILE="test_mobilenet_v2 or test_mobilenet_v3_small or test_mnasnet1_0 or test_shufflenet_v2_x1_0 or test_squeezenet1_1 or test_resnet50"
# 1. the six mobile-sized torchvision models' tests for openvino alone, openvino+xnnpack (again:
#    the f7bde2b run measured 1.79x plain before one thread a worker) and xnnpack+openvino
$RUN models_mobile $SNAP openvino,openvino+xnnpack,xnnpack+openvino models.test_torchvision -k "$MOBILE" &
PID=$!; until_deadline models_mobile
# 2. XNNPACK's static int8 per-tensor flow over the whole operator suite
[ $(date +%s) -lt $DEADLINE ] || exit 0
$RUN ops_xnnpack_static_int8_per_tensor $SNAP xnnpack_static_int8_per_tensor operators &
PID=$!; until_deadline ops_xnnpack_static_int8_per_tensor
