"""Where ``cuda`` delegates run here: each as its compiled AOTInductor ``.so``, hosted by libtorch.

ExecuTorch's CUDA runtime is C++ and not in the pip wheel. A delegate's ``.so`` leaves its
``aoti_torch_*`` symbols to its host; libtorch provides them, and
``torch._C._aoti.AOTIModelContainerRunnerCuda`` loads it. Its weights are bound from the
program's named data (the ``.ptd``) through the delegate's manifest (:mod:`.manifest`).
"""

from __future__ import annotations

import ctypes
import functools
import os
import tempfile
from collections.abc import Mapping, Sequence

import torch

from composer.contract.errors import ComposerError
from composer.contract.runtime import Delegate, DelegateRuntime, Run
from composer.plugins.cuda.manifest import Manifest, WeightEntry, missing_weights, parse_manifest

_TORCH_LIBS = ("libc10.so", "libtorch_cpu.so", "libc10_cuda.so", "libtorch_cuda.so")


@functools.cache
def host_unavailable_reason() -> str | None:
    """None when a compiled CUDA delegate can run here; otherwise why not, in words."""
    if torch.version.cuda is None:
        return f"torch {torch.__version__} here is not a CUDA build"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible"
    if not hasattr(torch._C._aoti, "AOTIModelContainerRunnerCuda"):
        return f"torch {torch.__version__} has no AOTIModelContainerRunnerCuda"
    # The .so does not link libtorch: its aoti_torch_* symbols must be global before dlopen.
    library_dir = os.path.join(os.path.dirname(torch.__file__), "lib")
    for name in _TORCH_LIBS:
        try:
            ctypes.CDLL(os.path.join(library_dir, name), mode=ctypes.RTLD_GLOBAL)
        except OSError as error:
            return f"cannot load {name} globally from {library_dir}: {error}"
    return None


def weight_tensor(entry: WeightEntry, raw: bytes) -> torch.Tensor:
    """The constant ``entry`` describes, viewed out of its storage bytes, on its device."""
    storage = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(entry.dtype)
    view = torch.as_strided(storage, entry.sizes, entry.strides, entry.storage_offset)
    return view.to(entry.device) if entry.device != "cpu" else view


class CompiledCudaDelegate:
    """One CudaBackend delegate: its .so on the GPU with its weights bound from the .ptd.
    Inputs go to the GPU; outputs stay there (the caller moves them where it runs)."""

    def __init__(self, manifest: Manifest, data: Mapping[str, bytes]) -> None:
        problems = missing_weights(manifest, data)
        if problems:
            raise ComposerError(
                "a CudaBackend delegate's data is incomplete: "
                + "; ".join(problems[:5])
                + ". Pass the .ptd files written beside the .pte (Composition.data_files)."
            )
        self._directory = tempfile.TemporaryDirectory(prefix="composer_aoti_")
        so_path = os.path.join(self._directory.name, f"{manifest.so_blob_key[:16]}.so")
        with open(so_path, "wb") as out:
            out.write(data[manifest.so_blob_key])
        self.runner = torch._C._aoti.AOTIModelContainerRunnerCuda(so_path, 1, "cuda")
        by_fqn = {entry.fqn: entry for entry in manifest.entries}
        constants, unbound = {}, []
        for name, fqn in self.runner.get_constant_names_to_original_fqns().items():
            entry = by_fqn.get(fqn) or by_fqn.get(name)
            if entry is None:
                unbound.append(f"{name} ({fqn})")
            else:
                constants[name] = weight_tensor(entry, data[entry.storage_key])
        if unbound:
            raise ComposerError(
                f"the compiled .so {manifest.so_blob_key[:16]} wants constants its manifest "
                f"does not list: {', '.join(unbound[:5])}."
            )
        if constants:
            self.runner.update_constant_buffer(constants, False, True)

    def __call__(self, operands: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return list(self.runner.run([t.to("cuda") for t in operands]))


class CudaRuntime(DelegateRuntime):
    """The ``cuda`` backend's delegates, each as its compiled ``.so`` in libtorch."""

    name = "AOTInductor .so, libtorch host"

    def unavailable_reason(self) -> str | None:
        return host_unavailable_reason()

    def load(self, delegate: Delegate) -> Run:
        return CompiledCudaDelegate(parse_manifest(delegate.processed_bytes), delegate.named_data)

    def time_call(self, call, calls: int) -> list[float]:
        # The GPU runs asynchronously: wait for it inside each timed call.
        def synchronized():
            call()
            torch.cuda.synchronize()

        return super().time_call(synchronized, calls)
