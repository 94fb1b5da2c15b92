#!/usr/bin/env bash
# One device call of gpu_wins.py: set up (bench/gpu_setup.sh, the CUDA runner carried in
# bench/et_runtime/carry/runner.tar.xz), compose MODELS in processes of their own and time them;
# wins.jsonl and the compose logs come back in $OUT. Carry .whl and bench/et_runtime/carry
# (and bench/et_runtime/vulkan/debs for Vulkan stacks).
#   bash bench/gpu/wins_device.sh MODELS [gpu_wins.py device options]
# On a machine still warm from an earlier call, /tmp/wins keeps that call's programs and caches:
# `time` then times them again beside the new ones (how session 23 timed most models 2-3 times).
# --limit bounds each model's composing; timing comes after, so leave it room in the call's
# 600 s (a CUDA compose of a CNN took 379 s and more on an H200, Triton autotuning).
set -uo pipefail
models="$1"; shift
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
tar -xJf bench/et_runtime/carry/runner.tar.xz -C / || exit 1
source bench/gpu_setup.sh >/tmp/setup.log 2>&1 || { tail /tmp/setup.log; exit 1; }
export COMPOSER_ET_RUNNER=/tmp/etb/build/composer_runner/composer_et_runner
source bench/et_runtime/vulkan/use_runner.sh  # Vulkan stacks: carry bench/et_runtime/vulkan/debs
echo "wins_device: $(date -u +%FT%TZ) $(nproc) cores; $(nvidia-smi -L | head -1)"
# The records as they come, so that a call cut by its 10 minutes still brings back what it
# composed and timed (session 25's came back empty: composing took 470 of its 600 s).
mkdir -p /tmp/wins
( while sleep 10; do cp /tmp/wins/wins.jsonl "$OUT/" 2>/dev/null; done ) &
copier=$!
python3 bench/gpu/gpu_wins.py device --models "$models" --out /tmp/wins "$@"
kill "$copier" 2>/dev/null
cp /tmp/wins/wins.jsonl "$OUT/" 2>/dev/null
tar -cJf "$OUT/logs.tar.xz" -C /tmp/wins $(cd /tmp/wins && ls compose_*.log) 2>/dev/null
true
