"""Measured placement: candidates composed and timed in the runtime, the fastest kept."""

from __future__ import annotations

import itertools
import json

import attrs
import pytest
import torch
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from plugins_for_tests import registry_with
from torch.fx.passes.operator_support import OperatorSupportBase

import composer
from composer import BackendSpec
from composer.cli import main
from composer.config import stack_from_text
from composer.contract.hookspecs import hookimpl
from composer.measure import placement
from composer.measure.candidates import Candidate, candidates
from composer.measure.choice import MARGIN, Measurement, choose, choose_confirmed
from composer.measure.etdump import ProgramTrace, StepTime, program_instructions, trace
from composer.measure.latency import Latency
from composer.measure.region_choice import cheapest_path, proposal
from composer.measure.region_costs import Costs, costs
from composer.measure.region_layouts import layouts, pins
from composer.measure.regions import Region, _has_kernel, cut, portable_kernels, topological_order
from composer.models import zoo
from composer.report.plan_text import summary_table
from composer.scheduler.plans import Partition as PlanPartition
from composer.scheduler.plans import Plan


def test_candidates_are_the_orders_and_each_backend_alone():
    labels = [c.label for c in candidates(["openvino", "xnnpack"])]
    assert labels == [
        "openvino,xnnpack (priority)",
        "openvino,xnnpack (strict)",
        "xnnpack,openvino (priority)",
        "openvino alone",
        "xnnpack alone",
    ]
    assert [c.label for c in candidates(["xnnpack"])] == ["xnnpack alone"]


def timed(backends, median_us, placement="priority"):
    return Measurement(Candidate(tuple(backends), placement), 1, Latency(median_us, median_us, 9))


def test_the_declared_order_stays_unless_clearly_beaten():
    declared = timed(["a", "b"], 100.0)
    within_noise = timed(["a"], 100.0 / (1 + MARGIN / 2))
    assert choose([declared, within_noise]) == declared.candidate
    faster = timed(["b"], 100.0 / (1 + 2 * MARGIN))
    assert choose([declared, within_noise, faster]) == faster.candidate
    untimed = Measurement(Candidate(("a", "b"), "priority"), None, None, "not timed: no runtime")
    assert choose([untimed, timed(["b"], 5.0)]) == Candidate(("b",), "priority")


def test_a_switch_from_the_declared_order_must_win_a_second_round_too():
    declared, winner = timed(["a", "b"], 100.0), timed(["b", "a"], 80.0)
    a_alone, b_alone = timed(["a"], 120.0), timed(["b"], 90.0)
    measurements = (declared, winner, a_alone, b_alone)
    assert choose(measurements) == winner.candidate
    same = {m.candidate: str(i) for i, m in enumerate(measurements)}
    rounds = []

    def second(times):
        def together(digests):  # times the programs of these digests together
            rounds.append(sorted(digests))
            return {d: Latency(times[d], times[d], 9) for d in digests}

        return together

    for times, kept in [
        ({"0": 100.0, "1": 99.0, "2": 120.0, "3": 130.0}, declared),  # the win was noise
        ({"0": 100.0, "1": 81.0, "2": 120.0, "3": 90.0}, winner),  # it won again
    ]:
        rounds.clear()
        confirmed = placement._confirm(measurements, winner.candidate, same, second(times), None)
        assert rounds == [["0", "1", "2", "3"]]  # the finalists, timed together
        assert choose_confirmed(confirmed) == kept.candidate
        assert [m.latency for m in confirmed] == [m.latency for m in measurements]


def test_a_round_slowed_by_load_does_not_hand_the_choice_to_a_slower_candidate():
    """llama_block, openvino,xnnpack, under load: xnnpack alone won the first round (38 us);
    a disturbed second round gave it 65 us against OpenVINO alone's 61. It beat the declared
    order in both rounds, and its faster round is the fastest: it stays chosen."""

    def confirmed(backends, first, second, placement="priority"):
        return attrs.evolve(timed(backends, first, placement), confirmed=Latency(second, second, 9))

    declared = confirmed(["openvino", "xnnpack"], 146.3, 146.6)
    openvino = confirmed(["openvino"], 61.7, 61.2)
    xnnpack = confirmed(["xnnpack"], 38.5, 64.9)
    assert choose_confirmed([declared, openvino, xnnpack]) == xnnpack.candidate
    # One that beat the declared order only in the first round is not a winner.
    lucky = confirmed(["xnnpack", "openvino"], 30.0, 150.0)
    assert choose_confirmed([declared, lucky, openvino]) == openvino.candidate


