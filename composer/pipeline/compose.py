"""The public entry points: ``plan`` a stack without lowering, ``compose`` it into a .pte; with
``placement="measured"``, the candidates composed here and timed by composer.measure.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch
from torch.export import ExportedProgram

from composer.contract.errors import ComposerError, ComposerWarning, ModelError
from composer.lower.cache import DamagedEntryWarning, cache_dir, cache_enabled
from composer.lower.export import (
    Model,
    eager_of,
    example_inputs_of,
    export_model,
    fresh_program,
    model_copy,
)
from composer.lower.lowering import Lowered, lower_program, with_backend_facts
from composer.lower.program_cache import ProgramCache
from composer.lower.shared_edge import sharing_edge_programs
from composer.measure import placement as measured
from composer.measure.placement_cache import cache_key
from composer.pipeline.arguments import check_arguments
from composer.pipeline.methods import MethodsComposition, compose_methods
from composer.pipeline.proven import composed_and_proven, repaired_stack
from composer.registry.discovery import Registry
from composer.registry.names import is_count
from composer.registry.resolved import ResolvedStack, resolve_stack
from composer.registry.stack import Stack
from composer.run import aoti_host, cpp_runtime, cpu_threads, cuda_manifest
from composer.run.composition import Composition
from composer.scheduler.plans import Plan


def plan(
    model: Model,
    stack: Stack | str | Sequence[str],
    example_inputs: Sequence[Any] | None = None,
    *,
    progress: Callable[[str], None] | None = None,
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
    if dynamic_shapes is not None:
        model = export_model(model, example_inputs, dynamic_shapes)
    cache = cache and cache_enabled()
    if stack.placement == "measured":  # it runs programs; a plain plan runs none
        _use_threads(stack)
        return _measured(model, stack, example_inputs, progress, cache, registry).plan
    given_registry = registry is not None
    resolved = resolve_stack(stack, registry, must_lower_here=False)
    wanted = cache and not given_registry
    # A composed program's entry holds its plan too: planning after composing costs nothing.
    cached = _program_cache(PLAN_SOURCES, wanted, resolved)
    stored = cached.by_module(model, example_inputs) if cached else None
    if stored is None:
        program = export_model(model, example_inputs)
        stored = cached.by_program(program) if cached else None
    if stored is None:
        # executorch.exir takes seconds to import, and a plan from the cache needs none of it.
        from composer.lower.stack import lower_stack

        # Lowering changes the program it is given: never the user's own (planning export_llama's
        # decoder twice raised KeyError 'rope.freqs_cos').
        source = (
            fresh_program(model, example_inputs) if isinstance(model, ExportedProgram) else program
        )
        with _composer_warnings() as said:
            # Plan mode compiles nothing: every backend lowers to the stand-in.
            _edge, result = lower_stack(source, resolved.planned(), progress)
        result = with_backend_facts(result, resolved.backends)
        if cached:
            cached.save({"plan": result, "warnings": said})
    else:
        if progress is not None:
            progress(f"reused the plan from the cache ({cache_dir()})")
        _replay(stored.get("warnings", ()))
        # A plan runs nothing, so it claims no proof, even read from a proven program.
        result = attrs.evolve(stored["plan"], proof="")
    stand_ins = tuple(b.name for b in resolved.backends if b.name in resolved.stand_ins)
    return attrs.evolve(result, stand_ins=stand_ins)


PLAN_SOURCES = ("plan", "program")  # where a plan may be found, in order


def _recipe_applied(model: Model, stack: Any, example_inputs, dynamic_shapes):
    """(model, stack, dynamic_shapes) as given, or for an ExecuTorch ``ExportRecipe`` as the
    stack: the program its stages before lowering make of ``model``, and its backends."""
    if type(stack).__name__ != "ExportRecipe":
        return model, stack, dynamic_shapes
    # executorch.export imports ExecuTorch's compiler: only for a recipe.
    from composer.pipeline.recipes import recipe_backends, recipe_program

    program = recipe_program(stack, model, example_inputs, dynamic_shapes)
    return program, recipe_backends(stack), None


def _program_cache(kinds: tuple[str, ...], wanted, resolved: ResolvedStack):
    """The cache of whole results for this stack, if caching is on and the stack digestible.

    Not with an explicit registry: it may hold plugin objects whose state no digest sees,
    while installed plugins are known by distribution, version and code."""
    if not wanted:
        return None

    return ProgramCache.open(
        cache_dir(), kinds, resolved.backends, resolved.stack, resolved.registry
    )


def _use_threads(stack: Stack) -> None:
    """Give XNNPACK the stack's threads before this process runs a program (a composition's
    verify, measured placement): the runtime's pool is fixed once a program loads."""
    if stack.threads is not None:
        cpu_threads.set_threads(stack.threads)


