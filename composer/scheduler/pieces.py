"""Whether a backend takes the pieces an op decomposes into, asked of the op alone.

A stack keeps an op whole when any of its backends asks (XNNPACK's ``linear``): ExecuTorch
decomposes for each partitioner in turn, and pieces cut for one backend can break another's
``preprocess``. But a backend ahead of the one that asked may take the pieces and not the
whole (OpenVINO takes ``linear``'s permute and addmm, not ``linear``; ``max_pool2d``'s
``max_pool2d_with_indices``, not ``max_pool2d``). Kept whole, the op goes to the later backend
and splits the earlier one's partition around it: deit_tiny with ``openvino,xnnpack`` had 49
linears on XNNPACK and 98 delegates, 3x slower than plain ExecuTorch's single OpenVINO one.

So before keeping a node whole for a later backend, the stack asks each backend ahead of it
about a probe: the node's op alone in a program of its own, with the node's shapes, dtypes and
strides, its weights as weights, decomposed as ``to_edge`` decomposes. If a backend takes
every piece, the node is decomposed and that backend gets it, as the priority order says.
"""

from __future__ import annotations

import copy
import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable
from functools import cache

import torch
import torch.fx
from executorch.exir import EdgeCompileConfig, to_edge

# The table to_edge decomposes with (ExecuTorch 1.5.1 keeps it in its tracer module).
from executorch.exir.tracer import _default_decomposition_table
from torch.export import ExportedProgram

from composer.contract.op_names import op_name, overload_of
from composer.scheduler.support import Support

# Support of one backend on one program, as ComposerPartitioner.support gives it.
AskSupport = Callable[[ExportedProgram], Support]


@cache
def decomposable() -> frozenset[object]:
    """The ops ExecuTorch's decomposition splits: keeping any other whole changes nothing, so
    no probe is needed for it (the CUDA plugin keeps every op of the graph whole)."""
    return frozenset(_default_decomposition_table())


class PieceProbes:
    """Answers of one backend about probes, one per distinct op and tensor signature."""

    def __init__(self, ask: AskSupport, keep_whole: frozenset[object] = frozenset()) -> None:
        self._ask = ask
        # Ops the backend itself keeps whole stay whole in its probe, as in its own pass.
        self._keep_whole = keep_whole
        # signature -> the op names of the pieces, where the backend takes them all
        self._answers: dict[Hashable, frozenset[str] | None] = {}

    def prefers_pieces(
        self,
        node: torch.fx.Node,
        program: ExportedProgram,
        pinned: Callable[[str], bool] = lambda op: False,
    ) -> bool:
        """Whether the backend declines ``node``'s op whole but takes every op it decomposes
        into, none of them ``pinned`` off it (by op name: ``aten.addmm.default``). False when
        unsure: the op then stays whole, as before the probes."""
        probe = _Probe.of(node, program)
        if probe is None:
            return False
        if probe.signature not in self._answers:
            self._answers[probe.signature] = self._ask_about(probe)
        pieces = self._answers[probe.signature]
        # A repair pins the pieces off the backend (resnet18 with openvino,xnnpack: OpenVINO's
        # max_pool2d_with_indices), and decomposed for it, nobody took them.
        return pieces is not None and not any(pinned(op) for op in pieces)

    def _ask_about(self, probe: _Probe) -> frozenset[str] | None:
        try:
            whole, pieces = _EDGE_PROGRAMS.of(probe, self._keep_whole)
        except Exception:  # noqa: BLE001
            # A probe that does not export or decompose proves nothing.
            return None
        # A backend that takes the op whole keeps it so (Vulkan's linear, Core ML's
        # max_pool2d): its own kernel for the op is no worse than the pieces'.
        kept_whole = any(overload_of(node.target) == probe.module.target for node in _ops_of(whole))
        if kept_whole and self._takes_every_op(whole):
            return None
        if not self._takes_every_op(pieces):
            return None
        return frozenset(op_name(node) for node in _ops_of(pieces))

    def _takes_every_op(self, program: ExportedProgram) -> bool:
        ops = _ops_of(program)
        if not ops:
            return False
        support = self._ask(program)  # once: it may run the backend's own partitioner
        return all(support.takes(node) for node in ops)


