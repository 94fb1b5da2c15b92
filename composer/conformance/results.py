"""The suite's JSON report (pytest-json-report), read back as one table per flow.

Each case is counted once per flow: passed (and whether anything was delegated: a flow that
lowers nothing passes every case, so such passes are counted apart), failed, skipped. Where
composer's flow and the plain flow of the same stack disagree on a case, the table says which
one failed and why: the suite's verdict, and what composer's proof or repair said.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from composer.conformance.flows import COMPOSER_PREFIX

PASSED = ("passed", "xpassed")
FAILED = ("failed", "error")


@attrs.frozen
class Case:
    """One test of the suite in one flow, as the JSON report has it."""

    flow: str
    key: str  # the test's id without the flow: the same case in every flow
    outcome: str  # passed | failed | skipped
    delegated: bool
    seconds: float
    why: str  # the suite's verdict where it did not pass
    composer: tuple[str, ...]  # composer's proof, repairs or refusal for this case
    ended: bool = True  # False where the worker running it died: failed, its time unknown


def _split_id(nodeid: str) -> tuple[str, str]:
    """``dir/test_a.py::test_x[flow-float32]`` -> (``flow``, ``test_a.py::test_x[float32]``)."""
    base, _, params = nodeid.rsplit("/", 1)[-1].partition("[")
    flow, _, rest = params.rstrip("]").partition("-")
    return flow, f"{base}[{rest}]" if rest else base


def _outcome(test: Mapping[str, Any]) -> str:
    outcome = test["outcome"]
    if outcome in PASSED:
        return "passed"
    return "failed" if outcome in FAILED else "skipped"


def _why(test: Mapping[str, Any], subtests: list[Mapping[str, Any]]) -> str:
    for sub in subtests:
        if sub.get("Result") not in (None, "Pass"):
            error = (sub.get("Error") or "").strip().splitlines()
            worst = sub.get("Output 0 Error Max")
            detail = sub.get("Result Detail") or sub.get("Result")
            return "; ".join(
                x for x in (detail, f"max error {worst}" if worst else "", error and error[0]) if x
            )
    if test["outcome"] == "skipped":
        return str(test.get("setup", {}).get("longrepr", ""))[-200:]
    return ""


CRASHED = (
    "its pytest-xdist worker died while running it ('dmesg' says whether the OOM killer took it)"
)


def _crashed(test: Mapping[str, Any]) -> bool:
    """pytest-xdist reports a case whose worker died as failed in 0 s, in a phase of its own
    (``???``), with no call: killed by the OOM killer, a composer case did not fail quickly."""
    return any(
        "crashed while running" in str(phase.get("longrepr", ""))
        for phase in test.values()
        if isinstance(phase, Mapping)
    )


def _composer_lines(notes: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    lines = []
    for note in notes:
        if "refused" in note:
            lines.append(f"refused: {note['refused']}")
            continue
        lines.append(f"proof: {note['proof']}")
        lines += [f"repair: {r}" for r in note["repairs"]]
    return tuple(dict.fromkeys(lines))  # several subtests often say the same


def read_cases(report: Mapping[str, Any]) -> list[Case]:
    """Every case of a pytest-json-report report of the suite."""
    cases = []
    for test in report.get("tests", []):
        if test.get("outcome") == "passed" and "call" not in test:
            # Set up, never called: a run stopped (Ctrl-C, a deadline) while the case ran is
            # reported "passed" by pytest-json-report, with its setup alone.
            continue
        flow, key = _split_id(test["nodeid"])
        metadata = test.get("metadata") or {}
        subtests = metadata.get("subtests") or []
        seconds = sum(test.get(p, {}).get("duration", 0.0) for p in ("setup", "call", "teardown"))
        delegated = any(s.get("Delegated") == "True" for s in subtests)
        crashed = _crashed(test)
        why = CRASHED if crashed else _why(test, subtests)
        notes = _composer_lines(metadata.get("composer") or [])
        cases.append(Case(flow, key, _outcome(test), delegated, seconds, why, notes, not crashed))
    return cases


@attrs.frozen
class FlowCounts:
    """One flow's row of the table."""

    flow: str
    passed: int
    passed_undelegated: int
    failed: int
    skipped: int
    seconds: float
    # Undelegated passes whose delegates composer's proof found wrong and moved off: its
    # lowering took them, so they do not say the flow is broken (OpenVINO's int8 linear,
    # 0.196 off on an AVX2 CPU, 2026-11-28).
    passed_moved_off: int = 0

    @property
    def lowered_nothing(self) -> bool:
        """Every pass ran undelegated, none by a repair: the flow's lowering took nothing (a
        broken flow)."""
        return (
            self.passed > 0 and self.passed_undelegated == self.passed and not self.passed_moved_off
        )


def _moved_off(case: Case) -> bool:
    return not case.delegated and any(line.startswith("repair:") for line in case.composer)


def flow_counts(cases: Iterable[Case]) -> list[FlowCounts]:
    """Passed, failed, skipped and seconds per flow, in the order the flows first appear."""
    by_flow: dict[str, list[Case]] = {}
    for case in cases:
        by_flow.setdefault(case.flow, []).append(case)
    rows = []
    for flow, flow_cases in by_flow.items():
        passed = [c for c in flow_cases if c.outcome == "passed"]
        rows.append(
            FlowCounts(
                flow,
                len(passed),
                sum(not c.delegated for c in passed),
                sum(c.outcome == "failed" for c in flow_cases),
                sum(c.outcome == "skipped" for c in flow_cases),
                sum(c.seconds for c in flow_cases),
                sum(_moved_off(c) for c in passed),
            )
        )
    return rows


def verdict(case: Case) -> str:
    """``passed``, ``passed undelegated``, ``failed`` or ``skipped``."""
    undelegated = case.outcome == "passed" and not case.delegated
    return case.outcome + (" undelegated" if undelegated else "")


@attrs.frozen
class Difference:
    """A case composer's flow and the plain flow of its stack judged (or delegated) differently."""

    stack: str
    key: str
    composer: Case
    plain: Case


def differences(cases: Iterable[Case]) -> list[Difference]:
    """Each case where ``composer_<stack>`` and ``<stack>`` differ in outcome or delegation."""
    by_flow_key = {(c.flow, c.key): c for c in cases}
    found = []
    for (flow, key), composed in by_flow_key.items():
        if not flow.startswith(COMPOSER_PREFIX):
            continue
        stack = flow.removeprefix(COMPOSER_PREFIX)
        plain = by_flow_key.get((stack, key))
        if plain is not None and verdict(plain) != verdict(composed):
            found.append(Difference(stack, key, composed, plain))
    return found


def load(path: str | Path) -> list[Case]:
    """The cases of a JSON report written by ``pytest --json-report``."""
    return read_cases(json.loads(Path(path).read_text()))


def write_suite_csv(report_path: str | Path, csv_path: str | Path) -> int:
    """The suite's own CSV (its columns, one row per subtest) from the JSON report; rows written."""
    from executorch.backends.test.suite.reporting import CSV_FIELD_NAMES

    report = json.loads(Path(report_path).read_text())
    rows = [
        sub
        for test in report.get("tests", [])
        for sub in test.get("metadata", {}).get("subtests", [])
    ]
    with open(csv_path, "w", newline="") as output:
        writer = csv.DictWriter(output, CSV_FIELD_NAMES, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return len(rows)
