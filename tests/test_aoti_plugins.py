"""The cuda and metal plugins on a machine that cannot lower them: plan with stand-ins."""

from __future__ import annotations

import pytest
import torch
from deit_parts import ClassToken, SqueezedSlices
from torch import nn

import composer
from composer.contract.errors import BackendListError, ComposerError
from composer.models import zoo
from composer.plugins.aoti import becomes_fallback_kernel
from composer.plugins.cuda import PAST_START
from composer.plugins.cuda import plugin as cuda_plugin
from composer.registry.discovery import default_registry
from composer.report.html import render_html
from composer.report.plan_text import summary_table

needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour")


def test_both_register_with_their_devices():
    backends = default_registry().backends
    assert (backends["cuda"].spec.backend_id, backends["cuda"].spec.device) == (
        "CudaBackend",
        "cuda",
    )
    assert (backends["metal"].spec.backend_id, backends["metal"].spec.device) == (
        "MetalBackend",
        "mps",
    )


@needs_no_gpu
def test_unavailable_reasons_say_why():
    registry = default_registry()
    assert "CUDA" in registry.unavailable_reason(registry.backends["cuda"])
    assert "macOS" in registry.unavailable_reason(registry.backends["metal"])


@needs_no_gpu
def test_compose_refuses_a_backend_that_cannot_lower_here_and_plan_works():
    model, inputs = zoo.load("mlp")
    with pytest.raises(BackendListError, match=r"'cuda' cannot lower on this machine.*plan"):
        composer.compose(model, ["cuda"], inputs)
    plan = composer.plan(model, ["cuda"], inputs)
    assert plan.stand_ins == ("cuda",)
    assert len(plan.partitions_of("cuda")) == 1
    assert plan.nodes_on("portable") == []
    assert plan.crossings == 2  # input to the GPU, result back


