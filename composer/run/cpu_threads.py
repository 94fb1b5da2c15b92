"""How many threads the ExecuTorch runtime gives XNNPACK: its CPU threadpool, one per process.

The runtime sizes the pool to the machine's cores. A program of many small ops (an unrolled
recurrence) pays for waking every core at each op: on the H100 machine's 16 cores, a 64-step
RNN then a wide head, the RNN on XNNPACK and the head on CUDA, took 534 us with 16 threads and
380 us with one (bench/RESULTS.md). Measured placement decides at the threads it runs with,
so the threads are a setting (``Stack.threads``, ``threads = N``, ``--threads N``), recorded in
the plan and in what its cache is keyed by.

A loaded XNNPACK delegate keeps the pool it was loaded with, and resizing the pool frees that
one (the runtime's own name for it is ``_unsafe_reset_threadpool``). So the threads are set
before this process loads any program, and composer refuses to change them afterwards."""

from __future__ import annotations

from composer.contract.errors import ComposerError
from composer.registry.names import MAX_THREADS, is_thread_count
from composer.run import torch_free_runtime
from composer.run.loads import has_loaded
from composer.run.runtime import NativeLog, torch_mismatch


def current() -> int | None:
    """The threads of the runtime composer runs programs in here; ``None`` where there is none."""
    pool = _pool()
    if pool is None:
        return None
    with NativeLog().capture():  # asking may make the pool, which logs its CPU probing
        return pool[0]()


def set_threads(count: int) -> None:
    """Give XNNPACK ``count`` threads in this process's runtime, before any program loads."""
    if not is_thread_count(count):
        raise ComposerError(
            f"threads must be a whole number from 1 to {MAX_THREADS}, not {count!r}."
        )
    pool = _pool()
    if pool is None:
        raise ComposerError(
            "threads set, but there is no ExecuTorch runtime here to run programs in "
            "(install executorch for this torch, or executorch-numpy-runtime)."
        )
    get, reset = pool
    with NativeLog().capture():
        now = get()
    if now == count:
        return
    if has_loaded():
        raise ComposerError(
            f"cannot give XNNPACK {count} thread(s): this process has loaded programs already, "
            f"on {now} thread(s), and a loaded XNNPACK delegate keeps the pool it was loaded "
            f"with. Set the threads before anything runs: Stack(threads={count}) in the first "
            f"compose, threads = {count} in the config, or --threads {count}."
        )
    # A new pool probes the CPU and logs that, and its size, to stderr: not the user's
    # business (5 lines in the middle of `composer lower --bench`).
    with NativeLog().capture():
        reset(count)


def _pool():
    """(read the thread count, resize the pool) of the runtime composer uses here, or None."""

    if torch_mismatch() is None:
        from executorch.extension.pybindings import portable_lib

        return portable_lib._threadpool_get_thread_count, portable_lib._unsafe_reset_threadpool
    if torch_free_runtime.backends():
        return torch_free_runtime.thread_count, torch_free_runtime.reset_threads
    return None
