"""The public entry points: ``plan`` a stack without lowering, ``compose`` it into a .pte; with
``placement="measured"``, the candidates composed here and timed by composer.measure.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from composer.contract.errors import ModelError
from composer.contract.quiet import quiet_call
from composer.lower.cache import cache_dir, cache_enabled
from composer.lower.export import Model
from composer.lower.shared_edge import sharing_edge_programs
from composer.measure import placement as measured
from composer.measure.placement_cache import cache_key
from composer.pipeline.arguments import check_arguments, check_samples_fit, proof_inputs_of
from composer.pipeline.methods import MethodsComposition, compose_methods
from composer.pipeline.stages import Composing, Exported, compose_resolved, plan_resolved
from composer.registry.asking import telling
from composer.registry.discovery import Registry, registry_in_use
from composer.registry.resolved import ResolvedStack, resolve_stack
from composer.registry.stack import Stack
from composer.run import cpp_runtime, cpu_threads, piecewise, remote
from composer.run.composition import Composition
from composer.scheduler.plans import Plan


@quiet_call
def plan(
    model: Model,
    stack: Stack | str | Sequence[str],
    example_inputs: Sequence[Any] | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    debug: bool = False,
    cache: bool = True,
    registry: Registry | None = None,
    dynamic_shapes: Any = None,
    **settings: Any,
) -> Plan:
    """Work out which backend takes which node, without compiling anything.

    Runs on any machine: the partitions are exactly those ``compose`` makes on the target.
    The arguments are as for :func:`compose`; ``placement="measured"`` composes and times
    candidates for real, so it needs backends that run here.
    """
    check_arguments(example_inputs, progress, cache, registry)
    model, stack, dynamic_shapes = _recipe_applied(model, stack, example_inputs, dynamic_shapes)
    stack = Stack.of(stack, **settings)
    exported = Exported.of(model, example_inputs, dynamic_shapes)
    with telling(progress):  # a plugin slow to say its options or whether it runs here
        resolved = resolve_stack(stack, registry, must_lower_here=False)
    return plan_exported(stack, resolved, exported, progress, cache, own_plugins=registry is None)


def plan_exported(
    stack: Stack,
    resolved: ResolvedStack,
    exported: Exported,
    progress: Callable[[str], None] | None = None,
    cache: bool = True,
    *,
    own_plugins: bool = True,
) -> Plan:
    """``plan`` of a model with ``stack`` resolved already (as ``resolved``, every backend
    allowed a stand-in), for a caller that resolved it to decide something first (the testing
    helpers): one resolve a call. ``own_plugins``: the installed plugins resolved it."""
    cache = cache and cache_enabled()
    if stack.placement == "measured":  # it runs programs; a plain plan runs none
        _use_threads(stack)
        how = Composing(progress, cache_dir() if cache else None)
        return _measured(exported, stack, resolved, how).plan
    return plan_resolved(exported, resolved, progress, cache and own_plugins)


def _recipe_applied(model: Model, stack: Any, example_inputs, dynamic_shapes):
    """(model, stack, dynamic_shapes) as given, or for an ExecuTorch ``ExportRecipe`` as the
    stack: the program its stages before lowering make of ``model``, and its backends."""
    if type(stack).__name__ != "ExportRecipe":
        return model, stack, dynamic_shapes
    # executorch.export imports ExecuTorch's compiler: only for a recipe.
    from composer.pipeline.recipes import recipe_backends, recipe_program

    program = recipe_program(stack, model, example_inputs, dynamic_shapes)
    return program, recipe_backends(stack), None


def _use_threads(stack: Stack) -> None:
    """Give XNNPACK the stack's threads before this process runs a program (a composition's
    verify, measured placement): the runtime's pool is fixed once a program loads."""
    if stack.threads is not None:
        cpu_threads.set_threads(stack.threads)


