"""Every answer a plugin gives composer, checked here and nowhere else.

The registry asks a plugin's hooks (:class:`composer.registry.discovery.Registry`, a method per
hook) and hands each answer to the check below of the same name, which returns it in the form
composer uses or raises a ``PluginError`` that names the plugin and says what the hook must
return. The support object ``composer_operator_support`` returns is wrapped
(:class:`CheckedPluginSupport`) so that its own answers, node by node, are checked here too.

The types an answer is checked against (ExecuTorch's ``Partitioner`` and ``CompileSpec``, torch's
``OperatorSupportBase``, PT2E's ``Quantizer``), and the torch-based helpers, are imported inside
the checks: the registry is imported where torch and ExecuTorch are not (``composer backends``
of plugins that import them lazily, a fleet's driver resolving a stack), and an answer of such a
type has loaded its module already.
"""

from __future__ import annotations

from collections.abc import Container
from typing import TYPE_CHECKING, Any

from composer.contract.backend_spec import BackendSpec
from composer.contract.errors import PluginError
from composer.contract.options import Option
from composer.registry.asking import asking

if TYPE_CHECKING:
    import torch
    import torch.fx
    from executorch.exir.backend.compile_spec_schema import CompileSpec
    from executorch.exir.backend.partitioner import Partitioner
    from torch.export import ExportedProgram
    from torch.fx.passes.operator_support import OperatorSupportBase
    from torchao.quantization.pt2e.quantizer import Quantizer

    from composer.contract.runtime import DelegateRuntime
    from composer.registry.found import Backend


def plugin_label(backend: Backend) -> str:
    """How errors name the plugin that declared ``backend``: its entry point and distribution."""
    origin = backend.origin
    return f"plugin {origin.name!r} ({origin.distribution})"


def short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def wrong_answer(backend: Backend, hook: str, answer: Any, wanted: str) -> PluginError:
    """The one form of every wrong answer to a hook: the plugin, the hook, what it said."""
    return PluginError(
        f"{plugin_label(backend)} returned {short_repr(answer)} from {hook}; "
        f"it must return {wanted}."
    )


def _is_list_of(answer: Any, kind: type | tuple[type, ...]) -> bool:
    return isinstance(answer, list | tuple) and all(isinstance(item, kind) for item in answer)


def backends(declared: Any) -> list[BackendSpec]:
    """``composer_backends``: a list of ``BackendSpec`` (the plugin is skipped otherwise, so
    the message is about the plugin, which the warning names)."""
    if not isinstance(declared, list | tuple) or not all(
        isinstance(spec, BackendSpec) for spec in declared
    ):
        raise PluginError(
            f"its composer_backends returned {short_repr(declared)}; it must return a "
            "list of composer.BackendSpec"
        )
    return list(declared)


def options(answer: Any, backend: Backend) -> tuple[Option, ...]:
    """``composer_options``: ``Option``s with distinct names; ``None`` is none."""
    if answer is None:
        return ()
    where = plugin_label(backend)
    if not _is_list_of(answer, Option):
        wanted = "a list of composer.Option (or None: no options)"
        raise wrong_answer(backend, "composer_options", answer, wanted)
    names = [option.name for option in answer]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise PluginError(
            f"{where} declares option {repeated[0]!r} twice in composer_options for backend "
            f"{backend.name!r}; name each option once."
        )
    return tuple(answer)


def unavailable_reason(reason: Any, backend: Backend) -> str | None:
    """``composer_unavailable_reason``: a reason, or ``None`` when the backend lowers here."""
    # An empty string would read as "available" to some callers and "not" to others.
    if reason is not None and not (isinstance(reason, str) and reason.strip()):
        wanted = "a reason (a non-empty string) or None"
        raise wrong_answer(backend, "composer_unavailable_reason", reason, wanted)
    return reason


def partitioner(native: Any, backend: Backend) -> Partitioner | None:
    """``composer_partitioner``: an ExecuTorch ``Partitioner`` or ``None``."""
    if native is None:
        return None
    from executorch.exir.backend.partitioner import Partitioner

    if not isinstance(native, Partitioner):
        wanted = "an ExecuTorch Partitioner or None"
        raise wrong_answer(backend, "composer_partitioner", native, wanted)
    return native


def compile_specs(specs: Any, backend: Backend) -> list[CompileSpec] | None:
    """``composer_compile_specs``: a list of ExecuTorch ``CompileSpec`` or ``None``."""
    if specs is None:
        return None
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    if not _is_list_of(specs, CompileSpec):
        wanted = "a list of executorch's CompileSpec or None"
        raise wrong_answer(backend, "composer_compile_specs", specs, wanted)
    return list(specs)


def rewrites(passes: Any, backend: Backend) -> list:
    """``composer_rewrites``: a list of passes (callables on a ``GraphModule``) or ``None``."""
    if passes is None:
        return []
    if not isinstance(passes, list | tuple) or not all(callable(p) for p in passes):
        raise wrong_answer(backend, "composer_rewrites", passes,
                           "a list of passes (ExportPass instances), or None")  # fmt: skip
    return list(passes)


