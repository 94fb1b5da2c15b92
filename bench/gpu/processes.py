"""Commands run as processes, a few at a time, within time limits: the GPU benches' device
commands compose or export one model a process (a failure or a hang stays in its process), and
a device call has ten minutes."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from pathlib import Path


def run_at_most(
    commands: Sequence[tuple[list[str], Path]],
    parallel: int,
    each: float | None = None,
    total: float | None = None,
) -> None:
    """Run each ``(argv, log)`` with its output in ``log``, ``parallel`` at a time, in order;
    a process is killed after ``each`` seconds, and every one still running, or not started,
    after ``total`` (what a killed one finished stays where it wrote it)."""
    waiting, running = list(commands), []
    end = None if total is None else time.time() + total
    while waiting or running:
        now = time.time()
        over = end is not None and now > end
        if over:
            waiting = []
        for proc, deadline, log in running:
            if over or (deadline is not None and now > deadline):
                proc.kill()
                proc.wait()
                with open(log, "a") as out:  # else a cut process leaves no trace of why
                    limit = "the call's total" if over else f"its {each:g} s"
                    out.write(f"\nrun_at_most: killed at {limit} limit\n")
        running = [(proc, deadline, log) for proc, deadline, log in running
                   if proc.poll() is None]  # fmt: skip
        while waiting and len(running) < parallel:
            argv, log = waiting.pop(0)
            with open(log, "w") as out:
                proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
            running.append((proc, None if each is None else time.time() + each, log))
        if running:
            time.sleep(1)
