"""The pytest side of ``--composer-flows``: composer's flows in the suite, and their notes.

Registered by composer's pytest plugin (:mod:`composer.testing`) only when the option is given,
so other pytest runs never import ExecuTorch for it.
"""

from __future__ import annotations

from typing import Any

import pytest

from composer.conformance.flows import CASE_NOTES, check_stacks, install_flows, parse_stacks
from composer.models.corpus import define_torchvision_ops

# The suite seeds each case's random inputs from its name plus a run seed, random unless a
# session is open: a fixed one gives composer's flow and plain's the same inputs.
RUN_SEED = 0


def activate(config: pytest.Config, flows_text: str) -> None:
    """Replace the suite's flows before its conftest imports them, and report composer's notes."""
    from executorch.backends.test.suite import reporting

    from composer.contract.errors import ComposerError

    # The suite's model tests import torchvision, whose wheel may be built for another torch.
    define_torchvision_ops()
    stacks = parse_stacks(flows_text)
    if not stacks:
        raise pytest.UsageError(f"--composer-flows={flows_text!r} names no stack")
    try:
        check_stacks(stacks)
    except ComposerError as error:
        raise pytest.UsageError(f"--composer-flows: {error}") from None
    install_flows(stacks)
    if reporting.get_active_test_session() is None:
        reporting.begin_test_session(None, seed=RUN_SEED)
    config.pluginmanager.register(NotesPlugin(), "composer-conformance")


class NotesPlugin:
    """Puts what composer said about each case (proof, repairs, refusal) in the JSON report."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        CASE_NOTES.clear()

    @pytest.hookimpl(optionalhook=True)
    def pytest_json_runtest_metadata(self, item: pytest.Item, call: Any) -> dict[str, Any]:
        return {"composer": list(CASE_NOTES)} if CASE_NOTES else {}
