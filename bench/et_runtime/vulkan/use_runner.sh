# Source from the repository root on the GPU machine: where bench/et_runtime/carry/vk_runner.tar.xz
# (the runner built with ET_VULKAN=ON, at the CUDA runner's path inside it, so unpacked
# elsewhere) and bench/et_runtime/vulkan/debs are carried, set up NVIDIA's Vulkan driver through
# its EGL ICD (setup.sh) and name that runner in $COMPOSER_VULKAN_RUNNER, for the proof and
# measured placement to run Vulkan programs in. Elsewhere it does nothing.
if [ -f bench/et_runtime/carry/vk_runner.tar.xz ] && [ -d bench/et_runtime/vulkan/debs ]; then
  mkdir -p /tmp/vkr && tar -xJf bench/et_runtime/carry/vk_runner.tar.xz -C /tmp/vkr
  if source bench/et_runtime/vulkan/setup.sh >/tmp/vk_setup.log 2>&1 && vk_use nvidia-egl; then
    export COMPOSER_VULKAN_RUNNER=/tmp/vkr/tmp/etb/build/composer_runner/composer_et_runner
  else
    echo "Vulkan setup failed:"; tail -5 /tmp/vk_setup.log
  fi
fi
