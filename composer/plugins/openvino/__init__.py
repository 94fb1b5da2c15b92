"""The ``openvino`` backend: ExecuTorch's OpenVINO partitioner and backend (Intel CPU, GPU, NPU).

Its delegates run in the pip ExecuTorch runtime once the ``openvino`` package is installed
(``pip install 'executorch-composer[openvino]'``, which pins an openvino and nncf pair that
import together). Option ``device`` (default ``CPU``) names the OpenVINO device.

Two facts of ExecuTorch 1.5.1 shape this plugin:

- an OpenVINO blob only loads under the OpenVINO version that compiled it, so the version is
  recorded in the plan and in each delegate's compile specs (``composer.library``), where
  ``composer run`` finds it to explain a failed load;
- on CPUs with bf16 instructions OpenVINO computes in bf16 and ExecuTorch does not pass a
  precision hint, so verification uses a bf16 tolerance for programs it takes part in;
- OpenVINO names nodes from process-wide counters, so its blobs differed between composes of
  one model; composer renumbers those names (:mod:`composer.plugins.openvino.blob`).
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from collections.abc import Mapping
from pathlib import Path

from composer.contract.backend_spec import BackendSpec, Tolerance
from composer.contract.errors import ComposerError
from composer.contract.hookspecs import BackendPlugin
from composer.contract.native_log import NativeLog
from composer.contract.options import Option

INSTALL = "pip install 'executorch-composer[openvino]'"
LIBRARY_SPEC_KEY = "composer.library"
OPTIONS = (Option("device", default="CPU", help="the OpenVINO device: CPU, GPU, NPU, AUTO..."),)
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def _openvino_version() -> str | None:
    try:
        return importlib.metadata.version("openvino")
    except importlib.metadata.PackageNotFoundError:
        return None


def _bf16_flags() -> list[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: no way to tell, assume f32
        return []
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines()
                  if line.startswith("flags")), [])  # fmt: skip
    return [flag for flag in BF16_FLAGS if flag in flags]


def _tolerance() -> Tolerance | None:
    flags = _bf16_flags()
    if not flags:
        return None
    # The proof holds its programs to eager run in bf16 against fp64 (atol and rtol are what
    # its delegates were seen to miss fp32 eager by: torch.testing's bf16 figures).
    return Tolerance(
        atol=1e-2,
        rtol=1.6e-2,
        reason=f"OpenVINO computes in bf16 on this CPU ({', '.join(flags)})",
        precision="bfloat16",
    )


@functools.cache  # reads the installed version and /proc/cpuinfo: once is enough
def _spec() -> BackendSpec:
    version = _openvino_version()
    return BackendSpec(
        name="openvino",
        backend_id="OpenvinoBackend",
        device="cpu",
        min_partition_size=1,
        description="OpenVINO: Intel CPUs (the default), GPUs and NPUs",
        tolerance=_tolerance(),
        library=f"openvino {version}" if version else "",
    )


@functools.cache
def unavailable_reason() -> str | None:
    """Why the OpenVINO backend cannot partition or lower here, or ``None``: whether its
    packages are installed, found without importing them."""
    # Not imported here: ExecuTorch's OpenVINO backend imports nncf and its quantizer (seconds),
    # and this is asked on every compose, a cache hit's included, which must cost a file read.
    # Whether the installed versions import together is checked before partitioning.
    for module in ("openvino", "nncf", "executorch.backends.openvino"):
        if importlib.util.find_spec(module) is None:
            return f"the {module} package is not installed ({INSTALL})"
    return None


@functools.cache
def _import_failure() -> str | None:
    """Why ExecuTorch's OpenVINO backend does not import (nncf must match openvino), or ``None``."""
    try:
        # It imports pytorch_tokenizers, whose C++ part logs a line on fd 2 when it loads.
        with NativeLog().capture():
            import executorch.backends.openvino  # noqa: F401 - imports nncf, which must match
    except Exception as error:  # noqa: BLE001 - any import failure means the same to a user
        return (
            f"executorch.backends.openvino does not import ({type(error).__name__}: {error}); "
            f"install versions that import together: {INSTALL}"
        )
    return None


def _require_openvino() -> None:
    reason = unavailable_reason() or _import_failure()
    if reason is not None:
        raise ComposerError(f"backend 'openvino' cannot be used: {reason}.")


class OpenvinoPlugin(BackendPlugin):
    options = OPTIONS

    @property
    def spec(self) -> BackendSpec:
        return _spec()

    def checked_options(self, options: Mapping[str, str] | None) -> dict[str, str]:
        # OpenVINO's device names are upper case.
        checked = super().checked_options(options)
        return {**checked, "device": checked["device"].upper()}

    def composer_unavailable_reason(self, backend):
        return unavailable_reason()

    def composer_operator_support(self, backend, program, options):
        _require_openvino()
        self.checked_options(options)
        from composer.plugins.openvino.support import OpenvinoSupport

        return OpenvinoSupport(program)

    def composer_ops_to_not_decompose(self, backend, program, options):
        _require_openvino()
        from executorch.backends.openvino import OpenvinoPartitioner

        from composer.plugins.openvino.support import takes_op

        # ExecuTorch 1.5.1's OpenvinoPartitioner asks to keep whole ops its own support check
        # then declines (upsample_bilinear2d, pixel_shuffle are not in OpenVINO's table): such
        # an op stays undecomposed and undelegated, and lowering stops ("was not decomposed
        # or delegated"). Keep whole only what OpenVINO will take; the rest decomposes.
        ops, _filter = OpenvinoPartitioner([]).ops_to_not_decompose(program)
        return [op for op in ops if takes_op(op)]

    def composer_compile_specs(self, backend, method_name, options):
        from executorch.exir.backend.compile_spec_schema import CompileSpec

        from composer.plugins.openvino.blob import make_preprocess_reproducible

        checked = self.checked_options(options)
        # Asked just before every lowering to OpenVINO: from here on its blobs name nodes the
        # same way in every compose (composer.plugins.openvino.blob).
        make_preprocess_reproducible()
        specs = [CompileSpec("device", checked["device"].encode())]
        if self.spec.library:
            specs.append(CompileSpec(LIBRARY_SPEC_KEY, self.spec.library.encode()))
        return specs


plugin = OpenvinoPlugin()
