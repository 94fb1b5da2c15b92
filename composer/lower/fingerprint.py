"""Content digests: what a lowered program or partition depends on, as one hex string.

A cache entry is only as safe as its key, so every digest here either covers the whole input
(graph, shapes, dtypes, debug handles, constants' bytes, code, versions) or refuses: a tensor
whose bytes cannot be read (a fake tensor, a tensor subclass) raises ``Unfingerprintable`` and
the caller lowers without the cache. Refusing costs a compile; guessing costs a wrong program.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import inspect
import sys
import sysconfig
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import torch
import torch.fx

# The distributions whose version changes what lowering produces (the backends' own libraries
# come from their BackendSpec.library).
VERSIONED = ("executorch", "torch")


class Unfingerprintable(Exception):
    """Something in the input cannot be digested faithfully: do not cache it."""


def digest(*parts: str | bytes) -> str:
    """sha256 over ``parts``, each length-prefixed so that no two splits collide."""
    hasher = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        hasher.update(len(data).to_bytes(8, "little"))
        hasher.update(data)
    return hasher.hexdigest()


def tensor_digest(tensor: Any) -> str:
    """Dtype, shape and bytes of a real, plain tensor."""
    if not isinstance(tensor, torch.Tensor):
        raise Unfingerprintable(f"a constant of type {type(tensor).__name__}")
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter) or tensor.is_quantized:
        raise Unfingerprintable(f"a {type(tensor).__name__} constant")
    if tensor.device.type == "meta":
        raise Unfingerprintable("a constant on the meta device")
    data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    return digest(str(tensor.dtype), str(tuple(tensor.shape)), data.tobytes())


def program_digest(program: torch.export.ExportedProgram) -> str:
    """The graphs (ops, arguments, shapes, dtypes, debug handles), the signature, the range
    constraints and every constant's bytes of ``program``."""
    parts = [
        str(program.graph_signature),
        repr(sorted(map(str, program.range_constraints.items()))),
    ]
    parts += module_parts(program.graph_module)
    for kind, tensors in (("state", program.state_dict), ("constant", program.constants)):
        for name in sorted(tensors):
            parts.append(f"{kind} {name} {tensor_digest(tensors[name])}")
    return digest(*parts)


def module_parts(root: torch.nn.Module) -> list[str]:
    """One line per node of every graph under ``root``, and what nested delegates hold."""
    parts = []
    for path, module in root.named_modules():
        graph = getattr(module, "graph", None)
        if isinstance(graph, torch.fx.Graph):
            parts.append(f"graph {path}")
            parts.extend(_node_line(node) for node in graph.nodes)
        processed = getattr(module, "processed_bytes", None)
        if processed is not None:  # an earlier backend's delegate inside this graph
            specs = [(s.key, bytes(s.value)) for s in getattr(module, "compile_specs", ())]
            parts.append(f"delegate {path} {module.backend_id} {digest(processed)} {specs!r}")
    return parts


def _node_line(node: torch.fx.Node) -> str:
    args = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: f"%{n.name}")
    target = node.target if isinstance(node.target, str) else _callable_name(node.target)
    return (
        f"{node.op} {node.name} {target} {args!r} {_value(node.meta.get('val'))} "
        f"{node.meta.get('debug_handle')!r}"
    )


def _callable_name(target: Any) -> str:
    name = getattr(target, "__name__", None) or str(target)
    return f"{getattr(target, '__module__', '')}.{name}:{target}"


def _value(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"T[{value.dtype},{tuple(map(str, value.shape))},{tuple(map(str, value.stride()))}]"
    if isinstance(value, (list, tuple)):
        return "(" + ",".join(_value(v) for v in value) + ")"
    return repr(value) if isinstance(value, (int, float, bool, str, type(None))) else str(value)


@cache
def versions() -> str:
    """The versions of what lowers, and a digest of composer's own source: composer is often
    installed editable, where its version number says nothing about its code."""
    found = []
    for distribution in VERSIONED:
        try:
            found.append(f"{distribution}=={importlib.metadata.version(distribution)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{distribution} missing")
    package, source = composer_sources()
    found.append("composer " + digest(*(f"{p.relative_to(package)}" for p in source),
                                      *(p.read_bytes() for p in source)))  # fmt: skip
    found.append(sys.version)
    return " ".join(found)


def composer_sources() -> tuple[Path, list[Path]]:
    """The composer package's folder and every Python file in it (the scheduler's and the
    plugins' as much as this stage's: until 2026-11-26 only composer/lower was digested, and
    a program planned by an edited scheduler came from the cache as the old one planned it)."""
    package = Path(__file__).resolve().parents[1]
    return package, sorted(package.rglob("*.py"))


def code_digest(objects: Iterable[Any]) -> str:
    """A digest of the source files that define ``objects`` (a backend class, a plugin): a
    plugin edited in place must not be answered with what its old code lowered."""
    files = set()
    for obj in objects:
        target = obj if inspect.ismodule(obj) or inspect.isclass(obj) else type(obj)
        try:
            files.add(inspect.getfile(target))
        except (TypeError, OSError):
            raise Unfingerprintable(f"no source file for {target!r}") from None
    parts = []
    for name in sorted(files):
        try:
            parts += [name, Path(name).read_bytes()]
        except OSError:
            raise Unfingerprintable(f"cannot read {name}") from None
    return digest(*parts)


def _versioned(file: str) -> bool:
    """Whether ``file`` is code ``versions()`` covers: torch's, ExecuTorch's, the standard
    library's (the interpreter's version)."""
    paths = sysconfig.get_paths()
    installed = (paths["purelib"], paths["platlib"])
    covered = [str(Path(torch.__file__).parent)]
    executorch = importlib.util.find_spec("executorch")
    if executorch is not None and executorch.submodule_search_locations:
        covered += list(executorch.submodule_search_locations)
    if file.startswith(tuple(covered)):
        return True
    return file.startswith(paths["stdlib"]) and not file.startswith(installed)


_PLAIN = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device)
_MAX_FILES = 500


