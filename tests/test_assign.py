"""The stack's assignment, decided once on names: priority order, pins, consolidation."""

from __future__ import annotations

import pytest
import torch

import composer
from composer.contract.errors import PartitionError
from composer.models import zoo
from composer.registry.discovery import default_registry
from composer.scheduler.assign import assign, warn_about_pins_naming_no_op
from composer.scheduler.partitioner import ComposerPartitioner, SharedLowering
from composer.scheduler.schedule import PrioritySchedule

DEVICES = {"gpu": "cuda", "cpu": "cpu"}
CHAIN = {"a": "aten.mm.default", "b": "aten.cumsum.default", "c": "aten.mm.default"}
EDGES = [("a", "b"), ("b", "c")]


def test_pins_are_withheld_from_their_backend_only():
    assignment = assign(CHAIN, ["gpu", "cpu"], {"cpu": ["aten.mm.default"]})
    assert assignment.withheld_from("cpu") == {
        "a": "pinned off cpu by the user",
        "c": "pinned off cpu by the user",
    }
    assert assignment.withheld_from("gpu") == {}


def test_without_supports_priority_order_and_pins_are_the_whole_assignment():
    assignment = assign(CHAIN, ["gpu", "cpu"], {})
    assert assignment.withheld == {}


def test_an_island_between_accelerator_partitions_is_withheld_from_its_owner():
    supported = {"gpu": {"a", "b", "c"}, "cpu": {"b"}}
    # cpu first: b is cpu's by priority, between two gpu ops; it goes to gpu.
    assignment = assign(CHAIN, ["cpu", "gpu"], {}, supported, EDGES, DEVICES)
    assert dict(assignment.withheld_from("cpu")) == {
        "b": "left to gpu: a small island between its partitions, moved to save a round trip "
        "off its device"
    }
    assert assignment.withheld_from("gpu") == {}


def test_pins_decide_ownership_before_islands_move():
    supported = {"cpu": {"a", "b", "c"}, "gpu": {"a", "b", "c"}}
    assert assign(CHAIN, ["cpu", "gpu"], {}, supported, EDGES, DEVICES).withheld == {}
    # Pinned off mm, cpu keeps only b, now an island between gpu ops: it moves to gpu.
    pins = {"cpu": ["aten.mm.default"]}
    withheld = assign(CHAIN, ["cpu", "gpu"], pins, supported, EDGES, DEVICES).withheld_from("cpu")
    assert sorted(withheld) == ["a", "b", "c"]
    assert withheld["b"].startswith("left to gpu: ")
    # Nor does an island move to a backend it is pinned off.
    pins = {"gpu": ["aten.cumsum.default"]}
    assignment = assign(CHAIN, ["gpu", "cpu"], pins, supported, EDGES, DEVICES)
    assert assignment.withheld_from("cpu") == {}


def test_a_pin_naming_no_op_warns_with_the_closest_names():
    with pytest.warns(composer.ComposerWarning, match=r"did you mean aten\.relu\.default"):
        warn_about_pins_naming_no_op({"gpu": ["aten.relu"]}, ["aten.relu.default"])


def test_a_real_op_the_model_does_not_use_is_no_warning(recwarn):
    warn_about_pins_naming_no_op({"gpu": ["aten.tanh.default"]}, ["aten.relu.default"])
    assert not [w for w in recwarn if issubclass(w.category, composer.ComposerWarning)]


def test_the_schedule_refuses_a_first_call_that_is_not_the_first_backend():
    registry = default_registry()
    backends = registry.resolve(["xnnpack", "tensorrt_stub"])
    schedule = PrioritySchedule({}, consolidate=True)
    lowering = SharedLowering(schedule=schedule)
    first, second = (ComposerPartitioner(b, registry, lowering=lowering) for b in backends)
    lowering.seat([first, second])
    model, inputs = zoo.load("mlp")
    program = torch.export.export(model, inputs)
    with pytest.raises(PartitionError, match="no longer lowers in list order"):
        schedule.withheld_from(second, program, set(), support=None)


def test_a_shared_lowering_seats_its_partitioners_once_and_only_then_lists_them():
    registry = default_registry()
    (backend,) = registry.resolve(["tensorrt_stub"])
    lowering = SharedLowering()
    partitioner = ComposerPartitioner(backend, registry, lowering=lowering)
    with pytest.raises(RuntimeError, match="read before they were seated"):
        _ = lowering.partitioners
    lowering.seat([partitioner])
    assert lowering.partitioners == (partitioner,)
    with pytest.raises(RuntimeError, match="seats its partitioners once"):
        lowering.seat([partitioner])
    with pytest.raises(AttributeError):
        lowering.keep_whole = "any"
