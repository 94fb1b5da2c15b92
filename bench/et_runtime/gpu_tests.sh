#!/usr/bin/env bash
# Issue 26 item 4, one device call (10 minutes at most), from the repository root on the GPU
# machine: build ExecuTorch's C++ runtime (build.sh; skipped where a carried or earlier runner
# is there) while the GPU tests of composer's libtorch host run without it, then, with
# $COMPOSER_ET_RUNNER naming the runner:
#   (b) composer lower zoo:llama_decoder --backends xnnpack,cuda -o x.pte --verify
#       composer run x.pte --compare zoo:llama_decoder   (and again with --bench 100)
#   (c) Composition.verify() of that program, from Python
#   (a) python3 -m pytest tests/test_gpu.py tests/test_cpp_runtime.py -m gpu
# Logs go to $OUT (at most 8 files); the runner too (runner.tar.xz), for a later call to carry
# as bench/et_runtime/carry/. Carry bench/et_runtime/src and .whl (see README.md here), and
# .whl-llama for export_llama's test (its tokenizers).
#   set -o pipefail; LIMIT=570 bash bench/et_runtime/gpu_tests.sh 2>&1 | tee $OUT/log
# PYTEST_ONLY=1 skips (b) and (c) (about 230 s with CUDA's autotuning), leaving the whole call
# to (a), which needs about 560 s with the runner (session 24: 320 s for five of its tests);
# PYTEST_K="..." runs only the tests pytest's -k selects.
set -uo pipefail
start=$(date +%s)
LIMIT="${LIMIT:-570}"
left() { echo $(( start + LIMIT - $(date +%s) )); }
at_most() { local l; l=$(( $(left) - $1 )); echo $(( l > 10 ? l : 10 )); }  # seconds, keeping $1
here=bench/et_runtime
carry=$here/carry
repo=$(pwd)
OUT="${OUT:-/tmp/out}"
R=/tmp/results
mkdir -p "$OUT" "$R"
export ET_ROOT=/tmp/etb COMPOSER_CACHE_DIR=/tmp/composer_cache PYTHONUNBUFFERED=1
runner=$ET_ROOT/build/composer_runner/composer_et_runner
PYTEST=(python3 -m pytest -p no:hydra_pytest -p no:cacheprovider -o addopts="" -m gpu -v -rA
        --durations=12)
echo "gpu_tests: $(date -u +%FT%TZ) $(nproc) cores; $(nvidia-smi -L | head -1); git $(git rev-parse --short HEAD 2>/dev/null)"

if [ ! -x "$runner" ] && [ -f "$carry/runner.tar.xz" ]; then
  tar -xJf "$carry/runner.tar.xz" -C / && echo "runner: carried from an earlier call"
fi

t0=$(date +%s)
source bench/gpu_setup.sh >"$R/setup.log" 2>&1 || { echo "gpu_setup failed"; tail "$R/setup.log"; }
echo "setup (wheels + composer into /tmp/site): $(( $(date +%s) - t0 )) s"
python3 -c "import torch, executorch; print('torch', torch.__version__, 'executorch', executorch.__version__ if hasattr(executorch, '__version__') else '?')"

host_pid=""
if [ ! -x "$runner" ]; then
  # composer's libtorch host (no runner named) while the runtime builds; it also fills
  # composer's cache for (a).
  ( env -u COMPOSER_ET_RUNNER timeout "$(at_most 200)" nice -n 5 "${PYTEST[@]}" tests/test_gpu.py \
      >"$R/pytest_gpu_libtorch_host.log" 2>&1; echo "pytest (libtorch host) exit $?" \
      >>"$R/pytest_gpu_libtorch_host.log" ) &
  host_pid=$!
  t0=$(date +%s)
  ET_DEADLINE=$(( start + LIMIT - 60 )) bash $here/build.sh >"$R/build.log" 2>&1
  echo "build.sh exit $? in $(( $(date +%s) - t0 )) s"
  grep -E "^piece|^runner|deadline|error:" "$R/build.log" | head -40
