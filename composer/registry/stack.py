"""A backend stack: the backends in priority order and what is set for each, checked once.

The config file, the command line and the Python API all build one ``Stack``; ``plan`` and
``compose`` take it, or a list of names or ``"a,b"`` with the other fields as keywords."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from composer.contract.errors import BackendListError, ComposerError
from composer.contract.options import check_options
from composer.registry.names import MAX_THREADS, backend_names, is_count, is_thread_count

if TYPE_CHECKING:
    from composer.registry.discovery import Backend, Registry


PLACEMENTS = ("priority", "strict", "measured")


def check_placement(placement: str) -> None:
    """A ComposerError unless ``placement`` is one of :data:`PLACEMENTS` (a Stack's, a sweep's)."""
    if placement not in PLACEMENTS:
        raise ComposerError(f"placement must be one of {', '.join(PLACEMENTS)}, not {placement!r}.")


KEEP_WHOLE = ("priority", "any")


def _by_backend(what: str, value: Mapping[str, Any] | None) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ComposerError(f"{what} must map backend names to values, not {value!r}.")
    return dict(value)


def _options(value: Mapping[str, Mapping[str, Any]] | None) -> dict[str, Any]:
    # What is not a mapping is left for check_options, which says what each backend takes.
    return {
        backend: dict(values) if isinstance(values, Mapping) else values
        for backend, values in _by_backend("options", value).items()
    }


def _sizes(value: Mapping[str, int] | None) -> dict[str, int]:
    return _by_backend("min_partition_size", value)


def _pins(value: Mapping[str, Iterable[str]] | None) -> dict[str, frozenset[str]]:
    pins = {}
    for backend, ops in _by_backend("never", value).items():
        if isinstance(ops, str):
            # frozenset("aten.relu.default") would pin its letters
            raise ComposerError(f"never[{backend!r}] must be a list of op names, not a string.")
        pins[backend] = frozenset(ops)
    return pins


@attrs.frozen(eq=False)
class Stack:
    """Backends in priority order, and what the user set for each, by backend name.

    - ``backends``: installed backends' names (``composer backends`` lists them); a string
      ``"a,b"`` is split at the commas.
    - ``options``: ``{"cuda": {"max_autotune": "OFF"}}``, checked against the options each
      plugin declares when the stack is resolved (:meth:`with_defaults`).
    - ``never``: pins, the ops (``aten.NAME.OVERLOAD``) a backend must not take, or single
      nodes of the edge program (``node:NAME``), as measured placement writes its choice.
    - ``min_partition_size``: overrides a backend's own smallest partition.
    - ``placement``: ``"priority"`` gives every op to the first backend that takes it, except
      a small host island between an accelerator's partitions, which joins the accelerator;
      ``"strict"`` makes no exception; ``"measured"`` times candidates on this machine
      (:mod:`composer.measure.placement`): the declared order, the other orders, each backend alone
      and a per-region assignment (:mod:`composer.measure.region_search`), composing them for at most
      ``tune_budget`` seconds, and keeps the fastest.
    - ``keep_whole``: which ops stay whole (not decomposed) for the backends that ask
      (XNNPACK's ``linear``). ``"priority"``: each such op, unless a backend ahead of the one
      asking declines it whole and takes its pieces (OpenVINO takes ``linear`` as permute and
      addmm), which then get it; ``"any"``: every op any backend of the stack keeps whole, so
      every order of the stack decomposes the model alike (measured placement's per-region
      search composes so).
    - ``threads``: how many threads the ExecuTorch runtime gives XNNPACK in this process
      (:mod:`composer.run.cpu_threads`), set before composer runs a program; ``None``: the
      runtime's default, one per core. Measured placement times candidates with them.
    - ``repair_time``: how long repairs may search for a program that runs and is right, as a
      multiple of the first compose (with its proof, counted as at least 10 s); past it,
      composer stops with what is wrong, at which size, and what it moved, and writes nothing.
    - ``widen_portable``: compute the ops left to ExecuTorch's portable kernels in float32
      where the model is bf16 or fp16 (:mod:`composer.lower.widened`); the proof's repair
      turns it on where the error builds up there.
    """

    backends: tuple[str, ...] = attrs.field(converter=backend_names)
    options: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict, converter=_options)
    never: Mapping[str, frozenset[str]] = attrs.field(factory=dict, converter=_pins)
    min_partition_size: Mapping[str, int] = attrs.field(factory=dict, converter=_sizes)
    placement: str = "priority"
    tune_budget: float | None = None
    threads: int | None = None
    keep_whole: str = "priority"
    repair_time: float = 3.0
    widen_portable: bool = False

    def __attrs_post_init__(self) -> None:
        for what, given in (
            ("options", self.options),
            ("never", self.never),
            ("min_partition_size", self.min_partition_size),
        ):
            unknown = set(given) - set(self.backends)
            if unknown:
                raise BackendListError(
                    f"{what} given for {', '.join(sorted(unknown))}, which is not in the "
                    f"backend list {list(self.backends)}."
                )
        for name, size in self.min_partition_size.items():
            if not is_count(size):
                raise ComposerError(
                    f"min_partition_size for {name!r} must be a whole number >= 1, not {size!r}."
                )
        check_placement(self.placement)
        if self.keep_whole not in KEEP_WHOLE:
            raise ComposerError(
                f"keep_whole must be one of {', '.join(KEEP_WHOLE)}, not {self.keep_whole!r}."
            )
        budget = self.tune_budget
        if budget is not None and (
            isinstance(budget, bool) or not isinstance(budget, int | float) or budget < 0
        ):
            raise ComposerError(f"tune_budget must be a number of seconds >= 0, not {budget!r}.")
        if self.threads is not None and not is_thread_count(self.threads):
            raise ComposerError(
                f"threads must be a whole number from 1 to {MAX_THREADS}, not {self.threads!r}."
            )
        repair = self.repair_time
        if isinstance(repair, bool) or not isinstance(repair, int | float) or repair < 0:
            raise ComposerError(
                f"repair_time must be a number >= 0 (times the first compose), not {repair!r}."
            )

    @classmethod
    def of(cls, stack: Stack | str | Sequence[str], **fields: Any) -> Stack:
        """``stack`` as a Stack, with ``fields`` set on it. ``consolidate=False`` is the older
        spelling of ``placement="strict"``."""
        if fields.pop("consolidate", True) is False:
            if fields.get("placement", "priority") != "priority":
                raise ComposerError(
                    f"consolidate=False and placement={fields['placement']!r} contradict each "
                    'other; pass placement="strict" alone.'
                )
            fields["placement"] = "strict"
        if isinstance(stack, Stack):
            return attrs.evolve(stack, **fields) if fields else stack
        return cls(stack, **fields)

    @property
    def consolidates(self) -> bool:
        """Whether a host island between an accelerator's partitions joins the accelerator."""
        return self.placement == "priority"

    def only(self, backends: Sequence[str], placement: str = "priority") -> Stack:
        """The stack of ``backends`` (some of these, in any order) with their settings."""
        kept = set(backends)

        def mine(given: Mapping[str, Any]) -> dict[str, Any]:
            return {name: value for name, value in given.items() if name in kept}

        return Stack(
            tuple(backends),
            options=mine(self.options),
            never=mine(self.never),
            min_partition_size=mine(self.min_partition_size),
            placement=placement,
            threads=self.threads,
            keep_whole=self.keep_whole,
            repair_time=self.repair_time,
            widen_portable=self.widen_portable,
        )

    def with_defaults(self, resolved: Sequence[Backend], registry: Registry) -> Stack:
        """The stack with every backend's options checked against what its plugin declares
        (asked through ``registry``, which resolved them), and its declared defaults filled in."""

        # Every backend, given options or not: defaults reach the hooks, and a plugin's broken
        # composer_options surfaces before export rather than halfway through lowering.
        return attrs.evolve(
            self,
            options={
                backend.name: check_options(
                    backend.name, registry.options(backend), self.options.get(backend.name)
                )
                for backend in resolved
            },
        )

    def settings(self) -> dict[str, Any]:
        """The per-backend settings as plain sorted data, for cache keys and reports."""
        return {
            "options": {k: dict(sorted(v.items())) for k, v in sorted(self.options.items())},
            "never": {k: sorted(v) for k, v in sorted(self.never.items())},
            "min_partition_size": dict(sorted(self.min_partition_size.items())),
            "keep_whole": self.keep_whole,
            # Only where set: the keys (and cache entries) of every other stack stay as they were.
            **({"widen_portable": True} if self.widen_portable else {}),
        }
