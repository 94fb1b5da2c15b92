"""Every form of torch.export's dynamic shapes composes where plain ExecuTorch lowers.

Each row exports a model with one form of ``dynamic_shapes`` (``Dim`` with and without
bounds, derived dims ``k * Dim``, ``Dim + c``, ``k * Dim + c``, ``Dim.AUTO``,
``Dim.DYNAMIC``, ``Dim.STATIC``, one dim shared by two inputs, dict and nested specs), lowers
it with plain ExecuTorch's partitioner list and runs that program, then composes it with
composer (the program as exported, and read back from a ``.pt2``). Where plain's program runs,
composer's must be written and proven at every size the form allows.
"""

from __future__ import annotations

import io

import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from executorch.exir.backend.compile_spec_schema import CompileSpec
from torch.export import Dim

import composer
from composer.lower.priority import _lowering_error
from composer.lower.size_reads import sizes_per_reader
from composer.run.runtime import LoadedProgram


class StridedConv(torch.nn.Module):
    """A strided Conv1d then a Linear over its frames: a length that halves."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(8, 16, 3, stride=2, padding=1)
        self.linear = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.relu(self.conv(x)).transpose(1, 2))


class TwoInputs(torch.nn.Module):
    """A signal one frame longer than the other, as a padded-by-one input is."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x[:, :, 1:] * 2.0 + y)


class Nested(torch.nn.Module):
    """Inputs in a dict, as a feature extractor takes them."""

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.relu(inputs["a"]) + inputs["b"].sum(dim=2, keepdim=True)


def _strided(spec, length=40):
    return StridedConv(), (torch.randn(1, 8, length),), spec


def _two(spec):
    # A batch of 2: an example dim of 1 is specialized by torch.export, whatever the spec says.
    return TwoInputs(), (torch.randn(2, 4, 13), torch.randn(2, 4, 12)), spec


half, seq, k = Dim("half", min=4, max=64), Dim("seq", min=8, max=128), Dim("k", min=3, max=50)
FORMS = {
    "dim": lambda: _strided(({2: seq},)),
    "dim_unbounded": lambda: _strided(({2: Dim("length", min=8)},)),
    "k_times_dim": lambda: _strided(({2: 2 * half},)),
    "k_times_dim_plus_c": lambda: _strided(({2: 4 * Dim("quarter", min=2, max=30) + 1},), 41),
    "auto": lambda: _strided(({2: Dim.AUTO},)),
    "dynamic": lambda: _strided(({2: Dim.DYNAMIC},)),
    "static": lambda: _strided(({2: Dim.STATIC},)),
    "dict_by_name": lambda: _strided({"x": {2: seq}}),
    "dim_plus_c": lambda: _two(({2: k + 1}, {2: k})),
    "shared": lambda: _two(({0: Dim("batch", max=8)}, {0: Dim("batch", max=8)})),
    "nested": lambda: (
        Nested(),
        ({"a": torch.randn(2, 4, 6), "b": torch.randn(2, 4, 6)},),
        ({"a": {0: Dim("b", max=8)}, "b": {0: Dim("b", max=8)}},),
    ),
}


def _exported(form: str) -> torch.export.ExportedProgram:
    torch.manual_seed(0)
    model, inputs, spec = FORMS[form]()
    return torch.export.export(model.eval(), inputs, dynamic_shapes=spec)


def _partitioners(stack: str) -> list:
    if stack == "xnnpack":
        return [XnnpackPartitioner()]
    from executorch.backends.openvino.partitioner import OpenvinoPartitioner  # the extra

    return [OpenvinoPartitioner([CompileSpec("device", b"CPU")]), XnnpackPartitioner()]


def _plain_runs(program: torch.export.ExportedProgram, stack: str) -> bool:
    """Whether plain ExecuTorch lowers ``program`` with ``stack``'s partitioners and runs it."""
    try:
        buffer = to_edge_transform_and_lower(program, partitioner=_partitioners(stack))
        buffer = buffer.to_executorch().buffer
        args, kwargs = program.example_inputs
        leaves = torch.utils._pytree.tree_leaves((args, kwargs))
        LoadedProgram(buffer).method.execute(leaves)
    except Exception:  # noqa: BLE001 - plain's failure is the row's data, not the test's
        return False
    return True