class Timeable:
    def timed_call(self, inputs):
        return lambda: None


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("COMPOSER_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_measured_is_never_slower_than_the_best_single_backend_and_is_cached(cache):
    model, inputs = zoo.load("cumsum_mlp")
    lines = []
    first = composer.compose(model, ["openvino", "xnnpack"], inputs, placement="measured",
                             progress=lines.append)  # fmt: skip
    placement = first.plan.placement
    assert not placement.cached
    assert any(line == "placement: composing xnnpack alone" for line in lines)
    medians = {item.candidate: item.median_us for item in placement.candidates}
    # The five whole programs, then the per-region search's candidate: on cumsum_mlp a
    # delegate call of OpenVINO's (10 us and more) costs more than any op it could run, so
    # the search never keeps the declared strict assignment (OpenVINO's relu, cumsum, add).
    assert list(medians)[-1] == "openvino,xnnpack (per region)"
    assert len(medians) == 6 and None not in medians.values()
    chosen = medians[placement.chosen]
    assert chosen <= min(medians["openvino alone"], medians["xnnpack alone"]) * (1 + MARGIN)
    assert chosen <= medians["openvino,xnnpack (priority)"]
    # The regions, each timed on every option that takes it, and the choice.
    searched = placement.regions
    assert [r.nodes for r in searched.regions] == [
        ("aten_linear_default",), ("aten_relu_default",), ("aten_cumsum_default",),
        ("aten_linear_default_1",), ("aten_add_tensor",),
    ]  # fmt: skip
    assert searched.regions[2].options == ("openvino", "portable")
    assert all(
        set(times) == set(region.options)
        for region, times in zip(searched.regions, searched.region_us)
    )
    assert searched.chosen[2] == "portable" and searched.estimated_us > 0
    layouts_composed = [line for line in lines if line.startswith("placement: regions: composing ")]
    assert len(layouts_composed) == 7  # 3 for each backend, 1 for the crossings
    assert any(line.startswith("placement: regions: chose ") for line in lines)
    table = summary_table(first.plan)
    assert "per region: 5 regions, each timed on every option" in table
    assert "    region 2: aten_cumsum_default: openvino " in table
    assert "    a call's fixed cost: openvino " in table
    per_region = dict(first.plan.explain("aten_cumsum_default"))["per region"]
    assert per_region.startswith("region 2: aten_cumsum_default: openvino ")
    assert per_region.endswith(f"-> {searched.chosen[2]}")
    assert first.verify().ok
    assert "placement: measured, chose " in table
    assert list(cache.glob("placement/*.json"))

    # Every partition of the chosen program, and every node it leaves to portable kernels,
    # has its traced time; cumsum's has one elsewhere too, whichever candidate won: the
    # candidates run it on portable kernels and on OpenVINO.
    plan = first.plan
    timed = {item.partition: item for item in placement.partitions}
    assert list(timed) == [p.id for p in plan.partitions] + plan.nodes_on("portable")
    assert all(item.median_us > 0 for item in timed.values())
    cumsum = plan.partition_time("aten_cumsum_default")
    assert cumsum is not None and cumsum in timed.values()
    elsewhere = {a.backend for a in cumsum.alternatives}
    assert elsewhere and cumsum.backend not in elsewhere
    assert elsewhere <= {"openvino", "xnnpack", "portable"}
    measured = dict(plan.explain("aten_cumsum_default"))["measured"]
    assert measured.startswith(f"{cumsum.partition} (1 node) on {cumsum.backend}: ")
    assert "per partition, traced over 30 runs (ExecuTorch's event tracer, ETDump)" in (
        summary_table(plan)
    )

    lines.clear()
    second = composer.compose(model, ["openvino", "xnnpack"], inputs, placement="measured",
                              progress=lines.append)  # fmt: skip
    assert second.plan.placement.cached
    assert second.plan.placement.chosen == placement.chosen
    assert second.plan.placement.partitions == placement.partitions
    # All but whether it came from the cache, as measured: the cache holds the record's JSON.
    assert attrs.evolve(second.plan.placement, cached=False) == placement
    assert lines == [f"placement: measurements from the cache ({placement.chosen})"]

    # New weights are a new program: never a stale hit.
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    third = composer.plan(model, ["openvino", "xnnpack"], inputs, placement="measured",
                          tune_budget=0)  # fmt: skip
    assert not third.placement.cached
    notes = {item.candidate: item.note for item in third.placement.candidates}
    assert [c for c, note in notes.items() if note.startswith("not measured: over the tune")] == [
        "openvino,xnnpack (strict)", "xnnpack,openvino (priority)"
    ]  # fmt: skip
    assert third.placement.regions.notes == ("not searched: over the tune budget of 0 s",)


def printed_config(out: str) -> list[str]:
    """The composer.toml lines a measured plan prints: on one line, or as a block with pins."""
    line = out.split("to reproduce without measuring, in composer.toml:")[1].splitlines()
    if line[0].strip():
        return (
            line[0]
            .strip()
            .replace('", "', '",@"')
            .replace(", ", "\n")
            .replace("@", " ")
            .split("\n")
        )
    return [item.strip() for item in itertools.takewhile(lambda l: l.startswith("    "), line[1:])]


def test_the_cli_prints_the_measurements_and_the_config_that_reproduces_them(
    cache, capsys, tmp_path, monkeypatch
):
    # Whole-program and per-region choices alike: the config printed gives the same plan.
    argv = ["plan", "zoo:cumsum_mlp", "--backends", "openvino,xnnpack"]
    assert main([*argv, "--placement", "measured"]) == 0
    out = capsys.readouterr().out
    assert "placement: measured, chose " in out
    measured_table = out.split("placement: measured")[0]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "composer.toml").write_text("\n".join(printed_config(out)) + "\n")
    assert main(["plan", "zoo:cumsum_mlp"]) == 0
    assert capsys.readouterr().out.startswith(measured_table)

    # A per-region choice is written as node pins, which reproduce it. Whether it wins depends
    # on this machine's load, so the cached choice is made the per-region candidate (the
    # measurements stay): a cache hit composes the chosen candidate and measures nothing.
    (entry,) = cache.glob("placement/*.json")
    stored = json.loads(entry.read_text())
    stored["chosen"] = "openvino,xnnpack (per region)"
    entry.write_text(json.dumps(stored))
    (tmp_path / "composer.toml").unlink()
    assert main([*argv, "--placement", "measured"]) == 0
    out = capsys.readouterr().out
    assert "placement: measured (from the cache), chose openvino,xnnpack (per region)" in out
    config = printed_config(out)
    # Its node pins name nodes of the model decomposed alike for every order.
    assert config[:4] == ['backends = ["openvino", "xnnpack"]', 'placement = "strict"',
                          'keep_whole = "any"', "[never]"]  # fmt: skip
    assert any("node:aten_cumsum_default" in line for line in config)
    (tmp_path / "composer.toml").write_text("\n".join(config) + "\n")
    assert main(["plan", "zoo:cumsum_mlp"]) == 0
    assert capsys.readouterr().out.startswith(out.split("placement: measured")[0])


