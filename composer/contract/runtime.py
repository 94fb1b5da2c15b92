"""The runtime half of a backend: where its delegates run, as a plugin supplies it.

ExecuTorch splits a backend in two: a ``Partitioner`` and ``preprocess`` ahead of time, a
``BackendInterface`` (``init``/``execute``) in the runtime. composer's plugin contract has both:
``composer_operator_support``/``composer_partitioner`` say what a backend takes, and
``composer_runtime`` (:class:`composer.hookspecs.BackendPlugin`) hands composer a
:class:`DelegateRuntime` that runs what the backend compiled. The proof, ``verify``, measured
placement and ``composer run`` reach every backend's compiled code through it; a program that no
single runtime here runs whole is run piece by piece, each delegate in its own backend's
runtime and what lies between them in Python.
"""

from __future__ import annotations

import abc
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    import torch

# ExecuTorch's runtime says so when a program names an operator its build has no kernel for.
_MISSING_OPERATOR = re.compile(r"Missing operator: ([\w.]+)")


@attrs.frozen
class Delegate:
    """One delegate of a composed program, as its runtime gets it.

    ``processed_bytes`` is what the backend's ``preprocess`` returned; ``compile_specs`` its
    compile specs by key; ``named_data`` the program's named data (what ExecuTorch writes to
    ``.ptd`` files: a backend that stores weights apart finds them here by key). ``standalone``
    gives the delegate as a ``.pte`` of its own (ExecuTorch emits it on the first call), for a
    runtime that runs whole programs; ``outputs`` is how many tensors it returns.
    """

    backend_id: str
    processed_bytes: bytes
    compile_specs: Mapping[str, bytes]
    named_data: Mapping[str, bytes]
    standalone: Callable[[], bytes]
    outputs: int = 1


Run = Callable[[Sequence["torch.Tensor"]], Sequence["torch.Tensor"]]


class DelegateRuntime(abc.ABC):
    """Where one backend's delegates run: give ``name`` and :meth:`load`; the rest has defaults.

    Return an instance from ``composer_runtime``. composer calls it from one thread at a time
    and passes CPU tensors; return tensors on any device (composer copies them back).
    """

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """Where the code runs, in a few words, as the proof line shows it
        (``"my accelerator's driver 2.1"``)."""

    def unavailable_reason(self) -> str | None:
        """Why this runtime cannot run anything on this machine (no device, no driver), or
        ``None`` if it can. composer then proves the backend's delegates nowhere, and says so."""
        return None

    @abc.abstractmethod
    def load(self, delegate: Delegate) -> Run:
        """Load one delegate alone and return a function that runs it on its operands.

        The operands are the tensors the delegate is called with in the program, in order; the
        function returns its outputs, ``delegate.outputs`` of them, in order. Raise an exception
        whose message says why where the delegate cannot load (a missing kernel, a format it does
        not know): composer names the delegate with that message and moves its nodes.
        """

    def run_program(
        self,
        program: bytes,
        data_files: Mapping[str, bytes],
        inputs: Sequence[torch.Tensor],
        method: str,
    ) -> Sequence[torch.Tensor] | None:
        """Run a whole program's ``method`` on ``inputs``, where this runtime can run every
        delegate of it (``data_files``: the ``.ptd`` files by name). Return ``None`` where it
        runs only single delegates: composer then runs the program piece by piece."""
        return None

    def lacked_operators(self, failure: str) -> tuple[str, ...]:
        """The operators a failure message of this runtime says it has no kernel for, as
        ``aten.name.overload``, or as a prefix ending in ``.`` for every overload of an op
        (``"aten.eq."``). composer then moves only the nodes of those operators.

        Default: ExecuTorch's own "Missing operator: aten.logical_not.default".
        """
        return tuple(_MISSING_OPERATOR.findall(failure))

    def time_call(self, call: Callable[[], Any], calls: int) -> list[float]:
        """Seconds each of ``calls`` runs of ``call`` took (one loaded delegate or program,
        its inputs bound). Override where the device runs asynchronously and a wall clock
        measures only the launch (wait for the device inside the timed region)."""
        seconds = []
        for _ in range(calls):
            started = time.perf_counter()
            call()
            seconds.append(time.perf_counter() - started)
        return seconds


def lacks(operators: Sequence[str], op: str) -> bool:
    """Whether ``op`` (``aten.eq.Scalar``) is one of ``operators`` as
    :meth:`DelegateRuntime.lacked_operators` gives them (a name, or a prefix ending in ``.``)."""
    return any(op == name or (name.endswith(".") and op.startswith(name)) for name in operators)
