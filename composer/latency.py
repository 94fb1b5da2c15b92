"""Timing programs the way a benchmark on a noisy machine must: warm, interleaved, by quantile."""

from __future__ import annotations

import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs
from tabulate import tabulate

from composer.plans import ETDUMP


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


def interleaved(
    candidates: Mapping[str, Callable[[], object]],
    runs: int,
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
    for tests.
    """
    if runs < 1 or block < 1 or max_rounds < 1:
        raise ValueError("runs, block and max_rounds must be at least 1")
    names = list(candidates)
    times: dict[str, list[float]] = {name: [] for name in names}
    best: dict[str, float] = {}
    agreed = {name: False for name in names}
    started = clock()
    for round_index in range(max_rounds):
        size = max(1, runs // 2) if round_index == 1 else (runs + 1) // 2
        order = names if round_index % 2 == 0 else names[::-1]
        fastest = _round({name: candidates[name] for name in order}, size, block, clock)
        if best:  # the best time so far, seen again in this round?
            agreed = {name: _agree(fastest[name][0], best[name], tolerance) for name in names}
        for name in names:
            times[name] += fastest[name][1]
            best[name] = min(best.get(name, fastest[name][0]), fastest[name][0])
        if all(agreed.values()) or (budget_s is not None and clock() - started >= budget_s):
            break
    return {name: Latency.of(times[name], settled=agreed[name]) for name in names}


def _agree(a: float, b: float, tolerance: float) -> bool:
    return abs(a - b) <= tolerance * min(a, b)


def _round(
    candidates: Mapping[str, Callable[[], object]],
    runs: int,
    block: int,
    clock: Callable[[], float],
) -> dict[str, tuple[float, list[float]]]:
    """One pass: every candidate timed ``runs`` times in turns of ``block`` calls, each turn
    led by an untimed call; each candidate's fastest call and all its times, in seconds."""
    times: dict[str, list[float]] = {name: [] for name in candidates}
    while any(len(samples) < runs for samples in times.values()):
        for name, call in candidates.items():
            if len(times[name]) >= runs:
                continue
            call()  # untimed: the switch from the previous candidate
            for _ in range(min(block, runs - len(times[name]))):
                started = clock()
                call()
                times[name].append(clock() - started)
    return {name: (min(samples), samples) for name, samples in times.items()}


@attrs.frozen
class DelegateTime:
    """One delegate call of a program, as ExecuTorch's event tracer (ETDump) timed it."""

    index: int  # position among the method's delegate calls, in execution order
    backend_id: str
    latency: Latency


@attrs.frozen
class StepTime:
    """One instruction of a program's run, timed by ETDump: a delegate call or a kernel call."""

    kind: str  # "delegate" or "kernel"
    name: str  # the delegate's backend id, or the kernel's operator ("aten::cumsum.out")
    latency: Latency


@attrs.frozen
class ProgramTrace:
    """A program's delegate and kernel calls in the order they run, and the whole call."""

    steps: tuple[StepTime, ...]
    execute: Latency  # Method::execute under the same tracer: steps plus what lies between
    timer = ETDUMP  # what the plan says timed it

    @property
    def between_steps_us(self) -> float:
        """The median call's time outside every timed step: the runtime's own work."""
        return max(0.0, self.execute.median_us - sum(s.latency.median_us for s in self.steps))


def trace(program: bytes, inputs: Sequence[object], runs: int) -> ProgramTrace | None:
    """Time every delegate and kernel call of ``program`` with ETDump (the pip runtime has it).

    The tracer names calls only ``DELEGATE_CALL`` and ``OPERATOR_CALL``; they come in the order
    the method's instructions run them, which is how each is matched with its instruction.
    ``None`` when that order does not hold (a method with control flow).
    """
    from composer.runtime import LoadedProgram

    loaded = LoadedProgram(program, etdump=True)
    for _ in range(runs):
        loaded.run(inputs)
    return _read_trace(loaded, program)


def trace_together(
    programs: Mapping[str, bytes], inputs: Sequence[object], runs: int, block: int = BLOCK
) -> dict[str, ProgramTrace | None]:
    """``trace`` for several programs, run taking turns in blocks of calls (as
    ``interleaved`` times them), so that a burst of load on the machine slows all alike
    instead of one program's every call."""
    from composer.runtime import LoadedProgram

    loaded = {key: LoadedProgram(program, etdump=True) for key, program in programs.items()}
    done = dict.fromkeys(loaded, 0)
    while any(count < runs for count in done.values()):
        for key, program in loaded.items():
            for _ in range(min(block, runs - done[key])):
                program.run(inputs)
                done[key] += 1
    return {key: _read_trace(loaded[key], programs[key]) for key in loaded}


def _read_trace(loaded, program: bytes) -> ProgramTrace | None:
    """The ``ProgramTrace`` of the calls ``loaded`` (an ETDump-recording program) has run."""
    from executorch.devtools import Inspector

    with tempfile.TemporaryDirectory() as folder:
        etdump = Path(folder) / "run.etdp"
        loaded.program.write_etdump_result_to_file(str(etdump), str(Path(folder) / "debug.bin"))
        with warnings.catch_warnings():
            # Tensor debug data is not what is asked for here; its absence is expected.
            warnings.simplefilter("ignore", UserWarning)
            inspector = Inspector(etdump_path=str(etdump))
    events = [
        event
        for block in inspector.event_blocks
        if block.name == "Execute"
        for event in block.events
        if event.perf_data is not None and not event.is_delegated_op
    ]
    timed = {"delegate": [e for e in events if e.name == "DELEGATE_CALL"],
             "kernel": [e for e in events if e.name == "OPERATOR_CALL"]}  # fmt: skip
    execute = [e for e in events if e.name == "Method::execute"]
    instructions = program_instructions(program)
    if (
        instructions is None
        or not execute
        or any(len(timed[kind]) != sum(1 for k, _ in instructions if k == kind) for kind in timed)
    ):
        return None
    steps = []
    for kind, name in instructions:
        event = timed[kind].pop(0)
        steps.append(StepTime(kind, name, _latency_of(event)))
    return ProgramTrace(tuple(steps), _latency_of(execute[0]))


def _latency_of(event) -> Latency:
    return Latency.of([ms / 1e3 for ms in event.perf_data.raw])  # ETDump times are in ms


def program_instructions(program: bytes, method: str = "forward") -> list[tuple[str, str]] | None:
    """``(kind, name)`` of each delegate and kernel call in ``method``, in order; ``None``
    when the method jumps (control flow), so that order is not the order calls run in."""
    from executorch.exir._serialize._program import deserialize_pte_binary
    from executorch.exir.schema import DelegateCall, JumpFalseCall, KernelCall

    plan = next(
        p for p in deserialize_pte_binary(program).program.execution_plan if p.name == method
    )
    found = []
    for chain in plan.chains:
        for instruction in chain.instructions:
            args = instruction.instr_args
            if isinstance(args, JumpFalseCall):
                return None
            if isinstance(args, DelegateCall):
                found.append(("delegate", plan.delegates[args.delegate_index].id))
            elif isinstance(args, KernelCall):
                operator = plan.operators[args.op_index]
                overload = f".{operator.overload}" if operator.overload else ""
                found.append(("kernel", f"{operator.name}{overload}"))
    return found


def delegate_times(program: bytes, inputs: Sequence[object], runs: int) -> list[DelegateTime]:
    """Time each delegate call of ``program`` with ETDump; empty when calls cannot be matched."""
    traced = trace(program, inputs, runs)
    if traced is None:
        return []  # a method with control flow: the order no longer tells which is which
    delegates = [step for step in traced.steps if step.kind == "delegate"]
    return [DelegateTime(i, step.name, step.latency) for i, step in enumerate(delegates)]


def delegate_backend_ids(program: bytes, method: str = "forward") -> list[str]:
    """The backend of each delegate call in ``method``'s instructions, in order."""
    from executorch.exir._serialize._program import deserialize_pte_binary
    from executorch.exir.schema import DelegateCall

    plan = next(
        p for p in deserialize_pte_binary(program).program.execution_plan if p.name == method
    )
    return [
        plan.delegates[instruction.instr_args.delegate_index].id
        for chain in plan.chains
        for instruction in chain.instructions
        if isinstance(instruction.instr_args, DelegateCall)
    ]


@attrs.frozen
class ProgramLatency:
    """One row of a latency comparison: a program, its delegate calls, its time and error."""

    program: str  # "eager", "xnnpack,openvino", "xnnpack alone"
    delegate_calls: int | None  # None for eager
    latency: Latency
    max_abs_error: float | None = None


def compare_with_singles(
    composition, compose_single: Callable[[str], object], runs: int
) -> tuple[list[ProgramLatency], list[str]]:
    """The composed program beside eager and beside each of its backends alone, interleaved.

    ``compose_single(name)`` composes the same model with that one backend. Returns the rows
    and a note for each program that could not be timed (a backend the runtime lacks).
    """
    import copy

    import torch

    from composer.runtime import LoadedProgram
    from composer.verification import compare

    inputs = composition.example_inputs
    eager = copy.deepcopy(composition.eager)
    with torch.no_grad():
        expected = eager(*inputs)
    programs = {",".join(composition.plan.backends): composition}
    notes = []
    if len(composition.plan.backends) > 1:
        for name in composition.plan.backends:
            single = compose_single(name)
            runnable, why = single.runtime_can_run()
            if runnable:
                programs[f"{name} alone"] = single
            else:
                notes.append(f"{name} alone: not timed, {why}")
    loaded, errors, calls = {}, {}, {}
    for label, program in programs.items():
        runnable, why = program.runtime_can_run()
        if not runnable:
            notes.append(f"{label}: not timed, {why}")
            continue
        loaded[label] = LoadedProgram(program.buffer)
        _ok, errors[label] = compare(loaded[label].run(inputs), expected)
        calls[label] = program.plan.delegate_calls
    candidates = {"eager": lambda: eager(*inputs)}
    candidates.update({label: program.timed_call(inputs) for label, program in loaded.items()})
    with torch.no_grad():
        timed = interleaved(candidates, runs)
    rows = [ProgramLatency("eager", None, timed["eager"])]
    rows += [ProgramLatency(label, calls[label], timed[label], errors[label]) for label in loaded]
    return rows, notes


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
