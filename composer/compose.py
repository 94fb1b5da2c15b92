"""The public entry points: ``plan`` a stack without lowering, ``compose`` it into a .pte."""

from __future__ import annotations

import contextlib
import copy
import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import torch
from torch.export import ExportedProgram

from composer.atomic import write_all
from composer.cache import DamagedEntryWarning, Store, cache_dir, cache_enabled
from composer.errors import BackendListError, ComposerError, ComposerWarning, ModelError
from composer.plan import Plan
from composer.registry import Registry, default_registry
from composer.runtime import program_backend_ids, registered_backends

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


def _settings(resolved, options, never, min_partition_size, progress, consolidate) -> dict:
    """The stack's settings, checked: keyword arguments of ``StackSettings``, which is only
    built when lowering starts (it imports ExecuTorch, which a cache hit does without)."""
    names = {backend.name for backend in resolved}
    for what, given in (
        ("options", options),
        ("never", never),
        ("min_partition_size", min_partition_size),
    ):
        unknown = set(given or {}) - names
        if unknown:
            raise BackendListError(
                f"{what} given for {', '.join(sorted(unknown))}, which is not in the backend "
                f"list {[b.name for b in resolved]}."
            )
    for name, size in (min_partition_size or {}).items():
        if not isinstance(size, int) or size < 1:
            raise ComposerError(f"min_partition_size for {name!r} must be a whole number >= 1.")
    from composer.options import check_options, declared_options

    # Every backend, given options or not: defaults reach the hooks, and a plugin's broken
    # composer_options surfaces before export rather than halfway through lowering.
    checked = {
        backend.name: check_options(
            backend.name, declared_options(backend), (options or {}).get(backend.name)
        )
        for backend in resolved
    }
    return {
        "options": checked,
        "never": {k: frozenset(v) for k, v in (never or {}).items()},
        "min_partition_size": dict(min_partition_size or {}),
        "progress": progress,
        "consolidate": consolidate,
    }


def _consolidates(placement: str, consolidate: bool) -> bool:
    from composer.placement import PLACEMENTS

    if placement not in PLACEMENTS:
        raise ComposerError(f"placement must be one of {', '.join(PLACEMENTS)}, not {placement!r}.")
    return consolidate and placement == "priority"


def _prepare(backends, registry, plan_only):
    registry = registry or default_registry()
    resolved = registry.resolve(backends)
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
    backends: str | Sequence[str],
    example_inputs: Sequence[Any] | None = None,
    *,
    options: Mapping[str, Mapping[str, str]] | None = None,
    never: Mapping[str, Iterable[str]] | None = None,
    min_partition_size: Mapping[str, int] | None = None,
    progress: Callable[[str], None] | None = None,
    consolidate: bool = True,
    placement: str = "priority",
    tune_budget: float | None = None,
    cache: bool = True,
    registry: Registry | None = None,
) -> Plan:
    """Work out which backend takes which node, without compiling anything.

    Runs on any machine: the partitions are exactly those ``compose`` makes on the target.
    The keyword arguments are as for :func:`compose`; ``placement="measured"`` composes and
    times candidates for real, so it needs backends that run here.
    """
    cache = cache and cache_enabled()
    if placement == "measured":
        return _measured(model, backends, example_inputs, options, never, min_partition_size,
                         progress, tune_budget, cache, registry).plan  # fmt: skip
    given_registry = registry is not None
    resolved, registry, unavailable = _prepare(backends, registry, True)
    consolidate = _consolidates(placement, consolidate)
    settings = _settings(resolved, options, never, min_partition_size, progress, consolidate)
    wanted = cache and not given_registry
    # A composed program's entry holds its plan too: planning after composing costs nothing.
    caches = [
        c
        for c in (_program_cache(k, wanted, resolved, settings, registry) for k in PLAN_SOURCES)
        if c
    ]
    stored = next(filter(None, (c.by_module(model, example_inputs) for c in caches)), None)
    if stored is None:
        program = export_model(model, example_inputs)
        stored = next(filter(None, (c.by_program(program) for c in caches)), None)
    if stored is None:
        from composer.scheduler.stack import StackSettings, lower_stack

        # Plan mode compiles nothing: every backend lowers to the stand-in.
        all_stand_ins = {backend.name for backend in resolved}
        with _composer_warnings() as said:
            _edge, result = lower_stack(
                program, resolved, registry, all_stand_ins, StackSettings(**settings)
            )
        result = _with_backend_facts(result, resolved)
        if caches:
            caches[0].save({"plan": result, "warnings": said})
    else:
        if progress is not None:
            progress(f"reused the plan from the cache ({cache_dir()})")
        _replay(stored.get("warnings", ()))
        result = stored["plan"]
    return attrs.evolve(result, stand_ins=tuple(b.name for b in resolved if b.name in unavailable))


PLAN_SOURCES = ("plan", "program")  # where a plan may be found, in order


def _program_cache(kind: str, wanted: bool, resolved, settings: dict, registry: Registry):
    """The cache of whole results for this stack, if caching is on and the stack digestible.

    Not with an explicit registry: it may hold plugin objects whose state no digest sees,
    while installed plugins are known by distribution, version and code."""
    if not wanted:
        return None
    from composer.program_cache import ProgramCache

    return ProgramCache.open(cache_dir(), kind, resolved, settings, registry)


