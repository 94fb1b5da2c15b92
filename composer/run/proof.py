"""The proof that a composed program runs: before anything is written, the program is run once
on its example inputs, in a runtime here that has every delegate's backend, and compared with
eager. Where it fails to run or to match, the delegate that failed is found by running the
delegates one by one: each as a program of its own in the runtime (a CUDA delegate as its
compiled ``.so``), on the inputs the Python reference computed for it, against the subgraph it
was made from. A runtime's "error 0x1 at instruction 3" then becomes a backend, a partition and
its nodes, which the pipeline hands to the next backend.
"""

from __future__ import annotations

import copy
import functools
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import attrs
import torch
import torch.fx

from composer.contract.errors import ComposerError, first_line
from composer.contract.machine import MachineError, retried_once
from composer.contract.runtime import lacks
from composer.run import cpp_runtime, remote
from composer.run.accuracy import (
    TOL,
    eager_in_precision,
    flatten_tensors,
    holds_nonfinite,
    judge,
    rmse,
    truth,
    worst,
)
from composer.run.inputs import SAMPLE, flat_inputs, points_to_prove
from composer.run.named_data import LazyNamedData
from composer.run.piecewise import (
    PluginDelegate,
    RuntimeDelegate,
    delegate_record,
    lacked_operators,
    plugin_runtime,
    runnable_piecewise,
    standalone_buffer,
)
from composer.run.program_table import delegate_call_at
from composer.run.runtime import runtime_can_run
from composer.run.subgraphs import run_subgraph, subgraph_module
from composer.run.verification import Verification, expected_outputs, verify
from composer.scheduler.origins import origin_name
from composer.scheduler.plans import Plan, partition_of

HOW = "running the delegates one by one against their subgraphs"


class Provable(Protocol):
    """What the proof needs of a composed program (a :class:`composer.run.composition.Composition`).
    One with ``proof_inputs`` (the user's own samples, each a tuple like ``example_inputs``) is
    run at each of them too."""

    buffer: bytes
    data_files: Mapping[str, bytes]
    plan: Plan
    eager: torch.nn.Module
    example_inputs: tuple

    @property
    def reference(self) -> torch.nn.Module: ...


@attrs.frozen(eq=False)
class Evidence:
    """What the proof ran a failed delegate on: the delegate and the operands the Python
    reference gave it, and the program's named data. Narrowing lowers parts of its subgraph
    again and judges them on these (:mod:`composer.pipeline.narrowing`)."""

    lowered: Any  # ExecuTorch's LoweredBackendModule
    operands: tuple
    data: Mapping[str, bytes]


@attrs.frozen
class Culprit:
    """The partition whose delegate failed, and how."""

    backend: str
    partition: str
    nodes: tuple[str, ...]
    why: str  # "failed at run time: ...", "does not match eager: ...", "failed to lower: ..."
    # node -> the exported program's node it descends from: a repaired program may decompose
    # the op differently (OpenVINO's permute + addmm, XNNPACK's whole linear), names change.
    origins: Mapping[str, str] = attrs.field(factory=dict)
    # Every delegate matched its own subgraph and the program missed: this one erred most.
    # Moving it is a try at a program that is right, not the repair of a known culprit.
    adds_up: bool = False
    # the backend's safer options tried instead of moving the nodes (a repair of its own)
    options: Mapping[str, str] = attrs.field(factory=dict)
    # what the delegate was run on, where the proof ran it alone and it failed
    evidence: Evidence | None = attrs.field(default=None, eq=False, repr=False)
    # the operators narrowing found wrong, and where the user wrote them (its nodes are then
    # only theirs): "aten.tanh.default at model.py:37 `torch.tanh(x)`"; how it found them;
    # and the partition's nodes before it narrowed them
    narrowed: str = ""
    narrowed_how: str = ""
    whole: tuple[str, ...] = ()

    @property
    def said_why(self) -> str:
        """``why``, with what narrowing found."""
        if not self.narrowed:
            return self.why
        return f"{self.why}; wrong there: {self.narrowed} ({self.narrowed_how})"

    def describe(self) -> str:
        return f"{self.partition} {self.said_why}"


