"""What the plugins that wrap ExecuTorch's own partitioners and support checks share.

(It was ``composer/plugins/vendor``, a name tools read as third-party code.)

Vulkan, Core ML, QNN, WebGPU, Arm (Ethos-U, VGF), MPS and MLX: each plugin asks its backend's
own operator-support check, node by node, so composer's guards, pins, minimum sizes and
placement apply to it, and keeps the reason the check gives for every node it declines.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import logging
from collections.abc import Iterator, Mapping

import torch.fx

from composer.contract.backend_spec import BackendSpec
from composer.contract.errors import ComposerError
from composer.contract.hookspecs import BackendPlugin
from composer.contract.support import ReasonedSupport

ON_OFF = ("ON", "OFF")


def is_on(options: Mapping[str, str], name: str) -> bool:
    return options.get(name, "OFF").upper() == "ON"


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Run vendor code without its prints and log lines below errors, and without letting it
    change the root logger.

    ExecuTorch's Vulkan partitioner sets the root logger to INFO when imported, which would
    print every INFO line of every library afterwards; coremltools logs a line per missing
    macOS library when imported on Linux, and its converters a progress bar per pass.
    """
    root = logging.getLogger()
    level = root.level
    disabled = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logging.disable(disabled)
        root.setLevel(level)


def import_problem(module: str) -> str | None:
    """Why ``module`` does not import here (one line), or ``None`` when it does."""
    try:
        with quiet():
            importlib.import_module(module)
    except Exception as error:  # noqa: BLE001 - any failure to import means the same to a user
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return f"{module} does not import ({type(error).__name__}: {first})"
    return None


class NativeCheckSupport(ReasonedSupport):
    """A backend's own ExecuTorch support check, asked through ``why_not(node)`` without the
    lines it prints; the reason it gives for each decline is kept for the plan."""

    def _ask(self, node: torch.fx.Node) -> str | None:
        with quiet():
            return self._why_not(node)


class NativePartitionerPlugin(BackendPlugin):
    """A backend whose support is its own ExecuTorch partitioner, where the wheel's module for
    it may not import here (MPS is not in the wheel; MLX lacks its generated files).

    Subclasses set ``spec``, ``module`` (what must import), ``missing`` (why it does not, and
    what would let it) and implement ``partitioner``; ``cannot_lower`` adds reasons that stop
    lowering but not planning.
    """

    spec: BackendSpec
    module: str
    missing: str

    def partitioner(self):
        raise NotImplementedError

    def cannot_lower(self) -> str | None:
        return None

    def _import_problem(self) -> str | None:
        return _cached_import_problem(self.module)

    def composer_unavailable_reason(self, backend):
        if self._import_problem() is not None:
            return self.missing
        return self.cannot_lower()

    def composer_partitioner(self, backend, program):
        problem = self._import_problem()
        if problem is not None:
            raise ComposerError(
                f"backend {self.spec.name!r} cannot plan or lower here: {self.missing} ({problem})."
            )
        with quiet():
            return self.partitioner()


@functools.cache
def _cached_import_problem(module: str) -> str | None:
    return import_problem(module)