@quiet_call
def compose(
    model: Model,
    stack: Stack | str | Sequence[str],
    example_inputs: Sequence[Any] | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    debug: bool = False,
    cache: bool = True,
    jobs: int | None = None,
    registry: Registry | None = None,
    check: bool = True,
    dynamic_shapes: Any = None,
    constant_methods: Mapping[str, Any] | None = None,
    runtime: str | remote.RemoteRuntime | None = None,
    proof_inputs: Sequence[Sequence[Any]] | None = None,
    **settings: Any,
) -> Composition | MethodsComposition:
    """Lower ``model`` with a stack of backends, in priority order, into one ExecuTorch program.

    ``stack`` is a :class:`~composer.registry.stack.Stack`, or its backends (a list of names or
    ``"a,b"``, or an ExecuTorch ``ExportRecipe``: :mod:`composer.pipeline.recipes`) with the
    other fields of a Stack as keywords: ``options``, ``never``,
    ``min_partition_size``, ``placement``, ``tune_budget``, ``threads`` (``consolidate=False``
    is the older spelling of ``placement="strict"``). ``example_inputs`` export an ``nn.Module``
    (an ``ExportedProgram`` needs none). ``progress`` gets one line per backend and
    partition as lowering goes.

    ``cache`` (default on) reuses what was composed before: the whole program when the model,
    stack and versions are the same, else each lowered partition that is (see
    :mod:`composer.lower.cache`); measured placement's timings are cached too. ``jobs`` processes
    lower partitions in parallel where the backend lowers each on its own (default 1).
    ``registry`` replaces the installed plugins (tests; a program composed with one is not
    cached whole).

    ``check`` (default on): where a runtime here runs every delegate, the program is run once
    on the example inputs and compared with eager before it is returned; a partition whose
    backend fails to lower it, or whose delegate fails to run or to match, is moved to the
    next backend (or portable kernels) and the stack composed again (``plan.repairs``, and
    ``plan.proof`` says how the proof went). With ``placement="strict"`` a failure raises.

    ``dynamic_shapes`` (torch.export's form, e.g. ``({1: Dim("seq", min=2, max=128)},)``)
    exports a module with dynamic dims; the proof then runs the program at the example and at
    each dim's smallest, a middle and its largest size.

    ``proof_inputs``: a few of your own inputs, a list of tuples each like ``example_inputs``
    (real images, real token ids: random example inputs can miss an error that real ones
    show). The proof runs the program at each of them too, beside the sizes above, and
    ``plan.proof`` names them ("at the example and proof inputs 1, 2"); one where the program
    is wrong is repaired like any size. Each must fit the exported program (as many inputs, the
    same dtypes, sizes within a dynamic dim's range), or a ComposerError names it before
    anything is lowered. They need ``check`` on and one method; with them the whole program is
    neither read from nor written to the cache (it was proven on other inputs), though its
    lowered partitions are.

    ``model`` may be a dict of methods, name -> ExportedProgram or (module, example_inputs),
    with ``constant_methods`` (values the runtime returns by name, as LLM runners read them):
    one program of several methods, each composed with the stack and proven in it
    (:class:`~composer.pipeline.methods.MethodsComposition`).

    ``runtime`` (``"HOST:PORT"`` of a ``composer agent``, its token in
    ``$COMPOSER_RUNTIME_TOKEN``, or a :class:`~composer.run.remote.RemoteRuntime`): the proof
    runs the program on that machine, and only there; a composed program is then not read
    from nor written to the cache whole.

    ``debug``: let upstream libraries' warnings and log lines through (torch's, torchao's,
    ExecuTorch's, a backend's, Inductor's autotuning), which composer keeps off the terminal
    while it works, as the command line does; ``$COMPOSER_DEBUG=1`` does so for every call.
    composer's own warnings (:class:`~composer.contract.errors.ComposerWarning`) always show.
    """
    check_arguments(example_inputs, progress, cache, registry, check, jobs, constant_methods)
    several = isinstance(model, Mapping)
    samples = proof_inputs_of(proof_inputs, several=several, check=check)
    if not several:
        _without_constant_methods(constant_methods)
        model, stack, dynamic_shapes = _recipe_applied(model, stack, example_inputs, dynamic_shapes)
    stack = Stack.of(stack, **settings)
    _use_threads(stack)
    # With measured placement each candidate must lower here, not the whole stack.
    with telling(progress):  # a plugin slow to say its options or whether it runs here
        resolved = resolve_stack(stack, registry, must_lower_here=stack.placement != "measured")
    with remote.runtime_at(runtime):
        return compose_model(
            stack, resolved, model, example_inputs, progress=progress, cache=cache, jobs=jobs,
            check=check, dynamic_shapes=dynamic_shapes, constant_methods=constant_methods,
            own_plugins=registry is None, proof_inputs=samples,
        )  # fmt: skip


