#!/usr/bin/env bash
# Run HERE (not on the GPU machine): make a trimmed, compressed ExecuTorch source tree that the
# GPU machine (no network) builds with build.sh. Output: bench/et_runtime/src/ (ignored via
# .git/info/exclude) holding et-src.tar.xz and SOURCE.txt (what went in, at which commit).
#
# Source: the `fetch github:pytorch/executorch` mirror. The 1.5.1 wheel's own commit
# (executorch/version.py git_version 3b606839...) is not in it and it has no release/1.5 branch;
# the closest is `main` of 2026-08-22 (cff6f4dd, version.txt 1.5.0). Its runtime schema
# (program.fbs, flat_tensor.fbs, scalar_type.fbs) and XNNPACK schemas are byte-identical to the
# wheel's; its CUDA backend reads an older delegate payload than the wheel writes (see
# patches/README.md), which build.sh patches in.
#
# Submodules, each at the commit the superproject pins (git ls-tree <commit> <path>), from the
# `fetch github:<owner>/<repo>` mirrors, except pthreadpool: its pinned a56dcd79 (2026) is not
# in the mirror, whose newest is main 0e6ca137 (2025-10-20); every pthreadpool_* symbol the
# pinned XNNPACK and extension/threadpool use is declared there (checked below).
#
# The Vulkan backend (build.sh ET_VULKAN=ON; see vulkan/README.md) is included by default: its
# CMakeLists/cmake, runtime/ (C++ sources, GLSL shaders and their .yaml variants, and
# gen_vulkan_spv.py, the one Python file its build runs), serialization/schema.fbs, and its
# three submodules at their pins (Vulkan-Headers: C headers only; volk: volk.c/h;
# VulkanMemoryAllocator: include/). About 0.6 MB more in the tarball.
# ET_VULKAN=0 (or OFF) leaves it out.
#
# Usage: bench/et_runtime/prepare_source.sh   [MIRRORS=/work/.mirror] [ET_VULKAN=0]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
M="${MIRRORS:-/work/.mirror}"
ET_REV="${ET_REV:-cff6f4dd32e630945b7188512c1f2b4f102b05ad}"   # main, 2026-08-22
out="$here/src"
work="$(mktemp -d /tmp/et_prepare.XXXXXX)"
trap 'rm -rf "$work"' EXIT
tree="$work/executorch"
mkdir -p "$tree" "$out"

et=(git -C "$M/pytorch+executorch/repo")
# What a CMake build of the runtime, portable kernels, XNNPACK, CUDA (AOTI) backends and the
# module/data_loader/flat_tensor/named_data_map/tensor/threadpool extensions reads.
paths=(CMakeLists.txt CMakePresets.json Test.cmake version.txt tools runtime kernels schema codegen
       configurations devtools shim_et extension third-party/CMakeLists.txt
       backends/aoti backends/cuda backends/xnnpack backends/backends.bzl)
case "${ET_VULKAN:-1}" in 0|OFF|off) ET_VULKAN=0 ;; *) ET_VULKAN=1 ;; esac
if [ "$ET_VULKAN" = 1 ]; then
  paths+=(backends/vulkan/CMakeLists.txt backends/vulkan/cmake backends/vulkan/runtime
          backends/vulkan/serialization/schema.fbs)
fi
# git archive of the whole tree fails on blobs the mirror lacks; these paths are complete.
# One path at a time, by its own tree or blob: git 2.39 walks (and fails on) the whole tree
# even with a pathspec.
for p in "${paths[@]}"; do
  if [ "$("${et[@]}" cat-file -t "$ET_REV:$p")" = tree ]; then
    "${et[@]}" archive --format=tar --prefix="$p/" "$ET_REV:$p" | tar -x -C "$tree"
  else
    mkdir -p "$tree/$(dirname "$p")" && "${et[@]}" show "$ET_REV:$p" >"$tree/$p"
  fi
done
# Trim what no CMake build reads: Python, tests, docs, other extensions' models.
rm -rf "$tree/extension/"{android,apple,wasm,llm/apple,benchmark,training/examples} \
       "$tree/backends/cuda/"{tests,benchmarks,triton,passes} "$tree/backends/xnnpack/test" \
       "$tree/kernels/test/"*.py "$tree/devtools/"{visualization,inspector,scripts}
find "$tree" \( -name '*.py' -o -name '*.md' -o -name '*.ipynb' -o -name '*.png' -o -name '*.jpg' \
     -o -name '*.pte' -o -name '*.bin' \) -not -path '*/codegen/*' -not -path '*/tools/*' \
     -not -path '*/shim_et/*' -not -path '*/third-party/*' \
     -not -path '*/backends/vulkan/runtime/gen_vulkan_spv.py' -delete

