"""Running a .pte in ExecuTorch's Python runtime, with errors a user can act on."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from composer.contract.backend_spec import Tolerance
from composer.contract.errors import ComposerError
from composer.contract.native_log import NativeLog
from composer.registry.discovery import current_registry, default_registry
from composer.run.cpp_runtime import missing_kernels, no_kernel
from composer.run.loads import note_loaded
from composer.run.program_table import execution_plan, program_table

# ExecuTorch's ScalarType codes, as MethodMeta reports an input's dtype.
_SCALAR_TYPES = {
    0: torch.uint8, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.int64,
    5: torch.float16, 6: torch.float32, 7: torch.float64, 11: torch.bool, 15: torch.bfloat16,
}  # fmt: skip
LIBRARY_SPEC_KEY = "composer.library"
# How a proof line names the pip runtime when it ran the whole program.
RUNTIME = "executorch runtime"


# The torch ExecuTorch 1.5.1's pip runtime is built against and links (libtorch_cpu).
BUILT_FOR_TORCH = "2.13."


def torch_mismatch() -> str | None:
    """Why the pip runtime is not used with this torch, or None where it is the one it is
    built for. (Under torch 2.11 on the GPU machine its XNNPACK delegates failed to load.)"""
    if torch.__version__.startswith(BUILT_FOR_TORCH):
        return None
    return f"the pip runtime is built for torch {BUILT_FOR_TORCH}x, not {torch.__version__}"


def registered_backends() -> set[str]:
    from executorch.runtime import Runtime

    with NativeLog().capture():
        return set(Runtime.get().backend_registry.registered_backend_names)


def program_libraries(program: bytes) -> dict[str, str]:
    """The library each delegate's backend was compiled with, as composer recorded it."""
    found: dict[str, str] = {}
    for plan in program_table(program).execution_plan:
        for delegate in plan.delegates:
            for spec in delegate.compile_specs:
                if spec.key == LIBRARY_SPEC_KEY:
                    found[delegate.id] = bytes(spec.value).decode()
    return found


def installed_libraries() -> dict[str, str]:
    """The library each installed backend compiles with here, by ExecuTorch backend id."""

    return {
        backend.spec.backend_id: backend.spec.library
        for backend in default_registry().backends.values()
        if backend.spec.library
    }


def library_mismatches(program: bytes) -> list[str]:
    """ "lowered with openvino X, this runtime has openvino Y" for each backend that differs."""
    here = installed_libraries()
    lines = []
    for backend_id, lowered in sorted(program_libraries(program).items()):
        name = lowered.split()[0]
        current = here.get(backend_id, f"no {name}")
        if current != lowered:
            lines.append(
                f"{backend_id} delegates were lowered with {lowered}, this runtime has {current}"
            )
    return lines


# A .pte is a flatbuffer whose identifier sits at bytes 4-8: "ET" and a format number.
_IDENTIFIER = slice(4, 8)


def check_program_file(buffer: bytes, name: str, method: str = "forward") -> None:
    """Refuse bytes that are not a whole ExecuTorch program with ``method`` before the runtime
    reads them.

    The runtime logs a damaged program's bytes (its identifier, a backend id) through Python,
    which cannot decode them and aborts the process; its own checks come after those logs.
    """
    identifier = bytes(buffer[_IDENTIFIER])
    if len(identifier) < 4 or not identifier.startswith(b"ET") or not identifier.isalnum():
        raise ComposerError(
            f"{name} is not an ExecuTorch program: a .pte has the identifier 'ET12' at byte 4, "
            f"this file has {identifier!r}. Pass a .pte that `composer lower` or ExecuTorch wrote."
        )
    _check_size(buffer, name)
    try:
        methods = [plan.name for plan in program_table(buffer).execution_plan]
    except Exception as error:  # any failure to parse is damage
        raise ComposerError(
            f"{name} is damaged: its program table does not parse ({type(error).__name__}). "
            "Write it again (`composer lower ... -o FILE`)."
        ) from error
    if method not in methods:
        raise ComposerError(
            f"{name} has no method {method!r}; its methods: {', '.join(sorted(methods))}."
        )


