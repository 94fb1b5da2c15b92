"""The ``cuda`` backend: ExecuTorch's CUDA backend (AOTInductor) on an NVIDIA GPU.

Options (``compose(..., options={"cuda": {...}})`` or ``--option cuda.NAME=VALUE``):
``triton_kernel_mode`` (ON/OFF: ExecuTorch's Triton replacements, e.g. its bf16 SDPA),
``max_autotune`` (ON/OFF; OFF leaves matmuls and convolutions to the next backend, as
Inductor then calls ATen kernels for them that ExecuTorch's CUDA runtime lacks),
``low_memory_mode`` (ON/OFF), ``target_device`` (``cuda:0``).
"""

from __future__ import annotations

import importlib.util
import operator
from collections.abc import Container
from typing import Any

import torch
import torch.fx

from composer.contract.backend_spec import BackendSpec
from composer.contract.op_names import overload_of
from composer.contract.options import Option
from composer.plugins.aoti import AotiOperatorSupport, AotiPlugin
from composer.plugins.cuda.dilation import is_dilated
from composer.plugins.cuda.runtime import CudaRuntime

ON_OFF = ("ON", "OFF")
# The ops triton_kernel_mode=ON hands to ExecuTorch's Triton kernels (ExecuTorch 1.5.1's
# backends/cuda/triton/replacement_pass.py, EDGE_TO_TRITON_KERNELS): OFF changes no other.
TRITON_REPLACED = ("aten.scaled_dot_product_attention.default", "aten.topk.default")


# The views ExecuTorch's AOTInductor lowering hands Inductor as views
# (executorch.backends.aoti.passes.replace_view_copy_with_view: select, slice, split). (A
# split_with_sizes or unbind piece too: zoo gru's gate splits left a CUDA delegate at a
# storage offset on the H100.)
_VIEWS = frozenset({"select_copy", "slice_copy", "narrow_copy", "split_copy",
                    "split_with_sizes_copy", "unbind_copy"})  # fmt: skip
# The other edge view copies decompose into the view and a contiguous clone (torch._refs'
# _make_copy_from_view), and Inductor's remove_noop_ops drops a clone whose sizes and strides
# are its input's, whatever the storage offset: a copy of a view already contiguous is that
# view. deit_tiny's v, a `squeeze_copy` of qkv's third `slice_copy`, left a CUDA delegate at
# storage offset 6528 on an H200. A clone that changes strides (of a permute) is a copy.
_CLONED_VIEWS = frozenset({"view_copy", "squeeze_copy", "unsqueeze_copy", "permute_copy",
                           "transpose_copy", "t_copy", "expand_copy", "alias_copy",
                           "detach_copy", "diagonal_copy", "unfold_copy"})  # fmt: skip
# Of those, the ones that keep the layout of what they view (where sizes are symbolic, such a
# copy is taken to be the view; the others, to be a copy).
_LAYOUT_KEEPING = frozenset({"view_copy", "squeeze_copy", "unsqueeze_copy", "alias_copy",
                             "detach_copy", "expand_copy"})  # fmt: skip
# Where they start (a split or unbind starts past its tensor's start from its second piece on).
_START_ARGUMENT = {"select_copy": (2, "index"), "slice_copy": (2, "start"),
                   "narrow_copy": (2, "start")}  # fmt: skip
PAST_START = (
    "a view that starts past its tensor's first element (a split's second piece, a select or "
    "slice not from 0...): ExecuTorch's CUDA runtime copies out only outputs at storage offset 0"
)
NOT_CONTIGUOUS = (
    "a view whose elements are not contiguous (a select or slice of an inner dimension...): "
    "ExecuTorch's CUDA runtime copies out only contiguous outputs"
)


class CudaOperatorSupport(AotiOperatorSupport):
    """AOTInductor's support, and the outputs ExecuTorch's CUDA runtime cannot hand back."""

    def reason_unsupported_at_boundary(
        self, node: torch.fx.Node, partition: Container[torch.fx.Node]
    ) -> str | None:
        # AOTInductor returns a view as a view, and the runtime's copy of a delegate output
        # refuses one at a storage offset ("SlimTensor storage_offset must be 0": a split's
        # second half, zoo gru with xnnpack,cuda on the H100) or not contiguous ("SlimTensor
        # must be contiguous": the selective scan's x[:, :, i], corpus mamba on an H200).
        # Left out, the view runs on the host, where it is a copy.
        if node in partition:
            why = _view_layout(node, partition)
            if why is not None:
                return why
        return super().reason_unsupported_at_boundary(node, partition)


