"""Composing until the program runs: a partition whose backend fails to lower it, or whose
delegate fails to run or to match eager (composer.run.proof), is pinned off that backend and the
stack composed again, so its nodes go to the next backend that takes them or to portable kernels.
``placement="strict"`` moves nothing: the failure is the user's error to see.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import NoReturn

import attrs

from composer.contract.backend_spec import safer_options_change
from composer.contract.errors import (
    ComposerError,
    ComposerWarning,
    PreprocessFailed,
    StalePinWarning,
)
from composer.lower.widened import computes_reduced
from composer.registry.stack import Stack
from composer.run.composition import Composition
from composer.run.proof import Culprit, ProgramFailed, prove
from composer.scheduler.assign import node_pin, user_pinned
from composer.scheduler.origins import origin_backends
from composer.scheduler.plan_records import Repair
from composer.scheduler.plans import PORTABLE, Plan

# Takes a culprit the proof found, the plan of the program that failed and a deadline
# (time.perf_counter()), and gives the culprit with only the nodes that must move.
Narrow = Callable[[Culprit, Plan, float], Culprit]
# Rounds of repairs, each moving every partition found failing (all those a compiler raised
# on, or the one delegate the proof names); a stack of k backends moves a node at most k times.
MAX_REPAIRS = 16
# The first compose counts as at least this long when repairs are budgeted: a small model's
# rounds take 1 to 5 s (the first in a process imports and warms its backends), and a busy
# machine alone can double one, which decided whether its repairs ran (seen in CI: a 1 s
# compose stopped before its second repair).
SHORTEST_COMPOSE = 10.0
NOT_CHECKED = "not checked (check=False)"


def composed_and_proven(
    build: Callable[[Stack], Composition],
    stack: Stack,
    *,
    check: bool,
    progress: Callable[[str], None] | None = None,
    narrow: Narrow | None = None,
) -> Composition:
    """``build(stack)``, proven where a runtime here runs it, repaired until it runs and is right:
    each partition that failed is pinned off its backend and ``build`` called again, for at most
    ``stack.repair_time`` times as long as the first compose took (counted as at least
    ``SHORTEST_COMPOSE`` seconds). The plan says what was moved
    and why (``plan.repairs``) and how the proof went (``plan.proof``). A program that is not
    right is never returned: where repairs run out, the error says what is wrong and what was
    tried. ``narrow`` (:mod:`composer.pipeline.narrowing`) takes a delegate the proof found wrong
    down to its wrong operators before it is moved, within the same time."""
    say = progress or (lambda line: None)
    strict = stack.placement == "strict"
    failed: list[Culprit] = []
    current = stack
    started = time.perf_counter()
    first_compose: float | None = None
    for _round in range(MAX_REPAIRS + 1):
        round_started = time.perf_counter()
        attempt = _attempt(build, current, check=check, strict=strict, failed=failed)
        last_round = time.perf_counter() - round_started
        if isinstance(attempt, _Widen):
            say(f"repair {_round + 1}: {attempt.why}; computing them in float32, composing again")
            current = attrs.evolve(current, widen_portable=True)
            continue
        if not isinstance(attempt, _Failed):
            return _said_widened(attempt, current, stack)
        culprits = attempt.culprits
        if first_compose is None and attempt.lowering_error is None:
            # the first round that built a program and proved it: what a compose costs
            first_compose = time.perf_counter() - started
        safer = _safer_options(attempt.declared, culprits, current)
        if safer and not strict:
            # the smaller move first: the backend's safer options, its nodes stay (a CUDA
            # partition whose Triton SDPA refuses per-head masks lowers with Triton off)
            tried = [attrs.evolve(c, options=safer[c.backend]) for c in culprits
                     if c.backend in safer]  # fmt: skip
            failed.extend(tried)
            _say_safer_options(say, _round + 1, tried)
            current = with_options(current, {c.backend: c.options for c in tried})
            continue
        if strict:  # a run-time failure under strict was raised in _attempt
            raise _strict_error(attempt.lowering_error, culprits)
        if _round == MAX_REPAIRS or _all_moved_already(culprits, current):
            break
        if narrow is not None and any(c.narrowed for c in failed):
            # What narrowing kept on a backend did not hold in the program as composed (a
            # partition of another shape than its trials': tied_lm's Vulkan embedding and
            # linears crashed the runner together): the whole partitions move, as before
            # narrowing, and nothing is narrowed again. This is the round the whole move had
            # without narrowing, so it is not held to repair_time: narrowing never makes a
            # compose fail that succeeds without it.
            narrow = None
            failed, moves = _narrowing_undone(failed, culprits)
            _say_moving(say, _round + 1, moves)
            current = pinned_off(current, [(c.backend, c.nodes) for c in moves])
            continue
        spent = time.perf_counter() - started
        # later rounds reuse the partitions compiled already: the last round bounds the next
        if first_compose is not None and not round_fits(
            spent, last_round, first_compose, stack.repair_time
        ):
            raise _past_repair_time(stack, culprits, failed, spent, first_compose, last_round)
        if narrow is not None and attempt.plan is not None:
            deadline = _narrowing_deadline(spent, last_round, first_compose, stack.repair_time)
            culprits = [narrow(c, attempt.plan, deadline) for c in culprits]
        culprits = [attrs.evolve(c, evidence=None) for c in culprits]  # their operands, freed
        failed.extend(culprits)
        _say_moving(say, _round + 1, culprits)
        current = pinned_off(current, [(c.backend, c.nodes) for c in culprits])
    _raise_with_tried(ComposerError(
        f"{culprits[0].describe()}, and moving it again changed nothing"
    ), failed)  # fmt: skip


def _narrowing_deadline(
    spent: float, last_round: float, first_compose: float | None, repair_time: float
) -> float:
    """Half of what repairs have left once the next round is set aside (a
    ``time.perf_counter()``): narrowing must not cost the round that proves what it kept."""
    left = max(first_compose or 0, SHORTEST_COMPOSE) * (1 + repair_time) - spent
    return time.perf_counter() + (left - last_round) / 2


def _narrowing_undone(
    failed: Sequence[Culprit], culprits: Sequence[Culprit]
) -> tuple[list[Culprit], list[Culprit]]:
    """``failed`` with each narrowed repair made whole again, and what moves now: those whole
    partitions, and this round's culprits outside them (inside one, they move with it)."""
    undone = [_unnarrowed(c) for c in failed if c.narrowed]
    moving = {(c.backend, n) for c in undone for n in c.nodes}
    fresh = [attrs.evolve(c, evidence=None) for c in culprits
             if not all((c.backend, n) in moving for n in c.nodes)]  # fmt: skip
    return [_unnarrowed(c) if c.narrowed else c for c in failed] + fresh, undone + fresh


