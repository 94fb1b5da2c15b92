"""What the command line does around a command: Ctrl-C, warnings and upstream chatter."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

from composer.contract.errors import ComposerWarning
from composer.lower.atomic import InterruptedAfterWriting

INTERRUPTED = 128 + signal.SIGINT  # what a shell reports for a program stopped by Ctrl-C


class _Interrupts:
    """Ctrl-C honoured wherever it lands: nothing written, one line, exit 130.

    A KeyboardInterrupt raised inside a weakref callback or ``__del__`` (torch and ExecuTorch
    run many during lowering) is only printed by Python as "Exception ignored in ...", and
    the run would go on to write its files. So the signal is also remembered, and checked
    between backends, before saving and at the end.
    """

    def __init__(self) -> None:
        self.received = False
        self.written: list[Path] = []  # what this run saved, should Ctrl-C come after

    def on_signal(self, signum, frame) -> None:
        self.received = True
        raise KeyboardInterrupt

    def on_unraisable(self, unraisable) -> None:
        if issubclass(unraisable.exc_type, KeyboardInterrupt):
            self.received = True
            return
        sys.__unraisablehook__(unraisable)

    def check(self) -> None:
        if self.received:
            raise KeyboardInterrupt


# Replaced by each run_command, so that a Ctrl-C of one call of composer.cli.main (tests make
# many in one process) does not stop the next: read it as terminal.interrupts, not imported.
interrupts = _Interrupts()


def run_command(command: Callable[[list[str] | None], int], argv: list[str] | None) -> int:
    """``command(argv)``'s exit code, Ctrl-C turned into one line and exit 130, and composer's
    warnings shown as one line. ``argv`` None is composer run as the program."""
    global interrupts
    interrupts = _Interrupts()
    previous_handler = signal.signal(signal.SIGINT, interrupts.on_signal)
    previous_hook, sys.unraisablehook = sys.unraisablehook, interrupts.on_unraisable
    previous_show = warnings.showwarning
    warnings.showwarning = _one_line_warnings(previous_show)
    try:
        code = command(argv)
        interrupts.check()
        return code
    except InterruptedAfterWriting as interrupt:
        print(f"composer: interrupted after writing {interrupt}", file=sys.stderr)
        return _interrupted(argv)
    except KeyboardInterrupt:
        written = ", ".join(map(str, interrupts.written))
        print(f"composer: interrupted after writing {written}" if written else
              "composer: interrupted; nothing was written", file=sys.stderr)  # fmt: skip
        return _interrupted(argv)
    finally:
        # Run as the program (no argv), what is left is the interpreter's exit: a Ctrl-C there
        # would turn a finished run's exit code into a signal death.
        signal.signal(signal.SIGINT, previous_handler if argv is not None else signal.SIG_IGN)
        sys.unraisablehook = previous_hook
        warnings.showwarning = previous_show


def _interrupted(argv: list[str] | None) -> int:
    """Exit 130. Run as the program, leave at once: a finalizer of torch's or ExecuTorch's at
    interpreter exit could otherwise turn 130 into a death by SIGINT (seen once in six runs)."""
    if argv is None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(INTERRUPTED)
    return INTERRUPTED


COMPOSER_DIRECTORY = str(Path(__file__).parent)


def _one_line_warnings(show_otherwise):
    """composer's own warnings as one line, like its errors; the rest as before."""

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if issubclass(category, ComposerWarning) or str(filename).startswith(COMPOSER_DIRECTORY):
            print(f"composer: warning: {message}", file=sys.stderr if file is None else file)
        else:
            show_otherwise(message, category, filename, lineno, file, line)

    return show


