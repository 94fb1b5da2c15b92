"""composer's pytest plugin: pin how a model is composed, and check it computes what eager does.

Active once composer is installed (entry point ``pytest11``). In a test::

    def test_my_model(composer_check):
        composer_check(MyModel(), ["tensorrt_stub", "xnnpack"], (torch.randn(1, 16),),
                       golden="my_model")

``composer_check`` composes the model (plans it, for backends that cannot lower on this
machine), asserts every partition convex and the stacked program acyclic, compares the output
as the proof judges it, against fp64 beside eager (in the ExecuTorch runtime where the stack allows,
else the Python reference run), and compares the plan with ``golden/<name>.json`` beside the
test file. ``pytest --composer-update-golden`` rewrites the golden files.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import pytest

if TYPE_CHECKING:
    from composer.registry.stack import Stack
    from composer.scheduler.plans import Plan

# pytest loads this plugin in every run wherever composer is installed: composer's own modules
# (and through them torch and ExecuTorch) are imported inside the functions that use them.

GOLDEN_DIR = "golden"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("composer")
    group.addoption(
        "--composer-update-golden",
        action="store_true",
        default=False,
        help="rewrite composer's golden plan files instead of comparing with them",
    )
    group.addoption(
        "--composer-flows",
        default=None,
        metavar="STACKS",
        help="run ExecuTorch's backend test suite (executorch.backends.test.suite) with these "
        "stacks through composer, each beside the suite's plain flow: comma-separated, a "
        "stack's backends joined by '+' (xnnpack,openvino+xnnpack); 'installed': each backend "
        "that runs here, alone and before xnnpack",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser, args) -> None:
    # The suite's conftest reads its flows when it is imported, which for a path on the
    # command line is before pytest_configure: the flows are replaced here, earlier.
    flows = early_config.known_args_namespace.composer_flows
    if flows:
        from composer.conformance.plugin import activate

        activate(early_config, flows)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "composer: a composition regression test")


def golden_summary(plan: Plan) -> dict[str, Any]:
    """The parts of a plan a golden file pins (:func:`composer.report.golden.golden_summary`)."""
    from composer.report.golden import golden_summary as summary

    return summary(plan)


def describe_golden_diff(expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    """What moved, in words (:func:`composer.report.golden.describe_golden_diff`)."""
    from composer.report.golden import describe_golden_diff as describe

    return describe(expected, actual)


def check_convex(plan: Plan, lowered: Any) -> None:
    """Assert, on the program ExecuTorch lowered, that each partition is one delegate in a DAG.

    ``lowered`` is the lowered ``EdgeProgramManager``, ``ExportedProgram`` or graph module.
    A partition that left itself and came back, or partitions forming a cycle, could not each
    have become one node of a topologically ordered graph.
    """
    import operator

    import torch.fx
    from executorch.exir.delegate import executorch_call_delegate

    if hasattr(lowered, "exported_program"):
        lowered = lowered.exported_program()
    graph_module = lowered if isinstance(lowered, torch.fx.GraphModule) else lowered.graph_module
    graph_module.graph.lint()  # raises if a node comes before one of its inputs
    delegates: dict[frozenset[str], str] = {}
    for node in graph_module.graph.nodes:
        if node.op == "call_function" and node.target is executorch_call_delegate:
            inner = getattr(graph_module, node.args[0].target).original_module.graph
            members = frozenset(
                n.name
                for n in inner.nodes
                if n.op == "call_function" and n.target is not operator.getitem
            )
            delegates[members] = node.name
    for partition in plan.partitions:
        members = frozenset(partition.nodes)
        assert members in delegates, (
            f"partition {partition.id} ({', '.join(sorted(members))}) is not one delegate of "
            "the lowered program"
        )
    planned = {frozenset(p.nodes) for p in plan.partitions}
    assert set(delegates) == planned, (
        f"delegates the plan does not list: {[delegates[m] for m in set(delegates) - planned]}"
    )


def _lowered_with_stand_ins(model, backends, example_inputs, settings: dict[str, Any]):
    """The program ``composer.plan`` lowers to stand-ins (it returns only the plan) and that
    plan, from one lowering, for a caller that has not resolved the stack (tests beside
    ``composer.plan``)."""
    from composer.registry.resolved import resolve_stack
    from composer.registry.stack import Stack

    settings = dict(settings)
    registry = settings.pop("registry", None)
    settings.pop("cache", None)
    resolved = resolve_stack(Stack.of(backends, **settings), registry, must_lower_here=False)
    return _planned_with_stand_ins(model, example_inputs, resolved)


def _stand_ins_lowered(model, example_inputs, resolved):
    """The program ``composer.plan`` lowers to stand-ins, with the stack resolved already."""
    edge, _plan = _planned_with_stand_ins(model, example_inputs, resolved)
    return edge


def _planned_with_stand_ins(model, example_inputs, resolved):
    """The program ``composer.plan`` lowers to stand-ins and the plan it returns, from one
    lowering (``composer.plan`` keeps only the plan: lowering again for the program doubled
    what a planned-only check cost)."""
    from composer.lower.export import export_model
    from composer.lower.lowering import with_backend_facts
    from composer.lower.priority import lower_in_order

    program = export_model(model, example_inputs)
    edge, plan = lower_in_order(program, resolved.planned())
    # as composer.pipeline.stages.plan_resolved finishes a plan it lowered
    plan = with_backend_facts(plan, resolved.backends)
    stand_ins = tuple(b.name for b in resolved.backends if b.name in resolved.stand_ins)
    return edge, attrs.evolve(plan, stand_ins=stand_ins)


@attrs.frozen
class CheckResult:
    plan: Plan
    verified: bool  # False where the stack could only be planned here
    executor: str
    max_abs_error: float


class CompositionChecker:
    """The callable behind the ``composer_check`` fixture."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self.request = request
        self.update = request.config.getoption("--composer-update-golden")

    def __call__(
        self,
        model,
        backends: Stack | str | Sequence[str],  # a Stack, or backends with its fields below
        example_inputs: Sequence[Any] | None = None,
        *,
        golden: str | None = None,
        **settings: Any,
    ) -> CheckResult:
        from composer.pipeline.arguments import check_arguments
        from composer.pipeline.compose import compose_model
        from composer.registry.resolved import resolve_stack
        from composer.registry.stack import Stack

        cache = settings.get("cache", True)
        stack = Stack.of(backends, **{k: v for k, v in settings.items() if k != "cache"})
        if stack.placement == "measured":
            pytest.fail(
                "composer_check pins an assignment, and measured placement chooses anew on "
                "every machine and run. Measure once, then check with the config it prints: "
                "composer.config.stack_from_text(plan.placement.config), or the same "
                "lines in composer.toml read with composer.config.stack_from(path).",
                pytrace=False,
            )
        # Resolved once: whether it lowers here, then what composes or plans it.
        resolved = resolve_stack(stack, must_lower_here=False)
        check_arguments(example_inputs, cache=cache)
        if not resolved.stand_ins:
            composition = compose_model(stack, resolved, model, example_inputs, cache=cache)
            plan = composition.plan
            verification = composition.verify()
            assert verification.ok, f"composed output differs from eager: {verification}"
            result = CheckResult(plan, True, verification.executor, verification.max_abs_error)
            lowered = composition.edge
        else:
            # One lowering gives both the plan and the program its convexity is checked on.
            lowered, plan = _planned_with_stand_ins(model, example_inputs, resolved)
            result = CheckResult(plan, False, "not run (planned with stand-ins)", float("nan"))
        check_convex(plan, lowered)
        if golden is not None:
            self._compare_golden(golden, plan)
        return result

    def _compare_golden(self, name: str, plan: Plan) -> None:
        path = self.request.path.parent / GOLDEN_DIR / f"{name}.json"
        actual = golden_summary(plan)
        if self.update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(actual, indent=2) + "\n")
            return
        if not path.exists():
            pytest.fail(
                f"no golden plan {path}; run pytest --composer-update-golden to write it",
                pytrace=False,
            )
        expected = json.loads(path.read_text())
        if expected != actual:
            changes = describe_golden_diff(expected, actual)
            pytest.fail(
                f"the composition changed from golden plan {path.name}:\n  "
                + "\n  ".join(changes)
                + "\n(if this is intended, run pytest --composer-update-golden)",
                pytrace=False,
            )