def _unnarrowed(culprit: Culprit) -> Culprit:
    """``culprit`` with its whole partition, where what narrowing kept did not hold."""
    return attrs.evolve(
        culprit, nodes=culprit.whole, narrowed="", narrowed_how="", whole=(),
        why=f"{culprit.why}; narrowed to {culprit.narrowed}, but what it kept failed in the "
        "program: the whole partition moved",
    )  # fmt: skip


def round_fits(spent: float, last_round: float, first_compose: float, repair_time: float) -> bool:
    """Whether another round of repairs, taking what the last one did, ends within
    ``repair_time`` times the first compose (counted as at least ``SHORTEST_COMPOSE``) past it:
    the time is checked only between rounds, and convnext_small's took 1116 s of 747 allowed
    when a round was begun whatever it would cost."""
    return spent + last_round <= max(first_compose, SHORTEST_COMPOSE) * (1 + repair_time)


@attrs.frozen
class _Failed:
    """What one compose and proof found failing: the partitions to move, the safer options
    their backends declare (backend -> options), and the lowering error (None where the
    program was built and its proof failed)."""

    culprits: list[Culprit]
    declared: dict[str, dict[str, str]]
    lowering_error: PreprocessFailed | None
    plan: Plan | None = None  # the plan of the program the proof failed


