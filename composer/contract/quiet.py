"""Upstream chatter kept off the user's terminal while composer works, on the command line and
in the Python API alike: torchao's optional kernels that do not load here, torch's notices,
upstream FutureWarnings and DeprecationWarnings, Inductor's autotuning tables. composer's own
warnings (:class:`~composer.contract.errors.ComposerWarning`) and errors still show.

Only while one of composer's calls runs: the warning filters, logger levels and ``sys.stderr``
are the user's again after it. ``debug=True`` on the call, ``$COMPOSER_DEBUG=1`` or
``composer --debug`` shows everything. What native code writes to file descriptor 2 is
:mod:`composer.contract.native_log`'s (``$COMPOSER_NATIVE_LOG``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from composer.contract import environment
from composer.contract.errors import ComposerError

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

# Whether one of composer's calls is under way in this process: the outermost one decides
# (compose runs verify; the command line runs compose), and the calls inside it leave its
# filters alone. Process-wide, not a context variable: warning filters are too.
_under_way = False


@contextlib.contextmanager
def upstream_quieted(debug: bool = False, *, lenient: bool = False) -> Iterator[None]:
    """Keep upstream chatter off the terminal while the block runs, unless ``debug`` or
    ``$COMPOSER_DEBUG`` (a bad value of which is a ComposerError; ``lenient``: taken as off,
    for an import, where the call that follows refuses it); inside another such block, leave
    it as that one decided."""
    global _under_way
    if _under_way:
        yield
        return
    try:
        debug = debug or environment.switch(environment.DEBUG)
    except ComposerError:
        if not lenient:
            raise
    _under_way = True
    try:
        if debug:
            yield
        else:
            with _quieted():
                yield
    finally:
        _under_way = False


Function = TypeVar("Function", bound=Callable[..., Any])


def quiet_call(function: Function) -> Function:
    """``function``, one of composer's public calls, run under :func:`upstream_quieted`; its
    keyword ``debug`` (where it takes one) is the switch."""

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        with upstream_quieted(bool(kwargs.get("debug", False))):
            return function(*args, **kwargs)

    return call  # type: ignore[return-value]


@contextlib.contextmanager
def _quieted() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in UPSTREAM_LOGGERS]
    levels = [logger.level for logger in loggers]
    torch_loggers = [logging.getLogger(name) for name in TORCH_LOGGERS]
    inductor_loggers = [logging.getLogger(name) for name in INDUCTOR_LOGGERS]
    # coremltools draws tqdm bars for every conversion pass; tqdm reads TQDM_* once, when
    # it is imported, which the backends do lazily, after this.
    no_bars = "tqdm" not in sys.modules and "TQDM_DISABLE" not in os.environ
    if no_bars:
        os.environ["TQDM_DISABLE"] = "1"
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
            if no_bars:
                os.environ.pop("TQDM_DISABLE", None)


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
