"""ExecuTorch's own C++ runtime as an executor (composer.run.cpp_runtime): its tensor file
format and how it is named. Running it needs the runner built on the GPU machine
(bench/et_runtime), where tests/test_gpu.py runs composer's CUDA programs in it."""

from __future__ import annotations

import os

import pytest
import torch

import composer
from composer import ComposerError
from composer.report.plan_text import summary_table
from composer.run import cpp_runtime


def test_tensors_round_trip_through_the_runners_file_format(tmp_path):
    tensors = [torch.randn(2, 3), torch.arange(5), torch.ones(0, 4), torch.tensor([True, False]),
               torch.randn(3).to(torch.bfloat16)]  # fmt: skip
    path = tmp_path / "t.bin"
    cpp_runtime.write_tensors(path, tensors)
    back = cpp_runtime.read_tensors(path)
    assert [t.dtype for t in back] == [t.dtype for t in tensors]
    for got, want in zip(back, tensors, strict=True):
        assert torch.equal(got, want)


def test_a_runner_variable_naming_no_program_is_an_error_that_says_what_to_do(
    monkeypatch, tmp_path
):
    monkeypatch.setenv(cpp_runtime.RUNNER_VARIABLE, str(tmp_path / "missing"))
    with pytest.raises(ComposerError, match="no executable file: build the runner"):
        cpp_runtime.runner_path()


def test_a_load_that_fails_for_want_of_a_kernel_names_the_operator():
    # As ExecuTorch's runtime logs it (operator_registry.cpp, method.cpp) when a program keeps
    # an op the runtime has no kernel for: the runner's error then leads with it.
    stderr = (
        "E 00:00:00.2 executorch:operator_registry.cpp:275] kernel 'aten::linear.out' not found.\n"
        "E 00:00:00.2 executorch:operator_registry.cpp:278] dtype: 15 | dim order: [\n"
        "E 00:00:00.2 executorch:operator_registry.cpp:278] ]\n"
        "E 00:00:00.2 executorch:method.cpp:824] Missing operator: [7] aten::linear.out\n"
        "E 00:00:00.2 executorch:method.cpp:824] Missing operator: [9] llama::sdpa.out\n"
    )
    assert cpp_runtime.missing_kernels(stderr) == ["aten::linear.out", "llama::sdpa.out"]
    assert cpp_runtime.missing_kernels("E method.cpp] Invalid program") == []
    assert cpp_runtime.errors_logged(stderr + "I 00:00:00.3 executorch:cpuinfo_utils.cpp:71] x\n")[
        -2:
    ] == ["Missing operator: [7] aten::linear.out", "Missing operator: [9] llama::sdpa.out"]


def test_without_the_variable_the_pip_runtime_runs_what_it_can():
    assert os.environ.get(cpp_runtime.RUNNER_VARIABLE) is None or pytest.skip("runner set here")
    assert cpp_runtime.runner_path() is None


ET_RUNNER = os.environ.get(cpp_runtime.RUNNER_VARIABLE)


@pytest.mark.gpu
@pytest.mark.skipif(
    torch.version.cuda is None or not torch.cuda.is_available() or not ET_RUNNER,
    reason="needs a CUDA GPU and ExecuTorch's C++ runtime built (bench/et_runtime/build.sh), "
    "named by $COMPOSER_ET_RUNNER",
)
@pytest.mark.parametrize("stack", [["xnnpack", "cuda"], ["cuda"]], ids=",".join)
def test_a_kv_cache_carries_across_calls_of_one_program_in_executorchs_runtime(tmp_path, stack):
    import composer
    from composer.models import zoo

    # llama_decoder writes its KV cache in place (index_copy_): a decoding loop of 3 steps, 4 new
    # tokens each, in one loaded program, against eager stepping from a fresh model. The CUDA
    # delegates own the caches (BackendSpec.keeps_state): the runtime keeps them between calls.
    model, inputs = zoo.load("llama_decoder")
    composition = composer.compose(model, stack, inputs)
    assert "CudaBackend" in composition.delegate_backend_ids()
    assert sum(len(p.state) for p in composition.plan.partitions_of("cuda")) == 4
    pte = composition.save(tmp_path / "m.pte")
    steps = [
        (torch.randint(0, 64, (1, 4), generator=torch.Generator().manual_seed(step)),
         torch.arange(4 * step, 4 * step + 4))
        for step in range(3)
    ]  # fmt: skip
    with torch.no_grad():
        eager = zoo.load("llama_decoder")[0]
        expected = [eager(*step) for step in steps]
        fresh = [zoo.load("llama_decoder")[0](*step) for step in steps]
    report = cpp_runtime.run_pte_detailed(
        ET_RUNNER, pte, sorted(tmp_path.glob("*.ptd")), None, repeats=0, warmup=0, steps=steps
    )
    errors = [(got[0] - want).abs().max().item()
              for got, want in zip(report["step_outputs"], expected, strict=True)]  # fmt: skip
    print(f"{cpp_runtime.EXECUTOR}, llama_decoder {stack}, steps vs eager: {errors}")
    assert max(errors) < 1e-4
    # A program that dropped its cache between calls would be far off from the second step on.
    assert min((a - b).abs().max().item() for a, b in zip(fresh[1:], expected[1:])) > 1e-2