sub() {  # sub <superproject path> <mirror dir> [override commit]
  local path="$1" mirror="$M/$2/repo" pin commit
  pin="$("${et[@]}" ls-tree "$ET_REV" "$path" | awk '{print $3}')"
  commit="${3:-$pin}"
  mkdir -p "$tree/$path"
  git -C "$mirror" archive --format=tar "$commit" | tar -x -C "$tree/$path"
  echo "$path  pinned $pin  used $commit  ($2, $(git -C "$mirror" log -1 --format=%cs "$commit"))" \
    >>"$work/SOURCE.txt"
}
echo "executorch $ET_REV ($("${et[@]}" log -1 --format='%cs %s' "$ET_REV"))" >"$work/SOURCE.txt"
sub third-party/flatbuffers google+flatbuffers
sub third-party/flatcc dvidelabs+flatcc
sub third-party/gflags gflags+gflags
# nlohmann/json: its pin ac0133ea (2025) is not in the mirror; header-only and read by no target
# built here (CoreML/LLM runners), but third-party/CMakeLists.txt adds it unconditionally.
sub third-party/json nlohmann+json v3.11.3
sub backends/xnnpack/third-party/XNNPACK google+XNNPACK
sub backends/xnnpack/third-party/cpuinfo pytorch+cpuinfo
sub backends/xnnpack/third-party/FXdiv Maratyszcza+FXdiv
sub backends/xnnpack/third-party/FP16 Maratyszcza+FP16
PTHREADPOOL_REV="$(git -C "$M/google+pthreadpool/repo" rev-parse main)"
sub backends/xnnpack/third-party/pthreadpool google+pthreadpool "$PTHREADPOOL_REV"
subfiles() {  # subfiles <superproject path> <mirror dir> <ERE of the files to take>: like sub,
  # blob by blob (these mirrors lack some blobs of files no build reads, e.g. vulkan_*.hpp)
  local path="$1" mirror="$M/$2/repo" re="$3" pin f
  pin="$("${et[@]}" ls-tree "$ET_REV" "$path" | awk '{print $3}')"
  git -C "$mirror" ls-tree -r --name-only "$pin" | grep -E "$re" | while read -r f; do
    mkdir -p "$tree/$path/$(dirname "$f")"
    git -C "$mirror" cat-file blob "$pin:$f" >"$tree/$path/$f"
  done
  echo "$path  pinned $pin  used $pin  ($2, $(git -C "$mirror" log -1 --format=%cs "$pin"); only ${re})" \
    >>"$work/SOURCE.txt"
}
if [ "$ET_VULKAN" = 1 ]; then
  # What the build reads: the C API headers (the runtime includes vulkan/vulkan.h, no
  # vulkan.hpp), volk.{c,h}, vk_mem_alloc.h; plus the licenses.
  subfiles backends/vulkan/third-party/Vulkan-Headers KhronosGroup+Vulkan-Headers \
    '^(include/(vulkan|vk_video)/[^/]+\.h|LICENSE\.md)$'
  subfiles backends/vulkan/third-party/volk zeux+volk '^(volk\.[ch]|LICENSE\.md)$'
  subfiles backends/vulkan/third-party/VulkanMemoryAllocator \
    GPUOpen-LibrariesAndSDKs+VulkanMemoryAllocator '^(include/vk_mem_alloc\.h|LICENSE\.txt)$'
fi

# The substituted pthreadpool must declare every pthreadpool_* the others call.
grep -rhoE 'pthreadpool_[a-z0-9_]+' "$tree/backends/xnnpack/third-party/XNNPACK/src" \
  "$tree/backends/xnnpack/third-party/XNNPACK/include" "$tree/extension/threadpool" | sort -u >"$work/used"
grep -rhoE 'pthreadpool_[a-z0-9_]+' "$tree/backends/xnnpack/third-party/pthreadpool/include" \
  | sort -u >"$work/have"
missing="$(comm -23 "$work/used" "$work/have" | grep -v '_t$' || true)"
if [ -n "$missing" ]; then echo "pthreadpool lacks: $missing" >&2; exit 1; fi

# Trim the submodules: tests, benchmarks, docs, other architectures' build-only extras.
x="$tree/backends/xnnpack/third-party/XNNPACK"
rm -rf "$x/"{test,bench,eval,litert,ynnpack,.github} "$tree/third-party/flatbuffers/"{docs,tests/ts,android,dart,kotlin,swift} \
       "$tree/third-party/flatcc/"{doc,samples} "$tree/third-party/json/"{tests,docs} "$tree/backends/xnnpack/third-party/cpuinfo/"{test,bench}

( cd "$work" && tar --sort=name -cf - executorch | xz -T0 -6 >"$out/et-src.tar.xz" )
cp "$work/SOURCE.txt" "$out/SOURCE.txt"
du -sh "$tree" | sed 's/^/unpacked: /'
ls -l "$out"
cat "$out/SOURCE.txt"
