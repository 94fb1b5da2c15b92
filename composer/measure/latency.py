"""Timing programs the way a benchmark on a noisy machine must: warm, interleaved, by quantile."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs


@attrs.frozen
class Latency:
    """Wall time of one call, over ``runs`` calls after warm-up, in microseconds.

    ``median_us`` and ``p90_us`` describe every call timed, load included; programs are
    compared by the median (``placement.choose`` says why). ``best_us`` is the fastest call,
    what ``interleaved``'s rounds settle on.
    ``settled`` says whether ``interleaved``'s rounds agreed on it (``None``: not asked).
    """

    median_us: float
    p90_us: float
    runs: int
    best_us: float | None = None
    settled: bool | None = None

    @classmethod
    def of(cls, seconds: Sequence[float], settled: bool | None = None) -> Latency:
        ordered = sorted(seconds)
        p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
        return cls(statistics.median(ordered) * 1e6, p90 * 1e6, len(ordered), ordered[0] * 1e6,
                   settled)  # fmt: skip

    @property
    def rank_us(self) -> float:
        """The fastest call where known, else the median: what ``interleaved`` settles on.
        Programs are compared by the median (``placement.choose``), not by this."""
        return self.median_us if self.best_us is None else self.best_us


BLOCK = 10  # consecutive calls of one candidate before the next takes its turn


TOLERANCE = 0.10  # two rounds agree when their fastest calls differ by at most this fraction


MAX_ROUNDS = 4  # of half the runs each: at most twice the calls asked for


SECONDS_PER_PROGRAM = 2.0  # of calls a slow program is timed for, where its runs would take longer


LEAST_RUNS = 6  # calls timed of a program however slow: two rounds' fastest calls, three each


def runs_within(call_s: float, runs: int, seconds: float | None = None) -> int:
    """How many calls to time of a program whose call takes ``call_s`` seconds: ``runs``, or as
    many as fit in ``seconds`` (``SECONDS_PER_PROGRAM``) where ``runs`` would take longer, never
    fewer than ``LEAST_RUNS`` (nor more than ``runs``).

    Measured placement times every candidate ``runs`` times, and a candidate that leaves its
    convolutions to portable kernels is 500 times slower than the best one (timm's nf_resnet26,
    XNNPACK alone: 0.72 s a call on 2 cores): its 100 calls, and the 50 of each layout the
    per-region search traces, took minutes for a program that can only lose. A call that long
    varies by a few percent, so a few calls tell its time as well as a hundred; a program of
    microseconds, whose calls vary most, keeps all ``runs``."""
    if call_s <= 0:
        return runs
    seconds = SECONDS_PER_PROGRAM if seconds is None else seconds
    return max(min(LEAST_RUNS, runs), min(runs, math.ceil(seconds / call_s)))


def runs_each(runs: int | Mapping[str, int], names: Iterable[str]) -> dict[str, int]:
    """``runs`` per program: the same number for each, or each its own (``runs_within``)."""
    return {name: runs if isinstance(runs, int) else runs[name] for name in names}


def fewer_runs(counts: Iterable[int], runs: int) -> str:
    """For a progress line: " (6, 6 for the slowest)" where some programs are run fewer than
    ``runs`` times (``runs_within``), else nothing."""
    fewer = sorted(count for count in counts if count < runs)
    return f" ({', '.join(map(str, fewer))} for the slowest)" if fewer else ""


def call_seconds(call: Callable[[], object]) -> float:
    """One call of ``call``, timed (after whatever warm-up the caller did)."""
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def interleaved(
    candidates: Mapping[str, Callable[[], object]],
    runs: int | Mapping[str, int],
    block: int = BLOCK,
    *,
    tolerance: float = TOLERANCE,
    max_rounds: int = MAX_ROUNDS,
    budget_s: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Latency]:
    """Time every candidate, the candidates taking turns in blocks of calls, in rounds until
    the rounds' fastest calls agree.

    Taking turns spreads the machine's slow moments over all candidates alike. Blocks, each
    led by one untimed call, keep one runtime's worker threads (OpenVINO's and PyTorch's spin
    after a call) from slowing the next candidate's timed calls: strict alternation on 2
    cores made one XNNPACK program 3x slower after an OpenVINO one than alone.

    Why the fastest call and rounds, not the median of one pass: on this shared 2-core
    machine under load, a call that is preempted (or whose runtime waits on a preempted
    worker thread) takes a scheduler tick or two longer, 4 or 8 ms, and under steady load
    most calls above about 1 ms are. Medians then land on those steps: in 14 of 24 passes
    under load (load average 4 to 8) the medians put all four ``unet`` programs (xnnpack,
    openvino, both orders) at 3.9 ms or more, although their fastest calls took about 270
    to 1500 us, and they named OpenVINO alone, the fastest in calm runs, the fastest in 7 of
    the 24; measured placement chose on that. Load only ever adds time, so the fastest call
    is the best estimate of what a call costs without it (the reasoning of Python's
    ``timeit``): it named OpenVINO alone the fastest in 22 of the same 24 passes.
    One round's fastest call is still slow when none of its calls ran clean, so the calls
    are split into rounds of half the runs (interleaved as above, the candidates' order
    reversed every other round), and timing goes on until a round's fastest call of every
    candidate is within ``tolerance`` of the fastest before it: the best time, seen twice.
    On a calm machine two rounds agree, which is the ``runs`` calls of one pass. The cap:
    ``max_rounds`` rounds, and ``budget_s`` seconds when given (checked between rounds);
    a candidate's ``Latency.settled`` says whether its rounds agreed.

    The limit: under steady contention a call of several milliseconds (3.6 ms and up here)
    rarely runs clean at all; its fastest call then varies from round to round and
    ``settled`` is mostly False (one program called 3 and 4 times, 3.6 and 4.8 ms: ranked
    right in 19 of 24 passes, where medians, whose preemptions grow with the call's length,
    got all 24). Rounds whose fastest calls were all slowed alike can still agree.
    ``median_us`` and ``p90_us`` stay those of every call timed, for reporting. ``clock`` is
    for tests. ``runs`` may be given per candidate (``runs_within``: fewer for a slow one).
    """
    names = list(candidates)
    wanted = runs_each(runs, names)
    if min(wanted.values(), default=1) < 1 or block < 1 or max_rounds < 1:
        raise ValueError("runs, block and max_rounds must be at least 1")
    rounds = _Rounds(names, tolerance)
    started = clock()
    for round_index in range(max_rounds):
        order = names if round_index % 2 == 0 else names[::-1]
        calls = {name: candidates[name] for name in order}
        rounds.add(_round(calls, _round_sizes(wanted, round_index), block, clock))
        if rounds.settled() or (budget_s is not None and clock() - started >= budget_s):
            break
    return rounds.latencies()


def _round_sizes(wanted: Mapping[str, int], round_index: int) -> dict[str, int]:
    """Calls per candidate in round ``round_index``: half its runs, so that two rounds make
    them all (the second rounds down, never to 0)."""
    return {
        name: max(1, count // 2) if round_index == 1 else (count + 1) // 2
        for name, count in wanted.items()
    }


@attrs.define
class _Rounds:
    """What ``interleaved``'s rounds have seen per candidate: every call's time, the fastest
    call so far, and whether the latest round saw that time again."""

    names: list[str]
    tolerance: float
    times: dict[str, list[float]] = attrs.field(init=False)
    best: dict[str, float] = attrs.field(factory=dict)
    agreed: dict[str, bool] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.times = {name: [] for name in self.names}
        self.agreed = {name: False for name in self.names}

    def add(self, fastest: Mapping[str, tuple[float, list[float]]]) -> None:
        """One round's fastest call and all its times, per candidate (``_round``)."""
        if self.best:  # the best time so far, seen again in this round?
            self.agreed = {
                name: agree(fastest[name][0], self.best[name], self.tolerance)
                for name in self.names
            }
        for name in self.names:
            self.times[name] += fastest[name][1]
            self.best[name] = min(self.best.get(name, fastest[name][0]), fastest[name][0])

    def settled(self) -> bool:
        return all(self.agreed.values())

    def latencies(self) -> dict[str, Latency]:
        return {
            name: Latency.of(self.times[name], settled=self.agreed[name]) for name in self.names
        }


def agree(a: float, b: float, tolerance: float) -> bool:
    """Whether two fastest calls are the same time, within ``tolerance`` of the smaller."""
    return abs(a - b) <= tolerance * min(a, b)


def _round(
    candidates: Mapping[str, Callable[[], object]],
    runs: Mapping[str, int],
    block: int,
    clock: Callable[[], float],
) -> dict[str, tuple[float, list[float]]]:
    """One pass: every candidate timed its ``runs`` times in turns of ``block`` calls, each
    turn led by an untimed call; each candidate's fastest call and all its times, in seconds."""
    times: dict[str, list[float]] = {name: [] for name in candidates}
    while any(len(samples) < runs[name] for name, samples in times.items()):
        for name, call in candidates.items():
            if len(times[name]) >= runs[name]:
                continue
            call()  # untimed: the switch from the previous candidate
            for _ in range(min(block, runs[name] - len(times[name]))):
                started = clock()
                call()
                times[name].append(clock() - started)
    return {name: (min(samples), samples) for name, samples in times.items()}
