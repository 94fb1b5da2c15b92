"""The public entry points: ``plan`` a stack without lowering, ``compose`` it into a .pte."""

from __future__ import annotations

import contextlib
import copy
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import torch
from torch.export import ExportedProgram

from composer import cpu_threads
from composer.atomic import write_all
from composer.cache import DamagedEntryWarning, Store, cache_dir, cache_enabled
from composer.errors import BackendListError, ComposerError, ComposerWarning, ModelError
from composer.plans import Plan
from composer.registry import Registry, default_registry
from composer.runtime import program_backend_ids, registered_backends, torch_mismatch
from composer.stack import Stack, is_count

if TYPE_CHECKING:
    from executorch.exir import EdgeProgramManager, ExecutorchProgramManager

    from composer.verification import Verification

Model = ExportedProgram | torch.nn.Module


def export_model(model: Model, example_inputs: Sequence[Any] | None) -> ExportedProgram:
    """An ``ExportedProgram`` as is; a module exported with its example inputs."""
    if isinstance(model, ExportedProgram):
        return model
    if not isinstance(model, torch.nn.Module):
        raise ModelError(
            f"expected a torch.nn.Module or torch.export.ExportedProgram, got "
            f"{type(model).__name__}."
        )
    if example_inputs is None:
        raise ModelError(
            f"{type(model).__name__} is an nn.Module: pass example_inputs (a tuple of tensors) "
            "so it can be exported, or pass an ExportedProgram."
        )
    try:
        return torch.export.export(model.eval(), tuple(example_inputs), strict=False)
    except Exception as error:
        raise ModelError(
            f"torch.export failed for {type(model).__name__}: {type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}. Make the model exportable "
            "(see torch.export's docs) or export it yourself and pass the ExportedProgram."
        ) from error


def _example_inputs(model: Model, given: Sequence[Any] | None) -> tuple:
    if given is not None:
        return tuple(given)
    stored = getattr(model, "example_inputs", None)
    if stored:
        args, _kwargs = stored
        return tuple(args)
    return ()


def _prepare(stack: Stack, registry, plan_only):
    registry = registry or default_registry()
    resolved = registry.resolve(stack.backends)
    stand_ins = set()
    for backend in resolved:
        reason = registry.unavailable_reason(backend)
        if reason is None:
            continue
        if not plan_only:
            raise BackendListError(
                f"backend {backend.name!r} cannot lower on this machine: {reason}. Run "
                "composer.plan() here for the plan, and compose on a machine that has it."
            )
        stand_ins.add(backend.name)
    return resolved, registry, stand_ins


def plan(
    model: Model,
    stack: Stack | str | Sequence[str],
    example_inputs: Sequence[Any] | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    cache: bool = True,
    registry: Registry | None = None,
    **settings: Any,
) -> Plan:
    """Work out which backend takes which node, without compiling anything.

    Runs on any machine: the partitions are exactly those ``compose`` makes on the target.
    The arguments are as for :func:`compose`; ``placement="measured"`` composes and times
    candidates for real, so it needs backends that run here.
    """
    stack = Stack.of(stack, **settings)
    cache = cache and cache_enabled()
    if stack.placement == "measured":  # it runs programs; a plain plan runs none
        _use_threads(stack)
        return _measured(model, stack, example_inputs, progress, cache, registry).plan
    given_registry = registry is not None
    resolved, registry, unavailable = _prepare(stack, registry, True)
    stack = stack.with_defaults(resolved)
    wanted = cache and not given_registry
    # A composed program's entry holds its plan too: planning after composing costs nothing.
    cached = _program_cache(PLAN_SOURCES, wanted, resolved, stack, registry)
    stored = cached.by_module(model, example_inputs) if cached else None
    if stored is None:
        program = export_model(model, example_inputs)
        stored = cached.by_program(program) if cached else None
    if stored is None:
        from composer.scheduler.stack import lower_stack

        # Plan mode compiles nothing: every backend lowers to the stand-in.
        all_stand_ins = {backend.name for backend in resolved}
        with _composer_warnings() as said:
            _edge, result = lower_stack(program, resolved, registry, all_stand_ins, stack, progress)
        result = _with_backend_facts(result, resolved)
        if cached:
            cached.save({"plan": result, "warnings": said})
    else:
        if progress is not None:
            progress(f"reused the plan from the cache ({cache_dir()})")
        _replay(stored.get("warnings", ()))
        result = stored["plan"]
    return attrs.evolve(result, stand_ins=tuple(b.name for b in resolved if b.name in unavailable))


