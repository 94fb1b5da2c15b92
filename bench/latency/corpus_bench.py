"""composer beside plain ExecuTorch over the corpus of real models (composer/models/corpus.py).

    .venv/bin/python bench/latency/corpus_bench.py [--models resnet18,bert] \
        [--stacks "xnnpack;openvino;openvino,xnnpack;xnnpack,openvino;measured:openvino,xnnpack"] \
        [--tune-budget 240] [--runs 100] [--out bench/results/corpus_cpu.jsonl] [--resume]
    .venv/bin/python bench/latency/corpus_bench.py --table RESULTS.jsonl [MORE.jsonl ...]

For every model and stack, the same model is composed twice, in one process, the two taking
turns at going first (so that load and warm caches favour neither):
- by composer: ``composer.compose(model, stack, inputs, cache=False)`` (export, planning,
  lowering, to_executorch and composer's proof run included); a stack written
  ``measured:a,b`` is that stack with ``placement="measured"`` and ``tune_budget``;
- by plain ExecuTorch: ``torch.export.export(strict=False)``, then
  ``to_edge_transform_and_lower(ep, partitioner=[...])`` with ``XnnpackPartitioner()`` and
  ``OpenvinoPartitioner([CompileSpec("device", b"CPU")])`` in the stack's order (for
  ``measured:a,b``, the declared order a,b), then ``to_executorch()``; both under
  ``torch.no_grad()``, as composer lowers.
Each program is then loaded and run in the pip runtime
(``Runtime.get().load_program(buf).load_method("forward").execute(inputs)``), compared with
eager at composer's tolerance for its delegates' backends (OpenVINO computes in bf16 on CPUs
with bf16 units: ``plan.tolerances``), and, where both run, the two are timed together in
one interleaved run (``composer.measure.latency.interleaved``: blocks of calls taking turns,
rounds until the fastest calls agree).

Each model runs in a child process (a crash in a runtime loses one case, not the run); one
JSON line per case goes to ``--out`` as it finishes, then a markdown table and a summary are
printed. ``--table FILE`` prints the table and summary of an existing results file only.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

STACKS = ("xnnpack", "openvino", "openvino,xnnpack", "xnnpack,openvino",
          "measured:openvino,xnnpack")  # fmt: skip
# Seconds of composing candidates for measured placement: on 2 cores a candidate of a corpus
# model takes 5 to 20 s, and the whole set (orders, each backend alone, the per-region search)
# a dozen of them; with less, most candidates are "not measured" and the declared order stays.
TUNE_BUDGET_S = 240.0
RUNS = 100


def backends_of(stack: str) -> tuple[list[str], bool]:
    """The stack's backends in order, and whether placement is measured."""
    measured = stack.startswith("measured:")
    return stack.removeprefix("measured:").split(","), measured


def _commit() -> str:
    """The checkout's commit, with "+changes" when its composer/ differs from it."""
    here = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=here,
            text=True,
            capture_output=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "composer"],
            cwd=here,
            text=True,
            capture_output=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


def _error(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:600]}"


def _plain_partitioners(backends: list[str]) -> list:
    from executorch.backends.openvino import OpenvinoPartitioner
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    made = {
        "xnnpack": lambda: XnnpackPartitioner(),
        "openvino": lambda: OpenvinoPartitioner([CompileSpec("device", b"CPU")]),
    }
    return [made[name]() for name in backends]


def plain_compose(model, inputs, backends: list[str]) -> bytes:
    """What an ExecuTorch user writes: export, to_edge_transform_and_lower, to_executorch."""
    import torch
    from executorch.exir import to_edge_transform_and_lower

    with torch.no_grad():
        program = torch.export.export(model, tuple(inputs), strict=False)
        edge = to_edge_transform_and_lower(program, partitioner=_plain_partitioners(backends))
        return edge.to_executorch().buffer


def delegate_calls(buffer: bytes) -> dict[str, int]:
    """Delegate call instructions of a program, by backend id."""
    from executorch.exir._serialize._program import deserialize_pte_binary
    from executorch.exir.schema import DelegateCall

    calls: dict[str, int] = {}
    for plan in deserialize_pte_binary(buffer).program.execution_plan:
        for chain in plan.chains:
            for instruction in chain.instructions:
                if isinstance(instruction.instr_args, DelegateCall):
                    backend = plan.delegates[instruction.instr_args.delegate_index].id
                    calls[backend] = calls.get(backend, 0) + 1
    return calls