class BagOfEmbeddings(nn.Module):
    """nn.EmbeddingBag between two linears: Inductor has only a fallback kernel for it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.bag = nn.EmbeddingBag(32, 8, mode="sum")
        self.fc2 = nn.Linear(8, 8)

    def forward(self, x, ids):
        return self.fc2(torch.relu(self.fc1(x)) + self.bag(ids))


@pytest.mark.parametrize("backend", ["cuda", "metal"])
def test_predicted_fallback_kernel_is_left_to_portable_with_the_reason(backend):
    inputs = (torch.randn(4, 8), torch.randint(0, 32, (4, 3)))
    plan = composer.plan(BagOfEmbeddings(), [backend], inputs)
    (fallback,) = plan.fallbacks
    assert fallback.op == "aten._embedding_bag.default"
    assert "fallback kernel for aten._embedding_bag.default" in dict(fallback.reasons)[backend]
    assert plan.ops_on(backend)["aten.linear.default"] == 2


def test_fallback_prediction_follows_inductor_tables():
    aten = torch.ops.aten
    assert becomes_fallback_kernel(aten._embedding_bag.default)
    assert becomes_fallback_kernel(aten.nonzero.default)
    # Measured on an H200: ExecuTorch's CUDA lowering compiles these.
    assert not becomes_fallback_kernel(aten.cumsum.default)
    assert not becomes_fallback_kernel(aten.sort.stable)
    assert not becomes_fallback_kernel(aten.slice_copy.Tensor)
    assert not becomes_fallback_kernel(aten.relu.default)
    assert not becomes_fallback_kernel(aten.linear.default)  # decomposed first


class Attention(nn.Module):
    def forward(self, q, k, v):
        return nn.functional.scaled_dot_product_attention(q, k, v)


@pytest.mark.parametrize(
    ("dtype", "options", "kept_whole"),
    [
        (torch.bfloat16, {}, True),
        (torch.float32, {}, False),
        (torch.bfloat16, {"triton_kernel_mode": "OFF"}, False),
    ],
)
def test_sdpa_is_kept_whole_only_where_executorch_cuda_can_run_it(dtype, options, kept_whole):
    qkv = tuple(torch.randn(1, 2, 8, 16, dtype=dtype) for _ in range(3))
    plan = composer.plan(Attention(), ["cuda"], qkv, options={"cuda": options})
    ops = plan.ops_on("cuda")
    assert ("aten.scaled_dot_product_attention.default" in ops) == kept_whole
    assert plan.nodes_on("portable") == [], "decomposed SDPA still goes to the GPU"


@pytest.mark.parametrize(
    "stack", [["cuda"], ["tensorrt_stub", "cuda"], ["xnnpack", "cuda"], ["metal"]], ids=",".join
)
@pytest.mark.parametrize("model_name", ["mlp", "cnn", "transformer_block"])
def test_stacks_plan_with_stand_ins(model_name, stack):
    model, inputs = zoo.load(model_name)
    plan = composer.plan(model, stack, inputs)
    gpu = stack[-1]
    taken = {b for b in plan.node_backends.values()}
    assert taken <= {*stack, "portable"}
    if len(stack) == 1:  # stacked, the CPU backend or the stub takes all of some models
        assert plan.partitions_of(gpu)
    for partition in plan.partitions_of(gpu):
        assert partition.device == ("mps" if gpu == "metal" else "cuda")


def test_compile_specs_carry_the_method_name_and_user_options():
    from executorch.backends.aoti.aoti_backend import COMPILE_SPEC_KEYS

    specs = cuda_plugin.composer_compile_specs(
        None, "forward", {"max_autotune": "off", "low_memory_mode": "ON"}
    )
    values = {spec.key: bytes(spec.value).decode() for spec in specs}
    assert values[COMPILE_SPEC_KEYS.METHOD_NAME.value] == "forward"
    assert values["max_autotune"] == "OFF"
    assert values["low_memory_mode"] == "ON"
    assert values["target_device"] == "cuda:0"


def test_unknown_option_is_an_error_listing_the_known_ones():
    model, inputs = zoo.load("mlp")
    with pytest.raises(ComposerError, match=r"unknown option 'autotune' .*max_autotune"):
        composer.plan(model, ["cuda"], inputs, options={"cuda": {"autotune": "ON"}})
    with pytest.raises(ComposerError, match=r"must be one of ON, OFF"):
        composer.plan(model, ["cuda"], inputs, options={"cuda": {"max_autotune": "maybe"}})
    with pytest.raises(ComposerError, match=r"options given for metal"):
        composer.plan(model, ["cuda"], inputs, options={"metal": {}})


@pytest.mark.parametrize(
    ("options", "matmuls_on_cuda"), [({}, True), ({"max_autotune": "OFF"}, False)]
)
def test_matmuls_go_to_cuda_only_when_max_autotune_lets_inductor_use_triton(
    options, matmuls_on_cuda
):
    # CudaBackend tunes GEMMs with Triton only; with max_autotune OFF Inductor calls ATen's
    # mm/bmm/addmm instead, and lowering failed: "missing fallback kernels
    # aoti_torch_cuda_mm_out, bmm_out".
    model, inputs = zoo.load("transformer_block")
    plan = composer.plan(model, ["cuda"], inputs, options={"cuda": options})
    matmuls = {"aten.linear.default", "aten.addmm.default", "aten.mm.default", "aten.bmm.default"}
    on_cuda = set(plan.ops_on("cuda")) & matmuls
    on_portable = set(plan.ops_on("portable"))
    if matmuls_on_cuda:
        assert on_cuda == {"aten.linear.default", "aten.bmm.default"}
        assert on_portable == set()
    else:
        assert on_cuda == set()
        # The split of q, k and v would leave a CUDA delegate as a view past its start.
        assert on_portable == {"aten.addmm.default", "aten.bmm.default", "aten.split_copy.Tensor"}
        reasons = {dict(f.reasons)["cuda"] for f in plan.fallbacks if "split" not in f.node}
        assert all("with max_autotune OFF" in reason for reason in reasons)
        assert "aten.bmm.out" in " ".join(reasons)
    # The rest of the block still goes to the GPU either way.
    assert plan.ops_on("cuda")["aten._softmax.default"] == 1


def test_a_backend_listed_before_cuda_takes_the_convolutions_it_takes_alone():
    """cuda kept conv2d whole (AotiPartitioner keeps every op whole), and XNNPACK takes only
    aten.convolution: listed first, it took no convolution and cuda took them all. conv2d
    is convolution to Inductor either way, so cuda lets it decompose."""
    model, inputs = zoo.load("cnn")
    first = composer.plan(model, ["xnnpack", "cuda"], inputs, cache=False)
    assert first.ops_on("xnnpack")["aten.convolution.default"] == 2
    assert first.delegate_calls == 1 and not first.partitions_of("cuda")
    alone = composer.plan(model, ["cuda"], inputs, cache=False)
    assert alone.ops_on("cuda")["aten.convolution.default"] == 2
    assert not alone.nodes_on("portable")


def test_transposed_convolutions_go_to_the_next_backend():
    """CudaBackend lets Inductor choose Triton conv templates only, and there is none for a
    transposed convolution: cuda alone failed to lower the zoo's unet on the H100 with
    "NoValidChoicesError: No choices to select"."""
    model, inputs = zoo.load("unet")
    plan = composer.plan(model, ["cuda", "xnnpack"], inputs, cache=False)
    assert plan.ops_on("xnnpack") == {"aten.convolution.default": 2}
    alone = composer.plan(model, ["cuda"], inputs, cache=False)
    reasons = [dict(f.reasons)["cuda"] for f in alone.fallbacks]
    assert reasons == ["AOTInductor has no Triton template for a transposed convolution"] * 2


class _Conv1dThenLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(8, 16, 3, padding=1)
        self.linear = nn.Linear(16, 4)

    def forward(self, x):
        return self.linear(nn.functional.gelu(self.conv(x)).transpose(1, 2))


def test_cuda_gets_a_conv1d_whole_for_its_backend_to_rewrite_as_2d():
    """Decomposed, conv1d reached AOTInductor as a 1-D convolution, for which its Triton
    templates have nothing: optimum's Whisper encoder failed to lower ("NoValidChoicesError"),
    and 117 of its nodes went to portable kernels. CudaBackend rewrites aten.conv1d as a 2-D
    convolution itself; an XNNPACK listed first still takes the convolution."""
    model, inputs = _Conv1dThenLinear().eval(), (torch.randn(1, 8, 20),)
    alone = composer.plan(model, ["cuda"], inputs, cache=False)
    assert alone.ops_on("cuda")["aten.conv1d.default"] == 1
    assert not alone.nodes_on("portable")
    first = composer.plan(model, ["xnnpack", "cuda"], inputs, cache=False)
    assert first.ops_on("xnnpack")["aten.convolution.default"] == 1


def test_a_1d_convolution_that_reached_the_edge_dialect_stays_off_cuda():
    exported = torch.export.export(_Conv1dThenLinear().eval(), (torch.randn(1, 8, 20),))
    exported = exported.run_decompositions()  # conv1d is aten.convolution from here on
    plan = composer.plan(exported, ["cuda"], cache=False)
    reasons = [dict(f.reasons)["cuda"] for f in plan.fallbacks]
    why = (
        "AOTInductor's Triton convolution templates are 2-D; ExecuTorch's CUDA backend compiles "
        "a 1-D convolution only as aten.conv1d, which it rewrites as a 2-D one"
    )
    assert reasons == [why]


def test_the_cuda_support_check_leaves_a_dynamic_programs_sizes_symbolic():
    """Tracing an op on meta tensors to see what Inductor makes of it read each symbolic size
    with int(), which specializes it in the program's ShapeEnv: export_llama's dynamic decoder
    became a program static at its example's 3 tokens, which the proof refused at 1 token."""
    model, inputs = zoo.load("transformer_block")
    seq = torch.export.Dim("seq", min=2, max=16)
    program = torch.export.export(model, inputs, dynamic_shapes=({1: seq},))
    support = cuda_plugin.composer_operator_support(None, program, {})
    for node in program.graph.nodes:
        if node.op == "call_function":
            support.reason_unsupported(node)
    cuda_plugin.composer_ops_to_not_decompose(None, program, {})
    first = next(n for n in program.graph.nodes if n.op == "placeholder" and "val" in n.meta
                 and n.meta["val"].dim() == 3)  # fmt: skip
    assert isinstance(first.meta["val"].shape[1], torch.SymInt)
    plan = composer.plan(program, ["cuda"])
    assert plan.dynamic_dims and plan.dynamic_dims[0]["dim"] == 1