def compose(
    model: Model,
    stack: Stack | str | Sequence[str],
    example_inputs: Sequence[Any] | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    cache: bool = True,
    jobs: int | None = None,
    registry: Registry | None = None,
    check: bool = True,
    dynamic_shapes: Any = None,
    constant_methods: Mapping[str, Any] | None = None,
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

    ``model`` may be a dict of methods, name -> ExportedProgram or (module, example_inputs),
    with ``constant_methods`` (values the runtime returns by name, as LLM runners read them):
    one program of several methods, each composed with the stack and proven in it
    (:class:`~composer.pipeline.methods.MethodsComposition`).
    """
    check_arguments(example_inputs, progress, cache, registry, check, jobs, constant_methods)
    if isinstance(model, Mapping):
        return compose_methods(
            model, stack, compose, constant_methods=constant_methods, progress=progress,
            cache=cache, registry=registry, check=check, **settings,
        )  # fmt: skip
    if constant_methods:
        raise ModelError(
            "constant_methods go with several methods: pass model as {'forward': model, ...}."
        )
    model, stack, dynamic_shapes = _recipe_applied(model, stack, example_inputs, dynamic_shapes)
    stack = Stack.of(stack, **settings)
    if dynamic_shapes is not None:
        model = export_model(model, example_inputs, dynamic_shapes)
    cache = cache and cache_enabled()
    _use_threads(stack)
    if stack.placement == "measured":
        return _measured(model, stack, example_inputs, progress, cache, registry, check)
    given_registry = registry is not None
    resolved = resolve_stack(stack, registry)
    workers = _jobs(jobs)
    folder = cache_dir() if cache else None
    cached = _program_cache(("program",), cache and not given_registry, resolved)
    composing = _Composing(model, example_inputs, resolved, progress, folder, workers)
    stored = cached.by_module(model, example_inputs) if cached else None
    if stored is None and cached:
        stored = cached.by_program(composing.program())
    if stored is not None:
        if progress is not None:
            progress(f"reused the composed program from the cache ({folder})")
        _replay(stored.get("warnings", ()))
        return composing.from_cache(stored)
    with _composer_warnings() as said:
        composition = composed_and_proven(
            composing.build, resolved.stack, check=check, progress=progress
        )
    # Only what can be lowered again to the same bytes: a composition from the cache lowers
    # again for its edge program and reference, which must match its bytes. A program that
    # was not checked is not stored: the cache holds proven programs only.
    if cached and composing.made[-1].repeatable and check:
        cached.save({"buffer": composition.buffer, "data_files": composition.data_files,
                     "plan": composition.plan, "warnings": said})  # fmt: skip
    return composition


@attrs.define(eq=False)
class _Composing:
    """One model composed with one resolved stack: exported once, lowered for each attempt
    (``build``, which composed_and_proven calls with each repaired stack)."""

    model: Model
    example_inputs: Sequence[Any] | None
    resolved: ResolvedStack
    progress: Callable[[str], None] | None
    folder: Path | None  # the cache of lowered partitions (None: none)
    workers: int
    made: list[Lowered] = attrs.field(factory=list)  # what each build lowered, in order
    _exported: ExportedProgram | None = None
    _exported_used: bool = False  # the exported program went to a lowering, which changed it

    def program(self) -> ExportedProgram:
        """The model exported, once."""
        if self._exported is None:
            self._exported = export_model(self.model, self.example_inputs)
        return self._exported

    def fresh(self) -> ExportedProgram:
        """A program no lowering has touched, equal to ``program()``."""
        return fresh_program(self.model, self.example_inputs)

    def lower(self, stack: Stack) -> Lowered:
        """The model lowered with ``stack`` (the resolved stack's, maybe repaired)."""
        # ExecuTorch's lowering changes the program it is given (a rotary embedding's
        # non-persistent inv_freq leaves it: lowering it again for a repair raised KeyError
        # 'model.rotary_emb.inv_freq'), so each lowering after the first gets a fresh one,
        # and a program the user passed is never lowered itself.
        first = not self._exported_used and not isinstance(self.model, ExportedProgram)
        source = self.program() if first else self.fresh()
        self._exported_used = True
        resolved = self.resolved
        return lower_program(
            source, resolved.lowering(stack), self.progress, self.folder, self.workers,
            again=self.fresh,
        )  # fmt: skip

    def build(self, stack: Stack) -> Composition:
        """The composition of the model lowered with ``stack``."""
        lowered = self.lower(stack)
        self.made.append(lowered)
        return Composition(lowered.buffer, lowered.data_files, lowered.plan,
                           eager_of(self.model, self.example_inputs),
                           example_inputs_of(self.model, self.example_inputs),
                           lowered=lowered)  # fmt: skip

    def from_cache(self, stored: Mapping[str, Any]) -> Composition:
        """The composition the cache stored, lowered again only if asked for."""
        # Maybe after the caller ran the model, which can update its buffers in place (a KV
        # cache): from the model as it is now. torch.export's graph depends on the grad mode
        # (verify runs under no_grad). A repaired program is lowered again with its repairs.
        again = _LoweringAgain(
            model_copy(self.model), self.example_inputs, torch.is_grad_enabled(),
            self.resolved, repaired_stack(self.resolved.stack, stored["plan"].repairs),
            self.progress, self.folder, self.workers,
        )  # fmt: skip
        return Composition(stored["buffer"], stored["data_files"], stored["plan"],
                           eager_of(self.model, self.example_inputs),
                           example_inputs_of(self.model, self.example_inputs),
                           from_cache=True, lower=again)  # fmt: skip


@attrs.frozen(eq=False)
class _LoweringAgain:
    """A composition from the cache, lowered again when asked for (its edge program, its
    reference): from a copy of the model as it was composed, with the stack it was."""

    model: Model  # a copy: the caller's model may change after
    example_inputs: Sequence[Any] | None
    grad: bool  # the grad mode it was composed in
    resolved: ResolvedStack
    stack: Stack  # the resolved stack with the stored plan's repairs
    progress: Callable[[str], None] | None
    folder: Path | None
    workers: int

    def export(self) -> ExportedProgram:
        with torch.set_grad_enabled(self.grad):
            return export_model(self.model, self.example_inputs)

    def __call__(self) -> Lowered:
        resolved = self.resolved
        return lower_program(
            self.export(), resolved.lowering(self.stack), self.progress, self.folder,
            self.workers, again=self.export,
        )  # fmt: skip


@contextlib.contextmanager
def _composer_warnings():
    """composer's own warnings while lowering (a pin that names no op...), as they are also
    shown, so that a result from the cache says them again."""
    said: list[tuple[type, str]] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ComposerWarning)
        yield said
    for warning in caught:
        if issubclass(warning.category, ComposerWarning) and not issubclass(
            warning.category, DamagedEntryWarning
        ):
            said.append((warning.category, str(warning.message)))
        warnings.warn_explicit(warning.message, warning.category, warning.filename,
                               warning.lineno, source=warning.source)  # fmt: skip


def _replay(said) -> None:
    for category, message in said:
        warnings.warn(message, category, stacklevel=3)


def _jobs(jobs: int | None) -> int:
    if jobs is None:
        # Forking a process that holds a lowered program costs more than a 2-core machine
        # wins back (bench/RESULTS.md, "Composing again"): parallel is asked for.
        return 1
    if not is_count(jobs):
        raise ComposerError(f"jobs must be a whole number >= 1, not {jobs!r}.")
    return jobs


def _measured(
    model, stack: Stack, example_inputs, progress, cache: bool, registry, check: bool = True
) -> Composition:
    """Compose with the fastest candidate placement, measured here (composer.measure.placement)."""

    # The checks every candidate's compose makes, once and before any work.
    resolved = resolve_stack(stack, registry, must_lower_here=False)
    registry = resolved.registry
    program = export_model(model, example_inputs)
    # With CUDA in the stack, on a GPU, every candidate runs hosted: one way of running
    # for all, or the comparison would measure the executors.
    hosted = aoti_host.host_unavailable_reason() is None and any(
        b.spec.backend_id == cuda_manifest.CUDA_BACKEND_ID for b in resolved.backends
    )
    # Where ExecuTorch's C++ runtime is named, the candidates are timed there: the runtime
    # they deploy to (hosted timing ranked them otherwise on the H100).
    runner = cpp_runtime.runner_path()

    def only(candidate) -> Stack:
        """The candidate's stack: its backends with their settings, the user's pins and its
        own node pins."""
        kept = stack.only(candidate.backends, candidate.placement)
        return attrs.evolve(
            kept, never=candidate.never(kept.never), keep_whole=candidate.keep_whole
        )

    def compose_candidate(candidate):
        return compose(model, only(candidate), example_inputs, registry=registry, check=check)

    def plan_candidate(candidate):
        return plan(model, only(candidate), example_inputs, registry=registry)

    # Every candidate, layout and plan lowers the same model: the decompositions to the edge
    # dialect that they reach alike are made once (composer.lower.shared_edge).
    with sharing_edge_programs():
        choice, composed = measured.measure(
            compose_candidate,
            list(stack.backends),
            example_inputs_of(program, example_inputs),
            key=cache_key(program, stack.backends, stack.settings(), measured.RUNS, runner),
            budget_s=stack.tune_budget,
            progress=progress,
            cache_dir=cache_dir() if cache else None,
            hosted=hosted,
            plan_candidate=plan_candidate,
            never={name: sorted(pins) for name, pins in stack.never.items()},
            threads_set=stack.threads is not None,
            runner=runner,
        )
        composition = composed.get(choice.chosen) or compose_candidate(choice.chosen)
    composition.plan = attrs.evolve(composition.plan, placement=choice.placement())
    return composition