class ProgramFailed(ComposerError):
    """The composed program failed to run or to match eager; ``culprits`` are the partitions
    whose delegates failed (none where running the delegates one by one found none)."""

    def __init__(self, message: str, culprits: Sequence[Culprit], failure: str = "") -> None:
        super().__init__(message)
        self.culprits = tuple(culprits)
        self.failure = failure  # "does not match eager: max |composed - eager| = 0.03"
        # The program as first composed, before any repair, where it is the one that failed:
        # to look into, never to deploy (set by the pipeline).
        self.unrepaired: Any = None

    @property
    def culprit(self) -> Culprit | None:
        return self.culprits[0] if self.culprits else None


@attrs.frozen
class Proof:
    """How the proof went: the verification where the program ran here, else why it did not."""

    verification: Verification | None
    reason: str
    seconds: float
    # the sizes it ran at, for a program with dynamic dims ("example", "max (s27=128)", ...)
    sizes: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()  # sizes eager itself refused, so nothing to compare with
    # sizes it ran at where every output was NaN or inf in fp64 too: nothing was compared
    uncompared: tuple[str, ...] = ()
    # the user's own samples it ran at (proof_inputs): "proof input 1", ...
    samples: tuple[str, ...] = ()

    @property
    def ran(self) -> bool:
        return self.verification is not None

    @property
    def compared(self) -> bool:
        """Whether it ran and compared something: at some size an output was a number."""
        return self.ran and len(self.uncompared) < max(len(self.sizes), 1) + len(self.samples)

    def describe(self) -> str:
        if self.verification is None:
            return f"not run here: {self.reason}"
        at = f" at {len(self.sizes)} sizes: {'; '.join(self.sizes)}" if len(self.sizes) > 1 else ""
        if self.samples:
            numbers = ", ".join(s.removeprefix(f"{SAMPLE} ") for s in self.samples)
            given = f"{SAMPLE}{'s' if len(self.samples) > 1 else ''} {numbers}"
            at = f"{at}, and at {given}" if at else f" at the example and {given}"
        if self.skipped:
            at += f" (eager refused {'; '.join(self.skipped)})"
        if not self.compared:
            # All NaN in the program and in fp64 too is no match: nothing was held to anything.
            said = self.verification.verdict.describe().removeprefix("nothing compared: ")
            return (
                f"ran{at} in {self.seconds:.2f} s ({self.verification.ran_in}), but nothing "
                f"was compared: {said}; the model computes no number from these inputs (a NaN "
                "weight, or inputs that hold NaN or inf)"
            )
        if self.uncompared:
            at += f" (nothing compared at {'; '.join(self.uncompared)}: NaN in fp64 too)"
        return (
            f"ran and matched eager{at} in {self.seconds:.2f} s ({self.verification.ran_in}): "
            f"{self.verification.verdict.describe()}"
        )


def can_prove(program: bytes) -> tuple[bool, str]:
    """Whether runtimes here execute every delegate of ``program`` (the pip runtime whole; the
    C++ runner ``$COMPOSER_ET_RUNNER`` names; else piece by piece, each delegate in the runtime
    its backend's plugin supplies), and why not. With an agent in use (``--runtime``), whether
    the agent runs it whole: the proof is then made there, or not at all."""
    agent = remote.active()
    if agent is not None:
        there, why, ran_in = agent.can_run(program)
        return there, agent.executor(ran_in) if there else why
    runnable, why = runtime_can_run(program)
    if runnable:
        return True, why
    runner = cpp_runtime.runner_path()
    if runner is not None:
        return True, f"{cpp_runtime.EXECUTOR} ({runner})"
    piecewise, where = runnable_piecewise(program)
    if piecewise:
        return True, where
    # Said once: "no runtime here has X" repeats what the runtime said; a plugin's runtime that
    # cannot run here says why.
    more = [part for part in where.split("; ") if not part.startswith("no runtime here has")]
    return False, "; ".join([why, *more])


