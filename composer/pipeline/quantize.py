"""Quantize for the stack: each region of the model with the quantizer of the backend that will
take it (the ``composer_quantizer`` hook), the regions of float backends left float.

The plan comes first, on the float model (no compiler runs: plan mode). Its nodes are traced back
to the exported program's (:func:`~composer.scheduler.origins.origin_backends`), whose names the
graph PT2E quantizes keeps, so each backend's quantizer annotates only what that backend takes.
An integer-only backend (Ethos-U) takes nothing of a float model: a backend with a quantizer
that the float plan gives no node is planned again on the model its quantizer quantized whole,
and given what it takes there, less what a backend ahead of it took float.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import torch
import torch.fx
from torch.export import ExportedProgram
from torchao.quantization.pt2e import FakeQuantizeBase, ObserverBase
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer import Quantizer, SharedQuantizationSpec

from composer.contract.errors import ComposerError
from composer.contract.op_names import op_name
from composer.contract.quiet import quiet_call
from composer.lower.export import Model, example_inputs_of, export_model, fresh_program
from composer.registry.discovery import Backend, Registry
from composer.registry.resolved import ResolvedStack, resolve_stack
from composer.registry.stack import Stack
from composer.run.compare import compare
from composer.scheduler.origins import origin_backends
from composer.scheduler.plans import QUANTIZED_OPS

ANNOTATION = "quantization_annotation"  # where PT2E quantizers put what they decided on a node


@attrs.frozen
class BackendQuantizer:
    """A backend of the stack and its quantizer, which may annotate the nodes the plan gives
    that backend (``RegionQuantizer.planned``)."""

    backend: str
    quantizer: Quantizer


class RegionQuantizer(Quantizer):
    """Several quantizers over one graph, each kept to its backend's nodes.

    A node is annotated by the quantizer of the backend the plan gives it, or by none. The
    quantizers annotate in the stack's order; an annotation one puts on a node of another
    region, or of no backend (portable kernels have no integer ops), is taken off again.
    """

    def __init__(self, regions: Sequence[BackendQuantizer], planned: Mapping[str, str]) -> None:
        super().__init__()
        self.regions = tuple(regions)
        self.planned = dict(planned)  # exported program's node -> the backend that takes it
        self.annotated: dict[str, int] = {}  # backend -> nodes its quantizer kept annotated

    def transform_for_annotation(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        for region in self.regions:
            model = region.quantizer.transform_for_annotation(model)
        return model

    def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        annotated: dict[torch.fx.Node, Any] = {}
        for region in self.regions:
            # Each quantizer sees a graph no other annotated (NNCF's OpenVINOQuantizer asserts it).
            for node in model.graph.nodes:
                node.meta.pop(ANNOTATION, None)
            region.quantizer.annotate(model)
            kept = 0
            for node in model.graph.nodes:
                annotation = node.meta.pop(ANNOTATION, None)
                if annotation is None or node in annotated or not self._in(node, region):
                    continue
                annotated[node] = annotation
                kept += node.op == "call_function"
            self.annotated[region.backend] = kept
        _drop_dangling_shares(annotated)
        for node, annotation in annotated.items():
            node.meta[ANNOTATION] = annotation
        return model

    def _in(self, node: torch.fx.Node, region: BackendQuantizer) -> bool:
        """Whether ``node`` is ``region``'s: the plan says so, or it is a weight (get_attr) or
        input one of the region's nodes reads; a node the plan does not know (a view folded
        away) follows the quantizer that annotates it."""
        if node.op != "call_function":
            return any(self._in(user, region) for user in node.users)
        return self.planned.get(node.name, region.backend) == region.backend

    def validate(self, model: torch.fx.GraphModule) -> None:
        for region in self.regions:
            region.quantizer.validate(model)


def _drop_dangling_shares(annotated: dict[torch.fx.Node, Any]) -> None:
    """Leave float each node whose annotation shares a quantization with a node or edge that
    kept none (a max pool sharing its input's scale, where that input went to another
    backend), until none is left: PT2E's prepare cannot resolve such a share."""
    while True:
        dangling = [
            node
            for node, annotation in annotated.items()
            if any(not _present(spec.edge_or_node, annotated) for spec in _shares(annotation))
        ]
        if not dangling:
            return
        for node in dangling:
            del annotated[node]


def _shares(annotation: Any) -> list[SharedQuantizationSpec]:
    specs = [*annotation.input_qspec_map.values(), annotation.output_qspec]
    return [spec for spec in specs if isinstance(spec, SharedQuantizationSpec)]


def _present(edge_or_node: Any, annotated: dict[torch.fx.Node, Any]) -> bool:
    if isinstance(edge_or_node, torch.fx.Node):
        return edge_or_node in annotated and annotated[edge_or_node].output_qspec is not None
    source, user = edge_or_node
    return user in annotated and source in annotated[user].input_qspec_map