class _ReadsPosition(nn.Module):
    """A table read at a position given as a tensor, as export_llama's decoder reads its RoPE
    tables and mask at ``input_pos.item()``."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.randn(16, 8))

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        start = pos.item()
        torch._check(start >= 0)
        torch._check(start + x.shape[0] <= 16)
        return torch.relu(x) + self.table.narrow(0, start, x.shape[0])


def test_what_computes_with_a_value_read_at_run_time_stays_off_cuda():
    # AOTInductor failed export_llama's dynamic decoder's CUDA partition with
    # PendingUnbackedSymbolNotFound: it held input_pos.item() and the slices made with it.
    program = torch.export.export(_ReadsPosition(), (torch.randn(4, 8), torch.tensor([2])))
    plan = composer.plan(program, ["cuda"], cache=False)
    on_cuda = plan.ops_on("cuda")
    assert on_cuda["aten.relu.default"] == 1 and on_cuda["aten.add.Tensor"] == 1
    portable = plan.ops_on("portable")
    assert portable["aten._local_scalar_dense.default"] == 1
    assert portable["aten.slice_copy.Tensor"] == 1
    reasons = {f.op: dict(f.reasons)["cuda"] for f in plan.fallbacks}
    assert reasons["aten._local_scalar_dense.default"].startswith(
        "it computes with a value read from a tensor at run time (an unbacked size"
    )


def test_a_view_past_its_tensors_start_never_leaves_a_cuda_delegate():
    """ExecuTorch's CUDA runtime copies out only delegate outputs at storage offset 0: the
    zoo's gru with xnnpack,cuda was refused on the H100 ("SlimTensor storage_offset must be 0,
    got 80"), its CUDA delegates being the GRU's gate splits. The splits now run on the host."""
    model, inputs = zoo.load("gru")
    plan = composer.plan(model, ["xnnpack", "cuda"], inputs, cache=False)
    cuda_nodes = {name for p in plan.partitions if p.backend == "cuda" for name in p.nodes}
    assert not [name for name in cuda_nodes if "split" in name or "select" in name]
    portable = plan.ops_on("portable")
    assert portable == {"aten.split_with_sizes_copy.default": 12, "aten.select_copy.int": 1}
    reasons = {dict(f.reasons)["cuda"] for f in plan.fallbacks}
    why = (
        "left out of its partition: its output would leave the delegate as a view that starts "
        "past its tensor's first element (a split's second piece, a select or slice not from "
        "0...): ExecuTorch's CUDA runtime copies out only outputs at storage offset 0"
    )
    assert reasons == {why}
    # A view of a whole tensor (the squeezes) stays: it starts where its tensor does.
    assert plan.ops_on("cuda")["aten.squeeze_copy.dims"] == 7