def _view_layout(node: torch.fx.Node, partition: Container[torch.fx.Node]) -> str | None:
    """Why ``node``, through views in ``partition`` of a tensor made there or handed in,
    cannot leave a CUDA delegate: replayed on a contiguous tensor of its base's size as
    Inductor compiles it, it starts past the first element or is not contiguous. ``None``
    where it can."""
    steps: list[tuple[Any, torch.fx.Node]] = []  # (view op or None for a piece, node)
    while node in partition and node.op == "call_function":
        if node.target is operator.getitem:
            steps.append((None, node))
        else:
            op = overload_of(node.target)
            if op is None or op.overloadpacket.__name__ not in _VIEWS | _CLONED_VIEWS:
                break
            steps.append((op, node))
        node = node.args[0]
    if not any(op is not None for op, _ in steps):
        return None
    base = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(base, torch.Tensor) or not all(isinstance(n, int) for n in base.shape):
        return _by_name(steps)  # symbolic sizes: no layout to replay
    try:
        view = torch.empty(tuple(base.shape), dtype=base.dtype, device="meta")
        for op, step in reversed(steps):
            if op is None:
                view = view[step.args[1]]
                continue
            name = op.overloadpacket.__name__
            viewing = getattr(torch.ops.aten, name.removesuffix("_copy"))
            view = getattr(viewing, op._overloadname)(view, *step.args[1:], **step.kwargs)
            if name in _CLONED_VIEWS:  # and its clone, unless a no-op
                copied = torch.empty(tuple(view.shape), dtype=view.dtype, device="meta")
                if copied.stride() != view.stride():
                    view = copied
    except Exception:  # noqa: BLE001 - arguments the view twin refuses: judged by name
        return _by_name(steps)
    if view.storage_offset() != 0:
        return PAST_START
    if not view.is_contiguous():
        return NOT_CONTIGUOUS
    return None


def _by_name(steps: list[tuple[Any, torch.fx.Node]]) -> str | None:
    """:func:`_view_layout`'s answer where the views cannot be replayed (symbolic sizes): from
    their arguments alone, a view that may start past its tensor's start, or that selects or
    slices an inner dimension, is refused."""
    piece = 0
    for op, node in steps:
        if op is None:
            piece = node.args[1]
            continue
        name = op.overloadpacket.__name__
        if name in _LAYOUT_KEEPING:
            continue  # the view itself: it starts where its input does, as contiguous
        if name in _CLONED_VIEWS:
            return None  # a permute...: copied, contiguous from the start
        if name in _START_ARGUMENT:
            position, keyword = _START_ARGUMENT[name]
            start = node.args[position] if len(node.args) > position else node.kwargs.get(keyword)
            if not (start is None or start == 0):  # None: the default, 0; a SymInt: maybe not
                return PAST_START
        elif piece != 0:
            return PAST_START
        at = 2 if name in ("split_copy", "split_with_sizes_copy") else 1  # (self, sizes, dim)
        dim = node.args[at] if len(node.args) > at else node.kwargs.get("dim", 0)
        if dim != 0:
            return NOT_CONTIGUOUS
        piece = 0
    return None


