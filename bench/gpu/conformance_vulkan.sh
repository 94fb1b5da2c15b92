#!/usr/bin/env bash
# On the GPU machine: ExecuTorch's backend test suite over vulkan+xnnpack, the suite's plain
# flow beside composer's, every program run in ExecuTorch's C++ runner built with the Vulkan
# backend, on NVIDIA's Vulkan driver (issue 57). Run from the repository root.
#
#   bash bench/gpu/conformance_vulkan.sh build   # carry bench/et_runtime/src, bench/et_runtime/vulkan/debs
#       builds the runner (Vulkan + XNNPACK + portable, no CUDA) and writes $OUT/vk_runner.tar.xz:
#       copy it to bench/et_runtime/carry/ for the runs
#   [SUITE=operators|models] [FLOWS=vulkan+xnnpack] [JOBS=15] [RUN_SECONDS=520] \
#   bash bench/gpu/conformance_vulkan.sh run NAME [pytest args...]
#       # carry .whl, .whl-conf, bench/et_runtime/carry/vk_runner.tar.xz, bench/et_runtime/vulkan/debs
#       runs the suite SUITE (executorch.backends.test.suite.SUITE; default operators) with
#       composer's flows FLOWS (--composer-flows; default vulkan+xnnpack; e.g. xnnpack), each beside
#       the suite's plain flow; pytest ARGS, e.g. -k EXPR. SUITE may name a module too:
#       SUITE=models.test_torchvision (without torchaudio installed, SUITE=models stops at
#       collection: test_torchaudio.py fails to import, whatever -k selects). The JSON report
#       in $OUT/NAME, each case's verdict in $OUT/NAME.log; JOBS xdist workers; RUN_SECONDS
#       stops it (SIGINT, report kept).
#       The runner is the Vulkan one either way (Vulkan + XNNPACK + portable); it runs plain
#       XNNPACK programs too.
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
  # Each worker's torch on its share of the cores, as `composer conformance --jobs` sets it:
  # with 8 workers of 16 threads each on 16 cores (session 31), one proof of mobilenet_v2 took
  # 207 s and plain's whole case 84 s. The proof's time holds its float64 eager reference,
  # which oversubscribed threads slow most (docs/conformance.md: 0.09 s became 99 s).
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / ${JOBS:-15} > 0 ? $(nproc) / ${JOBS:-15} : 1 ))}
  # hydra-core's pytest plugin fails to import with the carried antlr4 (gpu_setup.sh).
  export PYTEST_ADDOPTS="-p no:hydra_pytest"
  # pytest itself, not `composer conformance`: -v logs each case as it ends, which stays
  # where the deadline stops the run before the JSON report is written (composer's CLI,
  # interrupted, wrote nothing: 9 device-minutes of cases lost, session 28).
  mkdir -p "$OUT/$NAME" && printf '[pytest]\n' >"$OUT/$NAME/pytest.ini"
  started=$(date +%s)
  echo "suite ${SUITE:-operators}, flows ${FLOWS:-vulkan+xnnpack}, ${JOBS:-15} workers of $OMP_NUM_THREADS threads, ${RUN_SECONDS:-520} s"
  timeout -s INT "${RUN_SECONDS:-520}" python3 -m pytest \
    --pyargs "executorch.backends.test.suite.${SUITE:-operators}" -c "$OUT/$NAME/pytest.ini" \
    --rootdir "$OUT/$NAME" -p no:cacheprovider --composer-flows="${FLOWS:-vulkan+xnnpack}" \
    --json-report --json-report-file="$OUT/$NAME/report.json" -v --tb=no --disable-warnings \
    -rN -n "${JOBS:-15}" "$@" >"$OUT/$NAME.log" 2>&1
  echo "exit $? after $(($(date +%s) - started)) s"
  grep -c "PASSED\|FAILED\|SKIPPED" "$OUT/$NAME.log"
  tail -3 "$OUT/$NAME.log"
  ;;
*)
  echo "usage: $0 build | run NAME [args]"
  exit 2
  ;;
esac
