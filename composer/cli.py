"""The ``composer`` command line (argparse); ``terminal`` handles Ctrl-C and warnings."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

from composer import terminal
from composer.contract import environment
from composer.contract.errors import ComposerError, did_you_mean, from_command_line
from composer.contract.quiet import upstream_quieted

USER_ERROR = 2
MODEL_HELP = "zoo:NAME, a .pt2 file from torch.export.save, or package.module:function"
REPORT_SUFFIXES = (".json", ".html")


def _stack(args: argparse.Namespace):
    from composer.config import find_config, stack_from

    path = Path(args.config) if args.config else find_config(Path.cwd())
    if args.config and not path.is_file():
        raise ComposerError(f"no such config file: {args.config}")
    placement = "strict" if args.no_consolidate else args.placement
    return stack_from(
        path, args.backends, args.option, placement, args.tune_budget, args.threads,
        args.repair_time,
    )  # fmt: skip


def _backends(args: argparse.Namespace) -> int:
    import json

    from composer.registry.discovery import default_registry
    from composer.run.backends_here import backends_here

    registry = default_registry()
    if args.ray_resources:
        from composer.fleet.runtime_labels import ray_resources_line

        print(ray_resources_line(registry))
        return 0
    for name in args.names:
        if name not in registry.backends:
            registry.resolve([name])  # says which are known, and the nearest
    found = {each.name: each for each in backends_here(registry)}
    chosen = [found[name] for name in dict.fromkeys(args.names)] or list(found.values())
    width = terminal.width() or BACKENDS_WIDTH
    failed = [f"failed to load plugin {failed.name} ({failed.distribution}): {failed.error}"
              for failed in registry.failed]  # fmt: skip
    if args.json:
        listed = [{**each.to_dict(), **_options_of(registry, each.name)} for each in chosen]
        print(json.dumps(listed, indent=2))
        for line in failed:
            print(line, file=sys.stderr)
        return 0
    if args.names:
        _print_backend_details(registry, chosen, width)
    else:
        import textwrap

        print(_backends_table(chosen, width))
        for note in (
            "proves here: lowers and runs here, so each program is checked before it is written",
            "composer backends NAME: why a backend does not lower or run here, and its options",
        ):
            print(textwrap.fill(note, width, subsequent_indent="  "))
    for line in failed:
        print(line)
    return 0


# `composer backends` into a file or a pipe: as wide as a terminal would commonly be.
BACKENDS_WIDTH = 100


def _backends_table(backends: list, width: int) -> str:
    """One line a backend: its name, whether it lowers and proves here, what it is (cut to
    ``width``)."""
    from composer.registry.discovery import OWN_DISTRIBUTION

    rows = [("backend", "lowers here", "proves here", "what it is")]
    for each in backends:
        what = each.description
        if each.distribution != OWN_DISTRIBUTION:
            what = f"{what} ({each.distribution} {each.version})".lstrip()
        rows.append((each.name, _yes(each.lowers_here), _yes(each.proves_here), what))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    room = max(width - sum(widths) - 2 * len(widths), len(rows[0][3]))
    lines = []
    for *first, what in rows:
        if len(what) > room:
            what = what[: room - 3].rstrip() + "..."
        lines.append("  ".join([*(c.ljust(w) for c, w in zip(first, widths)), what]).rstrip())
    return "\n".join(lines)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _print_backend_details(registry, backends: list, width: int) -> None:
    """``composer backends NAME...``: what each is, why it does not lower or run here, and
    the options each takes."""
    import textwrap

    def say(text: str, indent: str = "") -> None:
        print(textwrap.fill(text, width, initial_indent=indent, subsequent_indent=indent + "  "))

    for each in backends:
        say(f"{each.name}  {each.description}".rstrip())
        say(f"ExecuTorch backend {each.backend_id} on {each.device}, from {each.distribution} "
            f"{each.version}", "  ")  # fmt: skip
        say(f"lowers here: {'yes' if each.lowers_here else f'no, {each.why_not_lower}'}", "  ")
        say(f"runs here: {f'yes, in {each.runs_in}' if each.runs_here else f'no, {each.why_not_run}'}",
            "  ")  # fmt: skip
    options = [("option", "values", "help")]
    takes_none = []
    for each in backends:
        declared = _options_of(registry, each.name)
        if declared["options_error"] is not None:
            options.append((each.name, "?", declared["options_error"]))
        elif not declared["options"]:
            takes_none.append(each.name)
        for option in declared["options"] or ():
            values = "|".join(option["choices"]) if option["choices"] else "any"
            if option["default"] is not None:
                values += f", default {option['default']}"
            options.append((f"{each.name}.{option['name']}", values, option["help"]))
    if len(options) > 1:
        print("options, each given as --option BACKEND.NAME=VALUE:")
        print(_table(options, width))
    if takes_none:
        print(f"no options: {', '.join(takes_none)}")


def _options_of(registry, name: str) -> dict:
    """The options backend ``name`` declares, as JSON would hold them, or why they are not
    known (one plugin's broken hook must not hide the others)."""
    try:
        declared = registry.options(registry.backends[name])
    except ComposerError as error:
        return {"options": None, "options_error": str(error)}
    return {
        "options": [
            {
                "name": option.name,
                "choices": list(option.choices) if option.choices else None,
                "default": option.default,
                "help": option.help,
            }
            for option in declared
        ],
        "options_error": None,
    }


def _plan(args: argparse.Namespace) -> int:
    import composer
    from composer.models.model_source import load_model
    from composer.registry.asking import telling
    from composer.report.plan_text import summary_table

    stack = _stack(args)
    model, inputs = load_model(args.model, args.dynamic)
    # A plugin slow to answer is named on stderr; stdout holds the plan alone.
    with telling(lambda line: print(line, file=sys.stderr, flush=True)):
        plan = composer.plan(model, stack, inputs, cache=not args.no_cache)
    print(plan.to_json() if args.json else summary_table(plan))
    return 0


def _lower(args: argparse.Namespace) -> int:
    import composer
    from composer.lower.atomic import FORCE_FLAG, check_outputs, output_kinds
    from composer.models.model_source import load_model
    from composer.report.plan_text import summary_table

    report = Path(args.report) if args.report else None
    if report is not None and report.suffix not in REPORT_SUFFIXES:
        raise ComposerError(f"--report must end in .json or .html, not {report.name!r}.")
    output = Path(args.output)
    outputs = [output] if report is None else [output, report]
    # Minutes of lowering must not end in "cannot write", nor write over what the user owns:
    # every path is checked first.
    check_outputs(output_kinds(output, outputs), _input_files(args), force=args.force,
                  remedy=FORCE_FLAG)  # fmt: skip
    samples = _proof_inputs(args)
    _use_runtime(args)
    stack = _stack(args)
    model, inputs = load_model(args.model, args.dynamic)
    started = time.perf_counter()

    def progress(line: str) -> None:
        terminal.interrupts.check()
        if not args.quiet:
            # One write, its newline in it: print() writes the newline apart, and a Ctrl-C
            # between the two put "composer: interrupted" at the end of this line.
            sys.stderr.write(f"[{time.perf_counter() - started:6.1f}s] {line}\n")
            sys.stderr.flush()

    if args.methods:
        return _lower_methods(args, stack, (model, inputs), progress, output, report)
    if args.quantize:
        model = composer.quantize(
            model, stack, inputs, calibration=_calibration(inputs, args.quantize),
            progress=progress,
        )  # fmt: skip
    composition = composer.compose(
        model, stack, inputs, progress=progress, jobs=args.jobs, cache=not args.no_cache,
        check=not args.no_check, proof_inputs=samples,
    )  # fmt: skip
    extra = {}
    if report is not None:
        extra[report] = _render_report(composition.plan, report, args.model).encode()
    _write(composition, output, extra, summary_table(composition.plan, verbose=args.verbose),
           args.force)  # fmt: skip
    if args.verify:
        result = composition.verify()
        print(f"verify: {result}")
        if not result.ok:
            return 1
    if args.beside_plain:
        print(_beside_plain(composition, model, inputs, stack))
    if args.bench:
        _print_stack_latencies(composition, model, inputs, stack, args.bench)
    return 0


def _beside_plain(composition, model, inputs, stack) -> str:
    import torch

    from composer.pipeline.plain import beside_plain
    from composer.registry.resolved import resolve_stack

    program = model
    if not isinstance(model, torch.export.ExportedProgram):
        program = torch.export.export(model.eval(), tuple(inputs))
    return beside_plain(
        composition, program, resolve_stack(stack, must_lower_here=False)
    ).describe()


def _input_files(args: argparse.Namespace) -> list[Path]:
    """The files ``lower`` reads: its models (``--method NAME=MODEL`` too, a factory's module
    source) and its config (named, or found here)."""
    from composer.config import find_config
    from composer.models.source_files import source_files

    models = [args.model, *(text.partition("=")[2] for text in args.methods)]
    config = Path(args.config) if args.config else find_config(Path())
    samples = [Path(args.proof_inputs)] if args.proof_inputs else []
    return [*source_files(models), *([config] if config and config.is_file() else []), *samples]


def _proof_inputs(args: argparse.Namespace) -> list[tuple] | None:
    """``--proof-inputs FILE``: the samples torch.save wrote there, a list of input tuples, or
    one line saying why not (before the model is loaded)."""
    if not args.proof_inputs:
        return None
    import torch
    import torch.utils._pytree as pytree

    from composer.contract.errors import first_line

    path = Path(args.proof_inputs)
    if args.methods:
        raise ComposerError(
            "--proof-inputs goes with one method: lower each --method alone to prove it on "
            "your samples."
        )
    if not path.is_file():
        raise ComposerError(f"--proof-inputs: no such file: {path}")
    try:
        value = torch.load(path, weights_only=True)
    except Exception as error:  # any file torch cannot load is the same mistake
        raise ComposerError(
            f"--proof-inputs {path} is not a file torch.save wrote ({first_line(error)[:120]}); "
            f"{_SAVE_SAMPLES}"
        ) from error
    if not isinstance(value, list | tuple) or not value:
        held = "an empty list" if isinstance(value, list | tuple) else type(value).__name__
        raise ComposerError(f"--proof-inputs {path} holds {held}; {_SAVE_SAMPLES}")
    for index, sample in enumerate(value, 1):
        if not isinstance(sample, list | tuple):
            raise ComposerError(
                f"--proof-inputs {path}: proof input {index} is a {type(sample).__name__}, not a "
                f"tuple of the model's inputs; {_SAVE_SAMPLES}"
            )
        others = {type(leaf).__name__ for leaf in pytree.tree_leaves(sample)
                  if not isinstance(leaf, torch.Tensor)}  # fmt: skip
        if others:
            raise ComposerError(
                f"--proof-inputs {path}: proof input {index} holds {', '.join(sorted(others))}, "
                f"not only tensors; {_SAVE_SAMPLES}"
            )
    return [tuple(sample) for sample in value]


_SAVE_SAMPLES = (
    "it must hold a list of input tuples, each as the model is called: "
    "torch.save([(x1,), (x2,)], FILE)"
)


def _write(composition, output: Path, extra: dict, table: str, force: bool) -> None:
    """Write the program and ``extra`` files (all or none, unless Ctrl-C came first), then print
    ``table`` and what was written."""
    terminal.interrupts.check()
    composition.save(output, extra=extra, force=force)
    terminal.interrupts.written = [output, *extra]
    print(table)
    written = ", ".join(str(p) for p in [output, *extra])
    print(f"wrote {written} ({len(composition.buffer):,} bytes of program)")


def _lower_methods(args, stack, forward, progress, output: Path, report: Path | None) -> int:
    """``composer lower MODEL --method NAME=MODEL ...``: one program of several methods, MODEL
    the method ``forward``."""
    from torch.export import ExportedProgram

    import composer
    from composer.models.model_source import load_model
    from composer.report.plan_text import methods_summary_table

    if args.bench or args.quantize:
        raise ComposerError(
            "with --method, --bench and --quantize are not available; compose the methods one "
            "at a time for those."
        )
    methods = {"forward": forward}
    for text in args.methods:
        name, _, source = text.partition("=")
        if not name or not source or name in methods:
            raise ComposerError(
                f"--method takes NAME=MODEL with a new name (forward is MODEL), not {text!r}."
            )
        methods[name] = load_model(source, args.dynamic)
    entries = {
        name: model if isinstance(model, ExportedProgram) else (model, inputs)
        for name, (model, inputs) in methods.items()
    }
    composition = composer.compose(
        entries, stack, progress=progress, cache=not args.no_cache, check=not args.no_check
    )
    extra = {}
    if report is not None:
        extra[report] = _render_methods_report(composition, report, args.model).encode()
    table = methods_summary_table(composition.plans, composition.constant_methods)
    _write(composition, output, extra, table, args.force)
    if args.verify:
        results = {name: composition.verify(name) for name in composition.methods}
        for name, result in results.items():
            print(f"verify {name}: {result}")
        if not all(result.ok for result in results.values()):
            return 1
    return 0


def _calibration(inputs, batches: int) -> list[tuple]:
    """What the command line has to calibrate with: random batches like the example inputs."""
    from composer.run.inputs import calibration_batches

    return calibration_batches(inputs, batches)


def _print_stack_latencies(composition, model, inputs, stack, runs: int) -> None:
    import composer
    from composer.measure.singles import compare_with_singles
    from composer.report.latency_table import latency_table

    def compose_single(name: str):
        return composer.compose(model, stack.only([name]), inputs)

    from composer.run import cpu_threads

    print(f"latency, {runs} or more calls each (interleaved with eager, until the fastest "
          f"calls agree), in the ExecuTorch runtime, XNNPACK on {cpu_threads.current()} "
          "thread(s):", flush=True)  # fmt: skip
    rows, notes = compare_with_singles(composition, compose_single, runs)
    print(latency_table(rows))
    for note in notes:
        print(note)


def _render_report(plan, path: Path, title: str) -> str:
    if path.suffix == ".json":
        return plan.to_json()
    from composer.report.html import render_html

    return render_html(plan, title=f"composer plan: {title}")


def _render_methods_report(composition, path: Path, title: str) -> str:
    if path.suffix == ".json":
        return composition.to_json()
    from composer.report.html import render_methods_html

    return render_methods_html(
        composition.plans, composition.constant_methods, title=f"composer program: {title}"
    )


def _run(args: argparse.Namespace) -> int:
    from composer.run import cpp_runtime
    from composer.run.inputs import flat_inputs
    from composer.run.runtime import check_program_file

    program = Path(args.program)
    if not program.is_file():
        raise ComposerError(f"no such file: {program}")
    buffer = program.read_bytes()
    check_program_file(buffer, str(program), args.method)
    _check_saved_outputs(args)
    model, inputs = _model_and_inputs(args, buffer)
    if args.threads is not None:
        from composer.run import cpu_threads

        cpu_threads.set_threads(args.threads)
    # The method takes the leaves of nested inputs, as torch.export flattened them; eager
    # takes them as they are.
    flat = flat_inputs(inputs)
    runner = cpp_runtime.runner_path()
    data_paths = sorted(program.parent.glob("*.ptd"))
    agent = _use_runtime(args)
    if agent is not None:
        return _run_on_agent(args, agent, buffer, data_paths, flat, model, inputs)
    loaded, outputs = _run_program(args, runner, buffer, data_paths, flat)
    for index, output in enumerate(outputs):
        print(
            f"output {index}: shape {list(output.shape)} {str(output.dtype).removeprefix('torch.')}"
        )
    _save_outputs(args, outputs)
    eager = None if model is None else _eager_module(model)
    if args.bench and loaded is not None:
        _print_program_latency(buffer, loaded, eager, inputs, args.bench)
    elif args.bench:
        _print_runner_latency(
            runner, program, data_paths, flat, args.bench, args.threads, args.method
        )
    if eager is None:
        return 0
    return _compare_with_eager(args.compare, buffer, eager, inputs, outputs)


def _use_runtime(args: argparse.Namespace):
    """The agent ``--runtime`` names, in use for this command (asked what it runs at once: an
    agent that cannot be reached fails before any work); None without ``--runtime``."""
    if not args.runtime:
        return None
    from composer.run import remote

    token = None
    if args.runtime_token_file:
        try:
            token = Path(args.runtime_token_file).read_text().strip()
        except OSError as error:
            raise ComposerError(
                f"cannot read --runtime-token-file {args.runtime_token_file}: {error.strerror}."
            ) from error
    if getattr(args, "bench", None) and args.command == "lower":
        raise ComposerError("--bench with --runtime: write the program, then time it there "
                            "with `composer run FILE.pte --runtime HOST:PORT --bench`.")  # fmt: skip
    agent = remote.RemoteRuntime(args.runtime, token, args.runtime_timeout)
    agent.hello()
    remote.use(agent)
    return agent


def _run_on_agent(args, agent, buffer: bytes, data_paths: list[Path], flat, model, inputs) -> int:
    """``composer run --runtime``: the program run (and timed) on the agent, compared here."""
    import statistics

    data_files = {p.name: p.read_bytes() for p in data_paths}
    there, why, ran_in = agent.can_run(buffer)
    if not there:
        raise ComposerError(f"{why}: run it where its backends are.")
    outputs = agent.run_program(buffer, data_files, flat, args.method)
    print(f"executor: {agent.executor(ran_in)}")
    for index, output in enumerate(outputs):
        print(f"output {index}: shape {list(output.shape)} "
              f"{str(output.dtype).removeprefix('torch.')}")  # fmt: skip
    _save_outputs(args, outputs)
    if args.bench:
        executor, seconds = agent.time_program(buffer, data_files, flat, args.bench, args.method)
        us = sorted(s * 1e6 for s in seconds)
        print(f"latency on the {executor}, {len(us)} calls after warm-up (timed there, without "
              f"the network): fastest {us[0]:.1f} us, median {statistics.median(us):.1f} us, "
              f"p90 {us[min(len(us) - 1, int(0.9 * len(us)))]:.1f} us")  # fmt: skip
    if model is None:
        return 0
    return _compare_with_eager(args.compare, buffer, _eager_module(model), inputs, outputs)


def _agent(args: argparse.Namespace) -> int:
    from composer.run.agent import DEFAULT_MAX_BYTES, serve

    max_bytes = DEFAULT_MAX_BYTES if args.max_bytes is None else args.max_bytes
    return serve(args.host, args.port, args.token_file, max_bytes)


def _check_saved_outputs(args: argparse.Namespace) -> None:
    """Refuse ``--save-outputs`` before the run where it would write over a file that is not
    outputs composer saved (unless ``--force``), or over what the run reads."""
    if not args.save_outputs:
        return
    from composer.lower.atomic import FORCE_FLAG, check_outputs
    from composer.models.source_files import source_files

    reads = [Path(args.program)] + ([Path(args.inputs)] if args.inputs else [])
    reads += source_files([args.compare]) if args.compare else []
    check_outputs([(Path(args.save_outputs), "outputs")], reads, force=args.force,
                  remedy=FORCE_FLAG)  # fmt: skip


def _save_outputs(args: argparse.Namespace, outputs: list) -> None:
    """``--save-outputs FILE``: the outputs as torch.save writes a list of tensors, marked as
    composer's (a later run may replace them; nothing else is replaced without --force)."""
    if not args.save_outputs:
        return
    import io

    import torch

    from composer.lower.atomic import marked_outputs, write_all

    saved = io.BytesIO()
    torch.save(list(outputs), saved)
    write_all({Path(args.save_outputs): marked_outputs(saved.getvalue())})
    print(f"outputs saved to {args.save_outputs}: a list of {len(outputs)} tensor(s), for "
          "torch.load")  # fmt: skip


def _model_and_inputs(args: argparse.Namespace, buffer: bytes) -> tuple:
    """``run``'s model to compare with (None without ``--compare``) and the inputs to run on:
    ``--inputs`` if given, else the model's example inputs, else inputs made from the
    program's signature (said on stderr)."""
    from composer.models.model_source import load_model

    model = inputs = None
    if args.compare:
        model, inputs = load_model(args.compare)
        inputs = inputs if inputs is not None else _saved_example_inputs(model)
    if args.inputs:
        inputs = _load_inputs(Path(args.inputs))
    if inputs is None and args.compare:
        raise ComposerError(f"{args.compare} holds no example inputs: pass --inputs FILE (a "
                            "tuple of tensors saved with torch.save).")  # fmt: skip
    if inputs is None:
        from composer.run.inputs import signature_inputs

        made, signature = signature_inputs(buffer, args.method)
        drawn = ["random normal (seed 0)"] if any(t.is_floating_point() for t in made) else []
        drawn += ["zeros for integers and bools"] if any(
            not t.is_floating_point() for t in made) else []  # fmt: skip
        print(f"no --inputs: made inputs from the program's signature: {signature}"
              + "".join(f"; {words}" for words in drawn), file=sys.stderr)  # fmt: skip
        inputs = tuple(made)
    return model, inputs


def _run_program(args, runner, buffer: bytes, data_paths: list[Path], flat: list) -> tuple:
    """Run ``buffer`` once and say which executor ran it: (the loaded program, or None where
    the C++ runner ran it, the outputs)."""
    from composer.run import cpp_runtime
    from composer.run.runtime import RUNTIME, LoadedProgram, runtime_can_run

    if runner is not None and not runtime_can_run(buffer)[0]:
        # A program the pip runtime cannot run (CUDA delegates): ExecuTorch's own C++ runtime.
        data_files = {p.name: p.read_bytes() for p in data_paths}
        outputs = cpp_runtime.run_program(
            runner, buffer, data_files, flat, args.threads, method=args.method
        )
        print(f"executor: {cpp_runtime.EXECUTOR} ({runner})")
        return None, outputs
    loaded = LoadedProgram(buffer, args.method)
    loaded.check_inputs(flat)
    outputs = loaded.run(flat)
    print(f"executor: {RUNTIME} (the pip wheel's, through its Python bindings)")
    return loaded, outputs


def _eager_module(model):
    """The eager model to compare with: a .pt2's program runs as its ``module()``."""
    import torch

    from composer.lower.export import export_model

    return model if isinstance(model, torch.nn.Module) else export_model(model, None).module()


def _compare_with_eager(compare: str, buffer: bytes, eager, inputs, outputs) -> int:
    """Print how the program's ``outputs`` compare with ``eager``'s (``compare`` names it); 1
    where they do not match."""
    import torch

    from composer.run.accuracy import eager_in_precision, holds_nonfinite, judge, truth
    from composer.run.runtime import installed_tolerance

    with torch.no_grad():
        expected = eager(*inputs)
    tolerance = installed_tolerance(buffer)
    precision = tolerance.precision if tolerance is not None else None
    # a backend computing in bf16 by design is held to eager in bf16
    expected, eager_in = eager_in_precision(eager, inputs, expected, precision)
    reference, truth_name = truth(eager, inputs)
    verdict = judge(outputs, expected, reference, steps=tolerance.steps if tolerance else 0,
                    truth_name=truth_name, eager_in=eager_in,
                    inputs_nonfinite=holds_nonfinite(inputs))  # fmt: skip
    # every output NaN in fp64 too is no match: nothing was held to anything
    ok = verdict.ok and not verdict.nothing_compared
    if verdict.nothing_compared:
        said = f"NOT PROVEN, {verdict.describe()}"
    elif ok:
        said = f"OK, matches eager: {verdict.describe()}{_close_to_eager(verdict)}"
    else:
        said = f"MISMATCH, does NOT match eager: {verdict.describe()}"
    print(f"compare with {compare}: {said}")
    return 0 if ok else 1


def _close_to_eager(verdict) -> str:
    """Why a match past its allowed error matches: it is within the proof's tolerance of eager
    itself (two fp32 programs summing in another order), which the rule accepts first."""
    from composer.run.accuracy import TOL

    worst = verdict.worst()
    if worst is None or worst.program_error is None or worst.share <= 1:
        return ""
    return f" (within {TOL:g} of eager itself, which the rule accepts first)"


def _print_runner_latency(
    runner, program, data_paths, inputs, runs: int, threads, method: str
) -> None:
    """Latency of ``program`` in ExecuTorch's C++ runtime: ``runs`` calls after 10, timed in
    the runner around each call and a device synchronization, in one loaded program."""
    import statistics

    from composer.run import cpp_runtime

    try:
        _, seconds = cpp_runtime.run_pte(
            runner, program, data_paths, inputs, repeats=runs, warmup=10, threads=threads,
            method=method,
        )  # fmt: skip
    except cpp_runtime.RunnerError as error:
        raise ComposerError(f"{cpp_runtime.EXECUTOR} ({runner}) failed: {error}") from error
    us = sorted(s * 1e6 for s in seconds)
    print(f"latency in the {cpp_runtime.EXECUTOR}, {len(us)} calls after 10 (inputs and outputs "
          "on the CPU; CUDA's memory pool as ExecuTorch leaves it): fastest "
          f"{us[0]:.1f} us, median {statistics.median(us):.1f} us, "
          f"p90 {us[min(len(us) - 1, int(0.9 * len(us)))]:.1f} us")  # fmt: skip


def _print_program_latency(buffer: bytes, loaded, eager, inputs, runs: int) -> None:
    import torch

    from composer.measure.etdump import delegate_backend_ids, delegate_times
    from composer.measure.latency import interleaved
    from composer.measure.singles import ProgramLatency
    from composer.report.latency_table import latency_table
    from composer.run.inputs import flat_inputs

    candidates = {"program": loaded.timed_call(flat_inputs(inputs))}
    if eager is not None:
        candidates["eager"] = lambda: eager(*inputs)
    with torch.no_grad():
        timed = interleaved(candidates, runs)
    from composer.run import cpu_threads

    print(
        f"latency, {runs} or more calls after warm-up, XNNPACK on {cpu_threads.current()} "
        "thread(s)" + (", interleaved with eager:" if eager else ":")
    )
    calls = len(delegate_backend_ids(buffer, loaded.method_name))
    rows = [ProgramLatency(name, None if name == "eager" else calls, latency)
            for name, latency in timed.items()]  # fmt: skip
    print(latency_table(rows))
    per_delegate = delegate_times(buffer, flat_inputs(inputs), runs, loaded.method_name)
    if not per_delegate:
        print("time per delegate: not available (the event tracer's delegate calls could not be "
              "matched with the program's: a method with control flow)")  # fmt: skip
        return
    print("time per delegate call (ExecuTorch event tracer, ETDump):")
    for item in per_delegate:
        print(f"  delegate {item.index} ({item.backend_id}): median {item.latency.median_us:.1f} us, "
              f"p90 {item.latency.p90_us:.1f} us")  # fmt: skip


def _saved_example_inputs(model) -> tuple | None:
    """The positional example inputs torch.export.save kept in a .pt2, if it kept them."""
    saved = getattr(model, "example_inputs", None)
    return tuple(saved[0]) if saved and not saved[1] else None


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
    from composer.models.model_source import load_model

    stack = _stack(args)
    model, inputs = load_model(args.model, args.dynamic)
    plan = composer.plan(model, stack, inputs, cache=not args.no_cache)
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


def _conformance(args: argparse.Namespace) -> int:
    from composer.conformance import command

    stacks = [command.parse_stack(text) for text in args.stacks]
    return command.run(
        stacks, args.report_dir, models=args.models, keyword=args.keyword, jobs=args.jobs
    )


def _cache(args: argparse.Namespace) -> int:
    from composer.lower import cache

    if args.action == "clear":
        print(f"cleared {cache.clear()}")
    else:
        print(cache.info())
    return 0


def _table(rows: list[tuple[str, ...]], width: int | None = None) -> str:
    from tabulate import tabulate

    limits = terminal.column_limits(rows, width or terminal.width())
    return tabulate(rows[1:], headers=rows[0], tablefmt="plain", disable_numparse=True,
                    maxcolwidths=limits, maxheadercolwidths=limits)  # fmt: skip


def _add_stack_arguments(parser: argparse.ArgumentParser) -> None:
    from composer.registry.stack import PLACEMENTS

    parser.add_argument("model", type=_model, help=MODEL_HELP)
    parser.add_argument(
        "--backends", help="priority list, e.g. tensorrt_stub,xnnpack (default: the config's)"
    )
    parser.add_argument(
        "--dynamic", action="append", default=[], metavar="INPUT:DIM=MIN..MAX",
        help="export with this dim dynamic, e.g. 0:1=2..128 (repeatable); the program is "
        "proven at the example, MIN, MAX and a size between",
    )  # fmt: skip
    parser.add_argument(
        "--option", action="append", default=[], metavar="BACKEND.NAME=VALUE",
        help="a backend option, e.g. cuda.max_autotune=OFF (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--config", type=_path,
        help="composer.toml or pyproject.toml (default: the one in this directory)",
    )  # fmt: skip
    parser.add_argument(
        "--placement", choices=PLACEMENTS,
        help="priority (default): first backend that can take an op, except a host island "
        "between accelerator partitions, which joins the accelerator; strict: no exception; "
        "measured: compose the orders and each backend alone, time them here, keep the fastest",
    )  # fmt: skip
    parser.add_argument(
        "--tune-budget", type=_amount, metavar="SECONDS",
        help="with --placement measured: stop composing new candidates after this long (the "
        "declared order and each backend alone are composed first, always)",
    )  # fmt: skip
    parser.add_argument(
        "--repair-time", type=_amount, metavar="TIMES",
        help="how long repairs may search for a program that runs and is right, in multiples "
        "of the first compose, counted as at least 10 s (default 3); then composer stops, says "
        "why, and writes nothing",
    )  # fmt: skip
    _add_threads_argument(parser)
    parser.add_argument(
        "--no-cache", action="store_true",
        help="neither read nor write composer's cache (composed programs, lowered partitions, "
        "measured placements): lower and measure again",
    )  # fmt: skip
    parser.add_argument(
        "--no-consolidate", action="store_true", help="the same as --placement strict",
    )  # fmt: skip


def _add_threads_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--threads", type=_threads, metavar="N",
        help="the ExecuTorch runtime's threads for XNNPACK in this run (default: the config's, "
        "else one per core); measured placement times with them",
    )  # fmt: skip


