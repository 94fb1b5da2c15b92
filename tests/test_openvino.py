"""The openvino backend: real OpenVINO lowering, run in the pip ExecuTorch runtime."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from eager_check import assert_runs_like_eager
from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary

import composer
from composer.cli import main
from composer.contract.errors import ComposerError
from composer.models import zoo
from composer.report.plan_text import summary_table
from composer.run.runtime import LIBRARY_SPEC_KEY, LoadedProgram, program_libraries


def delegate_ids(buffer: bytes) -> list[str]:
    plan = deserialize_pte_binary(buffer).program.execution_plan[0]
    return [delegate.id for delegate in plan.delegates]


@pytest.fixture(scope="module")
def cumsum_mlp_xnnpack_openvino():
    model, inputs = zoo.load("cumsum_mlp")
    return composer.compose(model, ["xnnpack", "openvino"], inputs)


def test_openvino_takes_what_xnnpack_cannot_and_the_runtime_runs_both(cumsum_mlp_xnnpack_openvino):
    composition = cumsum_mlp_xnnpack_openvino
    plan = composition.plan
    assert dict(plan.ops_on("openvino")) == {"aten.cumsum.default": 1}
    assert plan.ops_on("portable") == {}
    assert sorted(set(delegate_ids(composition.buffer))) == ["OpenvinoBackend", "XnnpackBackend"]
    result = composition.verify()
    assert result.executor == "executorch runtime"
    assert result.ok, str(result)
    # The compiled OpenVINO code ran: its output differs from eager's in float rounding only.
    assert_runs_like_eager(composition)


def test_the_openvino_version_is_in_the_plan_and_the_program(cumsum_mlp_xnnpack_openvino):
    from importlib.metadata import version

    composition = cumsum_mlp_xnnpack_openvino
    library = f"openvino {version('openvino')}"
    assert composition.plan.libraries == {"openvino": library}
    assert composition.plan.to_dict()["libraries"] == {"openvino": library}
    assert f"compiled with: openvino: {library}" in summary_table(composition.plan)
    assert program_libraries(composition.buffer) == {"OpenvinoBackend": library}
    from composer.report.html import render_html

    assert f"openvino compiled with {library}" in render_html(composition.plan)


def test_a_program_from_another_openvino_says_which_versions_differ(cumsum_mlp_xnnpack_openvino):
    # What a .pte lowered under another OpenVINO looks like here: its recorded version differs
    # and its blob does not import (the real failure between 2025.4 and 2026.4).
    pte = deserialize_pte_binary(cumsum_mlp_xnnpack_openvino.buffer)
    program = pte.program
    plan = program.execution_plan[0]
    for delegate in plan.delegates:
        if delegate.id == "OpenvinoBackend":
            for spec in delegate.compile_specs:
                if spec.key == LIBRARY_SPEC_KEY:
                    spec.value = b"openvino 2026.4.1"
            program.backend_delegate_data[delegate.processed.index].data = b"not an OpenVINO blob"
    foreign = bytes(serialize_pte_binary(pte))
    with pytest.raises(ComposerError) as caught:
        LoadedProgram(foreign)
    message = str(caught.value)
    assert "OpenvinoBackend delegates were lowered with openvino 2026.4.1" in message
    assert "this runtime has openvino " in message
    assert "0x" not in message


def test_openvino_precision_is_stated_and_xnnpack_is_held_to_fp32_eager():
    model, inputs = zoo.load("mlp")
    alone = composer.compose(model, ["openvino"], inputs)
    result = alone.verify()
    assert result.ok, str(result)
    assert result.verdict.truth == "fp64" and "against fp64" in str(result)
    tolerance = alone.plan.tolerance()
    if tolerance is not None:  # a CPU with bf16 instructions: OpenVINO computes in bf16
        assert "bf16" in tolerance.reason and tolerance.precision == "bfloat16"
        assert "eager bfloat16" in str(result)  # held to what eager achieves in bf16
        assert alone.plan.to_dict()["tolerances"]["openvino"]["precision"] == "bfloat16"
        assert "precision openvino: judged against eager in bfloat16" in summary_table(alone.plan)
    xnnpack = composer.compose(model, ["xnnpack", "openvino"], inputs)
    assert xnnpack.plan.nodes_on("openvino") == []
    assert xnnpack.plan.tolerance() is None  # openvino took nothing: fp32 eager is the bar
    assert xnnpack.verify().verdict.eager_in == ""


def test_pins_and_minimum_sizes_apply_to_openvino():
    model, inputs = zoo.load("cumsum_mlp")
    pinned = composer.plan(model, ["xnnpack", "openvino"], inputs,
                           never={"openvino": ["aten.cumsum.default"]})  # fmt: skip
    assert dict(pinned.ops_on("portable")) == {"aten.cumsum.default": 1}
    [fallback] = pinned.fallbacks
    assert dict(fallback.reasons)["openvino"] == "pinned off openvino by the user"
    sized = composer.plan(model, ["xnnpack", "openvino"], inputs,
                          min_partition_size={"openvino": 2})  # fmt: skip
    assert dict(sized.ops_on("portable")) == {"aten.cumsum.default": 1}
    assert dict(sized.fallbacks[0].reasons)["openvino"] == "partition below the minimum size 2"


def test_unknown_openvino_option_is_a_user_error(capsys, tmp_path):
    code = main(["plan", "zoo:mlp", "--backends", "openvino", "--option", "openvino.bogus=1"])
    assert code == 2
    assert "unknown option 'bogus' for backend 'openvino'; known: device" in capsys.readouterr().err


def test_without_openvino_installed_it_is_listed_unavailable_and_refused():
    script = (
        "import sys; sys.modules['openvino'] = None\n"
        "import warnings; warnings.simplefilter('ignore')\n"
        "from composer.cli import main\n"
        "main(['backends'])\n"
        "main(['backends', 'openvino'])\n"
        "sys.exit(main(['plan', 'zoo:mlp', '--backends', 'openvino']))\n"
    )
    # Whole rows: a narrow $COLUMNS (xdist's workers have one) wraps the table.
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, check=False, env={**os.environ, "COLUMNS": "400"})  # fmt: skip
    row = next(line for line in done.stdout.splitlines() if line.startswith("openvino"))
    assert row.split()[1] == "no", row  # the listing: it does not lower here
    said = " ".join(done.stdout.split())  # `composer backends openvino` says why
    assert "lowers here: no, the openvino package is not installed" in said
    assert "pip install 'executorch-composer[openvino]'" in said
    assert done.returncode == 2
    assert "backend 'openvino' cannot be used: the openvino package is not installed" in done.stderr


def test_lower_bench_times_the_stack_beside_eager_and_each_backend(capsys, tmp_path):
    pte = tmp_path / "m.pte"
    code = main(["lower", "zoo:cumsum_mlp", "--backends", "xnnpack,openvino", "-o", str(pte),
                 "--quiet", "--bench", "5"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    table = out[out.index("latency, 5 or more calls each") :].splitlines()
    assert table[1].split()[:3] == ["program", "delegate", "calls"]
    programs = [line.split()[0] for line in table[2:6]]
    assert programs == ["eager", "xnnpack,openvino", "xnnpack", "openvino"]
    assert table[3].split()[1] == "3"  # the composed program's delegate calls
    code = main(["run", str(pte), "--compare", "zoo:cumsum_mlp", "--bench", "5"])
    out = capsys.readouterr().out
    assert code == 0
    assert "delegate 1 (OpenvinoBackend): median" in out
    assert "delegate 0 (XnnpackBackend): median" in out
    assert "compare with zoo:cumsum_mlp: OK" in out


def test_lower_bench_times_a_slow_backend_alone_fewer_times(capsys, tmp_path, monkeypatch):
    # As if each backend alone were slow (XNNPACK alone on nf_resnet26: 0.72 s a call): the
    # program asked for and eager keep every call, the backends alone as few as LEAST_RUNS.
    from composer.measure import latency

    monkeypatch.setattr(latency, "SECONDS_PER_PROGRAM", 0.0)
    code = main(["lower", "zoo:cumsum_mlp", "--backends", "xnnpack,openvino", "-o",
                 str(tmp_path / "m.pte"), "--quiet", "--bench", "40"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    for name in ("xnnpack", "openvino"):
        assert f"{name} alone: timed 6 calls, as many as fit in 0 s (at least 6)" in out
    assert "xnnpack,openvino: timed" not in out


def test_run_says_what_input_the_program_expects(tmp_path, capsys, cumsum_mlp_xnnpack_openvino):
    pte = tmp_path / "m.pte"
    pte.write_bytes(cumsum_mlp_xnnpack_openvino.buffer)
    inputs = tmp_path / "wrong.pt"
    torch.save((torch.randn(3, 3),), inputs)
    assert main(["run", str(pte), "--inputs", str(inputs)]) == 2
    err = capsys.readouterr().err
    assert "input 0 has shape [3, 3] float32; the program was exported for [4, 16] float32" in err


def test_openvino_alone_lowers_the_bilinear_upsample_it_asks_to_keep_whole():
    # ExecuTorch 1.5.1's OpenvinoPartitioner asks to keep upsample_bilinear2d whole but its
    # support check declines it, so lowering stopped with "was not decomposed or delegated".
    # composer keeps whole only what OpenVINO takes; the upsample runs on portable kernels.
    pytest.importorskip("openvino")
    from composer.plugins.openvino import plugin
    from composer.plugins.openvino.support import takes_op

    model, inputs = zoo.load("unet_bilinear")
    composition = composer.compose(model, ["openvino"], inputs, cache=False)
    plan = composition.plan
    assert dict(plan.ops_on("portable")) == {"aten.upsample_bilinear2d.vec": 2}
    assert plan.ops_on("openvino")["aten.convolution.default"] == 6
    assert set(delegate_ids(composition.buffer)) == {"OpenvinoBackend"}
    result = composition.verify()
    assert result.executor == "executorch runtime"
    assert result.ok, str(result)
    assert_runs_like_eager(composition)
    # What OpenVINO's own check says, which the plugin follows: nearest yes, bilinear no.
    bilinear = torch.ops.aten.upsample_bilinear2d.vec
    assert not takes_op(bilinear) and takes_op(torch.ops.aten.upsample_nearest2d.vec)
    exported = torch.export.export(model, inputs)
    kept = plugin.composer_ops_to_not_decompose(backend=None, program=exported, options={})
    assert bilinear not in kept and torch.ops.aten.upsample_nearest2d.vec in kept


class UpsampleThenStack(torch.nn.Module):
    """Two ops OpenVINO asks to keep whole and takes: a nearest upsample (core ATen, with no
    decomposition) and a stack (which decomposes into views and a cat)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.up = torch.nn.Upsample(scale_factor=2, mode="nearest")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.up(torch.relu(self.conv(x)))
        return torch.stack([y, y * 2], dim=0)


