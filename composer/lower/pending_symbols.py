"""Unbacked symbols left pending by traces that are over.

A trace that reads a tensor's value (``input_pos.item()``) makes a fresh unbacked symbol in
the ShapeEnv that every copy of a program shares, and expects the trace's outputs to bind it
before it ends. Each retrace of export_llama's decoder (to the edge dialect, a repair's
lowering, ``to_executorch``) made more, and a later trace that found them still pending failed
with ``PendingUnbackedSymbolNotFound``: lowering a copy again, a method again with the others,
and AOTInductor compiling a CUDA partition inside the lowering (plain ExecuTorch too, lowering a
program twice). They belong to traces that are over; the ShapeEnv gets them back afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

from torch.export import ExportedProgram


def shape_envs(programs: Iterable[ExportedProgram]) -> list:
    """The ShapeEnvs of ``programs``' placeholders, each once (copies of a program share one)."""
    envs = []
    for program in programs:
        for node in program.graph.nodes:
            fake_mode = getattr(node.meta.get("val"), "fake_mode", None)
            env = getattr(fake_mode, "shape_env", None)
            if node.op == "placeholder" and env is not None:
                if all(env is not seen for seen in envs):
                    envs.append(env)
                break
    return envs


@contextlib.contextmanager
def pending_symbols_set_aside(programs: Iterable[ExportedProgram]) -> Iterator[None]:
    """Trace inside with none of the unbacked symbols pending in ``programs``' ShapeEnvs."""
    saved = []
    for env in shape_envs(programs):
        saved.append((env, list(env.pending_fresh_unbacked_symbols)))
        env.pending_fresh_unbacked_symbols.clear()
    try:
        yield
    finally:
        for env, pending in saved:
            env.pending_fresh_unbacked_symbols[:] = pending