class CudaPlugin(AotiPlugin):
    spec = BackendSpec(
        name="cuda",
        backend_id="CudaBackend",
        device="cuda",
        min_partition_size=1,
        description="CUDA: NVIDIA GPUs, compiled by AOTInductor",
        # AotiPartitioner tags mutated buffers into its delegate (tag_mutated_buffer): an
        # LLM's KV caches stay on the device, not copied in and out every token.
        keeps_state=True,
        # ExecuTorch's Triton kernels (its bf16 SDPA) are where a CUDA program that runs can be
        # wrong (a 4-layer bf16 encoder: 58x eager's error at length 3): off, SDPA is left to
        # the next backend and the rest stays on the GPU.
        safer_options={"triton_kernel_mode": "OFF"},
        safer_for=TRITON_REPLACED,
        # AOTInductor compiles delegate inputs as tensors: a size handed in arrives as None.
        sizes_from_shapes=True,
        # Inductor compiles a graph of constants alone for the CPU (BackendSpec's doc).
        needs_a_runtime_input=True,
    )
    inductor_device = "cuda"
    support_class = CudaOperatorSupport
    options = (
        Option("triton_kernel_mode", ON_OFF, help="ExecuTorch's Triton kernels (bf16 SDPA...)"),
        Option("max_autotune", ON_OFF, help="Inductor max-autotune"),
        Option("low_memory_mode", ON_OFF, help="compile with weights kept off the GPU"),
        Option("target_device", default="cuda:0", help="the CUDA device the delegate runs on"),
    )

    def backend_class(self) -> type:
        from executorch.backends.cuda.cuda_backend import CudaBackend

        return CudaBackend

    def unavailable_reason(self) -> str | None:
        if torch.version.cuda is None:
            return f"torch {torch.__version__} is not a CUDA build"
        if not torch.cuda.is_available():
            return "no CUDA device is visible"
        if importlib.util.find_spec("triton") is None:
            return "triton is not importable"
        return None

    def composer_runtime(self, backend: BackendSpec) -> CudaRuntime:
        return _RUNTIME

    def composer_rewrites(self, backend: BackendSpec, options):
        # A dilated convolution, which the Triton templates refuse, as undilated ones they take
        # (with the templates off, Inductor's ATen convolution takes the dilation itself).
        if not self.uses_triton_templates(options):
            return None
        # executorch.exir takes seconds to import; listing the plugins needs none of it.
        from composer.plugins.cuda.undilated import UndilatedConvolutions

        return [UndilatedConvolutions()]

    def uses_triton_templates(self, options):
        # CudaBackend compiles with max_autotune_gemm_backends = conv_backends = "TRITON";
        # Inductor reads those only under max_autotune, and without it emits extern ATen
        # calls (aoti_torch_cuda_mm_out, bmm_out...) that CudaBackend has no shims for.
        return options.get("max_autotune", "ON").upper() != "OFF"

    def special_case(self, op, node, options):
        if op is torch.ops.aten.scaled_dot_product_attention.default:
            # With Triton kernels on, ExecuTorch swaps in its own SDPA, which only takes
            # bf16 4-D q, k, v; otherwise Inductor calls flash attention, which has no shim.
            if options.get("triton_kernel_mode", "ON") == "OFF":
                return "SDPA without triton_kernel_mode becomes a flash-attention fallback kernel"
            qkv = [arg.meta.get("val") for arg in node.args[:3] if hasattr(arg, "meta")]
            if all(t is not None and t.dtype == torch.bfloat16 and t.dim() == 4 for t in qkv):
                return None
            return "ExecuTorch's CUDA SDPA kernel takes only bfloat16 4-D q, k, v"
        if _is_transposed_convolution(op, node):
            # Inductor has no Triton template for them, and CudaBackend allows Triton conv
            # templates only: "NoValidChoicesError: No choices to select" (zoo unet, H100).
            return "AOTInductor has no Triton template for a transposed convolution"
        if _is_dilated_convolution(op, node) and self.uses_triton_templates(options):
            # The same error (a bf16 TCN, H100): Inductor offers its Triton conv templates
            # only for a dilation of 1, so a dilated convolution left the whole partition to
            # portable kernels; declined, only it does.
            return "AOTInductor's Triton convolution templates take no dilation"
        if _is_1d_convolution(op, node) and self.uses_triton_templates(options):
            # The same error for a 1-D one (optimum's Whisper encoder, H200). CudaBackend
            # rewrites aten.conv1d as a 2-D convolution of height 1 before compiling; composer
            # keeps conv1d whole for it (own_decompositions), so only a 1-D convolution that
            # reached the edge dialect as one gets here.
            return (
                "AOTInductor's Triton convolution templates are 2-D; ExecuTorch's CUDA backend "
                "compiles a 1-D convolution only as aten.conv1d, which it rewrites as a 2-D one"
            )
        return False


def _is_1d_convolution(op, node) -> bool:
    if op is not torch.ops.aten.convolution.default:
        return False
    value = getattr(node.args[0], "meta", {}).get("val")
    return isinstance(value, torch.Tensor) and value.dim() == 3


# Convolutions whose dilation is their sixth argument.
_DILATED_AT_5 = frozenset({
    torch.ops.aten.convolution.default, torch.ops.aten.conv1d.default,
    torch.ops.aten.conv2d.default, torch.ops.aten.conv3d.default,
})  # fmt: skip


def _is_dilated_convolution(op, node) -> bool:
    if op not in _DILATED_AT_5:
        return False
    return is_dilated(node)


def _is_transposed_convolution(op, node) -> bool:
    aten = torch.ops.aten
    if op in (aten.conv_transpose1d.default, aten.conv_transpose2d.input,
              aten.conv_transpose3d.input):  # fmt: skip
        return True
    return op is aten.convolution.default and len(node.args) > 6 and node.args[6] is True


_RUNTIME = CudaRuntime()
plugin = CudaPlugin()
