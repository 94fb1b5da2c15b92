"""Jobs in local worker processes: the default, with nothing beyond composer's own install.

The driver hands each worker one job at a time, so it knows which job a worker that dies was
running: that job runs again in a new worker (until it has killed ``DEATHS`` of them), and no
other job is touched. Workers ignore Ctrl-C (the driver stops them) and die with the driver.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from composer.fleet.jobs import Job, run_job

DEATHS = 2  # workers a job may kill before it is recorded as failed rather than run again
STOP_SECONDS = 5.0  # how long workers told to stop may take before they are killed


def run_locally(
    jobs: Sequence[Job],
    workers: int,
    bench: int,
    done: Callable[[dict[str, Any]], None],
    placement: str = "priority",
) -> None:
    """Run ``jobs`` in ``workers`` processes, handing each record to ``done`` as it comes.
    Processes are spawned, not forked: each imports torch and ExecuTorch afresh, as a job on
    another machine would."""
    pool = _Pool(workers, (bench, placement), _upstream_quiet_here())
    try:
        pool.run(deque(jobs), done)
    finally:
        pool.stop()  # on Ctrl-C too: queued jobs are dropped, running ones killed


class _Worker:
    """One spawned process and the pipe its jobs and records go through."""

    def __init__(self, context, quiet: bool) -> None:
        self.conn, theirs = context.Pipe()
        self.process = context.Process(target=_serve, args=(theirs, os.getpid(), quiet))
        with _main_left_out():
            self.process.start()
        theirs.close()
        self.job: Job | None = None

    def give(self, job: Job, settings: tuple[int, str]) -> None:
        self.job = job
        self.conn.send(({"model": job.model, "stack": job.stack}, *settings))

    def record(self) -> dict[str, Any] | None:
        """The record it sent, if one is waiting; None if none (or the pipe broke)."""
        try:
            return self.conn.recv() if self.conn.poll() else None
        except (EOFError, OSError):
            return None


class _Pool:
    """Workers started as jobs need them, one job each at a time."""

    def __init__(self, size: int, settings: tuple[int, str], quiet: bool) -> None:
        self.size, self.settings, self.quiet = size, settings, quiet
        self.context = multiprocessing.get_context("spawn")
        self.workers: list[_Worker] = []  # each running a job, or about to
        self.retired: list[_Worker] = []  # told to exit
        self.deaths: Counter[Job] = Counter()

    def run(self, queue: deque[Job], done: Callable[[dict[str, Any]], None]) -> None:
        while queue or self.workers:
            self._hand_out(queue)
            wait([w.conn for w in self.workers] + [w.process.sentinel for w in self.workers])
            for worker in list(self.workers):
                if worker not in self.workers:
                    continue  # retired by _hand_out as this loop went on
                record = worker.record()
                if record is not None:
                    worker.job = None
                    # the next job first: the worker is busy while ``done`` writes this one
                    self._hand_out(queue)
                    done(record)
                elif not worker.process.is_alive():
                    self._buried(worker, queue, done)

    def _hand_out(self, queue: deque[Job]) -> None:
        """Give every idle worker a job, start workers up to ``size``, retire idle ones."""
        for worker in [w for w in self.workers if w.job is None]:
            if queue:
                worker.give(queue.popleft(), self.settings)
            else:
                self._retire(worker)
        while queue and len(self.workers) < self.size:
            worker = _Worker(self.context, self.quiet)
            self.workers.append(worker)
            worker.give(queue.popleft(), self.settings)

    def _buried(self, worker: _Worker, queue: deque[Job], done) -> None:
        """A worker that died: its job runs again, or is recorded failed once it killed enough."""
        self.workers.remove(worker)
        worker.process.join()
        job = worker.job
        if job is None:
            return
        self.deaths[job] += 1
        if self.deaths[job] < DEATHS:
            queue.appendleft(job)
            return
        done({"model": job.model, "stack": job.stack, "ok": False, "worker_died": True,
              "error": f"the worker process died running this job {self.deaths[job]} times "
                       f"({_death(worker.process.exitcode)}): out of memory, or a crash in "
                       "native code (a backend's, torch's); --resume runs it again"})  # fmt: skip

    def _retire(self, worker: _Worker) -> None:
        """Tell an idle worker to exit; it is waited for at the end, not now."""
        with contextlib.suppress(OSError):
            worker.conn.send(None)
        self.workers.remove(worker)
        self.retired.append(worker)

    def stop(self) -> None:
        """Stop the workers still running (after Ctrl-C or an error in ``done``: their jobs
        are not done) and wait for the retired ones; any left after ``STOP_SECONDS`` killed.
        Asked first, not killed: a worker killed leaves its semaphores (tqdm's lock) to the
        resource tracker, which warns of them when the sweep ends."""
        for worker in self.workers:
            worker.process.terminate()
        deadline = time.monotonic() + STOP_SECONDS
        for worker in self.workers + self.retired:
            worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
        self.workers.clear()
        self.retired.clear()


@contextlib.contextmanager
def _main_left_out() -> Iterator[None]:
    """Start a worker without the driver's ``__main__``. A spawned process runs the driver's
    script (or ``-m`` module) again first, so that what the driver pickled from it can be
    found; a script that calls ``composer.sweep()`` without an ``if __name__ == "__main__":``
    guard would start its whole sweep again in every worker (truncating the results file), and
    the worker dies of it. A worker takes only composer's own function and plain data, so it
    is started as from an interactive session, where spawn imports no ``__main__``."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved = {name: vars(main)[name] for name in ("__spec__", "__file__") if name in vars(main)}
    main.__spec__ = None
    vars(main).pop("__file__", None)
    try:
        yield
    finally:
        vars(main).pop("__spec__", None)
        vars(main).update(saved)


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        return f"killed by {signal.Signals(-exitcode).name}"
    return f"exit code {exitcode}"


def _upstream_quiet_here() -> bool:
    """Whether this process keeps upstream chatter quiet (``composer`` without ``--debug``):
    its workers then do too."""
    from composer.contract.quiet import UPSTREAM_LOGGERS

    return logging.getLogger(UPSTREAM_LOGGERS[0]).level >= logging.ERROR


def _serve(conn: Connection, driver: int, quiet: bool) -> None:
    """A worker: run the jobs the driver sends, one at a time, until it sends None or dies."""
    _die_with(driver)
    # Ctrl-C reaches every process of the terminal's group: the driver decides, and stops us
    # with SIGTERM, on which we exit as from the end of a job (finalizers run).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit)
    with _quieted(quiet):
        while True:
            try:
                task = conn.recv()
            except (EOFError, OSError):
                return  # the driver is gone
            if task is None:
                return
            conn.send(run_job(*task))


def _exit(signum, frame) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _quieted(quiet: bool) -> Iterator[None]:
    from composer.contract.quiet import upstream_quieted

    with upstream_quieted(debug=not quiet):
        yield


def _die_with(driver: int) -> None:
    """Die when the driver does (SIGKILL included), rather than live on holding a GiB: the
    kernel's parent-death signal on Linux, else a thread that watches the parent."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
            if os.getppid() != driver:  # it died before the signal was asked for
                os._exit(1)
            return

    def watch() -> None:
        while os.getppid() == driver:
            threading.Event().wait(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="composer-driver-watch").start()