PLAN_SOURCES = ("plan", "program")  # where a plan may be found, in order


def _program_cache(kinds: tuple[str, ...], wanted, resolved, stack: Stack, registry: Registry):
    """The cache of whole results for this stack, if caching is on and the stack digestible.

    Not with an explicit registry: it may hold plugin objects whose state no digest sees,
    while installed plugins are known by distribution, version and code."""
    if not wanted:
        return None
    from composer.program_cache import ProgramCache

    return ProgramCache.open(cache_dir(), kinds, resolved, stack, registry)


def _measured(model, stack: Stack, example_inputs, progress, cache: bool, registry) -> Composition:
    """Compose with the fastest candidate placement, measured here (composer.placement)."""
    from composer import aoti_host
    from composer import placement as measured

    registry = registry or default_registry()
    resolved = registry.resolve(stack.backends)
    # The checks every candidate's compose makes, once and before any work.
    stack.with_defaults(resolved)
    program = export_model(model, example_inputs)
    # With CUDA in the stack, on a GPU, every candidate runs hosted: one way of running
    # for all, or the comparison would measure the executors.
    hosted = aoti_host.host_unavailable_reason() is None and any(
        b.spec.backend_id == aoti_host.CUDA_BACKEND_ID for b in resolved
    )

    def only(candidate) -> Stack:
        """The candidate's stack: its backends with their settings, the user's pins and its
        own node pins."""
        kept = stack.only(candidate.backends, candidate.placement)
        return attrs.evolve(kept, never=candidate.never(kept.never))

    def compose_candidate(candidate):
        return compose(model, only(candidate), example_inputs, registry=registry)

    def plan_candidate(candidate):
        return plan(model, only(candidate), example_inputs, registry=registry)

    choice, composed = measured.measure(
        compose_candidate,
        list(stack.backends),
        _example_inputs(program, example_inputs),
        key=measured.cache_key(program, stack.backends, stack.settings(), measured.RUNS),
        budget_s=stack.tune_budget,
        progress=progress,
        cache_dir=cache_dir() if cache else None,
        hosted=hosted,
        plan_candidate=plan_candidate,
        never={name: sorted(pins) for name, pins in stack.never.items()},
        threads_set=stack.threads is not None,
    )
    composition = composed.get(choice.chosen) or compose_candidate(choice.chosen)
    composition.plan = attrs.evolve(composition.plan, placement=choice.to_dict())
    return composition


def _use_threads(stack: Stack) -> None:
    """Give XNNPACK the stack's threads before this process runs a program (a composition's
    verify, measured placement): the runtime's pool is fixed once a program loads."""
    if stack.threads is not None:
        cpu_threads.set_threads(stack.threads)


def _with_backend_facts(plan: Plan, resolved) -> Plan:
    """The plan with what each backend declared about tolerances and its compiler library."""
    return attrs.evolve(
        plan,
        tolerances={b.name: b.spec.tolerance for b in resolved if b.spec.tolerance is not None},
        libraries={b.name: b.spec.library for b in resolved if b.spec.library},
    )


