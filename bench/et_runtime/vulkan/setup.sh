# Vulkan tools for the GPU machine (no network, no Vulkan loader, no glslc), from the files
# carried in bench/et_runtime/vulkan/debs/ (and, optionally, bench/et_runtime/vulkan/lavapipe/).
# Source it from the repository root:
#   source bench/et_runtime/vulkan/setup.sh        # unpack, put glslc on PATH, diagnose
#   vk_use nvidia | nvidia-egl | lavapipe          # pick the Vulkan driver (ICD) for what runs next
#   vk_diagnose                                    # again: which ICD gives a device, and why not
# What it sets up (everything under $VK, default /tmp/vk):
#   $VK/bin/glslc      glslc 2025.2 (Debian 13 shaderc; the Vulkan backend's shaders need
#                      GL_EXT_integer_dot_product, which Debian 12's glslc 2023.2 lacks). It
#                      needs glibc >= 2.38: with an older glibc the wrapper runs it under the
#                      carried Debian 13 glibc's own ld.so.
#   $VK/bin/vulkaninfo vulkaninfo 1.3.239 (Debian 12)
#   $VK/lib            libvulkan.so.1 (the loader, Debian 12, 1.3.239; ExecuTorch's volk dlopens
#                      it), plus the X11/wayland libraries vulkaninfo and libGLX_nvidia need that
#                      this system lacks (only those: system copies win). On LD_LIBRARY_PATH.
#   $VK/icd/*.json     nvidia.json (the system's nvidia_icd.json), nvidia-egl.json (the same ICD
#                      through libEGL_nvidia.so.0, the headless variant), lavapipe.json (Mesa's
#                      CPU driver, absolute path; only with vulkan/lavapipe/ carried)
#   PyYAML             from the carried wheel into $VK/py (on PYTHONPATH) if python3 lacks it
#                      (gen_vulkan_spv.py, run by the build, imports yaml)
# The diagnosis goes to $VK/diagnose.log; a summary is printed.
VK="${VK:-/tmp/vk}"
_vk_here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
_vk_debs="$_vk_here/debs"
_vk_multi=usr/lib/x86_64-linux-gnu

_vk_has_soname() {  # does the system (ld.so.cache) provide this soname?
  ldconfig -p 2>/dev/null | grep -q "^[[:space:]]*$1 (.*x86-64"
}

