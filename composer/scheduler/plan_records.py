"""The records a plan is made of, typed, each with the JSON form the plan writes
(``to_dict``) and reads back (``from_dict``): the keys stay as they were when these were dicts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs


def _frozen_dict(value: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if value is None else dict(value)


@attrs.frozen
class Repair:
    """A partition whose backend failed it (to lower, to run, or to match eager), and what the
    proof did: moved its nodes (``moved_to``: backend -> how many went there), or first gave
    the backend its safer ``options`` (then its nodes stayed)."""

    backend: str
    partition: str  # "openvino:1", "brittle partition of aten_linear_default"
    nodes: tuple[str, ...] = attrs.field(converter=tuple)
    why: str
    moved_to: dict[str, int] = attrs.field(factory=dict, converter=dict)
    options: dict[str, str] | None = attrs.field(default=None, converter=_frozen_dict)

    def to_dict(self) -> dict[str, Any]:
        data = {
            "backend": self.backend,
            "partition": self.partition,
            "nodes": list(self.nodes),
            "why": self.why,
            "moved_to": dict(self.moved_to),
        }
        if self.options:
            data["options"] = dict(self.options)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Repair:
        return cls(
            data["backend"], data["partition"], data["nodes"], data["why"],
            data.get("moved_to", {}), data.get("options"),
        )  # fmt: skip
