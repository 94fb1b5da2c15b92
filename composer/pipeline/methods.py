"""Several methods in one program (prefill and decode, encoder and decoder, an LLM's metadata).

Each method is composed and proven alone with the stack, repairs included; then ExecuTorch
writes every method's lowered edge program (kept from before its own ``to_executorch``) into one
program, with the constant methods, as ``to_edge_transform_and_lower({...}, constant_methods=...)``
does: weights shared between methods are stored as plain lowering stores them. A method that
came from composer's program cache has no edge program kept and is lowered again with its
repairs. Each method is then proven again in the program that is written.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import torch
from torch.export import ExportedProgram

from composer.contract.errors import ComposerError, ModelError
from composer.contract.quiet import quiet_call
from composer.lower.atomic import check_owned, output_kinds, ptd_name, write_all
from composer.lower.lowering import keeping_unwritten, lower_edge, written
from composer.pipeline.proven import own_pins_unremarked, repaired_stack
from composer.pipeline.stages import Composing, Exported
from composer.registry.resolved import ResolvedStack
from composer.run.composition import Composition
from composer.run.proof import ProgramFailed, prove
from composer.run.verification import Verification, verify
from composer.scheduler.plans import Plan


@attrs.define
class Method:
    """One method of a composed program, checkable on its own (``verify``)."""

    name: str
    buffer: bytes
    data_files: dict[str, bytes]
    plan: Plan
    alone: Composition  # the method composed and proven by itself

    @property
    def method(self) -> str:  # the name the runtime loads
        return self.name

    @property
    def eager(self) -> torch.nn.Module:
        return self.alone.eager

    @property
    def example_inputs(self) -> tuple:
        return self.alone.example_inputs

    @property
    def reference(self) -> torch.nn.Module:
        return self.alone.reference


@attrs.define
class MethodsComposition:
    """A program of several methods: its bytes, one plan per method, and a way to check each."""

    buffer: bytes
    data_files: dict[str, bytes]
    methods: dict[str, Method]
    constant_methods: dict[str, Any]

    @property
    def plans(self) -> dict[str, Plan]:
        return {name: method.plan for name, method in self.methods.items()}

    @quiet_call
    def verify(self, method: str, inputs=None, *, debug: bool = False) -> Verification:
        """Run ``method`` of the written program and compare it with its eager model; ``debug``
        as for :func:`~composer.pipeline.compose.compose`."""
        if method not in self.methods:
            raise ComposerError(
                f"this program has no composed method {method!r}; it has {', '.join(self.methods)}."
            )
        return verify(self.methods[method], inputs)

    def save(
        self, path: str | os.PathLike, extra: Mapping[Path, bytes] | None = None, *,
        force: bool = False,
    ) -> Path:  # fmt: skip
        """Write the .pte, any .ptd data files beside it, and ``extra`` files (reports), all or
        none. An existing file is replaced only where it is composer's own output of the same
        kind, unless ``force``."""
        target = Path(path)
        files = {target: self.buffer, **(extra or {})}
        for name, data in self.data_files.items():
            files[target.parent / ptd_name(name)] = data
        check_owned(output_kinds(target, files), force=force)  # write_all checks the rest
        write_all(files)
        return target

    def to_json(self) -> str:
        return json.dumps(
            {
                "methods": {name: plan.to_dict() for name, plan in self.plans.items()},
                "constant_methods": {k: repr(v) for k, v in self.constant_methods.items()},
            },
            indent=2,
        )


def compose_methods(
    methods: Mapping[str, Any],
    resolved: ResolvedStack,
    compose_one: Callable[[Exported], Composition],
    how: Composing,
    *,
    constant_methods: Mapping[str, Any] | None = None,
) -> MethodsComposition:
    """Compose each of ``methods`` (name -> ExportedProgram, or (module, example_inputs)) with
    the ``resolved`` stack through ``compose_one`` (composer.pipeline.stages, as ``how``
    says), then write them as one program with ``constant_methods``; each method is proven in
    that program."""
    if not methods:
        raise ModelError("compose got no methods: pass {name: program or (module, inputs)}.")
    given = {name: Exported(*_model_and_inputs(name, entry)) for name, entry in methods.items()}
    clash = set(given) & set(constant_methods or {})
    if clash:
        raise ModelError(f"{', '.join(sorted(clash))} named both a method and a constant method.")
    alone = {}
    for name, exported in given.items():
        if how.progress is not None:
            how.progress(f"method {name}:")
        with keeping_unwritten():
            alone[name] = compose_one(exported)
    edges, plans = {}, {}
    for name, exported in given.items():
        edges[name], plans[name] = _edge_of(exported, alone[name], resolved, how)
    return _written(edges, plans, alone, constant_methods, how.check)


def _edge_of(exported: Exported, alone: Composition, resolved: ResolvedStack, how: Composing):
    """A method's lowered edge program before ``to_executorch``, and its plan: the one its own
    compose kept, or, composed from the cache, lowered again with its repairs."""
    plan = alone.plan
    if alone.unwritten_edge is not None:
        return alone.unwritten_edge, plan
    repaired = repaired_stack(resolved.stack, plan.repairs)
    with own_pins_unremarked(bool(plan.repairs)):
        edge, together, _ = lower_edge(
            exported.to_lower(), resolved.lowering(repaired), how.progress, how.folder, 1,
            again=exported.fresh,
        )  # fmt: skip
    return edge.exported_program(), attrs.evolve(
        together, repairs=plan.repairs, placement=plan.placement
    )


def _written(edges, plans, alone, constant_methods, check: bool) -> MethodsComposition:
    """Every method's edge program written as one program, each method proven in it."""
    from executorch.exir import EdgeCompileConfig, EdgeProgramManager

    manager = EdgeProgramManager(
        edges,
        constant_methods=dict(constant_methods or {}),
        compile_config=EdgeCompileConfig(_check_ir_validity=False),
    )
    program, data_files = written(manager, f"writing methods {', '.join(edges)}")
    composed = {
        name: Method(name, program.buffer, data_files, plans[name], alone[name]) for name in edges
    }
    for name, method in composed.items():
        if not check:
            method.plan = attrs.evolve(method.plan, proof=alone[name].plan.proof)
            continue
        try:
            proof = prove(method)
        except ProgramFailed as error:
            raise ComposerError(
                f"method {name!r} ran and matched alone, but not in the program of "
                f"{len(composed)} methods: {error}"
            ) from error
        method.plan = attrs.evolve(method.plan, proof=proof.describe())
    return MethodsComposition(program.buffer, data_files, composed, dict(constant_methods or {}))


def _model_and_inputs(name: str, entry: Any) -> tuple[Any, tuple | None]:
    if isinstance(entry, ExportedProgram | torch.nn.Module):
        return entry, None
    if isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], torch.nn.Module):
        return entry[0], tuple(entry[1])
    raise ModelError(
        f"method {name!r}: expected an ExportedProgram or (module, example_inputs), got "
        f"{type(entry).__name__}."
    )
