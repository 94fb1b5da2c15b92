"""The stages of one compose, after the public entry points (composer.pipeline.compose) have
checked the arguments, exported the model and resolved the stack, once: plan a resolved stack,
or lower, prove and repair it. Several methods (composer.pipeline.methods) and measured
placement's candidates go through these too, never back through the public ``compose``.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch
from torch.export import ExportedProgram

from composer.contract.errors import ComposerWarning
from composer.lower.cache import DamagedEntryWarning, cache_dir
from composer.lower.export import (
    Model,
    eager_of,
    example_inputs_of,
    export_model,
    fresh_program,
    model_copy,
    untouched_copies,
)
from composer.lower.lowering import Lowered, lower_program, with_backend_facts
from composer.lower.program_cache import ProgramCache
from composer.pipeline.narrowing import Narrowing
from composer.pipeline.proven import composed_and_proven, repaired_stack
from composer.registry.asking import telling
from composer.registry.resolved import ResolvedStack
from composer.registry.stack import Stack
from composer.run.composition import Composition
from composer.scheduler.plans import Plan

PLAN_SOURCES = ("plan", "program")  # where a plan may be found, in order


@attrs.define(eq=False)
class Exported:
    """The model of one compose, exported once; each lowering is handed a program that no
    lowering has touched (ExecuTorch's lowering changes the program it is given: a rotary
    embedding's non-persistent inv_freq leaves it, and lowering it again for a repair raised
    KeyError 'model.rotary_emb.inv_freq'). A program the user passed is never lowered itself."""

    model: Model
    example_inputs: Sequence[Any] | None
    _program: ExportedProgram | None = None
    _handed: bool = False  # the exported program went to a lowering, which changed it

    @classmethod
    def of(cls, model: Model, example_inputs, dynamic_shapes: Any = None) -> Exported:
        """``model``, exported here with ``dynamic_shapes`` where there are any."""
        if dynamic_shapes is not None:
            model = export_model(model, example_inputs, dynamic_shapes)
        return cls(model, example_inputs)

    def program(self) -> ExportedProgram:
        """The model exported, once (not to be lowered: :meth:`to_lower` is)."""
        if self._program is None:
            self._program = export_model(self.model, self.example_inputs)
        return self._program

    def fresh(self) -> ExportedProgram:
        """A program no lowering has touched, equal to ``program()``."""
        return fresh_program(self.model, self.example_inputs)

    def to_lower(self) -> ExportedProgram:
        """The program for a lowering: the exported one the first time, a fresh one after."""
        first = not self._handed and not isinstance(self.model, ExportedProgram)
        self._handed = True
        return self.program() if first else self.fresh()

    def kept(self) -> Callable[[], ExportedProgram]:
        """Untouched programs of the model as it is now, one a call, for lowerings later (the
        caller may run or change the model meanwhile): copies of this compose's one export,
        where it has one no lowering touched; else exports of a copy of the model."""
        exported = self.model if isinstance(self.model, ExportedProgram) else None
        if exported is None and not self._handed:
            exported = self._program
        copies = untouched_copies(exported) if exported is not None else None
        if copies is not None:
            return copies
        return functools.partial(fresh_program, model_copy(self.model), self.example_inputs)

    def inputs(self) -> tuple:
        return example_inputs_of(self.model, self.example_inputs)

    def eager(self) -> torch.nn.Module:
        return eager_of(self.model, self.example_inputs)


@attrs.frozen
class Composing:
    """How a resolved stack is composed: where progress goes, the cache of lowered partitions
    (``folder``, None: none), processes per lowering, whether the program is proven, whether
    the whole program is cached, and the user's own samples the proof runs it at too
    (``proof_inputs``, each a tuple like the example inputs)."""

    progress: Callable[[str], None] | None = None
    folder: Path | None = None
    workers: int = 1
    check: bool = True
    whole_cache: bool = False
    proof_inputs: tuple[tuple, ...] = ()


def compose_resolved(exported: Exported, resolved: ResolvedStack, how: Composing) -> Composition:
    """``exported`` lowered with ``resolved``, proven and repaired (composer.pipeline.proven), or
    the program the cache holds for them."""
    cached = program_cache(("program",), how.whole_cache, resolved)
    lowering = _Lowering(exported, resolved, how)
    stored = cached.by_module(exported.model, exported.example_inputs) if cached else None
    if stored is None and cached:
        stored = cached.by_program(exported.program())
    if stored is not None:
        if how.progress is not None:
            how.progress(f"reused the composed program from the cache ({how.folder})")
        replay(stored.get("warnings", ()))
        return lowering.from_cache(stored)
    # a plugin slow to answer, in lowering or in the proof, is named where progress goes
    with composer_warnings() as said, telling(how.progress):
        narrowing = Narrowing(resolved.lowering_backends(), how.folder)
        composition = composed_and_proven(
            lowering.build, resolved.stack, check=how.check, progress=how.progress,
            narrow=narrowing.narrowed,
        )  # fmt: skip
    # Only what can be lowered again to the same bytes: a composition from the cache lowers
    # again for its edge program and reference, which must match its bytes. A program that
    # was not checked is not stored: the cache holds proven programs only.
    if cached and lowering.made[-1].repeatable and how.check:
        cached.save({"buffer": composition.buffer, "data_files": composition.data_files,
                     "plan": composition.plan, "warnings": said})  # fmt: skip
    return composition


def plan_resolved(
    exported: Exported,
    resolved: ResolvedStack,
    progress: Callable[[str], None] | None = None,
    cache: bool = False,
) -> Plan:
    """The plan of ``exported`` with ``resolved``, every backend lowered to the stand-in (or read
    from the cache of programs and plans, where ``cache``)."""
    cached = program_cache(PLAN_SOURCES, cache, resolved)
    # A composed program's entry holds its plan too: planning after composing costs nothing.
    stored = cached.by_module(exported.model, exported.example_inputs) if cached else None
    if stored is None and cached:
        stored = cached.by_program(exported.program())
    if stored is None:
        # executorch.exir takes seconds to import, and a plan from the cache needs none of it.
        from composer.lower.priority import lower_in_order

        with composer_warnings() as said:
            # Plan mode compiles nothing: every backend lowers to the stand-in.
            _edge, result = lower_in_order(exported.to_lower(), resolved.planned(), progress)
        result = with_backend_facts(result, resolved.backends)
        if cached:
            cached.save({"plan": result, "warnings": said})
    else:
        if progress is not None:
            progress(f"reused the plan from the cache ({cache_dir()})")
        replay(stored.get("warnings", ()))
        # A plan runs nothing, so it claims no proof, even read from a proven program.
        result = attrs.evolve(stored["plan"], proof="")
    stand_ins = tuple(b.name for b in resolved.backends if b.name in resolved.stand_ins)
    return attrs.evolve(result, stand_ins=stand_ins)


def program_cache(kinds: tuple[str, ...], wanted: bool, resolved: ResolvedStack):
    """The cache of whole results for this stack, if ``wanted`` (caching is on, and no registry
    was given: it may hold plugin objects whose state no digest sees, while installed plugins
    are known by distribution, version and code)."""
    if not wanted:
        return None
    return ProgramCache.open(
        cache_dir(), kinds, resolved.backends, resolved.stack, resolved.registry
    )


@attrs.define(eq=False)
class _Lowering:
    """One exported model lowered with one resolved stack for each attempt (``build``, which
    composed_and_proven calls with each repaired stack)."""

    exported: Exported
    resolved: ResolvedStack
    how: Composing
    made: list[Lowered] = attrs.field(factory=list)  # what each build lowered, in order

    def build(self, stack: Stack) -> Composition:
        """The composition of the model lowered with ``stack`` (the resolved stack's, maybe
        repaired)."""
        exported, how = self.exported, self.how
        lowered = lower_program(
            exported.to_lower(), self.resolved.lowering(stack), how.progress, how.folder,
            how.workers, again=exported.fresh,
        )  # fmt: skip
        self.made.append(lowered)
        return Composition(lowered.buffer, lowered.data_files, lowered.plan, exported.eager(),
                           exported.inputs(), proof_inputs=how.proof_inputs,
                           lowered=lowered)  # fmt: skip

    def from_cache(self, stored: Mapping[str, Any]) -> Composition:
        """The composition the cache stored, lowered again only if asked for."""
        # Maybe after the caller ran the model, which can update its buffers in place (a KV
        # cache): from the model as it is now. torch.export's graph depends on the grad mode
        # (verify runs under no_grad). A repaired program is lowered again with its repairs.
        exported = self.exported
        again = _LoweringAgain(
            exported.kept(), torch.is_grad_enabled(),
            self.resolved.lowering(repaired_stack(self.resolved.stack, stored["plan"].repairs)),
            self.how,
        )  # fmt: skip
        return Composition(stored["buffer"], stored["data_files"], stored["plan"],
                           exported.eager(), exported.inputs(), from_cache=True,
                           proof_inputs=self.how.proof_inputs, lower=again)  # fmt: skip


@attrs.frozen(eq=False)
class _LoweringAgain:
    """A composition from the cache, lowered again when asked for (its edge program, its
    reference): from the model as it was composed, with the stack it was."""

    programs: Callable[[], ExportedProgram]  # Exported.kept: the model may change after
    grad: bool  # the grad mode it was composed in, which torch.export's graph depends on
    resolved: ResolvedStack  # with the stored plan's repairs
    how: Composing

    def program(self) -> ExportedProgram:
        with torch.set_grad_enabled(self.grad):
            return self.programs()

    def __call__(self) -> Lowered:
        how = self.how
        return lower_program(
            self.program(), self.resolved, how.progress, how.folder, how.workers,
            again=self.program,
        )  # fmt: skip


@contextlib.contextmanager
def composer_warnings():
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


def replay(said) -> None:
    """The warnings ``said`` again, as from the caller of the public ``plan`` or ``compose``."""
    for category, message in said:
        warnings.warn(message, category, stacklevel=4)
