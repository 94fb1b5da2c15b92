"""The public entry points: ``plan`` a stack without lowering, ``compose`` it into a .pte."""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch
from executorch.exir import EdgeProgramManager, ExecutorchProgramManager
from torch.export import ExportedProgram

from composer.errors import BackendListError, ComposerError, ModelError
from composer.plan import Plan
from composer.registry import Registry, default_registry
from composer.scheduler.stack import lower_stack

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


def _example_inputs(program: ExportedProgram, given: Sequence[Any] | None) -> tuple:
    if given is not None:
        return tuple(given)
    stored = getattr(program, "example_inputs", None)
    if stored:
        args, _kwargs = stored
        return tuple(args)
    return ()


def _prepare(model, backends, example_inputs, registry, plan_only, options):
    registry = registry or default_registry()
    resolved = registry.resolve(backends)
    unknown = set(options or {}) - {backend.name for backend in resolved}
    if unknown:
        raise BackendListError(
            f"options given for {', '.join(sorted(unknown))}, which is not in the backend list "
            f"{[b.name for b in resolved]}."
        )
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
    program = export_model(model, example_inputs)
    if plan_only:
        # Plan mode compiles nothing: every backend lowers to the stand-in.
        stand_ins = {backend.name for backend in resolved}
    return program, resolved, registry, stand_ins


def plan(
    model: Model,
    backends: str | Sequence[str],
    example_inputs: Sequence[Any] | None = None,
    *,
    options: Mapping[str, Mapping[str, str]] | None = None,
    registry: Registry | None = None,
) -> Plan:
    """Work out which backend takes which node, without compiling anything.

    Runs on any machine: the partitions are exactly those ``compose`` makes on the target.
    """
    program, resolved, registry, stand_ins = _prepare(
        model, backends, example_inputs, registry, plan_only=True, options=options
    )
    unavailable = {b.name for b in resolved if registry.unavailable_reason(b) is not None}
    _edge, result = lower_stack(program, resolved, registry, stand_ins, options)
    return attrs.evolve(result, stand_ins=tuple(b.name for b in resolved if b.name in unavailable))


def compose(
    model: Model,
    backends: str | Sequence[str],
    example_inputs: Sequence[Any] | None = None,
    *,
    options: Mapping[str, Mapping[str, str]] | None = None,
    registry: Registry | None = None,
) -> Composition:
    """Lower ``model`` with ``backends`` in priority order into one ExecuTorch program.

    ``options`` maps a backend name to its options, e.g. ``{"cuda": {"max_autotune": "OFF"}}``.
    """
    program, resolved, registry, stand_ins = _prepare(
        model, backends, example_inputs, registry, plan_only=False, options=options
    )
    edge, result = lower_stack(program, resolved, registry, stand_ins, options)
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
    return Composition(
        buffer=executorch_program.buffer,
        # ExecutorchProgramManager exposes the .ptd data only as a private attribute.
        data_files={
            name: bytes(cord) for name, cord in (executorch_program._tensor_data or {}).items()
        },
        program=executorch_program,
        plan=result,
        edge=edge,
        reference=reference,
        eager=model if isinstance(model, torch.nn.Module) else program.module(),
        example_inputs=_example_inputs(program, example_inputs),
    )


def _write_temporary(destination: Path, data: bytes) -> str:
    try:
        handle, temporary = tempfile.mkstemp(
            dir=destination.parent, prefix=f".{destination.name}.", suffix=".tmp"
        )
    except OSError as error:
        raise ComposerError(f"cannot write {destination}: {error.strerror}.") from error
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return temporary


@attrs.frozen
class Verification:
    """How the composed program compared with eager, and which executor ran it."""

    executor: str  # "executorch runtime" or "python reference"
    max_abs_error: float
    ok: bool
    reason: str  # why this executor was chosen

    def __str__(self) -> str:
        verdict = "OK" if self.ok else "MISMATCH"
        return (
            f"{verdict}: max |composed - eager| = {self.max_abs_error:.3g} "
            f"({self.executor}; {self.reason})"
        )


