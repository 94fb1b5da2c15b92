"""XNNPACK's threads in the ExecuTorch runtime: set once, before programs load, and recorded.

The threadpool is one per process, so each case runs in a fresh interpreter: a pytest worker
has loaded programs already.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from composer import ComposerError, Stack
from composer.config import stack_from_text
from composer.run import runtime, torch_free_runtime


def python(code: str, *, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        check=False, capture_output=True, text=True, cwd=cwd,
    )  # fmt: skip


def test_measured_placement_times_with_the_threads_set_and_its_config_repeats_them(tmp_path):
    done = python(
        """
        import json, warnings
        warnings.simplefilter("ignore")
        import composer
        from composer.models import zoo
        from composer.report.plan_text import summary_table
        from composer.run import cpu_threads
        model, inputs = zoo.load("mlp")
        stack = composer.Stack(["xnnpack"], placement="measured", threads=1)
        composition = composer.compose(model, stack, inputs, cache=False)
        plan = composition.plan
        print(json.dumps({"runtime": cpu_threads.current(),
                          "recorded": plan.placement.threads,
                          "config": plan.placement.config,
                          "summary": summary_table(plan)}))
        try:
            composer.compose(model, composer.Stack(["xnnpack"], threads=2), inputs, cache=False)
        except composer.ComposerError as error:
            print("refused:", error)
        """,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    facts = json.loads(next(line for line in lines if line.startswith("{")))
    assert facts["runtime"] == 1 and facts["recorded"] == 1
    assert "threads = 1" in facts["config"].splitlines()
    assert "placement: measured, chose xnnpack" in facts["summary"]
    assert "  timed with XNNPACK on 1 thread(s)\n" in facts["summary"]
    refused = next(line for line in lines if line.startswith("refused:"))
    assert "cannot give XNNPACK 2 thread(s)" in refused
    assert "loaded programs already, on 1 thread(s)" in refused
    assert "Stack(threads=2) in the first compose" in refused


def test_the_runtime_default_is_not_written_into_the_config(tmp_path):
    done = python(
        """
        import warnings
        warnings.simplefilter("ignore")
        import composer
        from composer.models import zoo
        from composer.run import cpu_threads
        model, inputs = zoo.load("mlp")
        plan = composer.compose(model, ["xnnpack"], inputs, placement="measured", cache=False).plan
        print(cpu_threads.current(), plan.placement.threads, repr(plan.placement.config))
        """,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    runtime, recorded, config = done.stdout.splitlines()[-1].split(" ", 2)
    assert runtime == recorded and int(runtime) >= 1
    assert "threads" not in config


def test_run_on_the_command_line_with_threads(tmp_path):
    pte = tmp_path / "m.pte"
    done = python(
        f"""
        import warnings
        warnings.simplefilter("ignore")
        import composer
        from composer.models import zoo
        model, inputs = zoo.load("mlp")
        composer.compose(model, ["xnnpack"], inputs, cache=False).save({str(pte)!r})
        """,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    command = [sys.executable, "-m", "composer.cli", "run", str(pte), "--compare", "zoo:mlp"]
    done = subprocess.run(
        [*command, "--threads", "1", "--bench", "5"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "XNNPACK on 1 thread(s)" in done.stdout
    assert "compare with zoo:mlp: OK" in done.stdout
    done = subprocess.run([*command, "--threads", "0"], capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert "--threads: must be a whole number >= 1, not '0'" in done.stderr


@pytest.mark.parametrize("threads", [0, -1, True, 1.5, "2"])
def test_threads_that_are_not_a_count_are_refused(threads):
    with pytest.raises(ComposerError, match="threads must be a whole number from 1 to 1024"):
        Stack(["xnnpack"], threads=threads)
    value = f'"{threads}"' if isinstance(threads, str) else str(threads).lower()
    with pytest.raises(ComposerError, match="threads must be a whole number from 1 to 1024"):
        stack_from_text(f'backends = ["xnnpack"]\nthreads = {value}\n')


def test_the_config_sets_the_threads():
    assert stack_from_text('backends = ["xnnpack"]\nthreads = 2\n').threads == 2
    assert Stack(["xnnpack", "openvino"], threads=3).only(["xnnpack"]).threads == 3


@pytest.mark.gpu
@pytest.mark.skipif(
    runtime.torch_mismatch() is None or not torch_free_runtime.backends(),
    reason="composer runs XNNPACK in the pip runtime here; the torch-free one serves under "
    "another torch (the GPU machine's)",
)
def test_the_torch_free_runtime_takes_the_threads_too(tmp_path):
    done = python(
        """
        import warnings
        warnings.simplefilter("ignore")
        import torch, composer
        from composer.models import zoo
        from composer.run import cpu_threads
        from composer.run.piecewise import program_runner
        from composer.run.compare import compare
        model, inputs = zoo.load("mlp")
        before = cpu_threads.current()
        stack = composer.Stack(["xnnpack"], threads=1)
        composition = composer.compose(model, stack, inputs, cache=False)
        runner = program_runner(composition, hosted=True)
        with torch.no_grad():
            ok, worst = compare(runner.run(inputs), model(*inputs))
        names = {name for _, name in runner.module.meta["in_runtime"]}
        print(before, cpu_threads.current(), ok, sorted(names))
        """,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    before, after, ok, names = done.stdout.splitlines()[-1].split(" ", 3)
    assert int(before) > 1 and after == "1" and ok == "True"
    assert "executorch-numpy-runtime" in names


def test_asking_and_setting_the_threads_prints_nothing(tmp_path):
    # Making the pool probes the CPU and logs five lines to stderr ("cpuinfo_utils.cpp:71]
    # Reading file /sys/devices/soc0/image_version"), which `composer lower --bench` printed.
    if runtime.torch_mismatch():
        pytest.skip(runtime.torch_mismatch())
    code = "from composer.run import cpu_threads; cpu_threads.current(); cpu_threads.set_threads(1)"
    run = python(code, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "cpuinfo" not in run.stderr and "threadpool" not in run.stderr, run.stderr
