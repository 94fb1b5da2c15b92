"""What "right" means: a program's outputs judged against a higher-precision truth, beside eager's.

torch._dynamo judges a compiled model this way (``torch._dynamo.utils.same`` with ``fp64_ref``):
the model run in float64 is the truth, and the compiled result's error against it (RMSE) may be a
small multiple of eager's own error against it. A bf16 program is then held to what bf16 eager
achieves at that size, not to a hand-set atol: plain ExecuTorch's CUDA encoder, 58x eager's error
at length 3, fails; a program as close as eager passes however loose bf16 is.

The rule is ``same(eager, program, fp64_ref=truth, tol=1e-4,
use_larger_multiplier_for_smaller_tensor=True)``: within 1e-4 of eager, or an RMSE against the
truth at most 2x eager's (3x for the half types, up to 10x for outputs of a few elements, whose
RMSE a single element decides). The verdict carries the figures. Two extensions:

- the worst element is bounded too: at most 10x eager's worst error against the truth. RMSE
  dilutes a few wrong elements (OpenVINO's int8 average pooling, 22 quantization steps off at
  the edge of 408 elements, had an RMSE within 6x eager's), which ExecuTorch's own backend
  suite, comparing element by element, fails;

- a quantized model's truth is the model with its activations' quantize/dequantize pairs taken
  out: the float computation the q/dq simulation approximates. Eager is the
  q/dq simulation, integer kernels the program.

Without a truth (a model that will not run in float64), the program is held to eager within the
dtype's default tolerance, as dynamo does when it has no ``fp64_ref``; the verdict says so.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import attrs
import torch
import torch.fx
import torch.utils._pytree as pytree

from composer.contract.machine import machine_error

# torch._dynamo.utils.same: 2x eager's RMSE for fp32, 3x for the half types, more for small
# tensors, whose RMSE is dominated by a few elements (its use_larger_multiplier_for_smaller_tensor).
FLOAT_MULTIPLIER = 2.0
HALF_MULTIPLIER = 3.0
SMALL_MULTIPLIERS = ((10, 10.0), (500, 8.0), (999, 3.0))  # (numel at most, multiplier)
HALF_TYPES = (torch.float16, torch.bfloat16)
# The worst element's bound, against eager's worst (dynamo's largest multiplier): what is
# legitimately different (another order of summation, an integer kernel's rounding) moves the
# worst element about as much as the RMSE; a few wrong elements move it far more.
WORST_MULTIPLIER = 10.0
# same()'s default tol: a program within it of eager passes outright (fp32 programs that sum
# in another order), and tol/10 is the absolute slack where eager is exact.
TOL = 1e-4


def default_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) against eager where no higher-precision truth exists (dynamo's ``tol``)."""
    if dtype in HALF_TYPES:
        return 1e-2, 1e-2
    if dtype.is_floating_point:
        return 1e-4, 1e-4
    return 0.0, 0.0


def multiplier(dtype: torch.dtype, numel: int) -> float:
    """How many times eager's error a program's error may be, as torch._dynamo allows."""
    for most, factor in SMALL_MULTIPLIERS:
        if numel <= most:
            return factor
    return HALF_MULTIPLIER if dtype in HALF_TYPES else FLOAT_MULTIPLIER


def flatten_tensors(value: Any) -> list[torch.Tensor]:
    """The tensors of a (nested) output, in order, as torch.export flattens them: eager's
    tuples, lists, dicts and model-output classes against the runtime's flat list."""
    return [leaf for leaf in pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor)]


@attrs.frozen
class OutputVerdict:
    """One output tensor's figures: errors are RMSE against the truth."""

    ok: bool
    max_abs: float  # max |program - eager|, the figure users compare by eye
    program_error: float | None = None  # RMSE of the program against the truth
    eager_error: float | None = None  # RMSE of eager against the truth
    allowed: float | None = None
    why: str = ""  # for a failure without figures: "shape [2, 3] against [2, 4]"
    program_worst: float | None = None  # max |program - truth|
    eager_worst: float | None = None  # max |eager - truth|
    worst_allowed: float | None = None
    # Elements left out of the figures: NaN or inf in the reference, as in the program (or
    # anything in the program where the inputs held NaN or inf), and what they were.
    not_compared: int = 0
    compared: int = 0
    nonfinite: str = ""  # "NaN", "inf", "NaN or inf": what the reference held there
    # of those, where the program held something else: not judged, for the inputs held NaN
    # or inf, and what a backend makes of them is its own
    excused: int = 0

    @property
    def share(self) -> float:
        """How much of its allowance the output used (the larger of RMSE's and the worst
        element's; infinite where a failure has no figures)."""
        if self.program_error is None or not self.allowed:
            return math.inf
        share = self.program_error / self.allowed
        if self.program_worst is not None and self.worst_allowed:
            share = max(share, self.program_worst / self.worst_allowed)
        return share

    @property
    def worst_element_failed(self) -> bool:
        """Whether the worst element, not the RMSE, is what is past its allowance."""
        return (
            self.program_worst is not None
            and self.worst_allowed is not None
            and self.program_worst > self.worst_allowed
            and self.program_error is not None
            and self.allowed is not None
            and self.program_error <= self.allowed
        )


