"""Measured placement chooses as it did when these choices were pinned: a
change to how it gets there (fewer candidates composed, candidates ranked by their plans and
the per-region timings, one proof) must change what it costs, not what it chooses.

The choices and programs below are those main at 9166d4f made on the 2-core CPU this suite runs
on, in three runs (bench/results/placement_choices_before.json; a branch that ranked candidates
made the same, placement_choices_after.json), with ``openvino,xnnpack``: a model whose whole
programs are far apart is pinned to its choice (or the per-region candidate, whose mix is each
run's guess from its own region timings), one whose choice the noise of a shared machine
decides (cumsum_mlp, unet) to the choices seen. Which whole candidates are one program does not
depend on timing: pinned for every model; the per-region candidate's program depends on its
mix, so it is left out of that."""

from __future__ import annotations

import copy

import pytest

import composer
from composer.models import zoo

OV_FIRST = ["openvino,xnnpack (priority)", "openvino,xnnpack (strict)", "openvino alone"]
XNN_FIRST = ["xnnpack,openvino (priority)", "xnnpack alone"]
PER_REGION = "openvino,xnnpack (per region)"

# model -> (the choices seen before, the candidates grouped by the program they lowered to)
BEFORE = {
    # XNNPACK first or alone: 6.4 us; OpenVINO first: 20 us; per region: 6.9 us. On the AVX2
    # machine of 2026-11-28 (no AVX-512) per region won: OpenVINO first (19 us) never does
    "mlp": ({"xnnpack,openvino (priority)", PER_REGION}, [OV_FIRST, XNN_FIRST, [PER_REGION]]),
    # XNNPACK alone: 43 us; OpenVINO first: 59 to 62; XNNPACK first: 264. Per region: 49 to 71
    # here, but its mix is the search's guess of each run and has won (bench/RESULTS.md)
    # Under CI's load (two test workers on two cores) XNNPACK alone once failed to beat the
    # declared order by MARGIN in both rounds, and the declared order stays by design: a choice
    # too, not a regression (fresh-clone .ci/run, 2026-11-27).
    "transformer_block": (
        {"xnnpack alone", PER_REGION, "openvino,xnnpack (priority)"},
        [OV_FIRST, ["xnnpack,openvino (priority)"], ["xnnpack alone"], [PER_REGION]],
    ),
    # XNNPACK alone 6.7 us, per region (all on portable kernels) 6.5: either wins a run
    "cumsum_mlp": (
        {"xnnpack alone", PER_REGION},
        [OV_FIRST, ["xnnpack,openvino (priority)"], ["xnnpack alone"], [PER_REGION]],
    ),
}
SLOW = {
    # XNNPACK first and alone, and OpenVINO first: each was chosen in one run or another (from
    # 0.5 to 8 ms on this shared machine, where unet's threads wait on whatever else runs)
    "unet": (
        {"xnnpack,openvino (priority)", "xnnpack alone", "openvino,xnnpack (priority)"},
        [OV_FIRST, ["xnnpack,openvino (priority)"], ["xnnpack alone"], [PER_REGION]],
    ),
}


def programs(placement) -> list[list[str]]:
    """The candidates that were timed, grouped by program: candidates that lower to the same
    bytes are timed once, so they share every figure of the first round."""
    found: dict[tuple, list[str]] = {}
    for item in placement.candidates:
        if item.median_us is not None:
            key = (item.median_us, item.p90_us, item.best_us)
            found.setdefault(key, []).append(item.candidate)
    return sorted(sorted(group) for group in found.values())


def assert_chooses_as_before(name: str, choices: set[str], before: list[list[str]]) -> None:
    model, inputs = zoo.load(name)
    composition = composer.compose(
        copy.deepcopy(model), ["openvino", "xnnpack"], inputs, placement="measured"
    )
    placement = composition.plan.placement
    assert placement.chosen in choices, placement.candidates
    assert composition.plan.proof.startswith("ran and matched eager"), composition.plan.proof
    # The timed candidates are the programs they were (any not timed taken out of them).
    timed = {i.candidate for i in placement.candidates if i.median_us is not None}
    whole = timed - {PER_REGION}
    expected = [sorted(set(group) & whole) for group in before]
    found = [sorted(set(group) & whole) for group in programs(placement)]
    assert sorted(group for group in found if group) == sorted(group for group in expected if group)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("COMPOSER_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("name", list(BEFORE))
def test_measured_placement_chooses_as_it_did_when_it_composed_every_candidate(name, cache):
    assert_chooses_as_before(name, *BEFORE[name])


@pytest.mark.slow  # about 30 s: unet's candidates run for milliseconds each
@pytest.mark.parametrize("name", list(SLOW))
def test_measured_placement_chooses_as_before_on_larger_models(name, cache):
    assert_chooses_as_before(name, *SLOW[name])
