"""The pytest plugin as a user meets it: golden plans written, kept, and a readable diff."""

from __future__ import annotations

import json

# pytester's inline runs drop from sys.modules what was first imported inside them, and torch
# crashes when imported twice in one process; composer's pytest plugin imports it only on use.
import composer.pipeline.compose  # noqa: F401

pytest_plugins = ["pytester"]

USER_TEST = """
from composer.models import zoo

def test_cumsum_mlp_composition(composer_check):
    model, inputs = zoo.load("cumsum_mlp")
    result = composer_check(model, ["tensorrt_stub", "xnnpack"], inputs, golden="cumsum_mlp")
    assert result.verified
"""


def test_golden_plan_is_written_kept_and_a_change_is_explained(pytester):
    pytester.makepyfile(test_user=USER_TEST)
    missing = pytester.runpytest("-p", "no:cacheprovider")
    missing.assert_outcomes(failed=1)
    missing.stdout.fnmatch_lines(["*no golden plan*--composer-update-golden*"])

    pytester.runpytest("-p", "no:cacheprovider", "--composer-update-golden").assert_outcomes(
        passed=1
    )
    golden_file = pytester.path / "golden" / "cumsum_mlp.json"
    golden = json.loads(golden_file.read_text())
    assert golden["ops"]["portable"] == {"aten.cumsum.default": 1}
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)

    # Pretend an upgrade moved relu to xnnpack, and the add with it, in a third delegate.
    golden["ops"]["tensorrt_stub"].pop("aten.relu.default")
    golden["ops"]["xnnpack"] = {"aten.relu.default": 1}
    golden["partitions"].append({"backend": "xnnpack", "ops": {"aten.relu.default": 1}})
    golden["delegate_calls"] = 3
    golden_file.write_text(json.dumps(golden))

    changed = pytester.runpytest("-p", "no:cacheprovider")
    changed.assert_outcomes(failed=1)
    changed.stdout.fnmatch_lines(
        [
            "*the composition changed from golden plan cumsum_mlp.json:",
            "*aten.relu.default: xnnpack x1 -> tensorrt_stub x1",
            "*partitions on xnnpack: 1 -> 0",
            "*delegate calls: 3 -> 2",
            "*--composer-update-golden*",
        ]
    )
    assert '"partitions"' not in changed.stdout.str(), "a diff in words, not a JSON dump"