class _EdgePrograms:
    """The probes' edge programs, kept for the process: they depend on the op and its
    signature only, not on the backend asked, and exporting and decomposing twice costs
    0.6 s a probe (1.3 s of a 5 s compose of cumsum_mlp with openvino,xnnpack, paid again by
    every backend and every candidate measured placement composes)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._kept: OrderedDict[Hashable, tuple[ExportedProgram, ExportedProgram]] = OrderedDict()

    def of(
        self, probe: _Probe, keep_whole: frozenset[object]
    ) -> tuple[ExportedProgram, ExportedProgram]:
        key = (probe.signature, keep_whole)
        if key not in self._kept:
            self._kept[key] = probe.edge_programs(keep_whole)
            if len(self._kept) > self._size:
                self._kept.popitem(last=False)
        self._kept.move_to_end(key)
        # A backend's partitioner, asked for its support, tags the nodes it takes.
        return copy.deepcopy(self._kept[key])


_EDGE_PROGRAMS = _EdgePrograms(size=256)


def _ops_of(program: ExportedProgram) -> list[torch.fx.Node]:
    return [
        node
        for node in program.graph_module.graph.nodes
        if node.op == "call_function" and op_name(node) != "getitem"
    ]


# An argument the probe cannot reproduce: a symbolic shape, a value that is not a tensor.
_UNPLACEABLE = object()


class _Weight:
    """Where a weight goes in the probe's arguments."""

    def __init__(self, index: int) -> None:
        self.index = index


class _Input:
    """Where an input goes in the probe's arguments."""

    def __init__(self, index: int) -> None:
        self.index = index


class _OneOp(torch.nn.Module):
    def __init__(self, target, args, kwargs, weights: list[torch.Tensor]) -> None:
        super().__init__()
        self.target = target
        self.template = (args, kwargs)
        self.weights = torch.nn.ParameterList(
            torch.nn.Parameter(weight, requires_grad=False) for weight in weights
        )

    def forward(self, *inputs):
        def fill(arg):
            if isinstance(arg, _Input):
                return inputs[arg.index]
            if isinstance(arg, _Weight):
                return self.weights[arg.index]
            if isinstance(arg, list | tuple):
                return type(arg)(fill(a) for a in arg)
            return arg

        args, kwargs = self.template
        return self.target(*fill(args), **{k: fill(v) for k, v in kwargs.items()})


class _Probe:
    """One node's op alone, with example tensors shaped as the node's arguments."""

    def __init__(self, module: _OneOp, inputs: tuple, signature: Hashable) -> None:
        self.module = module
        self.inputs = inputs
        self.signature = signature

    @classmethod
    def of(cls, node: torch.fx.Node, program: ExportedProgram) -> _Probe | None:
        """The probe of ``node``, or None where its arguments are not plain, static tensors."""
        signature = program.graph_signature
        weights_by_name = {
            *signature.inputs_to_parameters,
            *signature.inputs_to_buffers,
            *signature.inputs_to_lifted_tensor_constants,
        }
        inputs: list[torch.Tensor] = []
        weights: list[torch.Tensor] = []
        keys: list[Hashable] = []

        def place(arg):
            if isinstance(arg, list | tuple):
                placed = [place(a) for a in arg]
                return _UNPLACEABLE if _UNPLACEABLE in placed else type(arg)(placed)
            if not isinstance(arg, torch.fx.Node):
                keys.append(("value", repr(arg)))
                return arg
            value = arg.meta.get("val")
            if not isinstance(value, torch.Tensor) or not all(
                isinstance(size, int) for size in (*value.shape, *value.stride())
            ):
                return _UNPLACEABLE
            example = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype)
            example.zero_()
            is_weight = arg.op == "get_attr" or (
                arg.op == "placeholder" and arg.name in weights_by_name
            )
            # By rank, not shape: one probe answers for an op at every size (mobilenet_v3's
            # hardswish at each channel count cost a probe each), and supports decide by op,
            # dtype and rank; a wrong answer costs a delegate boundary, not correctness.
            keys.append(("weight" if is_weight else "input", value.dim(), value.dtype))
            if is_weight:
                weights.append(example)
                return _Weight(len(weights) - 1)
            inputs.append(example)
            return _Input(len(inputs) - 1)

        args = place(list(node.args))
        kwargs = {key: place(value) for key, value in node.kwargs.items()}
        if args is _UNPLACEABLE or _UNPLACEABLE in kwargs.values():
            return None
        return cls(
            _OneOp(node.target, args, kwargs, weights),
            tuple(inputs),
            (node.target, tuple(keys)),
        )

    def edge_programs(
        self, keep_whole: frozenset[object]
    ) -> tuple[ExportedProgram, ExportedProgram]:
        """The probe as ``to_edge`` makes it with its op kept whole, and decomposed."""
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            exported = torch.export.export(self.module, self.inputs, strict=False)
            kept = [op for op in keep_whole if isinstance(op, torch._ops.OpOverload)]
            whole, pieces = (
                to_edge(
                    exported,
                    compile_config=EdgeCompileConfig(_check_ir_validity=False, preserve_ops=ops),
                ).exported_program()
                for ops in ([*kept, self.module.target], kept)
            )
        return whole, pieces