def _sweep(args: argparse.Namespace) -> int:
    from composer.fleet import sweep

    summary = sweep(
        args.models, args.stacks, results=args.results, html=args.html, golden=args.golden,
        update_golden=args.update_golden, resume=args.resume, workers=args.workers,
        ray=args.ray, bench=args.bench or 0, device_resource=args.device_resource,
        placement=args.placement, progress=None if args.quiet else lambda line: print(line, flush=True),
        force=args.force,
    )  # fmt: skip
    print(summary.describe())
    print(f"results: {args.results}" + (f", table: {args.html}" if args.html else ""))
    return 0 if summary.ok else 1


def _count(text: str) -> int:
    """A flag's whole number >= 1 (--threads, --jobs, --bench, --quantize)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, not {text!r}")
    return value


def _amount(text: str) -> float:
    """A flag's finite number >= 0 (--tune-budget, --repair-time)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number >= 0, not {text!r}")
    return value


def _threads(text: str) -> int:
    """--threads: a count the runtime's threadpool can make (it starts one thread each)."""
    from composer.registry.names import MAX_THREADS

    value = _count(text)
    if value > MAX_THREADS:
        raise argparse.ArgumentTypeError(
            f"must be a whole number from 1 to {MAX_THREADS}, not {text!r}"
        )
    return value