class Loaded:
    """A program loaded in the pip runtime; the bytes and the program live as long as it."""

    def __init__(self, buffer: bytes) -> None:
        from executorch.runtime import Runtime

        from composer.run.runtime import NativeLog

        self.buffer, self.log = buffer, NativeLog()
        with self.log.capture():
            self.program = Runtime.get().load_program(buffer)
            self.method = self.program.load_method("forward")

    def run(self, inputs) -> list:
        with self.log.capture():
            return list(self.method.execute(list(inputs)))

    def call(self, inputs):
        execute, arguments = self.method.execute, list(inputs)
        return lambda: execute(arguments)


def run_and_compare(buffer: bytes, inputs, expected, tolerance) -> tuple[dict, Loaded | None]:
    """Load and run a program, compare with eager; the facts, and the loaded program if it ran."""
    from composer.run.compare import compare

    facts: dict = {"delegate_calls": delegate_calls(buffer), "bytes": len(buffer)}
    try:
        loaded = Loaded(buffer)
        actual = loaded.run(inputs)
    except Exception as error:  # noqa: BLE001 - the runtime's failure is the result
        reason = ""
        if "loaded" in locals():
            reason = loaded.log.reasons()
        facts.update(
            runs=False, run_error=_error(error) + (f" (runtime log: {reason})" if reason else "")
        )
        return facts, None
    matches, worst = compare(actual, expected, tolerance)
    facts.update(
        runs=True,
        matches=matches,
        max_abs_error=worst,
        tolerance=None if tolerance is None else [tolerance.atol, tolerance.rtol],
    )
    return facts, loaded


def bench_case(
    name: str,
    stack: str,
    model,
    inputs,
    expected,
    composer_first: bool,
    tune_budget: float,
    runs: int,
) -> dict:
    """One model and stack: composer's and plain ExecuTorch's programs, side by side."""
    import torch

    import composer
    from composer.measure.latency import interleaved
    from composer.run.runtime import installed_tolerance

    backends, measured = backends_of(stack)
    row: dict = {
        "model": name,
        "stack": stack,
        "composer_first": composer_first,
        "load_at_start": os.getloadavg()[0],
        "commit": _commit(),
    }
    results: dict[str, dict] = {}
    buffers: dict[str, bytes] = {}
    tolerances: dict = {}

    def by_composer() -> None:
        settings = {"placement": "measured", "tune_budget": tune_budget} if measured else {}
        started = time.perf_counter()
        try:
            made = composer.compose(copy.deepcopy(model), backends, inputs, cache=False, **settings)
        except Exception as error:  # noqa: BLE001 - a failure is the result
            results["composer"] = {
                "composed": False,
                "error": _error(error),
                "compose_s": time.perf_counter() - started,
            }
            return
        plan = made.plan
        facts = {
            "composed": True,
            "compose_s": time.perf_counter() - started,
            "proof": plan.proof,
            "nodes": {b: len(plan.nodes_on(b)) for b in (*plan.backends, "portable")},
            "repairs": [r.to_dict() for r in plan.repairs],
        }
        if measured:
            facts["chose"] = plan.placement.chosen
            facts["candidates"] = [
                {k: c.to_dict()[k] for k in ("candidate", "delegate_calls", "median_us", "note")}
                for c in plan.placement.candidates
            ]
        results["composer"] = facts
        buffers["composer"] = made.buffer
        tolerances["composer"] = plan.tolerance()

    def by_plain() -> None:
        started = time.perf_counter()
        try:
            buffer = plain_compose(copy.deepcopy(model), inputs, backends)
        except Exception as error:  # noqa: BLE001
            results["plain"] = {
                "composed": False,
                "error": _error(error),
                "compose_s": time.perf_counter() - started,
            }
            return
        results["plain"] = {"composed": True, "compose_s": time.perf_counter() - started}
        buffers["plain"] = buffer
        tolerances["plain"] = installed_tolerance(buffer)

    for step in (by_composer, by_plain) if composer_first else (by_plain, by_composer):
        step()
    if len(buffers) == 2:
        # Byte for byte: then any latency ratio between the two is the measurement's.
        row["same_program"] = buffers["composer"] == buffers["plain"]
    loaded = {}
    # Loaded, and first in the first round of timing, in the order they were composed, which
    # alternates from case to case. Always loaded and timed first, composer's program came
    # out 1.6% slower than plain's loaded a second time (median of 17 cases), 1.06 on
    # resnet18 xnnpack where the two are the same bytes.
    for who in ("composer", "plain") if composer_first else ("plain", "composer"):
        if who in buffers:
            facts, program = run_and_compare(buffers[who], inputs, expected, tolerances[who])
            results[who].update(facts)
            if program is not None:
                loaded[who] = program
    if len(loaded) == 2:
        # The control: plain's program loaded a second time and timed beside the two. Two
        # loads of one program differ by up to 6% here (levit_128s: 1572 and 1474 us), so a
        # composer/plain ratio means something only next to plain/plain-again.
        _facts, again = run_and_compare(buffers["plain"], inputs, expected, tolerances["plain"])
        if again is not None:
            loaded["plain_again"] = again
        calls = {who: program.call(inputs) for who, program in loaded.items()}
        with torch.no_grad():
            timed = interleaved(calls, runs)
        for who, latency in timed.items():
            results.setdefault(who, {}).update(
                median_us=latency.median_us,
                best_us=latency.best_us,
                p90_us=latency.p90_us,
                timed_runs=latency.runs,
            )
    row.update(results)
    return row


