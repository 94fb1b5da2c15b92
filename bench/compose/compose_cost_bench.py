"""What composing costs next to plain ExecuTorch, on corpus models (issue 24 item 5).

    .venv/bin/python bench/compose/compose_cost_bench.py [--models squeezenet,bert] \
        [--stacks "xnnpack;openvino,xnnpack"] [--rounds 3]

For each model and stack, in one process, ``rounds`` rounds of two composes taking turns at
going first: ``composer.compose(model, stack, inputs, cache=False)`` (export, planning,
lowering, ``to_executorch`` and the proof run, as a user gets it) and plain ExecuTorch's
``export`` + ``to_edge_transform_and_lower`` + ``to_executorch`` with the same partitioners in
the same order (``corpus_bench.plain_compose``). Prints each case's median seconds per side and
their ratio, then the median ratio over the cases. Only the ratio within one case means much:
the two sides of a round run back to back on the same load.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "latency"))  # corpus_bench

MODELS = "squeezenet,mobilenet_v3_small,resnet18,deit_tiny,bert,gpt2,whisper_encoder,lcnet"
STACKS = "xnnpack;openvino,xnnpack"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--stacks", default=STACKS)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")

    import corpus_bench

    import composer
    from composer.models import corpus

    corpus_bench._warm_up()
    ratios = []
    print("| model | stack | composer s | plain s | ratio |")
    print("|---|---|---|---|---|")
    for name in args.models.split(","):
        model, inputs = corpus.load(name)
        for stack in args.stacks.split(";"):
            backends = stack.split(",")
            sides = {
                "composer": lambda m=model, b=backends, i=inputs: composer.compose(
                    copy.deepcopy(m), b, i, cache=False
                ),
                "plain": lambda m=model, b=backends, i=inputs: corpus_bench.plain_compose(
                    copy.deepcopy(m), i, b
                ),
            }
            seconds: dict[str, list[float]] = {side: [] for side in sides}
            for round_ in range(args.rounds):
                order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
                for side in order:
                    started = time.perf_counter()
                    sides[side]()
                    seconds[side].append(time.perf_counter() - started)
            mine, plain = (statistics.median(seconds[s]) for s in ("composer", "plain"))
            ratios.append(mine / plain)
            print(f"| {name} | {stack} | {mine:.2f} | {plain:.2f} | {mine / plain:.2f} |",
                  flush=True)  # fmt: skip
    print(f"\ncomposer/plain compose seconds over {len(ratios)} cases: median "
          f"{statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