def _path(text: str) -> str:
    """A file or folder argument: refused where this system cannot name it (too long)."""
    if environment.too_long(text):
        raise argparse.ArgumentTypeError(
            f"{environment.shortened(text)!r} is longer than this system allows for a path or "
            "one of its names: name a shorter path"
        )
    return text


def _model(text: str) -> str:
    """A model argument: a path (``.pt2``, a manifest) is checked as one; zoo:NAME is not."""
    return _path(text) if text.endswith((".pt2", ".txt")) or "/" in text else text


def _file_to_write(example: str):
    """An output file argument: a path ending in a separator names a folder, not the file
    (git and cargo refuse it alike rather than guess a name)."""

    def checked(text: str) -> str:
        if text.endswith(("/", os.sep)):
            raise argparse.ArgumentTypeError(
                f"{text!r} ends in a separator, so it names a folder: name the file to write "
                f"in it, e.g. {text}{example}"
            )
        return _path(text)

    return checked


class _Parser(argparse.ArgumentParser):
    """argparse's errors as composer's: one line, exit 2 (``--help`` shows the usage), with the
    nearest option or choice to a misspelt one."""

    def error(self, message: str):
        choice = _INVALID_CHOICE.search(message)
        if choice is not None:
            near = did_you_mean(choice["given"], _QUOTED.findall(choice["choices"]))
            message += f"; {near.strip()}" if near else ""
        self.exit(USER_ERROR, f"composer: error: {message} (see {self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            # The command's own options: argparse hands its leftovers up to this parser.
            command = self._commands().get(getattr(parsed, "command", None), self)
            flags = [flag for action in command._actions for flag in action.option_strings]
            misspelt = [each.partition("=")[0] for each in unknown if each.startswith("-")]
            near = next(filter(None, (did_you_mean(flag, flags) for flag in misspelt)), "")
            hint = f"; {near.strip()}" if near else ""
            command.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
        return parsed

    def _commands(self) -> dict[str, argparse.ArgumentParser]:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}


