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
from composer.lower.atomic import ptd_name, write_all
from composer.lower.cache import cache_dir, cache_enabled
from composer.lower.export import fresh_program
from composer.lower.lowering import keeping_unwritten, lower_edge, written
from composer.pipeline.proven import own_pins_unremarked, repaired_stack
from composer.registry.discovery import Registry
from composer.registry.resolved import resolve_stack
from composer.registry.stack import Stack
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

    def verify(self, method: str, inputs=None) -> Verification:
        """Run ``method`` of the written program and compare it with its eager model."""
        if method not in self.methods:
            raise ComposerError(
                f"this program has no composed method {method!r}; it has {', '.join(self.methods)}."
            )
        return verify(self.methods[method], inputs)

    def save(self, path: str | os.PathLike, extra: Mapping[Path, bytes] | None = None) -> Path:
        """Write the .pte, any .ptd data files beside it, and ``extra`` files, all or none."""
        target = Path(path)
        files = {target: self.buffer, **(extra or {})}
        for name, data in self.data_files.items():
            files[target.parent / ptd_name(name)] = data
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
    stack: Stack | str,
    compose_one: Callable[..., Composition],
    *,
    constant_methods: Mapping[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
    cache: bool = True,
    registry: Registry | None = None,
    check: bool = True,
    **settings: Any,
) -> MethodsComposition:
    """Compose each of ``methods`` (name -> ExportedProgram, or (module, example_inputs)) with
    ``stack`` through ``compose_one`` (:func:`composer.compose`), then write them as one
    program with ``constant_methods``; each method is proven in that program."""
    from executorch.exir import EdgeCompileConfig, EdgeProgramManager

    if not methods:
        raise ModelError("compose got no methods: pass {name: program or (module, inputs)}.")
    given = {name: _model_and_inputs(name, entry) for name, entry in methods.items()}
    clash = set(given) & set(constant_methods or {})
    if clash:
        raise ModelError(f"{', '.join(sorted(clash))} named both a method and a constant method.")
    alone = {}
    for name, (model, inputs) in given.items():
        if progress is not None:
            progress(f"method {name}:")
        with keeping_unwritten():
            alone[name] = compose_one(
                model, stack, inputs, progress=progress, cache=cache, registry=registry,
                check=check, **settings,
            )  # fmt: skip
    # Each method's compose_one asked whether the backends lower here.
    resolved = resolve_stack(Stack.of(stack, **settings), registry, must_lower_here=False)
    folder = cache_dir() if cache and cache_enabled() else None
    edges, plans = {}, {}
    for name, (model, inputs) in given.items():
        plan = alone[name].plan
        if alone[name].unwritten_edge is not None:
            edges[name], plans[name] = alone[name].unwritten_edge, plan
            continue
        repaired = repaired_stack(resolved.stack, plan.repairs)
        with own_pins_unremarked(bool(plan.repairs)):
            edge, together, _ = lower_edge(
                fresh_program(model, inputs), resolved.lowering(repaired), progress, folder, 1,
                again=lambda model=model, inputs=inputs: fresh_program(model, inputs),
            )  # fmt: skip
        edges[name] = edge.exported_program()
        plans[name] = attrs.evolve(together, repairs=plan.repairs, placement=plan.placement)
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
