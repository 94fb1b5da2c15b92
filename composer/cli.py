"""The ``composer`` command line (argparse)."""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

from composer.errors import ComposerError

USER_ERROR = 2
MODEL_HELP = "zoo:NAME, a .pt2 file from torch.export.save, or package.module:function"
REPORT_SUFFIXES = (".json", ".html")


def _stack(args: argparse.Namespace):
    from composer.config import find_config, load_config

    path = Path(args.config) if args.config else find_config(Path.cwd())
    if args.config and not path.is_file():
        raise ComposerError(f"no such config file: {args.config}")
    stack = load_config(path).with_overrides(args.backends, args.option, args.no_consolidate)
    if not stack.backends:
        raise ComposerError(
            "no backends given: pass --backends a,b or set backends in [tool.composer] of "
            "pyproject.toml or in composer.toml."
        )
    return stack


def _settings(stack) -> dict:
    return {
        "options": stack.options,
        "never": stack.never,
        "min_partition_size": stack.min_partition_size,
        "consolidate": stack.consolidate,
    }


def _backends(args: argparse.Namespace) -> int:
    from composer.registry import default_registry

    registry = default_registry()
    rows = [("name", "backend id", "device", "lowers here", "from")]
    for name, backend in sorted(registry.backends.items()):
        reason = registry.unavailable_reason(backend)
        origin = backend.origin
        rows.append(
            (
                name,
                backend.spec.backend_id,
                backend.spec.device,
                "yes" if reason is None else f"no: {reason}",
                f"{origin.distribution} {origin.version}",
            )
        )
    print(_table(rows))
    for failed in registry.failed:
        print(f"failed to load plugin {failed.name} ({failed.distribution}): {failed.error}")
    return 0


def _plan(args: argparse.Namespace) -> int:
    import composer
    from composer.model_source import load_model

    stack = _stack(args)
    model, inputs = load_model(args.model)
    plan = composer.plan(model, list(stack.backends), inputs, **_settings(stack))
    print(plan.to_json() if args.json else plan.summary_table())
    return 0


def _lower(args: argparse.Namespace) -> int:
    import composer
    from composer.model_source import load_model

    report = Path(args.report) if args.report else None
    if report is not None and report.suffix not in REPORT_SUFFIXES:
        raise ComposerError(f"--report must end in .json or .html, not {report.name!r}.")
    output = Path(args.output)
    for path in (output, report):
        if path is not None and not path.parent.is_dir():
            raise ComposerError(f"cannot write {path}: the directory {path.parent} does not exist.")
    stack = _stack(args)
    model, inputs = load_model(args.model)
    started = time.perf_counter()

    def progress(line: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {line}", file=sys.stderr, flush=True)

    composition = composer.compose(
        model,
        list(stack.backends),
        inputs,
        progress=None if args.quiet else progress,
        **_settings(stack),
    )
    extra = {}
    if report is not None:
        extra[report] = _render_report(composition.plan, report, args.model).encode()
    composition.save(output, extra=extra)
    print(composition.plan.summary_table())
    written = ", ".join(str(p) for p in [output, *extra])
    print(f"wrote {written} ({len(composition.buffer):,} bytes of program)")
    if args.verify:
        result = composition.verify()
        print(f"verify: {result}")
        if not result.ok:
            return 1
    return 0


def _render_report(plan, path: Path, title: str) -> str:
    if path.suffix == ".json":
        return plan.to_json()
    from composer.report_html import render_html

    return render_html(plan, title=f"composer plan: {title}")


def _run(args: argparse.Namespace) -> int:
    import torch

    from composer.model_source import load_model
    from composer.runtime import run_program

    program = Path(args.program)
    if not program.is_file():
        raise ComposerError(f"no such file: {program}")
    model = inputs = None
    if args.compare:
        model, inputs = load_model(args.compare)
    if args.inputs:
        inputs = _load_inputs(Path(args.inputs))
    if inputs is None:
        raise ComposerError("pass --inputs FILE (a tuple of tensors saved with torch.save) or "
                            "--compare MODEL to use the model's example inputs.")  # fmt: skip
    outputs = run_program(program.read_bytes(), inputs)
    for index, output in enumerate(outputs):
        print(
            f"output {index}: shape {list(output.shape)} {str(output.dtype).removeprefix('torch.')}"
        )
    if model is None:
        return 0
    from composer.compose import compare, export_model

    eager = model if isinstance(model, torch.nn.Module) else export_model(model, None).module()
    with torch.no_grad():
        expected = eager(*inputs)
    ok, worst = compare(outputs, expected)
    verdict = "OK" if ok else "MISMATCH"
    print(f"compare with {args.compare}: {verdict}, max |pte - eager| = {worst:.3g}")
    return 0 if ok else 1


def _load_inputs(path: Path) -> tuple:
    import torch

    if not path.is_file():
        raise ComposerError(f"no such inputs file: {path}")
    try:
        value = torch.load(path, weights_only=True)
    except Exception as error:
        raise ComposerError(f"cannot read inputs from {path}: {error}") from error
    return tuple(value) if isinstance(value, list | tuple) else (value,)


def _explain(args: argparse.Namespace) -> int:
    import composer
    from composer.model_source import load_model

    stack = _stack(args)
    model, inputs = load_model(args.model)
    plan = composer.plan(model, list(stack.backends), inputs, **_settings(stack))
    if args.node:
        nodes = [args.node] if args.node in plan.node_backends else []
    else:
        nodes = [name for name, op in plan.node_ops.items() if op == args.op]
    if not nodes:
        what = f"node {args.node!r}" if args.node else f"op {args.op!r}"
        known = ", ".join(sorted(set(plan.node_ops.values())))
        raise ComposerError(f"the edge program has no {what}. Its ops: {known}.")
    for name in nodes:
        print(f"{name} ({plan.node_ops[name]}) -> {plan.backend_of(name)}")
        for backend, answer in plan.explain(name):
            print(f"  {backend}: {answer}")
    return 0


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows
    )