def _warm_up() -> None:
    """Import and run everything once, so the first case pays no import for either side."""
    import torch

    import composer
    from composer.models import zoo

    model, inputs = zoo.load("cnn")
    with torch.no_grad():
        expected = model(*inputs)
    composer.compose(model, ["openvino", "xnnpack"], inputs, cache=False)
    run_and_compare(plain_compose(model, inputs, ["openvino", "xnnpack"]), inputs, expected, None)


def child(name: str, stacks: list[str], first_index: int, tune_budget: float, runs: int) -> int:
    """Bench one model over ``stacks``, printing a JSON line per case."""
    warnings.simplefilter("ignore")
    import logging

    import torch

    from composer.models import corpus

    logging.getLogger().setLevel(logging.ERROR)
    _warm_up()
    model, inputs = corpus.load(name)
    with torch.no_grad():
        expected = copy.deepcopy(model)(*inputs)
        # The first compose of a model in a process pays 1 to 3 s more than the next (its
        # first export and decomposition: bert xnnpack 7.8 s for whoever went first, 4.8
        # for the other), which went to whichever side was first in the model's first case.
        try:
            plain_compose(copy.deepcopy(model), inputs, backends_of(stacks[0])[0])
        except Exception as error:  # noqa: BLE001 - the case itself reports plain's failure
            print(f"warm-up: {_error(error)}", file=sys.stderr)
    for offset, stack in enumerate(stacks):
        print(json.dumps({"starting": stack}), flush=True)
        try:
            row = bench_case(
                name,
                stack,
                model,
                inputs,
                expected,
                (first_index + offset) % 2 == 0,
                tune_budget,
                runs,
            )
        except Exception as error:  # noqa: BLE001 - the bench's own failure, said as such
            row = {
                "model": name,
                "stack": stack,
                "bench_error": _error(error),
                "traceback": traceback.format_exc()[-2000:],
            }
        row["library"] = corpus.CORPUS[name].library
        print(json.dumps(row, default=str), flush=True)
    return 0


def run_model(name: str, stacks: list[str], first_index: int, args, out) -> list[dict]:
    """Run ``child`` in a new process, again after a crash for the stacks left."""
    rows, left = [], list(stacks)
    while left:
        command = [
            sys.executable,
            __file__,
            "--child",
            name,
            "--stacks",
            ";".join(left),
            "--first-index",
            str(first_index + len(stacks) - len(left)),
            "--tune-budget",
            str(args.tune_budget),
            "--runs",
            str(args.runs),
        ]
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        started = None
        for line in process.stdout:
            if not line.startswith("{"):
                continue
            record = json.loads(line)
            if "starting" in record:
                started = record["starting"]
                continue
            rows.append(record)
            out.write(json.dumps(record, default=str) + "\n")
            out.flush()
            print(table_row(record), flush=True)
            left.remove(record["stack"])
            started = None
        stderr = process.stderr.read()
        code = process.wait()
        if left and started is None:  # died before its first case: record them all
            started = left[0]
        if left:
            record = {
                "model": name,
                "stack": started,
                "bench_error": f"the process died (exit {code}) during this case: "
                + " | ".join(stderr.strip().splitlines()[-3:]),
            }
            rows.append(record)
            out.write(json.dumps(record) + "\n")
            out.flush()
            print(table_row(record), flush=True)
            left.remove(started)
    return rows