def _attempt(
    build: Callable[[Stack], Composition],
    stack: Stack,
    *,
    check: bool,
    strict: bool,
    failed: Sequence[Culprit],
) -> Composition | _Failed:
    """One round: ``build(stack)`` and its proof. The program where it is proven (or ``check``
    is off), what failed where a repair may help, else the error (with the repairs ``failed``
    so far) raised."""
    try:
        with own_pins_unremarked(bool(failed)):
            composition = build(stack)
    except PreprocessFailed as error:
        return _Failed(_lowering_culprits(error), {error.backend: error.safer_options}, error)
    except ComposerError as error:
        _raise_with_tried(error, failed)
    if not check:
        return _finished(composition, failed, NOT_CHECKED)
    try:
        proof = prove(composition)
    except ProgramFailed as error:
        if not failed:
            composition.plan = attrs.evolve(composition.plan, proof=f"refused: {error.failure}")
            error.unrepaired = composition
        # Before guessing at a delegate that matched its own subgraph (adds_up), or where
        # none is to blame: the bf16 ops on portable kernels (the H100's decoder moved a
        # convolution off cuda at 43% of its allowance before this repair made it right).
        guessed = all(c.adds_up for c in error.culprits)
        widen = _widening(composition, stack) if guessed and not strict else None
        if widen is not None:
            return widen
        if not error.culprits or strict:
            _raise_with_tried(error, failed)
        culprits = list(error.culprits)
        return _Failed(culprits, _changing(composition.plan, culprits), None, composition.plan)
    if proof.ran and not proof.compared:
        # Written, as what the model computes; but the plan alone would not show that nothing
        # was held to anything.
        warnings.warn(
            f"the composed program is not proven: it {proof.describe()}",
            ComposerWarning,
            stacklevel=2,
        )
    return _finished(composition, failed, proof.describe())


@attrs.frozen
class _Widen:
    """The proof missed with no delegate to blame, and reduced-precision ops are left to
    portable kernels, which accumulate in bf16 or fp16 where eager accumulates in float32."""

    why: str


def _widening(composition: Composition, stack: Stack) -> _Widen | None:
    if stack.widen_portable:
        return None
    left = sum(composition.plan.ops_on(PORTABLE).values())
    if not left or not computes_reduced(composition.edge.exported_program()):
        return None
    return _Widen(f"the error builds up in the {left} bf16/fp16 op(s) left to portable kernels")


def _said_widened(composition: Composition, current: Stack, asked: Stack) -> Composition:
    """The plan's proof says the repair computed the portable kernels' ops in float32."""
    if not current.widen_portable or asked.widen_portable:
        return composition
    proof = f"{composition.plan.proof}; repaired: the ops on portable kernels computed in float32"
    return attrs.evolve(composition, plan=attrs.evolve(composition.plan, proof=proof))


def _all_moved_already(culprits: Sequence[Culprit], stack: Stack) -> bool:
    """Whether ``stack`` already pins every culprit's nodes off its backend: moving them again
    would compose the same program."""
    return all(
        {node_pin(n) for n in c.nodes} <= stack.never.get(c.backend, frozenset()) for c in culprits
    )


def _lowering_culprits(error: PreprocessFailed) -> list[Culprit]:
    """The partitions whose backend raised ``error`` while lowering them, one culprit each."""
    return [
        Culprit(
            error.backend,
            f"{error.backend} partition of {nodes[0]}",
            nodes,
            f"failed to lower: {raised}",
            {n: error.origins[n] for n in nodes if n in error.origins},
        )
        for nodes, raised in error.partitions
    ]


def _strict_error(
    lowering_error: PreprocessFailed, culprits: Sequence[Culprit]
) -> PreprocessFailed:
    return PreprocessFailed(
        f"{lowering_error}. placement='strict' moves nothing; drop it (or use "
        "placement='priority') to hand these nodes to the next backend, or pin them off "
        f"{culprits[0].backend} yourself.",
        culprits[0].backend, lowering_error.nodes,
    )  # fmt: skip


def _past_repair_time(
    stack: Stack, culprits: Sequence[Culprit], failed: Sequence[Culprit], spent: float,
    first_compose: float, last_round: float,
) -> ComposerError:  # fmt: skip
    tried = "; ".join(c.describe() for c in failed) or "nothing yet"
    return ComposerError(
        f"{culprits[0].describe()}; repairs stopped after {spent:.0f} s: another round (the "
        f"last took {last_round:.0f} s) would end past repair_time={stack.repair_time:g} times "
        f"the first compose and proof ({_counted(first_compose)}). Tried: {tried}. Nothing was "
        "written: raise repair_time (--repair-time) to search longer, or pin the failing "
        f"nodes off {culprits[0].backend} yourself."
    )