@pytest.mark.parametrize(
    ("stack", "on_portable"),
    [
        # A pinned node of an op without a decomposition stays whole, on portable kernels.
        (
            composer.Stack(["openvino"], never={"openvino": ["node:aten_upsample_nearest2d_vec"]}),
            {"aten.upsample_nearest2d.vec": 1},
        ),
        # A pinned op is decomposed, and its pieces stay off the backend it was pinned off.
        (
            composer.Stack(["openvino"], never={"openvino": ["aten.stack.default"]}),
            {"aten.cat.default": 1, "aten.view_copy.default": 1},
        ),
        # A partition below the minimum size leaves everything, the kept-whole ops too.
        (
            composer.Stack(["openvino"], min_partition_size={"openvino": 20}),
            {
                "aten.convolution.default": 1,
                "aten.relu.default": 1,
                "aten.upsample_nearest2d.vec": 1,
                "dim_order_ops._to_dim_order_copy.default": 1,
                "aten.mul.Tensor": 1,
                "aten.cat.default": 1,
                "aten.view_copy.default": 1,
            },
        ),
    ],
    ids=["node-pin", "op-pin", "min-size"],
)
def test_a_node_openvino_keeps_whole_but_does_not_take_is_lowered_without_it(stack, on_portable):
    # OpenVINO asks to keep upsample_nearest2d and stack whole. Left whole and undelegated,
    # ExecuTorch refused them: "... was not decomposed or delegated".
    pytest.importorskip("openvino")
    composition = composer.compose(UpsampleThenStack().eval(), stack,
                                   (torch.randn(1, 3, 8, 8),), cache=False)  # fmt: skip
    plan = composition.plan
    assert dict(plan.ops_on("portable")) == on_portable
    assert_runs_like_eager(composition)


