"""Run a composed program's CUDA delegates as their compiled AOTInductor ``.so`` on a GPU.

ExecuTorch's CUDA runtime is C++ and not in the pip wheel, so nothing else here executes the
code ``CudaBackend`` compiled. Each delegate's ``.so`` leaves its ``aoti_torch_*`` symbols to
its host; libtorch provides them, and ``torch._C._aoti.AOTIModelContainerRunnerCuda`` loads
it. Its weights are bound from the ``.ptd`` through the delegate's manifest
(:mod:`composer.run.cuda_manifest`). A delegate of a backend
an ExecuTorch runtime here has (XNNPACK, OpenVINO) runs its own compiled code too, as a
program of that one delegate in that runtime; what is outside the delegates runs as in
``Composition.reference``, in Python.
"""

from __future__ import annotations

import copy
import ctypes
import functools
import operator
import os
import tempfile
from collections.abc import Mapping
from typing import Protocol

import torch
import torch.fx
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from composer.contract.errors import ComposerError
from composer.run import torch_free_runtime
from composer.run.compare import flatten_tensors
from composer.run.cuda_manifest import (
    CUDA_BACKEND_ID,
    Manifest,
    WeightEntry,
    missing_weights,
    named_data,
    parse_manifest,
)
from composer.run.runtime import (
    LoadedProgram,
    program_backend_ids,
    registered_backends,
    runtime_can_run,
    torch_mismatch,
)
from composer.run.subgraphs import subgraph_module


class Hostable(Protocol):
    """What the host needs of a composed program (a :class:`composer.run.composition.Composition`)."""

    buffer: bytes
    data_files: Mapping[str, bytes]

    @property
    def reference(self) -> torch.nn.Module: ...


EXECUTOR = "AOTInductor .so, libtorch host"
_TORCH_LIBS = ("libc10.so", "libtorch_cpu.so", "libc10_cuda.so", "libtorch_cuda.so")


@functools.cache
def host_unavailable_reason() -> str | None:
    """None when a compiled CUDA delegate can run here; otherwise why not, in words."""
    if torch.version.cuda is None:
        return f"torch {torch.__version__} here is not a CUDA build"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible"
    if not hasattr(torch._C._aoti, "AOTIModelContainerRunnerCuda"):
        return f"torch {torch.__version__} has no AOTIModelContainerRunnerCuda"
    # The .so does not link libtorch: its aoti_torch_* symbols must be global before dlopen.
    library_dir = os.path.join(os.path.dirname(torch.__file__), "lib")
    for name in _TORCH_LIBS:
        try:
            ctypes.CDLL(os.path.join(library_dir, name), mode=ctypes.RTLD_GLOBAL)
        except OSError as error:
            return f"cannot load {name} globally from {library_dir}: {error}"
    return None


def weight_tensor(entry: WeightEntry, raw: bytes) -> torch.Tensor:
    """The constant ``entry`` describes, viewed out of its storage bytes, on its device."""
    storage = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(entry.dtype)
    view = torch.as_strided(storage, entry.sizes, entry.strides, entry.storage_offset)
    return view.to(entry.device) if entry.device != "cpu" else view