def default_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) for comparing with eager: looser for the half types."""
    if dtype in (torch.float16, torch.bfloat16):
        return 1e-2, 1e-2
    if dtype.is_floating_point:
        return 1e-4, 1e-4
    return 0.0, 0.0


def _flatten(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for item in value for t in _flatten(item)]
    return []


@attrs.define
class Composition:
    """A composed ExecuTorch program: its bytes, its plan, and a way to check it."""

    buffer: bytes
    data_files: dict[str, bytes]  # external tensor data (.ptd), e.g. CUDA weights
    program: ExecutorchProgramManager
    plan: Plan
    edge: EdgeProgramManager  # lowered, then converted by to_executorch
    reference: torch.nn.Module  # the lowered program as Python: delegates run their subgraphs
    eager: torch.nn.Module
    example_inputs: tuple

    def save(self, path: str | os.PathLike) -> Path:
        """Write the .pte (and any .ptd data files beside it) atomically.

        Each file goes to a temporary file in the same directory first and is renamed into
        place only when every one is written, so a failure leaves nothing partial behind.
        """
        target = Path(path)
        if not target.parent.is_dir():
            raise ComposerError(
                f"cannot write {target}: the directory {target.parent} does not exist."
            )
        outputs = {target: self.buffer}
        for name, data in self.data_files.items():
            outputs[target.parent / (name if name.endswith(".ptd") else f"{name}.ptd")] = data
        written: list[tuple[str, Path]] = []
        try:
            for destination, data in outputs.items():
                written.append((_write_temporary(destination, data), destination))
            for temporary, destination in written:
                os.replace(temporary, destination)
        except BaseException:
            for temporary, _ in written:
                Path(temporary).unlink(missing_ok=True)
            raise
        return target

    def runtime_can_run(self) -> tuple[bool, str]:
        """Whether the ExecuTorch runtime here has every delegate's backend registered."""
        from executorch.runtime import Runtime

        registered = set(Runtime.get().backend_registry.registered_backend_names)
        used = {
            lowered.backend_id
            for _name, lowered in self.edge.exported_program().graph_module.named_children()
            if hasattr(lowered, "backend_id")
        }
        missing = sorted(used - registered)
        if missing:
            return False, f"the runtime has no {', '.join(missing)}"
        return True, "every delegate's backend is registered in the runtime"

    def verify(self, inputs: Sequence[Any] | None = None) -> Verification:
        """Run the composed program and compare with eager.

        In the ExecuTorch runtime when it has every backend used; otherwise in Python, where
        each delegate runs the subgraph it was made from (which checks the wiring, not the
        backend's kernels).
        """
        with torch.no_grad():
            return self._verify(tuple(self.example_inputs if inputs is None else inputs))

    def _verify(self, inputs: tuple) -> Verification:
        # Copies, so that models updating buffers in place start from the same state as
        # the freshly loaded program, however often verify is called.
        expected = _flatten(copy.deepcopy(self.eager)(*inputs))
        can_run, reason = self.runtime_can_run()
        if can_run:
            from executorch.runtime import Runtime

            method = Runtime.get().load_program(self.buffer).load_method("forward")
            actual = _flatten(method.execute(list(inputs)))
            executor = "executorch runtime"
        else:
            actual = _flatten(copy.deepcopy(self.reference)(*inputs))
            executor = "python reference"
        if len(actual) != len(expected):
            return Verification(executor, float("inf"), False, reason)
        worst = 0.0
        ok = True
        for got, want in zip(actual, expected):
            atol, rtol = default_tolerance(want.dtype)
            if got.shape != want.shape:
                return Verification(executor, float("inf"), False, reason)
            got = got.to(want.dtype)
            if want.numel():
                worst = max(worst, (got.double() - want.double()).abs().max().item())
            ok = ok and torch.allclose(got, want, atol=atol, rtol=rtol)
        return Verification(executor, worst, ok, reason)