class _InnerViews(torch.nn.Module):
    def forward(self, x):
        y = torch.relu(x)
        return y.transpose(1, 2), y[:, :, 0], y[:, 0], y.unsqueeze(0), y[:, 1]


def test_a_view_that_is_not_contiguous_never_leaves_a_cuda_delegate():
    """ExecuTorch's CUDA runtime copies out only contiguous delegate outputs: corpus mamba
    with xnnpack,cuda failed on an H200 ("SlimTensor must be contiguous"), its CUDA delegates
    handing out the selective scan's x[:, :, i]. ExecuTorch's lowering makes selects, slices
    and splits views for Inductor; each is replayed on its tensor's size."""
    plan = composer.plan(_InnerViews(), ["cuda"], (torch.randn(1, 3, 4),), cache=False)
    # y[:, 0] of a (1, 3, 4) tensor is 4 elements in a row at offset 0; y.unsqueeze(0) is y
    # itself, contiguous at 0, and a transpose is copied (its clone changes the strides)
    assert plan.ops_on("cuda") == {
        "aten.relu.default": 1, "aten.select_copy.int": 1, "aten.unsqueeze_copy.default": 1,
        "aten.transpose_copy.int": 1,
    }  # fmt: skip
    assert plan.ops_on("portable") == {"aten.select_copy.int": 2}
    reasons = sorted(dict(f.reasons)["cuda"].removeprefix("left out of its partition: its output "
                     "would leave the delegate as ")[:40] for f in plan.fallbacks)  # fmt: skip
    assert reasons == [
        "a view that starts past its tensor's fir",  # y[:, 1]
        "a view whose elements are not contiguous",  # y[:, :, 0]
    ]