def ops_to_not_decompose(ops: Any, backend: Backend) -> list[torch._ops.OpOverload] | None:
    """``composer_ops_to_not_decompose``: a list of ATen ``OpOverload``s (not names) or ``None``."""
    if ops is None:
        return None
    import torch

    if not _is_list_of(ops, torch._ops.OpOverload):
        # Named by the first wrong item, so that a name among ops ('aten.linear.default') shows.
        wrong = ops
        if isinstance(ops, list | tuple):
            wrong = next(op for op in ops if not isinstance(op, torch._ops.OpOverload))
        wanted = "a list of ATen ops (torch.ops.aten.linear.default), not names, or None"
        raise wrong_answer(backend, "composer_ops_to_not_decompose", wrong, wanted)
    return list(ops)


def quantizer(answer: Any, backend: Backend) -> Quantizer | None:
    """``composer_quantizer``: a PT2E ``Quantizer`` or ``None``."""
    if answer is None:
        return None
    from torchao.quantization.pt2e.quantizer import Quantizer

    if not isinstance(answer, Quantizer):
        raise wrong_answer(backend, "composer_quantizer", answer, "a PT2E Quantizer or None")
    return answer


def operator_support(
    support: Any, backend: Backend, program: ExportedProgram
) -> CheckedPluginSupport | None:
    """``composer_operator_support``: an ``OperatorSupportBase`` or ``None``, wrapped so that
    what it answers for each node of ``program`` is checked as well."""
    if support is None:
        return None
    from torch.fx.passes.operator_support import OperatorSupportBase

    if not isinstance(support, OperatorSupportBase):
        wanted = "a torch.fx.passes.operator_support.OperatorSupportBase or None"
        raise wrong_answer(backend, "composer_operator_support", support, wanted)
    return CheckedPluginSupport(support, backend, dict(program.graph_module.named_modules()))


class CheckedPluginSupport:
    """A plugin's support object for one program, asked the questions
    :class:`composer.ExplainedSupport` declares, each answer checked."""

    def __init__(
        self,
        support: OperatorSupportBase,
        backend: Backend,
        submodules: dict[str, torch.nn.Module],
    ) -> None:
        self._support = support
        self._submodules = submodules
        self._who = f"{plugin_label(backend)}: {type(support).__name__}"
        self._plugin = f"plugin {backend.origin.name!r}"
        # A plain OperatorSupportBase may define the further questions without the base that
        # declares them (composer.ExplainedSupport); one that does not is not asked them.
        self._explain = getattr(support, "reason_unsupported", None)
        from composer.contract.support import asks_at_boundary

        self.asks_at_boundary = asks_at_boundary(support)

    def takes(self, node: torch.fx.Node) -> bool:
        """Whether the backend takes ``node`` (``is_node_supported``): True or False, nothing
        else (``"no"`` is truthy: taken as yes, the backend would take every node)."""
        try:
            with asking(self._plugin, f"is_node_supported, node {node.name}"):
                answer = self._support.is_node_supported(self._submodules, node)
        except Exception as error:
            from composer.contract.op_names import op_name

            raise PluginError(
                f"{self._who}.is_node_supported raised on node {node.name} ({op_name(node)}): "
                f"{type(error).__name__}: {error}"
            ) from error
        if not _is_boolean(answer):
            raise PluginError(
                f"{self._who}.is_node_supported returned {short_repr(answer)} for node "
                f"{node.name}; it must return True or False."
            )
        return bool(answer)

    def why_not(self, node: torch.fx.Node) -> str:
        """Why the backend declines ``node`` (``reason_unsupported``; "unsupported op")."""
        if self._explain is None:
            return "unsupported op"
        try:
            with asking(self._plugin, f"reason_unsupported, node {node.name}"):
                reason = self._explain(node)
        except Exception as error:
            from composer.contract.op_names import op_name

            raise PluginError(
                f"{self._who}.reason_unsupported raised on node {node.name} ({op_name(node)}): "
                f"{type(error).__name__}: {error}"
            ) from error
        if reason is not None and not isinstance(reason, str):
            raise PluginError(
                f"{self._who}.reason_unsupported returned {short_repr(reason)} for node "
                f"{node.name}; it must return a string or None."
            )
        return reason or "unsupported op"

    def refuses_at_boundary(
        self, node: torch.fx.Node, partition: Container[torch.fx.Node]
    ) -> str | None:
        """Why the backend's runtime cannot bind ``node``'s tensor at the edge of a delegate of
        ``partition`` (``reason_unsupported_at_boundary``), or ``None``."""
        try:
            with asking(self._plugin, f"reason_unsupported_at_boundary, node {node.name}"):
                reason = self._support.reason_unsupported_at_boundary(node, partition)
        except Exception as error:
            raise PluginError(
                f"{self._who}.reason_unsupported_at_boundary raised on node {node.name}: "
                f"{type(error).__name__}: {error}"
            ) from error
        if reason is not None and not isinstance(reason, str):
            raise PluginError(
                f"{self._who}.reason_unsupported_at_boundary returned {short_repr(reason)} for "
                f"node {node.name}; it must return a string or None."
            )
        return reason or None


def _is_boolean(answer: Any) -> bool:
    """A Python bool, or numpy's (what a support check computed with numpy returns)."""
    kind = type(answer)
    return isinstance(answer, bool) or (
        kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_")
    )


def runtime(answer: Any, backend: Backend) -> DelegateRuntime | None:
    """``composer_runtime``'s answer: a :class:`composer.DelegateRuntime`, or ``None``."""
    from composer.contract.runtime import DelegateRuntime

    if answer is None or isinstance(answer, DelegateRuntime):
        return answer
    raise wrong_answer(backend, "composer_runtime", answer, "a composer.DelegateRuntime or None")
