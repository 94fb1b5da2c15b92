"""A program composer writes has run: the proof at compose time, and the repair of a partition
whose backend fails (tests of composer.run.proof and composer.pipeline.proven)."""

from __future__ import annotations

import pytest
from executorch.exir.backend.backend_details import BackendDetails
from plugins_for_tests import registry_with
from torch.fx.passes.operator_support import OperatorSupportBase

import composer
from composer import BackendSpec, ComposerError, zoo
from composer.contract.hookspecs import hookimpl


class BrittleBackend(BackendDetails):
    """A real ExecuTorch backend whose compiler refuses every partition it is given."""

    @staticmethod
    def preprocess(edge_program, compile_specs):
        raise ValueError("this compiler cannot build aten.linear on this machine")


class LinearsAndRelus(OperatorSupportBase):
    def is_node_supported(self, submodules, node) -> bool:
        return composer.op_name(node) in ("aten.linear.default", "aten.relu.default")


class BrittlePlugin:
    """Claims linears and relus, then fails to lower them: a plugin whose support check
    promises more than its compiler does."""

    def __init__(self) -> None:
        self.spec = BackendSpec("brittle", "BrittleBackend")

    @hookimpl
    def composer_backends(self):
        return [self.spec]

    @hookimpl
    def composer_operator_support(self, backend, program):
        return LinearsAndRelus()


@pytest.fixture
def brittle_registry():
    return registry_with(BrittlePlugin())


def test_a_partition_its_backend_fails_to_lower_goes_to_the_next_backend_and_the_program_runs(
    brittle_registry,
):
    model, inputs = zoo.load("mlp")
    composition = composer.compose(
        model, ["brittle", "xnnpack"], inputs, registry=brittle_registry, cache=False
    )
    plan = composition.plan
    assert plan.nodes_on("brittle") == []
    (repair,) = plan.repairs
    assert repair["backend"] == "brittle"
    assert repair["why"].startswith("failed to lower: ValueError: this compiler cannot build")
    assert repair["moved_to"] == {"xnnpack": len(repair["nodes"])}
    assert plan.proof.startswith("ran and matched eager")
    assert "moved: brittle partition of" in plan.summary_table()
    assert plan.to_dict()["repairs"][0]["moved_to"] == repair["moved_to"]
    verification = composition.verify()
    assert verification.ok and verification.executor == "executorch runtime"


def test_strict_placement_moves_nothing_and_says_which_partition_failed(brittle_registry):
    model, inputs = zoo.load("mlp")
    with pytest.raises(
        ComposerError,
        match=r"failed to lower: BrittleBackend.preprocess raised ValueError: this compiler cannot "
        r"build.*'strict' moves nothing",
    ):
        composer.compose(model, ["brittle", "xnnpack"], inputs, registry=brittle_registry,
                         cache=False, placement="strict")  # fmt: skip


def test_the_proof_runs_by_default_and_check_false_says_it_did_not():
    model, inputs = zoo.load("mlp")
    checked = composer.compose(model, "xnnpack", inputs, cache=False)
    assert checked.plan.proof.startswith("ran and matched eager in ")
    assert "(executorch runtime)" in checked.plan.proof
    unchecked = composer.compose(model, "xnnpack", inputs, cache=False, check=False)
    assert unchecked.plan.proof == "not checked (check=False)"
    assert unchecked.plan.repairs == ()


def test_a_plan_runs_nothing_and_claims_no_proof():
    model, inputs = zoo.load("mlp")
    assert composer.plan(model, "xnnpack", inputs, cache=False).proof == ""
