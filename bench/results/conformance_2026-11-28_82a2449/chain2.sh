#!/bin/bash
# After chain.sh's first run (models_convnext): XNNPACK's static int8 flow over the operator
# suite from where the f7bde2b run stopped (cat), each xdist worker on one thread as `composer
# conformance --jobs 2` now runs it (OMP_NUM_THREADS=1); stopped with SIGINT at DEADLINE.
# usage: chain2.sh SNAPSHOT DEADLINE_EPOCH
set -u
OUT=$(cd "$(dirname "$0")" && pwd); SNAP=$1; DEADLINE=$2
export OUT OMP_NUM_THREADS=1
/work/main/bench/results/conformance_2026-11-27_336ec22/run.sh ops_xnnpack_static_int8_per_channel $SNAP \
  xnnpack_static_int8_per_channel operators \
  -k "not (test_abs or test_adaptive or test_add or test_amax or test_amin or test_argmax or test_argmin or test_avgpool or test_cat)" &
PID=$!
while kill -0 $PID 2>/dev/null; do
  [ $(date +%s) -ge $DEADLINE ] && pkill -INT -f "conformance_ini_ops_xnnpack_static"; sleep 15
done
