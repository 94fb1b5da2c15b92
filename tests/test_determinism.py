"""Equal input, equal bytes: every compose of one model and stack writes the same program,
in one process and in another, OpenVINO included (golden and sweep digests compare them)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

import composer
from composer.models import zoo
from composer.plugins.openvino import unavailable_reason
from composer.plugins.openvino.blob import renumbered

MODEL = "cnn"
STACKS = ["xnnpack", "openvino,xnnpack"]
COMPOSES_IN_ONE_PROCESS = 3

IN_A_FRESH_PROCESS = f"""
import hashlib, json, warnings
warnings.filterwarnings("ignore")
import composer
from composer.models import zoo
digests = {{}}
for stack in {STACKS!r}:
    model, inputs = zoo.load({MODEL!r})
    buffer = composer.compose(model, stack, inputs, cache=False).buffer
    digests[stack] = hashlib.sha256(buffer).hexdigest()
print(json.dumps(digests))
"""


def composed(stack: str) -> tuple[str, int, str]:
    """Digest, size and proof line of a fresh compose (no cache: the cache would hide it)."""
    model, inputs = zoo.load(MODEL)
    composition = composer.compose(model, stack, inputs, cache=False)
    buffer = composition.buffer
    return hashlib.sha256(buffer).hexdigest(), len(buffer), composition.plan.proof


@pytest.fixture(scope="module")
def fresh_process_digests() -> dict[str, str]:
    run = subprocess.run(
        [sys.executable, "-c", IN_A_FRESH_PROCESS], capture_output=True, text=True, check=True
    )
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("stack", STACKS)
def test_every_compose_of_one_model_writes_the_same_bytes(stack, fresh_process_digests):
    if "openvino" in stack and unavailable_reason() is not None:
        pytest.skip(unavailable_reason())
    runs = [composed(stack) for _ in range(COMPOSES_IN_ONE_PROCESS)]
    sizes = [size for _, size, _ in runs]
    assert len({digest for digest, _, _ in runs}) == 1, f"{stack}: sizes {sizes}"
    # Made the same, and still what the model computes: the proof ran it.
    assert all(proof.startswith("ran and matched eager") for _, _, proof in runs), runs
    assert fresh_process_digests[stack] == runs[0][0], f"{stack}: another process differs"


def test_openvino_automatic_names_are_renumbered_and_others_kept():
    first = (
        b'<net name="Model6"><layer name="Multiply_9140" fused="Constant_5451, aten_add_1/Add"/>'
    )
    second = b'<net name="Model0"><layer name="Multiply_3692" fused="Constant_3, aten_add_1/Add"/>'
    assert renumbered(first) == renumbered(second)
    assert renumbered(first) == (
        b'<net name="Model0"><layer name="Multiply_0" fused="Constant_1, aten_add_1/Add"/>'
    )


def test_distinct_openvino_names_stay_distinct():
    # Two nodes of one type swapped in number keep two names, each used where it was.
    xml = b'<a name="Add_7" to="Add_12"/><b name="Add_12" from="Add_7" x="Add_7_fused"/>'
    assert (
        renumbered(xml)
        == b'<a name="Add_0" to="Add_1"/><b name="Add_1" from="Add_0" x="Add_0_fused"/>'
    )
