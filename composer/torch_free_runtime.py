"""One delegate's program run in ``executorch-numpy-runtime``, an ExecuTorch runtime that
links no torch.

ExecuTorch 1.5.1's pip runtime converts tensors through the torch 2.13 it is built against;
under another torch (the GPU machine has 2.11) its XNNPACK delegates fail or compute garbage.
This runtime takes numpy arrays instead, so a delegate still runs its backend's compiled code
there. It is ExecuTorch 1.3.1's C++ core with XNNPACK and portable kernels: a 1.5.1 delegate
it cannot load raises ComposerError, and nothing assumes that it can.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from composer.errors import ComposerError

DISTRIBUTION = "executorch-numpy-runtime"


@functools.cache
def backends() -> frozenset[str]:
    """The delegate backends the torch-free runtime has; empty where it is not installed (it
    needs Python 3.12)."""
    try:
        import executorch_numpy_runtime as runtime
    except ImportError:
        return frozenset()
    return frozenset(runtime.runtime_info()["backends"])


def version() -> str:
    import executorch_numpy_runtime as runtime

    return runtime.runtime_info()["executorch_version"]


class TorchFreeMethod:
    """``forward`` of one program, loaded in the torch-free runtime; called with tensors."""

    def __init__(self, program: bytes) -> None:
        import executorch_numpy_runtime as runtime

        try:
            self._method = runtime.Runtime.get().load_program(bytes(program)).load_method("forward")
        except Exception as error:
            raise ComposerError(
                f"{DISTRIBUTION} (ExecuTorch {version()}) cannot load it: {error}"
            ) from error

    def execute(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        # Its outputs are fresh copies, so from_numpy shares nothing with the runtime.
        arrays = [t.detach().cpu().contiguous().numpy() for t in inputs]
        return [torch.from_numpy(np.asarray(out)) for out in self._method(arrays)]
