"""Sweeps go where the runtime is: Ray nodes say which backends' programs they prove
(``runtime:NAME`` resources), and a job asks for its stack's."""

from __future__ import annotations

import json

import pytest

from composer.cli import main
from composer.contract.errors import ComposerError
from composer.fleet.jobs import Job
from composer.fleet.on_ray import with_labels
from composer.fleet.runtime_labels import labels_asked


def test_this_machine_declares_the_backends_it_proves(capsys):
    assert main(["backends", "--ray-resources"]) == 0
    declared = json.loads(capsys.readouterr().out)
    # XNNPACK lowers and runs on this CPU; the TensorRT stand-in lowers here and runs nowhere.
    assert declared["runtime:xnnpack"] == 1000
    assert "runtime:tensorrt_stub" not in declared
    assert all(name.startswith("runtime:") for name in declared)


def test_a_job_asks_for_each_backend_of_its_stack_where_nodes_are_labelled():
    declared = {"CPU", "GPU", "runtime:xnnpack", "runtime:cuda"}
    job = Job("zoo:mlp", "cuda,xnnpack")
    asked = with_labels({"num_gpus": 1}, job, declared)
    assert asked == {
        "num_gpus": 1, "resources": {"runtime:cuda": 0.001, "runtime:xnnpack": 0.001},
    }  # fmt: skip


def test_a_cluster_without_labels_is_scheduled_as_before():
    job = Job("zoo:mlp", "vulkan,xnnpack")
    asks = {"resources": {"device:h100": 1}}
    assert with_labels(asks, job, {"CPU", "GPU", "device:h100"}) == asks


def test_a_backend_no_node_proves_is_one_line_naming_it_and_how_to_join_one():
    with pytest.raises(ComposerError) as raised:
        labels_asked(["vulkan", "xnnpack"], {"CPU", "runtime:xnnpack", "runtime:openvino"})
    said = str(raised.value)
    assert "no node of the Ray cluster proves vulkan (none declares runtime:vulkan" in said
    assert "the nodes' labels: openvino, xnnpack" in said
    assert '--resources "$(composer backends --ray-resources)"' in said
    assert "\n" not in said
