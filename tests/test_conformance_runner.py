"""ExecuTorch's backend test suite with every flow's programs run in ExecuTorch's C++ runner.

Where ``$COMPOSER_ET_RUNNER`` names a runner, ``composer conformance`` runs plain's programs and
composer's in it: the pip runtime has no Vulkan backend, and on the GPU machine (another torch)
it does not load at all, so a case passes there only if the runner ran its program. Skips where
no runner is built (CI); runs on the GPU machine with ``-m gpu``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from composer.conformance import command, results
from composer.run import cpp_runtime

pytest.importorskip("pytest_jsonreport")
RUNNER = os.environ.get(cpp_runtime.RUNNER_VARIABLE)
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not RUNNER,
        reason="needs ExecuTorch's C++ runner (bench/et_runtime/build.sh), named by "
        "$COMPOSER_ET_RUNNER",
    ),
]
CASES = "test_linear_unbatched or test_conv2d_padding_modes or test_cat_negative_dim"


def _has_vulkan() -> bool:
    # The runner is stripped: the backend's registered name is in its bytes where it is linked.
    return bool(RUNNER) and b"VulkanBackend" in Path(RUNNER).read_bytes()


STACKS = [["xnnpack"]] + ([["vulkan", "xnnpack"]] if _has_vulkan() else [])


@pytest.mark.parametrize("stack", STACKS, ids=",".join)
def test_the_suite_runs_plain_and_composer_programs_in_the_runner(tmp_path, stack):
    argv = ["conformance", "--stack", ",".join(stack), "-k", CASES, "--report-dir", str(tmp_path)]
    completed = subprocess.run(
        [sys.executable, "-m", "composer.cli", *argv],
        check=False, capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    text = completed.stdout + completed.stderr
    print(text[-4000:])
    assert completed.returncode == 0, text[-4000:]
    cases = results.load(tmp_path / "report.json")
    counts = {row.flow: row for row in results.flow_counts(cases)}
    name = "+".join(stack)
    assert set(counts) == {name, "composer_" + name}, text[-4000:]
    for row in counts.values():
        # Delegated passes: the suite ran those programs, and only the runner could.
        assert row.passed - row.passed_undelegated >= 1, row
    assert not command.lost_cases(cases), text[-4000:]
