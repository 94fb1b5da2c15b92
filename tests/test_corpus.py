"""Real architectures (composer/models/corpus.py: torchvision, timm, transformers, random weights)
composed as a user would: the program ran in the ExecuTorch runtime and matched eager.

A few models from different libraries run in the normal suite; every model over every stack
runs with ``pytest -m corpus tests/test_corpus.py`` (long: bench/latency/corpus_bench.py times the
same cases beside plain ExecuTorch).
"""

from __future__ import annotations

import sys

import pytest
import torch

import composer
from composer.cli import main
from composer.contract.errors import ModelError
from composer.models import corpus
from composer.models.model_source import load_model
from composer.report.plan_text import summary_table

RAN = "ran and matched eager"

# One model per library, each a few seconds to compose on 2 cores.
FAST = {"squeezenet": "torchvision", "lcnet": "timm", "whisper_encoder": "transformers"}
FAST_STACKS = {"xnnpack": ["xnnpack"], "openvino-xnnpack": ["openvino", "xnnpack"]}
STACKS = {
    **FAST_STACKS,
    "openvino": ["openvino"],
    "xnnpack-openvino": ["xnnpack", "openvino"],
}


def composed_and_checked(name: str, backends: list[str], **settings) -> composer.Composition:
    """Compose a corpus model and check what its user is promised: the program ran in the
    ExecuTorch runtime and matched eager, at compose time and again in verify()."""
    model, inputs = corpus.load(name)
    composition = composer.compose(model, backends, inputs, **settings)
    plan = composition.plan
    assert plan.proof.startswith(RAN) and "executorch runtime" in plan.proof, plan.proof
    verified = composition.verify()
    assert verified.executor == "executorch runtime", str(verified)
    assert verified.ok, str(verified)
    return composition


def test_the_corpus_is_twenty_or_more_architectures_from_three_libraries():
    libraries = {entry.library for entry in corpus.CORPUS.values()}
    kinds = {entry.kind for entry in corpus.CORPUS.values()}
    assert len(corpus.CORPUS) >= 20
    assert libraries == {"torchvision", "timm", "transformers"}
    assert {"vision", "text", "speech", "recurrent", "detection"} <= kinds
    assert corpus.names("timm") == [n for n, e in corpus.CORPUS.items() if e.library == "timm"]
    assert set(FAST.values()) == libraries and all(corpus.CORPUS[n].library == lib
                                                   for n, lib in FAST.items())  # fmt: skip


def test_torchvision_imports_under_a_cpu_torch_and_builds_with_random_weights():
    # The wheel's extension is built for CUDA torch; the corpus defines its ops first.
    model, inputs = corpus.load("squeezenet")
    assert sys.modules["torchvision"].models.SqueezeNet is type(model)
    assert torch._C._jit_get_schemas_for_operator("torchvision::nms")
    assert not model.training
    with torch.no_grad():
        assert model(*inputs).shape == (1, 10)


def test_batch_norm_statistics_keep_a_deep_network_from_fading():
    # With a fresh batch norm's statistics (mean 0, variance 1) EfficientNet-B0's outputs
    # were about 1e-13: every program, a wrong one too, would have matched eager.
    model, inputs = corpus.load("efficientnet_b0")
    with torch.no_grad():
        assert model(*inputs).std() > 0.1


def test_loading_twice_gives_the_same_weights_and_another_seed_others():
    first, inputs = corpus.load("bert")
    second, _ = corpus.load("bert")
    other, _ = corpus.load("bert", seed=1)
    with torch.no_grad():
        assert torch.equal(first(*inputs), second(*inputs))
        assert not torch.equal(first(*inputs), other(*inputs))


@pytest.mark.parametrize("stack", list(FAST_STACKS))
@pytest.mark.parametrize("name", list(FAST))
def test_a_real_model_composes_runs_and_matches_eager(name, stack):
    backends = FAST_STACKS[stack]
    composition = composed_and_checked(name, backends)
    plan = composition.plan
    # The first backend of the stack takes part of every model here unless the proof moved
    # it off (plan.repairs says why: OpenVINO's bf16 result for PP-LCNet is off by 0.05, over
    # its tolerance of 0.01, and its nodes go to XNNPACK), and only the stack's backends have
    # delegates.
    ids = {"xnnpack": "XnnpackBackend", "openvino": "OpenvinoBackend"}
    assert composition.delegate_backend_ids() <= {ids[b] for b in backends}
    if not plan.repairs:
        assert plan.nodes_on(backends[0]), summary_table(plan)
        assert ids[backends[0]] in composition.delegate_backend_ids()
    else:
        assert all(r.backend == backends[0] for r in plan.repairs), summary_table(plan)
        assert composition.delegate_backend_ids(), "the repaired program still delegates"
    if "openvino" in backends:
        # OpenVINO computes in bf16 on CPUs with bf16 units: its looser tolerance is stated.
        assert set(plan.tolerances) <= {"openvino"}
    else:
        assert plan.tolerance() is None, "XNNPACK alone is held to fp32's default"


def test_a_missing_library_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "timm", None)  # import timm now raises ImportError
    with pytest.raises(ModelError, match=r"pip install 'executorch-composer\[corpus\]'"):
        corpus.load("convnext_atto")


def test_an_unknown_name_lists_the_corpus():
    with pytest.raises(ModelError, match="no corpus model 'resnet1000'.*resnet18"):
        corpus.load("resnet1000")


def test_corpus_models_are_a_model_source(capsys):
    model, inputs = load_model("corpus:squeezenet")
    assert type(model).__name__ == "SqueezeNet" and inputs[0].shape == (1, 3, 64, 64)
    with pytest.raises(ModelError, match="no corpus model 'nope'"):
        load_model("corpus:nope")
    with pytest.raises(ModelError, match="corpus:NAME"):
        load_model("nothing-like-a-model")
    assert main(["plan", "corpus:squeezenet", "--backends", "xnnpack"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["backend", "nodes", "partitions", "ops"]
    assert "xnnpack" in out.splitlines()[1]


# ---------------------------------------------------------------- the whole corpus (-m corpus)


@pytest.mark.corpus
@pytest.mark.parametrize("stack", list(STACKS))
@pytest.mark.parametrize("name", corpus.names())
def test_corpus_model_over_every_stack(name, stack):
    composed_and_checked(name, STACKS[stack])


@pytest.mark.corpus
@pytest.mark.parametrize("name", corpus.names())
def test_corpus_model_with_measured_placement(name):
    composition = composed_and_checked(
        name, ["openvino", "xnnpack"], placement="measured", tune_budget=240
    )
    assert composition.plan.placement.chosen
