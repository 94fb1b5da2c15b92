"""What narrowing a wrong delegate to its wrong operators changes for the zoo models whose
Vulkan partition the proof finds wrong in ExecuTorch's Vulkan runner (tied_lm: 0.000988 off
where 1.54e-05 is allowed; unet: the runner dies with vkapi::Error; bench/RESULTS.md and
bench/results/conformance_2026-11-28_7e57a50/vk_repairs.txt).

Each case composes the model for the stack vulkan,xnnpack with the cache off, with narrowing
on (composer's default) and off (``Narrowing.narrowed`` patched to give its culprit back
unchanged, which is how repairs moved whole partitions before), and prints the compose time,
each repair (backend, partition, nodes, why, where its nodes went), the nodes left on each
backend and the proof line.

On the GPU machine, after `source bench/gpu_setup.sh; source bench/et_runtime/vulkan/use_runner.sh;
export COMPOSER_ET_RUNNER=$COMPOSER_VULKAN_RUNNER`:
    python3 bench/gpu/vk_narrowing.py tied_lm:on tied_lm:off unet:on unet:off
A case is MODEL:on or MODEL:off, optionally :REPAIR_TIME after it (the stack's repair_time,
default 3); a bare MODEL means both. `--trace` prints each of narrowing's trial lowerings (the
operators it kept on the backend, whether that delegate failed, the seconds). `--warmup` first composes zoo:mlp
for the same stack (its time printed apart), so that the first case does not alone pay for
the imports and the backends' first lowering in the process.
"""

from __future__ import annotations

import sys
import time

import composer
from composer.models import zoo
from composer.pipeline import narrowing

STACK = ["vulkan", "xnnpack"]
BACKENDS = ("vulkan", "xnnpack", "portable")
_NARROWED = narrowing.Narrowing.narrowed


def _set_narrowing(on: bool) -> None:
    narrowing.Narrowing.narrowed = (
        _NARROWED if on else (lambda self, culprit, plan, deadline: culprit)
    )


def _trace() -> None:
    judged = narrowing._Tries._judged

    def traced(self, ops):
        started = time.perf_counter()
        failed = judged(self, ops)
        print(
            f"      trial {self.count}: kept on the backend {sorted(ops)} -> "
            f"{'fails' if failed else 'passes' if failed is False else 'not known'} "
            f"({time.perf_counter() - started:.1f} s)",
            flush=True,
        )
        return failed

    narrowing._Tries._judged = traced
    lowered_holding = narrowing._lowered_holding

    def lowering(lowered, ops, backends, store):
        try:
            return lowered_holding(lowered, ops, backends, store)
        except Exception as error:
            print(f"      trial lowering of {sorted(ops)} failed: {error!r:.300}", flush=True)
            raise

    narrowing._lowered_holding = lowering


def _cases(args: list[str]) -> list[tuple[str, bool, float | None]]:
    cases = []
    for arg in args:
        name, _, rest = arg.partition(":")
        mode, _, repair_time = rest.partition(":")
        modes = [mode] if mode else ["on", "off"]
        cases.extend((name, m == "on", float(repair_time) if repair_time else None) for m in modes)
    return cases


def run_case(name: str, on: bool, repair_time: float | None = None) -> None:
    label = f"{name} narrowing={'on' if on else 'off'}"
    stack = composer.Stack(STACK)
    if repair_time is not None:
        label += f" repair_time={repair_time:g}"
        stack = composer.Stack(STACK, repair_time=repair_time)
    _set_narrowing(on)
    model, inputs = zoo.load(name)
    started = time.perf_counter()

    def say(line: str) -> None:
        print(f"    [{time.perf_counter() - started:6.1f} s] {line}", flush=True)

    try:
        composition = composer.compose(model, stack, inputs, cache=False, progress=say)
    except composer.ComposerError as error:
        print(
            f"== {label}: refused after {time.perf_counter() - started:.1f} s: {error}", flush=True
        )
        return
    seconds = time.perf_counter() - started
    plan = composition.plan
    print(f"== {label}: compose {seconds:.1f} s, repairs={len(plan.repairs)}", flush=True)
    for repair in plan.repairs:
        print(
            f"   repair {repair.backend} {repair.partition}: {len(repair.nodes)} node(s) "
            f"moved to {dict(repair.moved_to)}",
            flush=True,
        )
        print(f"     nodes: {', '.join(repair.nodes)}", flush=True)
        print(f"     why: {repair.why}", flush=True)
        if repair.options:
            print(f"     options: {repair.options}", flush=True)
    for backend in BACKENDS:
        ops = plan.ops_on(backend)
        print(
            f"   on {backend}: {sum(ops.values())} node(s) {dict(sorted(ops.items()))}", flush=True
        )
    print(f"   proof: {plan.proof}", flush=True)


def warm_up() -> None:
    model, inputs = zoo.load("mlp")
    started = time.perf_counter()
    composition = composer.compose(model, composer.Stack(STACK), inputs, cache=False)
    print(
        f"== warm-up mlp: {time.perf_counter() - started:.1f} s; proof: {composition.plan.proof}",
        flush=True,
    )


def main(args: list[str]) -> None:
    if "--warmup" in args:
        warm_up()
    if "--trace" in args:
        _trace()
    for name, on, repair_time in _cases([a for a in args if not a.startswith("--")]):
        run_case(name, on, repair_time)
    _set_narrowing(True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["tied_lm", "unet"])