def _counted(first_compose: float) -> str:
    if first_compose >= SHORTEST_COMPOSE:
        return f"{first_compose:.0f} s"
    return f"{first_compose:.0f} s, counted as {SHORTEST_COMPOSE:g} s"


def _say_safer_options(say: Callable[[str], None], repair: int, tried: Sequence[Culprit]) -> None:
    for culprit in tried:
        say(f"repair {repair}: {culprit.describe()}; trying "
            f"{culprit.backend} with {_words(culprit.options)}")  # fmt: skip


def _say_moving(say: Callable[[str], None], repair: int, culprits: Sequence[Culprit]) -> None:
    round_words = f"repair {repair}: "
    for index, culprit in enumerate(culprits, 1):
        say(f"{round_words}moving {culprit.describe()}: its {len(culprit.nodes)} node(s) leave "
            f"{culprit.backend}" + ("; composing again" if index == len(culprits) else ""))  # fmt: skip


def _raise_with_tried(error: ComposerError, failed: Sequence[Culprit]) -> NoReturn:
    """``error``, with the repairs tried before it said, where there were any: nothing is
    written, and the user sees what was wrong and what was moved."""
    if not failed:
        raise error
    tried = "; ".join(c.describe() for c in failed)
    error.args = (f"{error} (after moving: {tried})", *error.args[1:])
    raise error


@contextlib.contextmanager
def own_pins_unremarked(repairing: bool) -> Iterator[None]:
    """Without warnings about node pins that name no node, once repairs have pinned nodes:
    a repair pins a failed partition's nodes by name, pieces among them (OpenVINO's
    ``addmm``), and the repaired program keeps their op whole for the next backend, so the
    names are gone. The pin still works (it is why the op stayed whole); "names no node of
    this program; did you mean ..." would blame the user for composer's own pins. The user's
    pins were checked by the first attempt, which had no repairs."""
    if not repairing:
        yield
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StalePinWarning)
        yield


def _safer_options(
    declared_by: dict[str, dict[str, str]], culprits: Sequence[Culprit], stack: Stack
) -> dict[str, dict[str, str]]:
    """The safer options (BackendSpec.safer_options, ``declared_by`` backend) of the culprits'
    backends not yet set."""
    found = {}
    for culprit in culprits:
        declared = declared_by.get(culprit.backend, {})
        given = stack.options.get(culprit.backend, {})
        if declared and any(given.get(k) != v for k, v in declared.items()):
            found[culprit.backend] = dict(declared)
    return found


def _changing(plan, culprits: Sequence[Culprit]) -> dict[str, dict[str, str]]:
    """The plan's safer options (backend -> options) that can change a culprit's partition
    (``BackendSpec.safer_for``)."""
    return {
        c.backend: plan.safer_options[c.backend]
        for c in culprits
        if c.backend in plan.safer_options
        and safer_options_change(
            plan.safer_for.get(c.backend, ()), (plan.node_ops.get(n, "") for n in c.nodes)
        )
    }


def _words(options) -> str:
    return ", ".join(f"{k}={v}" for k, v in options.items())


def with_options(stack: Stack, options: dict[str, dict[str, str]]) -> Stack:
    """``stack`` with ``options`` (backend -> name -> value) set over its own."""
    merged = {name: dict(values) for name, values in stack.options.items()}
    for backend, values in options.items():
        merged.setdefault(backend, {}).update(values)
    return attrs.evolve(stack, options=merged)


def repaired_stack(stack: Stack, repairs) -> Stack:
    """``stack`` with a plan's ``repairs`` applied: nodes pinned off their backend, safer
    options set: how a repaired program is lowered again."""
    stack = pinned_off(stack, [(r.backend, r.nodes) for r in repairs if r.nodes])
    return with_options(stack, {r.backend: r.options for r in repairs if r.options})


