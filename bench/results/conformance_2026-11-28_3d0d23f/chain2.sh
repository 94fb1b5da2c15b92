#!/bin/bash
# After chain.sh: the case the 1d442c0 run fixed and did not rerun, then the quantized flows over
# the whole operator suite (each beside composer's), with the tree of SNAPSHOT (float64 scales).
set -u
OUT=$(cd "$(dirname "$0")" && pwd); SNAP=$1; WAIT_PID=$2
while kill -0 $WAIT_PID 2>/dev/null; do sleep 20; done
$OUT/run.sh ops_adaptive_maxpool3d_openvino $SNAP openvino operators -k "test_adaptive_maxpool3d"
$OUT/run.sh ops_openvino_int8 $SNAP openvino_int8 operators
$OUT/run.sh ops_xnnpack_static_int8_per_channel $SNAP xnnpack_static_int8_per_channel operators
