"""The plan's records, typed (composer.scheduler.plan_records): their JSON keys stay those the
plan wrote when they were dicts, and they read back as they were written."""

from __future__ import annotations

import json

from composer.scheduler.plan_records import Repair


def test_a_repair_round_trips_through_the_plans_json_with_the_keys_it_always_had():
    moved = Repair("openvino", "openvino:1", ["a", "b"], "failed at run time: x", {"portable": 2})
    data = moved.to_dict()
    assert list(data) == ["backend", "partition", "nodes", "why", "moved_to"]
    assert data["nodes"] == ["a", "b"] and data["moved_to"] == {"portable": 2}
    assert Repair.from_dict(json.loads(json.dumps(data))) == moved

    tried = Repair("cuda", "cuda:0", ("n",), "does not match", {"cuda": 1},
                   {"triton_kernel_mode": "OFF"})  # fmt: skip
    assert tried.to_dict()["options"] == {"triton_kernel_mode": "OFF"}
    assert Repair.from_dict(json.loads(json.dumps(tried.to_dict()))) == tried
    assert moved.options is None and "options" not in data
