"""The description of one backend, as a plugin declares it."""

from __future__ import annotations

import attrs

DEVICES = ("cpu", "cuda", "mps")


@attrs.frozen
class BackendSpec:
    """A backend a plugin provides.

    ``name`` is what users write in a priority list (``"xnnpack"``); ``backend_id`` is the
    ExecuTorch ``BackendDetails`` class name that lowers it (``"XnnpackBackend"``).
    """

    name: str = attrs.field(validator=attrs.validators.instance_of(str))
    backend_id: str = attrs.field(validator=attrs.validators.instance_of(str))
    device: str = attrs.field(default="cpu", validator=attrs.validators.in_(DEVICES))
    min_partition_size: int = attrs.field(
        default=1, validator=[attrs.validators.instance_of(int), attrs.validators.ge(1)]
    )
    description: str = ""
