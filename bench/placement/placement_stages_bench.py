"""Where a measured compose's time goes, by stage (issue 42 item 3).

    PYTHONPATH=. .venv/bin/python bench/placement/placement_stages_bench.py [--models transformer_block,gru] \
        [--stack openvino,xnnpack]

For each zoo model, in one process, after one compose that warms imports and the runtime:
``composer.compose(..., cache=False)`` (priority), then the same with ``placement="measured"``,
each with a fresh, empty ``$COMPOSER_CACHE_DIR``. During the measured compose the functions
below are wrapped with timers, and each stage's time is counted outside the stages it calls
(``to_edge_transform_and_lower`` less the backends' ``preprocess`` inside it, and so on).
Prints the stages by time, with their calls. The names wrapped are those of main at 9166d4f and
of the placement-cost branch; a name a tree lacks is left unwrapped and said.
"""

from __future__ import annotations

import argparse
import collections
import copy
import functools
import importlib
import os
import sys
import tempfile
import time
import warnings

# (module, function, stage): where each stage starts.
STAGES = (
    ("composer.lower.partition_cache", "_preprocess_serially", "backends' preprocess"),
    (
        "composer.lower.priority",
        "to_edge_transform_and_lower",
        "to_edge_transform_and_lower less preprocess",
    ),
    ("composer.lower.lowering", "written", "to_executorch"),
    ("composer.pipeline.proven", "prove", "proofs"),
    ("composer.pipeline.stages", "export_model", "torch.export"),
    ("composer.pipeline.stages", "fresh_program", "torch.export"),
    ("composer.measure.etdump", "trace_together", "ETDump traces of the search's layouts"),
    ("composer.measure.placement", "trace", "ETDump traces of the candidates"),
    ("composer.measure.placement", "program_runner", "loading programs"),
    ("composer.measure.region_search", "program_runner", "loading programs"),
    ("composer.measure.placement", "interleaved", "timing rounds"),
    ("composer.measure.placement", "measure", "the rest of measure()"),
)


def wrapped(stages):
    """Wrap each stage's function; returns (seconds, calls) per stage, filled as they run."""
    seconds, calls, open_stages = collections.Counter(), collections.Counter(), []
    for module_name, name, stage in stages:
        module = importlib.import_module(module_name)
        function = getattr(module, name, None)
        if function is None:
            print(f"not wrapped: {module_name}.{name} (not in this tree)")
            continue

        def timed(*args, _function=function, _stage=stage, **kwargs):
            open_stages.append([_stage, 0.0])
            started = time.perf_counter()
            try:
                return _function(*args, **kwargs)
            finally:
                spent = time.perf_counter() - started
                label, inside = open_stages.pop()
                seconds[label] += spent - inside
                calls[label] += 1
                if open_stages:
                    open_stages[-1][1] += spent

        setattr(module, name, functools.wraps(function)(timed))
    return seconds, calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="transformer_block,gru")
    parser.add_argument("--stack", default="openvino,xnnpack")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    import composer
    from composer.models import zoo

    seconds, calls = wrapped(STAGES)
    model, inputs = zoo.load("mlp")
    with tempfile.TemporaryDirectory() as warm:
        os.environ["COMPOSER_CACHE_DIR"] = warm
        composer.compose(model, args.stack, inputs, cache=False)
    for name in args.models.split(","):
        model, inputs = zoo.load(name)
        with tempfile.TemporaryDirectory() as folder:
            os.environ["COMPOSER_CACHE_DIR"] = folder
            started = time.perf_counter()
            composer.compose(copy.deepcopy(model), args.stack, inputs, cache=False)
            priority = time.perf_counter() - started
        seconds.clear()
        calls.clear()
        with tempfile.TemporaryDirectory() as folder:
            os.environ["COMPOSER_CACHE_DIR"] = folder
            started = time.perf_counter()
            composition = composer.compose(
                copy.deepcopy(model), args.stack, inputs, cache=False, placement="measured"
            )
            measured = time.perf_counter() - started
        chosen = composition.plan.placement.chosen
        print(f"{name}: priority {priority:.2f} s, measured {measured:.2f} s, chose {chosen}")
        for stage, spent in seconds.most_common():
            print(f"  {spent:6.2f} s  {calls[stage]:3d} calls  {stage}")
        print(f"  {measured - sum(seconds.values()):6.2f} s  outside measure()")
    return 0


if __name__ == "__main__":
    sys.exit(main())