class CompiledCudaDelegate(torch.nn.Module):
    """One CudaBackend delegate: its .so on the GPU with its weights bound from the .ptd.

    Inputs go to the GPU; outputs come back to ``host`` (the device the rest runs on).
    """

    def __init__(
        self, manifest: Manifest, data: Mapping[str, bytes], host: str, single_output: bool
    ) -> None:
        super().__init__()
        problems = missing_weights(manifest, data)
        if problems:
            raise ComposerError(
                "a CudaBackend delegate's data is incomplete: "
                + "; ".join(problems[:5])
                + ". Pass the .ptd files written beside the .pte (Composition.data_files)."
            )
        self.host, self.single_output = host, single_output
        self._directory = tempfile.TemporaryDirectory(prefix="composer_aoti_")
        so_path = os.path.join(self._directory.name, f"{manifest.so_blob_key[:16]}.so")
        with open(so_path, "wb") as out:
            out.write(data[manifest.so_blob_key])
        self.runner = torch._C._aoti.AOTIModelContainerRunnerCuda(so_path, 1, "cuda")
        by_fqn = {entry.fqn: entry for entry in manifest.entries}
        constants, unbound = {}, []
        for name, fqn in self.runner.get_constant_names_to_original_fqns().items():
            entry = by_fqn.get(fqn) or by_fqn.get(name)
            if entry is None:
                unbound.append(f"{name} ({fqn})")
            else:
                constants[name] = weight_tensor(entry, data[entry.storage_key])
        if unbound:
            raise ComposerError(
                f"the compiled .so {manifest.so_blob_key[:16]} wants constants its manifest "
                f"does not list: {', '.join(unbound[:5])}."
            )
        if constants:
            self.runner.update_constant_buffer(constants, False, True)

    def forward(self, *inputs: torch.Tensor):
        outputs = self.runner.run([t.to("cuda") for t in inputs])
        outputs = tuple(t.to(self.host) for t in outputs)
        return outputs[0] if self.single_output else outputs


class RuntimeDelegate(torch.nn.Module):
    """One delegate of a backend an ExecuTorch runtime here has, run there as a program of its
    own (``LoweredBackendModule.buffer()``): its backend's compiled code, not its subgraph in
    Python. Inputs go to the CPU; outputs come back to ``host``.

    The pip runtime runs it under the torch it is built for (``runtime.BUILT_FOR_TORCH``);
    under another, the torch-free runtime (:mod:`composer.run.torch_free_runtime`) where
    installed. ``runtime`` names the one that runs it. Raises ComposerError saying why where
    neither can.
    """

    def __init__(self, lowered, host: str, single_output: bool) -> None:
        super().__init__()
        self.host, self.single_output = host, single_output
        # The loaded program must outlive its method: _program keeps it.
        self._program, self._execute, self.runtime = _delegate_method(lowered)

    def forward(self, *inputs: torch.Tensor):
        outputs = self._execute([t.cpu() for t in inputs])
        outputs = tuple(t if self.host == "cpu" else t.to(self.host) for t in outputs)
        return outputs[0] if self.single_output else outputs


def _delegate_method(lowered):
    """One delegate's program loaded here, its execute function and the runtime's name; or
    ComposerError saying why it cannot be."""

    backend = lowered.backend_id
    mismatch = torch_mismatch()
    if mismatch is None:
        if backend not in registered_backends():
            raise ComposerError(f"the pip runtime has no {backend}")
        program = LoadedProgram(standalone_buffer(lowered))
        return program, program.method.execute, "executorch"
    if backend in torch_free_runtime.backends():
        method = torch_free_runtime.TorchFreeMethod(standalone_buffer(lowered))
        name = f"{torch_free_runtime.DISTRIBUTION} (ExecuTorch {torch_free_runtime.version()})"
        return method, method.execute, name
    raise ComposerError(
        f"{mismatch}, and {torch_free_runtime.DISTRIBUTION}, which links no torch, "
        + ("has no " + backend if torch_free_runtime.backends() else "is not installed")
        + " (pip install it; it needs Python 3.12)"
    )


class _UpperBoundPlanning(PassBase):
    """Memory planning at each dynamic dim's upper bound, as ``to_executorch`` plans a dynamic
    program with ``ConstraintBasedSymShapeEvalPass``: ``LoweredBackendModule.program()`` plans
    a delegate's own program without any such pass, and its emitter then fails on a tensor of
    symbolic size ("Non-const tensor should be an activation tensor: mem_offset 16*CeilToInt(...)")."""

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        # Here, not at the top: importing executorch.exir costs seconds (its edge dialect's
        # YAML), and this module is on the path of a cache hit, which must cost a file read.
        from executorch.exir.passes import MemoryPlanningPass
        from executorch.exir.passes.sym_shape_eval_pass import ConstraintBasedSymShapeEvalPass

        ConstraintBasedSymShapeEvalPass()(graph_module)
        return MemoryPlanningPass()(graph_module)


