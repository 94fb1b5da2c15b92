"""A program's output structure made one ExecuTorch can write.

``to_executorch`` writes each method's output pytree spec into the program, and torch has no
serialized name for its ``torch.return_types`` structs: a model returning ``torch.median(x,
dim)`` failed to write ("No registered serialization name for <class
'torch.return_types.median'>"), with plain ExecuTorch as with composer. The runtime returns a
method's outputs as a flat list whatever the spec says, so such a struct is written as the
tuple it is (its fields in order).
"""

from __future__ import annotations

from torch.utils._pytree import (
    NO_SERIALIZED_TYPE_NAME_FOUND,
    SUPPORTED_SERIALIZED_TYPES,
    TreeSpec,
    treespec_dumps,
)


def outputs_made_serializable(program) -> bool:
    """Replace, in place, each tuple subclass with no serialized name in ``program``'s (an
    ``ExportedProgram``) output spec by ``tuple``; whether anything changed."""
    signature = program.module_call_graph[0].signature if program.module_call_graph else None
    if signature is None or _writes(signature.out_spec):
        return False
    signature.out_spec = _as_tuples(signature.out_spec)
    return True


def _writes(spec: TreeSpec) -> bool:
    try:
        treespec_dumps(spec)
    except NotImplementedError:
        return False
    return True


def _as_tuples(spec: TreeSpec) -> TreeSpec:
    if spec.is_leaf():
        return spec
    children = [_as_tuples(child) for child in spec.children_specs]
    named = SUPPORTED_SERIALIZED_TYPES.get(spec.type)
    unnamed = named is None or named.serialized_type_name in (None, NO_SERIALIZED_TYPE_NAME_FOUND)
    if isinstance(spec.type, type) and issubclass(spec.type, tuple) and unnamed:
        return TreeSpec(tuple, None, children)
    return TreeSpec(spec.type, spec.context, children)
