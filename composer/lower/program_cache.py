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

from composer.lower.cache import Store
from composer.lower.fingerprint import (
    Unfingerprintable,
    code_digest,
    digest,
    module_digest,
    program_digest,
    versions,
)
from composer.lower.runtime_kernels import kernels_digest, target_kernels
from composer.registry.stack import Stack


@attrs.define
class ProgramCache:
    """The entries for one stack, looked for in the kinds given (``"plan"``, ``"program"``)
    in order; results are saved to the first. Each digest is taken once per lookup."""

    stores: tuple[Store, ...]
    modules: Store
    stack: str  # digest of the stack: backends, their plugins' code, settings
    program_digest: str | None = None
    module_digest: str | None = None
    found: Store | None = None  # where the last hit came from

    @classmethod
    def open(
        cls, folder: Path, kinds: tuple[str, ...], resolved, stack: Stack, registry
    ) -> ProgramCache | None:
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
        # The target runtime's kernels decide what lowering may leave undelegated.
        runtime = kernels_digest(target_kernels())
        key = digest(
            versions(), *backends, repr(stack.settings()), repr(stack.consolidates), runtime
        )
        return cls(tuple(Store(folder, kind) for kind in kinds), Store(folder, "module"), key)

    def _key(self, store: Store, content: str) -> str:
        return digest(store.kind, self.stack, content)

    def by_module(self, model: Any, example_inputs: tuple | None) -> Any | None:
        """The stored result for an ``nn.Module`` seen before, found without exporting it."""
        if not isinstance(model, torch.nn.Module) or example_inputs is None:
            return None
        found = module_digest(model, tuple(example_inputs))
        if found is None:
            return None
        # What torch.export makes of the module depends on the grad mode too.
        self.module_digest = digest(found, str(torch.is_grad_enabled()))
        for store in self.stores:
            pointer = self.modules.get(self._key(store, self.module_digest))
            value = None if pointer is None else store.load(pointer.decode())
            if value is not None:
                self.found = store
                return value
        return None

    def by_program(self, program: torch.export.ExportedProgram) -> Any | None:
        """The stored result for ``program``; an entry for the module is added on a hit."""
        try:
            self.program_digest = program_digest(program)
        except Unfingerprintable:
            self.program_digest = None
            return None
        for store in self.stores:
            value = store.load(self._key(store, self.program_digest))
            if value is not None:
                self.found = store
                self._point_module(store)
                return value
        return None

    def save(self, value: Any) -> None:
        if self.program_digest is None:
            return
        store = self.stores[0]
        store.put(
            self._key(store, self.program_digest),
            pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL),
        )
        self._point_module(store)
        store.evict()

    def _point_module(self, store: Store) -> None:
        if self.module_digest is not None and self.program_digest is not None:
            self.modules.put(
                self._key(store, self.module_digest),
                self._key(store, self.program_digest).encode(),
            )
