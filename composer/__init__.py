"""composer: several ExecuTorch backends in one .pte, safely.

import composer
composer.available_backends()  # the installed backends that lower here
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
    from composer.contract.backend_spec import BackendSpec, Tolerance
    from composer.contract.errors import (
        BackendListError,
        ComposerError,
        ComposerWarning,
        ModelError,
        PartitionError,
        PluginError,
    )
    from composer.contract.hookspecs import BackendPlugin
    from composer.contract.op_names import op_name
    from composer.contract.options import Option
    from composer.contract.runtime import Delegate, DelegateRuntime
    from composer.contract.support import ExplainedSupport
    from composer.fleet import sweep
    from composer.pipeline.compose import compose, plan
    from composer.pipeline.methods import MethodsComposition
    from composer.pipeline.quantize import quantize
    from composer.pipeline.recipes import export_recipe
    from composer.registry.discovery import Registry, default_registry
    from composer.registry.stack import Stack
    from composer.report.plan_text import summary_table
    from composer.run.backends_here import available_backends, provable_backends
    from composer.run.composition import Composition
    from composer.run.verification import Verification
    from composer.scheduler.drop_in import guard, partitioner
    from composer.scheduler.plans import Fallback, Partition, Plan

_MODULE_OF = {
    "BackendListError": "composer.contract.errors",
    "BackendPlugin": "composer.contract.hookspecs",
    "BackendSpec": "composer.contract.backend_spec",
    "ComposerError": "composer.contract.errors",
    "ComposerWarning": "composer.contract.errors",
    "Composition": "composer.run.composition",
    "Delegate": "composer.contract.runtime",
    "DelegateRuntime": "composer.contract.runtime",
    "ExplainedSupport": "composer.contract.support",
    "Fallback": "composer.scheduler.plans",
    "MethodsComposition": "composer.pipeline.methods",
    "ModelError": "composer.contract.errors",
    "Option": "composer.contract.options",
    "Partition": "composer.scheduler.plans",
    "PartitionError": "composer.contract.errors",
    "Plan": "composer.scheduler.plans",
    "PluginError": "composer.contract.errors",
    "Registry": "composer.registry.discovery",
    "Stack": "composer.registry.stack",
    "Tolerance": "composer.contract.backend_spec",
    "Verification": "composer.run.verification",
    "available_backends": "composer.run.backends_here",
    "compose": "composer.pipeline.compose",
    "default_registry": "composer.registry.discovery",
    "export_recipe": "composer.pipeline.recipes",
    "guard": "composer.scheduler.drop_in",
    "listed": "composer.scheduler.drop_in",
    "op_name": "composer.contract.op_names",
    "partitioner": "composer.scheduler.drop_in",
    "plan": "composer.pipeline.compose",
    "provable_backends": "composer.run.backends_here",
    "quantize": "composer.pipeline.quantize",
    "summary_table": "composer.report.plan_text",
    "sweep": "composer.fleet",
}

__all__ = [
    "BackendListError",
    "BackendPlugin",
    "BackendSpec",
    "ComposerError",
    "ComposerWarning",
    "Composition",
    "Delegate",
    "DelegateRuntime",
    "ExplainedSupport",
    "Fallback",
    "MethodsComposition",
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
    "available_backends",
    "compose",
    "default_registry",
    "export_recipe",
    "guard",
    "listed",
    "op_name",
    "partitioner",
    "plan",
    "provable_backends",
    "quantize",
    "summary_table",
    "sweep",
]


def __getattr__(name: str) -> Any:
    if name == "__version__":
        globals()[name] = _version()
        return globals()[name]
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'composer' has no attribute {name!r}")
    # Some import torchao, which logs the optional kernels it cannot load here.
    from composer.contract.quiet import upstream_quieted

    with upstream_quieted(lenient=True):
        value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, "__version__"})


def _version() -> str:
    """composer's version, from the installed distribution's metadata; ``0+unknown`` where
    composer is imported from a source tree that was never installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("executorch-composer")
    except PackageNotFoundError:
        return "0+unknown"
