"""What the AOTInductor-driven backends (CUDA, Metal) share: support, fallback prediction, specs.

ExecuTorch's ``AotiPartitioner`` claims every node not yet lowered, and the backend's
``preprocess`` then fails the whole lowering when Inductor emits a fallback kernel the
backend's runtime has no shim for ("missing fallback kernels"). This plugin predicts those
ops before lowering from Inductor's own tables, leaves them to the next backend (or
portable kernels), and says why in the plan.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Container, Mapping

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from composer.contract.backend_spec import BackendSpec
from composer.contract.hookspecs import BackendPlugin
from composer.contract.op_names import overload_of
from composer.contract.support import ExplainedSupport


@functools.cache
def _inductor_tables():
    from torch._inductor import lowering
    from torch._inductor.decomposition import select_decomp_table

    return lowering.lowerings, lowering.fallbacks, select_decomp_table()


def becomes_fallback_kernel(op: torch._ops.OpOverload) -> bool:
    """Whether Inductor always calls out to ATen for ``op`` instead of generating code.

    Only ops whose lowering is a plain fallback count. Ops with a real lowering that falls
    back on some devices only (cumsum, sort) compile on CUDA, and ops with no lowering at
    all are decompositions or the edge dialect's view-copy variants, which compile too:
    both were checked against ExecuTorch's own CUDA lowering on an H200 (bench/RESULTS.md).
    """
    lowerings, _fallbacks, decompositions = _inductor_tables()
    if op in decompositions:
        return False
    lowering = lowerings.get(op)
    return lowering is not None and "fallback_handler" in getattr(lowering, "__qualname__", "")


@functools.cache
def _template_lowered_ops() -> dict[object, tuple[torch._ops.OpOverload, ...]]:
    """Per ATen op (packet), the ATen kernels its Inductor GEMM or conv lowering calls when
    it may not use a Triton template: the choices those lowerings declare."""
    from torch._inductor.kernel import bmm, conv, mm
    from torch._inductor.select_algorithm import ExternKernelChoice

    table: dict[object, list[torch._ops.OpOverload]] = {}
    for module in (mm, bmm, conv):
        for value in vars(module).values():
            kernel = getattr(value, "op_overload", None)
            if isinstance(value, ExternKernelChoice) and kernel is not None:
                table.setdefault(kernel.overloadpacket, []).append(kernel)
    return {packet: tuple(kernels) for packet, kernels in table.items()}


def extern_kernels_without_templates(
    op: torch._ops.OpOverload,
) -> tuple[torch._ops.OpOverload, ...]:
    """The ATen kernels Inductor calls for ``op`` (mm, bmm, addmm, convolution...) when
    max-autotune is off, so that it picks no Triton template; ``()`` for any other op."""
    return _template_lowered_ops().get(op.overloadpacket, ())


class _NoHint(Exception):
    """A size with no example value (an unbacked symbol): the node cannot be traced here."""


def _hint(size) -> int:
    # The example's value, read without a guard: int() of a symbolic size specializes it in
    # the program's ShapeEnv, and the support check made export_llama's dynamic decoder a
    # program static at its example's 3 tokens ("Attempted to resize a static tensor").
    if isinstance(size, torch.SymInt):
        hint = size.node.hint
        if hint is None:
            raise _NoHint(str(size))
        return int(hint)
    return size


def _as_meta(value):
    if isinstance(value, torch.fx.Node):
        value = value.meta.get("val")
    if isinstance(value, torch.Tensor):
        shape = [_hint(size) for size in value.shape]
        return torch.empty_strided(
            shape, [_hint(s) for s in value.stride()], dtype=value.dtype, device="meta"
        )
    if isinstance(value, list | tuple):
        return type(value)(_as_meta(item) for item in value)
    return _hint(value)


def _signature(value) -> object:
    if isinstance(value, torch.fx.Node):
        value = value.meta.get("val")
    if isinstance(value, torch.Tensor):
        # Symbolic sizes by name: a SymInt cannot be hashed ("s27" can, and says the same).
        return ("tensor", tuple(map(str, value.shape)), value.dtype)
    if isinstance(value, list | tuple):
        return tuple(_signature(item) for item in value)
    return repr(value)


_traced_cache: dict[object, frozenset[torch._ops.OpOverload] | None] = {}


def _traced_ops(node: torch.fx.Node, op, decompositions=None) -> frozenset | None:
    """The ops ``op`` becomes, traced on ``node``'s arguments as meta tensors, with
    ``decompositions`` (None: only what every trace decomposes, the composite ops); ``None``
    where it cannot be traced (data-dependent or symbolic)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    # Tracing costs milliseconds; a model repeats few (op, shapes) pairs.
    key = (op, decompositions is None, _signature(tuple(node.args)),
           _signature(tuple(node.kwargs.items())))  # fmt: skip
    if key in _traced_cache:
        return _traced_cache[key]
    try:
        args = _as_meta(tuple(node.args))
        kwargs = {name: _as_meta(value) for name, value in node.kwargs.items()}
        traced = make_fx(lambda *a: op(*a, **kwargs), decomposition_table=decompositions)(*args)
        ops = frozenset(
            n.target
            for n in traced.graph.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
        )
    except Exception:  # noqa: BLE001 - the caller judges the op itself
        ops = None
    _traced_cache[key] = ops
    return ops


