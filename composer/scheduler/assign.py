"""The stack's assignment: which ops each backend is not offered, and why. Names, not graphs.

Priority order offers every op to the first backend that takes it. Two things override it,
both decided here once for the whole stack: the user's pins (``never``: ops a backend must
not take, or single nodes: ``"node:NAME"``) and consolidation (a small island moved to the accelerator around it). Each
backend then partitions what it is offered on the program it is given; partition sizes and
convexity are its own business, so they are not decided here.
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Iterable, Mapping, Sequence

import attrs
import torch

from composer.contract.errors import ComposerWarning, StalePinWarning
from composer.scheduler.consolidate import PORTABLE, islands_to_move

# A pin that names one node of the edge program, not an op: "node:aten_linear_default_2".
# Measured placement writes its per-region choice this way (composer.measure.region_search).
NODE_PIN = "node:"


def node_pin(node: str) -> str:
    """The pin that keeps the edge-program node named ``node`` off a backend."""
    return NODE_PIN + node


def user_pinned(backend: str) -> str:
    """Why a node pinned off ``backend`` (``Stack.never``) was not offered to it; repairs pin
    with the same pins, and say so instead (pipeline.proven)."""
    return f"pinned off {backend} by the user"


@attrs.frozen
class Assignment:
    """Per backend, the ops it must leave alone, with the reason the plan gives."""

    withheld: Mapping[str, Mapping[str, str]]  # backend -> node name -> reason

    def withheld_from(self, backend: str) -> Mapping[str, str]:
        return self.withheld.get(backend, {})


def assign(
    ops: Mapping[str, str],
    order: Sequence[str],
    never: Mapping[str, Iterable[str]],
    supported: Mapping[str, set[str]] | None = None,
    edges: Iterable[tuple[str, str]] = (),
    devices: Mapping[str, str] | None = None,
) -> Assignment:
    """Assign the ops of one program to the backends of ``order``.

    ``ops`` maps each op's node name to its op name; ``never`` each backend to the pins that
    keep ops off it: op names, and node names as ``"node:NAME"``. ``supported`` (each backend's takes, on the same program) turns on
    consolidation over the data ``edges`` between ops, with each backend's device from
    ``devices``; without it, priority order and pins are the whole assignment.
    """
    withheld: dict[str, dict[str, str]] = {backend: {} for backend in order}
    for backend in order:
        pinned = frozenset(never.get(backend, ()))
        for node, op in ops.items():
            if op in pinned:
                withheld[backend][node] = user_pinned(backend)
            elif node_pin(node) in pinned:
                withheld[backend][node] = f"{user_pinned(backend)} (node pin)"
    if supported is not None:
        offered = {
            backend: supported.get(backend, set()) - withheld[backend].keys() for backend in order
        }
        owner = {
            node: next((backend for backend in order if node in offered[backend]), PORTABLE)
            for node in ops
        }
        moves = islands_to_move(owner, offered, edges, devices or {})
        for node, receiver in moves.items():
            withheld[owner[node]][node] = (
                f"left to {receiver}: a small island between its partitions, moved to save a "
                "round trip off its device"
            )
    return Assignment({backend: reasons for backend, reasons in withheld.items() if reasons})


def warn_about_pins_naming_no_op(
    never: Mapping[str, Iterable[str]], in_program: Iterable[str], nodes: Iterable[str] = ()
) -> None:
    """Warn about each pin that names no op (or, ``node:NAME``, no node of ``nodes``), with
    the closest names as a hint."""
    # A pin is an op name; one with a typo (aten.relu for aten.relu.default) would pin
    # nothing, silently. A real op the model does not use is fine: configs are shared.
    in_program = sorted(set(in_program))
    nodes = sorted(set(nodes))
    for backend, pins in never.items():
        for pin in sorted(set(pins) - set(in_program)):
            if pin.startswith(NODE_PIN):
                _warn_about_node_pin(backend, pin, nodes)
                continue
            if _names_an_op(pin):
                continue
            close = difflib.get_close_matches(pin, in_program, n=3)
            close += difflib.get_close_matches(pin, sorted(_overloads_of(pin) - set(close)), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else " (use aten.NAME.OVERLOAD)"
            warnings.warn(
                f"the pin never {backend} = {pin!r} names no op{hint}",
                ComposerWarning,
                stacklevel=2,
            )


def _warn_about_node_pin(backend: str, pin: str, nodes: Sequence[str]) -> None:
    # A node pin belongs to one model's edge program (a measured placement wrote it); its
    # name can change with the model, the stack or the torch version, and then pins nothing.
    name = pin[len(NODE_PIN) :]
    if name in nodes:
        return
    close = difflib.get_close_matches(name, nodes, n=3)
    hint = f"; did you mean {', '.join(NODE_PIN + c for c in close)}?" if close else ""
    warnings.warn(
        f"the pin never {backend} = {pin!r} names no node of this program{hint} (node names "
        "are the edge program's, as `composer plan --json` lists them; measure again with "
        "--placement measured if the model or the stack changed)",
        StalePinWarning,
        stacklevel=3,
    )


def _names_an_op(name: str) -> bool:
    """Whether ``name`` is an op overload as composer names them (``aten.add.Tensor``)."""
    namespace, _, rest = name.partition(".")
    op, _, overload = rest.rpartition(".")
    if not (namespace and op and overload):
        return False
    try:
        packet = getattr(getattr(torch.ops, namespace), op)
    except (AttributeError, RuntimeError):
        return False
    return overload in packet.overloads()


def _overloads_of(name: str) -> set[str]:
    """``aten.relu.default`` and the other overloads of the op ``name`` starts with."""
    namespace, _, rest = name.partition(".")
    op = rest.split(".")[0]
    try:
        packet = getattr(getattr(torch.ops, namespace), op)
        return {f"{namespace}.{op}.{overload}" for overload in packet.overloads()}
    except (AttributeError, RuntimeError):
        return set()
