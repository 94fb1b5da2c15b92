"""Flows for ExecuTorch's backend test suite: composer's stacks beside the suite's plain ones.

A composer flow lowers each case with ``composer.compose(program, stack, inputs)`` (its proof
on), and the suite serializes, runs and compares exactly the bytes composer wrote. The plain
flow of a stack lists each backend's own partitioner, as the suite's flow for that backend
makes it, in one ``to_edge_transform_and_lower``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

COMPOSER_PREFIX = "composer_"
STACK_JOIN = "+"  # "openvino+xnnpack": a flow name is also a pytest id, where "," would split
PARTNER = "xnnpack"  # the common deploy case: a backend, and XNNPACK for what it declines
INSTALLED = "installed"  # --composer-flows=installed: the default stacks


def default_stacks() -> list[tuple[str, ...]]:
    """Each backend that lowers here and whose delegates this runtime runs: alone, and before
    XNNPACK."""
    from composer.registry.discovery import default_registry
    from composer.run.runtime import registered_backends

    registry, runnable = default_registry(), registered_backends()
    names = [
        name
        for name, backend in registry.backends.items()
        if registry.unavailable_reason(backend) is None and backend.spec.backend_id in runnable
    ]
    stacks = [(name,) for name in names]
    return stacks + [(name, PARTNER) for name in names if name != PARTNER and PARTNER in names]


def parse_stacks(text: str) -> list[tuple[str, ...]]:
    """``"xnnpack,openvino+xnnpack"`` -> ``[("xnnpack",), ("openvino", "xnnpack")]``;
    ``"installed"``: :func:`default_stacks`."""
    if text.strip() == INSTALLED:
        return default_stacks()
    stacks = [tuple(b.strip() for b in part.split(STACK_JOIN)) for part in text.split(",")]
    return [s for s in stacks if all(s)]


def check_stacks(stacks: Sequence[Sequence[str]]) -> None:
    """Raise composer's ``BackendListError`` (saying which are known) for an unknown backend,
    once, before the suite runs it in every case."""
    from composer.registry.discovery import default_registry

    registry = default_registry()
    for stack in stacks:
        quantized = suite_quantized_flow(stack)
        registry.resolve([quantized.backend] if quantized is not None else list(stack))


def stack_name(stack: Sequence[str]) -> str:
    """The plain flow's name for ``stack``; composer's flow is this with ``composer_`` before."""
    return STACK_JOIN.join(stack)


# --- what composer's flow tells the report beyond the suite's columns ----------------------

# The notes of the case running now: the conformance pytest plugin empties this before each
# case and puts what is in it after the case into the JSON report. One case runs at a time in
# a pytest process (xdist's workers are processes), so a module list is enough.
CASE_NOTES: list[dict[str, Any]] = []


def _note_composition(stack: Sequence[str], plan: Any) -> None:
    from composer.scheduler.plans import describe_repair

    CASE_NOTES.append(
        {
            "stack": ",".join(stack),
            "proof": plan.proof,
            "repairs": [describe_repair(r) for r in plan.repairs],
            "partitions": [f"{p.id} ({p.backend}, {len(p.nodes)} nodes)" for p in plan.partitions],
        }
    )


def _note_refusal(stack: Sequence[str], error: Exception) -> None:
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    CASE_NOTES.append({"stack": ",".join(stack), "refused": f"{type(error).__name__}: {first}"})


# --- composer's flow: stages of the suite's tester that call compose -----------------------


def _nodes_before_lowering(edge_program: Any) -> list[Any]:
    """The program's nodes with each delegate's own nodes in its place, as before lowering."""
    from executorch.exir.lowered_backend_module import LoweredBackendModule

    module = edge_program.graph_module
    nodes = [n for n in module.graph.nodes if n.op == "call_function"]
    for child in module.children():
        if isinstance(child, LoweredBackendModule):
            nodes += list(child.original_module.graph.nodes)
    return nodes


class _ComposedEdge:
    """What the suite reads from its lowering stage's ``EdgeProgramManager``, for a composition:
    the lowered edge program, and (as its ETRecord would hold) the edge graph before lowering."""

    def __init__(self, composition: Any) -> None:
        self.composition = composition
        # Before to_executorch, so the suite counts edge ops by their own names (not .out).
        lowered = composition.unwritten_edge or composition.edge.exported_program()
        self._edge_programs = {"forward": lowered}
        before = SimpleNamespace(graph=SimpleNamespace(nodes=_nodes_before_lowering(lowered)))
        self._etrecord = SimpleNamespace(edge_dialect_program=before)

    def exported_program(self, method_name: str = "forward") -> Any:
        return self._edge_programs[method_name]


def _stage_classes(stack: tuple[str, ...], example_inputs: Any) -> dict[Any, Callable]:
    from executorch.backends.test.harness import Tester
    from executorch.backends.test.harness.stages import Stage, StageType

    class ComposeStage(Stage):
        """The suite's lowering stage, done by ``composer.compose`` with its proof."""

        def stage_type(self) -> StageType:
            return StageType.TO_EDGE_TRANSFORM_AND_LOWER

        def run(self, artifact, inputs=None, generate_etrecord: bool = False) -> None:
            self.edge = _ComposedEdge(_compose(artifact, stack, example_inputs))

        @property
        def artifact(self) -> _ComposedEdge:
            return self.edge

        @property
        def graph_module(self) -> Any:
            return self.edge.exported_program().graph_module

    class ComposedProgram(Stage):
        """The suite's ``to_executorch`` stage: the bytes composer wrote, as they are."""

        def stage_type(self) -> StageType:
            return StageType.TO_EXECUTORCH

        def run(self, artifact: _ComposedEdge, inputs=None) -> None:
            self.program = SimpleNamespace(buffer=artifact.composition.buffer)

        @property
        def artifact(self) -> Any:
            return self.program

        @property
        def graph_module(self) -> None:
            return None

    return Tester.default_stage_classes() | {
        StageType.TO_EDGE_TRANSFORM_AND_LOWER: ComposeStage,
        StageType.TO_EXECUTORCH: ComposedProgram,
    }