@quiet_call
def quantize(
    model: Model,
    stack: Stack | str | Sequence[str],
    example_inputs: Sequence[Any] | None = None,
    *,
    calibration: Iterable[Sequence[Any]] | None = None,
    dynamic_shapes: Any = None,
    registry: Registry | None = None,
    progress: Callable[[str], None] | None = None,
    **settings: Any,
) -> ExportedProgram:
    """Quantize ``model`` for ``stack``: plan the stack on the float model, then quantize each
    backend's nodes with that backend's quantizer (PT2E: prepare, calibrate, convert), and
    export the result. Backends without a quantizer (``composer_quantizer``) keep theirs float.

    ``calibration``: input tuples run through the prepared model to set the scales (default:
    the example inputs alone, which is seldom enough for accuracy). The stack and ``settings``
    are as for :func:`composer.compose`, which takes the program this returns with the same
    stack.
    """
    # Quantizing plans the stack, which runs anywhere: every backend lowers to the stand-in.
    resolved = resolve_stack(Stack.of(stack, **settings), registry, must_lower_here=False)
    quantizers = _quantizers(resolved)
    program = _float_program(model, example_inputs, dynamic_shapes)
    inputs = example_inputs_of(model, example_inputs)
    planned = _planned_by_backend(program, inputs, resolved, quantizers)
    if not set(planned.values()) & quantizers.keys():
        # No backend with a quantizer takes a node: PT2E would annotate nothing worth an
        # integer kernel, and preparing costs seconds (XNNPACK's quantizer traces its conv+bn
        # patterns on every call), so the float program is the quantized one.
        if progress is not None:
            progress(f"no node of the model goes to {', '.join(quantizers)}: nothing quantized")
        return program
    region_quantizer = RegionQuantizer(
        [BackendQuantizer(name, quantizer) for name, quantizer in quantizers.items()], planned
    )
    prepared = prepare_pt2e(program.module(check_guards=False), region_quantizer)
    for batch in calibration if calibration is not None else [inputs]:
        prepared(*batch)
    converted = convert_pt2e(prepared)
    if progress is not None:
        for name, count in region_quantizer.annotated.items():
            progress(f"{name}: quantized {count} node(s) with its quantizer")
        _, worst = compare(converted(*inputs), program.module()(*inputs))
        progress(f"quantized model against the float one: max |difference| {worst:.3g}")
    return torch.export.export(converted, tuple(inputs), dynamic_shapes=dynamic_shapes)


def _quantizer_of(resolved: ResolvedStack, backend: Backend) -> Quantizer | None:
    """A fresh quantizer of ``backend``'s, with its options (the hook promises one a call)."""
    return resolved.registry.quantizer(backend, resolved.stack.options.get(backend.name, {}))


def _quantizers(resolved: ResolvedStack) -> dict[str, Quantizer]:
    """The quantizer of each backend of the stack that offers one; a ComposerError if none."""
    quantizers = {
        b.name: q for b in resolved.backends if (q := _quantizer_of(resolved, b)) is not None
    }
    if not quantizers:
        raise ComposerError(
            f"no backend of {list(resolved.stack.backends)} offers a quantizer (the "
            "composer_quantizer hook), so there is nothing to quantize with: add one that does "
            "to the stack (xnnpack's is XNNPACK's int8 quantizer)."
        )
    return quantizers


def _float_program(model: Model, example_inputs, dynamic_shapes: Any) -> ExportedProgram:
    """``model`` exported, refused where it is quantized already."""
    program = export_model(model, example_inputs, dynamic_shapes)
    if any(node.op == "call_function" and op_name(node).startswith(QUANTIZED_OPS)
           for node in program.graph.nodes):  # fmt: skip
        raise ComposerError("the model is already quantized: compose it as it is.")
    return program


def _planned_by_backend(
    program: ExportedProgram,
    inputs: Sequence[Any],
    resolved: ResolvedStack,
    quantizers: Mapping[str, Quantizer],
) -> dict[str, str]:
    """Which backend the plan gives each node of ``program``, a backend with a quantizer that
    the float plan gives nothing planned again on the model its quantizer quantized whole."""
    # Imported here: it imports executorch.exir, seconds that a cache hit elsewhere never pays.
    from composer.lower.priority import lower_in_order

    def planned_for(candidate: ExportedProgram) -> dict[str, str]:
        edge, plan = lower_in_order(fresh_program(candidate, None), resolved.planned())
        return origin_backends(edge.exported_program().graph_module, plan.node_backends)

    planned = planned_for(program)
    compute = [node.name for node in program.graph.nodes if node.op == "call_function"]
    for index, backend in enumerate(resolved.backends):
        if backend.name not in quantizers or backend.name in planned.values():
            continue
        # What a backend ahead of it took float stays that backend's: the stack's order comes
        # first (with nothing else left, no trial: openvino,xnnpack where OpenVINO takes all).
        ahead = {b.name for b in resolved.backends[:index]}
        free = {name for name in compute if planned.get(name) not in ahead}
        if free:
            # A fresh quantizer for the trial: the hook promises one per call.
            trial = _taken_once_quantized(
                backend.name, _quantizer_of(resolved, backend), program, inputs, planned_for
            )
            planned.update((n, b) for n, b in trial.items() if n in free)
    return planned


def _taken_once_quantized(
    backend: str,
    quantizer: Quantizer,
    program: ExportedProgram,
    inputs: Sequence[Any],
    planned_for: Callable[[ExportedProgram], dict[str, str]],
) -> dict[str, str]:
    """The nodes that ``backend`` takes once ``quantizer`` quantized the whole of ``program``
    (by name: the float program's op nodes keep theirs; the q/dq nodes added are not in it):
    what an integer-only backend (Ethos-U) is given, which takes no node of the float model
    the plan first looks at. Its quantizer's annotations on them are the ones kept."""
    prepared = prepare_pt2e(program.module(check_guards=False), quantizer)
    if not any(isinstance(m, (ObserverBase, FakeQuantizeBase)) for m in prepared.modules()):
        return {}  # it annotated nothing: the trial would plan the float model again
    prepared(*inputs)
    trial = torch.export.export(convert_pt2e(prepared), tuple(inputs))
    return {node: taker for node, taker in planned_for(trial).items() if taker == backend}
