"""What a backend must never take: earlier delegates, graph inputs and outputs, shared constants."""

from __future__ import annotations

import operator
import warnings

import torch
import torch.fx
from executorch.exir.delegate import executorch_call_delegate
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from composer.contract.errors import ComposerWarning

TAG = "delegation_tag"


def foreign_delegate_nodes(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """The ``executorch_call_delegate`` nodes of earlier backends and their ``getitem`` users."""
    guarded = set()
    for node in graph.nodes:
        if node.op == "call_function" and node.target is executorch_call_delegate:
            guarded.add(node)
            guarded.update(u for u in node.users if u.target is operator.getitem)
        elif node.op == "get_attr" and node.name.startswith("lowered_module_"):
            guarded.add(node)
    return guarded


def constant_placeholders(program: ExportedProgram) -> dict[torch.fx.Node, str]:
    """Placeholders that hold parameters, buffers or lifted constants, with their state names."""
    kinds = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
    names = {
        spec.arg.name: spec.target
        for spec in program.graph_signature.input_specs
        if spec.kind in kinds and hasattr(spec.arg, "name")
    }
    return {node: names[node.name] for node in program.graph.nodes if node.name in names}


def mutated_buffer_placeholders(program: ExportedProgram) -> set[torch.fx.Node]:
    """Buffer placeholders the program writes back to; they stay outside every delegate."""
    mutated = set(program.graph_signature.buffers_to_mutate.values())
    inputs_to_buffers = program.graph_signature.inputs_to_buffers
    return {
        node
        for node in program.graph.nodes
        if node.op == "placeholder" and inputs_to_buffers.get(node.name) in mutated
    }


def tag_state(program: ExportedProgram, tags: set[str]) -> dict[str, list[str]]:
    """Give each mutated buffer read and written only inside one partition of ``tags`` that
    partition's tag: its delegate then owns the buffer (``BackendSpec.keeps_state``). Returns
    the buffers so placed, by tag.

    Stricter than ExecuTorch's ``tag_mutated_buffer``, which follows the readers alone: the
    value written back must come from the same partition, or the delegate would own a buffer
    the rest of the program updates.
    """
    signature = program.graph_signature
    written_by = {buffer: output for output, buffer in signature.buffers_to_mutate.items()}
    nodes = {node.name: node for node in program.graph.nodes}
    owned: dict[str, list[str]] = {}
    for node in mutated_buffer_placeholders(program):
        buffer = signature.inputs_to_buffers[node.name]
        writer = nodes.get(written_by[buffer])
        user_tags = {user.meta.get(TAG) for user in node.users}
        if writer is None or len(user_tags) != 1:
            continue
        (tag,) = user_tags
        if tag in tags and writer.meta.get(TAG) == tag:
            node.meta[TAG] = tag
            owned.setdefault(tag, []).append(buffer)
    return owned


def constant_nbytes(program: ExportedProgram, state_name: str) -> int:
    value = program.state_dict.get(state_name)
    if value is None:
        value = program.constants.get(state_name)
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    return 0


def tag_constants(
    program: ExportedProgram, backend_wants: set[torch.fx.Node], only_wanted: bool = False
) -> int:
    """Give constants and control-flow submodules the tag of the partition that reads them.

    The policy for a constant read outside one partition is *share*: it stays untagged and
    reaches the delegate as an input, stored once. The exception is a constant the backend's
    own partitioner asked for (``backend_wants``), which a backend like XNNPACK must bake
    into its blob: it follows its first tagged reader and ExecuTorch duplicates it for the
    other readers. Returns the bytes so duplicated.

    With ``only_wanted`` (the backend's own partitioner chose, as in plain ExecuTorch) a
    lifted tensor constant it did not ask for stays an input even where one partition alone
    reads it; parameters and buffers keep the policy above. XNNPACK takes a 0-d lifted
    constant that a clone reads (Swin's attention mask) as an input, and baked into its blob
    the delegate fails at run time ("Failed to retrieve dim order from tensor").
    """
    constants = constant_placeholders(program)
    mutated = mutated_buffer_placeholders(program)
    lifted = set(program.graph_signature.inputs_to_lifted_tensor_constants)
    duplicated = 0
    for node in program.graph.nodes:
        is_constant = node in constants and node not in mutated
        is_submodule = node.op == "get_attr" and not node.name.startswith("lowered_module_")
        if not (is_constant or is_submodule) or not node.users:
            continue
        user_tags = [user.meta.get(TAG) for user in node.users]
        distinct = set(user_tags)
        left_as_input = only_wanted and node.name in lifted
        if len(distinct) == 1 and None not in distinct and not left_as_input:
            node.meta[TAG] = user_tags[0]
        elif node in backend_wants and distinct - {None}:
            node.meta[TAG] = next(tag for tag in user_tags if tag is not None)
            duplicated += (len(distinct) - 1) * constant_nbytes(program, constants[node])
    return duplicated


def take_tags(graph: torch.fx.Graph) -> dict[torch.fx.Node, str]:
    """Remove every delegation tag from ``graph`` and return what they were."""
    tag_of = {node: node.meta[TAG] for node in graph.nodes if node.meta.get(TAG)}
    for node in graph.nodes:
        node.meta.pop(TAG, None)
    return tag_of


def clean_foreign_tags(
    program: ExportedProgram,
    tag_of: dict[torch.fx.Node, str],
    guarded: set[torch.fx.Node],
    who: str,
) -> dict[torch.fx.Node, str]:
    """Drop the tags no partitioner may set (earlier delegates, user inputs, the output).

    Returns the tags kept on ops and constants; a warning naming ``who`` lists the rest.
    """
    constants = constant_placeholders(program)
    refused = []
    kept: dict[torch.fx.Node, str] = {}
    for node, tag in tag_of.items():
        if node in guarded:
            refused.append(f"{node.name} (a delegate of an earlier backend)")
        elif node.op == "output":
            refused.append(f"{node.name} (the graph output)")
        elif node.op == "placeholder" and node not in constants:
            refused.append(f"{node.name} (a user input)")
        elif node.op in ("placeholder", "call_function"):
            kept[node] = tag
    if refused:
        warnings.warn(
            f"composer removed tags that {who} put on nodes no backend may take: "
            f"{', '.join(refused)}",
            ComposerWarning,
            stacklevel=3,
        )
    return kept