def test_cache_info_and_clear(cache, capsys):
    model, inputs = zoo.load("mlp")
    # CI time: a budget of 0 s times the first candidates only, and caches the choice alike.
    composer.plan(model, ["xnnpack", "openvino"], inputs, placement="measured", tune_budget=0)
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert f"cache: {cache}" in out and "placement: 1 entry" in out
    assert main(["cache", "clear"]) == 0
    assert "placement: 1 entry" in capsys.readouterr().out
    assert main(["cache", "info"]) == 0
    assert "placement: 0 entries, 0 bytes" in capsys.readouterr().out
    assert cache.is_dir()  # only composer's own subfolders go


def test_trace_times_every_delegate_and_kernel_call_in_order():
    model, inputs = zoo.load("transformer_block")
    composition = composer.compose(model, ["xnnpack"], inputs)
    # 40 calls: a debug buffer for intermediate tensors used to abort the process after 14.
    traced = trace(composition.buffer, composition.example_inputs, 40)
    assert traced is not None
    assert [(s.kind, s.name) for s in traced.steps] == program_instructions(composition.buffer)
    kinds = [s.kind for s in traced.steps]
    assert kinds.count("delegate") == composition.plan.delegate_calls
    assert kinds.count("kernel") >= len(composition.plan.nodes_on("portable"))
    assert ("kernel", "aten::native_layer_norm.out") in [(s.kind, s.name) for s in traced.steps]
    assert all(s.latency.runs == 40 for s in traced.steps)
    assert traced.execute.median_us >= max(s.latency.median_us for s in traced.steps)