def standalone_buffer(lowered) -> bytes:
    """One delegate as a program of its own, planned at its inputs' upper bounds."""
    return lowered.buffer(memory_planning=_UpperBoundPlanning())


def _is_delegate_call(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and "executorch_call_delegate" in str(node.target)


def retarget_factories(graph_module: torch.fx.GraphModule, device: str) -> None:
    """Make the factory calls (arange, full...) that export recorded with device=cpu run on
    ``device``, so a program moved there does not mix devices."""
    for node in graph_module.graph.nodes:
        if isinstance(node.kwargs.get("device"), torch.device):
            node.kwargs = {**node.kwargs, "device": torch.device(device)}
    graph_module.recompile()


def _move_program(program, device: str) -> None:
    # LoweredBackendModule.__deepcopy__ shares state_dict and constants with the module it
    # copies (and ExportedProgram's setters refuse): give the copy its own dicts.
    state = {}
    for name, value in program.state_dict.items():
        moved = value.to(device)
        if isinstance(value, torch.nn.Parameter):
            moved = torch.nn.Parameter(moved, requires_grad=False)
        state[name] = moved
    program._state_dict = state
    program._constants = {
        name: value.to(device) if isinstance(value, torch.Tensor) else value
        for name, value in program.constants.items()
    }


def reference_on(composition: Hostable, device: str) -> torch.fx.GraphModule:
    """The Python reference with every tensor, delegate subgraph and factory op on ``device``."""
    module = copy.deepcopy(composition.reference)
    retarget_factories(module, device)
    for child in module.modules():
        original = getattr(child, "original_module", None)
        if original is not None and hasattr(original, "state_dict"):
            _move_program(original, device)
            retarget_factories(original.graph_module, device)
    return module.to(device)


def aoti_hosted(composition: Hostable, host: str = "cpu") -> torch.fx.GraphModule:
    """The composed program with each CudaBackend delegate run as its compiled .so.

    A delegate of a backend an ExecuTorch runtime here has runs there
    (:class:`RuntimeDelegate`); any other runs the subgraph it was made from, as in the
    Python reference. The rest of the program runs on ``host``: "cpu" (as the .pte does,
    with copies to and from the GPU around each CUDA delegate; inputs and outputs on the
    CPU) or "cuda" (all on the GPU; inputs and outputs there). Raises ComposerError where
    host_unavailable_reason() says why the GPU part cannot run; a program without CUDA
    delegates runs on a CPU host anywhere.
    """

    _check_can_host(composition, host)
    module = (
        reference_on(composition, "cuda")
        if host == "cuda"
        else copy.deepcopy(composition.reference)
    )
    module.meta["in_python"] = []  # (delegate, why) for those that ran as subgraphs
    module.meta["in_runtime"] = []  # (delegate, the runtime that ran its compiled code)
    data = named_data(composition.buffer, composition.data_files)
    for node in list(module.graph.nodes):
        if _is_delegate_call(node):
            name, replacement = _hosted_delegate(module, composition, node, data, host)
            _call_instead(module, node, name, replacement)
    module.recompile()
    return module


def _check_can_host(composition: Hostable, host: str) -> None:
    if host not in ("cpu", "cuda"):
        raise ComposerError(f"host must be 'cpu' or 'cuda', not {host!r}.")
    reason = host_unavailable_reason()
    if reason is not None and (
        host == "cuda" or CUDA_BACKEND_ID in program_backend_ids(composition.buffer)
    ):
        raise ComposerError(f"cannot run the compiled CUDA delegates here: {reason}.")


def _hosted_delegate(
    module: torch.fx.GraphModule, composition: Hostable, node: torch.fx.Node, data, host: str
) -> tuple[str, torch.nn.Module]:
    """What runs the delegate that ``node`` calls, and the name it goes by in ``module``: a
    CUDA delegate's compiled .so, else the ExecuTorch runtime that has its backend, else its
    subgraph in Python (``module.meta`` lists which ran where)."""
    lowered_node = node.args[0]
    lowered = getattr(module, lowered_node.target)
    single = any(user.target is not operator.getitem for user in node.users)
    if lowered.backend_id == CUDA_BACKEND_ID:
        manifest = parse_manifest(lowered.processed_bytes)
        return f"{lowered_node.target}_compiled", CompiledCudaDelegate(manifest, data, host, single)
    try:
        # From the reference's own module: reference_on moved this one's program to
        # the GPU, and its buffer() would serialize that.
        source = getattr(composition.reference, lowered_node.target, lowered)
        replacement = RuntimeDelegate(source, host, single)
        module.meta["in_runtime"].append((lowered_node.target, replacement.runtime))
        return f"{lowered_node.target}_in_runtime", replacement
    except ComposerError as error:
        # Said, not hidden: its time would be Python's.
        module.meta["in_python"].append((lowered_node.target, str(error).splitlines()[0]))
        # What executorch_call_delegate runs in Python, unlifted once, not per call.
        return f"{lowered_node.target}_subgraph", subgraph_module(lowered)


def _call_instead(
    module: torch.fx.GraphModule, node: torch.fx.Node, name: str, replacement: torch.nn.Module
) -> None:
    """Replace the delegate call ``node`` with a call of ``replacement`` (as submodule
    ``name``), dropping the lowered module once nothing calls it."""
    lowered_node = node.args[0]
    graph = module.graph
    module.add_submodule(name, replacement)
    with graph.inserting_before(node):
        call = graph.call_module(name, tuple(node.args[1:]))
    call.meta = dict(node.meta)
    call.meta["lowered_module"] = lowered_node.target  # what composer.measure.hosted_trace times
    node.replace_all_uses_with(call)
    graph.erase_node(node)
    if not lowered_node.users:
        graph.erase_node(lowered_node)
        delattr(module, lowered_node.target)


class HostedProgram:
    """A composed program with CUDA delegates, run through :func:`aoti_hosted` on a CPU host,
    with the calls :class:`composer.run.runtime.LoadedProgram` offers: ``run`` and
    ``timed_call``. Its outputs come back to the CPU, so a timed call includes the GPU's
    work."""

    def __init__(self, composition: Hostable) -> None:
        self.composition = composition
        self.module = aoti_hosted(composition)
        # Delegates that ran as their subgraphs in Python: timing them says little.
        self.in_python: list[tuple[str, str]] = self.module.meta["in_python"]

    def run(self, inputs) -> list:
        with torch.no_grad():
            return flatten_tensors(self.module(*inputs))

    def timed_call(self, inputs):
        module, arguments = self.module, tuple(inputs)

        def call():
            with torch.no_grad():
                return module(*arguments)

        return call


def program_runner(composition: Hostable, hosted: bool):
    """What runs ``composition`` here for timing: the ExecuTorch runtime (a ``LoadedProgram``),
    or, with ``hosted`` (a stack with CUDA in it, on a GPU), a :class:`HostedProgram`, so that
    every candidate of one comparison runs the same way. Raises ComposerError saying why it
    cannot run here."""

    if hosted:
        program = HostedProgram(composition)
        if program.in_python:
            delegate, why = program.in_python[0]
            raise ComposerError(
                f"{len(program.in_python)} delegate(s) would run as Python subgraphs, which "
                f"says nothing of their backend's speed ({delegate}: {why})"
            )
        return program
    runnable, why = runtime_can_run(composition.buffer)
    if not runnable:
        raise ComposerError(why)
    return LoadedProgram(composition.buffer)
