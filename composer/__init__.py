"""composer: several ExecuTorch backends in one .pte, safely.

import composer
plan = composer.plan(model, ["tensorrt_stub", "xnnpack"], example_inputs)
composition = composer.compose(model, "tensorrt_stub,xnnpack", example_inputs)
composition.save("model.pte"); print(composition.verify())
"""

from composer.backend_spec import BackendSpec
from composer.compose import Composition, Verification, compose, plan
from composer.drop_in import guard, partitioner
from composer.errors import (
    BackendListError,
    ComposerError,
    ModelError,
    PartitionError,
    PluginError,
)
from composer.plan import Fallback, Partition, Plan
from composer.registry import Registry, default_registry

__all__ = [
    "BackendListError",
    "BackendSpec",
    "ComposerError",
    "Composition",
    "Fallback",
    "ModelError",
    "Partition",
    "PartitionError",
    "Plan",
    "PluginError",
    "Registry",
    "Verification",
    "compose",
    "default_registry",
    "guard",
    "partitioner",
    "plan",
]