def compose(
    model: Model,
    stack: Stack | str | Sequence[str],
    example_inputs: Sequence[Any] | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    cache: bool = True,
    jobs: int | None = None,
    registry: Registry | None = None,
    **settings: Any,
) -> Composition:
    """Lower ``model`` with a stack of backends, in priority order, into one ExecuTorch program.

    ``stack`` is a :class:`~composer.stack.Stack`, or its backends (a list of names or
    ``"a,b"``) with the other fields of a Stack as keywords: ``options``, ``never``,
    ``min_partition_size``, ``placement``, ``tune_budget``, ``threads`` (``consolidate=False``
    is the older spelling of ``placement="strict"``). ``example_inputs`` export an ``nn.Module``
    (an ``ExportedProgram`` needs none). ``progress`` gets one line per backend and
    partition as lowering goes.

    ``cache`` (default on) reuses what was composed before: the whole program when the model,
    stack and versions are the same, else each lowered partition that is (see
    :mod:`composer.cache`); measured placement's timings are cached too. ``jobs`` processes
    lower partitions in parallel where the backend lowers each on its own (default 1).
    ``registry`` replaces the installed plugins (tests; a program composed with one is not
    cached whole).
    """
    stack = Stack.of(stack, **settings)
    cache = cache and cache_enabled()
    _use_threads(stack)
    if stack.placement == "measured":
        return _measured(model, stack, example_inputs, progress, cache, registry)
    given_registry = registry is not None
    resolved, registry, stand_ins = _prepare(stack, registry, False)
    workers = _jobs(jobs)
    stack = stack.with_defaults(resolved)
    folder = cache_dir() if cache else None
    cached = _program_cache(("program",), cache and not given_registry, resolved, stack, registry)
    exported: list[ExportedProgram] = []

    def program() -> ExportedProgram:
        if not exported:
            exported.append(export_model(model, example_inputs))
        return exported[0]

    def lower() -> Lowered:
        return _lower(program(), resolved, registry, stand_ins, stack, progress, folder, workers)

    stored = cached.by_module(model, example_inputs) if cached else None
    if stored is None and cached:
        stored = cached.by_program(program())
    if stored is not None:
        if progress is not None:
            progress(f"reused the composed program from the cache ({folder})")
        _replay(stored.get("warnings", ()))
        # Lowered again only if asked for, maybe after the caller ran the model, which can
        # update its buffers in place (a KV cache): from the model as it is now.
        # torch.export's graph depends on the grad mode (verify runs under no_grad).
        frozen, grad = copy.deepcopy(model), torch.is_grad_enabled()

        def lower_frozen() -> Lowered:
            with torch.set_grad_enabled(grad):
                program = export_model(frozen, example_inputs)
            return _lower(program, resolved, registry, stand_ins, stack, progress, folder, workers)

        return Composition(stored["buffer"], stored["data_files"], stored["plan"],
                           _eager(model, program), _example_inputs(model, example_inputs),
                           from_cache=True, lower=lower_frozen)  # fmt: skip
    with _composer_warnings() as said:
        lowered = lower()
    composition = Composition(lowered.buffer, lowered.data_files, lowered.plan,
                              _eager(model, program), _example_inputs(model, example_inputs),
                              lowered=lowered)  # fmt: skip
    # Only what can be lowered again to the same bytes: a composition from the cache lowers
    # again for its edge program and reference, which must match its bytes.
    if cached and lowered.repeatable:
        cached.save({"buffer": composition.buffer, "data_files": composition.data_files,
                     "plan": composition.plan, "warnings": said})  # fmt: skip
    return composition


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


def _eager(model: Model, program: Callable[[], ExportedProgram]) -> torch.nn.Module:
    return model if isinstance(model, torch.nn.Module) else program().module()


@attrs.frozen
class Lowered:
    """What lowering made besides the bytes: ExecuTorch's program managers and the reference."""

    buffer: bytes
    data_files: dict[str, bytes]
    plan: Plan
    program: ExecutorchProgramManager
    edge: EdgeProgramManager
    reference: torch.nn.Module
    # Every partition came from the cache or went into it: lowering again gives these bytes
    # (AOTInductor's autotuning alone would not).
    repeatable: bool = False


