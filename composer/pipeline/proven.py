"""Composing until the program runs: a partition whose backend fails to lower it, or whose
delegate fails to run or to match eager (composer.run.proof), is pinned off that backend and the
stack composed again, so its nodes go to the next backend that takes them or to portable kernels.
``placement="strict"`` moves nothing: the failure is the user's error to see.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable

import attrs

from composer.contract.errors import ComposerError, ComposerWarning, PreprocessFailed, first_line
from composer.planning.assign import node_pin
from composer.registry.stack import Stack
from composer.run.composition import Composition
from composer.run.proof import Culprit, ProgramFailed, prove

# Each repair moves one partition; a stack of k backends moves a node at most k times.
MAX_REPAIRS = 16
NOT_CHECKED = "not checked (check=False)"


def composed_and_proven(
    build: Callable[[Stack], Composition],
    stack: Stack,
    *,
    check: bool,
    progress: Callable[[str], None] | None = None,
) -> Composition:
    """``build(stack)``, proven where a runtime here runs it, repaired until it runs: each
    partition that failed is pinned off its backend and ``build`` called again. The plan says
    what was moved and why (``plan.repairs``) and how the proof went (``plan.proof``)."""
    say = progress or (lambda line: None)
    failed: list[Culprit] = []
    current = stack
    while True:
        culprit = lowering_error = None
        try:
            composition = build(current)
        except PreprocessFailed as error:
            lowering_error = error
            culprit = Culprit(
                error.backend,
                f"{error.backend} partition of {error.nodes[0]}",
                error.nodes,
                f"failed to lower: {first_line(error).partition('raised ')[2] or first_line(error)}",
            )
        else:
            if not check:
                return _finished(composition, failed, NOT_CHECKED)
            try:
                proof = prove(composition)
            except ProgramFailed as error:
                if error.culprit is None or stack.placement == "strict":
                    raise
                culprit = error.culprit
            else:
                say(f"proof: {proof.describe()}")
                return _finished(composition, failed, proof.describe())
        if stack.placement == "strict":  # a run-time failure under strict was raised above
            raise PreprocessFailed(
                f"{lowering_error}. placement='strict' moves nothing; drop it (or use "
                "placement='priority') to hand these nodes to the next backend, or pin them off "
                f"{culprit.backend} yourself.",
                culprit.backend, culprit.nodes,
            )  # fmt: skip
        pins = {node_pin(node) for node in culprit.nodes}
        if pins <= current.never.get(culprit.backend, frozenset()) or len(failed) >= MAX_REPAIRS:
            raise ComposerError(
                f"{culprit.describe()}, and moving it again changed nothing; "
                + "; ".join(c.describe() for c in failed)
            )
        failed.append(culprit)
        say(f"moving {culprit.describe()}: its {len(culprit.nodes)} node(s) leave "
            f"{culprit.backend}; composing again")  # fmt: skip
        current = pinned_off(current, [(culprit.backend, culprit.nodes)])


def pinned_off(stack: Stack, moved) -> Stack:
    """``stack`` with each (backend, nodes) of ``moved`` pinned off that backend: how a
    repaired program is composed again (``plan.repairs`` lists them)."""
    never = {name: set(pins) for name, pins in stack.never.items()}
    for backend, nodes in moved:
        never.setdefault(backend, set()).update(node_pin(node) for node in nodes)
    return attrs.evolve(stack, never=never)


def _finished(composition: Composition, failed: list[Culprit], proof: str) -> Composition:
    plan = composition.plan
    repairs = tuple(
        {
            "backend": c.backend,
            "partition": c.partition,
            "nodes": list(c.nodes),
            "why": c.why,
            "moved_to": dict(Counter(plan.node_backends.get(n, "elsewhere") for n in c.nodes)),
        }
        for c in failed
    )
    composition.plan = attrs.evolve(plan, proof=proof, repairs=repairs)
    _warn_of_portable_kernels(repairs)
    return composition


def _warn_of_portable_kernels(repairs) -> None:
    # Correct but possibly 50-200x slower (OpenVINO alone, a bf16 miss on shufflenet_v2: 47 ms
    # on portable kernels against 0.27 ms): the user should not have to read the plan to see.
    moved = Counter()
    for repair in repairs:
        moved[repair["backend"]] += repair["moved_to"].get("portable", 0)
    for backend, count in moved.items():
        if count:
            warnings.warn(
                f"{count} node(s) moved off {backend} (the plan's repairs say why) now run on "
                "ExecuTorch's "
                "portable kernels, often 10 to 100 times slower than a delegate: list a backend "
                f"after {backend} that takes them (xnnpack on a CPU), or compose with "
                f"check=False (--no-check) to keep {backend}'s program as it is, unproven.",
                ComposerWarning,
                stacklevel=2,
            )
