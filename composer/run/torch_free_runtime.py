"""One delegate's program run in ``executorch-numpy-runtime``, an ExecuTorch runtime that
links no torch.

ExecuTorch 1.5.1's pip runtime links the libtorch it is built against (2.13), so composer
does not use it under another torch (the GPU machine has 2.11). This runtime takes numpy
arrays instead, so a delegate still runs its backend's compiled code there. It is ExecuTorch
1.3.1's C++ core with XNNPACK and portable kernels: a 1.5.1 delegate it cannot load raises
ComposerError, and nothing assumes that it can.

It is imported with ``RTLD_DEEPBIND``: the CUDA host (:mod:`composer.run.piecewise`) makes
libtorch_cpu's symbols global for the compiled ``.so``, and libtorch_cpu exports an XNNPACK of
its own (334 ``xnn_*`` functions in torch 2.11). Bound to that one, another version, the
runtime's XNNPACK refused every delegate ("Failed to create linear node 1 with code:
xnn_status_invalid_parameter"); bound to its own first, it ran them (seen on the H100).
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

import numpy as np
import torch

from composer.contract.errors import ComposerError
from composer.run.loads import note_loaded
from composer.run.runtime import NativeLog

DISTRIBUTION = "executorch-numpy-runtime"


@functools.cache
def _runtime():
    flags = sys.getdlopenflags()
    sys.setdlopenflags(os.RTLD_NOW | os.RTLD_DEEPBIND)
    try:
        import executorch_numpy_runtime
    finally:
        sys.setdlopenflags(flags)
    return executorch_numpy_runtime


@functools.cache
def _info() -> dict | None:
    """What the torch-free runtime reports of itself; ``None`` where it is not installed (it
    needs Python 3.12)."""
    try:
        return _runtime().runtime_info()
    except ImportError:
        return None


def backends() -> frozenset[str]:
    """The delegate backends the torch-free runtime has; empty where it is not installed."""
    info = _info()
    return frozenset(info["backends"]) if info else frozenset()


def operators() -> frozenset[str]:
    """The kernels the torch-free runtime has ("aten::add.out"); empty where it is not
    installed."""
    info = _info()
    return frozenset(info["operators"]) if info else frozenset()


def thread_count() -> int:
    """The threads of the runtime's CPU threadpool (XNNPACK's)."""
    threadpool, count, _reset = _threadpool()
    return count(threadpool())


def reset_threads(count: int) -> None:
    """Resize the runtime's CPU threadpool; no program may be loaded (composer.run.cpu_threads)."""
    threadpool, _count, reset = _threadpool()
    if not reset(threadpool(), count):
        raise ComposerError(f"{DISTRIBUTION} could not resize its threadpool to {count}.")


@functools.cache
def _threadpool():
    """ExecuTorch's threadpool functions in the runtime's library, which exports them but
    wraps none for Python; the pip runtime wraps the same two (``_unsafe_reset_threadpool``)."""
    library = ctypes.CDLL(_runtime()._core.__file__, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
    threadpool = library._ZN10executorch9extension10threadpool14get_threadpoolEv
    threadpool.restype = ctypes.c_void_p
    count = library._ZNK10executorch9extension10threadpool10ThreadPool16get_thread_countEv
    count.argtypes, count.restype = [ctypes.c_void_p], ctypes.c_size_t
    reset = library._ZN10executorch9extension10threadpool10ThreadPool24_unsafe_reset_threadpoolEj
    reset.argtypes, reset.restype = [ctypes.c_void_p, ctypes.c_uint], ctypes.c_bool
    return threadpool, count, reset


def version() -> str:
    return _runtime().runtime_info()["executorch_version"]


class TorchFreeMethod:
    """``forward`` of one program, loaded in the torch-free runtime; called with tensors."""

    def __init__(self, program: bytes) -> None:
        note_loaded()
        # Its first load logs CPU probing to stderr ("cpuinfo_utils.cpp:71] Reading file ..."
        # in a user's terminal on the GPU machine), and a failed one the reason only there.
        log = NativeLog()
        try:
            with log.capture():
                self._method = (
                    _runtime().Runtime.get().load_program(bytes(program)).load_method("forward")
                )
        except Exception as error:
            raise ComposerError(
                f"{DISTRIBUTION} (ExecuTorch {version()}) cannot load it: {error}{log.because()}"
            ) from error

    # The first call of any method in the process makes XNNPACK's threadpool, which probes the
    # CPU and logs it to stderr (seen on the H100); later calls are timed, so not captured.
    _pool_made = False

    def execute(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        # Its outputs are fresh copies, so from_numpy shares nothing with the runtime.
        arrays = [t.detach().cpu().contiguous().numpy() for t in inputs]
        if TorchFreeMethod._pool_made:
            outputs = self._method(arrays)
        else:
            log = NativeLog()
            try:
                with log.capture():
                    outputs = self._method(arrays)
            except RuntimeError as error:  # its reason is in the log it would have printed
                raise RuntimeError(f"{error}{log.because()}") from error
            TorchFreeMethod._pool_made = True
        return [torch.from_numpy(np.asarray(out)) for out in outputs]
