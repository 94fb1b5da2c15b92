"""Whole composed programs and plans by content: the same model, stack and versions answer
from the cache without lowering, and without exporting when the model is an ``nn.Module``
whose digest (``fingerprint.module_digest``) matches one seen before.

Two entries per result: one under the digest of the exported program (sound: it is what
lowering reads), and one under the module's digest that names the first. Only stacks of
installed plugins are cached; an explicit ``Registry`` may hold plugin objects whose state no
digest sees.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import attrs
import torch

from composer.cache import Store
from composer.fingerprint import (
    Unfingerprintable,
    code_digest,
    digest,
    module_digest,
    program_digest,
    versions,
)
from composer.stack import Stack


@attrs.define
class ProgramCache:
    """The entries of one kind (``"program"`` or ``"plan"``) for one stack."""

    store: Store
    modules: Store
    stack: str  # digest of the stack: backends, their plugins' code, settings
    program_key: str | None = None
    module_key: str | None = None

    @classmethod
    def open(cls, folder: Path, kind: str, resolved, stack: Stack, registry) -> ProgramCache | None:
        """None when something in the stack cannot be digested. Whether each backend can
        lower here is part of the key: a plugin that refuses to plan without its library
        must not be answered with a plan made while it had it."""
        try:
            backends = [
                f"{b.spec!r} {b.origin!r} {code_digest([b.plugin])} "
                f"{registry.unavailable_reason(b)!r}"
                for b in resolved
            ]
        except Unfingerprintable:
            return None
        stack = digest(
            kind,
            versions(),
            *backends,
            repr(stack.settings()),
            repr(stack.consolidates),
        )
        return cls(Store(folder, kind), Store(folder, "module"), stack)

    def by_module(self, model: Any, example_inputs: tuple | None) -> Any | None:
        """The stored result for an ``nn.Module`` seen before, found without exporting it."""
        if not isinstance(model, torch.nn.Module) or example_inputs is None:
            return None
        found = module_digest(model, tuple(example_inputs))
        if found is None:
            return None
        # What torch.export makes of the module depends on the grad mode too.
        self.module_key = digest(self.stack, found, str(torch.is_grad_enabled()))
        pointer = self.modules.get(self.module_key)
        if pointer is None:
            return None
        self.program_key = pointer.decode()
        return self.store.load(self.program_key)

    def by_program(self, program: torch.export.ExportedProgram) -> Any | None:
        """The stored result for ``program``; an entry for the module is added on a hit."""
        try:
            self.program_key = digest(self.stack, program_digest(program))
        except Unfingerprintable:
            self.program_key = None
            return None
        value = self.store.load(self.program_key)
        if value is not None:
            self._point_module()
        return value

    def save(self, value: Any) -> None:
        if self.program_key is None:
            return
        self.store.put(self.program_key, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
        self._point_module()
        self.store.evict()

    def _point_module(self) -> None:
        if self.module_key is not None and self.program_key is not None:
            self.modules.put(self.module_key, self.program_key.encode())