fi
host_tests() {
  if [ -n "$host_pid" ]; then
    wait "$host_pid"
    echo "--- pytest tests/test_gpu.py -m gpu, no \$COMPOSER_ET_RUNNER (composer's libtorch host; $(left) s left):"
    grep -E " PASSED| FAILED| ERROR| SKIPPED|passed|failed|exit" "$R/pytest_gpu_libtorch_host.log" | tail -25
    host_pid=""
  fi
}

if [ -x "$runner" ]; then
  export COMPOSER_ET_RUNNER=$runner
fi
# The Vulkan runner's tests of (a), where it and bench/et_runtime/vulkan/debs are carried.
source bench/et_runtime/vulkan/use_runner.sh
if [ -x "$runner" ] && [ -z "${PYTEST_ONLY:-}" ]; then
  echo "--- (b) $(left) s left; COMPOSER_ET_RUNNER=$COMPOSER_ET_RUNNER"
  mkdir -p /tmp/b
  ( cd /tmp/b
    set -x
    timeout "$(at_most 170)" python3 -m composer.cli lower zoo:llama_decoder --backends xnnpack,cuda -o x.pte --verify
    echo "lower exit $?"
    timeout "$(at_most 160)" python3 -m composer.cli run x.pte --compare zoo:llama_decoder
    echo "run exit $?"
    timeout "$(at_most 150)" python3 -m composer.cli run x.pte --compare zoo:llama_decoder --bench 100
    echo "run --bench exit $?"
    ls -l /tmp/b
  ) 2>&1 | tee "$R/lower_run_verify.log"
  echo "--- (c) $(left) s left: Composition.verify()"
  timeout "$(at_most 140)" python3 - <<'EOF2' 2>&1 | tee -a "$R/lower_run_verify.log"
import composer
from composer.models import zoo

model, inputs = zoo.load("llama_decoder")
composition = composer.compose(model, "xnnpack,cuda", inputs)  # composer's cache: (b)'s program
print("delegates:", sorted(composition.delegate_backend_ids()), "from cache:", composition.from_cache)
print("plan.proof:", composition.plan.proof)
result = composition.verify()
print("verify():", result)
print("executor:", result.executor, "| max_abs_error:", result.max_abs_error, "| ok:", result.ok)
EOF2
fi
if [ -x "$runner" ]; then
  host_tests
  echo "--- (a) $(left) s left: pytest tests/test_gpu.py tests/test_cpp_runtime.py -m gpu"
  timeout "$(at_most 15)" "${PYTEST[@]}" ${PYTEST_K:+-k "$PYTEST_K"} tests/test_gpu.py tests/test_cpp_runtime.py \
    >"$R/pytest_gpu_et_runtime.log" 2>&1
  pytest_rc=$?
  echo "pytest exit $pytest_rc" | tee -a "$R/pytest_gpu_et_runtime.log"
  grep -E " PASSED| FAILED| ERROR| SKIPPED|passed|failed|executor|verify:|proof:|latency in|steps vs eager|Error" \
    "$R/pytest_gpu_et_runtime.log" | tail -60
else
  host_tests
  echo "no runner: (a) with the runner, (b), (c) not run"
fi

# What comes back (at most 8 files).
if [ ! -x "$runner" ] && [ -d "$ET_ROOT/build" ]; then
  bash $here/build.sh pack "$OUT"  # for the next call: bench/et_runtime/carry/
fi
cp "$R"/pytest_gpu_et_runtime.log "$R"/pytest_gpu_libtorch_host.log "$R"/lower_run_verify.log "$OUT"/ 2>/dev/null
if [ -x "$runner" ]; then
  libs=$(ldd "$runner" | awk '$3 ~ /^\/tmp\/etb/ {print $3}')
  tar -cf - "$runner" $libs 2>/dev/null | xz -T0 -6 >"$OUT/runner.tar.xz"
fi
cp "$ET_ROOT/configure.log" "$R/" 2>/dev/null
tar -C /tmp -cf - results 2>/dev/null | xz -T0 -6 >"$OUT/results.tar.xz"
ls -l "$OUT"
echo "gpu_tests: done, $(left) s of $LIMIT left"
exit "${pytest_rc:-0}"  # the suite's verdict is the call's