def prove(composition: Provable) -> Proof:
    """Run ``composition`` on its example inputs (at each size of a dynamic program) and on
    its ``proof_inputs``, and compare with eager. Raises :class:`ProgramFailed` naming the
    partition whose delegate failed."""
    started = time.perf_counter()
    provable, why = can_prove(composition.buffer)
    if not provable:
        return Proof(None, why, 0.0)
    samples = getattr(composition, "proof_inputs", ())
    sizes = points_to_prove(composition.example_inputs, composition.plan.dynamic_dims, samples)
    ran: list[str] = []
    skipped: list[str] = []
    uncompared: list[str] = []
    for label, inputs in sizes:
        try:
            # the machine's errors are retried, never a size eager refused
            expected = retried_once(
                functools.partial(expected_outputs, composition, inputs), "running eager"
            )
        except MachineError:
            raise
        except Exception as error:
            if label == "example":
                raise
            if label.startswith(SAMPLE):
                # the user's own input: eager refusing it is theirs to see, not a size to skip
                raise ComposerError(
                    f"the model itself (eager) fails on {label} of proof_inputs: "
                    f"{first_line(error)}; nothing was written: give samples the model takes"
                ) from error
            skipped.append(label)
            continue
        at = "" if len(sizes) == 1 else f" at {label}"
        try:
            # the machine's errors are retried, never a delegate's failure to repair
            verification = retried_once(
                functools.partial(verify, composition, inputs, expected),
                f"running the program{at}",
            )
        except MachineError:
            raise
        except (ComposerError, RuntimeError) as error:
            failure = f"failed at run time{at}: {first_line(error)}"
        else:
            if verification.ok:
                ran.append(label)
                if verification.verdict.nothing_compared:
                    uncompared.append(label)
                continue
            failure = (
                f"does not match eager{at}: max |composed - eager| = "
                f"{verification.max_abs_error:.3g}; {verification.verdict.describe()}"
            )
        mismatch = failure.startswith("does not match")
        culprits = localize_all(composition, inputs, mismatch=mismatch)
        if not culprits and not mismatch:
            culprits = _named_by_the_runtime(composition, failure)
        where = "".join(f"; {c.partition} ({c.backend}) {c.why}" for c in culprits)
        if mismatch and not culprits:
            where = f"; {outside_the_delegates(composition.plan)}"
        elif not culprits and (kernel := _FAILED_KERNEL.search(failure)):
            where = (
                f"; {kernel[1]} runs on ExecuTorch's portable kernels (no delegate of the "
                f"program took it), which refuse these inputs: {cpp_runtime.NO_KERNEL_ADVICE}"
            )
        # Only a delegate is found by running them one by one; a missing kernel, or an error
        # outside every delegate, is said as the runtime said it.
        how = f" (found by {HOW})" if culprits or mismatch else ""
        raise ProgramFailed(f"the composed program {failure}{where}{how}", culprits, failure)
    seconds = time.perf_counter() - started
    at_sizes = tuple(label for label in ran if not label.startswith(SAMPLE))
    at_samples = tuple(label for label in ran if label.startswith(SAMPLE))
    return Proof(
        verification, why, seconds, at_sizes if len(sizes) - len(samples) > 1 else (),
        tuple(skipped), tuple(uncompared), at_samples,
    )  # fmt: skip


def outside_the_delegates(plan: Any) -> str:
    """Why a program that misses has no delegate to blame, and where its error comes from."""
    left = plan.ops_on("portable")
    most = ", ".join(f"{op} x{n}" for op, n in left.most_common(4))
    host = (f"the {sum(left.values())} ops left to ExecuTorch's portable kernels ({most}), "
            "which no backend of the stack takes") if left else "the glue between the delegates"  # fmt: skip
    if not plan.partitions:
        return (
            f"no backend of the stack took any of it: the error is in {host}; nothing was "
            "written: add a backend that takes those ops, or compose the model in a wider dtype"
        )
    # Each delegate was run alone on the inputs eager gives it. Right alone and wrong in the
    # program is either the ops between them or the delegates as the runtime joins them:
    # swin_v2_t on vulkan+xnnpack (H200) missed by 0.275 where each Vulkan
    # delegate matched alone, and on xnnpack alone the same portable ops passed.
    return (
        "no delegate errs more than eager's own run of its subgraph, run alone: the error "
        f"builds up in {host}, or where the runtime joins the delegates; nothing was written: "
        "add a backend that takes those ops, compose the model in a wider dtype, or pin the "
        "delegates' nodes off their backend to find which"
    )


