#!/usr/bin/env bash
# Build ExecuTorch's C++ runtime with the CUDA (AOTInductor) and XNNPACK backends, portable
# kernels, the module/data_loader/flat_tensor/named_data_map/tensor extensions, and
# composer_et_runner (runner/runner.cpp), with CMake and Ninja, from the source
# prepare_source.sh made (bench/et_runtime/src/et-src.tar.xz, carried to the GPU machine).
#
# Run from the repository root, on the GPU machine:
#   bash bench/et_runtime/build.sh            # -> $ET_ROOT/build/composer_runner/composer_et_runner
# Environment:
#   ET_ROOT=/tmp/etb        where the source is unpacked and built (fixed, so a carried-back
#                           build directory resumes with the same absolute paths)
#   ET_CUDA=ON              OFF builds the CPU part only (a check on a machine without CUDA)
#   ET_VULKAN=OFF           ON adds ExecuTorch's Vulkan backend (vulkan_backend, linked whole-archive
#                           into the runner through executorch_backends). Needs glslc on PATH (or
#                           GLSLC=/path) and PyYAML for $PYTHON: `source bench/et_runtime/vulkan/setup.sh`
#                           first (vulkan/README.md). OFF (the default) builds exactly what it did before.
#   ET_DEADLINE=<epoch s>   stop ninja at this time (a 10-minute device command): the build
#                           resumes where it stopped when build.sh runs again over the same
#                           $ET_ROOT, e.g. after `pack` and `unpack` below
#   ET_JOBS=$(nproc)
# Subcommands:
#   build.sh pack DIR       tar+xz the build directory into DIR/etbuild.tar.xz.NN (15 MiB pieces)
#   build.sh unpack DIR     restore it from those pieces before building again
# It prints one "piece <name> <seconds>" line per piece, and "runner <path>" at the end.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
ET_ROOT="${ET_ROOT:-/tmp/etb}"
SRC="$ET_ROOT/executorch"
BUILD="$ET_ROOT/build"
ET_CUDA="${ET_CUDA:-ON}"
ET_VULKAN="${ET_VULKAN:-OFF}"
JOBS="${ET_JOBS:-$(nproc)}"

if [ "${1:-}" = pack ]; then
  mkdir -p "$2"
  tar -C "$ET_ROOT" -cf - build | xz -T0 -1 | split -b 15M -d - "$2/etbuild.tar.xz."
  ls -l "$2"
  exit 0
fi
if [ "${1:-}" = unpack ]; then
  mkdir -p "$ET_ROOT"
  cat "$2"/etbuild.tar.xz.* | xz -d -T0 | tar -C "$ET_ROOT" -xf -
  exit 0
fi

for dir in /usr/local/cuda-13.0/bin /opt/torch/.venv/bin; do
  [ -d "$dir" ] && export PATH="$dir:$PATH"
done
PYTHON="${PYTHON:-$(command -v python3)}"
stamp() { date +%s.%N; }
piece() {  # piece NAME COMMAND...: run, time, print; a failure (3: the deadline) ends build.sh
  local name="$1" start rc=0
  shift
  start="$(stamp)"
  "$@" || rc=$?
  awk -v s="$start" -v e="$(stamp)" -v n="$name" -v rc="$rc" \
    'BEGIN { printf "piece %s %.1f s%s\n", n, e - s, (rc ? " (stopped, rc " rc ")" : "") }'
  [ "$rc" -eq 0 ] || exit "$rc"
}
ninja_until_deadline() {  # build targets; with ET_DEADLINE, stop cleanly at it
  if [ -n "${ET_DEADLINE:-}" ]; then
    local left=$(( ${ET_DEADLINE%.*} - $(date +%s) ))
    if [ "$left" -le 5 ]; then echo "deadline reached before: $*"; return 3; fi
    timeout --signal=INT "$left" ninja -C "$BUILD" -j "$JOBS" "$@" || {
      local rc=$?
      [ $rc -eq 124 ] && echo "deadline reached during: $*" && return 3
      return $rc
    }
  else
    ninja -C "$BUILD" -j "$JOBS" "$@"
  fi
}

