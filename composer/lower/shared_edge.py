"""The decomposition to the edge dialect, shared among the lowerings of one model.

Measured placement lowers one model many times: each candidate, each layout of the per-region
search, each plan; ExecuTorch's ``to_edge_transform_and_lower`` decomposes the exported program
anew every time (``ExportedProgram.run_decompositions``, two or three times per lowering, then
``_generate_edge_program``'s passes): most of a measured compose's time (bench/RESULTS.md, "What
measured placement costs"). Every candidate starts from the same exported program, and most
reach the same decompositions, so inside ``sharing_edge_programs`` both steps answer from what
an earlier lowering made of the same input: a copy of it, as if made again.

The steps are pure functions of the program they are given (and the table, or the config and
the ops kept whole), so the key is that program's content: its graphs, its nodes' metadata
(shapes and dtypes of their values), its signature, and which tensors it holds (by identity and
version: a model's parameters are the same tensor objects in every export of it, and a write
to one, a buffer the proof's eager run updates, changes its version). A copy shares those
tensors, as the step itself would have; whatever else it holds is copied. What the partitioners
are asked (``ops_to_not_decompose``, their filters) is still asked of every lowering, on the
program they would have seen: only the retracing is skipped.

Not shared: programs with symbolic dims (a copy shares the ShapeEnv of the program it was made
from, which a lowering's guards can specialize: ``export._Untouched`` says how that went
wrong), and programs holding constants other than tensors (script objects)."""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Iterator
from typing import Any

import attrs
import torch
import torch.export.decomp_utils
import torch.export.exported_program
from torch.export import ExportedProgram


@attrs.define
class Shared:
    """What one ``sharing_edge_programs`` made and reused: step name -> count."""

    made: dict[str, int] = attrs.field(factory=dict)
    reused: dict[str, int] = attrs.field(factory=dict)
    entries: dict[tuple, tuple[ExportedProgram, Any, list]] = attrs.field(factory=dict, repr=False)

    def count(self, counts: dict[str, int], step: str) -> None:
        counts[step] = counts.get(step, 0) + 1


_ACTIVE: list[Shared] = []


@contextlib.contextmanager
def sharing_edge_programs() -> Iterator[Shared]:
    """Inside, ``run_decompositions`` and ExecuTorch's ``_generate_edge_program`` answer an input
    seen before (by content) with a copy of what they made of it; nested, the outer one holds."""
    if _ACTIVE:
        yield _ACTIVE[-1]
        return
    # executorch.exir takes seconds to import; only a lowering needs it.
    from executorch.exir.program import _program

    shared = Shared()
    decompose = ExportedProgram.run_decompositions
    generate = _program._generate_edge_program

    def run_decompositions(self, decomp_table=None, decompose_custom_triton_ops=False):
        table = None if decomp_table is None else _table_key(decomp_table)
        key = _key(self, ("run_decompositions", table, decompose_custom_triton_ops))
        return _answer(shared, key, "run_decompositions", self, None,
                       lambda: decompose(self, decomp_table, decompose_custom_triton_ops))  # fmt: skip

    def generate_edge_program(config, program, core_aten_ops_exception_list=None,
                              preserve_ops=None):  # fmt: skip
        listed = (repr(config), _ops_key(core_aten_ops_exception_list), _ops_key(preserve_ops))
        key = _key(program, ("_generate_edge_program", *listed))
        return _answer(shared, key, "_generate_edge_program", program, config,
                       lambda: generate(config, program, core_aten_ops_exception_list,
                                        preserve_ops))  # fmt: skip

    ExportedProgram.run_decompositions = run_decompositions
    _program._generate_edge_program = generate_edge_program
    collected = {module: module._collect_all_valid_cia_ops for module in _CIA_USERS}
    for module, collect in collected.items():
        module._collect_all_valid_cia_ops = _registry_memo(collect)
    _ACTIVE.append(shared)
    try:
        yield shared
    finally:
        _ACTIVE.pop()
        ExportedProgram.run_decompositions = decompose
        _program._generate_edge_program = generate
        for module, collect in collected.items():
            module._collect_all_valid_cia_ops = collect


# Where torch.export asks for every operator it may keep whole (composite implicit ones):
# each decomposition table made, and each decomposition run, walks the dispatcher's every
# namespace for them (a tenth of a second; of a measured compose of cnn, a fifth).
_CIA_USERS = (torch.export.exported_program, torch.export.decomp_utils)


def _registry_memo(collect):
    """``collect`` answered again while the dispatcher has the same operators: torch does not
    cache it because registering an operator changes it, and a registration shows in the
    operator names and in the composite implicit registrations, which are the key."""
    found: dict[str, Any] = {}

    def collect_again():
        key = (
            tuple(torch.ops._dir),
            len(torch._C._dispatch_get_all_op_names()),
            tuple(
                torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd")
            ),
        )
        if found.get("key") != key:
            found["key"], found["ops"] = key, collect()
        return found["ops"]

    return collect_again


