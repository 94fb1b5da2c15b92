"""On the GPU machine: vit_b_16 (static, as the suite exports it) on `vulkan,xnnpack`, composed
with composer's Vulkan default (``skip_bool_tensors`` OFF: its partitioner claims
``logical_not``, which the runner lacks, and a repair moves it) and with ``skip_bool_tensors``
ON (as ExecuTorch's Vulkan tester builds the partitioner); then plain's lowering with that
tester's partitioner, for scale. Each compose proves its program in the C++ runner
($COMPOSER_ET_RUNNER). Prints one JSON line each: seconds, repairs, the proof.

    source bench/gpu_setup.sh; source bench/et_runtime/vulkan/use_runner.sh
    COMPOSER_ET_RUNNER=$COMPOSER_VULKAN_RUNNER python3 bench/results/conformance_s33/vit_bool_ops.py
"""

import json
import time

import torch
import torchvision
from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower

import composer

torch.manual_seed(0)
model = torchvision.models.vit_b_16().eval()
inputs = (torch.randn(1, 3, 224, 224),)
program = torch.export.export(model, inputs)

for label, options in (("skip_bool_tensors ON", {"vulkan": {"skip_bool_tensors": "ON"}}),
                       ("composer's default (OFF)", {})):  # fmt: skip
    started = time.perf_counter()
    try:
        plan = composer.compose(
            program, composer.Stack(["vulkan", "xnnpack"], options=options), inputs, cache=False
        ).plan
        said = {"proof": plan.proof[:200], "repairs": len(plan.repairs),
                "partitions": [p.backend for p in plan.partitions].count("vulkan")}  # fmt: skip
    except composer.ComposerError as refused:
        said = {"refused": str(refused)[:300]}
    print(json.dumps({"compose": label, "seconds": round(time.perf_counter() - started, 1), **said}), flush=True)  # fmt: skip

started = time.perf_counter()
partitioners = [VulkanPartitioner({"skip_bool_tensors": True}), XnnpackPartitioner()]
buffer = to_edge_transform_and_lower(program, partitioner=partitioners).to_executorch().buffer
print(json.dumps({"plain lowering": "vulkan (skip_bool_tensors), xnnpack", "seconds": round(time.perf_counter() - started, 1), "bytes": len(buffer)}))  # fmt: skip