def ops_inductor_sees(node: torch.fx.Node, op: torch._ops.OpOverload) -> frozenset:
    """The ops left once Inductor's decompositions have run on ``node`` (``{op}`` if none)."""
    _lowerings, _fallbacks, decompositions = _inductor_tables()
    if op not in decompositions:
        return frozenset({op})
    ops = _traced_ops(node, op, decompositions)
    return frozenset({op}) if ops is None else ops


def is_core_alias(node: torch.fx.Node) -> bool:
    """Whether ``node``'s op is a composite whose decomposition is one core ATen op (conv2d
    is convolution, layer_norm native_layer_norm): the form the edge dialect has anyway."""
    op = node.target
    if not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
        return False
    ops = _traced_ops(node, op)
    return ops is not None and len(ops) == 1 and torch.Tag.core in next(iter(ops)).tags


def fallback_kernel_names(op: torch._ops.OpOverload, device: str) -> set[str]:
    """The names under which Inductor asks a runtime for ``op``'s fallback kernel."""
    packet = op.overloadpacket.__name__
    overload = op._overloadname
    full = packet if overload == "default" else f"{packet}_{overload}"
    return {f"aoti_torch_{device}_{full}", f"at::_ops::{full}::call", str(op.name())}


class AotiOperatorSupport(ExplainedSupport):
    """Every node AOTInductor compiles for the backend; ops ending as unsupported fallbacks not.

    ``reason_unsupported`` tells the plan why a node was left out.
    """

    def __init__(self, plugin: AotiPlugin, options: Mapping[str, str]) -> None:
        self.plugin = plugin
        self.options = options

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        return self.reason_unsupported(node) is None

    def reason_unsupported(self, node: torch.fx.Node) -> str | None:
        if node.op != "call_function":
            return "not an op"
        if _reads_run_time_values(node):
            return (
                "it computes with a value read from a tensor at run time (an unbacked size, "
                "e.g. input_pos.item()): AOTInductor fails such a partition "
                "(PendingUnbackedSymbolNotFound); the host computes it"
            )
        op = overload_of(node.target)
        if op is None or op.namespace != "aten":
            return None  # control flow, ExecuTorch's own ops: AOTInductor takes them
        special = self.plugin.special_case(op, node, self.options)
        if special is not False:
            return special
        shims = self.plugin.supported_fallback_kernels()
        device = self.plugin.inductor_device
        templates = self.plugin.uses_triton_templates(self.options)
        for piece in sorted(ops_inductor_sees(node, op), key=str):
            via = "" if piece == op else f" (from {op})"
            if becomes_fallback_kernel(piece) and not fallback_kernel_names(piece, device) & shims:
                return (
                    f"AOTInductor would emit a fallback kernel for {piece}{via} that "
                    f"{self.plugin.spec.backend_id}'s runtime has no shim for"
                )
            kernels = () if templates else extern_kernels_without_templates(piece)
            if kernels and not any(fallback_kernel_names(k, device) & shims for k in kernels):
                return (
                    f"with max_autotune OFF, AOTInductor calls {piece}{via} as an ATen "
                    f"fallback kernel ({', '.join(str(k) for k in kernels)}) that "
                    f"{self.plugin.spec.backend_id}'s runtime has no shim for; leave "
                    "max_autotune ON to compile it as a Triton kernel"
                )
        return None

    def reason_unsupported_at_boundary(
        self, node: torch.fx.Node, partition: Container[torch.fx.Node]
    ) -> str | None:
        # A delegate's inputs and outputs are tensors to AOTInductor: a size handed in as an
        # int arrives as None (export_llama's dynamic decoder: "aten::arange() ... 'end' ...
        # 'NoneType'", "aten::view_copy() ... immutable_list"). Left out, the node that reads
        # it runs on the host, and the partition gets tensors whose shapes carry the size.
        if _is_scalar(node.meta.get("val")):
            return (
                "a number (a size such as sym_size), not a tensor: AOTInductor compiles a "
                "delegate's inputs and outputs as tensors"
            )
        return None


def _is_scalar(value: object) -> bool:
    return isinstance(value, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool))


def _reads_run_time_values(node: torch.fx.Node) -> bool:
    """Whether ``node`` makes or reads an unbacked symbol: a size or scalar known only when a
    tensor's value is read at run time (``_local_scalar_dense``, and what computes with it)."""
    values = [node.meta.get("val")] + [n.meta.get("val") for n in node.all_input_nodes]
    return any(value is not None and free_unbacked_symbols(value) for value in values)


