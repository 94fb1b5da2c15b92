"""The latency table ``--bench`` prints: per program, delegate calls, fastest call, median,
p90, speed against eager and the largest error.
"""

from __future__ import annotations

from collections.abc import Sequence

from tabulate import tabulate

from composer.measure.singles import ProgramLatency


def latency_table(rows: Sequence[ProgramLatency]) -> str:
    """A plain-text table of ``rows``: each program's fastest call, its median and p90 over
    every call, and its speed relative to eager by the medians.

    By the medians, as measured placement chooses (``placement.choose``): a mixed program's
    calls vary widely, and a lucky fastest call made one look faster than the program its
    median showed it slower than. The fastest call stays, as its own column, for what a call
    costs without load.
    """
    eager = next((r.latency.median_us for r in rows if r.program == "eager"), None)
    table = [("program", "delegate calls", "fastest us", "median us", "p90 us",
              "median speed vs eager", "max |err|")]  # fmt: skip
    for row in rows:
        best = row.latency.best_us
        table.append((
            row.program,
            "-" if row.delegate_calls is None else str(row.delegate_calls),
            "-" if best is None else f"{best:.1f}",
            f"{row.latency.median_us:.1f}",
            f"{row.latency.p90_us:.1f}",
            f"{eager / row.latency.median_us:.2f}x" if eager else "-",
            "-" if row.max_abs_error is None else f"{row.max_abs_error:.3g}",
        ))  # fmt: skip
    return tabulate(table[1:], headers=table[0], tablefmt="plain", disable_numparse=True)
