"""Per-call times from ExecuTorch's event tracer (ETDump): each delegate call and kernel of a
program run in the pip runtime, in the order its instructions run them.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from composer.measure.latency import BLOCK, Latency, runs_each
from composer.run.program_table import execution_plan
from composer.run.runtime import LoadedProgram
from composer.scheduler.measured_placement import ETDUMP


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


def trace(
    program: bytes, inputs: Sequence[object], runs: int, method: str = "forward"
) -> ProgramTrace | None:
    """Time every delegate and kernel call of ``program``'s ``method`` with ETDump (the pip
    runtime has it).

    The tracer names calls only ``DELEGATE_CALL`` and ``OPERATOR_CALL``; they come in the order
    the method's instructions run them, which is how each is matched with its instruction.
    ``None`` when that order does not hold (a method with control flow).
    """

    loaded = LoadedProgram(program, method, etdump=True)
    for _ in range(runs):
        loaded.run(inputs)
    return _read_trace(loaded, program, method)


def trace_together(
    programs: Mapping[str, bytes],
    inputs: Sequence[object],
    runs: int | Mapping[str, int],
    block: int = BLOCK,
) -> dict[str, ProgramTrace | None]:
    """``trace`` for several programs, run taking turns in blocks of calls (as
    ``interleaved`` times them), so that a burst of load on the machine slows all alike
    instead of one program's every call; ``runs`` may be given per program."""

    loaded = {key: LoadedProgram(program, etdump=True) for key, program in programs.items()}
    wanted = runs_each(runs, loaded)
    done = dict.fromkeys(loaded, 0)
    while any(count < wanted[key] for key, count in done.items()):
        for key, program in loaded.items():
            for _ in range(min(block, wanted[key] - done[key])):
                program.run(inputs)
                done[key] += 1
    return {key: _read_trace(loaded[key], programs[key]) for key in loaded}


def _read_trace(loaded, program: bytes, method: str = "forward") -> ProgramTrace | None:
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
    instructions = program_instructions(program, method)
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
    from executorch.exir.schema import DelegateCall, JumpFalseCall, KernelCall

    plan = execution_plan(program, method)
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


def delegate_times(
    program: bytes, inputs: Sequence[object], runs: int, method: str = "forward"
) -> list[DelegateTime]:
    """Time each delegate call of ``program``'s ``method`` with ETDump; empty when calls
    cannot be matched."""
    traced = trace(program, inputs, runs, method)
    if traced is None:
        return []  # a method with control flow: the order no longer tells which is which
    delegates = [step for step in traced.steps if step.kind == "delegate"]
    return [DelegateTime(i, step.name, step.latency) for i, step in enumerate(delegates)]


def delegate_backend_ids(program: bytes, method: str = "forward") -> list[str]:
    """The backend of each delegate call in ``method``'s instructions, in order."""
    from executorch.exir.schema import DelegateCall

    plan = execution_plan(program, method)
    return [
        plan.delegates[instruction.instr_args.delegate_index].id
        for chain in plan.chains
        for instruction in chain.instructions
        if isinstance(instruction.instr_args, DelegateCall)
    ]