# ---------------------------------------------------------------- the table and summary

HEADER = (
    "| model | stack | composer | plain ExecuTorch | max abs error composer / plain "
    "| delegate calls composer / plain | compose s composer / plain (ratio) "
    "| median us composer / plain (ratio) |"
)


def _outcome(facts: dict | None) -> str:
    if not facts:
        return "-"
    if not facts.get("composed"):
        return "fails to compose"
    if not facts.get("runs"):
        return "fails to run"
    return "runs, matches" if facts.get("matches") else "runs, MISMATCH"


def _num(value, fmt: str = ".3g") -> str:
    return "-" if value is None else format(value, fmt)


def table_row(row: dict) -> str:
    if "bench_error" in row:
        return f"| {row['model']} | {row['stack']} | bench error: {row['bench_error'][:200]} |"
    c, p = row.get("composer", {}), row.get("plain", {})
    calls = [
        sum(x.get("delegate_calls", {}).values()) if x.get("composed") else None for x in (c, p)
    ]
    ratio = lambda a, b: None if a is None or b is None or not b else a / b
    compose = ratio(c.get("compose_s"), p.get("compose_s"))
    latency = ratio(c.get("median_us"), p.get("median_us"))
    chose = f" (chose {c['chose']})" if c.get("chose") else ""
    moved = f" ({len(c['repairs'])} repair(s))" if c.get("repairs") else ""
    return (
        f"| {row['model']} | {row['stack']} | {_outcome(c)}{chose}{moved} | {_outcome(p)} "
        f"| {_num(c.get('max_abs_error'))} / {_num(p.get('max_abs_error'))} "
        f"| {_num(calls[0], 'd')} / {_num(calls[1], 'd')} "
        f"| {_num(c.get('compose_s'), '.1f')} / {_num(p.get('compose_s'), '.1f')} "
        f"({_num(compose, '.2f')}) "
        f"| {_num(c.get('median_us'), '.0f')} / {_num(p.get('median_us'), '.0f')} "
        f"({_num(latency, '.2f')}) |"
    )


def _ok(facts: dict | None) -> bool:
    return bool(facts and facts.get("composed") and facts.get("runs") and facts.get("matches"))


def summary(rows: list[dict]) -> str:
    """Where composer beats plain ExecuTorch, where both fail, the median ratios."""
    lines = []
    cases = [r for r in rows if "bench_error" not in r]
    beats = [r for r in cases if _ok(r["composer"]) and not _ok(r["plain"])]
    loses = [r for r in cases if _ok(r["plain"]) and not _ok(r["composer"])]
    both_fail = [r for r in cases if not _ok(r["plain"]) and not _ok(r["composer"])]
    both = [r for r in cases if _ok(r["composer"]) and _ok(r["plain"])]
    # A single backend "runs the model alone" where either side's program of it ran and matched.
    alone = {
        (r["model"], r["stack"])
        for r in cases
        if "," not in r["stack"] and (_ok(r["composer"]) or _ok(r["plain"]))
    }
    bar_missed = [
        r
        for r in cases
        if not _ok(r["composer"])
        and any((r["model"], b) in alone for b in backends_of(r["stack"])[0])
    ]
    lines.append(f"cases: {len(cases)} ({len(rows) - len(cases)} bench errors)")
    lines.append(
        f"composer runs and matches: {sum(_ok(r['composer']) for r in cases)}; "
        f"plain ExecuTorch: {sum(_ok(r['plain']) for r in cases)}"
    )

    def listed(title: str, chosen: list[dict], who: str | None) -> None:
        lines.append(f"{title}: {len(chosen)}")
        for r in chosen:
            why = ""
            if who:
                facts = r[who]
                why = (
                    facts.get("error")
                    or facts.get("run_error")
                    or (
                        f"max abs error {_num(facts.get('max_abs_error'))}"
                        if facts.get("runs")
                        else ""
                    )
                )
            lines.append(
                f"  - {r['model']} / {r['stack']}" + (f": {who}: {why[:300]}" if why else "")
            )

    listed("composer beats plain (composer runs and matches, plain does not)", beats, "plain")
    listed("plain beats composer (plain runs and matches, composer does not)", loses, "composer")
    listed("both fail", both_fail, "composer")
    listed(
        "composer fails where one of the stack's backends runs the model alone",
        bar_missed,
        "composer",
    )
    for label, stack_filter in (
        ("all stacks", lambda s: True),
        ("priority stacks (not measured)", lambda s: not s.startswith("measured:")),
        ("measured", lambda s: s.startswith("measured:")),
    ):
        chosen = [r for r in both if stack_filter(r["stack"])]
        if not chosen:
            continue
        c = [r["composer"]["compose_s"] / r["plain"]["compose_s"] for r in chosen]
        t = _ratios(chosen, "composer", "plain")
        aa = _ratios(chosen, "plain_again", "plain")
        same = sum(bool(r.get("same_program")) for r in chosen)
        lines.append(
            f"where both run and match, {label} ({len(chosen)} cases, {same} of them the same "
            "program byte for byte): composer/plain compose "
            f"seconds median {statistics.median(c):.2f} (min {min(c):.2f}, max {max(c):.2f})"
            + (f"; latency (median us) {_spread(t)}" if t else "")
            + (f"; control, plain's program loaded twice: {_spread(aa)}" if aa else "")
        )
    return "\n".join(lines)