def _compose(program: Any, stack: tuple[str, ...], example_inputs: Any) -> Any:
    import composer
    from composer.contract.errors import ComposerError
    from composer.lower.lowering import keeping_unwritten

    def composed(check: bool) -> Any:
        # Cache off: each case costs what a first compose costs, as each plain case does.
        with keeping_unwritten():
            return composer.compose(
                program, list(stack), tuple(example_inputs), cache=False, check=check
            )

    try:
        composition = composed(check=True)
    except ComposerError as error:
        _note_refusal(stack, error)
        # The proof runs every program; the suite runs none that delegates nothing (it passes
        # it unrun), nor one it deems a bad test: ops portable kernels lack left undelegated,
        # or a 3-d convolution anywhere (it skips it). Such a program composed unproven meets
        # a refusal (this runtime has no kernel for an op, or its kernel refuses the input)
        # the suite never lets plain's flow meet: the suite judges it as it judges plain's
        # (int8 conv3d quantized by the suite's own stage, its quantize ops on XNNPACK: 22
        # cases composer "failed" where plain skipped).
        unproven = getattr(error, "unrepaired", None)
        if unproven is None:  # refused after repairs, or before a program was built
            try:
                unproven = composed(check=False)
            except ComposerError:
                raise error from None
        if unproven.plan.partitions and not _suite_skips(unproven):
            raise  # the refusal: bare raise re-raises it once the inner handler is done
        composition = unproven
    _note_composition(stack, composition.plan)
    return composition


def _suite_skips(composition: Any) -> bool:
    """Whether the suite skips ``composition``'s program as a bad test, by the rule it applies
    to every flow's (``executorch.backends.test.suite.runner.run_test``)."""
    from executorch.backends.test.suite import runner
    from executorch.backends.test.suite.reporting import count_ops

    edge = _ComposedEdge(composition)
    undelegated = count_ops({"forward": edge.exported_program()})
    return any(op in runner.UNSUPPORTED_PORTABLE_OPS for op in undelegated) or (
        # private to the suite, and its rule: a 3-d convolution anywhere in the edge graph
        runner._graph_has_unsupported_patterns(edge._etrecord.edge_dialect_program)
    )


