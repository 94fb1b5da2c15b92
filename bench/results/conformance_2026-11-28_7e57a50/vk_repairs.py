"""Which zoo models' Vulkan partitions the proof moves in ExecuTorch's Vulkan runner, with the
Vulkan option skip_bool_tensors ON (composer's default since the 8bddf39 run) and OFF.

On the GPU machine, after `source bench/gpu_setup.sh; source bench/et_runtime/vulkan/use_runner.sh;
export COMPOSER_ET_RUNNER=$COMPOSER_VULKAN_RUNNER`:
    python3 bench/results/conformance_2026-11-28_7e57a50/vk_repairs.py tied_lm unet ...
"""

import sys
import time

import composer
from composer.models import zoo

for name in sys.argv[1:]:
    for skip in ("ON", "OFF"):
        model, inputs = zoo.load(name)
        stack = composer.Stack(
            ["vulkan", "xnnpack"], options={"vulkan": {"skip_bool_tensors": skip}}
        )
        started = time.perf_counter()
        try:
            composition = composer.compose(model, stack, inputs, cache=False)
        except composer.ComposerError as error:
            print(f"{name} skip_bool_tensors={skip}: refused: {error}", flush=True)
            continue
        plan = composition.plan
        print(
            f"{name} skip_bool_tensors={skip}: {time.perf_counter() - started:.1f} s, "
            f"repairs={len(plan.repairs)}",
            flush=True,
        )
        for repair in plan.repairs:
            print("   ", repair, flush=True)