def _answer(shared: Shared, key, step: str, given: ExportedProgram, config, make):
    """A copy of what ``make`` made of an input with this ``key``, or ``make()`` (kept)."""
    if key is None:
        return make()
    found = shared.entries.get(key)
    if found is not None:
        shared.count(shared.reused, step)
        kept, kept_config, kept_examples = found
        memo = _held_tensors(given)
        # The steps pass the example inputs on as they are: the caller's, not the first one's
        # (alike in shape and dtype; a probe of one op is made with inputs of its own).
        for before, now in zip(kept_examples, _examples(given), strict=True):
            if isinstance(before, torch.Tensor):
                memo[id(before)] = now
        if config is not None:
            # What refers to the config refers to the caller's. The verifier class ExecuTorch
            # makes for an edge program stays the first one's (a class is not copied): it was
            # made from a config alike (the config is in the key) and reads nothing else of it.
            memo[id(kept_config)] = config
        return copy.deepcopy(kept, memo)
    made = make()
    shared.count(shared.made, step)
    # Kept as made, apart from what later steps change in place; the given program's tensors
    # stay shared (a copy of them would hold the same values, and cost memory).
    memo = _held_tensors(given)
    if config is not None:
        memo[id(config)] = config
    shared.entries[key] = (copy.deepcopy(made, memo), config, _examples(given))
    return made


def _held_tensors(program: ExportedProgram) -> dict[int, Any]:
    """The tensors ``program`` holds, which the steps pass on as they are: its parameters,
    buffers, constants and example inputs."""
    held = [*program.state_dict.values(), *program.constants.values(), *_examples(program)]
    return {id(t): t for t in held if isinstance(t, torch.Tensor)}


def _examples(program: ExportedProgram) -> list:
    examples = program.example_inputs
    return [] if examples is None else torch.utils._pytree.tree_leaves(examples)


def _table_key(table) -> tuple:
    return tuple(sorted((str(op), _function_key(fn)) for op, fn in table.items()))


def _function_key(fn) -> tuple:
    """A decomposition, as what it runs: ``torch.export``'s default table wraps half its entries
    anew each time it is made (``functools.partial`` of a closure made per call), each the same
    code on the same op."""
    if isinstance(fn, functools.partial):
        return ("partial", _function_key(fn.func), repr(fn.args), repr(sorted(fn.keywords.items())))
    code = getattr(fn, "__code__", None)
    if code is None:
        return ("object", id(fn))
    try:
        cells = tuple(repr(cell.cell_contents) for cell in fn.__closure__ or ())
    except ValueError:  # a cell not filled yet: this function, by identity
        return ("object", id(fn))
    return ("code", id(code), cells, repr(getattr(fn, "__defaults__", None)))


def _ops_key(ops) -> tuple | None:
    return None if ops is None else tuple(sorted(map(str, ops)))


def _key(program: ExportedProgram, step: tuple) -> tuple | None:
    """The content of ``program`` that a decomposition reads, with ``step``'s arguments; None
    where it is not shared (symbolic dims, constants other than tensors)."""
    if program.range_constraints:
        return None
    tensors = []
    for name, value in [*program.state_dict.items(), *program.constants.items()]:
        if not isinstance(value, torch.Tensor):
            return None
        tensors.append((name, id(value), value._version))
    graphs = []
    for name, module in program.graph_module.named_modules():
        if isinstance(module, torch.fx.GraphModule):
            nodes = tuple((node.name, _meta(node.meta)) for node in module.graph.nodes)
            attributes = tuple(
                _attribute(module, node.target) for node in module.graph.nodes
                if node.op == "get_attr"
            )  # fmt: skip
            graphs.append((name, str(module.graph), nodes, attributes))
    return (
        step,
        type(program).__name__,
        program.dialect,
        tuple(v.__name__ if isinstance(v, type) else repr(v) for v in program.verifiers),
        str(program.graph_signature),
        str(program.module_call_graph),
        tuple(tensors),
        tuple(map(_value, _examples(program))),
        tuple(graphs),
    )


def _attribute(module: torch.nn.Module, target: str):
    value = module
    for part in target.split("."):
        value = getattr(value, part, None)
    if isinstance(value, torch.Tensor):
        return (target, id(value), value._version)
    if isinstance(value, torch.fx.GraphModule):
        return (target, "graph")  # its graph is among the program's modules
    return (target, type(value).__name__, id(value))


# Where a node came from, as a trace of passes over graphs named by id, and the autograd
# sequence number of its trace: provenance that differs between two programs alike, and that no
# step reads to decide what it makes.
_PROVENANCE = frozenset({"from_node", "seq_nr"})


def _meta(meta: dict) -> tuple:
    return tuple(
        (name, _value(value) if name in ("val", "tensor_meta") else repr(value))
        for name, value in sorted(meta.items())
        if name not in _PROVENANCE
    )


def _value(value) -> Any:
    """A node's value as its shape, dtype, strides, device and grad flag, for tensors."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(map(str, value.shape)), str(value.dtype),
                tuple(map(str, value.stride())), str(value.device), value.requires_grad)  # fmt: skip
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(_value(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((repr(k), _value(v)) for k, v in value.items()))
    return repr(value)