def _saved_and_loaded(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    return torch.export.load(buffer)


@pytest.mark.parametrize("stack", ["xnnpack", "openvino,xnnpack"])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_each_dynamic_shapes_form_composes_where_plain_executorch_runs(form, stack):
    if stack != "xnnpack" and form not in ("k_times_dim", "dim_plus_c", "k_times_dim_plus_c"):
        pytest.skip("openvino,xnnpack: the derived forms only (the others are the same code)")
    plain = _plain_runs(_exported(form), stack)
    for source in ("exported", "pt2"):
        program = _exported(form)
        if source == "pt2":
            program = _saved_and_loaded(program)
        composition = composer.compose(program, stack, cache=False)
        assert composition.plan.proof.startswith("ran and matched eager"), (form, source)
        if form != "static":
            assert composition.plan.dynamic_dims, (form, source)
            assert "min (" in composition.plan.proof and "max (" in composition.plan.proof
    # The row's point: plain's success is never composer's failure (composer passed above).
    assert plain or stack != "xnnpack", f"plain ExecuTorch failed on {form}: the row proves less"


def test_a_derived_dim_is_proven_at_sizes_it_allows_and_named_as_written():
    composition = composer.compose(_exported("k_times_dim_plus_c"), "xnnpack", cache=False)
    (dim,) = composition.plan.dynamic_dims
    assert dim["size"] == "4*quarter + 1" and dim["ranges"] == {"quarter": [2, 30]}
    # The root dim's smallest, middle and largest, each mapped through 4*quarter + 1.
    assert "min (quarter=2)" in composition.plan.proof
    assert "mid (quarter=16)" in composition.plan.proof
    assert "max (quarter=30)" in composition.plan.proof
    program = LoadedProgram(composition.buffer).method
    eager = _exported("k_times_dim_plus_c").module()
    for quarter in (2, 16, 30):
        x = torch.randn(1, 8, 4 * quarter + 1)
        torch.testing.assert_close(program.execute([x])[0], eager(x), atol=1e-5, rtol=1e-4)


def test_a_module_with_derived_dims_names_them_in_the_plan_text():
    model, inputs, spec = FORMS["dim_plus_c"]()
    composition = composer.compose(model, "xnnpack", inputs, dynamic_shapes=spec, cache=False)
    sizes = sorted(d["size"] for d in composition.plan.dynamic_dims)
    assert sizes == ["k", "k + 1"]
    assert "min (k=3)" in composition.plan.proof and "max (k=50)" in composition.plan.proof


class Fire(torch.nn.Module):
    """SqueezeNet's block: a 1x1 squeeze, then 1x1 and 3x3 expansions side by side."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.squeeze = torch.nn.Conv2d(channels, 4, 1)
        self.one = torch.nn.Conv2d(4, 8, 1)
        self.three = torch.nn.Conv2d(4, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.squeeze(x))
        return torch.cat([torch.relu(self.one(x)), torch.relu(self.three(x))], 1)


class Squeezed(torch.nn.Module):
    """torchvision's squeezenet1_1 in small: three ceil-mode pools take ``16 * h`` down to
    ``h - 1``, a size whose strides ExecuTorch compares through the root ``h`` itself."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.fire, self.last = torch.nn.Conv2d(3, 8, 3, stride=2), Fire(8), Fire(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pool = torch.nn.MaxPool2d(3, 2, ceil_mode=True)
        x = pool(self.fire(pool(torch.relu(self.stem(x)))))
        return torch.nn.functional.adaptive_avg_pool2d(self.last(pool(x)), 1).flatten(1)


def test_a_derived_dims_root_has_the_examples_value_where_executorch_guards_on_it():
    """The suite's torchvision tests export at ``16 * Dim`` sizes (ExecuTorch's backend test
    suite on the GPU machine: squeezenet1_1 and alexnet failed ``to_executorch`` with "Could not
    guard on data-dependent expression (s89 - 1)*(s99 - 1) < s99 - 1" where plain's lowered):
    the program composer lowers, read back from torch.export's bytes, kept the example's value
    for ``16*s89`` only, so a guard on ``s89`` itself found none."""
    torch.manual_seed(0)
    spec = ({2: 16 * Dim("h", min=1, max=8), 3: 16 * Dim("w", min=1, max=8)},)
    inputs = (torch.randn(1, 3, 64, 64),)
    program = torch.export.export(Squeezed().eval(), inputs, dynamic_shapes=spec)
    assert _plain_runs(program, "xnnpack")
    program = torch.export.export(Squeezed().eval(), inputs, dynamic_shapes=spec)
    composition = composer.compose(program, "xnnpack", cache=False)
    assert composition.plan.proof.startswith("ran and matched eager")
    assert "max (h=8, w=8)" in composition.plan.proof


class WindowMask(torch.nn.Module):
    """swin_v2_t's shifted-window mask in small: a trailing ``unsqueeze`` of a tensor with two
    dynamic dims, which XNNPACK's lowering turns into its static reshape."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (torch.relu(x) + 1).unsqueeze(-1) * self.weight


def test_a_reshape_xnnpack_cannot_lower_goes_to_portable_kernels_in_one_compose():
    """ExecuTorch's XNNPACK partitioner tags an ``unsqueeze_copy`` whose output has two
    dynamic dims, and its lowering refuses it ("XNNPACK reshape only supports 1 dynamic
    dimension"): swin_v2_t at the suite's dynamic sizes fails plain, and composer's repairs
    moved one whole partition a round, each round lowering the model again (35 minutes in
    the suite). composer's XNNPACK plugin declines that node, and says why."""
    torch.manual_seed(0)
    spec = ({2: Dim("h", min=2, max=16), 3: Dim("w", min=2, max=16)},)
    inputs = (torch.randn(1, 4, 8, 8),)
    program = torch.export.export(WindowMask().eval(), inputs, dynamic_shapes=spec)
    with pytest.raises(RuntimeError, match="XNNPACK reshape only supports 1 dynamic dimension"):
        to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
    program = torch.export.export(WindowMask().eval(), inputs, dynamic_shapes=spec)
    plan = composer.compose(program, "xnnpack", cache=False).plan
    assert plan.repairs == ()
    assert plan.node_backends["aten_unsqueeze_copy_default"] == "portable"
    assert dict(plan.decisions["aten_unsqueeze_copy_default"]) == {
        "xnnpack": "XNNPACK's static reshape takes one dynamic dim; this output has 2"
    }
    assert {"aten_relu_default", "aten_mul_tensor"} <= set(plan.nodes_on("xnnpack"))
    assert plan.proof.startswith("ran and matched eager at 4 sizes")


def test_a_failure_in_composers_own_step_is_not_blamed_on_executorch():
    dims = ({"input": 0, "dim": 2, "size": "2*half", "ranges": {"half": [4, 64]}},)
    try:
        sizes_per_reader(None)  # composer's pass, given what no lowering gives it
    except AttributeError as raised:
        error = _lowering_error(raised, [], [], dims)
    message = str(error)
    assert message.startswith(
        "composer's own step composer.lower.size_reads.sizes_per_reader failed while "
        "ExecuTorch lowered the program to its edge dialect"
    )
    assert "ExecuTorch's to_edge_transform_and_lower failed" not in message
    assert "input 0 dim 2 = 2*half (half in [4, 64])" in message
    assert "bug in composer" in message


def test_a_failure_in_composers_own_pass_is_not_blamed_on_executorch():
    """ExecuTorch runs a pass under its own error ("An error occurred when running the
    'NegativePadAsSlice' pass"), raised from the pass's: swin_v2_t's computed pad failed in
    composer's pass and the error blamed ExecuTorch's to_edge_transform_and_lower."""
    try:
        try:
            sizes_per_reader(None)  # composer's pass, given what no lowering gives it
        except AttributeError as inner:
            raise Exception(  # noqa: TRY002 - ExecuTorch's pass manager raises exactly this
                "An error occurred when running the 'sizes_per_reader' pass after the "
                "following passes: []"
            ) from inner
    except Exception as raised:  # noqa: BLE001 - what the pass manager raised is the point
        error = _lowering_error(raised, [], [], ())
    assert str(error).startswith(
        "composer's own step composer.lower.size_reads.sizes_per_reader failed"
    )
    assert "bug in composer" in str(error)


def test_a_failure_inside_torch_alone_names_executorch_and_the_dims():
    dims = ({"input": 0, "dim": 1, "size": "seq", "ranges": {"seq": [2, 128]}},)
    try:
        torch.export.load(io.BytesIO(b"not an archive"))
    except Exception as raised:  # noqa: BLE001 - whatever torch raises is the point
        error = _lowering_error(raised, [], [], dims)
    assert str(error).startswith("ExecuTorch's to_edge_transform_and_lower failed before any")
    assert "(the program's dynamic dims: input 0 dim 1 = seq (seq in [2, 128]))" in str(error)
