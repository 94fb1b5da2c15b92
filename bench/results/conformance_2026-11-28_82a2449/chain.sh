#!/bin/bash
# The d689e35 run's CPU runs, one after another, each composer beside plain at nice 19 (records here).
# usage: chain.sh SNAPSHOT DEADLINE_EPOCH   (the last run is stopped with SIGINT at the deadline;
# its JSON report is still written)
set -u
OUT=$(cd "$(dirname "$0")" && pwd); SNAP=$1; DEADLINE=$2
RUN=/work/main/bench/results/conformance_2026-11-27_336ec22/run.sh
export OUT
# 1. convnext_small, the model test the f7bde2b run refused after 1116 s of repairs (derived sizes)
$RUN models_convnext $SNAP openvino+xnnpack models -n 1 -k "test_convnext_small" &
PID=$!
while kill -0 $PID 2>/dev/null; do
  [ $(date +%s) -ge $DEADLINE ] && pkill -INT -f "conformance_ini_models_convnext" ; sleep 15
done
# 2. XNNPACK's static int8 flow over the operator suite, from where the f7bde2b run stopped (cat)
[ $(date +%s) -lt $DEADLINE ] || exit 0
$RUN ops_xnnpack_static_int8_per_channel $SNAP xnnpack_static_int8_per_channel operators \
  -k "not (test_abs or test_adaptive or test_add or test_amax or test_amin or test_argmax or test_argmin or test_avgpool or test_cat)" &
PID=$!
while kill -0 $PID 2>/dev/null; do
  [ $(date +%s) -ge $DEADLINE ] && pkill -INT -f "conformance_ini_ops_xnnpack_static" ; sleep 15
done