@attrs.frozen
class Verdict:
    """How a program's outputs compare with the truth, beside eager's."""

    outputs: tuple[OutputVerdict, ...]
    truth: str  # "fp64", "float model in fp64", or "" (none: eager at the default tolerance)
    eager_in: str = ""  # the precision eager was run in, where not the model's ("bfloat16")

    @property
    def ok(self) -> bool:
        return all(output.ok for output in self.outputs)

    @property
    def max_abs_error(self) -> float:
        worst = 0.0
        for output in self.outputs:
            if math.isnan(output.max_abs):
                return float("nan")
            worst = max(worst, output.max_abs)
        return worst

    @property
    def nothing_compared(self) -> bool:
        """Whether no element was compared: every output NaN or inf in the reference too (a
        NaN weight), or empty. Not a mismatch, and never a match."""
        return (
            self.ok
            and sum(o.not_compared for o in self.outputs) > 0
            and sum(o.compared for o in self.outputs) == 0
        )

    def nonfinite_said(self) -> str:
        """How many output elements were left out as NaN or inf, or ""."""
        left = sum(o.not_compared for o in self.outputs)
        if not left:
            return ""
        total = sum(o.not_compared + o.compared for o in self.outputs)
        kinds = {o.nonfinite for o in self.outputs if o.nonfinite}
        kind = kinds.pop() if len(kinds) == 1 else "NaN or inf"
        where = self.truth or "eager"
        excused = sum(o.excused for o in self.outputs)
        differ = (
            f" (the program's differ at {excused} of them: the inputs hold NaN or inf, and "
            "what a backend makes of those is not judged)"
            if excused
            else ""
        )
        if self.nothing_compared:
            return f"nothing compared: every output element is {kind} in {where} too{differ}"
        return f"{left} of {total} output elements {kind} in {where} too, not compared{differ}"

    def worst(self) -> OutputVerdict | None:
        """A failing output (one without figures first), else the one closest to its allowance."""
        pool = [o for o in self.outputs if not o.ok] or [
            o for o in self.outputs if o.allowed is not None
        ]
        if not pool:
            return None
        return max(pool, key=lambda o: o.share)

    def describe(self) -> str:
        """``rmse 0.0051 against fp64, eager bf16 0.0047, allowed 0.014``; or why not judged so;
        and how many elements were NaN or inf, where any were."""
        said = self._figures()
        nonfinite = self.nonfinite_said()
        if self.nothing_compared:
            return nonfinite
        return f"{said}; {nonfinite}" if nonfinite and self.ok else said

    def _figures(self) -> str:
        worst = self.worst()
        if worst is None:
            without = (
                "" if self.truth else " (no higher-precision run of this model: held to eager)"
            )
            return f"max |composed - eager| = {self.max_abs_error:.3g}{without}"
        if worst.program_error is None:
            return worst.why
        eager = f"eager {self.eager_in} " if self.eager_in else "eager "
        if worst.worst_element_failed:
            eager = f"eager {self.eager_in}'s" if self.eager_in else "eager's"
            return (
                f"worst element {worst.program_worst:.3g} off {self.truth}, {eager} "
                f"{worst.eager_worst:.3g}, allowed {worst.worst_allowed:.3g} (rmse "
                f"{worst.program_error:.3g} within {worst.allowed:.3g}: a few elements wrong)"
            )
        return (
            f"rmse {worst.program_error:.3g} against {self.truth}, {eager}"
            f"{worst.eager_error:.3g}, allowed {worst.allowed:.3g}"
        )


