"""A .pte's program table, read without its segments.

ExecuTorch's ``deserialize_pte_binary`` copies every constant and delegate blob out of the
buffer before it returns (and slices the whole buffer to read the header): three calls took
23 s of a 62 s compose of ExecuTorch's 200M-parameter example Llama. The questions composer
asks of a written program (which backends its delegates use, which inputs are dynamic, the
order of its calls) are answered by the flatbuffer table alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from executorch.exir.schema import ExecutionPlan, Program

# The extended header sits 8 bytes in and is 32 bytes long; a little more is read.
_HEADER_BYTES = 64


def program_table(buffer: bytes) -> Program:
    """The program's execution plans, delegates (their ids and compile specs; blobs kept in
    segments are not read), values and operators."""
    from executorch.exir._serialize._flatbuffer_program import _flatbuffer_to_program
    from executorch.exir._serialize._program import _get_extended_header

    header = _get_extended_header(bytes(buffer[:_HEADER_BYTES]))
    size = header.program_size if header is not None else len(buffer)
    return _flatbuffer_to_program(bytes(buffer[:size]))


def execution_plan(buffer: bytes, method: str = "forward") -> ExecutionPlan | None:
    """The execution plan of ``method``, or ``None`` if the program has none by that name."""
    return next((p for p in program_table(buffer).execution_plan if p.name == method), None)


def delegate_call_at(buffer: bytes, instruction: int, method: str = "forward") -> int | None:
    """Which of ``method``'s delegate calls (0: its first) instruction ``instruction`` of its
    first chain is, as a runtime's "CALL_DELEGATE execute failed at instruction N" counts;
    ``None`` where that instruction calls no delegate."""
    from executorch.exir.schema import DelegateCall

    plan = execution_plan(buffer, method)
    if plan is None or not plan.chains:
        return None
    instructions = plan.chains[0].instructions
    if not 0 <= instruction < len(instructions):
        return None
    if not isinstance(instructions[instruction].instr_args, DelegateCall):
        return None
    return sum(isinstance(i.instr_args, DelegateCall) for i in instructions[:instruction])