VULKAN_RUNNER = os.environ.get("COMPOSER_VULKAN_RUNNER")


@pytest.mark.gpu  # on the GPU machine, with NVIDIA's Vulkan driver: -m gpu selects it
@pytest.mark.skipif(
    not VULKAN_RUNNER,
    reason="needs a runner built with ExecuTorch's Vulkan backend (bench/et_runtime/vulkan) and "
    "a Vulkan driver, named by $COMPOSER_VULKAN_RUNNER",
)
def test_vulkan_delegates_are_proven_and_checked_alone_in_the_runner(monkeypatch):
    # No Python runtime has VulkanBackend: each delegate of a program that failed is run
    # alone in the runner, so only those that fail there move (ExecuTorch 1.5.1's Vulkan
    # partitioner claims logical_not, which the runtime of 2026-08-22 has no operator for:
    # "Missing operator: aten.logical_not.default"), not every Vulkan partition. The option
    # OFF, as the partitioner's default: composer's own (ON) never offers it.
    from composer.models import zoo

    monkeypatch.setenv(cpp_runtime.RUNNER_VARIABLE, VULKAN_RUNNER)
    model, inputs = zoo.load("transformer_block")
    stack = composer.Stack(["vulkan"], options={"vulkan": {"skip_bool_tensors": "OFF"}})
    composition = composer.compose(model, stack, inputs, cache=False)
    plan = composition.plan
    assert f"({cpp_runtime.EXECUTOR})" in plan.proof
    assert plan.nodes_on("vulkan"), summary_table(plan)
    assert plan.repairs
    for repair in plan.repairs:
        # Each delegate ran alone in the runner: one it failed says so, one that ran and
        # computed wrong was judged against fp64 (on the H200, Vulkan's attention partition:
        # rmse 4.2e-05 where dynamo's rule allows 1.02e-05).
        assert "has no VulkanBackend" not in repair.why, repair.why
        assert cpp_runtime.EXECUTOR in repair.why or "against fp64" in repair.why, repair.why
        if "Missing operator: aten.logical_not.default" in repair.why:
            # only the op the runtime lacks moves; the rest of its partition stays on Vulkan
            assert all(n.startswith("aten_logical_not") for n in repair.nodes), repair.nodes
    assert composition.verify().ok


@pytest.mark.gpu  # on the GPU machine, with NVIDIA's Vulkan driver: -m gpu selects it
@pytest.mark.skipif(
    not VULKAN_RUNNER,
    reason="needs a runner built with ExecuTorch's Vulkan backend (bench/et_runtime/vulkan) and "
    "a Vulkan driver, named by $COMPOSER_VULKAN_RUNNER",
)
def test_measured_placement_times_its_candidates_in_the_runner(monkeypatch, tmp_path):
    # Timed where the programs deploy: hosted timing ranked them otherwise on the H100.
    from composer.models import zoo

    monkeypatch.setenv(cpp_runtime.RUNNER_VARIABLE, VULKAN_RUNNER)
    monkeypatch.setenv("COMPOSER_CACHE_DIR", str(tmp_path))
    model, inputs = zoo.load("mlp")
    composition = composer.compose(model, "vulkan,xnnpack", inputs, placement="measured")
    placement = composition.plan.placement
    timed = [c for c in placement.candidates if c.median_us]
    assert any(c.candidate == "vulkan alone" for c in timed), placement.candidates
    assert placement.regions.notes[0].startswith(
        f"not searched: candidates are timed whole in {VULKAN_RUNNER}"
    )
    assert f"({cpp_runtime.EXECUTOR})" in composition.plan.proof


@pytest.mark.gpu  # on the GPU machine, with NVIDIA's Vulkan driver: -m gpu selects it
@pytest.mark.skipif(
    not VULKAN_RUNNER,
    reason="needs a runner built with ExecuTorch's Vulkan backend (bench/et_runtime/vulkan) and "
    "a Vulkan driver, named by $COMPOSER_VULKAN_RUNNER",
)
def test_bench_times_what_the_pip_runtime_cannot_run_in_the_runner(monkeypatch, capsys, tmp_path):
    from composer.cli import main

    monkeypatch.setenv(cpp_runtime.RUNNER_VARIABLE, VULKAN_RUNNER)
    assert main(["lower", "zoo:mlp", "--backends", "vulkan,xnnpack", "-o",
                 str(tmp_path / "m.pte"), "--bench", "20"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.split()}
    assert "vulkan,xnnpack" in rows and "vulkan" in rows and "xnnpack" in rows
    assert f"vulkan,xnnpack: timed in the {cpp_runtime.EXECUTOR} ({VULKAN_RUNNER})" in out
    assert "not timed" not in out