unpack_source() {
  if [ ! -f "$SRC/.composer_prepared" ]; then
    mkdir -p "$ET_ROOT"
    tar -xJf "$here/src/et-src.tar.xz" -C "$ET_ROOT"
    ( cd "$SRC"
      patch -p1 --quiet <"$here/patches/cuda_backend.patch"
      cp "$here/patches/composer_fqn_manifest.h" backends/cuda/runtime/
      cp -r "$here/runner" composer_runner
      printf '\n# composer bench: the runner, linked like executor_runner\nadd_subdirectory(composer_runner)\n' >>CMakeLists.txt
      touch .composer_prepared )
  fi
  if [ "$ET_VULKAN" = ON ] && [ ! -f "$SRC/backends/vulkan/CMakeLists.txt" ]; then
    # A tree unpacked earlier from a tarball without the Vulkan backend: add it.
    tar -xJf "$here/src/et-src.tar.xz" -C "$ET_ROOT" executorch/backends/vulkan
    [ -f "$SRC/backends/vulkan/CMakeLists.txt" ] || {
      echo "et-src.tar.xz has no backends/vulkan: rerun prepare_source.sh here"; return 1; }
  fi
}

configure() {
  local cuda_args=()
  if [ "$ET_CUDA" = ON ]; then
    # Hopper; TORCH_CUDA_ARCH_LIST is what backends/cuda/CMakeLists.txt reads (9.0 -> 90-real,
    # 90-virtual).
    export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
    cuda_args=(-DEXECUTORCH_BUILD_CUDA=ON -DCMAKE_CUDA_COMPILER="$(command -v nvcc)")
  fi
  if [ "$ET_VULKAN" = ON ]; then
    local glslc="${GLSLC:-$(command -v glslc || true)}"
    [ -n "$glslc" ] || { echo "ET_VULKAN=ON: no glslc (source bench/et_runtime/vulkan/setup.sh)"; return 1; }
    "$PYTHON" -c "import yaml" || { echo "ET_VULKAN=ON: $PYTHON cannot import yaml"; return 1; }
    echo "glslc: $glslc ($("$glslc" --version 2>&1 | head -1))"
    # gen_vulkan_spv.py (a build step) compiles every shader variant with glslc, on all cores.
    cuda_args+=(-DEXECUTORCH_BUILD_VULKAN=ON -DGLSLC_PATH="$glslc"
                -DEXECUTORCH_VULKAN_SHADER_COMPILE_NTHREADS="$JOBS")
  fi
  cmake -S "$SRC" -B "$BUILD" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    -DPYTHON_EXECUTABLE="$PYTHON" \
    -DEXECUTORCH_BUILD_XNNPACK=ON \
    -DEXECUTORCH_XNNPACK_ENABLE_KLEIDI=OFF \
    -DEXECUTORCH_BUILD_EXTENSION_MODULE=ON \
    -DEXECUTORCH_BUILD_EXTENSION_DATA_LOADER=ON \
    -DEXECUTORCH_BUILD_EXTENSION_FLAT_TENSOR=ON \
    -DEXECUTORCH_BUILD_EXTENSION_NAMED_DATA_MAP=ON \
    -DEXECUTORCH_BUILD_EXTENSION_TENSOR=ON \
    -DEXECUTORCH_BUILD_EXECUTOR_RUNNER=OFF \
    -DEXECUTORCH_ENABLE_LOGGING=ON \
    -DEXECUTORCH_LOG_LEVEL=Info \
    "${cuda_args[@]}" >"$ET_ROOT/configure.log" 2>&1 || {
      tail -60 "$ET_ROOT/configure.log"; return 1; }
  grep -E "CUDA architectures|Found CUDAToolkit|Found Torch|Build files" "$ET_ROOT/configure.log" || true
}

piece unpack_and_patch unpack_source
if [ ! -f "$BUILD/build.ninja" ] || { [ "$ET_VULKAN" = ON ] &&
     ! grep -q '^EXECUTORCH_BUILD_VULKAN:BOOL=ON' "$BUILD/CMakeCache.txt"; }; then
  piece configure configure
fi
# Pieces, in dependency order (each is resumable: ninja redoes only what is missing).
piece flatc_flatcc ninja_until_deadline flatbuffers_ep flatcc_ep
piece xnnpack ninja_until_deadline XNNPACK xnnpack_backend
piece portable_kernels ninja_until_deadline portable_ops_lib
if [ "$ET_CUDA" = ON ]; then
  piece cuda_backend ninja_until_deadline aoti_cuda_backend
fi
if [ "$ET_VULKAN" = ON ]; then
  # The shaders (gen_vulkan_spv.py + glslc -> vulkan_compute_shaders/spv.cpp), then the backend.
  piece vulkan_shaders ninja_until_deadline vulkan_compute_shaders/spv.cpp
  piece vulkan_backend ninja_until_deadline vulkan_backend
fi
piece runner ninja_until_deadline composer_et_runner
echo "runner $BUILD/composer_runner/composer_et_runner"
