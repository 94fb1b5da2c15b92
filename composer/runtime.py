"""Running a .pte in ExecuTorch's Python runtime."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from composer.errors import ComposerError


def registered_backends() -> set[str]:
    from executorch.runtime import Runtime

    return set(Runtime.get().backend_registry.registered_backend_names)


def run_program(program: bytes, inputs: Sequence[torch.Tensor], method: str = "forward") -> list:
    """Load ``program`` and run ``method`` on ``inputs``; failures become ComposerError."""
    from executorch.runtime import Runtime

    try:
        loaded = Runtime.get().load_program(program)
    except Exception as error:
        raise ComposerError(f"the ExecuTorch runtime cannot load this program: {error}") from error
    try:
        runnable = loaded.load_method(method)
    except Exception as error:
        raise ComposerError(
            f"the ExecuTorch runtime cannot load method {method!r}: {error}. A delegate whose "
            f"backend this runtime lacks fails here; it has: {', '.join(sorted(registered_backends()))}."
        ) from error
    try:
        return list(runnable.execute(list(inputs)))
    except Exception as error:
        raise ComposerError(f"running {method!r} failed: {error}") from error