def module_digest(model: torch.nn.Module, example_inputs: tuple) -> str | None:
    """A digest of what ``torch.export`` would read from ``model`` and its inputs, without
    exporting: the source files of its classes and of the code their modules name (followed
    through other files of the user's, not into torch or the standard library), every
    parameter and buffer, each submodule's plain attributes, and the inputs.

    None when the model holds something this cannot see through (a hook, an attribute that
    is neither plain data, a tensor nor a module, a class without a source file): the caller
    then exports and digests the program itself. Code that reads global state (environment
    variables, flags of another library) is not seen; ``cache=False`` is the way out there."""
    try:
        parts = [versions()]
        files: set[str] = set()
        for name, module in model.named_modules():
            if any(getattr(module, hooks, None) for hooks in _HOOKS):
                return None
            cls = type(module)
            parts.append(f"module {name} {cls.__module__}.{cls.__qualname__}")
            parts.extend(_attributes(module))
            files.add(_source_file(cls))
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            parts.append(f"tensor {name} {tensor.requires_grad} {tensor_digest(tensor)}")
        for index, value in enumerate(torch.utils._pytree.tree_leaves(tuple(example_inputs))):
            value = tensor_digest(value) if isinstance(value, torch.Tensor) else _plain(value)
            parts.append(f"input {index} {value}")
        for file in sorted(_code_closure(files)):
            parts += [file, Path(file).read_bytes()]
        return digest(*parts)
    except (Unfingerprintable, OSError, TypeError):
        return None


_HOOKS = (
    "_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_state_dict_hooks",
    "_load_state_dict_pre_hooks", "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs",
)  # fmt: skip


def _attributes(module: torch.nn.Module) -> list[str]:
    lines = []
    for name, value in sorted(vars(module).items()):
        if name in ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"):
            continue
        if name.startswith("_") and isinstance(value, dict | set) and not value:
            continue  # torch's bookkeeping (empty hook tables and the like)
        lines.append(f"attribute {name} {_plain(value)}")
    return lines


def _plain(value: Any) -> str:
    if isinstance(value, _PLAIN):
        return repr(value)
    if isinstance(value, list | tuple) and all(isinstance(v, _PLAIN) for v in value):
        return repr(value)
    raise Unfingerprintable(f"an attribute of type {type(value).__name__}")


def _source_file(obj: Any) -> str:
    try:
        return inspect.getfile(obj)
    except (TypeError, OSError):
        raise Unfingerprintable(f"no source file for {obj!r}") from None


def _code_closure(files: set[str]) -> set[str]:
    """``files`` and the files of the functions, classes and modules their modules' globals
    name, followed transitively through code that is not torch's or the standard library's."""
    by_file = {getattr(m, "__file__", None): m for m in list(sys.modules.values())}
    seen: set[str] = set()
    pending = [f for f in files if not _versioned(f)]
    while pending:
        file = pending.pop()
        if file in seen:
            continue
        seen.add(file)
        if len(seen) > _MAX_FILES:
            raise Unfingerprintable("more code than the cache follows")
        module = by_file.get(file)
        if module is None:
            raise Unfingerprintable(f"{file} is not an imported module")
        for value in vars(module).values():
            if not (inspect.isfunction(value) or inspect.isclass(value) or inspect.ismodule(value)):
                continue
            try:
                found = inspect.getfile(value)
            except (TypeError, OSError):
                continue  # built in: covered by the interpreter's version
            if found.endswith(".py") and not _versioned(found):
                pending.append(found)
    return seen