def pinned_off(stack: Stack, moved) -> Stack:
    """``stack`` with each (backend, nodes) of ``moved`` pinned off that backend: how a
    repaired program is composed again (``plan.repairs`` lists them)."""
    never = {name: set(pins) for name, pins in stack.never.items()}
    for backend, nodes in moved:
        never.setdefault(backend, set()).update(node_pin(node) for node in nodes)
    return attrs.evolve(stack, never=never)


def _finished(composition: Composition, failed: list[Culprit], proof: str) -> Composition:
    plan = composition.plan
    renamed = any(n not in plan.node_backends for c in failed for n in c.nodes)
    by_origin = _backends_by_origin(composition) if renamed else {}

    def went_to(culprit: Culprit, node: str) -> str:
        found = plan.node_backends.get(node) or by_origin.get(culprit.origins.get(node, ""))
        return found or "elsewhere"

    repairs = tuple(
        Repair(
            c.backend,
            c.partition,
            c.nodes,
            c.said_why,
            Counter(went_to(c, n) for n in c.nodes),
            dict(c.options) or None,
        )
        for c in failed
    )
    narrowed = [f"{c.narrowed} moved off {c.backend}, its other ops kept" for c in failed
                if c.narrowed]  # fmt: skip
    proof = "; ".join([proof, *narrowed])
    composition.plan = _said_as_repairs(
        attrs.evolve(plan, proof=proof, repairs=repairs), [c for c in failed if not c.options]
    )
    _warn_of_portable_kernels(repairs, plan.backends)
    return composition


def _said_as_repairs(plan, moved: Sequence[Culprit]):
    """``plan`` with the reason of each node a repair pinned off a backend said as the repair
    (its pins are node pins, which the scheduler reports as the user's): "moved off vulkan by
    a repair: vulkan:1 failed at run time: ..." rather than "pinned off vulkan by the user"."""
    if not moved:
        return plan
    by = {(c.backend, node): c for c in moved for node in c.nodes}

    def said(node: str, answers):
        out = []
        for backend, answer in answers:
            culprit = by.get((backend, node))
            if culprit is not None and answer.startswith(user_pinned(backend)):
                answer = f"moved off {backend} by a repair: {culprit.describe()}"[:300]
            out.append((backend, answer))
        return tuple(out)

    fallbacks = tuple(attrs.evolve(f, reasons=said(f.node, f.reasons)) for f in plan.fallbacks)
    decisions = {node: said(node, answers) for node, answers in plan.decisions.items()}
    return attrs.evolve(plan, fallbacks=fallbacks, decisions=decisions)


def _backends_by_origin(composition: Composition) -> dict[str, str]:
    """Where each node of the exported program went in ``composition``, by its origin name:
    a moved node whose op the repaired program decomposes differently has a new name (a
    repair pins OpenVINO's ``permute_copy`` and ``addmm`` off it, and XNNPACK then takes the
    ``linear`` whole). Empty for a program from the cache: its edge program is not at hand
    without lowering again, and the report is not worth that."""
    if composition.from_cache:
        return {}
    module = composition.edge.exported_program().graph_module
    return origin_backends(module, composition.plan.node_backends)


def _warn_of_portable_kernels(repairs, backends: Sequence[str]) -> None:
    # Correct but possibly 50-200x slower (OpenVINO alone, a bf16 miss on shufflenet_v2: 47 ms
    # on portable kernels against 0.27 ms): the user should not have to read the plan to see.
    moved = Counter()
    for repair in repairs:
        moved[repair.backend] += repair.moved_to.get("portable", 0)
    for backend, count in moved.items():
        if count:
            after = list(backends[backends.index(backend) + 1 :]) if backend in backends else []
            # With a backend after it, that one declined them: naming xnnpack, already in
            # the stack, would be advice the user cannot take (lcnet's 4 dim-order copies).
            remedy = (
                f"{', '.join(after)} after it declined them (the plan's fallbacks say why)"
                if after
                else f"list a backend after {backend} that takes them (xnnpack on a CPU)"
            )
            warnings.warn(
                f"{count} node(s) moved off {backend} (the plan's repairs say why) now run on "
                "ExecuTorch's portable kernels, often 10 to 100 times slower than a delegate: "
                f"{remedy}; or compose with check=False (--no-check) to keep {backend}'s "
                "program as it is, unproven.",
                ComposerWarning,
                stacklevel=2,
            )