def test_unet_gives_the_backends_parts_each_runs_best():
    # The premise of the zoo's unet (bench/RESULTS.md): XNNPACK takes its whole conv trunk but
    # not the softmax over the class channel, which OpenVINO takes as one more call.
    model, inputs = zoo.load("unet")
    alone = composer.plan(model, ["xnnpack"], inputs)
    assert [alone.node_ops[n] for n in alone.nodes_on("portable")] == ["aten._softmax.default"]
    mixed = composer.plan(model, ["xnnpack", "openvino"], inputs)
    assert mixed.delegate_calls == 2
    assert mixed.nodes_on("xnnpack") == alone.nodes_on("xnnpack")
    assert mixed.ops_on("openvino") == {"aten._softmax.default": 1}
    assert mixed.ops_on("xnnpack")["aten.convolution.default"] == 8


class PlacementCrashBackend(BackendDetails):
    @staticmethod
    def preprocess(edge_program, compile_specs) -> PreprocessResult:
        raise RuntimeError("the compiler crashed")


class CumsumCrasher:
    """A CPU backend that takes only cumsum (XNNPACK does not) and whose compiler crashes."""

    spec = BackendSpec("cumsum_crasher", "PlacementCrashBackend")

    @hookimpl
    def composer_backends(self):
        return [self.spec]

    @hookimpl
    def composer_operator_support(self, backend, program):
        return OpNames(["aten.cumsum.default"])


class OpNames(OperatorSupportBase):
    def __init__(self, names) -> None:
        self.names = set(names)

    def is_node_supported(self, submodules, node) -> bool:
        return node.op == "call_function" and composer.op_name(node) in self.names


def test_a_candidate_that_fails_to_lower_is_noted_and_the_rest_measured(cache):
    model, inputs = zoo.load("cumsum_mlp")
    registry = registry_with(CumsumCrasher())
    plan = composer.plan(model, ["xnnpack", "cumsum_crasher"], inputs, placement="measured",
                         registry=registry)  # fmt: skip
    found = {item.candidate: item for item in plan.placement.candidates}
    failed = ["xnnpack,cumsum_crasher (priority)", "cumsum_crasher alone"]
    for label in failed:  # repaired at compose time: the crasher's cumsum went to portable
        assert found[label].note.startswith("moved: cumsum_crasher partition of "), found[label]
        assert "the compiler crashed" in found[label].note
        assert "went to portable x1" in found[label].note
    strict = "xnnpack,cumsum_crasher (strict)"
    assert found[strict].note.startswith("not composed: "), found[strict]
    assert "the compiler crashed" in found[strict].note and found[strict].median_us is None
    assert found["xnnpack alone"].median_us is not None
    # The choice is among what was measured: xnnpack alone, or the per-region search's mix
    # of XNNPACK and portable kernels (the crasher's regions left out), which on cumsum_mlp
    # comes within a few percent of it and on a busy machine can win both rounds.
    chosen = plan.placement.chosen
    assert found[chosen].median_us is not None
    assert plan.nodes_on("cumsum_crasher") == []