def localize(
    composition: Provable, inputs: Sequence[Any] | None = None, *, mismatch: bool = False
) -> Culprit | None:
    """The first of :func:`localize_all`'s culprits, or ``None``."""
    found = localize_all(composition, inputs, mismatch=mismatch)
    return found[0] if found else None


def localize_all(
    composition: Provable, inputs: Sequence[Any] | None = None, *, mismatch: bool = False
) -> list[Culprit]:
    """Every delegate, in the order the program runs them, that fails to load, to run, or to
    match its own subgraph on the inputs the Python reference gives it: all of them move in
    one repair (an OpenVINO program at a dynamic size has every delegate wrong at once).

    Each delegate is judged as the program is (composer.run.accuracy): against its subgraph
    run in float64, beside the subgraph run as eager runs it. With ``mismatch`` (the program
    ran but missed) and every delegate within its allowance, the delegate that errs most
    (furthest toward its allowance) is named, so that moving it can be tried.
    """
    plan = composition.plan
    reference = copy.deepcopy(composition.reference)
    inputs = flat_inputs(composition.example_inputs if inputs is None else inputs)

    def culprit(lowered_name: str, why: str) -> Culprit | None:
        return _culprit(reference, plan, lowered_name, why)

    data = LazyNamedData(composition.buffer, composition.data_files)
    finder = _DelegateChecker(reference, plan, data)
    if not _ran_checking(finder, inputs):
        return []  # it failed outside every delegate: no culprit to name
    if finder.failed:
        found = [_with_evidence(culprit(name, why), finder.evidence.get(name))
                 for name, why in finder.failed]  # fmt: skip
        return lacking_the_same_op(reference, plan, [c for c in found if c is not None])
    if finder.unchecked and (not mismatch or finder.worst is None):
        # Only delegates that cannot be checked alone are left: the first of them is the
        # suspect, and the repaired program is proven again whole.
        lowered_name, why = finder.unchecked[0]
        found = culprit(
            lowered_name, f"is the first delegate that could not be checked alone ({why})"
        )
        return [found] if found is not None else []
    if mismatch and finder.worst is not None:
        share, lowered_name = finder.worst
        found = culprit(
            lowered_name,
            f"errs most of the delegates ({share:.0%} of its allowance against its own "
            "subgraph; the program as a whole missed)",
        )
        return [] if found is None else [attrs.evolve(found, adds_up=True)]
    return []


def _with_evidence(culprit: Culprit | None, evidence: Evidence | None) -> Culprit | None:
    if culprit is None or evidence is None:
        return culprit
    return attrs.evolve(culprit, evidence=evidence)


def delegates_failing(
    module: torch.fx.GraphModule, plan: Plan, operands: Sequence[Any], data: Mapping[str, bytes]
) -> list[tuple[str, str]]:
    """Each delegate of ``module`` (a failed delegate's subgraph, parts of it lowered again)
    that fails to load, to run or to match its own subgraph on ``operands``, judged as the
    proof judges: (its name, why). ``data``: the named data its delegates read."""
    checker = _DelegateChecker(module, plan, data)
    _ran_checking(checker, operands)  # where the part in Python refuses: judged up to there
    return checker.failed


def _ran_checking(checker: _DelegateChecker, operands: Sequence[Any]) -> bool:
    """Run ``checker`` over its module on ``operands``; False where it failed outside every
    delegate (``checker.failed`` holds what failed up to there)."""
    with torch.no_grad():
        try:
            checker.run(*operands)
        except _Stopped:
            pass
        except MachineError:
            raise
        except Exception:  # noqa: BLE001 - outside every delegate
            return False
    return True


def _culprit(reference: Any, plan: Plan, lowered_name: str, why: str) -> Culprit | None:
    """The partition the delegate ``lowered_name`` of ``reference`` was made from, as a culprit."""
    lowered = getattr(reference, lowered_name)
    inside = {n.name: n for n in lowered.original_module.graph.nodes}
    partition = partition_of(plan, set(inside))
    if partition is None:
        return None
    nodes = next(p.nodes for p in plan.partitions if p.id == partition)
    backend = next(p.backend for p in plan.partitions if p.id == partition)
    nodes = missing_operator_nodes(why, nodes, plan.node_ops, backend)
    origins = {name: origin_name(inside[name]) for name in nodes if name in inside}
    return Culprit(backend, partition, tuple(nodes), why, origins)