def test_a_copy_of_a_view_that_inductor_keeps_a_view_never_leaves_a_cuda_delegate():
    """corpus deit_tiny with xnnpack,cuda on an H200: attention's v, a squeeze_copy of qkv's
    third slice, left a CUDA delegate at storage offset 6528 ("SlimTensor storage_offset must
    be 0, got 6528"). A squeeze_copy is a squeeze and a contiguous clone for Inductor, which
    drops the clone as a no-op where the strides already are contiguous; a permute's clone
    changes the strides and stays a copy."""
    plan = composer.plan(SqueezedSlices(), ["cuda"], (torch.randn(3, 2, 4),), cache=False)
    assert plan.ops_on("portable") == {"aten.slice_copy.Tensor": 1, "aten.squeeze_copy.dim": 1}
    assert plan.ops_on("cuda")["aten.permute_copy.default"] == 1
    for fallback in plan.fallbacks:
        assert dict(fallback.reasons)["cuda"].endswith(PAST_START)


def test_planning_with_cuda_says_nothing_of_ops_executorch_would_not_keep_whole(caplog):
    # The CUDA plugin keeps whole every op it takes, add and view among them; ExecuTorch
    # ignores those and said so on the root logger, 11 lines a plan of llama_decoder.
    model, inputs = zoo.load("llama_decoder")
    with caplog.at_level("WARNING"):
        plan = composer.plan(model, ["cuda", "xnnpack"], inputs, cache=False)
    assert plan.nodes_on("cuda")
    said = [r.getMessage() for r in caplog.records]
    assert not [line for line in said if "requested for preservation" in line]


@pytest.mark.parametrize("plugin", ["cuda", "metal"])
def test_ops_of_sizes_are_not_kept_whole(plugin):
    # On the GPU an export_llama decoder with a dynamic token dimension stopped with
    # "KeptWholeButLeft: no backend takes sym_size": a sym_size the CUDA partition did not take
    # was listed as kept whole, which ExecuTorch refuses undelegated; it never decomposes.
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
    model = nn.TransformerEncoder(layer, 2).eval()
    seq = torch.export.Dim("seq", min=2, max=128)
    program = torch.export.export(model, (torch.randn(1, 10, 32),), dynamic_shapes=({1: seq},))
    assert any(n.target == torch.ops.aten.sym_size.int for n in program.graph.nodes)
    registry = default_registry()
    backend = registry.backends[plugin]
    kept = registry.ops_to_not_decompose(backend, program, {})
    assert torch.ops.aten.linear.default in kept
    assert torch.ops.aten.sym_size.int not in kept


@pytest.mark.parametrize("stack", [["cuda"], ["xnnpack", "cuda"]], ids=",".join)
def test_a_kv_cache_stays_in_the_cuda_delegate_that_reads_and_writes_it(stack):
    # As CudaPartitioner places them (tag_mutated_buffer): on the device between tokens, not
    # handed in and out of the delegate on every call.
    model, inputs = zoo.load("llama_decoder")
    plan = composer.plan(model, stack, inputs)
    caches = {f"layers.{i}.attention.{kv}_cache" for i in range(2) for kv in "kv"}
    owners = {cache: p for p in plan.partitions for cache in p.state}
    assert set(owners) == caches
    # index_copy_ writes them; the partition that owns one holds its writer
    assert all(p.backend == "cuda" and "aten.index_copy.default" in p.ops for p in owners.values())
    kept = f"state kept in {owners['layers.0.attention.k_cache'].id}: "
    assert kept in summary_table(plan) and kept in render_html(plan)
    if stack == ["cuda"]:  # the tokens, their positions, the logits
        assert plan.crossings == 3


def test_a_backend_that_keeps_no_state_leaves_the_caches_outside():
    model, inputs = zoo.load("llama_decoder")
    plan = composer.plan(model, "xnnpack", inputs)
    assert not any(p.state for p in plan.partitions)
    assert "state kept" not in summary_table(plan)


