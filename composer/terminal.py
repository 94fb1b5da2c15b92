"""What the command line does around a command: Ctrl-C and warnings (upstream chatter is
:mod:`composer.contract.quiet`'s, shared with the Python API)."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import warnings
from collections.abc import Callable
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
