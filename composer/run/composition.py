"""A composed program: its bytes and data files, its plan, the eager model it must match, and
``verify()``; lowered again on first use where it came from the cache.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import torch

from composer.contract.errors import ComposerError
from composer.contract.quiet import quiet_call
from composer.lower.atomic import check_owned, output_kinds, ptd_name, write_all
from composer.run.runtime import program_backend_ids, runtime_can_run
from composer.run.verification import Verification, verify
from composer.scheduler.plans import Plan

if TYPE_CHECKING:
    from executorch.exir import EdgeProgramManager, ExecutorchProgramManager
    from torch.export import ExportedProgram

    from composer.lower.lowering import Lowered


@attrs.define
class Composition:
    """A composed ExecuTorch program: its bytes, its plan, and a way to check it.

    ``proof_inputs``: the user's own samples, which the proof runs it at beside the example
    inputs (``compose(proof_inputs=...)``). From the cache (``from_cache``) it holds the bytes
    and the plan only; ``program``, ``edge`` and ``reference`` are lowered again (lowered
    partitions reused) when first asked for.
    """

    buffer: bytes
    data_files: dict[str, bytes]  # external tensor data (.ptd), e.g. CUDA weights
    plan: Plan
    eager: torch.nn.Module
    example_inputs: tuple
    from_cache: bool = False
    # the user's own samples the proof runs it at too, each a tuple like example_inputs
    proof_inputs: tuple[tuple, ...] = ()
    _lowered: Lowered | None = attrs.field(default=None, alias="lowered", repr=False)
    _lower: Callable[[], Lowered] | None = attrs.field(default=None, alias="lower", repr=False)

    @quiet_call  # lowering again, for a program from the cache
    def _lowering(self) -> Lowered:
        if self._lowered is None:
            assert self._lower is not None, "a Composition needs its lowering or a way to redo it"
            lowered = self._lower()
            if (lowered.buffer, lowered.data_files) != (self.buffer, self.data_files):
                raise ComposerError(
                    "this program came from composer's cache, and lowering it again for its "
                    "edge program made different bytes (its lowered partitions have left the "
                    "cache). Compose again with cache=False (--no-cache)."
                )
            self._lowered = lowered
        return self._lowered

    @property
    def program(self) -> ExecutorchProgramManager:
        return self._lowering().program

    @property
    def edge(self) -> EdgeProgramManager:
        """The lowered edge program, after to_executorch converted it."""
        return self._lowering().edge

    @property
    def unwritten_edge(self) -> ExportedProgram | None:
        """The lowered edge program before ``to_executorch``, where the lowering that made this
        program kept it (``composer.lower.lowering.keeping_unwritten``); never lowers again."""
        return None if self._lowered is None else self._lowered.unwritten

    @property
    def reference(self) -> torch.nn.Module:
        """The lowered program as Python, in which delegates run their subgraphs."""
        return self._lowering().reference

    def save(
        self, path: str | os.PathLike, extra: Mapping[Path, bytes] | None = None, *,
        force: bool = False,
    ) -> Path:  # fmt: skip
        """Write the .pte, any .ptd data files beside it, and ``extra`` files (reports), all or
        none. An existing file is replaced only where it is composer's own output of the same
        kind (a program, tensor data, a report), unless ``force``."""
        target = Path(path)
        files = {target: self.buffer}
        for name, data in self.data_files.items():
            files[target.parent / ptd_name(name)] = data
        files.update(extra or {})
        check_owned(output_kinds(target, files), force=force)  # write_all checks the rest
        write_all(files)
        return target

    def runtime_can_run(self) -> tuple[bool, str]:
        """Whether the ExecuTorch runtime here can run this program: built for this torch,
        with every delegate's backend registered."""
        return runtime_can_run(self.buffer)

    def delegate_backend_ids(self) -> set[str]:
        """The ExecuTorch backend ids of this program's delegates."""
        return program_backend_ids(self.buffer)

    @quiet_call
    def verify(self, inputs: Sequence[Any] | None = None, *, debug: bool = False) -> Verification:
        """Run the composed program and compare with eager (see :mod:`composer.run.verification`);
        ``debug`` as for :func:`~composer.pipeline.compose.compose`."""
        return verify(self, inputs)