_vk_unpack() {
  [ -f "$VK/.unpacked" ] && return 0
  rm -rf "$VK" && mkdir -p "$VK"/{bin,lib,icd,root,glslc,libc13}
  local deb
  for deb in "$_vk_debs"/*.deb; do
    case "$(basename "$deb")" in
      glslc_*|libshaderc1_*) dpkg-deb -x "$deb" "$VK/glslc" ;;
      libc6_*|libstdc++6_*|libgcc-s1_*) dpkg-deb -x "$deb" "$VK/libc13" ;;   # Debian 13, for glslc only
      *) dpkg-deb -x "$deb" "$VK/root" ;;                                     # Debian 12
    esac
  done
  # The loader, and whatever of the loader's/vulkaninfo's/libGLX_nvidia's X11 libraries the
  # system lacks (system copies are newer: keep them first).
  local f so
  for f in "$VK/root/$_vk_multi"/*.so.*; do
    so="$(basename "$f")"
    case "$so" in *.so.[0-9]) ;; *) continue ;; esac          # sonames only (libfoo.so.N)
    if [ "$so" = libvulkan.so.1 ] || ! _vk_has_soname "$so"; then ln -sf "$f" "$VK/lib/$so"; fi
  done
  ln -sf "$VK/lib/libvulkan.so.1" "$VK/lib/libvulkan.so"
  cat >"$VK/bin/vulkaninfo" <<EOF
#!/bin/sh
exec "$VK/root/usr/bin/vulkaninfo" "\$@"
EOF
  # glslc: directly if this glibc/libstdc++ can run it, else with the Debian 13 libstdc++,
  # else under the Debian 13 glibc's ld.so.
  local g="$VK/glslc/usr/bin/glslc" gl="$VK/glslc/$_vk_multi" c13="$VK/libc13/$_vk_multi"
  if LD_LIBRARY_PATH="$gl" "$g" --version >/dev/null 2>&1; then
    printf '#!/bin/sh\nLD_LIBRARY_PATH="%s" exec "%s" "$@"\n' "$gl" "$g" >"$VK/bin/glslc"
  else
    mkdir -p "$VK/libstdcxx13"
    cp -P "$c13"/libstdc++.so.6* "$c13"/libgcc_s.so.1 "$VK/libstdcxx13/" 2>/dev/null
    if LD_LIBRARY_PATH="$gl:$VK/libstdcxx13" "$g" --version >/dev/null 2>&1; then
      printf '#!/bin/sh\nLD_LIBRARY_PATH="%s" exec "%s" "$@"\n' "$gl:$VK/libstdcxx13" "$g" >"$VK/bin/glslc"
    else
      printf '#!/bin/sh\nexec "%s/ld-linux-x86-64.so.2" --library-path "%s" "%s" "$@"\n' \
        "$c13" "$gl:$c13" "$g" >"$VK/bin/glslc"
    fi
  fi
  chmod +x "$VK/bin/glslc" "$VK/bin/vulkaninfo"
  # Lavapipe (optional carry): lavapipe/lib/<soname>; drop what the system has (e.g. libxml2,
  # libzstd), so only what it lacks (libLLVM-15, libz3, ...) is taken from here.
  local t
  for t in "$_vk_here"/lavapipe/lavapipe*.tar.xz; do
    [ -f "$t" ] && tar -xJf "$t" -C "$VK"
  done
  if [ -f "$VK/lavapipe/lib/libvulkan_lvp.so" ]; then
    mkdir -p "$VK/lavapipe/system-has"
    for f in "$VK/lavapipe/lib"/*.so.*; do
      so="$(basename "$f")"
      _vk_has_soname "$so" && mv "$f" "$VK/lavapipe/system-has/"
    done
    # libicu72 is there only for the carried libxml2: not needed if the system's libxml2 is used
    sed "s#\"library_path\": *\"[^\"]*\"#\"library_path\": \"$VK/lavapipe/lib/libvulkan_lvp.so\"#" \
      "$VK/lavapipe/icd/lvp_icd.x86_64.json" >"$VK/icd/lavapipe.json"
  fi
  # NVIDIA's ICD as installed, and the same driver through its EGL library (headless).
  local sys
  for sys in /usr/share/vulkan/icd.d/nvidia_icd.json /etc/vulkan/icd.d/nvidia_icd.json \
             /usr/share/vulkan/icd.d/nvidia_icd.x86_64.json; do
    [ -f "$sys" ] && { cp "$sys" "$VK/icd/nvidia.json"; break; }
  done
  if [ -f "$VK/icd/nvidia.json" ]; then
    sed 's#"library_path": *"[^"]*"#"library_path": "libEGL_nvidia.so.0"#' "$VK/icd/nvidia.json" \
      >"$VK/icd/nvidia-egl.json"
  fi
  # PyYAML for gen_vulkan_spv.py, for the python build.sh uses ($PYTHON, else python3 with
  # /opt/torch/.venv/bin first on PATH)
  local py="${PYTHON:-}"
  [ -n "$py" ] || py="$(PATH="/opt/torch/.venv/bin:$PATH" command -v python3)"
  if ! "$py" -c "import yaml" 2>/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --target "$VK/py" "$_vk_debs"/pyyaml-*.whl ||
      echo "vulkan/setup.sh: could not install PyYAML for $py"
  fi
  touch "$VK/.unpacked"
}

vk_use() {  # vk_use nvidia | nvidia-egl | lavapipe
  local icd="$VK/icd/$1.json"
  [ -f "$icd" ] || { echo "vk_use: no $icd"; return 1; }
  export VK_ICD_FILENAMES="$icd" VK_DRIVER_FILES="$icd"
  local ld=":${LD_LIBRARY_PATH:-}:"
  ld="${ld//:$VK\/lavapipe\/lib:/:}"
  [ "$1" = lavapipe ] && ld=":$VK/lavapipe/lib$ld"
  ld="${ld#:}"; export LD_LIBRARY_PATH="${ld%:}"
  echo "Vulkan ICD: $icd"
}

_vk_try() {  # _vk_try NAME: vulkaninfo --summary with that ICD, loader messages on
  local icd="$VK/icd/$1.json" ld="$LD_LIBRARY_PATH"
  [ -f "$icd" ] || { echo "$1: no ICD json"; return 1; }
  [ "$1" = lavapipe ] && ld="$VK/lavapipe/lib:$ld"
  echo "=== vulkaninfo --summary with $1 ($icd)"
  cat "$icd"
  env VK_ICD_FILENAMES="$icd" VK_DRIVER_FILES="$icd" VK_LOADER_DEBUG=error,warn,driver \
    LD_LIBRARY_PATH="$ld" timeout 60 "$VK/bin/vulkaninfo" --summary 2>&1 | head -150
}

vk_diagnose() {
  {
    echo "=== driver"
    if command -v nvidia-smi >/dev/null; then
      nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -2
    else echo "no nvidia-smi"; fi
    cat /proc/driver/nvidia/version 2>&1 | head -2
    echo "NVIDIA_DRIVER_CAPABILITIES=${NVIDIA_DRIVER_CAPABILITIES:-<unset>}" \
         "NVIDIA_VISIBLE_DEVICES=${NVIDIA_VISIBLE_DEVICES:-<unset>}"
    echo "=== devices (Vulkan needs /dev/nvidiactl and /dev/nvidia0 ...; /dev/nvidia-modeset only for display)"
    ls -l /dev/nvidia* /dev/dri 2>&1
    echo "=== ICD json files"
    ls -l /usr/share/vulkan/icd.d /etc/vulkan/icd.d /usr/share/vulkan/implicit_layer.d 2>&1
    echo "=== NVIDIA user-space libraries the Vulkan ICD needs (graphics capability)"
    # libGLX_nvidia/libEGL_nvidia export vk_icdGetInstanceProcAddr; they dlopen libnvidia-glcore,
    # -tls, -glsi, -gpucomp (>= 535), -glvkspirv (SPIR-V compiler); all must match the kernel
    # driver's version.
    ls -l /usr/lib/x86_64-linux-gnu/lib{GLX,EGL}_nvidia* \
          /usr/lib/x86_64-linux-gnu/libnvidia-{glcore,tls,glsi,gpucomp,glvkspirv,eglcore,egl-gbm,api}* 2>&1
    local lib
    for lib in libGLX_nvidia.so.0 libEGL_nvidia.so.0; do
      local p; p="$(ldconfig -p | awk -v l="$lib" '$1 == l {print $NF; exit}')"
      [ -n "$p" ] || { echo "$lib: not in ld.so.cache"; continue; }
      echo "--- ldd $p (not found:)"
      LD_LIBRARY_PATH="$VK/lib" ldd "$p" 2>&1 | grep -E "not found" || echo "(none)"
      nm -D --defined-only "$p" 2>/dev/null | grep -E "vk_icd" | sed 's/^/    /'
    done
    local drv=""
    command -v nvidia-smi >/dev/null && drv="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"
    if [ -n "$drv" ]; then
      echo "--- NVIDIA libraries whose version differs from the driver's ($drv):"
      ls /usr/lib/x86_64-linux-gnu/libnvidia-*.so.[0-9]*.* /usr/lib/x86_64-linux-gnu/lib{GLX,EGL}_nvidia.so.[0-9]*.* \
        2>/dev/null | grep -v "$drv" || echo "(none)"
    fi
    local name
    for name in nvidia nvidia-egl lavapipe; do _vk_try "$name"; done
  } >"$VK/diagnose.log" 2>&1
  echo "Vulkan diagnosis ($VK/diagnose.log):"
  grep -E "^=== vulkaninfo|deviceName|driverName|apiVersion|ERROR|Could not|INCOMPATIBLE|cannot open|unable to open|Found no|not found|no ICD json" \
    "$VK/diagnose.log" | grep -v "^.*=== devices" | head -40
}

_vk_unpack || echo "vulkan/setup.sh: unpacking failed"
export PATH="$VK/bin:$PATH"
export LD_LIBRARY_PATH="$VK/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[ -d "$VK/py" ] && export PYTHONPATH="$VK/py${PYTHONPATH:+:$PYTHONPATH}"
echo "glslc: $("$VK/bin/glslc" --version 2>&1 | head -1)"
vk_diagnose
# Default: NVIDIA's ICD if it gives a device, else its EGL variant, else lavapipe.
if VK_ICD_FILENAMES="$VK/icd/nvidia.json" VK_DRIVER_FILES="$VK/icd/nvidia.json" timeout 60 \
     "$VK/bin/vulkaninfo" --summary 2>/dev/null | grep -q "deviceName"; then
  vk_use nvidia
elif VK_ICD_FILENAMES="$VK/icd/nvidia-egl.json" VK_DRIVER_FILES="$VK/icd/nvidia-egl.json" timeout 60 \
     "$VK/bin/vulkaninfo" --summary 2>/dev/null | grep -q "deviceName"; then
  vk_use nvidia-egl
elif [ -f "$VK/icd/lavapipe.json" ]; then
  vk_use lavapipe
else
  echo "no working Vulkan ICD (see $VK/diagnose.log)"
fi