def _measured(
    model, backends, example_inputs, options, never, min_partition_size, progress,
    tune_budget, cache, registry,
) -> Composition:  # fmt: skip
    """Compose with the fastest candidate placement, measured here (composer.placement)."""
    from composer import placement as measured

    registry = registry or default_registry()
    resolved = registry.resolve(backends)
    names = [backend.name for backend in resolved]
    # The checks every candidate's compose makes, once and before any work.
    _settings(resolved, options, never, min_partition_size, None, True)
    program = export_model(model, example_inputs)
    settings = {
        "options": options or {},
        "never": never or {},
        "min_partition_size": min_partition_size or {},
    }

    def only(candidate):
        given = {
            key: {
                name: value for name, value in (given or {}).items() if name in candidate.backends
            }
            for key, given in settings.items()
        }
        return {**given, "never": candidate.never(given["never"])}  # with its node pins

    def compose_candidate(candidate):
        return compose(model, list(candidate.backends), example_inputs, registry=registry,
                       placement=candidate.placement, **only(candidate))  # fmt: skip

    def plan_candidate(candidate):
        return plan(model, list(candidate.backends), example_inputs, registry=registry,
                    placement=candidate.placement, **only(candidate))  # fmt: skip

    choice, composed = measured.measure(
        compose_candidate,
        names,
        _example_inputs(program, example_inputs),
        key=measured.cache_key(program, names, settings, measured.RUNS),
        budget_s=tune_budget,
        progress=progress,
        cache_dir=cache_dir() if cache else None,
        plan_candidate=plan_candidate,
        never=settings["never"],
    )
    composition = composed.get(choice.chosen) or compose_candidate(choice.chosen)
    composition.plan = attrs.evolve(composition.plan, placement=choice.to_dict())
    return composition


def _with_backend_facts(plan: Plan, resolved) -> Plan:
    """The plan with what each backend declared about tolerances and its compiler library."""
    return attrs.evolve(
        plan,
        tolerances={b.name: b.spec.tolerance for b in resolved if b.spec.tolerance is not None},
        libraries={b.name: b.spec.library for b in resolved if b.spec.library},
    )


def compose(
    model: Model,
    backends: str | Sequence[str],
    example_inputs: Sequence[Any] | None = None,
    *,
    options: Mapping[str, Mapping[str, str]] | None = None,
    never: Mapping[str, Iterable[str]] | None = None,
    min_partition_size: Mapping[str, int] | None = None,
    progress: Callable[[str], None] | None = None,
    consolidate: bool = True,
    placement: str = "priority",
    tune_budget: float | None = None,
    cache: bool = True,
    jobs: int | None = None,
    registry: Registry | None = None,
) -> Composition:
    """Lower ``model`` with ``backends`` in priority order into one ExecuTorch program.

    By backend name: ``options`` (``{"cuda": {"max_autotune": "OFF"}}``), ``never`` (ops it
    must not take: ``{"tensorrt_stub": ["aten._softmax.default"]}``) and
    ``min_partition_size`` (overrides the backend's). ``progress`` gets one line per backend
    and partition as lowering goes. ``placement="priority"`` (the default) gives every op to
    the first backend that can take it, except a small host island between partitions of an
    accelerator backend, which joins that backend when it can take it (a device round trip
    saved); ``"strict"`` (or the older ``consolidate=False``) makes no exception;
    ``"measured"`` composes the declared order, the other orders and each backend alone, times
    them in the runtime here and keeps the fastest (see :mod:`composer.placement`; at most
    ``tune_budget`` seconds of composing, measurements cached unless ``cache=False``).

    ``cache`` (default on) reuses what was composed before: the whole program when the model,
    stack and versions are the same, else each lowered partition that is (see
    :mod:`composer.cache`). ``jobs`` processes lower partitions in parallel where the backend
    lowers each on its own (default 1).
    """
    cache = cache and cache_enabled()
    if placement == "measured":
        return _measured(model, backends, example_inputs, options, never, min_partition_size,
                         progress, tune_budget, cache, registry)  # fmt: skip
    given_registry = registry is not None
    resolved, registry, stand_ins = _prepare(backends, registry, False)
    workers = _jobs(jobs)
    consolidate = _consolidates(placement, consolidate)
    settings = _settings(resolved, options, never, min_partition_size, progress, consolidate)
    folder = cache_dir() if cache else None
    cached = _program_cache("program", cache and not given_registry, resolved, settings, registry)
    exported: list[ExportedProgram] = []

    def program() -> ExportedProgram:
        if not exported:
            exported.append(export_model(model, example_inputs))
        return exported[0]

    def lower() -> Lowered:
        return _lower(program(), resolved, registry, stand_ins, settings, folder, workers)

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
            return _lower(program, resolved, registry, stand_ins, settings, folder, workers)

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
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
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
    program, resolved, registry, stand_ins, settings: dict, folder: Path | None, jobs: int
) -> Lowered:
    from composer.partition_cache import reusing
    from composer.scheduler.stack import StackSettings, lower_stack

    lowering = {b.spec.backend_id: b for b in resolved if b.name not in stand_ins}
    store = None if folder is None else Store(folder, "partition")
    with reusing(lowering, store, settings["progress"], jobs) as reuse:
        edge, result = lower_stack(
            program, resolved, registry, stand_ins, StackSettings(**settings)
        )
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
        """Whether the ExecuTorch runtime here has every delegate's backend registered."""
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