def _check_size(buffer: bytes, name: str) -> None:
    from executorch.exir._serialize._program import _get_extended_header

    header = _get_extended_header(bytes(buffer[:64]))
    if header is None:
        return
    expected = max(header.program_size, header.segment_base_offset + header.segment_data_size)
    if expected > len(buffer):
        raise ComposerError(
            f"{name} is truncated: its header says {expected:,} bytes, the file has "
            f"{len(buffer):,}. Copy or write it again."
        )


class LoadedProgram:
    """A program and one method loaded in the runtime; keeps the bytes alive while it lives."""

    def __init__(self, program: bytes, method: str = "forward", *, etdump: bool = False) -> None:
        from executorch.runtime import Runtime

        note_loaded()
        self.buffer = program
        self.method_name = method
        log = NativeLog()
        try:
            with log.capture():
                runtime = Runtime.get()
                # No debug buffer: with one, ETDump also stores every intermediate tensor and
                # aborts the process once it is full (14 calls of transformer_block at 1 MiB).
                self.program = runtime.load_program(
                    program, enable_etdump=etdump, debug_buffer_size=0
                )
        except Exception as error:
            raise ComposerError(
                f"the ExecuTorch runtime cannot load this program: {error}" + log.because()
            ) from error
        if method not in self.program.method_names:
            raise ComposerError(
                f"the program has no method {method!r}; its methods: "
                f"{', '.join(sorted(self.program.method_names))}."
            )
        try:
            with log.capture():
                self.method = self.program.load_method(method)
        except Exception as error:
            mismatches = library_mismatches(program)
            if mismatches:
                raise ComposerError(
                    f"cannot load method {method!r}: {'; '.join(mismatches)}. A compiled blob "
                    "only loads under the version that compiled it: lower the model again here, "
                    "or install the version it was lowered with."
                ) from error
            lacking = sorted(program_backend_ids(program) - registered_backends())
            missing = missing_kernels(log.text)
            if missing and not lacking:
                raise ComposerError(
                    f"the ExecuTorch runtime cannot load method {method!r}: {no_kernel(missing)}."
                ) from error
            hint = _elsewhere_hint(lacking)
            raise ComposerError(
                f"the ExecuTorch runtime cannot load method {method!r}: {error}{log.because()}. "
                + (f"It has no {', '.join(lacking)}; " if lacking else "")
                + f"it has: {', '.join(sorted(registered_backends()))}.{hint}"
            ) from error

    def check_inputs(self, inputs: Sequence[object]) -> None:
        """Raise a ComposerError naming the first input that does not fit the method."""
        meta = self.method.metadata
        if len(inputs) != meta.num_inputs():
            raise ComposerError(
                f"method {self.method_name!r} takes {meta.num_inputs()} input(s), got "
                f"{len(inputs)}: {_describe(meta)}."
            )
        for index, value in enumerate(inputs):
            info = meta.input_tensor_meta(index)
            want_shape = tuple(info.sizes())
            want_dtype = _SCALAR_TYPES.get(info.dtype())
            if not isinstance(value, torch.Tensor):
                raise ComposerError(
                    f"input {index} must be a tensor of shape {list(want_shape)}, got "
                    f"{type(value).__name__}."
                )
            bounded = index in self.bounded_inputs
            if not _fits(tuple(value.shape), want_shape, bounded) or (
                want_dtype and value.dtype != want_dtype
            ):
                raise ComposerError(
                    f"input {index} has shape {list(value.shape)} "
                    f"{str(value.dtype).removeprefix('torch.')}; the program was exported for "
                    f"{_describe(meta)}" + (" (at most, per dim)" if bounded else "") + "."
                )

    @functools.cached_property
    def bounded_inputs(self) -> frozenset[int]:
        """The method's inputs whose sizes are upper bounds (a dynamic dim): the runtime's
        metadata gives the bound, and any size up to it is accepted."""
        return bounded_inputs(self.buffer, self.method_name)

    def timed_call(self, inputs: Sequence[object]):
        """A call of the method on ``inputs`` as cheap as the runtime allows, for timing.

        It skips the log capture of :meth:`run` (a file and two descriptor swaps cost more
        than a small program's whole run); check the inputs with :meth:`run` first.
        """
        execute, arguments = self.method.execute, list(inputs)
        return lambda: execute(arguments)

    def run(self, inputs: Sequence[object]) -> list:
        """Execute the method once; failures become a ComposerError with the runtime's reason."""
        log = NativeLog()
        try:
            with log.capture():
                return list(self.method.execute(list(inputs)))
        except Exception as error:
            raise ComposerError(
                f"running {self.method_name!r} failed: {error}{log.because()}"
            ) from error