def _add_stack_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help=MODEL_HELP)
    parser.add_argument(
        "--backends", help="priority list, e.g. tensorrt_stub,xnnpack (default: the config's)"
    )
    parser.add_argument(
        "--option", action="append", default=[], metavar="BACKEND.NAME=VALUE",
        help="a backend option, e.g. cuda.max_autotune=OFF (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--config", help="composer.toml or pyproject.toml (default: the one in this directory)"
    )
    parser.add_argument(
        "--no-consolidate", action="store_true",
        help="plain priority order: do not hand small islands to the backend around them",
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="composer", description="Compose several ExecuTorch backends into one .pte."
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    commands = parser.add_subparsers(dest="command", required=True)

    backends = commands.add_parser("backends", help="list the backends found")
    backends.set_defaults(run=_backends)

    plan = commands.add_parser("plan", help="which backend takes which op; lowers nothing")
    _add_stack_arguments(plan)
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.set_defaults(run=_plan)

    lower = commands.add_parser("lower", help="lower to a .pte with the backend stack")
    _add_stack_arguments(lower)
    lower.add_argument("-o", "--output", required=True, help="the .pte to write")
    lower.add_argument("--report", help="also write the plan: out.html (a picture) or out.json")
    lower.add_argument("--verify", action="store_true", help="run it and compare with eager")
    lower.add_argument("--quiet", action="store_true", help="no progress lines")
    lower.set_defaults(run=_lower)

    run = commands.add_parser("run", help="run a .pte in the ExecuTorch runtime")
    run.add_argument("program", help="the .pte")
    run.add_argument("--inputs", help="a tuple of tensors saved with torch.save")
    run.add_argument("--compare", metavar="MODEL", help="check against this model in eager")
    run.set_defaults(run=_run)

    explain = commands.add_parser("explain", help="why a node went where it went")
    _add_stack_arguments(explain)
    which = explain.add_mutually_exclusive_group(required=True)
    which.add_argument("--node", help="a node name from the plan")
    which.add_argument("--op", help="every node of this op, e.g. aten.cumsum.default")
    explain.set_defaults(run=_explain)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.debug:
        # Upstream deprecation chatter hides composer's own messages in a terminal.
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
    try:
        return args.run(args)
    except ComposerError as error:
        if args.debug:
            raise
        print(f"composer: error: {error}", file=sys.stderr)
        return USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