class AotiPlugin(BackendPlugin):
    """A composer plugin for one AOTInductor-driven ExecuTorch backend.

    Subclasses set ``spec``, ``inductor_device`` and ``options`` (the ``Option``s the backend
    takes) and implement ``backend_class``, ``unavailable_reason`` and, where the backend
    replaces some ops itself, ``special_case``.
    """

    spec: BackendSpec
    inductor_device: str
    # The support object's class: a backend whose runtime refuses some delegate outputs
    # answers reason_unsupported_at_boundary in a subclass.
    support_class: type[AotiOperatorSupport] = AotiOperatorSupport

    # --- what differs per backend ---------------------------------------------------

    def backend_class(self) -> type:
        raise NotImplementedError

    def unavailable_reason(self) -> str | None:
        raise NotImplementedError

    def special_case(
        self, op, node: torch.fx.Node, options: Mapping[str, str]
    ) -> str | None | bool:
        """``False``: no special rule for ``op``; ``None``: supported; a string: why not."""
        return False

    def uses_triton_templates(self, options: Mapping[str, str]) -> bool:
        """Whether Inductor compiles GEMMs and convolutions from Triton templates, under
        ``options``; if not, it calls ATen for them, and the backend needs their shims."""
        return True

    def base_compile_specs(self, method_name: str, options: Mapping[str, str]) -> list:
        backend = self.backend_class()
        return [backend.generate_method_name_compile_spec(method_name)]

    # --- shared -----------------------------------------------------------------------

    def own_decompositions(self) -> frozenset:
        """The ops the backend's own preprocess decomposes (its ``get_decomposition_table``),
        so must receive whole."""
        return _own_decompositions(self.backend_class)

    def supported_fallback_kernels(self) -> frozenset[str]:
        # Not a cached_property: pluggy reads every attribute of a plugin as it registers it,
        # and this one imports ExecuTorch's backend, which a cache hit does without.
        return _fallback_kernels(self.backend_class)

    def composer_unavailable_reason(self, backend):
        return self.unavailable_reason()

    def composer_operator_support(self, backend, program, options):
        return self.support_class(self, self.checked_options(options))

    def composer_ops_to_not_decompose(self, backend, program, options):
        # Like AotiPartitioner, keep whole what AOTInductor compiles whole; unlike it, let
        # ops it would not take decompose, so their parts can still go to this backend, and
        # let aliases of one core op decompose: conv2d is convolution to Inductor either way,
        # but whole, no backend before this one in a stack could take it (XNNPACK takes
        # aten.convolution only, so [xnnpack, cuda] gave every convolution to cuda).
        # Ops of sizes (sym_size, _assert_scalar on a dynamic program) have no decomposition
        # to keep them from: listed, an undelegated one would fail ExecuTorch's check that
        # every op kept whole was delegated.
        # An alias the backend rewrites itself before compiling stays whole for it (CUDA's
        # conv1d, as a 2-D convolution: Triton's templates are 2-D); a backend ahead of this
        # one that takes its pieces still gets them (composer.scheduler.pieces).
        support = AotiOperatorSupport(self, self.checked_options(options))
        own = self.own_decompositions()
        # An op of the backend's own decompositions stays whole if it takes any of its
        # nodes: decomposed, it could take none of them (a dilated conv1d beside plain ones
        # sent every convolution of a TCN to portable kernels). A node of it that it leaves
        # is decomposed alone (composer.scheduler.kept_whole).
        keep: dict[torch._ops.OpOverload, bool] = {}
        for node in program.graph.nodes:
            if (
                node.op == "call_function"
                and isinstance(node.target, torch._ops.OpOverload)
                and _computes_tensors(node)
            ):
                takes = support.reason_unsupported(node) is None
                if node.target in own:
                    keep[node.target] = keep.get(node.target, False) or takes
                else:
                    keep[node.target] = (
                        keep.get(node.target, True) and takes and not is_core_alias(node)
                    )
        return [op for op, ok in keep.items() if ok]

    def composer_compile_specs(self, backend, method_name, options):
        from executorch.exir.backend.compile_spec_schema import CompileSpec

        checked = self.checked_options(options)
        specs = self.base_compile_specs(method_name, checked)
        specs.extend(CompileSpec(name, value.encode()) for name, value in sorted(checked.items()))
        return specs


def _computes_tensors(node: torch.fx.Node) -> bool:
    value = node.meta.get("val")
    values = value if isinstance(value, list | tuple) else [value]
    return any(isinstance(v, torch.Tensor) for v in values)


@functools.cache
def _own_decompositions(backend_class: Callable[[], type]) -> frozenset:
    try:
        return frozenset(backend_class().get_decomposition_table())
    except ImportError:  # the backend's module cannot import here
        return frozenset()


@functools.cache
def _fallback_kernels(backend_class: Callable[[], type]) -> frozenset[str]:
    try:
        return frozenset(backend_class().get_supported_fallback_kernels())
    except ImportError:  # the backend's module cannot import here; plan with no shims
        return frozenset()
