"""``composer conformance``: the suite's tests over composer's flows and plain's, and the table.

pytest runs in a process of its own, so the suite's conftest imports the flows composer's
pytest plugin puts in (it reads them once, when it is imported), with an empty ini file so
that the caller's pytest settings (addopts, markers) do not change the suite's run.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from composer.conformance import results
from composer.conformance.flows import (
    COMPOSER_PREFIX,
    STACK_JOIN,
    check_stacks,
    default_stacks,
    stack_name,
)
from composer.contract.errors import ComposerError
from composer.lower.atomic import InterruptedAfterWriting, check_outputs

SUITES = {
    "operators": "executorch.backends.test.suite.operators",
    "models": "executorch.backends.test.suite.models",
}


def pytest_command(
    stacks: Sequence[Sequence[str]], report_dir: Path, *, models: bool, keyword: str | None,
    jobs: int | None,
) -> list[str]:  # fmt: skip
    """The pytest command line that runs the suite with these stacks' flows."""
    if importlib.util.find_spec("pytest_jsonreport") is None:
        raise ComposerError(
            "composer conformance reads the suite's JSON report, written by pytest-json-report: "
            "pip install pytest-json-report"
        )
    ini = report_dir / "pytest.ini"
    ini.write_text("[pytest]\n")
    flows = ",".join(stack_name(s) for s in stacks)
    command = [sys.executable, "-m", "pytest", "--pyargs", SUITES["operators"]]
    # A model test file that cannot import (torchaudio not installed) is reported, and the
    # others run.
    command += [SUITES["models"], "--continue-on-collection-errors"] if models else []
    command += ["-c", str(ini), "--rootdir", str(report_dir), "-p", "no:cacheprovider"]
    command += [f"--composer-flows={flows}", "--json-report", f"--json-report-file={report_dir / 'report.json'}"]  # fmt: skip
    command += ["-q", "--tb=no", "--disable-warnings", "-rN"]
    command += ["-k", keyword] if keyword else []
    command += ["-n", str(jobs)] if jobs and jobs > 1 else []
    return command