class RepeatInterleave(torch.nn.Module):
    """Llama's grouped-query attention repeats its KV heads: ``repeat_interleave`` has no
    portable kernel (no out variant), only its decomposition has."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x).repeat_interleave(2, dim=1) * 2


@pytest.mark.parametrize("stack", [["cuda"], ["xnnpack", "cuda"]], ids=",".join)
def test_an_op_kept_whole_for_cuda_that_cuda_then_leaves_is_decomposed(stack):
    # The dynamic bf16 export_llama decoder on the GPU: CUDA's compiler failed, its nodes moved
    # off it, and the repeat_interleave it had asked to keep whole stayed whole with no
    # kernel anywhere: to_executorch's "Missing out variants: aten::repeat_interleave" (with
    # xnnpack before it, ExecuTorch's "scalar_tensor ... was not decomposed or delegated").
    # Asked again of the edge program, the plugin (which lists the ATen ops it finds) listed
    # none, so composer's own check saw nothing kept whole. A pin leaves it the same way.
    never = {"cuda": ["aten.repeat_interleave.self_int"]}
    plan = composer.plan(RepeatInterleave(), composer.Stack(stack, never=never),
                         (torch.randn(2, 3, 4, 8),), cache=False)  # fmt: skip
    ops = {op for node, op in plan.node_ops.items()}
    assert "aten.repeat_interleave.self_int" not in ops
    assert "aten.expand_copy.default" in plan.ops_on("portable")  # one of its pieces
    assert not {"aten.expand_copy.default"} & set(plan.ops_on("cuda"))
    # with xnnpack first, cuda is left only the cast of the lifted constant 2, which reads
    # nothing but that constant: not a partition for cuda (needs_a_runtime_input)
    assert bool(plan.nodes_on("cuda")) == (stack == ["cuda"])


class AnyDim(torch.nn.Module):
    """``any.dim``: a core op with no decomposition, which cuda asks to keep whole."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (torch.relu(x) * 2).any(dim=1).float() + 1


def test_an_op_without_decomposition_left_by_cuda_runs_on_its_portable_kernel():
    # The dynamic bf16 export_llama decoder with xnnpack,cuda, once CUDA's compiler failed and
    # its nodes moved: cuda, second in the stack, listed the ops still present with no filter
    # (a shortcut that saves ExecuTorch a retrace), any.dim among them, so lowering again
    # "decomposed" it into itself and stopped with KeptWholeButLeft.
    stack = composer.Stack(["xnnpack", "cuda"], never={"cuda": ["aten.any.dim"]})
    plan = composer.plan(AnyDim(), stack, (torch.randn(2, 3, 4, 8),), cache=False)
    # and the cast of the lifted constant 1, which reads only that constant (not for cuda)
    assert plan.ops_on("portable") == {
        "aten.any.dim": 1, "dim_order_ops._to_dim_order_copy.default": 1,
    }  # fmt: skip
    assert plan.nodes_on("xnnpack")


