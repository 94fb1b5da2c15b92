"""From a model to an ``ExportedProgram``: an ``nn.Module`` is exported with its example inputs."""

from __future__ import annotations

import copy
import io
import weakref
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import sympy
import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.export.graph_signature import OutputKind

from composer.contract.errors import ModelError
from composer.lower.pending_symbols import shape_envs

Model = ExportedProgram | torch.nn.Module


def export_model(
    model: Model, example_inputs: Sequence[Any] | None, dynamic_shapes: Any = None
) -> ExportedProgram:
    """An ``ExportedProgram`` as is; a module exported with its example inputs (and
    ``dynamic_shapes``, in ``torch.export.export``'s own form)."""
    if isinstance(model, ExportedProgram):
        if dynamic_shapes is not None:
            raise ModelError(
                "dynamic_shapes is for an nn.Module: an ExportedProgram's dims are as it was "
                "exported (export it again with dynamic_shapes=, or pass the module)."
            )
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
        return torch.export.export(
            model.eval(), tuple(example_inputs), dynamic_shapes=dynamic_shapes, strict=False
        )
    except Exception as error:
        raise ModelError(
            f"torch.export failed for {type(model).__name__}: {type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}. Make the model exportable "
            "(see torch.export's docs) or export it yourself and pass the ExportedProgram."
        ) from error


def fresh_program(model: Model, example_inputs: Sequence[Any] | None) -> ExportedProgram:
    """A program to lower that no lowering has touched: exported again, or the user's copied
    (ExecuTorch's lowering changes the program it is given)."""
    if isinstance(model, ExportedProgram):
        return _Untouched.of(model).copy()
    return export_model(model, example_inputs)


def model_copy(model: Model) -> Model:
    """A copy of the user's model as it is now, for lowering again later (the caller may change
    or run it meanwhile)."""
    if isinstance(model, ExportedProgram):
        return _Untouched.of(model).copy()
    return copy.deepcopy(model)


def untouched_copies(program: ExportedProgram) -> Callable[[], ExportedProgram] | None:
    """Copies of ``program`` as it is now, one a call, each sharing nothing with it or the
    others (a lowering changes what it is given); None where torch.export cannot save it."""
    saved = _saved(program)
    return None if saved is None else _Untouched(program, saved).copy


def _deepcopy_program(program: ExportedProgram) -> ExportedProgram:
    """``copy.deepcopy(program)``, its example inputs detached first: optimum's Whisper decoder
    keeps the encoder's output it was exported with, a tensor with a grad_fn, which deepcopy
    refuses ("Only Tensors created explicitly by the user (graph leaves) support the deepcopy
    protocol")."""
    memo: dict[int, Any] = {}
    for tensor in pytree.tree_leaves(program.example_inputs):
        if isinstance(tensor, torch.Tensor) and tensor.grad_fn is not None:
            memo[id(tensor)] = tensor.detach().clone()
    return copy.deepcopy(program, memo)


class _Untouched:
    """A user's ExportedProgram kept as torch.export serialized it, before any lowering.

    A deepcopy shares the program's ShapeEnv, and a lowering that guards on a symbolic size
    specializes it for every copy: after the cuda backend's first lowering of a dynamic bf16
    encoder, the repair's copy had a static sequence length, and composer proved and wrote a
    program that failed at every other length. A program loaded from bytes has its own.
    """

    # By the program's id, while it lives: a strong reference kept the last 8 programs a
    # process composed, weights and all (a worker of ExecuTorch's test suite, composing vgg11
    # after other torchvision models, was killed by the OOM killer at 15.3 GB of 24).
    _kept: ClassVar[dict[int, tuple[weakref.ref, bytes | None]]] = {}

    def __init__(self, program: ExportedProgram, saved: bytes | None) -> None:
        self.program, self.saved = program, saved

    @classmethod
    def of(cls, program: ExportedProgram) -> _Untouched:
        kept = cls._kept.get(id(program))
        if kept is not None and kept[0]() is program:
            return cls(program, kept[1])
        saved = _saved(program)
        cls._kept[id(program)] = (weakref.ref(program), saved)
        weakref.finalize(program, cls._kept.pop, id(program), None)
        if len(cls._kept) > 8:  # a sweep composes many programs; keep the latest few
            cls._kept.pop(next(iter(cls._kept)))
        return cls(program, saved)

    def copy(self) -> ExportedProgram:
        if self.saved is None:
            return _deepcopy_program(self.program)
        try:
            loaded = load_program(io.BytesIO(self.saved))
        except Exception:  # noqa: BLE001 - as above: a deepcopy is the next best
            return _deepcopy_program(self.program)
        # The file drops the names the user gave their Dims, which the plan reports sizes by.
        for original, copy_ in zip(shape_envs([self.program]), shape_envs([loaded]), strict=False):
            copy_.source_name_to_debug_name.update(original.source_name_to_debug_name)
        return loaded


def _saved(program: ExportedProgram) -> bytes | None:
    """``program`` as torch.export saves it; None for an op it cannot serialize."""
    try:
        buffer = io.BytesIO()
        torch.export.save(program, buffer)
        return buffer.getvalue()
    except Exception:  # noqa: BLE001 - the caller has a next best: a deepcopy, an export
        return None


