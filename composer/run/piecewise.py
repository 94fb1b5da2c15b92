"""Run a composed program piece by piece: each delegate in its own backend's runtime, what lies
between the delegates in Python.

A program no single runtime here runs whole (a ``cuda`` delegate beside an XNNPACK one, a
third-party backend's delegate) is still run for real: each delegate goes to the
:class:`composer.DelegateRuntime` its plugin supplies (``composer_runtime``), else to an
ExecuTorch runtime here whose build has its backend, as a program of that one delegate; what is
outside the delegates runs as in ``Composition.reference``. A delegate no runtime here has runs
as the subgraph it was made from, and ``meta["in_python"]`` says so: that checks the wiring,
not the backend's code.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Mapping
from typing import Protocol

import torch
import torch.fx
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from composer.contract.errors import ComposerError, first_line
from composer.contract.runtime import Delegate, DelegateRuntime
from composer.registry.discovery import current_registry
from composer.run import torch_free_runtime
from composer.run.compare import flatten_tensors
from composer.run.named_data import LazyNamedData
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


EXECUTOR = "piecewise"


def plugin_runtime(backend_id: str) -> tuple[str, DelegateRuntime] | None:
    """The backend lowering ``backend_id`` and the runtime its plugin supplies, if any."""
    return current_registry().runtime_of_id(backend_id)


def unavailable_runtimes(program: bytes) -> dict[str, str]:
    """Per backend id of ``program`` whose plugin supplies a runtime that cannot run here: why."""
    found = {}
    for backend_id in sorted(program_backend_ids(program)):
        supplied = plugin_runtime(backend_id)
        if supplied is not None and (reason := supplied[1].unavailable_reason()) is not None:
            found[backend_id] = f"{supplied[0]}'s runtime ({supplied[1].name}): {reason}"
    return found


def runtimes_here(program: bytes) -> tuple[list[str], list[str]]:
    """Where each backend of ``program``'s delegates would run here, piece by piece ("XnnpackBackend
    in the ExecuTorch runtime"), and why the others cannot run here."""
    where, missing = [], []
    pip = registered_backends() if torch_mismatch() is None else torch_free_runtime.backends()
    for backend_id in sorted(program_backend_ids(program)):
        supplied = plugin_runtime(backend_id)
        if supplied is not None:
            reason = supplied[1].unavailable_reason()
            if reason is None:
                where.append(f"{backend_id} in {supplied[1].name}")
            else:
                missing.append(f"{supplied[0]}'s runtime ({supplied[1].name}): {reason}")
        elif backend_id in pip:
            where.append(f"{backend_id} in the ExecuTorch runtime")
        else:
            missing.append(f"no runtime here has {backend_id}")
    return where, missing


def runnable_piecewise(program: bytes) -> tuple[bool, str]:
    """Whether every delegate of ``program`` has a runtime here (its plugin's, or an ExecuTorch
    runtime whose build has its backend), so the program runs piece by piece; and where."""
    where, missing = runtimes_here(program)
    if missing:
        return False, "; ".join(missing)
    return True, "piece by piece: " + ", ".join(where)


def lacked_operators(backend: str, failure: str) -> tuple[str, ...]:
    """The operators ``failure`` says ``backend``'s own runtime lacks (its plugin's
    :meth:`composer.DelegateRuntime.lacked_operators`); none where its plugin supplies none."""
    registry = current_registry()
    found = registry.backends.get(backend)
    runtime = registry.runtime(found) if found is not None else None
    return runtime.lacked_operators(failure) if runtime is not None else ()


def delegate_record(lowered, data: Mapping[str, bytes], outputs: int) -> Delegate:
    """What a :class:`composer.DelegateRuntime` gets of the delegate ``lowered``."""
    return Delegate(
        backend_id=lowered.backend_id,
        processed_bytes=bytes(lowered.processed_bytes),
        compile_specs={spec.key: bytes(spec.value) for spec in lowered.compile_specs},
        named_data=data,
        standalone=lambda: standalone_buffer(lowered),
        outputs=outputs,
    )