def _ratios(rows: list[dict], who: str, over: str) -> list[float]:
    """Median latency of ``who`` over that of ``over``, per row where both were timed."""
    return [
        r[who]["median_us"] / r[over]["median_us"]
        for r in rows
        if r.get(who, {}).get("median_us") and r[over].get("median_us")
    ]


def _spread(ratios: list[float]) -> str:
    return f"median {statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f})"


def _in_corpus_order(rows: list[dict]) -> list[dict]:
    """Rows by the corpus's order of models, then the order of STACKS."""
    from composer.models import corpus

    names = corpus.names()

    def key(row: dict) -> tuple:
        model = names.index(row["model"]) if row["model"] in names else len(names)
        stack = STACKS.index(row["stack"]) if row["stack"] in STACKS else len(STACKS)
        return model, stack, row["model"], row["stack"]

    return sorted(rows, key=key)


def print_table(rows: list[dict]) -> None:
    print(HEADER)
    print("|---" * (HEADER.count(" | ") + 1) + "|")
    for row in rows:
        print(table_row(row))
    print()
    print(summary(rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated corpus names (default: all)")
    parser.add_argument(
        "--stacks",
        default=";".join(STACKS),
        help="semicolon-separated; 'measured:a,b' for measured placement",
    )
    parser.add_argument("--tune-budget", type=float, default=TUNE_BUDGET_S)
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--out", default="bench/results/corpus_cpu.jsonl")
    parser.add_argument(
        "--resume", action="store_true", help="keep --out's rows and run only the cases it lacks"
    )
    parser.add_argument(
        "--table",
        nargs="+",
        help="print the table of these results files and stop; a later file's row for a model "
        "and stack replaces an earlier one's (a part run again)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--first-index", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    stacks = args.stacks.split(";")
    if args.child:
        return child(args.child, stacks, args.first_index, args.tune_budget, args.runs)
    if args.table:
        merged: dict[tuple[str, str], dict] = {}
        for path in args.table:
            for line in Path(path).read_text().splitlines():
                if line.strip():
                    row = json.loads(line)
                    merged[row["model"], row["stack"]] = row
        print_table(_in_corpus_order(list(merged.values())))
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from composer.models import corpus

    names = args.models.split(",") if args.models else corpus.names()
    unknown = [n for n in names if n not in corpus.CORPUS]
    if unknown:
        parser.error(f"no corpus model {', '.join(unknown)}; choose from {corpus.names()}")
    print(f"load average (1, 5, 15 min) at start: {os.getloadavg()}", flush=True)
    print(HEADER)
    print("|---" * (HEADER.count(" | ") + 1) + "|", flush=True)
    rows, done = [], set()
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if args.resume and out_path.exists():
        rows = [json.loads(line) for line in out_path.read_text().splitlines() if line.strip()]
        done = {(row["model"], row["stack"]) for row in rows}
    with open(out_path, "a" if args.resume else "w") as out:
        for index, name in enumerate(names):
            left = [stack for stack in stacks if (name, stack) not in done]
            if left:
                # Who goes first alternates from case to case and from model to model (with
                # an even number of stacks, index * len(stacks) put composer first in every
                # model's first case).
                rows += run_model(name, left, index, args, out)
    print(f"load average (1, 5, 15 min) at end: {os.getloadavg()}")
    print()
    print(summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