# argparse's words for a value not among an argument's choices (Python 3.11 to 3.13).
_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<given>[^']*)' \(choose from (?P<choices>.*)\)")
_QUOTED = re.compile(r"'([^']*)'")


class _Version(argparse.Action):
    """``--version``: the versions installed, read from package metadata (no torch import)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        from importlib.metadata import PackageNotFoundError, version

        def installed(distribution: str) -> str:
            try:
                return version(distribution)
            except PackageNotFoundError:
                return "not installed"

        print(f"composer {installed('executorch-composer')} (executorch "
              f"{installed('executorch')}, torch {installed('torch')})")  # fmt: skip
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="composer", description="Compose several ExecuTorch backends into one .pte."
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parser.add_argument(
        "--version", action=_Version, nargs=0, help="print composer's, ExecuTorch's and torch's versions"
    )  # fmt: skip
    commands = parser.add_subparsers(dest="command", required=True)
    # The order here is the order ``composer --help`` lists the commands in.
    for add_command in (
        _add_backends_command, _add_plan_command, _add_lower_command, _add_run_command,
        _add_cache_command, _add_sweep_command, _add_explain_command, _add_conformance_command,
        _add_agent_command,
    ):  # fmt: skip
        add_command(commands)
    return parser


def _add_backends_command(commands) -> None:
    backends = commands.add_parser(
        "backends", help="the backends installed: what each is, whether it lowers and proves here"
    )
    backends.add_argument(
        "names", nargs="*", metavar="NAME",
        help="say for these backends why they do not lower or run here, and their options",
    )  # fmt: skip
    backends.add_argument(
        "--json", action="store_true",
        help="print a JSON list, an object a backend: what it is, whether and where it lowers, "
        "runs and proves here (and why not), its options",
    )  # fmt: skip
    backends.add_argument(
        "--ray-resources", action="store_true",
        help="print this machine's Ray resources for `ray start --resources`: runtime:NAME for "
        "each backend it proves, so that sweeps send it the jobs that need them",
    )  # fmt: skip
    backends.set_defaults(run=_backends)


def _add_plan_command(commands) -> None:
    plan = commands.add_parser("plan", help="which backend takes which op; lowers nothing")
    _add_stack_arguments(plan)
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.set_defaults(run=_plan)


def _add_lower_command(commands) -> None:
    lower = commands.add_parser("lower", help="lower to a .pte with the backend stack")
    _add_stack_arguments(lower)
    lower.add_argument("-o", "--output", required=True, type=_file_to_write("model.pte"),
                       help="the .pte to write")  # fmt: skip
    lower.add_argument("--report", type=_file_to_write("plan.html"),
                       help="also write the plan: out.html (a picture) or out.json")  # fmt: skip
    lower.add_argument(
        "--force", action="store_true",
        help="replace an existing -o or --report file that is not composer's own output of "
        "that kind (by default such a file is refused: it may be a source, a config, notes)",
    )  # fmt: skip
    lower.add_argument("--verify", action="store_true", help="run it and compare with eager")
    lower.add_argument(
        "--proof-inputs", type=_path, metavar="FILE",
        help="a few of your own inputs to prove the program on too, beside the example and "
        "its sizes: a list of input tuples saved with torch.save, e.g. "
        "torch.save([(x1,), (x2,)], FILE); the proof line names them",
    )  # fmt: skip
    lower.add_argument(
        "--no-check", action="store_true",
        help="write the program without running it first (by default it is run once on the "
        "example inputs against eager where a runtime here has every delegate's backend, and a "
        "partition that fails is moved to the next backend)",
    )  # fmt: skip
    lower.add_argument("--quiet", action="store_true", help="no progress lines")
    lower.add_argument(
        "--verbose", action="store_true",
        help="the whole plan: every fallback and why, and a measured placement's every "
        "candidate, partition and region (by default: its choice, stated once)",
    )  # fmt: skip
    lower.add_argument(
        "--beside-plain", action="store_true",
        help="also lower it as plain ExecuTorch does (the backends' own partitioners in one "
        "to_edge_transform_and_lower) and run that program at the sizes composer's was proven "
        "at: does composer's differ?",
    )  # fmt: skip
    lower.add_argument(
        "--method", dest="methods", action="append", default=[], metavar="NAME=MODEL",
        help="another method of the program, e.g. decode=zoo:mlp (repeatable); MODEL is the "
        "method forward",
    )  # fmt: skip
    lower.add_argument(
        "--quantize", type=_count, nargs="?", const=8, metavar="N",
        help="quantize for the stack first: each backend's nodes with its own quantizer "
        "(XNNPACK: int8), the others float; calibrated on N random batches (default 8)",
    )  # fmt: skip
    lower.add_argument(
        "--bench", type=_count, nargs="?", const=200, metavar="N",
        help="time the program against eager and each backend alone (N runs, default 200)",
    )  # fmt: skip
    lower.add_argument(
        "--jobs", type=_count, metavar="N",
        help="lower partitions in N processes where the backend lowers each on its own "
        "(default 1)",
    )  # fmt: skip
    _add_runtime_arguments(lower)
    lower.set_defaults(run=_lower)


def _add_run_command(commands) -> None:
    run = commands.add_parser("run", help="run a .pte in the ExecuTorch runtime")
    run.add_argument("program", type=_path, help="the .pte")
    run.add_argument("--inputs", type=_path, help="a tuple of tensors saved with torch.save "
                     "(default: the --compare model's example inputs, else inputs made from the "
                     "program's signature)")  # fmt: skip
    run.add_argument("--method", default="forward", help="the method to run (default: forward)")
    run.add_argument("--compare", type=_model, metavar="MODEL",
                     help="judge the outputs against this model in fp64, by the proof's rule")  # fmt: skip
    run.add_argument("--save-outputs", type=_path, metavar="FILE",
                     help="write the outputs with torch.save (a list of tensors)")  # fmt: skip
    run.add_argument("--force", action="store_true",
                     help="let --save-outputs replace a file composer did not write")  # fmt: skip
    run.add_argument(
        "--bench", type=_count, nargs="?", const=200, metavar="N",
        help="fastest, median and p90 latency over N or more calls after warm-up (default 200), "
        "per delegate too",
    )  # fmt: skip
    _add_threads_argument(run)
    _add_runtime_arguments(run)
    run.set_defaults(run=_run)


def _add_runtime_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runtime", metavar="HOST:PORT",
        help="run the program on the machine where `composer agent` serves this address: the "
        "proof, --verify and --bench run there",
    )  # fmt: skip
    parser.add_argument(
        "--runtime-token-file", metavar="FILE",
        help="the agent's token (default: $COMPOSER_RUNTIME_TOKEN)",
    )  # fmt: skip
    parser.add_argument(
        "--runtime-timeout", type=_amount, metavar="SECONDS",
        help="give up on an agent that has not answered a request after this long "
        "(default: $COMPOSER_RUNTIME_TIMEOUT, else 600)",
    )  # fmt: skip


def _add_agent_command(commands) -> None:
    # `composer --help` imports no torch: the agent's module (and its default) load only
    # when the agent runs.
    agent = commands.add_parser(
        "agent", help="serve this machine's ExecuTorch runtimes to composer elsewhere (--runtime)"
    )
    agent.add_argument("--port", type=int, required=True,
                       help="the TCP port to listen on (0: a free one, printed)")  # fmt: skip
    agent.add_argument("--host", default="127.0.0.1",
                       help="the address to listen on (default 127.0.0.1: this machine only)")  # fmt: skip
    agent.add_argument("--token-file", metavar="FILE",
                       help="the token clients must present: read from FILE, or made and written "
                       "there (mode 0600) where it does not exist (default: made and printed)")  # fmt: skip
    agent.add_argument("--max-bytes", type=_count, default=None, metavar="N",
                       help="refuse a request larger than N bytes (default 512 MiB)")  # fmt: skip
    agent.set_defaults(run=_agent)


def _add_cache_command(commands) -> None:
    cache = commands.add_parser("cache", help="what composer keeps between runs")
    cache.add_argument("action", choices=("info", "clear"))
    cache.set_defaults(run=_cache)


def _add_sweep_command(commands) -> None:
    from composer.registry.stack import PLACEMENTS  # as _add_stack_arguments: light to import

    sweep = commands.add_parser(
        "sweep", help="compose many models with many stacks: local processes or a Ray cluster"
    )
    sweep.add_argument("models", nargs="+", type=_model, help="zoo:NAME, model.pt2, module:function, or a "
                       "manifest.txt naming one a line")  # fmt: skip
    sweep.add_argument("--stacks", nargs="+", required=True, metavar="A,B",
                       help="the stacks, each backends in priority order")  # fmt: skip
    sweep.add_argument("--results", default="sweep.jsonl", type=_file_to_write("sweep.jsonl"),
                       help="one JSON record a job (default sweep.jsonl)")  # fmt: skip
    sweep.add_argument("--html", type=_file_to_write("sweep.html"),
                       help="also write the table of results as HTML")  # fmt: skip
    sweep.add_argument("--golden", type=_path, metavar="DIR",
                       help="compare each plan with DIR/<job>.json")  # fmt: skip
    sweep.add_argument("--update-golden", action="store_true", help="write the golden plans")
    sweep.add_argument("--resume", action="store_true",
                       help="skip the jobs the results file already holds")  # fmt: skip
    sweep.add_argument("--workers", type=int, metavar="N", help="local processes (default: "
                       "half the cores)")  # fmt: skip
    sweep.add_argument("--ray", metavar="auto|ADDRESS",
                       help="run the jobs as Ray tasks on this cluster (pip install ray)")  # fmt: skip
    sweep.add_argument("--device-resource", metavar="NAME",
                       help="with --ray: a custom resource every job asks for (device:h100)")  # fmt: skip
    sweep.add_argument("--bench", type=int, nargs="?", const=200, metavar="N",
                       help="time each program (N calls, default 200)")  # fmt: skip
    sweep.add_argument("--placement", choices=PLACEMENTS, default="priority",
                       help="each job's placement; measured: its candidates are composed and "
                       "timed where the job runs (with --device-resource, on that device)")  # fmt: skip
    sweep.add_argument("--quiet", action="store_true", help="no line per job")
    sweep.add_argument("--force", action="store_true",
                       help="replace an existing --results, --html or golden file that is not "
                       "composer's own output of that kind (by default it is refused)")  # fmt: skip
    sweep.set_defaults(run=_sweep)


def _add_explain_command(commands) -> None:
    explain = commands.add_parser("explain", help="why a node went where it went")
    _add_stack_arguments(explain)
    which = explain.add_mutually_exclusive_group(required=True)
    which.add_argument("--node", help="a node name from the plan")
    which.add_argument("--op", help="every node of this op, e.g. aten.cumsum.default")
    explain.set_defaults(run=_explain)


def _add_conformance_command(commands) -> None:
    conformance = commands.add_parser(
        "conformance", help="ExecuTorch's backend test suite through composer, beside plain"
    )
    conformance.add_argument(
        "--stack", dest="stacks", action="append", default=[], metavar="A,B",
        help="a stack to test, backends in priority order (repeatable; default: each backend "
        "that runs here, alone and before xnnpack)",
    )  # fmt: skip
    conformance.add_argument("--models", action="store_true", help="the model tests too")
    conformance.add_argument("-k", dest="keyword", help="pytest -k: which tests (conv2d or linear)")
    conformance.add_argument("--report-dir", default="conformance", type=_path, help="where the suite's "
                             "JSON and CSV reports go (default ./conformance)")  # fmt: skip
    conformance.add_argument("--jobs", type=_count, metavar="N", help="pytest-xdist processes")
    conformance.set_defaults(run=_conformance)


def main(argv: list[str] | None = None) -> int:
    import contextvars

    # What one command sets for itself (the agent of --runtime) ends with it, also where a
    # program calls main() more than once.
    return contextvars.copy_context().run(terminal.run_command, _main, argv)


def _main(argv: list[str] | None) -> int:
    from_command_line()  # messages name what to type here (`composer plan`, not composer.plan())
    args = build_parser().parse_args(argv)
    try:
        with upstream_quieted(args.debug):
            # A variable set to nonsense stops every command at once, naming itself.
            environment.check_all()
            return args.run(args)
    except ComposerError as error:
        # A library turned the interrupt into an error of its own.
        if terminal.interrupts.received:
            raise KeyboardInterrupt from error
        if args.debug:
            raise
        print(f"composer: error: {error}", file=sys.stderr)
        return USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