def load_program(source: Any) -> ExportedProgram:
    """``torch.export.load(source)``, with the loaded ShapeEnv's ranges keyed by symbols only
    and each derived dim's root given its example value."""
    program = torch.export.load(source)
    # torch 2.13 loads a derived dim's range (``2*s44: [8, 128]``) into the ShapeEnv beside its
    # root's; the next retrace (every lowering, ExecuTorch's own) then fails in
    # ``_replace_unbacked_bindings`` with "expected sympy.Symbol". The derived range follows
    # from the root's, and range_constraints keeps it for the program's users.
    for env in shape_envs([program]):
        for key in [k for k in env.var_to_range if not isinstance(k, sympy.Symbol)]:
            del env.var_to_range[key]
        _root_hints(env)
    return program


def _root_hints(env: Any) -> None:
    """Give each root symbol of a derived dim the example value the file keeps only for the
    derived size (``16*s89: 224`` and no ``s89``). Without it the root reads as data-dependent:
    torchvision's squeezenet at ``16 * Dim`` sizes failed ``to_executorch`` on "Could not guard on
    data-dependent expression (s89 - 1)*(s99 - 1) < s99 - 1" where the program as exported
    lowered, as plain's does."""
    # torch 2.13 names them backed_var_to_val (var_to_val, deprecated, is the same dict); 2.11
    # (the GPU machine's) var_to_val alone
    hints = env.backed_var_to_val if hasattr(env, "backed_var_to_val") else env.var_to_val
    for derived, value in list(hints.items()):
        (root, *others) = derived.free_symbols or (None,)
        if isinstance(derived, sympy.Symbol) or others or root is None or root in hints:
            continue
        if not derived.is_polynomial(root):  # a floor or a modulo of it has no one root
            continue
        solved = [s for s in sympy.solve(sympy.Eq(derived, value), root) if s.is_integer]
        if len(solved) == 1:
            hints[root] = sympy.Integer(solved[0])


def parameters_written(program: ExportedProgram) -> list[str]:
    """The parameters ``program``'s forward writes to, as ExecuTorch's lowering sees them once
    functionalized (``torch.export`` keeps the write in place, in a no_grad region's
    submodule, so the exported graph alone does not say). A full retrace: for a lowering that
    failed, not for every one."""
    try:
        functional = program.run_decompositions({})
    except Exception:  # noqa: BLE001 - the lowering's own error says more than this one
        return []
    return [
        spec.target
        for spec in functional.graph_signature.output_specs
        if spec.kind == OutputKind.PARAMETER_MUTATION
    ]


def parameters_written_error(written: Sequence[str]) -> ModelError:
    """Why no ExecuTorch lowering of a program that writes ``written`` can succeed: it fails
    deep in a backend's ``to_backend`` or in ``to_executorch`` ("SpecViolationError: Parameter
    output getitem_6 does not point to a parameter that exists"), which reads as the backend's
    fault. transformers' RWKV rescales its weights in place on its first call in eval mode."""
    shown = ", ".join(written[:4]) + (f" and {len(written) - 4} more" if len(written) > 4 else "")
    return ModelError(
        f"the model writes to {len(written)} parameter(s) in forward ({shown}); an ExecuTorch "
        "program cannot update parameters, with any backend. Register what forward updates as "
        "a buffer (register_buffer), or make the update before export: a model that changes "
        "its weights once, on its first call (transformers' RWKV rescales them in eval mode), "
        "exports without the write after one call on the example inputs."
    )


def example_inputs_of(model: Model, given: Sequence[Any] | None) -> tuple:
    """The inputs to prove ``model`` on: ``given``, else an ExportedProgram's own example
    inputs; where those have keyword inputs (export_llama's ``input_pos``), the leaves of
    ``(args, kwargs)``, which :func:`eager_of` takes."""
    if given is not None:
        return tuple(given)
    stored = getattr(model, "example_inputs", None)
    if stored:
        args, kwargs = stored
        if kwargs:
            return tuple(pytree.tree_leaves((tuple(args), dict(kwargs))))
        return tuple(args)
    return ()


def eager_of(model: Model, given: Sequence[Any] | None) -> torch.nn.Module:
    """The eager model to compare with, called as :func:`example_inputs_of`'s inputs are."""
    if isinstance(model, torch.nn.Module):
        return model
    eager = model.module()
    stored = getattr(model, "example_inputs", None)
    if given is None and stored and stored[1]:
        _, spec = pytree.tree_flatten((tuple(stored[0]), dict(stored[1])))
        return KeywordsFlattened(eager, spec)
    return eager


class KeywordsFlattened(torch.nn.Module):
    """A module with keyword inputs, called with the leaves of ``(args, kwargs)`` in the
    order torch.export flattens them, which is how an ExecuTorch method takes them."""

    def __init__(self, module: torch.nn.Module, spec: pytree.TreeSpec) -> None:
        super().__init__()
        self.module, self.spec = module, spec

    def forward(self, *leaves: Any) -> Any:
        args, kwargs = pytree.tree_unflatten(list(leaves), self.spec)
        return self.module(*args, **kwargs)
