#!/bin/bash
# After run (1): rerun composer's failures with the fixed flow, then run (2). Each at nice 19.
set -u
OUT=/work/main/bench/results/conformance_2026-11-27_336ec22
SNAP=$1; WAIT_PID=$2
S26='not (test_conv2d or test_linear or test_lstm or (test_embedding and not embedding_bag) or test_gelu or test_cat or test_index_put or test_masked_fill or test_maxpool2d or test_upsample_bilinear2d or test_permute or test_glu)'
while kill -0 $WAIT_PID 2>/dev/null; do sleep 20; done
source /work/main/.venv/bin/activate
FAILED=$(cd /tmp && PYTHONPATH=$SNAP python -c "
from composer.conformance import results
names = sorted({c.key.split('::')[1].split('[')[0] for c in results.load('$OUT/ops_xnnpack.json')
                if c.flow.startswith('composer_') and c.outcome == 'failed'})
print(' or '.join(names))" 2>/dev/null | tail -1)
if [ -n "$FAILED" ]; then
  $OUT/run.sh ops_xnnpack_rerun_composer_failures $SNAP xnnpack operators -k "composer_xnnpack and ($FAILED)"
fi
$OUT/run.sh ops_openvino $SNAP openvino,openvino+xnnpack operators -k "$S26"