def judge(
    program: Any, eager: Any, truth: Any = None, *, steps: int = 0, truth_name: str = "fp64",
    eager_in: str = "", inputs_nonfinite: bool = False,
) -> Verdict:  # fmt: skip
    """Judge ``program``'s outputs against ``truth`` beside ``eager``'s (all nested as the model
    returns them). ``steps``: integer outputs may differ by that many (an int8 kernel rounds
    where the q/dq simulation does not).

    NaN and inf compare as ``torch.testing.assert_close(equal_nan=True)`` compares them: the
    same NaN and inf (with its sign) as the reference's is equal, and left out of the figures;
    another one is a mismatch, except where the reference holds NaN or inf and the inputs did
    (``inputs_nonfinite``): what a backend makes of an inf is its own, and the model's answer
    there is not a number to hold it to."""
    got, want = flatten_tensors(program), flatten_tensors(eager)
    true = flatten_tensors(truth) if truth is not None else None
    if true is not None and len(true) != len(want):
        true = None
    if len(got) != len(want):
        lost = OutputVerdict(False, math.inf, why=f"{len(got)} outputs against eager's {len(want)}")
        return Verdict((lost,), truth_name if true is not None else "", eager_in)
    verdicts = tuple(
        _judge_one(g, w, None if true is None else true[i], steps, inputs_nonfinite)
        for i, (g, w) in enumerate(zip(got, want))
    )
    return Verdict(verdicts, truth_name if true is not None else "", eager_in)


def rmse(reference: torch.Tensor, value: torch.Tensor) -> float:
    return torch.sqrt(torch.mean(torch.square(reference - value))).item()


def worst(reference: torch.Tensor, value: torch.Tensor) -> float:
    """max |reference - value| (0 for empty tensors)."""
    return (reference - value).abs().max().item() if reference.numel() else 0.0


def holds_nonfinite(value: Any) -> bool:
    """Whether ``value`` (inputs, nested) holds a NaN or an inf in a floating tensor."""
    return any(
        t.is_floating_point() and not bool(t.isfinite().all()) for t in flatten_tensors(value)
    )


def _judge_one(
    got: torch.Tensor,
    want: torch.Tensor,
    true: torch.Tensor | None,
    steps: int,
    inputs_nonfinite: bool = False,
) -> OutputVerdict:
    if got.shape != want.shape:
        why = f"output shape {list(got.shape)} against eager's {list(want.shape)}"
        return OutputVerdict(False, math.inf, why=why)
    if not want.is_floating_point():
        difference = (got.to(torch.int64) - want.to(torch.int64)).abs() if want.numel() else None
        largest = 0.0 if difference is None else float(difference.max().item())
        ok = largest <= steps
        return OutputVerdict(
            ok, largest, why="" if ok else f"integer outputs differ by {largest:g}",
            compared=want.numel(),
        )  # fmt: skip
    if want.numel() == 0:
        return OutputVerdict(True, 0.0)
    program, eager = got.detach().double(), want.detach().double()
    usable = true is not None and true.is_floating_point() and true.shape == want.shape
    true = true.detach().double() if usable else None
    # NaN where eager has NaN is what eager computes (a model with uninitialized weights:
    # export_llama without a checkpoint); NaN elsewhere, or none where eager has one, is not.
    kept = _Finite.of(program, eager, true, inputs_nonfinite)
    if kept.wrong:
        return OutputVerdict(False, float("nan"), why=kept.wrong)
    counts = {"not_compared": kept.left, "compared": want.numel() - kept.left,
              "nonfinite": kept.kind, "excused": kept.excused}  # fmt: skip
    if kept.left:
        program, eager = program[kept.mask], eager[kept.mask]
        true = None if true is None else true[kept.mask]
        if not program.numel():
            return OutputVerdict(True, 0.0, **counts)
    max_abs = worst(eager, program)
    if true is None:
        atol, rtol = default_tolerance(want.dtype)
        ok = torch.allclose(program, eager, atol=atol, rtol=rtol)
        why = "" if ok else (
            f"max |composed - eager| = {max_abs:.3g}, past atol {atol:g} rtol {rtol:g} "
            "(no higher-precision run to judge by)"
        )  # fmt: skip
        return OutputVerdict(ok, max_abs, why=why, **counts)
    if not bool(true.isfinite().all()):
        true = torch.where(true.isfinite(), true, eager)  # eager decides where fp64 cannot
    program_error, eager_error = rmse(true, program), rmse(true, eager)
    allowed = multiplier(want.dtype, program.numel()) * eager_error + TOL / 10
    program_worst, eager_worst = worst(true, program), worst(true, eager)
    worst_allowed = WORST_MULTIPLIER * eager_worst + TOL / 10
    # dynamo's first test: as close to eager as fp32 accumulation order ever makes two
    # programs (a bf16 program is never that close unless it computes what eager does)
    ok = torch.allclose(program, eager, atol=TOL, rtol=TOL) or (
        program_error <= allowed and program_worst <= worst_allowed
    )
    return OutputVerdict(
        ok, max_abs, program_error, eager_error, allowed, "", program_worst, eager_worst,
        worst_allowed, **counts,
    )  # fmt: skip