class PluginDelegate(torch.nn.Module):
    """One delegate run by the runtime its backend's plugin supplies. Outputs come back to
    ``host`` (the device the rest runs on)."""

    def __init__(
        self, runtime: DelegateRuntime, delegate: Delegate, host: str, single_output: bool
    ) -> None:
        super().__init__()
        self.runtime = runtime.name
        self.host, self.single_output = host, single_output
        try:
            self._run = runtime.load(delegate)
        except ComposerError:
            raise
        except Exception as error:  # the plugin's runtime says why, as it said it
            raise ComposerError(
                f"{runtime.name} cannot load a {delegate.backend_id} delegate: "
                f"{type(error).__name__}: {first_line(error)}"
            ) from error

    def forward(self, *inputs: torch.Tensor):
        try:
            outputs = self._run([t.cpu() for t in inputs])
        except ComposerError:
            raise
        except Exception as error:  # a RuntimeError as a runtime raises one, with its text
            raise RuntimeError(f"{self.runtime}: {type(error).__name__}: {error}") from error
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


def piecewise_module(composition: Hostable, host: str = "cpu") -> torch.fx.GraphModule:
    """The composed program with each delegate run by its backend's runtime here.

    A delegate goes to the runtime its plugin supplies (:class:`PluginDelegate`), else to an
    ExecuTorch runtime here that has its backend (:class:`RuntimeDelegate`), else runs the
    subgraph it was made from, as in the Python reference. The rest of the program runs on
    ``host``: "cpu" (as the .pte does, with copies to and from a device around each delegate
    whose runtime computes there; inputs and outputs on the CPU) or "cuda" (all on the GPU).
    Raises ComposerError where a plugin's runtime says it cannot run here.
    """

    _check_can_host(composition, host)
    module = (
        reference_on(composition, "cuda")
        if host == "cuda"
        else copy.deepcopy(composition.reference)
    )
    module.meta["in_python"] = []  # (delegate, why) for those that ran as subgraphs
    module.meta["in_runtime"] = []  # (delegate, the runtime that ran its compiled code)
    data = LazyNamedData(composition.buffer, composition.data_files)
    for node in list(module.graph.nodes):
        if _is_delegate_call(node):
            name, replacement = _hosted_delegate(module, composition, node, data, host)
            _call_instead(module, node, name, replacement)
    module.recompile()
    return module


def _check_can_host(composition: Hostable, host: str) -> None:
    if host not in ("cpu", "cuda"):
        raise ComposerError(f"host must be 'cpu' or 'cuda', not {host!r}.")
    if host == "cuda" and not torch.cuda.is_available():
        raise ComposerError("cannot host the program on the GPU here: no CUDA GPU is visible.")
    unavailable = unavailable_runtimes(composition.buffer)
    if unavailable:
        raise ComposerError(
            "cannot run the program's delegates here: " + "; ".join(unavailable.values()) + "."
        )


def _outputs(node: torch.fx.Node) -> int:
    """How many tensors the delegate call ``node`` returns, as its value says."""
    value = node.meta.get("val")
    return len(value) if isinstance(value, list | tuple) else 1


def _hosted_delegate(
    module: torch.fx.GraphModule, composition: Hostable, node: torch.fx.Node, data, host: str
) -> tuple[str, torch.nn.Module]:
    """What runs the delegate that ``node`` calls, and the name it goes by in ``module``: the
    runtime its plugin supplies, else the ExecuTorch runtime that has its backend, else its
    subgraph in Python (``module.meta`` lists which ran where)."""
    lowered_node = node.args[0]
    lowered = getattr(module, lowered_node.target)
    # From the reference's own module: reference_on moved this one's program to the GPU, and
    # its buffer() would serialize that.
    source = getattr(composition.reference, lowered_node.target, lowered)
    single = any(user.target is not operator.getitem for user in node.users)
    supplied = plugin_runtime(lowered.backend_id)
    if supplied is not None:
        record = delegate_record(source, data, _outputs(node))
        replacement = PluginDelegate(supplied[1], record, host, single)
        module.meta["in_runtime"].append((lowered_node.target, replacement.runtime))
        return f"{lowered_node.target}_in_runtime", replacement
    try:
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
    """A composed program run piece by piece (:func:`piecewise_module`) on a CPU host,
    with the calls :class:`composer.run.runtime.LoadedProgram` offers: ``run`` and
    ``timed_call``. Its outputs come back to the CPU, so a timed call includes the GPU's
    work."""

    def __init__(self, composition: Hostable) -> None:
        self.composition = composition
        self.module = piecewise_module(composition)
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
    or, with ``hosted`` (a stack a plugin's runtime runs part of), a :class:`HostedProgram`, so that
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