_MISSING_OPERATOR = re.compile(r"Missing operator: ([\w.]+)")
# A binary op's shader it lacks (gpt2's int mask: "Could not find ShaderInfo with name
# binary_eq_texture3d_int32"): that op, in any overload
_MISSING_SHADER = re.compile(r"ShaderInfo with name binary_([a-z]+)_(?:texture|buffer)")


def missing_operator_nodes(
    why: str, nodes: Sequence[str], node_ops: Mapping[str, str], backend: str | None = None
) -> tuple[str, ...]:
    """Of a failed delegate's ``nodes``, those that must move: where its runtime said it has no
    kernel for an op (ExecuTorch's "Missing operator: aten.logical_not.default", an op the
    Vulkan partitioner of 1.5.1 claims, or no shader for a binary op's dtype; what the
    ``backend``'s own runtime says it lacks), the nodes of that op, and the rest stay on the
    backend; otherwise all of them."""
    return _lacking(why, nodes, node_ops, backend) or tuple(nodes)


def _lacking(
    why: str, nodes: Sequence[str], node_ops: Mapping[str, str], backend: str | None = None
) -> tuple[str, ...]:
    """The nodes of the op ``why`` says a runtime has no kernel for; none where it names none."""
    said = lacked_operators(backend, why) if backend else ()
    if said:
        return tuple(n for n in nodes if lacks(said, node_ops.get(n, "")))
    if found := _MISSING_OPERATOR.search(why):
        return tuple(n for n in nodes if node_ops.get(n) == found[1])
    if found := _MISSING_SHADER.search(why):
        return tuple(n for n in nodes if node_ops.get(n, "").startswith(f"aten.{found[1]}."))
    return ()


def lacking_the_same_op(reference: Any, plan: Plan, found: list[Culprit]) -> list[Culprit]:
    """``found``, and where its runtime said a backend has no kernel for an op, each other
    partition of that backend holding the op: its delegate dies at load the same way, and the
    program stops at the first (vit_b_16 on Vulkan moved its 24 logical_nots a round each:
    280 s beside plain's 134 s)."""
    named = {c.partition for c in found}
    more: list[Culprit] = []
    for culprit in found:
        said = _MISSING_OPERATOR.search(culprit.why) or _MISSING_SHADER.search(culprit.why)
        if said is None:
            continue
        why = f"holds the op its runtime lacks, as {culprit.partition} did ({said[0]})"
        for name in _delegate_names(reference):
            other = _culprit(reference, plan, name, why)
            if (
                other is not None
                and other.backend == culprit.backend
                and other.partition not in named
                and _lacking(why, other.nodes, plan.node_ops, other.backend)
            ):
                named.add(other.partition)
                more.append(other)
    return found + more


def _delegate_names(reference: Any) -> list[str]:
    """The delegates of ``reference``, by name, in the order the program calls them."""
    return [
        node.args[0].target
        for node in reference.graph.nodes
        if getattr(node.target, "__name__", "") == "executorch_call_delegate"
    ]


_FAILED_CALL = re.compile(r"CALL_DELEGATE execute failed at instruction (\d+)")
# A kernel instruction (not a delegate's) that failed: ExecuTorch's method.cpp logs its op.
_FAILED_KERNEL = re.compile(r"KernelCall failed at instruction [\d:]+ in operator (\w+::[\w.]+)")


def _named_by_the_runtime(composition: Provable, failure: str) -> list[Culprit]:
    """The delegate whose call the runtime says failed, where every delegate alone ran and
    matched: what failed is its call in the program. (ExecuTorch's C++ CUDA runtime refuses to
    copy out an output that AOTInductor returns as a view: "SlimTensor must be contiguous",
    "storage_offset must be 0"; run alone, as its .so, the same delegate is right.)"""
    found = _FAILED_CALL.search(failure)
    method = getattr(composition, "method", "forward")
    call = None if found is None else delegate_call_at(composition.buffer, int(found[1]), method)
    if call is None:
        return []
    reference = composition.reference
    delegates = _delegate_names(reference)
    if call >= len(delegates):
        return []
    detail = failure.split("it logged: ", 1)[-1][:300]
    why = (
        f"failed at run time in its call (instruction {found[1]}), though it ran and matched "
        f"alone: {detail}"
    )
    named = _culprit(reference, composition.plan, delegates[call], why)
    return [] if named is None else [named]


