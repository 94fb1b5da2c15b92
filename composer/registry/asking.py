"""Saying which plugin is being asked when its answer takes long.

A plugin's hook may hang or take minutes (a support check that compiles, a sleep); composer
would sit silent and then report the work as quick. Every question to a plugin goes through
:func:`asking`; one daemon thread watches the questions in flight and, once one has taken
``SLOW_ANSWER_S`` seconds (then twice that, four times...), tells the progress sink of the
compose that asked (:func:`telling`), or logs it at INFO on the ``composer`` logger.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator

from composer.contract import environment

# Seconds before composer says it is still waiting for a plugin: None reads
# $COMPOSER_SLOW_ANSWER_S (default 5) when a question is asked; the constant may be set (the
# tests do).
SLOW_ANSWER_S: float | None = None


def slow_answer_s() -> float:
    """The seconds after which a question in flight is named (a wrong variable: ComposerError)."""
    if SLOW_ANSWER_S is not None:
        return SLOW_ANSWER_S
    return environment.seconds(environment.SLOW_ANSWER_S, 5.0)


Tell = Callable[[str], None]
_sink: contextvars.ContextVar[Tell | None] = contextvars.ContextVar("composer_sink", default=None)
# The clocks (composer.registry.asking.counting) that the answers' time goes to.
_clocks: contextvars.ContextVar[tuple[Clock, ...]] = contextvars.ContextVar(
    "composer_clocks", default=()
)
_logger = logging.getLogger("composer")


class _Question:
    """One question in flight: who is asked what, since when, and where to tell."""

    def __init__(self, who: str, what: str, tell: Tell) -> None:
        self.who, self.what, self.tell = who, what, tell
        self.started = time.monotonic()
        self.next_notice = slow_answer_s()
        self.told = False

    def notice_due(self, now: float) -> str | None:
        waited = now - self.started
        if waited < self.next_notice:
            return None
        self.next_notice = max(self.next_notice * 2, waited)
        self.told = True
        return f"still asking {self.who} ({self.what}) after {waited:.1f} s"


_in_flight: dict[int, _Question] = {}
_watcher: list[threading.Thread] = []
_watcher_lock = threading.Lock()


class Clock:
    """Seconds the plugins took to answer within a :func:`counting` block."""

    seconds: float = 0.0


@contextlib.contextmanager
def counting() -> Iterator[Clock]:
    """Within this block, the time every question to a plugin takes is added to the clock
    given (a backend's partitioning counts the answers it waited for before it began)."""
    clock = Clock()
    token = _clocks.set((*_clocks.get(), clock))
    try:
        yield clock
    finally:
        _clocks.reset(token)


@contextlib.contextmanager
def telling(progress: Tell | None) -> Iterator[None]:
    """Within this block, notices of slow answers go to ``progress`` (a compose's progress);
    with ``None``, where they went around it (``composer plan``'s stderr), else to the log."""
    if progress is None:
        yield
        return
    token = _sink.set(progress)
    try:
        yield
    finally:
        _sink.reset(token)


@contextlib.contextmanager
def asking(who: str, what: str) -> Iterator[None]:
    """Ask ``who`` (``plugin 'x'``) ``what`` (a hook's name) in this block, watched."""
    question = _Question(who, what, _sink.get() or _logger.info)
    thread = threading.get_ident()
    outer = _in_flight.get(thread)  # a plugin's hook may ask composer, which asks again
    _in_flight[thread] = question
    _start_watching()
    try:
        yield
    finally:
        waited = time.monotonic() - question.started
        if outer is None:
            _in_flight.pop(thread, None)
            for clock in _clocks.get():  # a question asked within an answer is counted in it
                clock.seconds += waited
        else:
            _in_flight[thread] = outer
        if question.told:
            question.tell(f"{who} answered {what} after {waited:.1f} s")


def _forget_the_watcher() -> None:
    # A forked child (composer's parallel lowering) has no watcher thread, only the record.
    _watcher.clear()
    _in_flight.clear()


os.register_at_fork(after_in_child=_forget_the_watcher)


def _start_watching() -> None:
    if _watcher:
        return
    with _watcher_lock:
        if not _watcher:
            thread = threading.Thread(target=_watch, name="composer-slow-answers", daemon=True)
            thread.start()
            _watcher.append(thread)


def _watch() -> None:
    """Forever: every fraction of the threshold, tell about each question now overdue."""
    while True:
        time.sleep(min(1.0, slow_answer_s() / 4))
        now = time.monotonic()
        for question in list(_in_flight.values()):
            notice = question.notice_due(now)
            if notice is not None:
                question.tell(notice)