def _elsewhere_hint(lacking: Sequence[str]) -> str:
    """Where the delegates of backends this runtime lacks run instead: the runtime their
    plugin supplies, through which `--verify` runs the program piece by piece."""
    hints = []
    for backend_id in lacking:
        found = current_registry().runtime_of_id(backend_id)
        if found is not None:
            name, runtime = found
            unavailable = runtime.unavailable_reason()
            where = f" (not here: {unavailable})" if unavailable else ""
            hints.append(f"{backend_id} delegates run in {name}'s runtime, {runtime.name}{where}")
    if not hints:
        return ""
    return (
        f" {'; '.join(hints)}: where it runs, `composer lower MODEL --backends ... --verify` "
        "runs the program piece by piece."
    )


def _fits(shape: tuple[int, ...], declared: tuple[int, ...], bounded: bool) -> bool:
    if not bounded:
        return shape == declared
    return len(shape) == len(declared) and all(n <= m for n, m in zip(shape, declared))


def bounded_inputs(program: bytes, method: str = "forward") -> frozenset[int]:
    """Indices of ``method``'s tensor inputs whose shape is dynamic (bounded by the sizes the
    runtime reports for them)."""
    from executorch.exir.schema import Tensor, TensorShapeDynamism

    plan = execution_plan(program, method)
    if plan is None:
        return frozenset()
    return frozenset(
        index
        for index, value in enumerate(plan.inputs)
        if isinstance(plan.values[value].val, Tensor)
        and plan.values[value].val.shape_dynamism != TensorShapeDynamism.STATIC
    )


def _describe(meta) -> str:
    parts = []
    for index in range(meta.num_inputs()):
        info = meta.input_tensor_meta(index)
        dtype = _SCALAR_TYPES.get(info.dtype())
        name = str(dtype).removeprefix("torch.") if dtype else f"dtype {info.dtype()}"
        parts.append(f"{list(info.sizes())} {name}")
    return ", ".join(parts) or "no inputs"


def run_program(program: bytes, inputs: Sequence[torch.Tensor], method: str = "forward") -> list:
    """Load ``program`` and run ``method`` on ``inputs``; failures become ComposerError."""
    loaded = LoadedProgram(program, method)
    loaded.check_inputs(inputs)
    return loaded.run(inputs)


def installed_tolerance(program: bytes):
    """The loosest tolerance that the installed backends of ``program``'s delegates declare."""

    used = program_backend_ids(program)
    return Tolerance.loosest({
        name: b.spec.tolerance
        for name, b in default_registry().backends.items()
        if b.spec.backend_id in used and b.spec.tolerance is not None
    })  # fmt: skip


def program_backend_ids(program: bytes) -> set[str]:
    """The ExecuTorch backend ids of ``program``'s delegates."""
    return {
        delegate.id for plan in program_table(program).execution_plan for delegate in plan.delegates
    }


def runtime_can_run(program: bytes) -> tuple[bool, str]:
    """Whether the ExecuTorch runtime here can run ``program``: built for this torch, with
    every delegate's backend registered."""
    mismatch = torch_mismatch()
    if mismatch is not None:
        return False, mismatch
    missing = sorted(program_backend_ids(program) - registered_backends())
    if missing:
        return False, f"the runtime has no {', '.join(missing)}"
    return True, "every delegate's backend is registered in the runtime"