def _delegate_alone(lowered, single: bool) -> Callable[..., Any]:
    """``lowered`` as a program of its own, in a runtime here that has its backend: the pip
    (or torch-free) runtime, else the C++ runtime ``$COMPOSER_ET_RUNNER`` names, where the
    whole program was proven (a Vulkan delegate: no Python runtime has VulkanBackend, and
    blaming it for that moved every Vulkan partition of a program that failed for another
    reason). With an agent in use, on the agent, where the whole program ran."""
    agent = remote.active()
    if agent is not None:
        alone = standalone_buffer(lowered)

        def run_there(*operands: torch.Tensor) -> Any:
            outputs = agent.run_program(alone, {}, list(operands))
            return outputs[0] if single else tuple(outputs)

        return run_there
    try:
        return RuntimeDelegate(lowered, "cpu", single)
    except ComposerError:
        runner = cpp_runtime.runner_path()
        if runner is None:
            raise
    buffer = standalone_buffer(lowered)

    def run(*operands: torch.Tensor) -> Any:
        outputs = cpp_runtime.run_program(runner, buffer, {}, [t.cpu() for t in operands])
        return outputs[0] if single else tuple(outputs)

    return run


class _Stopped(Exception):
    """The reference could not go on past a delegate (``_DelegateChecker.failed`` says why)."""


class _DelegateChecker(torch.fx.Interpreter):
    """Runs the Python reference; at each delegate call, runs the delegate's compiled code on
    the same inputs and judges it; those that fail are listed (``failed``), and the run goes
    on with the reference's values."""

    def __init__(self, module: torch.fx.GraphModule, plan: Plan, data: Mapping[str, bytes]) -> None:
        super().__init__(module)
        self.plan = plan
        tolerance = plan.tolerance()
        self.steps = tolerance.steps if tolerance is not None else 0
        self.data = data  # the program's named data (a CUDA delegate's .so and weights)
        # the delegate closest to its allowance: (program error / allowed, its name)
        self.worst: tuple[float, str] | None = None
        self.failed: list[tuple[str, str]] = []  # (delegate, why)
        self.unchecked: list[tuple[str, str]] = []  # (delegate, why it has no program alone)
        self.evidence: dict[str, Evidence] = {}  # what each failed delegate was run on

    def _precision(self, lowered) -> str | None:
        """The lower precision ``lowered``'s backend computes in by design, if it declares one."""
        nodes = {n.name for n in lowered.original_module.graph.nodes}
        partition = partition_of(self.plan, nodes)
        backend = next((p.backend for p in self.plan.partitions if p.id == partition), None)
        declared = self.plan.tolerances.get(backend) if backend else None
        return declared.precision if declared and declared.precision else None

    def call_function(self, target: Any, args: tuple, kwargs: dict) -> Any:
        if getattr(target, "__name__", "") != "executorch_call_delegate":
            return super().call_function(target, args, kwargs)
        lowered, *operands = args
        name = next(
            n.target
            for n in self.module.graph.nodes
            # fetch_attr: constants' targets are dotted paths ("bn1.num_batches_tracked")
            if n.op == "get_attr" and self.fetch_attr(n.target) is lowered
        )
        try:
            expected = run_subgraph(lowered, *operands)
        except Exception as error:
            # The delegate's own subgraph refuses these inputs: it was made for other sizes
            # (a partition whose dynamic dim was specialized to the example's). Nothing after
            # it can run; it is the culprit.
            self.failed.append((name, f"cannot run at this size: {first_line(error)[:200]}"))
            raise _Stopped from error
        outputs = 1 if isinstance(expected, torch.Tensor) else len(expected)
        failed_before = len(self.failed)
        try:
            return self._checked(name, lowered, operands, expected, outputs)
        finally:
            if len(self.failed) > failed_before:
                self.evidence[name] = Evidence(lowered, tuple(operands), self.data)

    def _checked(self, name: str, lowered, operands: tuple, expected: Any, outputs: int) -> Any:
        delegate = self._loaded_alone(name, lowered, isinstance(expected, torch.Tensor), outputs)
        if delegate is None:
            return expected
        try:
            got = retried_once(functools.partial(delegate, *operands), f"running {name} alone")
        except MachineError:
            raise
        except (ComposerError, RuntimeError) as error:
            self.failed.append((name, f"failed at run time: {first_line(error)}"))
            return expected
        self._judge(name, lowered, operands, got, expected)
        return expected

    def _loaded_alone(
        self, name: str, lowered, single: bool, outputs: int
    ) -> Callable[..., Any] | None:
        """``lowered``'s compiled code, callable on its own; None where it cannot be loaded
        here (``failed`` or ``unchecked`` says why)."""
        supplied = plugin_runtime(lowered.backend_id)
        if supplied is not None and (unavailable := supplied[1].unavailable_reason()):
            self.unchecked.append((name, unavailable))
            return None
        try:
            if supplied is not None:
                record = delegate_record(lowered, self.data, outputs)
                return PluginDelegate(supplied[1], record, "cpu", single)
            return _delegate_alone(lowered, single)
        except MachineError:
            raise
        except ComposerError as error:
            self.failed.append((name, f"failed to load: {first_line(error)}"))
        except Exception as error:  # noqa: BLE001 - ExecuTorch's emitter, not the backend
            # A delegate ExecuTorch cannot emit as a program of its own: the proof says so
            # rather than blame it or escape with the emitter's traceback.
            self.unchecked.append((name, f"{type(error).__name__}: {first_line(error)[:120]}"))
        return None

    def _judge(self, name: str, lowered, operands: list, got: Any, expected: Any) -> None:
        """Judge the delegate's outputs ``got`` against its subgraph run in eager (``expected``
        is the reference's run of it): a miss is listed in ``failed``, a suspect kept in
        ``worst`` where it is the closest to its allowance so far."""
        subgraph = subgraph_module(lowered)
        true, truth_name = truth(subgraph, operands)
        # a backend computing in bf16 by design is held to its subgraph run in bf16
        eager, eager_in = eager_in_precision(subgraph, operands, expected, self._precision(lowered))
        verdict = judge(
            got, eager, true, steps=self.steps, truth_name=truth_name, eager_in=eager_in,
            inputs_nonfinite=holds_nonfinite(operands),
        )  # fmt: skip
        if not verdict.ok:
            why = (
                f"does not match its subgraph: max error {verdict.max_abs_error:.3g}; "
                f"{verdict.describe()}"
            )
            self.failed.append((name, why))
            return
        share = _suspect_share(verdict, true, expected, eager_in)
        if share > 0 and (self.worst is None or share > self.worst[0]):
            self.worst = (share, name)


