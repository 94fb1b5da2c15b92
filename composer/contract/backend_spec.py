"""The description of one backend, as a plugin declares it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import attrs

# Where a backend's delegates keep their data; a plan counts a crossing wherever data moves
# between two of them. "gpu" is a GPU other than CUDA's (Vulkan, WebGPU), "npu" an NPU or DSP
# (Core ML's Neural Engine, QNN's HTP, Ethos-U).
DEVICES = ("cpu", "cuda", "mps", "gpu", "npu")


PRECISIONS = ("float16", "bfloat16")


@attrs.frozen
class Tolerance:
    """What a backend declares about its precision, which the proof takes into account.

    The proof judges every program against a higher-precision truth beside eager
    (``composer.run.accuracy``), so a backend needs no tolerance of its own to be judged
    fairly. ``precision`` names a lower precision the backend computes float models in by
    design (``"bfloat16"``: OpenVINO on CPUs with bf16 units; ``"float16"``): its programs are
    then held to eager run in that precision, and the plan says so. ``reason`` says why; it is
    shown beside it. ``atol`` and ``rtol`` are what the backend's delegates usually miss eager
    by, shown in the plan: they decide nothing (hand-set numbers say nothing of how far eager
    itself is from the truth). ``steps``: integer outputs (a delegate handing on int8 values)
    may differ by this many, since an integer kernel rounds where the q/dq simulation does not.
    """

    atol: float = attrs.field(converter=float, validator=attrs.validators.ge(0))
    rtol: float = attrs.field(converter=float, validator=attrs.validators.ge(0))
    reason: str = ""
    steps: int = attrs.field(default=0, converter=int, validator=attrs.validators.ge(0))
    precision: str = attrs.field(default="", validator=attrs.validators.in_(("", *PRECISIONS)))

    def to_dict(self) -> dict[str, object]:
        extra: dict[str, object] = {"steps": self.steps} if self.steps else {}
        if self.precision:
            extra["precision"] = self.precision
        return {"atol": self.atol, "rtol": self.rtol, "reason": self.reason, **extra}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Tolerance:
        """The tolerance ``to_dict`` wrote (a plan's ``tolerances`` and ``quantization``)."""
        return cls(
            data["atol"], data["rtol"], data.get("reason", ""), data.get("steps", 0),
            data.get("precision", ""),
        )  # fmt: skip

    @classmethod
    def loosest(cls, declared: Mapping[str, Tolerance]) -> Tolerance | None:
        """One tolerance as loose as every one of ``declared`` (by backend name), or ``None``."""
        if not declared:
            return None
        reasons = "; ".join(f"{name}: {t.reason}" for name, t in declared.items() if t.reason)
        precisions = [t.precision for t in declared.values() if t.precision]
        return cls(
            max(t.atol for t in declared.values()),
            max(t.rtol for t in declared.values()),
            reasons,
            max(t.steps for t in declared.values()),
            # the lowest: float16's 10 bits of mantissa beside bfloat16's 7 round less
            "bfloat16" if "bfloat16" in precisions else (precisions[0] if precisions else ""),
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
    ``safer_options``: options of this backend that trade speed for accuracy (the cuda
    plugin's ``{"triton_kernel_mode": "OFF"}``: no Triton SDPA): where one of its delegates
    computes wrong or fails at run time, the proof tries the stack with these set before it
    moves the delegate's nodes to the next backend. ``safer_for``: the ops whose lowering those
    options change (the cuda plugin's: the ops ExecuTorch replaces with Triton kernels); a
    failed partition holding none of them moves at once, with no second compile of every
    partition (empty: the options may change any partition).
    ``sizes_from_shapes``: its delegates take tensors only, never a size as an int (the
    AOTInductor backends): composer gives each node that reads a dynamic input's size its
    own ``sym_size`` node before partitioning, so each delegate computes the size from the
    input's shape instead of receiving it.
    ``needs_a_runtime_input``: each of its delegates must read a tensor that is not a constant
    (an input or what another delegate computed). AOTInductor picks a graph's device from its
    inputs and kernels; a partition of constants alone (deit's class token, expanded) compiles
    for the CPU and fails ("Mixed-device constants are only supported when the secondary
    device is CPU"). Such a partition is left to the next backend.
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
    safer_options: tuple[tuple[str, str], ...] = attrs.field(
        default=(), converter=lambda given: tuple(sorted(dict(given).items()))
    )
    safer_for: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    sizes_from_shapes: bool = attrs.field(
        default=False, validator=attrs.validators.instance_of(bool)
    )
    needs_a_runtime_input: bool = attrs.field(
        default=False, validator=attrs.validators.instance_of(bool)
    )


def safer_options_change(safer_for: Sequence[str], ops: Iterable[str]) -> bool:
    """Whether a backend's safer options can change a partition of ``ops``
    (``BackendSpec.safer_for``; empty: any partition)."""
    return not safer_for or any(op in safer_for for op in ops)
