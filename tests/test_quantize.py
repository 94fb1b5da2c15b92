"""composer.quantize: each backend's nodes quantized with that backend's quantizer, the nodes of
a float backend left float, and the result composes, runs and matches its quantized reference."""

from __future__ import annotations

import pytest
import torch
from executorch.runtime import Runtime

import composer
from composer.models import zoo
from composer.report.plan_text import summary_table

pytest.importorskip("openvino")


def test_an_int8_backend_beside_a_float_one_each_gets_its_own_precision():
    model, inputs = zoo.load("cnn")
    # The convolutions are pinned off XNNPACK, so OpenVINO takes them: XNNPACK's quantizer
    # annotates every conv and linear, and the convolutions' annotations must come off again
    # (OpenVINO cannot convert XNNPACK's int8 convolutions: OpConversionFailure).
    stack = composer.Stack("xnnpack,openvino", never={"xnnpack": ["aten.convolution.default"]})
    generator = torch.Generator().manual_seed(0)
    calibration = [(torch.randn(inputs[0].shape, generator=generator),) for _ in range(8)]
    said: list[str] = []

    program = composer.quantize(model, stack, inputs, calibration=calibration, progress=said.append)
    composition = composer.compose(program, stack, inputs, cache=False)

    plan = composition.plan
    assert plan.proof.startswith("ran and matched eager"), plan.proof
    assert plan.repairs == ()
    xnnpack, openvino = plan.partitions_of("xnnpack"), plan.partitions_of("openvino")
    assert xnnpack and all(p.quantized for p in xnnpack)
    assert openvino and not any(p.quantized for p in openvino)
    assert plan.ops_on("openvino")["aten.convolution.default"] == 2
    assert plan.ops_on("xnnpack")["aten.linear.default"] == 1
    assert f"{len(xnnpack)} ({len(xnnpack)} quantized)" in summary_table(plan)
    assert any(line.startswith("xnnpack: quantized") for line in said)
    # The program, run in ExecuTorch's runtime, stays close to the float model it came from.
    method = Runtime.get().load_program(composition.buffer).load_method("forward")
    (composed,) = method.execute(list(inputs))
    assert (composed - model(*inputs)).abs().max().item() < 0.1


def test_a_stack_without_a_quantizer_is_refused_with_what_to_do():
    model, inputs = zoo.load("mlp")
    with pytest.raises(composer.ComposerError, match="no backend of \\['openvino'\\] offers"):
        composer.quantize(model, "openvino", inputs)


def test_quantized_nodes_no_backend_of_the_stack_takes_run_on_portable_kernels():
    model, inputs = zoo.load("mlp")
    program = composer.quantize(model, "xnnpack", inputs)
    # OpenVINO's converter fails on XNNPACK's int8 linears (plain ExecuTorch stops there);
    # the partition moves to ExecuTorch's portable kernels, which run quantize/dequantize once
    # its quantized kernels library is loaded ("Missing out variants" in to_executorch before).
    with pytest.warns(composer.ComposerWarning, match="now run on ExecuTorch's portable kernels"):
        composition = composer.compose(program, "openvino", inputs, cache=False)
    plan = composition.plan
    assert "OpConversionFailure" in plan.repairs[0].why
    assert plan.ops_on("portable")["quantized_decomposed.dequantize_per_channel.default"] == 3
    assert plan.proof.startswith("ran and matched eager")
    method = Runtime.get().load_program(composition.buffer).load_method("forward")
    (composed,) = method.execute(list(inputs))
    assert (composed - program.module()(*inputs)).abs().max().item() < 1e-5


def test_a_float_backend_ahead_keeps_what_it_takes_float():
    # OpenVINO, first, takes every node of the cnn float: XNNPACK's quantizer gets none of them,
    # though XNNPACK would take some once quantized (the trial composer.quantize makes for a
    # backend the float plan gives nothing, meant for integer-only NPUs).
    model, inputs = zoo.load("cnn")
    program = composer.quantize(model, "openvino,xnnpack", inputs)
    ops = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert not any("quantize" in op for op in ops)


def test_a_model_no_backend_with_a_quantizer_takes_is_left_float_and_said():
    # XNNPACK takes no argmin, float or quantized: its quantizer annotates nothing, so nothing
    # is prepared or planned again (each PT2E prepare of XNNPACK's quantizer costs seconds).
    class Argmin(torch.nn.Module):
        def forward(self, x):
            return torch.argmin(x, dim=1)

    inputs = (torch.randn(4, 8, 16),)
    said: list[str] = []
    program = composer.quantize(Argmin(), "xnnpack", inputs, progress=said.append)
    assert said == ["no node of the model goes to xnnpack: nothing quantized"]
    ops = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert ops == {"aten.argmin.default"}
    composition = composer.compose(program, "xnnpack", inputs, cache=False)
    assert composition.plan.proof.startswith("ran and matched eager")


def test_a_node_is_the_backends_its_op_went_to_not_its_output_dequantize():
    # XNNPACK takes no 3-d convolution, float or quantized. Quantized on trial, the dequantize
    # after it (which descends from it) went to XNNPACK alone, and stood for the convolution:
    # XNNPACK's quantizer was given it, and int8 kernels nobody runs were left to portable.
    inputs = (torch.randn(1, 3, 8, 8, 8),)
    said: list[str] = []
    program = composer.quantize(torch.nn.Conv3d(3, 4, 3).eval(), "xnnpack", inputs,
                                progress=said.append)  # fmt: skip
    assert said == ["no node of the model goes to xnnpack: nothing quantized"]
    assert not any("quantize" in str(n.target) for n in program.graph.nodes)
