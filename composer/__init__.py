"""composer: several ExecuTorch backends in one .pte, safely.

import composer
plan = composer.plan(model, ["tensorrt_stub", "xnnpack"], example_inputs)
stack = composer.Stack(["cuda", "xnnpack"], options={"cuda": {"max_autotune": "OFF"}})
composition = composer.compose(model, "tensorrt_stub,xnnpack", example_inputs)
composition.save("model.pte"); print(composition.verify())
"""

# The public names load on first use (PEP 562): torch and ExecuTorch take seconds to import,
# and this package is imported by `composer --help` and by its pytest plugin, which pytest
# loads in every run of every environment composer is installed in.

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from composer.backend_spec import BackendSpec, Tolerance
    from composer.composition import Composition, compose, plan
    from composer.drop_in import guard, partitioner
    from composer.errors import (
        BackendListError,
        ComposerError,
        ComposerWarning,
        ModelError,
        PartitionError,
        PluginError,
    )
    from composer.op_names import op_name
    from composer.options import Option
    from composer.plans import Fallback, Partition, Plan
    from composer.registry import Registry, default_registry
    from composer.stack import Stack
    from composer.verification import Verification

_MODULE_OF = {
    "BackendListError": "composer.errors",
    "BackendSpec": "composer.backend_spec",
    "ComposerError": "composer.errors",
    "ComposerWarning": "composer.errors",
    "Composition": "composer.composition",
    "Fallback": "composer.plans",
    "ModelError": "composer.errors",
    "Option": "composer.options",
    "Partition": "composer.plans",
    "PartitionError": "composer.errors",
    "Plan": "composer.plans",
    "PluginError": "composer.errors",
    "Registry": "composer.registry",
    "Stack": "composer.stack",
    "Tolerance": "composer.backend_spec",
    "Verification": "composer.verification",
    "compose": "composer.composition",
    "default_registry": "composer.registry",
    "guard": "composer.drop_in",
    "listed": "composer.drop_in",
    "op_name": "composer.op_names",
    "partitioner": "composer.drop_in",
    "plan": "composer.composition",
}

__all__ = [
    "BackendListError",
    "BackendSpec",
    "ComposerError",
    "ComposerWarning",
    "Composition",
    "Fallback",
    "ModelError",
    "Option",
    "Partition",
    "PartitionError",
    "Plan",
    "PluginError",
    "Registry",
    "Stack",
    "Tolerance",
    "Verification",
    "compose",
    "default_registry",
    "guard",
    "listed",
    "op_name",
    "partitioner",
    "plan",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'composer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