def compose_model(
    stack: Stack,
    resolved: ResolvedStack,
    model: Model | Mapping[str, Any],
    example_inputs: Sequence[Any] | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    cache: bool = True,
    jobs: int | None = None,
    check: bool = True,
    dynamic_shapes: Any = None,
    constant_methods: Mapping[str, Any] | None = None,
    own_plugins: bool = True,
    proof_inputs: Sequence[Sequence[Any]] | None = None,
) -> Composition | MethodsComposition:
    """``compose`` of a model with ``stack`` resolved already (as ``resolved``; every backend
    lowers here unless placement is measured), for a caller that resolved it to decide
    something first (the testing helpers): one resolve a call. ``own_plugins``: the installed
    plugins resolved it, so the whole program may be cached (never with ``proof_inputs``: a
    program cached whole was proven on other inputs)."""
    _use_threads(stack)  # a no-op after compose's own: its caller may not have
    several = isinstance(model, Mapping)
    samples = proof_inputs_of(proof_inputs, several=several, check=check)
    cache = cache and cache_enabled()
    whole = cache and own_plugins and remote.active() is None and not samples
    how = Composing(progress, cache_dir() if cache else None, 1 if several else _jobs(jobs),
                    check, whole_cache=whole, proof_inputs=samples)  # fmt: skip
    compose_one = _stages(stack, resolved, how)
    # The proof finds each backend's runtime in the plugins that lowered it.
    with registry_in_use(resolved.registry):
        if several:
            return compose_methods(
                model, resolved, compose_one, how, constant_methods=constant_methods
            )
        exported = Exported.of(model, example_inputs, dynamic_shapes)
        if samples:  # before any lowering: the exported program says what it takes
            check_samples_fit(samples, exported.inputs(), exported.program())
        return compose_one(exported)


def _without_constant_methods(constant_methods) -> None:
    if constant_methods:
        raise ModelError(
            "constant_methods go with several methods: pass model as {'forward': model, ...}."
        )


def _stages(stack: Stack, resolved: ResolvedStack, how: Composing):
    """What composes one exported model: measured placement, or the stack as it is."""
    if stack.placement == "measured":
        return functools.partial(_measured, stack=stack, resolved=resolved, how=how)
    return functools.partial(compose_resolved, resolved=resolved, how=how)


def _jobs(jobs: int | None) -> int:
    # check_arguments has refused anything but None or a count. Forking a process that holds
    # a lowered program costs more than a 2-core machine wins back (bench/RESULTS.md,
    # "Composing again"): parallel is asked for.
    return 1 if jobs is None else jobs


def _measured(exported: Exported, stack: Stack, resolved: ResolvedStack, how: Composing):
    """Compose with the fastest candidate placement, measured here (composer.measure.placement).
    ``resolved``: the whole ``stack``, resolved where it may not lower here; each candidate
    must. Measurements are cached where ``how`` caches lowered partitions."""
    program = exported.program()
    # With a backend in the stack whose plugin's runtime runs here (cuda on a GPU), every
    # candidate runs piece by piece: one way of running for all, or the comparison would
    # measure the executors.
    hosted = any(
        (runtime := piecewise.plugin_runtime(b.spec.backend_id)) is not None
        and runtime[1].unavailable_reason() is None
        for b in resolved.backends
    )
    # Where ExecuTorch's C++ runtime is named, the candidates are timed there: the runtime
    # they deploy to (hosted timing ranked them otherwise on the H100).
    runner = cpp_runtime.runner_path()
    # Candidates reuse lowered partitions wherever caching is on; none is cached whole.
    candidate_how = Composing(folder=cache_dir() if cache_enabled() else None, check=how.check,
                              proof_inputs=how.proof_inputs)  # fmt: skip

    def only(candidate) -> ResolvedStack:
        """The candidate's stack: its backends with their settings, the user's pins and its
        own node pins."""
        kept = stack.only(candidate.backends, candidate.placement)
        kept = attrs.evolve(
            kept, never=candidate.never(kept.never), keep_whole=candidate.keep_whole
        )
        return resolved.narrowed(kept)

    def compose_candidate(candidate):
        return compose_resolved(exported, only(candidate).lowered_here(), candidate_how)

    def plan_candidate(candidate):
        return plan_resolved(exported, only(candidate))

    # Every candidate, layout and plan lowers the same model: the decompositions to the edge
    # dialect that they reach alike are made once (composer.lower.shared_edge).
    with sharing_edge_programs():
        choice, composed = measured.measure(
            compose_candidate,
            list(stack.backends),
            exported.inputs(),
            key=cache_key(program, stack.backends, stack.settings(), measured.RUNS, runner),
            budget_s=stack.tune_budget,
            progress=how.progress,
            cache_dir=how.folder,
            hosted=hosted,
            plan_candidate=plan_candidate,
            never={name: sorted(pins) for name, pins in stack.never.items()},
            threads_set=stack.threads is not None,
            runner=runner,
        )
        composition = composed.get(choice.chosen) or compose_candidate(choice.chosen)
    composition.plan = attrs.evolve(composition.plan, placement=choice.placement())
    return composition