def test_hosted_the_search_and_the_partition_times_come_from_each_call_timed(cache):
    """With CUDA in the stack on a GPU every candidate runs hosted (composer.run.piecewise), where
    ETDump sees nothing: the per-region search and the per-partition times then time each
    call there. Here the hosted executor runs OpenVINO and XNNPACK delegates in the runtime."""
    model, inputs = zoo.load("cumsum_mlp")
    stack = composer.Stack(["openvino", "xnnpack"])

    def only(candidate):
        kept = stack.only(candidate.backends, candidate.placement)
        return attrs.evolve(
            kept, never=candidate.never(kept.never), keep_whole=candidate.keep_whole
        )

    lines = []
    choice, composed = placement.measure(
        lambda c: composer.compose(model, only(c), inputs, cache=False),
        list(stack.backends), inputs, key=None, hosted=True, progress=lines.append,
        plan_candidate=lambda c: composer.plan(model, only(c), inputs, cache=False),
    )  # fmt: skip
    hosted = "(hosted, each call timed in Python)"
    # Each backend wherever it can, and the crossings both ways round: no portable kernels.
    assert f"placement: regions: tracing 4 programs together, 50 runs each {hosted}" in lines
    searched = choice.regions
    assert searched.timer == "hosted, each call timed in Python"
    assert searched.max_regions == 8  # each region on CUDA would be an .so to compile
    assert [r.options for r in searched.regions][2] == ("openvino", "portable")
    # Hosted, portable kernels are torch ops in Python: never chosen where a backend can be.
    assert [set(times) for times in searched.region_us] == [
        set(region.options) - {"portable"} for region in searched.regions
    ]
    assert "portable" not in searched.chosen
    assert any(note.startswith("hosted: ops outside the delegates ran in Python")
               for note in searched.notes)  # fmt: skip
    assert set(searched.call_us) == {"openvino", "xnnpack"}
    labels = [m.candidate.label for m in choice.measurements]
    assert labels[-1] == "openvino,xnnpack (per region)"
    # The chosen program's partitions, each with its time as the hosted executor ran it.
    plan = composed[choice.chosen].plan
    timed = {p.partition: p for p in choice.partitions}
    assert list(timed) == [p.id for p in plan.partitions] + plan.nodes_on("portable")
    assert all(p.median_us > 0 for p in timed.values())
    assert choice.traced.timer == "hosted, each call timed in Python"
    assert any(line.startswith("placement: tracing ") and line.endswith(hosted) for line in lines)


def test_a_per_region_candidate_must_beat_every_whole_program_by_the_margin():
    declared = timed(["a", "b"], 100.0)
    other_order = timed(["b", "a"], 50.0)
    mixed = Measurement(
        Candidate(("a", "b"), "strict", (("a", ("node:x",)),)), 1, Latency(49.0, 49.0, 9)
    )
    # 2% faster than the best whole program: a guess from parts, within noise of it.
    assert choose([declared, other_order, mixed]) == other_order.candidate
    clearly = attrs.evolve(mixed, latency=Latency(40.0, 40.0, 9))
    assert choose([declared, other_order, clearly]) == clearly.candidate
    assert clearly.candidate.label == "a,b (per region)"


def test_regions_are_intervals_cut_where_the_places_that_can_run_them_change():
    # a -> b -> c -> d, and e, f beside them: x takes a, b, e, f; y takes b, c; nobody takes d;
    # f has no portable kernel (as aten.max_pool2d has none in ExecuTorch 1.5.1).
    support = {
        "a": frozenset({"x", "portable"}), "b": frozenset({"x", "y", "portable"}),
        "c": frozenset({"x", "y", "portable"}), "d": frozenset({"portable"}),
        "e": frozenset({"x", "portable"}), "f": frozenset({"x"}),
    }  # fmt: skip
    edges = [("a", "b"), ("b", "c"), ("c", "d")]
    order = topological_order(["e", "a", "b", "c", "d", "f"], edges)
    assert order.index("a") < order.index("b") < order.index("c") < order.index("d")
    found = {r.nodes: r.options for r in cut(order, support, ["x", "y"])}
    assert found[("b", "c")] == ("x", "y", "portable")
    assert found[("d",)] == ("portable",)
    assert found[("f",)] == ("x",)
    # Long runs are cut in even pieces; too many regions are merged, smallest first.
    chain = [f"n{i}" for i in range(10)]
    same = dict.fromkeys(chain, frozenset({"x", "portable"}))
    assert [len(r.nodes) for r in cut(chain, same, ["x"], max_nodes=4)] == [4, 4, 2]
    assert [len(r.nodes) for r in cut(chain, same, ["x"], max_nodes=2, max_regions=3)] == [4, 4, 2]


def test_only_ops_the_runtime_has_a_kernel_for_may_go_to_portable_kernels():
    kernels = portable_kernels()
    assert _has_kernel("aten.linear.default", kernels)
    assert _has_kernel("aten.upsample_bilinear2d.vec", kernels)
    assert not _has_kernel("aten.max_pool2d.default", kernels)