# Lines upstream libraries log on every command that are not the user's business: torchao's
# optional kernels that do not load on this machine, torch's notice about an enum a library
# registers. Set before torch is imported, as the loggers are created at import.
UPSTREAM_LOGGERS = ("torchao", "torch.utils._pytree")
# Loggers torch manages: it resets their levels when it is imported, after this runs, so their
# records below ERROR are filtered instead. symbolic_shapes warns "Unable to find user code"
# before the one-line error of a model torch.export cannot trace.
TORCH_LOGGERS = ("torch.fx.experimental.symbolic_shapes",)
# Inductor's autotuning logs each candidate kernel that does not fit or fails ("OutOfResources:
# shared memory", with a traceback) and goes on with the others: on a compose that succeeds a
# user reads them as failures. A choice that leaves none fails the compile, which composer
# reports in its own words; so every record of these, errors included, is off the terminal.
INDUCTOR_LOGGERS = ("torch._inductor.select_algorithm", "torch._inductor.autotune_process")
# Files whose plain prints to stderr are dropped: torch.export prints the partial graph of a
# failed export (20 lines and more) before raising the error composer reports in one line.
UPSTREAM_PRINTERS = (
    os.path.join("torch", "export", "_trace.py"),
    # "SingleProcess AUTOTUNE benchmarking takes 1.56 seconds ...", once per autotuned kernel.
    os.path.join("torch", "_inductor", "select_algorithm.py"),
)
UPSTREAM_WARNINGS = (
    # ExecuTorch warns for every program whose buffers the model updates in place (a KV cache).
    "Mutation on a buffer in the model is detected",
)


@contextlib.contextmanager
def upstream_quieted(debug: bool) -> Iterator[None]:
    """Keep upstream chatter off the terminal (``--debug`` shows everything)."""
    if debug:
        yield
        return
    loggers = [logging.getLogger(name) for name in UPSTREAM_LOGGERS]
    levels = [logger.level for logger in loggers]
    torch_loggers = [logging.getLogger(name) for name in TORCH_LOGGERS]
    inductor_loggers = [logging.getLogger(name) for name in INDUCTOR_LOGGERS]
    # coremltools draws tqdm bars for every conversion pass; tqdm reads TQDM_* once, when
    # it is imported, which the backends do lazily, after this.
    if "tqdm" not in sys.modules:
        os.environ.setdefault("TQDM_DISABLE", "1")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        # torchao's sources have invalid escapes, compiled (and warned of) on first import.
        warnings.filterwarnings("ignore", category=SyntaxWarning)
        for message in UPSTREAM_WARNINGS:
            warnings.filterwarnings("ignore", message=message)
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        for logger in torch_loggers:
            logger.addFilter(_errors_only)
        for logger in inductor_loggers:
            logger.addFilter(_nothing)
        stderr, sys.stderr = sys.stderr, _StderrWithout(sys.stderr, UPSTREAM_PRINTERS)
        try:
            yield
        finally:
            sys.stderr = stderr
            for logger in torch_loggers:
                logger.removeFilter(_errors_only)
            for logger in inductor_loggers:
                logger.removeFilter(_nothing)
            for logger, level in zip(loggers, levels):
                logger.setLevel(level)


def _errors_only(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.ERROR


def _nothing(record: logging.LogRecord) -> bool:
    return False


class _StderrWithout:
    """``stream`` less what code in the ``printers`` files writes to it directly (``print``)."""

    def __init__(self, stream, printers: tuple[str, ...]) -> None:
        self._stream = stream
        self._printers = printers

    def write(self, text: str) -> int:
        # print() is C code: the frame above write is the one that called print.
        if sys._getframe(1).f_code.co_filename.endswith(self._printers):
            return len(text)
        return self._stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


NARROWEST_COLUMN = 12  # a column is wrapped no narrower than this, whatever the terminal
COLUMN_GAP = 2  # what tabulate's "plain" format puts between columns, and around a header


def width() -> int | None:
    """The terminal's width where output goes to one (or ``$COLUMNS`` is set); None where it
    goes to a file or a pipe, whose reader wants whole rows."""
    if "COLUMNS" not in os.environ and not sys.stdout.isatty():
        return None
    return shutil.get_terminal_size().columns


def column_limits(rows: list[tuple[str, ...]], columns: int | None) -> list[int | None]:
    """The widest each column of ``rows`` (the first: headers) may be for the table to fit
    ``columns`` characters (None: as wide as it is); the widest columns give way first."""
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    if columns is None:
        return [None] * len(widths)
    # A column is never narrower than its header and tabulate's padding around it.
    floors = [max(NARROWEST_COLUMN, len(header) + COLUMN_GAP) for header in rows[0]]
    limits = [max(w, f) for w, f in zip(widths, floors)]
    budget = columns - COLUMN_GAP * (len(widths) - 1)
    while sum(limits) > budget:
        shrinkable = [i for i, limit in enumerate(limits) if limit > floors[i]]
        if not shrinkable:
            break
        limits[max(shrinkable, key=limits.__getitem__)] -= 1
    return [None if limit >= wide else limit for limit, wide in zip(limits, widths)]
