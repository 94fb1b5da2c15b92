#!/usr/bin/env bash
# On the GPU machine (Python 3.12, torch 2.11+cu130, no network): install the wheels carried
# in .whl/ (ExecuTorch 1.5.1 and its small dependencies) and composer itself into /tmp/site.
# Usage: source bench/gpu_setup.sh
# Then: python3 bench/gpu_check.py, or python3 -m pytest tests/test_gpu.py -m gpu -p no:hydra_pytest
# -o addopts="" (hydra-core's own pytest plugin fails to import with the carried antlr4 4.13).
if [ ! -d /tmp/site/executorch ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || return 1
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade \
  --target /tmp/site . 2>&1 | grep -v "already exists" || true
export PYTHONPATH=/tmp/site