def _suspect_share(verdict, true: Any, expected: Any, eager_in) -> float:
    """How much of its allowance a delegate that passed used (program error / allowed, its
    worst output, by RMSE or by its worst element), counting only outputs where it could be
    what makes the program miss; 0 where it is no suspect."""
    # Only a delegate further from float64 than eager's run of its subgraph in the model's
    # dtype can be what makes the program miss: one as close or closer (a bf16 subgraph
    # as eager computes it) is no suspect, and moving it changes nothing for the better.
    # A backend computing in bf16 by design is held to eager in bf16, but is a suspect
    # against the model's fp32 (OpenVINO's bf16 partitions adding up: moved, they go right).
    # An error under dynamo's floor (tol / 10) is no one's: view-like delegates of a bf16
    # program differ from eager there by a rounding, and moving them was all a repair did.
    # The worst element counts as the RMSE does: a program can miss by a few elements alone.
    baseline = [(o.eager_error, o.eager_worst) for o in verdict.outputs]
    if eager_in and true is not None:
        pairs = zip(flatten_tensors(true), flatten_tensors(expected), strict=False)
        baseline = [(rmse(t.double(), e.double()), worst(t.double(), e.double()))
                    for t, e in pairs]  # fmt: skip
    shares = [0.0]
    for o, (base, base_worst) in zip(verdict.outputs, baseline, strict=False):
        if o.allowed and base is not None and o.program_error > max(base, TOL / 10):
            shares.append(o.program_error / o.allowed)
        element = o.program_worst
        if (
            o.worst_allowed
            and base_worst is not None
            and element
            and element > max(base_worst, TOL / 10)
        ):
            shares.append(element / o.worst_allowed)
    return max(shares)