class _SizedTwice(nn.Module):
    """Two views sized by the input's dynamic length, with a node between them that CUDA does
    not take: two CUDA partitions that both need the length."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        h = torch.sigmoid(torch.relu(x).reshape(n, 8))
        return (h * 2).reshape(1, n, 8)


def test_each_cuda_delegate_computes_the_sizes_it_needs_from_its_inputs_shape():
    # export_llama's dynamic decoder: the token count, read once, crossed from one CUDA
    # delegate into the next as an int, and AOTInductor failed that partition ("aten::arange()
    # ... 'end' ... 'NoneType'"). Each reader now has its own sym_size, so each delegate
    # computes the size from its input's shape, and no view is left on the host for it.
    seq = torch.export.Dim("seq", min=2, max=16)
    program = torch.export.export(_SizedTwice(), (torch.randn(1, 4, 8),),
                                  dynamic_shapes=({1: seq},))  # fmt: skip
    plan = composer.plan(program, composer.Stack(["cuda"], never={"cuda": ["aten.sigmoid.default"]}),
                         cache=False)  # fmt: skip
    cuda = [p for p in plan.partitions if p.backend == "cuda"]
    assert len(cuda) == 2
    assert all(p.op_counts.get("aten.sym_size.int") == 1 for p in cuda), plan.to_dict()
    assert set(plan.ops_on("portable")) == {"aten.sigmoid.default"}


def test_a_size_never_crosses_a_cuda_delegates_boundary():
    # Without a copy of its own (here the user's pin keeps sym_size itself off CUDA), the node
    # that would read a size into the delegate stays on the host instead.
    seq = torch.export.Dim("seq", min=2, max=16)
    program = torch.export.export(_SizedTwice(), (torch.randn(1, 4, 8),),
                                  dynamic_shapes=({1: seq},))  # fmt: skip
    stack = composer.Stack(["cuda"], never={"cuda": ["aten.sigmoid.default", "aten.sym_size.int"]})
    plan = composer.plan(program, stack, cache=False)
    reasons = {f.op: dict(f.reasons)["cuda"] for f in plan.fallbacks}
    assert reasons["aten.view_copy.default"] == (
        "left out of its partition: it would read sym_size_int into the delegate as a number (a "
        "size such as sym_size), not a tensor: AOTInductor compiles a delegate's inputs and "
        "outputs as tensors"
    )


def test_a_cuda_partition_never_reads_only_constants():
    """corpus deit_tiny with xnnpack,cuda on an H100: XNNPACK left the class token's expand,
    CUDA took it alone, and AOTInductor refused the partition ("Mixed-device constants are
    only supported when the secondary device is CPU. Model device is 'cpu', but constant
    'cls_token' is on device 'cuda:0'"): a graph that reads no input compiles for the CPU."""
    plan = composer.plan(ClassToken().eval(), ["xnnpack", "cuda"], (torch.randn(1, 4, 8),),
                         cache=False)  # fmt: skip
    assert plan.ops_on("xnnpack") == {
        "aten.linear.default": 1, "aten.cat.default": 1, "aten.relu.default": 1,
    }  # fmt: skip
    assert not plan.nodes_on("cuda")
    assert plan.ops_on("portable") == {"aten.expand_copy.default": 1}
    (fallback,) = plan.fallbacks
    assert dict(fallback.reasons)["cuda"].startswith(
        "left out: its partition would read only constants"
    )


def test_cuda_declares_safer_for_the_ops_executorch_hands_to_triton():
    # triton_kernel_mode=OFF changes only these: a failed partition without them moves at once
    from executorch.backends.cuda.triton.replacement_pass import EDGE_TO_TRITON_KERNELS

    from composer.contract.op_names import overload_of
    from composer.plugins.cuda import TRITON_REPLACED

    replaced = {str(overload_of(op)) for op in EDGE_TO_TRITON_KERNELS}
    assert set(TRITON_REPLACED) == replaced


class _DilatedThenDepthwise(nn.Module):
    """A TCN's pieces: plain, dilated and depthwise 1-D convolutions."""

    def __init__(self) -> None:
        super().__init__()
        self.plain = nn.Conv1d(8, 16, 3, padding=1)
        self.dilated = nn.Conv1d(16, 16, 3, dilation=2, padding=2)
        self.depthwise = nn.Conv1d(16, 16, 5, groups=16, padding=2)

    def forward(self, x):
        return self.depthwise(torch.relu(self.dilated(torch.relu(self.plain(x)))))


def test_a_dilated_convolution_stays_on_cuda_rewritten_as_undilated_ones():
    """Inductor's Triton conv templates take no dilation, and CudaBackend allows no other
    choice: a bf16 TCN failed to lower on the H100 ("NoValidChoicesError"), and the repair
    moved the whole partition, every convolution, to portable kernels; declined up front, the
    dilated one alone went there, with copies each way. cuda's rewrite (composer_rewrites)
    writes it as one undilated convolution a tap, which the templates take: nothing leaves."""
    model, inputs = _DilatedThenDepthwise().eval(), (torch.randn(1, 8, 20),)
    plan = composer.plan(model, ["cuda"], inputs, cache=False)
    assert plan.fallbacks == (), plan.fallbacks
    assert not plan.ops_on("portable")
    assert plan.ops_on("cuda")["aten.conv1d.default"] == 2 + 3  # the dilated one's 3 taps