def _composer_tester(stack: tuple[str, ...], module: Any, example_inputs: Any, **kwargs: Any):
    from executorch.backends.test.harness import Tester

    stages = _stage_classes(stack, example_inputs)
    return Tester(module, example_inputs, stage_classes=stages, **kwargs)


def composer_flow(stack: Sequence[str]) -> Any:
    """The suite's ``TestFlow`` whose lowering is ``composer.compose(program, stack, inputs)``."""
    from executorch.backends.test.suite.flow import TestFlow

    stack = tuple(stack)
    return TestFlow(
        COMPOSER_PREFIX + stack_name(stack),
        backend=COMPOSER_PREFIX + stack[0],
        tester_factory=functools.partial(_composer_tester, stack),
    )


# --- quantized flows: the suite's, and composer's beside each --------------------------

# The suite's quantized flows whose quantization composer's own quantizer for the backend (its
# plugin's composer_quantizer hook) is: XNNPACK's static int8, weights per channel. composer's
# flow quantizes these with composer.quantize; the others with the suite's own quantize stage.
COMPOSER_QUANTIZES = frozenset({"xnnpack_static_int8_per_channel"})


def suite_quantized_flow(stack: Sequence[str]) -> Any | None:
    """The suite's quantized flow ``stack`` names (``("xnnpack_static_int8_per_channel",)``),
    or ``None``: a stack of backends. Quantized flows are of one backend, as the suite's are."""
    if len(stack) != 1 or "_" not in stack[0]:
        return None  # no backend's name is a quantized flow's: skip importing the suite's flows
    flow = suite_own_flows().get(stack[0])
    return flow if flow is not None and flow.quantize else None


def _composer_quantize_stage(stack: tuple[str, ...]) -> Any:
    """The suite's quantize stage, done by ``composer.quantize(module, stack, inputs)``:
    calibrated on the example inputs alone, as the suite's own stage is."""
    from executorch.backends.test.harness.stages import Quantize

    class ComposerQuantize(Quantize):
        def __init__(self) -> None:
            super().__init__(quantizer=None)

        def run(self, artifact: Any, inputs: Any) -> None:
            import composer
            from composer.contract.errors import ComposerError

            try:
                program = composer.quantize(artifact, list(stack), tuple(inputs))
            except ComposerError as error:
                _note_refusal(stack, error)
                raise
            self.converted_graph = program.module()

    return ComposerQuantize()


def composer_quantized_flow(quantized: Any) -> Any:
    """``composer_<name>`` beside the suite's quantized flow ``<name>``: quantized by
    ``composer.quantize`` where composer's quantizer is the flow's (:data:`COMPOSER_QUANTIZES`),
    else by the suite's own quantize stage; then lowered by ``composer.compose``."""
    from executorch.backends.test.suite.flow import TestFlow

    stack = (quantized.backend,)
    own = quantized.name in COMPOSER_QUANTIZES
    return TestFlow(
        COMPOSER_PREFIX + quantized.name,
        backend=COMPOSER_PREFIX + quantized.backend,
        tester_factory=functools.partial(_composer_tester, stack),
        quantize=True,
        quantize_stage_factory=(
            functools.partial(_composer_quantize_stage, stack)
            if own
            else quantized.quantize_stage_factory
        ),
    )


# --- the suite's plain flow of a stack -------------------------------------------------


def _plain_tester(flows: list[Any], module: Any, example_inputs: Any, **kwargs: Any):
    from executorch.backends.test.harness.stages import StageType

    testers = [f.tester_factory(module, example_inputs, **kwargs) for f in flows]
    lowering = [t._get_default_stage(StageType.TO_EDGE_TRANSFORM_AND_LOWER) for t in testers]
    first = testers[0]
    own_lowering = first.stage_classes[StageType.TO_EDGE_TRANSFORM_AND_LOWER]

    def listed_lowering(*args: Any, **stage_kwargs: Any) -> Any:
        stage = own_lowering(*args, **stage_kwargs)
        # Set after __init__: the harness drops a list given with default_partitioner_cls=None.
        stage.partitioners = [p for each in lowering for p in each.partitioners]
        return stage

    first.stage_classes = first.stage_classes | {
        StageType.TO_EDGE_TRANSFORM_AND_LOWER: listed_lowering
    }
    return first