def _lower(
    program, resolved, registry, stand_ins, stack: Stack, progress, folder: Path | None, jobs: int
) -> Lowered:
    from composer.partition_cache import reusing
    from composer.scheduler.stack import lower_stack

    lowering = {b.spec.backend_id: b for b in resolved if b.name not in stand_ins}
    store = None if folder is None else Store(folder, "partition")
    with reusing(lowering, store, progress, jobs) as reuse:
        edge, result = lower_stack(program, resolved, registry, stand_ins, stack, progress)
    result = _with_backend_facts(result, resolved)
    # Built before to_executorch, which rewrites the edge program in place (buffer copies).
    reference = edge.exported_program().module()
    try:
        with torch.no_grad():
            executorch_program = edge.to_executorch()
    except Exception as error:
        raise ComposerError(
            f"to_executorch failed after lowering with {list(result.backends)}: "
            f"{type(error).__name__}: {error}"
        ) from error
    return Lowered(
        buffer=executorch_program.buffer,
        # ExecutorchProgramManager exposes the .ptd data only as a private attribute.
        data_files={
            name: bytes(cord) for name, cord in (executorch_program._tensor_data or {}).items()
        },
        plan=result,
        program=executorch_program,
        edge=edge,
        reference=reference,
        repeatable=store is not None and reuse.unstored == 0,
    )


@attrs.define
class Composition:
    """A composed ExecuTorch program: its bytes, its plan, and a way to check it.

    From the cache (``from_cache``) it holds the bytes and the plan only; ``program``, ``edge``
    and ``reference`` are lowered again (lowered partitions reused) when first asked for.
    """

    buffer: bytes
    data_files: dict[str, bytes]  # external tensor data (.ptd), e.g. CUDA weights
    plan: Plan
    eager: torch.nn.Module
    example_inputs: tuple
    from_cache: bool = False
    _lowered: Lowered | None = attrs.field(default=None, alias="lowered", repr=False)
    _lower: Callable[[], Lowered] | None = attrs.field(default=None, alias="lower", repr=False)

    def _lowering(self) -> Lowered:
        if self._lowered is None:
            assert self._lower is not None, "a Composition needs its lowering or a way to redo it"
            lowered = self._lower()
            if (lowered.buffer, lowered.data_files) != (self.buffer, self.data_files):
                raise ComposerError(
                    "this program came from composer's cache, and lowering it again for its "
                    "edge program made different bytes (its lowered partitions have left the "
                    "cache). Compose again with cache=False (--no-cache)."
                )
            self._lowered = lowered
        return self._lowered

    @property
    def program(self) -> ExecutorchProgramManager:
        return self._lowering().program

    @property
    def edge(self) -> EdgeProgramManager:
        """The lowered edge program, after to_executorch converted it."""
        return self._lowering().edge

    @property
    def reference(self) -> torch.nn.Module:
        """The lowered program as Python: delegates run their subgraphs."""
        return self._lowering().reference

    def save(self, path: str | os.PathLike, extra: Mapping[Path, bytes] | None = None) -> Path:
        """Write the .pte, any .ptd data files beside it, and ``extra`` files, all or none."""
        target = Path(path)
        files = {target: self.buffer}
        for name, data in self.data_files.items():
            files[target.parent / (name if name.endswith(".ptd") else f"{name}.ptd")] = data
        files.update(extra or {})
        write_all(files)
        return target

    def runtime_can_run(self) -> tuple[bool, str]:
        """Whether the ExecuTorch runtime here can run this program: built for this torch,
        with every delegate's backend registered."""
        mismatch = torch_mismatch()
        if mismatch is not None:
            return False, mismatch
        missing = sorted(self.delegate_backend_ids() - registered_backends())
        if missing:
            return False, f"the runtime has no {', '.join(missing)}"
        return True, "every delegate's backend is registered in the runtime"

    def delegate_backend_ids(self) -> set[str]:
        """The ExecuTorch backend ids of this program's delegates."""
        return program_backend_ids(self.buffer)

    def verify(self, inputs: Sequence[Any] | None = None) -> Verification:
        """Run the composed program and compare with eager (see :mod:`composer.verification`)."""
        from composer.verification import verify

        return verify(self, inputs)