def test_layouts_time_every_region_on_every_option_then_the_crossings():
    regions_ = [
        Region(("a",), ("x", "y", "portable")),
        Region(("b",), ("x", "portable")),
        Region(("c",), ("y", "portable")),
        Region(("d",), ("x", "y", "portable")),
    ]
    found = dict(layouts(regions_, ["x", "y"]))
    assert list(found.values()) == [
        ("x", "x", "portable", "x"),  # x wherever it can: what merging saves
        ("x", "portable", "portable", "portable"),  # x's regions, taking turns with portable
        ("portable", "x", "portable", "x"),
        ("y", "portable", "y", "y"),
        ("y", "portable", "y", "portable"),
        ("portable", "portable", "portable", "y"),
        ("x", "x", "y", "y"),  # the crossings between x and y
    ]
    assert list(found)[-1] == "crossings between x and y"
    alternating = [a for what, a in found.items() if "taking turns" in what or "regions on" in what]
    for region, options in zip(regions_, zip(*alternating)):
        assert set(options) == set(region.options)
    # Hosted: no portable kernels to alternate with; the crossings both ways round time
    # every region on every backend that takes it, as a call of its own.
    hosted = dict(layouts(regions_, ["x", "y"], hosted=True))
    assert list(hosted.values()) == [
        ("x", "x", "portable", "x"),
        ("y", "portable", "y", "y"),
        ("x", "x", "y", "y"),
        ("y", "x", "y", "x"),
    ]
    assert list(hosted)[2:] == [
        "crossings between x and y, x first",
        "crossings between y and x, y first",
    ]
    for region, options in zip(regions_, zip(*list(hosted.values())[2:])):
        assert set(options) == set(region.options) - {"portable"}
    # A region that cannot run on portable kernels stays on a backend that takes it.
    only_x = [Region(("a",), ("x", "y", "portable")), Region(("m",), ("x",))]
    assert {assignment[1] for _what, assignment in layouts(only_x, ["x", "y"])} == {"x"}
    # Pins that make a strict plan of [x, y] run each region where a layout says.
    support = {"a": frozenset({"x", "y"}), "b": frozenset({"x"}), "c": frozenset({"y"})}
    assert pins(regions_, ("y", "portable", "y"), ["x", "y"], support) == {
        "x": ("node:a", "node:b")
    }
    assert pins(regions_, ("portable", "x", "portable"), ["x", "y"], support) == {
        "x": ("node:a",),
        "y": ("node:a", "node:c"),
    }


def test_dynamic_programming_weighs_region_times_against_switches_and_calls():
    regions_ = [Region((n,), ("x", "y", "portable")) for n in "abc"]
    # y is faster per region, but each switch costs 5 us and x's calls merge (1 us each).
    measured = Costs(
        ({"x": 3.0, "y": 1.0, "portable": 9.0}, {"x": 3.0, "y": 9.0, "portable": 9.0},
         {"x": 3.0, "y": 1.0, "portable": 9.0}),
        {"x": 1.0, "y": 1.0},
        5.0,
    )  # fmt: skip
    assert cheapest_path(regions_, measured) == (("x", "x", "x"), 7.0)
    cheap_switch = attrs.evolve(measured, between_us=0.0)
    assert cheapest_path(regions_, cheap_switch) == (("y", "x", "y"), 5.0)
    # A call that runs slower after another backend's (its threads still spinning) counts,
    # the program's next run included: y, x, y pays it once, x, x, y at the next run's start.
    slow_after_y = attrs.evolve(cheap_switch, switch_us={("y", "x"): 4.0})
    assert cheapest_path(regions_, slow_after_y) == (("x", "x", "x"), 7.0)


def test_a_switch_costs_even_with_portable_kernels_between():
    regions_ = [Region(("a",), ("x", "y", "portable")), Region(("b",), ("portable",)),
                Region(("c",), ("x", "portable"))]  # fmt: skip
    measured = Costs(
        ({"x": 5.0, "y": 1.0}, {"portable": 1.0}, {"x": 1.0}), {}, 0.0, {("y", "x"): 10.0}
    )
    assert cheapest_path(regions_, measured) == (("x", "portable", "x"), 7.0)