def worker_environment(jobs: int | None, environ: dict[str, str], cores: int) -> dict[str, str]:
    """The suite's environment: with several pytest-xdist workers, each computes on its share
    of the ``cores`` (``OMP_NUM_THREADS``), unless the user set it. Every worker's torch would
    otherwise run as many threads as there are cores, and where there are fewer cores than
    threads they wait on one another: the float64 run of mobilenet_v2 that the proof judges by
    took 0.05 s on one thread and 0.09 s to 99 s on two beside another process computing on two
    (2 cores)."""
    if not jobs or jobs <= 1 or "OMP_NUM_THREADS" in environ:
        return dict(environ)
    return {**environ, "OMP_NUM_THREADS": str(max(1, cores // jobs))}


NOT_RUN = "delegated nothing, so the suite passed it without running it"


def _ratio(flow: str, seconds: dict[str, dict[str, float]]) -> str:
    """composer's time over plain's, on the cases both flows ran (ended, neither skipped): a
    run stopped by its deadline or Ctrl-C ends more of plain's (the faster) than of
    composer's, and sums over each flow's own cases said 0.80x where the cases both ran took
    1.71x; a flow's skip list skips a case in no time where the other flow
    composes it (plain OpenVINO's skips swin_v2_t, composer ran it for 1,100 s: 3.97x where
    the cases both ran took 1.33x); a case whose worker died is reported in 0 s
    (two OOM-killed cases read 0.95x where the rest took 1.29x)."""
    plain = seconds.get(flow.removeprefix(COMPOSER_PREFIX))
    if not flow.startswith(COMPOSER_PREFIX) or plain is None:
        return ""
    composed = seconds[flow]
    both = composed.keys() & plain.keys()
    plain_seconds = sum(plain[key] for key in both)
    if not plain_seconds:
        return ""
    ratio = f"{sum(composed[key] for key in both) / plain_seconds:.2f}x plain"
    if len(both) < max(len(composed), len(plain)):
        ratio += f" (the {len(both)} case{'s' * (len(both) != 1)} both ran)"
    return ratio


def flow_table(cases: Sequence[results.Case]) -> list[str]:
    """One line per flow: passed (undelegated passes apart), failed, skipped, seconds."""
    rows = results.flow_counts(cases)
    seconds: dict[str, dict[str, float]] = {}
    for case in cases:
        ran = seconds.setdefault(case.flow, {})
        if case.outcome != "skipped" and case.ended:
            ran[case.key] = case.seconds
    width = max([len(r.flow) for r in rows] + [4])
    lines = [f"{'flow':<{width}}  passed  failed  skipped  seconds"]
    for row in rows:
        passed = f"{row.passed}" + (f" ({row.passed_undelegated} undelegated)" if row.passed_undelegated else "")  # fmt: skip
        lines.append(
            f"{row.flow:<{width}}  {passed:>6}  {row.failed:>6}  {row.skipped:>7}  "
            f"{row.seconds:>7.1f}  {_ratio(row.flow, seconds)}".rstrip()
        )
        if row.lowered_nothing:
            lines.append(f"  {row.flow} delegated nothing in any case: its lowering is broken")
    return lines


def difference_lines(cases: Sequence[results.Case]) -> list[str]:
    """For each case composer and plain judged differently: who failed, and why."""
    lines = []
    for diff in results.differences(cases):
        composed, plain = results.verdict(diff.composer), results.verdict(diff.plain)
        lines.append(f"{diff.key} ({diff.stack}): composer {composed}, plain {plain}")
        for who, case in (("plain", diff.plain), ("composer", diff.composer)):
            if case.outcome != "passed" and case.why:
                lines.append(f"  {who}: {case.why}")
            elif who == "plain" and case.outcome == "passed" and not case.delegated:
                lines.append(f"  plain: {NOT_RUN}")
        said = [line for line in diff.composer.composer if not line.startswith("proof")]
        lines += [f"  composer {line}" for line in (said or diff.composer.composer[:1])]
    return lines


def lost_cases(cases: Sequence[results.Case]) -> list[results.Difference]:
    """Cases plain passes, having run them, and composer does not: what ``composer
    conformance`` fails on. The suite passes a case that delegated nothing without running it
    (``SUCCESS_UNDELEGATED``), so plain did not run such a case, and composer, whose proof runs
    the program, may find it does not run here (an operator this runtime has no kernel for)."""
    return [
        d
        for d in results.differences(cases)
        if d.plain.outcome == "passed" and d.plain.delegated and d.composer.outcome != "passed"
    ]


def run(
    stacks: Sequence[Sequence[str]], report_dir: str | Path, *, models: bool = False,
    keyword: str | None = None, jobs: int | None = None,
) -> int:  # fmt: skip
    """Run the suite, write its JSON and CSV reports, print the tables; 0 when composer lost no
    case plain passed and every flow delegated something."""
    report_dir = Path(report_dir)
    _prepare_report_dir(report_dir)
    stacks = list(stacks) or default_stacks()
    check_stacks(stacks)
    print("flows: " + ", ".join(f"{COMPOSER_PREFIX}{stack_name(s)} beside {stack_name(s)}" for s in stacks))  # fmt: skip
    command = pytest_command(stacks, report_dir, models=models, keyword=keyword, jobs=jobs)
    environment = worker_environment(jobs, dict(os.environ), os.cpu_count() or 1)
    exit_code, interrupted = _pytest(command, environment)
    report = report_dir / "report.json"
    if (exit_code not in (0, 1) and not interrupted) or not report.exists():
        if interrupted:
            raise KeyboardInterrupt
        raise ComposerError(f"the suite's run ended with pytest exit code {exit_code}; nothing to report")  # fmt: skip
    cases = results.load(report)
    results.write_suite_csv(report, report_dir / "report.csv")
    if interrupted:
        print("\ninterrupted: the tables count the cases that ran")
    print("\n".join(["", *flow_table(cases), "", *(difference_lines(cases) or ["composer and plain agree on every case"])]))  # fmt: skip
    print(f"\nreports: {report} and {report_dir / 'report.csv'}")
    if interrupted:
        raise InterruptedAfterWriting([report, report_dir / "report.csv"])
    broken = [r for r in results.flow_counts(cases) if r.lowered_nothing]
    return 1 if lost_cases(cases) or broken else 0


def _prepare_report_dir(report_dir: Path) -> None:
    """Make the report folder, refusing first one whose report files are not the suite's own:
    the run replaces them."""
    if report_dir.exists() and not report_dir.is_dir():
        raise ComposerError(f"--report-dir {report_dir} is a file, not a folder: pass a folder.")
    try:
        report_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ComposerError(
            f"cannot make the report folder {report_dir}: {error.strerror}. Pass another "
            "--report-dir."
        ) from error
    outputs = [(report_dir / "pytest.ini", "pytest ini"), (report_dir / "report.json", "suite report"),
               (report_dir / "report.csv", "suite table")]  # fmt: skip
    check_outputs(outputs, remedy="pass another --report-dir, or remove the file.")


# How long pytest may take, after Ctrl-C, to finish its case and write its report; and how
# long composer waits before passing the signal on (a second SIGINT while pytest writes its
# report would lose it, and xdist's workers take seconds to stop).
REPORT_SECONDS = 120
FORWARD_AFTER_SECONDS = 30


def _pytest(command: list[str], environment: dict[str, str]) -> tuple[int, bool]:
    """pytest's exit code, and whether Ctrl-C stopped it. A terminal's Ctrl-C reaches pytest
    too (one process group): it stops after the cases under way and writes its report, which
    is worth waiting for after a long run. A signal sent to composer alone is passed on
    once pytest has not stopped by itself."""
    process = subprocess.Popen(command, env=environment)
    try:
        return process.wait(), False
    except KeyboardInterrupt:
        pass
    try:
        try:
            return process.wait(timeout=FORWARD_AFTER_SECONDS), True
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGINT)
        return process.wait(timeout=REPORT_SECONDS), True
    except (KeyboardInterrupt, subprocess.TimeoutExpired):
        process.kill()  # a second Ctrl-C, or a pytest that would not stop
        process.wait()
        raise KeyboardInterrupt from None


def parse_stack(text: str) -> tuple[str, ...]:
    """``"openvino,xnnpack"`` (the CLI's spelling) or ``"openvino+xnnpack"`` -> the backends."""
    return tuple(b.strip() for b in text.replace(STACK_JOIN, ",").split(",") if b.strip())
