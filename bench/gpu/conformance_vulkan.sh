#!/usr/bin/env bash
# On the GPU machine: ExecuTorch's backend test suite over vulkan+xnnpack, the suite's plain
# flow beside composer's, every program run in ExecuTorch's C++ runner built with the Vulkan
# backend, on NVIDIA's Vulkan driver (issue 57). Run from the repository root.
#
#   bash bench/gpu/conformance_vulkan.sh build   # carry bench/et_runtime/src, bench/et_runtime/vulkan/debs
#       builds the runner (Vulkan + XNNPACK + portable, no CUDA) and writes $OUT/vk_runner.tar.xz:
#       copy it to bench/et_runtime/carry/ for the runs
#   bash bench/gpu/conformance_vulkan.sh run NAME [composer conformance args...]
#       # carry .whl, .whl-conf, bench/et_runtime/carry, bench/et_runtime/vulkan/debs
#       runs `composer conformance --stack vulkan,xnnpack ARGS` with the report in $OUT/NAME
set -u
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
case "${1:-}" in
build)
  export ET_ROOT=/tmp/etb
  source bench/et_runtime/vulkan/setup.sh >"$OUT/vk_setup.log" 2>&1
  tail -3 "$OUT/vk_setup.log"
  ET_CUDA=OFF ET_VULKAN=ON ET_DEADLINE=$(($(date +%s) + ${BUILD_SECONDS:-480})) \
    bash bench/et_runtime/build.sh 2>&1 | tail -8
  R=$ET_ROOT/build/composer_runner/composer_et_runner
  [ -x "$R" ] || { echo "no runner built"; exit 1; }
  echo "VulkanBackend in the runner: $(grep -a -o VulkanBackend "$R" | wc -l)"
  tar -C / -cJf "$OUT/vk_runner.tar.xz" "${R#/}"
  ls -l "$OUT/vk_runner.tar.xz"
  ;;
run)
  NAME=$2
  shift 2
  source bench/gpu_setup.sh >/tmp/setup.log 2>&1 || { tail -5 /tmp/setup.log; exit 1; }
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl-conf/*.whl
  source bench/et_runtime/vulkan/use_runner.sh
  [ -n "${COMPOSER_VULKAN_RUNNER:-}" ] || { echo "no Vulkan runner"; exit 1; }
  # The suite runs every flow's programs in this runner; composer's proof does too.
  export COMPOSER_ET_RUNNER=$COMPOSER_VULKAN_RUNNER
  # hydra-core's pytest plugin fails to import with the carried antlr4 (gpu_setup.sh).
  export PYTEST_ADDOPTS="-p no:hydra_pytest"
  started=$(date +%s)
  python3 -m composer.cli conformance --stack vulkan,xnnpack --report-dir "$OUT/$NAME" "$@" \
    >"$OUT/$NAME.log" 2>&1
  echo "exit $? after $(($(date +%s) - started)) s"
  grep -v "^\s*$" "$OUT/$NAME.log" | tail -40
  ;;
*)
  echo "usage: $0 build | run NAME [args]"
  exit 2
  ;;
esac