def test_the_search_proposes_the_cheapest_mix_where_one_backend_everywhere_is_cheapest():
    """Every region on one backend is that backend alone, which measured placement times
    whole anyway: the search proposes the cheapest mix, to be timed whole too."""
    regions_ = [Region((n,), ("x", "y")) for n in "abc"]
    # x's calls merge (40 us each saved), so x everywhere is cheapest: 3 * 50 - 2 * 40.
    measured = Costs(
        ({"x": 50.0, "y": 20.0}, {"x": 50.0, "y": 20.0}, {"x": 50.0, "y": 60.0}),
        {"x": 40.0, "y": 5.0},
        0.0,
    )  # fmt: skip
    assert cheapest_path(regions_, measured) == (("x", "x", "x"), 70.0)
    # y, x, x: 20 + 50 + (50 - 40); y, y, x: 20 + (20 - 5) + 50.
    assert cheapest_path(regions_, measured, mixed=True) == (("y", "x", "x"), 80.0)
    assignment, estimate, why = proposal(regions_, measured)
    assert (assignment, estimate) == (("y", "x", "x"), 80.0)
    assert why == (
        "the cheapest estimate puts every region on x (70.0 us), which x alone is, timed "
        "whole; proposed the cheapest mix instead (80.0 us)"
    )
    # A mix, or all on portable kernels (no whole program is), is proposed as it is.
    cheap_y = attrs.evolve(measured, call_us={"x": 0.0, "y": 5.0})
    assert proposal(regions_, cheap_y) == (("y", "y", "x"), 85.0, None)
    portable = [Region((n,), ("x", "portable")) for n in "ab"]
    on_portable = Costs(({"x": 9.0, "portable": 1.0}, {"x": 9.0, "portable": 1.0}), {}, 0.0)
    assert proposal(portable, on_portable) == (("portable", "portable"), 2.0, None)
    # Only one option anywhere: nothing to mix.
    only_x = Costs(({"x": 3.0},), {"x": 1.0}, 0.0)
    assert proposal([Region(("a",), ("x",))], only_x) == (("x",), 3.0, None)


def test_node_pins_reproduce_a_placement_and_unknown_ones_warn():
    model, inputs = zoo.load("cumsum_mlp")
    plan = composer.plan(model, ["xnnpack", "openvino"], inputs, placement="strict",
                         never={"xnnpack": ["node:aten_relu_default"]})  # fmt: skip
    assert plan.backend_of("aten_relu_default") == "openvino"
    assert plan.backend_of("aten_linear_default") == "xnnpack"
    assert ("xnnpack", "pinned off xnnpack by the user (node pin)") in plan.explain(
        "aten_relu_default"
    )
    with pytest.warns(composer.ComposerWarning, match=r"'node:aten_relu' names no node of "
                      r"this program; did you mean node:aten_relu_default\?"):  # fmt: skip
        composer.plan(model, ["xnnpack", "openvino"], inputs, placement="strict",
                      never={"xnnpack": ["node:aten_relu"]})  # fmt: skip


def layout_program(assignment, partitions, calls):
    """A traced layout as ``regions.costs`` reads it: its plan (``partitions``: id -> nodes;
    every other node of a, b, c on portable kernels) and its calls in order (unit, us)."""
    taken = {node: pid.split(":")[0] for pid, nodes in partitions.items() for node in nodes}
    plan = Plan(
        backends=("x", "y"),
        node_backends={n: taken.get(n, "portable") for n in "abc"},
        node_ops=dict.fromkeys("abc", "aten.relu.default"),
        partitions=tuple(
            PlanPartition(pid, pid.split(":")[0], "cpu", tuple(nodes), ("aten.relu.default",))
            for pid, nodes in partitions.items()
        ),
        fallbacks=(),
        delegate_calls=len(partitions),
        crossings=0,
        duplicated_constant_bytes=0,
    )
    steps = [(unit, unit.split(":")[0] if ":" in unit else "portable", Latency(us, us, 9))
             for unit, us in calls]  # fmt: skip
    whole = Latency(sum(us for _unit, us in calls), 0.0, 9)
    traced = ProgramTrace(tuple(StepTime("kernel", u, lat) for u, _w, lat in steps), whole)
    return (assignment, plan, steps, traced)


