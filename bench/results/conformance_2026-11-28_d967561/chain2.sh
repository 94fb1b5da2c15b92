#!/bin/bash
# After chain.sh: XNNPACK's dynamic int8 flow over the operator suite from its first family,
# until DEADLINE (SIGINT; the JSON report is still written). One thread a worker.
# usage: chain2.sh SNAPSHOT DEADLINE_EPOCH
set -u
OUT=$(cd "$(dirname "$0")" && pwd); SNAP=$1; DEADLINE=$2
export OUT OMP_NUM_THREADS=1
while pgrep -f "chain.sh /tmp/w/s30snap2" >/dev/null; do sleep 20; done
[ $(date +%s) -lt $DEADLINE ] || exit 0
/work/main/bench/results/conformance_2026-11-27_336ec22/run.sh ops_xnnpack_dynamic_int8_per_channel $SNAP \
  xnnpack_dynamic_int8_per_channel operators &
PID=$!
while kill -0 $PID 2>/dev/null; do
  [ $(date +%s) -ge $DEADLINE ] && pkill -INT -f "conformance_ini_ops_xnnpack_dynamic"; sleep 15
done
