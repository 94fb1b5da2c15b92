"""The plan's records, typed (composer.scheduler.plan_records, .measured_placement, .plans):
their JSON keys stay those the plan wrote when they were dicts, and they read back as they were
written."""

from __future__ import annotations

import json
from pathlib import Path

from composer.contract.backend_spec import Tolerance
from composer.report.plan_text import summary_table
from composer.scheduler.measured_placement import ETDUMP, Placement, RegionSearch, TracedCall
from composer.scheduler.plan_records import Repair
from composer.scheduler.plans import Plan


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


# A plan written by composer before its placement was typed (commit 9166d4f): a measured
# compose of cumsum_mlp over openvino,xnnpack, with two repairs, a tolerance, a dynamic dim, a
# quantization tolerance, a library and a partition's state added (attrs.evolve), then
# plan.to_json() and plan.summary_table(); and composer.plan's JSON and table, not measured.
PLANS = Path(__file__).parent / "data" / "plans"

# Every key of a plan's JSON, nested: what readers of ``composer plan --json`` and of
# ``--report x.json`` rely on. A change here is a change to the format.
PLAN_KEYS = [
    "backends", "stand_ins", "summary", "delegate_calls", "crossings",
    "duplicated_constant_bytes", "partitions", "fallbacks", "nodes", "edges", "libraries",
    "tolerances", "placement", "proof", "repairs", "dynamic_dims", "quantization",
]  # fmt: skip
PARTITION_KEYS = ["id", "backend", "device", "nodes", "op_counts", "quantized", "state"]
PLACEMENT_KEYS = [
    "mode", "chosen", "cached", "candidates", "config", "partitions", "traced", "regions",
    "never", "threads", "threads_set",
]  # fmt: skip
CANDIDATE_KEYS = [
    "candidate", "backends", "placement", "pins", "keep_whole", "delegate_calls", "median_us",
    "p90_us", "best_us", "note", "confirmed_median_us", "confirmed_best_us",
]  # fmt: skip
TIMED_PARTITION_KEYS = ["partition", "backend", "nodes", "median_us", "p90_us", "alternatives"]
ALTERNATIVE_KEYS = ["backend", "candidate", "median_us", "p90_us", "extra_nodes"]
TRACED_KEYS = ["execute_median_us", "between_calls_us", "runs", "timer"]
REGION_SEARCH_KEYS = [
    "notes", "max_regions", "regions", "timer", "region_us", "call_us", "between_us",
    "switch_us", "chosen", "estimated_us",
]  # fmt: skip


def test_a_measured_plan_keeps_its_json_keys_and_reads_back_as_it_was_written():
    written = (PLANS / "measured_plan.json").read_text()
    plan = Plan.from_json(written)
    data = plan.to_dict()
    assert list(data) == PLAN_KEYS
    assert list(data["partitions"][0]) == PARTITION_KEYS
    assert [list(f) for f in data["fallbacks"]] == [["node", "op", "reasons"]]
    assert {tuple(node) for node in data["nodes"].values()} == {("op", "backend")}
    assert [list(r) for r in data["repairs"]] == [
        ["backend", "partition", "nodes", "why", "moved_to"],
        ["backend", "partition", "nodes", "why", "moved_to", "options"],
    ]
    assert list(data["tolerances"]["halfpack"]) == ["atol", "rtol", "reason", "precision"]
    assert list(data["quantization"]) == ["atol", "rtol", "reason", "steps"]
    assert list(data["dynamic_dims"][0]) == ["input", "dim", "size", "ranges"]
    placement = data["placement"]
    assert list(placement) == PLACEMENT_KEYS
    assert all(list(c) == CANDIDATE_KEYS for c in placement["candidates"])
    assert all(list(p) == TIMED_PARTITION_KEYS for p in placement["partitions"])
    alternatives = [a for p in placement["partitions"] for a in p["alternatives"]]
    assert alternatives and all(list(a) == ALTERNATIVE_KEYS for a in alternatives)
    assert list(placement["traced"]) == TRACED_KEYS
    assert list(placement["regions"]) == REGION_SEARCH_KEYS
    assert all(list(r) == ["nodes", "options"] for r in placement["regions"]["regions"])
    assert list(placement["regions"]["switch_us"]) == ["openvino->xnnpack", "xnnpack->openvino"]

    # Read as records, and back to the very text the old code wrote.
    assert Plan.from_dict(data) == plan
    assert plan.to_json() + "\n" == written
    assert isinstance(plan.placement, Placement)
    assert plan.placement.regions.switch_us[("xnnpack", "openvino")] == 0.18
    assert plan.repairs[1].options == {"triton_kernel_mode": "OFF"}
    assert plan.tolerances["halfpack"] == Tolerance(0.01, 0.02, "bf16", precision="bfloat16")
    assert plan.partitions[0].ops == ("aten.linear.default", "aten.relu.default")
    assert plan.proof.startswith("ran and matched eager")
    # The text report, moved to composer.report.plan_text, says what it said.
    assert summary_table(plan) + "\n" == (PLANS / "measured_summary.txt").read_text()


def test_a_plan_not_measured_has_no_placement_and_writes_an_empty_one():
    written = (PLANS / "plain_plan.json").read_text()
    plan = Plan.from_json(written)
    assert plan.placement is None and plan.to_dict()["placement"] == {}
    assert plan.to_json() + "\n" == written and Plan.from_dict(plan.to_dict()) == plan
    assert summary_table(plan) + "\n" == (PLANS / "plain_summary.txt").read_text()


def test_a_search_cut_short_and_an_untraced_choice_write_what_they_have():
    placement = Placement(
        chosen="xnnpack alone", cached=False, candidates=[], config='backends = ["xnnpack"]\n',
        regions=RegionSearch(["not searched: over the tune budget of 0 s"]),
    )  # fmt: skip
    data = placement.to_dict()
    assert data["traced"] == {} and data["partitions"] == []
    assert data["regions"] == {"notes": ["not searched: over the tune budget of 0 s"]}
    assert Placement.from_dict(json.loads(json.dumps(data))) == placement
    assert Placement.from_dict({}) is None
    # A plan from before hosted timing says nothing of what traced it: ETDump did.
    old = TracedCall.from_dict({"execute_median_us": 5.0, "between_calls_us": 1.0, "runs": 30})
    assert old.timed_by == ETDUMP and "timer" not in old.to_dict()


def test_lower_states_a_measured_choice_once_and_counts_the_fallbacks():
    """The demo's measured placement once printed two answers on one screen, each inside
    the machine's noise, in about 80 lines. Without --verbose, `composer lower` states the
    choice beside the fastest other candidate and the noise, and counts the fallbacks."""
    plan = Plan.from_json((PLANS / "measured_plan.json").read_text())
    short = summary_table(plan, verbose=False)
    assert (
        "placement: measured, chose xnnpack alone: median 6.7 us; the fastest other, "
        "openvino,xnnpack (per region), 6.5 us (0.97x, one round); a candidate's two rounds "
        "differed by up to 2%"
    ) in short
    assert "fallbacks: 1 node(s) no backend of the stack took" in short
    assert "fallback aten_cumsum_default" not in short and "per partition" not in short
    assert '    backends = ["xnnpack"]' in short  # the config that reproduces it stays
    whole = summary_table(plan)
    assert "fallback aten_cumsum_default" in whole and "per partition" in whole
    assert len(short.splitlines()) < len(whole.splitlines())