def test_a_node_pinned_off_openvino_stays_whole_where_executorch_lets_it():
    """With XNNPACK in the stack ExecuTorch checks kept-whole ops through its filter, which
    lets an undelegated whole node be: it runs on portable kernels, not decomposed."""
    pytest.importorskip("openvino")
    stack = composer.Stack(["openvino", "xnnpack"], never={"openvino": ["node:aten_stack_default"]})
    composition = composer.compose(UpsampleThenStack().eval(), stack,
                                   (torch.randn(1, 3, 8, 8),), cache=False)  # fmt: skip
    plan = composition.plan
    assert dict(plan.ops_on("portable")) == {"aten.stack.default": 1}
    openvino = plan.ops_on("openvino")
    assert openvino["aten.upsample_nearest2d.vec"] == 1
    assert "aten.stack.default" not in openvino
    assert_runs_like_eager(composition)


class ConcatenatesOne(torch.nn.Module):
    """DenseNet's first layer of each dense block concatenates a list of one tensor: XNNPACK
    leaves that ``cat``, and OpenVINO fails to convert it alone (OpConversionFailure)."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(8, 8, 3, padding=1) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = conv(torch.cat([torch.relu(x)], 1))
        return x


def test_every_partition_openvino_fails_to_convert_moves_in_one_repair():
    # Plain ExecuTorch's xnnpack,openvino fails here (OpConversionFailure). The compiler is
    # handed every partition before the repair: found one at a time, DenseNet-121's four such
    # concatenations cost four more lowerings of the whole model.
    torch.manual_seed(0)
    lines: list[str] = []
    composition = composer.compose(
        ConcatenatesOne().eval(), "xnnpack,openvino", (torch.randn(1, 8, 16, 16),),
        cache=False, progress=lines.append,
    )  # fmt: skip
    repairs = composition.plan.repairs
    assert [r.partition for r in repairs] == [
        f"openvino partition of aten_cat_default{suffix}" for suffix in ("", "_1", "_2")
    ]
    assert all(r.why.startswith("failed to lower: OpConversionFailure") for r in repairs)
    assert all(r.moved_to == {"portable": 1} for r in repairs)
    assert sum("composing again" in line for line in lines) == 1
    assert sum(line.startswith("openvino: ") for line in lines) == 2  # lowered twice, no more
    assert composition.plan.proof.startswith("ran and matched eager")


class ChannelShuffle(torch.nn.Module):
    """shufflenet_v2's channel shuffle over a length that varies: the view reads the length
    as a size computed at run time (``sym_size``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, n = x.shape
        y = torch.relu(x).view(b, 2, c // 2, n).transpose(1, 2).reshape(b, c, n)
        return (y * 2).mean(-1)


def test_a_size_computed_at_run_time_stays_out_of_openvinos_delegates():
    # OpenVINO's compile takes tensors only: a partition reading a SymInt failed to lower
    # ("'SymInt' object has no attribute 'type'", shufflenet_v2 at dynamic sizes in the
    # backend test suite) and a repair moved it all. Now the view reading it stays out at
    # planning, and OpenVINO takes what ends at a fixed size.
    pytest.importorskip("openvino")
    length = torch.export.Dim("n", min=2, max=32)
    program = torch.export.export(
        ChannelShuffle().eval(), (torch.randn(1, 4, 8),), dynamic_shapes=({2: length},)
    )
    composition = composer.compose(program, "openvino", cache=False)
    plan = composition.plan
    assert plan.repairs == ()
    assert plan.nodes_on("openvino") != []
    assert plan.proof.startswith("ran and matched eager at 4 sizes")
    said = dict(plan.explain("aten_view_copy_default"))["openvino"]
    assert "a size computed at run time (a SymInt) entering the delegate" in said, said
