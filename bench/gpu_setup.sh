#!/usr/bin/env bash
# On the GPU machine (Python 3.12, torch 2.11+cu130, no network): install the wheels carried
# in .whl/ (ExecuTorch 1.5.1 and its small dependencies) and composer itself into /tmp/site.
# The set that worked on 2026-11-22 (pip download --no-deps --python-version 3.12, see the
# device README): executorch 1.5.1 (cp312 manylinux_2_28), torchao 0.18.0 (the XNNPACK
# partitioner imports it), ruamel.yaml 0.19.1, hydra-core 1.3.8, omegaconf 2.3.1,
# antlr4-python3-runtime 4.9.3 (made with `pip wheel --no-deps`), expecttest 0.3.0,
# parameterized 0.9.0, kgb 7.3, tabulate 0.10.0, executorch-numpy-runtime 1.4.0 (the torch-free
# runtime that runs XNNPACK delegates beside CUDA ones under torch 2.11); pluggy, attrs, flatbuffers, hypothesis were
# already there.
# Usage: source bench/gpu_setup.sh
# Then: python3 bench/gpu/gpu_check.py, or python3 -m pytest tests/test_gpu.py -m gpu -p no:hydra_pytest
# -o addopts="" (hydra-core's own pytest plugin fails to import with the carried antlr4 4.13).
if [ ! -d /tmp/site/executorch ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || return 1
fi
# Optional sets, carried only by the runs that need them (the carry limit is 64 MiB):
# .whl-llama/ holds export_llama's tokenizer wheels (pytorch_tokenizers, tokenizers,
# sentencepiece, tiktoken, regex); .whl-ray/ Ray 2.60's cp312 wheel unpacked without its
# jars, rllib, tune, train, serve, llm, data and dashboard/client, its binaries stripped
# (79 MB as a wheel, 25 MB as that .tar.xz) and
# its dependencies' wheels (`pip download ray==2.60.0 --python-version 3.12 --only-binary=:all:`).
if [ -d .whl-llama ] && [ ! -d /tmp/site/tokenizers ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site .whl-llama/*.whl || return 1
fi
if [ -d .whl-ray ] && [ ! -d /tmp/site/ray ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site .whl-ray/*.whl || return 1
  tar -xJf .whl-ray/ray-*.tar.xz -C /tmp/site || return 1
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade \
  --target /tmp/site . 2>&1 | grep -v "already exists" || true
export PYTHONPATH=/tmp/site
