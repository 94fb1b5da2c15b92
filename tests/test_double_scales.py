"""A quantize op left to portable kernels reads float64 scales (composer/lower/double_scales.py).

NNCF's OpenVINO quantization leaves a float weight behind a ``quantize_per_channel`` with float32
scales. OpenVINO computes the reflect-padded convolution of ExecuTorch's backend test suite
wrong, the proof's repair moves the partition to portable kernels, and the portable kernel's
``ET_CHECK`` on the scales' dtype aborted the whole process (the suite's ``openvino_int8`` case).
The compose runs in a child process, so the abort it guards against fails this test alone.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("openvino")
pytest.importorskip("nncf")

SCRIPT = textwrap.dedent(
    """
    import torch
    import composer
    from executorch.backends.test.suite.flow import all_flows
    from executorch.backends.test.suite.operators.test_conv2d import Model

    torch.manual_seed(0)
    inputs = (torch.randn(4, 3, 16, 16),)
    quantize = all_flows()["openvino_int8"].quantize_stage_factory()
    quantize.run(Model(padding=1, padding_mode="reflect").eval(), inputs)
    program = torch.export.export(quantize.artifact, inputs)
    composition = composer.compose(program, ["openvino"], inputs, cache=False)
    print("PROOF", composition.plan.proof)
    for node in composition.edge.exported_program().graph.nodes:
        if node.op == "call_function" and "quantize_per_channel" in str(node.target):
            print("PORTABLE", node.target.__name__, node.args[1].meta["val"].dtype)
    """
)


def test_a_per_channel_quantize_on_portable_kernels_runs():
    completed = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600, check=False
    )
    text = completed.stdout + completed.stderr
    assert completed.returncode == 0, text[-3000:]
    lines = completed.stdout.splitlines()
    proof = next(line for line in lines if line.startswith("PROOF"))
    assert "ran and matched eager" in proof, proof
    portable = [line.split()[1:] for line in lines if line.startswith("PORTABLE")]
    # The case this guards: the repair left the weight's quantize op to portable kernels.
    assert ["quantize_per_channel.out", "torch.float64"] in portable, lines
    assert all(dtype == "torch.float64" for _, dtype in portable), lines
