import collections
import os
import warnings

import pytest


def pytest_configure(config):
    # The suite composes the same models with the same stacks many times: one cache for the
    # whole run (xdist workers included) and the next, off the user's own ~/.cache. Keys
    # carry a digest of composer's source, so an edit never meets what old code lowered.
    os.environ.setdefault(
        "COMPOSER_CACHE_DIR", str(config.rootpath / ".pytest_cache" / "composer-cache")
    )


@pytest.fixture(autouse=True)
def _quiet_upstream_warnings():
    # torch and ExecuTorch deprecation chatter is not ours; composer's own warnings are
    # UserWarnings and stay visible to pytest.warns.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        yield


def pytest_terminal_summary(terminalreporter):
    # Each test file's time (setup, call and teardown of its tests, fixtures included),
    # largest first, after pytest's 20 slowest tests: where the run's time goes, so that a file
    # that grows shows before CI nears its limit.
    totals: collections.Counter[str] = collections.Counter()
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                totals[report.nodeid.split("::")[0]] += report.duration
    if not totals:
        return
    terminalreporter.write_sep("=", "time per test file (sum of its tests' setup, call, teardown)")
    for path, seconds in totals.most_common(25):
        terminalreporter.write_line(f"{seconds:9.1f}s {path}")
    terminalreporter.write_line(f"{sum(totals.values()):9.1f}s all {len(totals)} files")
