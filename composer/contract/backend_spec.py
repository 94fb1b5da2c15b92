"""The description of one backend, as a plugin declares it."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

# Where a backend's delegates keep their data; a plan counts a crossing wherever data moves
# between two of them. "gpu" is a GPU other than CUDA's (Vulkan, WebGPU), "npu" an NPU or DSP
# (Core ML's Neural Engine, QNN's HTP, Ethos-U).
DEVICES = ("cpu", "cuda", "mps", "gpu", "npu")


@attrs.frozen
class Tolerance:
    """How far a backend's results may be from eager's: ``|got - want| <= atol + rtol*|want|``.

    ``reason`` says why the backend needs more than the default (``"computes in bf16"``); it is
    shown in the plan and the report beside the numbers.
    """

    atol: float = attrs.field(converter=float, validator=attrs.validators.ge(0))
    rtol: float = attrs.field(converter=float, validator=attrs.validators.ge(0))
    reason: str = ""
    # atol grows to this fraction of the largest |eager output|, for errors that scale with
    # the values themselves (activations quantized at run time, whose scales follow them)
    of_largest: float = attrs.field(default=0.0, converter=float, validator=attrs.validators.ge(0))
    # integer outputs (a delegate handing on int8 values) may differ by this many steps: an
    # integer kernel rounds where the q/dq simulation computes in float
    steps: int = attrs.field(default=0, converter=int, validator=attrs.validators.ge(0))

    def to_dict(self) -> dict[str, object]:
        extra = {"of_largest": self.of_largest} if self.of_largest else {}
        if self.steps:
            extra["steps"] = self.steps
        return {"atol": self.atol, "rtol": self.rtol, "reason": self.reason, **extra}

    @classmethod
    def loosest(cls, declared: Mapping[str, Tolerance]) -> Tolerance | None:
        """One tolerance as loose as every one of ``declared`` (by backend name), or ``None``."""
        if not declared:
            return None
        reasons = "; ".join(f"{name}: {t.reason}" for name, t in declared.items() if t.reason)
        return cls(
            max(t.atol for t in declared.values()),
            max(t.rtol for t in declared.values()),
            reasons,
            max(t.of_largest for t in declared.values()),
            max(t.steps for t in declared.values()),
        )


@attrs.frozen
class BackendSpec:
    """A backend a plugin provides.

    ``name`` is what users write in a priority list (``"xnnpack"``); ``backend_id`` is the
    ExecuTorch ``BackendDetails`` class name that lowers it (``"XnnpackBackend"``).
    ``tolerance`` loosens verification for programs this backend takes part in (``None``:
    the default for the output's dtype). ``library`` names the library and version that
    compile its delegates (``"openvino 2025.4.1"``); composer records it in the plan, the
    report and the program, so a runtime with another version can say so.
    ``keeps_state``: its delegates can own a buffer the program updates in place (an LLM's KV
    cache), as ExecuTorch's AOTInductor backends do: a mutated buffer that only one of its
    partitions reads and writes goes into that delegate and stays on its device between
    calls, as the backend's own partitioner (``tag_mutated_buffer``) would place it. Off: such
    buffers stay outside every delegate, handed in and out on each call.
    """

    name: str = attrs.field(validator=attrs.validators.instance_of(str))
    backend_id: str = attrs.field(validator=attrs.validators.instance_of(str))
    device: str = attrs.field(default="cpu", validator=attrs.validators.in_(DEVICES))
    min_partition_size: int = attrs.field(
        default=1, validator=[attrs.validators.instance_of(int), attrs.validators.ge(1)]
    )
    description: str = ""
    tolerance: Tolerance | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(Tolerance))
    )
    library: str = ""
    keeps_state: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