def test_costs_separate_a_regions_own_time_from_switches_and_merged_calls():
    regions_ = [Region(("a",), ("x", "portable")), Region(("b",), ("x", "portable")),
                Region(("c",), ("x", "y", "portable"))]  # fmt: skip
    programs = [
        # x wherever it can: one call for three regions of 4 + 5 + 6 us alone
        layout_program(("x", "x", "x"), {"x:0": "abc"}, [("x:0", 8.0)]),
        # x's regions taking turns with portable kernels: each region's own time
        layout_program(
            ("x", "portable", "x"),
            {"x:0": "a", "x:1": "c"},
            [("x:0", 4.0), ("b", 1.0), ("x:1", 6.0)],
        ),
        layout_program(
            ("portable", "x", "portable"), {"x:0": "b"}, [("a", 2.0), ("x:0", 5.0), ("c", 3.0)]
        ),
        layout_program(
            ("portable", "portable", "y"), {"y:0": "c"}, [("a", 2.0), ("b", 1.0), ("y:0", 7.0)]
        ),
        # the crossing: c on y right after b on x, 10 us where it takes 7 after portable
        layout_program(
            ("portable", "x", "y"),
            {"x:0": "b", "y:0": "c"},
            [("a", 2.0), ("x:0", 5.0), ("y:0", 10.0)],
        ),
    ]
    measured = costs(regions_, programs)
    assert measured.region_us == (
        {"x": 4.0, "portable": 2.0},
        {"portable": 1.0, "x": 5.0},
        {"x": 6.0, "portable": 3.0, "y": 7.0},
    )
    assert measured.call_us == {"x": 3.5, "y": 7.0}  # (4 + 5 + 6 - 8) / 2; y: its one call
    assert measured.switch_us == {("x", "y"): 3.0}


def test_a_region_that_never_ran_alone_is_estimated_from_the_call_that_held_it():
    # b has no portable kernel: wherever x runs a or c, b's call runs with them on x.
    regions_ = [Region(("a",), ("x", "portable")), Region(("b",), ("x",)),
                Region(("c",), ("x", "portable"))]  # fmt: skip
    programs = [
        layout_program(("x", "x", "x"), {"x:0": "abc"}, [("x:0", 10.0)]),
        layout_program(
            ("portable", "x", "portable"), {"x:0": "b"}, [("a", 2.0), ("x:0", 4.0), ("c", 3.0)]
        ),
    ]
    measured = costs(regions_, programs)
    # 10 us for the call, 2 calls of 4 us saved, less b's own 4 us: 7 us each for a and c.
    assert measured.region_us == ({"portable": 2.0, "x": 7.0}, {"x": 4.0},
                                  {"portable": 3.0, "x": 7.0})  # fmt: skip


@pytest.mark.slow  # CI time: the CLI test above checks the printed config reproduces the plan
def test_a_measured_choice_is_pinned_by_the_config_it_prints(cache, composer_check):
    model, inputs = zoo.load("cumsum_mlp")
    measured = composer.plan(model, "xnnpack,openvino", inputs, placement="measured")
    stack = stack_from_text(measured.placement.config)
    assert stack.placement != "measured"
    # What composer_check (and its golden plan) sees: the measured assignment, not measuring.
    result = composer_check(model, stack, inputs)
    assert result.plan.node_backends == measured.node_backends
    assert result.plan.placement is None
    with pytest.raises(pytest.fail.Exception, match="Measure once, then check with the config"):
        composer_check(model, "xnnpack,openvino", inputs, placement="measured")


def test_slow_programs_are_timed_and_traced_fewer_times(cache, monkeypatch):
    # As if every program's calls were slow (nf_resnet26's XNNPACK alone, 0.72 s a call):
    # each is timed and traced only LEAST_RUNS times, where 100 and 50 took minutes.
    from composer.measure import latency

    monkeypatch.setattr(latency, "SECONDS_PER_PROGRAM", 0.0)
    model, inputs = zoo.load("mlp")
    lines = []
    composition = composer.compose(model, ["openvino", "xnnpack"], inputs, placement="measured",
                                   progress=lines.append)  # fmt: skip
    least = latency.LEAST_RUNS
    fewer = ", ".join([str(least)] * 3)  # mlp's programs: OpenVINO's, XNNPACK's, per region
    assert (
        f"placement: timing 3 distinct program(s), 100 runs each ({fewer} for the slowest)" in lines
    )
    assert any(
        line.startswith("placement: regions: tracing ")
        and f"50 runs each ({', '.join([str(least)] * 6)} for the slowest)" in line
        for line in lines
    ), lines
    assert composition.plan.placement.traced.runs == least
    assert f"per partition, traced over {least} runs" in summary_table(composition.plan)