def _same_nonfinite(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Where ``a`` and ``b`` hold the same NaN or inf (an inf of the same sign)."""
    return ~a.isfinite() & ((a == b) | (a.isnan() & b.isnan()))


@attrs.frozen
class _Finite:
    """Which elements of one output are compared: where the program and eager both computed a
    number. The rest must be the reference's NaN and inf, as assert_close(equal_nan=True)
    compares them: eager's, or the truth's where eager's dtype overflowed and the program did
    not."""

    mask: torch.Tensor  # the elements compared
    left: int  # how many were not
    kind: str  # what the reference held where they were not: "NaN", "inf", "NaN or inf"
    excused: int  # of those, where the program held another (the inputs held NaN or inf)
    wrong: str  # why the program's NaN and inf are not the reference's, or ""

    @classmethod
    def of(
        cls, program: torch.Tensor, eager: torch.Tensor, true: torch.Tensor | None,
        inputs_nonfinite: bool,
    ) -> _Finite:  # fmt: skip
        program_finite, eager_finite = program.isfinite(), eager.isfinite()
        mask = program_finite & eager_finite
        if bool(mask.all()):
            return cls(mask, 0, "", 0, "")
        true_finite = eager_finite if true is None else true.isfinite()
        agree = mask | _same_nonfinite(program, eager)
        if true is not None:
            agree |= _same_nonfinite(program, true) | (program_finite & true_finite)
        differ = ~agree
        # Where the reference itself is no number, and the inputs held NaN or inf, the
        # program is not held to the reference's NaN: OpenVINO computes numbers from an
        # input's inf where eager computes NaN, and right at every other element.
        excused = differ & ~(eager_finite & true_finite)
        if not inputs_nonfinite:
            excused = torch.zeros_like(differ)
        wrong = differ & ~excused
        reference = eager if true is None else torch.where(true_finite, eager, true)
        skipped = ~mask
        nan = bool((reference.isnan() & skipped).any())
        inf = bool((reference.isinf() & skipped).any())
        kind = "NaN or inf" if nan and inf else "NaN" if nan else "inf" if inf else "NaN or inf"
        return cls(mask, int(skipped.sum()), kind, int(excused.sum()), _said_wrong(
            program, eager, wrong))  # fmt: skip


def _said_wrong(program: torch.Tensor, eager: torch.Tensor, wrong: torch.Tensor) -> str:
    """Why the program's NaN and inf are not eager's, in counts; "" where they are."""
    if not bool(wrong.any()):
        return ""
    program_finite, eager_finite = program.isfinite(), eager.isfinite()
    said = []
    if count := int((wrong & ~program_finite & eager_finite).sum()):
        said.append(f"{count} NaN or inf where eager computes a number")
    if count := int((wrong & program_finite & ~eager_finite).sum()):
        said.append(f"{count} number(s) where eager's are NaN or inf")
    if count := int((wrong & ~program_finite & ~eager_finite).sum()):
        said.append(f"{count} NaN or inf unlike eager's")
    return f"of {program.numel()} output elements, " + ", ".join(said)


# --- the truth: the model in float64, or a quantized model without its activations' q/dq ---


def in_precision(value: Any, dtype: torch.dtype) -> Any:
    """``value`` (inputs or outputs, nested) with its floating tensors in ``dtype``."""
    return pytree.tree_map(
        lambda leaf: (
            leaf.to(dtype) if isinstance(leaf, torch.Tensor) and leaf.is_floating_point() else leaf
        ),
        value,
    )


def run_in_precision(
    module: torch.nn.Module, inputs: Sequence[Any], dtype: torch.dtype
) -> Any | None:
    """``module`` on ``inputs``, its floating parameters, buffers and inputs in ``dtype``, on a
    copy (a KV cache updated in place stays as it was); ``None`` where the model will not run so
    (an op without a float64 kernel, a dtype written into the graph)."""
    copied = copy_in_precision(module, dtype)
    if copied is None:
        return None
    try:
        with torch.no_grad():
            return copied(*in_precision(tuple(inputs), dtype))
    except Exception as error:  # any other failure means the same: no run in that precision
        if machine_error(error) is not None:
            raise  # out of memory: the machine's, not a model that will not run so
        return None
    finally:
        free_copy(copied)


def free_copy(copied: torch.nn.Module) -> None:
    """Free the tensors of a copy of the model that is done with. A GraphModule's copy is a
    reference cycle (its graph names the module that owns it), which only the collector frees,
    and it came too seldom: a proof at four sizes held each size's float32 and float64 copies
    of the model to its end (vgg11 at dynamic sizes: 9.0 GB at its peak, beside plain
    ExecuTorch's 3.2 GB). A collection costs 0.2 s after composer's imports; this, nothing."""
    for module in copied.modules():
        module._parameters.clear()
        module._buffers.clear()
        for name in [n for n, value in vars(module).items() if isinstance(value, torch.Tensor)]:
            del vars(module)[name]  # a GraphModule's lifted tensor constants


def copy_in_precision(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module | None:
    """A copy of ``module`` with its floating parameters, buffers and the dtypes its graph
    names in ``dtype`` (a decoding loop steps it as it steps the model: its cache is its own);
    ``None`` where it cannot be made."""
    try:
        copied = copy.deepcopy(module, _converted(module, dtype))
        # An exported graph may sit inside a wrapper (a method with keyword inputs is called
        # through KeywordsFlattened): optimum's decoders were held to eager for want of this.
        for graph_module in copied.modules():
            if isinstance(graph_module, torch.fx.GraphModule):
                _dtypes_written_as(graph_module, dtype)
        # The memo made every tensor it reached in dtype already; this converts what a
        # module's own __deepcopy__ copied without it (else the "truth" stays float32).
        with torch.no_grad():
            for tensor in (*copied.parameters(), *copied.buffers()):
                if tensor.is_floating_point():
                    tensor.data = tensor.data.to(dtype)
            for name, value in list(vars(copied).items()):
                # a GraphModule's lifted tensor constants are plain attributes
                if isinstance(value, torch.Tensor) and value.is_floating_point():
                    setattr(copied, name, value.to(dtype))
        return copied
    except Exception:  # noqa: BLE001 - any failure means the same: no copy in that precision
        return None


def _converted(module: torch.nn.Module, dtype: torch.dtype) -> dict[int, Any]:
    """A deepcopy memo giving each floating tensor of ``module`` its copy in ``dtype``: the
    copy is made once, in ``dtype``, where a deepcopy then a conversion held a float32 copy
    of every weight beside the float64 one (vgg11: 0.5 GB more at the proof's peak). A tensor
    two modules share stays shared."""
    memo: dict[int, Any] = {}
    with torch.no_grad():
        for part in module.modules():
            for tensor in (*part._parameters.values(), *part._buffers.values(), *vars(part).values()):  # fmt: skip
                if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
                    continue
                if id(tensor) not in memo:
                    converted = tensor.detach().to(dtype, copy=True)
                    if isinstance(tensor, torch.nn.Parameter):
                        converted = torch.nn.Parameter(converted, tensor.requires_grad)
                    memo[id(tensor)] = converted
    return memo


def _dtypes_written_as(module: torch.fx.GraphModule, dtype: torch.dtype) -> None:
    """Every floating dtype an exported graph names (``.to(torch.float32)`` became
    ``_to_copy(dtype=torch.float32)`` and ``_assert_tensor_metadata(..., torch.float32)``;
    ``arange``, ``full`` and ``zeros`` name theirs) made ``dtype``: export_llama's decoder would
    otherwise not run in float64 at all, and the proof held it to eager itself."""

    if any(node.op == "call_function" and _foreign(node.target) for node in module.graph.nodes):
        return  # a custom op (export_llama's llama::sdpa) may not check its dtype: left as is
    cast: list[torch.dtype] = []

    def as_dtype(value: Any) -> Any:
        if isinstance(value, torch.dtype) and value.is_floating_point and value != dtype:
            cast.append(value)
            return dtype
        return value

    for node in module.graph.nodes:
        if node.op == "call_function":
            node.args = torch.fx.node.map_aggregate(node.args, as_dtype)
            node.kwargs = torch.fx.node.map_aggregate(node.kwargs, as_dtype)
    if cast:
        module.recompile()


def _foreign(target: Any) -> bool:
    """Whether ``target`` is an op outside ATen's (and Python's): its float64 kernel, if any,
    is not known to compute what its float32 one does."""
    if isinstance(target, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
        return target.namespace not in ("aten", "prims")
    return isinstance(target, torch._ops.HigherOrderOperator)  # cond, map: graphs of their own


def eager_in_precision(
    module: torch.nn.Module, inputs: Sequence[Any], eager: Any, precision: str | None
) -> tuple[Any, str]:
    """(eager's outputs as a backend computing in ``precision`` by design is held to them, that
    precision's name or ""): ``module`` run in that precision where ``eager``'s outputs are more
    precise (OpenVINO in bf16 on an fp32 model), else ``eager`` as it is."""
    if not precision:
        return eager, ""
    dtype = getattr(torch, precision)
    finer = any(
        t.is_floating_point() and torch.finfo(t.dtype).eps < torch.finfo(dtype).eps
        for t in flatten_tensors(eager)
    )
    lowered = run_in_precision(module, inputs, dtype) if finer else None
    return (eager, "") if lowered is None else (_integers_of(eager, lowered), precision)


def _integers_of(eager: Any, lowered: Any) -> Any:
    """``lowered`` with its integer outputs taken from ``eager``: bf16's rounding ties values
    that float32 keeps apart, so eager in bf16 picks other indices (a max-pool's, 63 apart),
    where a backend computing in bf16 is held to its values, not to eager's ties."""
    eager_leaves, _ = torch.utils._pytree.tree_flatten(eager)
    lowered_leaves, spec = torch.utils._pytree.tree_flatten(lowered)
    if len(eager_leaves) != len(lowered_leaves):
        return lowered
    kept = [
        e if isinstance(e, torch.Tensor) and not e.is_floating_point() else lo
        for e, lo in zip(eager_leaves, lowered_leaves, strict=True)
    ]
    return torch.utils._pytree.tree_unflatten(kept, spec)


_QUANTIZE = {
    "quantize_per_tensor",
    "quantize_per_channel",
    "quantize_per_token",
    "quantize_affine",
}
_DEQUANTIZE = {"dequantize_per_tensor", "dequantize_per_channel", "dequantize_per_token",
               "dequantize_affine"}  # fmt: skip


def _kind(node: torch.fx.Node) -> str:
    target = node.target
    name = getattr(target, "__name__", str(target))
    if hasattr(target, "_schema"):
        name = target._schema.name.split("::")[-1]
    return name.split(".")[0]


def unquantized(module: torch.nn.Module) -> torch.nn.Module | None:
    """A copy of a PT2E-quantized ``module`` (a GraphModule) with every activation's
    ``dequantize(quantize(x))`` replaced by ``x``: the float computation its q/dq simulation
    approximates (weights stay as quantized). ``None`` where ``module`` has no such pair."""
    if not isinstance(module, torch.fx.GraphModule):
        return None
    copied = copy.deepcopy(module)
    found = False
    for node in list(copied.graph.nodes):
        if node.op != "call_function" or _kind(node) not in _DEQUANTIZE:
            continue
        source = node.args[0] if node.args else None
        if not isinstance(source, torch.fx.Node) or source.op != "call_function":
            continue
        if _kind(source) not in _QUANTIZE:
            continue
        value = source.args[0]
        if not isinstance(value, torch.fx.Node) or value.op in ("get_attr",):
            continue  # a weight quantized in the graph: part of the model
        node.replace_all_uses_with(value)
        found = True
    if not found:
        return None
    copied.graph.eliminate_dead_code()
    copied.recompile()
    return copied


def is_quantized(module: torch.nn.Module) -> bool:
    return isinstance(module, torch.fx.GraphModule) and any(
        n.op == "call_function" and _kind(n) in _DEQUANTIZE for n in module.graph.nodes
    )


def truth(module: torch.nn.Module, inputs: Sequence[Any]) -> tuple[Any | None, str]:
    """(the truth for ``module`` on ``inputs``, its name): the model in float64, or a quantized
    one without its activations' q/dq in its own float precision (int8's error is 1e5 times
    fp32's); ``(None, "")`` where it cannot be run so."""
    if is_quantized(module):
        stripped = unquantized(module)
        if stripped is None:
            return None, ""
        try:
            with torch.no_grad():
                return stripped(*copy.deepcopy(tuple(inputs))), "the float model"
        except Exception as error:  # no float run: judged against eager instead
            if machine_error(error) is not None:
                raise  # out of memory: the machine's, not a model that will not run so
            return None, ""
        finally:
            free_copy(stripped)
    outputs = run_in_precision(module, inputs, torch.float64)
    return (outputs, "fp64") if outputs is not None else (None, "")