def plain_flow(stack: Sequence[str], suite_flows: dict[str, Any]) -> Any | None:
    """The suite's own flow for one backend; for a stack, every backend's partitioners listed
    in one lowering. ``None`` where the suite has no float flow for one of the backends."""
    from executorch.backends.test.suite.flow import TestFlow

    flows = [suite_flows.get(name) for name in stack]
    if any(f is None or f.quantize for f in flows):
        return None
    if len(flows) == 1:
        return flows[0]
    # No skip patterns: a backend's own flow skips what that backend gets wrong alone, and
    # whether the stack gets it right is what this flow is for.
    return TestFlow(
        stack_name(stack),
        backend=stack_name(stack),
        tester_factory=functools.partial(_plain_tester, flows),
    )


def conformance_flows(stacks: Sequence[Sequence[str]]) -> dict[str, Any]:
    """For each stack, the suite's plain flow (where it has one) and composer's, by name."""
    suite_flows = suite_own_flows()
    flows: dict[str, Any] = {}
    for stack in stacks:
        quantized = suite_quantized_flow(stack)
        if quantized is not None:
            flows[quantized.name] = quantized
            composed = composer_quantized_flow(quantized)
            flows[composed.name] = composed
            continue
        plain = plain_flow(stack, suite_flows)
        if plain is not None:
            flows[plain.name] = plain
        composed = composer_flow(stack)
        flows[composed.name] = composed
    return flows


def suite_own_flows() -> dict[str, Any]:
    """The flows the suite itself makes here, even after :func:`install_flows` replaced them."""
    from executorch.backends.test.suite import flow as suite_flow

    return getattr(suite_flow.all_flows, "suite_own", suite_flow.all_flows)()


# --- where the suite runs a flow's programs --------------------------------------------


def in_runner(flow: Any, runner: str) -> Any:
    """``flow`` with its programs run in ExecuTorch's C++ runner ``runner`` (the one composer's
    proof uses, ``$COMPOSER_ET_RUNNER``), not in the pip runtime: where that lacks a backend of
    the stack (Vulkan) or does not load (a torch other than the one it was built for)."""
    return dataclasses.replace(
        flow, tester_factory=functools.partial(_runner_tester, flow.tester_factory, runner)
    )


def _runner_tester(factory: Callable, runner: str, module: Any, example_inputs: Any, **kwargs):
    from executorch.backends.test.harness.stages import StageType

    tester = factory(module, example_inputs, **kwargs)
    serialize = functools.partial(_runner_serialize_class(), runner)
    tester.stage_classes = tester.stage_classes | {StageType.SERIALIZE: serialize}
    return tester


@functools.cache
def _runner_serialize_class() -> type:
    from executorch.backends.test.harness.stages import Serialize
    from torch.utils._pytree import tree_flatten

    from composer.run.cpp_runtime import run_program

    class RunnerSerialize(Serialize):
        """The suite's serialize stage, its program run in ExecuTorch's C++ runner."""

        def __init__(self, runner: str) -> None:
            super().__init__()
            self.runner = runner

        def run_artifact(self, inputs: Any) -> list:
            flat, _ = tree_flatten(inputs)
            return run_program(self.runner, self.buffer, {}, flat)

    return RunnerSerialize


def install_flows(stacks: Sequence[Sequence[str]]) -> dict[str, Any]:
    """Make the suite's ``all_flows()`` answer these flows; call before its conftest imports.
    Where ``$COMPOSER_ET_RUNNER`` names a runner, every flow (plain's too) runs its programs in
    it, as composer's proof then does."""
    from executorch.backends.test.suite import flow as suite_flow

    from composer.run.cpp_runtime import runner_path

    flows = conformance_flows(stacks)
    runner = runner_path()
    if runner is not None:
        flows = {name: in_runner(flow, runner) for name, flow in flows.items()}
    own = getattr(suite_flow.all_flows, "suite_own", suite_flow.all_flows)

    def all_flows() -> dict[str, Any]:
        return dict(flows)

    all_flows.suite_own = own  # type: ignore[attr-defined]
    suite_flow.all_flows = all_flows
    return flows