@pytest.fixture
def composer_check(request: pytest.FixtureRequest) -> CompositionChecker:
    """Compose, check convexity and outputs, and compare with a golden plan; see the module."""
    return CompositionChecker(request)


# --- checking a backend plugin against the contract ------------------------------------

PLUGIN_CHECK_MODELS = ("mlp", "cnn", "transformer_block")
PLUGIN_CHECK_PARTNERS = ("xnnpack",)


def check_plugin(
    plugin: Any,
    *,
    name: str | None = None,
    models: Sequence[str] = PLUGIN_CHECK_MODELS,
    partners: Sequence[str] = PLUGIN_CHECK_PARTNERS,
) -> list[str]:
    """Check a backend plugin against composer's contract on zoo models, as composer uses it.

    Every backend the plugin declares is planned and composed alone and before and after
    each of ``partners``, on each of ``models``: the plan's partitions must be those lowering
    makes and the output must match eager (planned only where the backend cannot lower on
    this machine). Raises ``AssertionError`` listing every problem; returns what was checked.
    """
    import warnings

    from composer.contract.errors import ComposerWarning
    from composer.models import zoo
    from composer.registry.discovery import PluginInfo, Registry

    registry = Registry.from_entry_points()
    name = name or getattr(plugin, "__name__", type(plugin).__name__)
    if not registry.has_plugin(plugin):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ComposerWarning)
            registry.add_plugin(plugin, PluginInfo(name, "the plugin under test", "0"))
        skipped = [f for f in registry.failed if f.name == name]
        if skipped:
            raise AssertionError(
                f"composer skips plugin {name!r}: {skipped[0].error}\n"
                + "\n".join(str(w.message) for w in caught)
            )
    backends = [b.name for b in registry.backends.values() if b.plugin is plugin]
    if not backends:
        raise AssertionError(f"plugin {name!r} declares no backend in composer_backends.")
    checked, problems = [], []
    for backend in backends:
        stacks = [[backend]]
        stacks += [[backend, p] for p in partners if p != backend]
        stacks += [[p, backend] for p in partners if p != backend]
        for model_name in models:
            for stack in stacks:
                what = f"zoo:{model_name} with {','.join(stack)}"
                model, inputs = zoo.load(model_name)
                problem = _plugin_check_problem(registry, model, stack, inputs)
                checked.append(what)
                if problem is not None:
                    problems.append(f"{what}: {problem}")
    if problems:
        raise AssertionError(
            f"plugin {name!r} breaks composer's contract:\n  " + "\n  ".join(problems)
        )
    return checked


def _plugin_check_problem(registry, model, stack: list[str], inputs) -> str | None:
    from composer.pipeline.compose import compose_model, plan_exported
    from composer.pipeline.stages import Exported
    from composer.registry.resolved import resolve_stack
    from composer.registry.stack import Stack

    try:
        # Resolved once: what plans it, whether it lowers here, then what composes it.
        given = Stack.of(stack)
        resolved = resolve_stack(given, registry, must_lower_here=False)
        planned = plan_exported(given, resolved, Exported(model, inputs), own_plugins=False)
        if resolved.stand_ins:
            return None  # planned only: the backend cannot lower on this machine
        composition = compose_model(given, resolved, model, inputs, own_plugins=False)
        if composition.plan.partitions != planned.partitions:
            return "the plan's partitions differ from those lowering made"
        verification = composition.verify()
    except Exception as error:  # noqa: BLE001 - every failure is a finding to report
        return f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error) else ''}"
    return None if verification.ok else f"output differs from eager: {verification}"


@pytest.fixture
def composer_plugin_check() -> Any:
    """:func:`check_plugin`, for a plugin's own test suite."""
    return check_plugin
