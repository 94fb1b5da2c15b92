"""The edge programs measured placement shares among its lowerings (composer.lower.shared_edge):
every candidate lowers to the bytes it lowers to alone, so the measurements, and the choices
made from them, are those of lowering each anew."""

from __future__ import annotations

import contextlib
import hashlib

import attrs
import pytest
import torch

import composer
from composer.lower.shared_edge import sharing_edge_programs
from composer.measure.candidates import Candidate, candidates
from composer.models import corpus, zoo
from composer.registry.discovery import default_registry
from composer.registry.stack import Stack

# What measured placement composes with two backends: the five whole programs, and a program of
# the per-region search (node pins, every backend keeping whole what any does).
LAYOUT = Candidate(
    ("openvino", "xnnpack"), "strict", (("openvino", ("node:aten_linear_default",)),), "any"
)


def composed(model, inputs, candidate: Candidate, registry):
    stack = Stack.of(
        list(candidate.backends),
        placement=candidate.placement,
        keep_whole=candidate.keep_whole,
        never={backend: list(pins) for backend, pins in candidate.pins},
    )
    # A registry of its own, as measured placement passes: no whole program from the cache.
    return composer.compose(model, stack, inputs, registry=registry)


def fingerprints(model, inputs, listed, registry):
    found = []
    for candidate in listed:
        composition = composed(model, inputs, candidate, registry)
        plan = composition.plan
        assert plan.proof.startswith("ran and matched eager in ")
        # The proof says how long it took, and nothing else differs between two lowerings.
        found.append((hashlib.sha256(composition.buffer).hexdigest(), attrs.evolve(plan, proof="")))
    return found


@pytest.mark.parametrize("name", ["cumsum_mlp", "transformer_block"])
def test_every_candidate_lowers_to_the_same_program_with_the_edge_programs_shared(
    name, tmp_path, monkeypatch
):
    assert_candidates_lower_alike(*zoo.load(name), tmp_path, monkeypatch)


@pytest.mark.corpus
@pytest.mark.parametrize("name", corpus.names())
def test_corpus_candidates_lower_alike_with_the_edge_programs_shared(name, tmp_path, monkeypatch):
    assert_candidates_lower_alike(*corpus.load(name), tmp_path, monkeypatch)


def assert_candidates_lower_alike(model, inputs, tmp_path, monkeypatch):
    registry = default_registry()
    listed = [*candidates(["openvino", "xnnpack"]), LAYOUT]
    # One cache of lowered partitions for both sides: OpenVINO's compiler does not give the
    # same bytes twice, and the cache answers a partition by its content, so a partition the
    # shared edge program changed is lowered anew, as any other difference shows in the bytes.
    monkeypatch.setenv("COMPOSER_CACHE_DIR", str(tmp_path))
    alone = fingerprints(model, inputs, listed, registry)
    with sharing_edge_programs() as shared:
        together = fingerprints(model, inputs, listed, registry)
    for candidate, (digest, plan), (digest_shared, plan_shared) in zip(
        listed, alone, together, strict=True
    ):
        assert digest_shared == digest, candidate.label
        assert plan_shared == plan, candidate.label
    # The decomposition was made once for the candidates that reach it alike: priority and
    # strict of one order decompose alike, as do every program of the per-region search.
    assert shared.reused.get("run_decompositions", 0) >= len(listed)
    assert shared.reused.get("_generate_edge_program", 0) >= 1


def test_a_parameter_written_in_place_is_lowered_anew(tmp_path, monkeypatch):
    monkeypatch.setenv("COMPOSER_CACHE_DIR", str(tmp_path))
    model, inputs = zoo.load("cumsum_mlp")
    registry = default_registry()
    xnnpack = Candidate(("xnnpack",), "priority")
    with sharing_edge_programs() as shared:
        before = composed(model, inputs, xnnpack, registry)
        with torch.no_grad():
            next(model.parameters()).add_(1.0)
        after = composed(model, inputs, xnnpack, registry)
        assert shared.reused.get("run_decompositions", 0) == 0
    assert after.buffer != before.buffer
    assert after.buffer == composed(model, inputs, xnnpack, registry).buffer
    assert after.verify().ok


def test_sharing_nests_and_puts_the_functions_back():
    # Outside, torch's and ExecuTorch's own functions are in place again.
    from executorch.exir.program import _program
    from torch.export import ExportedProgram

    decompose, generate = ExportedProgram.run_decompositions, _program._generate_edge_program
    collect = torch.export.decomp_utils._collect_all_valid_cia_ops
    with sharing_edge_programs() as outer:
        assert ExportedProgram.run_decompositions is not decompose
        with sharing_edge_programs() as inner:
            assert inner is outer
        assert ExportedProgram.run_decompositions is not decompose
    assert ExportedProgram.run_decompositions is decompose
    assert _program._generate_edge_program is generate
    assert torch.export.decomp_utils._collect_all_valid_cia_ops is collect


def test_measured_placement_lowers_its_candidates_with_the_edge_programs_shared(
    tmp_path, monkeypatch
):
    from composer.pipeline import compose as pipeline

    monkeypatch.setenv("COMPOSER_CACHE_DIR", str(tmp_path))
    entered = []

    @contextlib.contextmanager
    def watched():
        with sharing_edge_programs() as shared:
            entered.append(shared)
            yield shared

    monkeypatch.setattr(pipeline, "sharing_edge_programs", watched)
    model, inputs = zoo.load("cumsum_mlp")
    composition = composer.compose(model, ["openvino", "xnnpack"], inputs, placement="measured")
    assert composition.plan.placement.chosen
    [shared] = entered
    # Six candidates, seven layouts and two plans lowered, most from one decomposition.
    assert shared.reused["run_decompositions"] > shared.made["run_decompositions"]
