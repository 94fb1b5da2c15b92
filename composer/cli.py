"""The ``composer`` command line."""

from __future__ import annotations

import argparse
import sys
import warnings

from composer.errors import ComposerError

USER_ERROR = 2


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
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    for failed in registry.failed:
        print(f"failed to load plugin {failed.name} ({failed.distribution}): {failed.error}")
    return 0


def _plan(args: argparse.Namespace) -> int:
    import composer
    from composer.model_source import load_model

    model, inputs = load_model(args.model)
    plan = composer.plan(model, args.backends, inputs)
    print(plan.to_json() if args.json else plan.summary_table())
    return 0


def _lower(args: argparse.Namespace) -> int:
    import composer
    from composer.model_source import load_model

    model, inputs = load_model(args.model)
    composition = composer.compose(model, args.backends, inputs)
    path = composition.save(args.output)
    print(composition.plan.summary_table())
    print(f"wrote {path} ({len(composition.buffer):,} bytes)")
    if args.verify:
        result = composition.verify()
        print(f"verify: {result}")
        if not result.ok:
            return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="composer", description="Compose several ExecuTorch backends into one .pte."
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    commands = parser.add_subparsers(dest="command", required=True)

    backends = commands.add_parser("backends", help="list the backends found")
    backends.set_defaults(run=_backends)

    model_help = "zoo:NAME, a .pt2 file, or package.module:function -> (module, inputs)"
    plan = commands.add_parser("plan", help="show which backend takes which op, no lowering")
    plan.add_argument("model", help=model_help)
    plan.add_argument("--backends", required=True, help="priority list, e.g. tensorrt_stub,xnnpack")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.set_defaults(run=_plan)

    lower = commands.add_parser("lower", help="lower to a .pte with the backend stack")
    lower.add_argument("model", help=model_help)
    lower.add_argument(
        "--backends", required=True, help="priority list, e.g. tensorrt_stub,xnnpack"
    )
    lower.add_argument("-o", "--output", required=True, help="the .pte to write")
    lower.add_argument("--verify", action="store_true", help="run it and compare with eager")
    lower.set_defaults(run=_lower)
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
