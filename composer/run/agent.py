"""``composer agent``: this machine's ExecuTorch runtimes, served to composer running elsewhere.

composer on a workstation composes; the program must run where it deploys (a board, a phone, a
GPU box). The agent runs there, as TVM's RPC server does for TVM, and answers three requests:
``hello`` (the backends its runtimes have, its versions), ``run`` (a program, its ``.ptd`` data
files by name, a method and its inputs -> the outputs, or why not) and ``time`` (the same and a
call count -> seconds per call). :mod:`composer.run.remote` is the client.

The wire carries programs, tensors and timings only, never pickles: each message is one frame,
``MAGIC | u32 header length | u64 body length | header (JSON) | body``, where the header's
``blobs`` give each part of the body (raw bytes, or a tensor's dtype and shape) and every field
is checked before it is used. A frame bigger than the limit is refused from its first 16 bytes,
before its body is read. Every request carries the token, compared in constant time. Requests
are served one at a time; the runtimes write only under the agent's own temporary folder
(``tempfile.tempdir`` and ``$TMPDIR``), removed when it stops.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import secrets
import signal
import socket
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from composer.contract.errors import ComposerError, first_line
from composer.run import cpp_runtime
from composer.run.runtime import (
    RUNTIME,
    LoadedProgram,
    check_program_file,
    registered_backends,
    run_program,
    runtime_can_run,
    torch_mismatch,
)

MAGIC = b"CPA1"
_PREFIX = struct.Struct(">4sIQ")  # magic, header length, body length
MAX_HEADER = 1 << 20  # a header is names, dtypes and shapes: a MiB is plenty
DEFAULT_MAX_BYTES = 512 << 20  # a request's or a reply's body: programs and tensors
IO_TIMEOUT_S = 60.0  # the agent waits this long for a client's next bytes
_DTYPES = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (
        torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8,
        torch.int16, torch.int32, torch.int64, torch.bool,
    )
}  # fmt: skip
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}


class FrameError(Exception):
    """Bytes that are not a frame of this protocol, or one bigger than the limit."""


# -- frames --------------------------------------------------------------------------------


def encode(header: Mapping[str, Any], blobs: Sequence[bytes | torch.Tensor] = ()) -> bytes:
    """One frame: ``header`` (JSON) with a ``blobs`` entry describing ``blobs``, then their
    bytes. A tensor travels as its dtype, shape and contiguous bytes."""
    described, parts = [], []
    for blob in blobs:
        if isinstance(blob, torch.Tensor):
            tensor = blob.detach().cpu().contiguous()
            if tensor.dtype not in _NAMES:
                raise ComposerError(
                    f"a {tensor.dtype} tensor cannot travel to or from the agent; it carries "
                    f"{', '.join(_DTYPES)}."
                )
            data = tensor.reshape(-1).view(torch.uint8).numpy().tobytes()
            described.append(
                {"nbytes": len(data), "dtype": _NAMES[tensor.dtype], "shape": list(tensor.shape)}
            )
        else:
            data = bytes(blob)
            described.append({"nbytes": len(data)})
        parts.append(data)
    head = json.dumps({**header, "blobs": described}).encode()
    body = b"".join(parts)
    return _PREFIX.pack(MAGIC, len(head), len(body)) + head + body


def read_frame(
    connection: socket.socket, max_bytes: int, check: Callable[[dict], None] | None = None
) -> tuple[dict[str, Any], list[bytes | torch.Tensor]]:
    """The header and blobs of the next frame on ``connection``. A FrameError where the bytes
    are no frame, or its body is over ``max_bytes`` (refused before the body is read); an
    OSError (a timeout, a reset) or EOFError where the connection fails. ``check`` sees the
    header before the body is read (and may raise)."""
    magic, head_length, body_length = _PREFIX.unpack(_read(connection, _PREFIX.size))
    if magic != MAGIC:
        raise FrameError(f"it does not start with {MAGIC!r} but {magic!r}")
    if head_length > MAX_HEADER:
        raise FrameError(f"its header is {head_length:,} bytes, over the limit {MAX_HEADER:,}")
    if body_length > max_bytes:
        raise FrameError(f"it is {body_length:,} bytes, over the limit {max_bytes:,}")
    try:
        header = json.loads(_read(connection, head_length))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise FrameError(f"its header is not JSON ({error})") from error
    if not isinstance(header, dict):
        raise FrameError("its header is not a JSON object")
    if check is not None:
        check(header)
    return header, _blobs(header.get("blobs"), _read(connection, body_length))


def _blobs(described: Any, body: bytes) -> list[bytes | torch.Tensor]:
    """The blobs of ``body`` as ``described``, each checked: sizes that add up to the body, a
    dtype of the list, a shape whose elements fill the bytes."""
    if not isinstance(described, list):
        raise FrameError("its header has no list of blobs")
    blobs: list[bytes | torch.Tensor] = []
    at = 0
    for entry in described:
        nbytes = entry.get("nbytes") if isinstance(entry, dict) else None
        if not _count(nbytes) or at + nbytes > len(body):
            raise FrameError(f"a blob's size {nbytes!r} does not fit the body")
        data, at = body[at : at + nbytes], at + nbytes
        if "dtype" not in entry:
            blobs.append(data)
            continue
        dtype, shape = _DTYPES.get(entry["dtype"]), entry.get("shape")
        if dtype is None or not isinstance(shape, list) or not all(map(_count, shape)):
            raise FrameError(f"a tensor's dtype {entry['dtype']!r} or shape {shape!r} is not one")
        if math.prod(shape) * dtype.itemsize != nbytes:
            raise FrameError(f"a {entry['dtype']} tensor of shape {shape} is not {nbytes} bytes")
        if nbytes == 0:
            blobs.append(torch.empty(shape, dtype=dtype))
        else:
            flat = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            blobs.append(flat.view(dtype).reshape(shape))
    if at != len(body):
        raise FrameError(f"its blobs are {at:,} bytes, its body {len(body):,}")
    return blobs


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _read(connection: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = connection.recv(min(left, 1 << 20))
        if not chunk:
            raise EOFError("the connection closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def values_in(header: Mapping[str, Any], key: str, blobs: Sequence[Any]) -> list:
    """The values ``header[key]`` lists: an index of a tensor among ``blobs``, or
    ``{"value": number}`` (an int, float or bool input or output), or ``None``."""
    listed = header.get(key)
    if not isinstance(listed, list):
        raise FrameError(f"its {key!r} is not a list")
    values: list = []
    for item in listed:
        if item is None:
            values.append(None)
        elif _count(item) and item < len(blobs) and isinstance(blobs[item], torch.Tensor):
            values.append(blobs[item])
        elif isinstance(item, dict) and type(item.get("value")) in (int, float, bool):
            values.append(item["value"])
        else:
            raise FrameError(f"its {key!r} holds {item!r}, which is no value")
    return values


def listed(values: Sequence[Any], blobs: list) -> list:
    """``values`` as a header lists them, their tensors appended to ``blobs``."""
    items: list = []
    for value in values:
        if isinstance(value, torch.Tensor):
            items.append(len(blobs))
            blobs.append(value)
        elif value is None:
            items.append(None)
        elif type(value) in (int, float, bool):
            items.append({"value": value})
        else:
            raise ComposerError(
                f"a {type(value).__name__} cannot travel to or from the agent: only tensors, "
                "ints, floats and bools do."
            )
    return items


# -- the server ----------------------------------------------------------------------------


def load_token(path: str | None) -> tuple[str, str]:
    """The token clients must present, and where it came from: read from ``path`` where that
    file exists; else a new one, written to ``path`` (readable by its owner alone) where given."""
    if path and os.path.exists(path):
        with open(path) as file:
            token = file.read().strip()
        if not token:
            raise ComposerError(
                f"the token file {path} is empty: write a token in it, or remove it."
            )
        return token, f"read from {path}"
    token = secrets.token_urlsafe(32)
    if not path:
        return token, "new"
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as error:
        raise ComposerError(f"cannot write the token file {path}: {error.strerror}.") from error
    with os.fdopen(descriptor, "w") as file:
        file.write(token + "\n")
    return token, f"written to {path}"


class Agent:
    """Serves this machine's runtimes on ``host``:``port`` (0: a free one) to clients that
    present ``token``; bodies over ``max_bytes`` are refused."""

    def __init__(
        self, host: str, port: int, token: str, max_bytes: int = DEFAULT_MAX_BYTES,
        log: Callable[[str], None] = print,
    ) -> None:  # fmt: skip
        self.token, self.max_bytes, self.log = token.encode(), max_bytes, log
        try:
            self.listener = socket.create_server((host, port))
        except OSError as error:
            raise ComposerError(
                f"cannot listen on {host}:{port}: {error.strerror or error}. Pick another --port."
            ) from error
        self.address = "{}:{}".format(*self.listener.getsockname()[:2])

    def serve_forever(self) -> None:
        """Answer requests, one at a time, until interrupted."""
        try:
            while True:
                connection, peer = self.listener.accept()
                with connection:
                    connection.settimeout(IO_TIMEOUT_S)
                    self._serve(connection, f"{peer[0]}:{peer[1]}")
        finally:
            self.listener.close()

    def _serve(self, connection: socket.socket, peer: str) -> None:
        try:
            # the token is checked before a body is read: a stranger's bytes are never held
            header, blobs = read_frame(connection, self.max_bytes, self._check_token)
        except _Denied:
            self.log(f"refused a request from {peer}: wrong token")
            self._reply(connection, {"ok": False, "denied": True, "error": "wrong token"})
            return
        except FrameError as error:
            self.log(f"refused a request from {peer}: {error}")
            self._reply(connection, {"ok": False, "error": f"the request is no request: {error}"})
            return
        except (OSError, EOFError, struct.error) as error:
            self.log(f"dropped {peer}: {error}")
            return
        op = header.get("op")
        size = sum(len(b) if isinstance(b, bytes) else b.nbytes for b in blobs)
        self.log(f"{op} from {peer}: {size:,} bytes")
        started = time.perf_counter()
        try:
            reply, out = self._answer(op, header, blobs)
        except ComposerError as error:
            reply, out = {"ok": False, "error": str(error)}, []
        except FrameError as error:
            reply, out = {"ok": False, "error": f"the request is no request: {error}"}, []
        except Exception as error:  # noqa: BLE001 - the runtime's failure is the client's answer
            reply, out = {"ok": False, "error": f"{type(error).__name__}: {first_line(error)}"}, []
        self.log(f"{op} answered in {time.perf_counter() - started:.3f} s: "
                 f"{'ok' if reply.get('ok') else reply.get('error', '')[:200]}")  # fmt: skip
        self._reply(connection, reply, out)

    def _check_token(self, header: dict) -> None:
        token = header.get("token")
        if not isinstance(token, str) or not hmac.compare_digest(token.encode(), self.token):
            raise _Denied

    def _reply(self, connection: socket.socket, reply: dict, blobs: Sequence[Any] = ()) -> None:
        try:
            frame = encode(reply, blobs)
            if len(frame) - _PREFIX.size > self.max_bytes + MAX_HEADER:
                frame = encode({"ok": False, "error": "the reply is over the agent's limit"})
            connection.sendall(frame)
        except (OSError, ComposerError) as error:
            self.log(f"could not reply: {error}")

    def _answer(self, op: Any, header: dict, blobs: list) -> tuple[dict, list]:
        if op == "hello":
            return hello(self.max_bytes), []
        if op not in ("run", "time"):
            raise FrameError(f"it asks for {op!r}; an agent answers hello, run and time")
        program = blobs[header["program"]] if _count(header.get("program")) and header[
            "program"] < len(blobs) else None  # fmt: skip
        method, files = header.get("method"), header.get("data_files", {})
        if not isinstance(program, bytes) or not isinstance(method, str):
            raise FrameError("it has no program or no method")
        if not isinstance(files, dict) or not all(
            _plain_name(n) and _count(i) and i < len(blobs) and isinstance(blobs[i], bytes)
            for n, i in files.items()
        ):
            raise FrameError("its data files are not plain names of byte blobs")
        data_files = {name: blobs[index] for name, index in files.items()}
        inputs = values_in(header, "inputs", blobs)
        if op == "run":
            executor, outputs = run_here(program, data_files, inputs, method)
            out: list = []
            return {"ok": True, "executor": executor, "outputs": listed(outputs, out)}, out
        calls = header.get("calls")
        if not _count(calls) or not 1 <= calls <= 10**9:
            raise FrameError(f"its call count {calls!r} is not one")
        executor, seconds = time_here(program, data_files, inputs, method, calls)
        return {"ok": True, "executor": executor, "seconds": seconds}, []


class _Denied(FrameError):
    """The request's token is not the agent's."""


def _plain_name(name: Any) -> bool:
    """A data file's name that stays in the folder it is written to."""
    return (
        isinstance(name, str) and 0 < len(name) <= 200 and not name.startswith(".")
        and all(c.isalnum() or c in "._-" for c in name)
    )  # fmt: skip


def hello(max_bytes: int) -> dict[str, Any]:
    """What this machine's runtimes are: the backends the pip runtime has (where it is built
    for this torch), whether ExecuTorch's C++ runner is named, the versions, the limit."""
    from importlib.metadata import version

    mismatch = torch_mismatch()
    return {
        "ok": True,
        "backends": sorted(registered_backends()) if mismatch is None else [],
        "runtime": mismatch,  # why the pip runtime is not used, or None
        "runner": cpp_runtime.runner_path() is not None,
        "torch": torch.__version__,
        "executorch": version("executorch"),
        "max_bytes": max_bytes,
    }


def run_here(
    program: bytes, data_files: Mapping[str, bytes], inputs: Sequence[Any], method: str
) -> tuple[str, list]:
    """(the executor, the outputs) of ``method`` of ``program`` run once here: in the pip
    runtime where it has every delegate's backend, else in the C++ runner."""

    can_run, why = _checked(program, method)
    if can_run:
        return RUNTIME, run_program(program, inputs, method)
    runner = cpp_runtime.runner_path()
    if runner is None:
        raise ComposerError(f"this agent cannot run the program: {why}, and no C++ runner is "
                            f"named (${cpp_runtime.RUNNER_VARIABLE})")  # fmt: skip
    return cpp_runtime.EXECUTOR, cpp_runtime.run_program(
        runner, program, data_files, inputs, method=method
    )


_CHECKED: dict[tuple[bytes, str], tuple[bool, str]] = {}


def _checked(program: bytes, method: str) -> tuple[bool, str]:
    """Whether the pip runtime runs ``program`` whole, and why not; a ComposerError where it
    is no program with ``method``. Remembered for the last few programs: the proof sends one
    program again and again, and parsing its table costs more than running a small one."""

    key = (hashlib.sha256(program).digest(), method)
    if key not in _CHECKED:
        # A damaged program must be refused before the runtime reads it: it aborts the process.
        check_program_file(program, "the program", method)
        if len(_CHECKED) >= 8:
            _CHECKED.pop(next(iter(_CHECKED)))
        _CHECKED[key] = runtime_can_run(program)
    return _CHECKED[key]


def time_here(
    program: bytes, data_files: Mapping[str, bytes], inputs: Sequence[Any], method: str,
    calls: int,
) -> tuple[str, list[float]]:  # fmt: skip
    """(the executor, the seconds of each of ``calls`` calls after a warm-up) of ``method``."""

    if _checked(program, method)[0]:
        loaded = LoadedProgram(program, method)
        loaded.check_inputs(inputs)
        for _ in range(min(10, calls)):
            loaded.run(inputs)
        call, seconds = loaded.timed_call(inputs), []
        for _ in range(calls):
            started = time.perf_counter()
            call()
            seconds.append(time.perf_counter() - started)
        return RUNTIME, seconds
    runner = cpp_runtime.runner_path()
    if runner is None:
        raise ComposerError("this agent cannot run the program: its runtime lacks a backend of "
                            f"it, and no C++ runner is named (${cpp_runtime.RUNNER_VARIABLE})")  # fmt: skip
    loaded_runner = cpp_runtime.RunnerProgram(runner, program, data_files, method=method)
    try:
        report = loaded_runner.report(inputs, repeats=calls, warmup=10)
        return cpp_runtime.EXECUTOR, report["seconds"]
    finally:
        loaded_runner.close()


def serve(host: str, port: int, token_file: str | None, max_bytes: int) -> int:
    """``composer agent``: serve until interrupted (Ctrl-C)."""
    token, source = load_token(token_file)
    agent = Agent(host, port, token, max_bytes, log=lambda line: print(line, flush=True))
    # The address first: a client (or a test) can connect while the runtimes load.
    print(f"composer agent listening on {agent.address} (requests up to {max_bytes:,} bytes)",
          flush=True)  # fmt: skip
    print(f"token {source}" if token_file else f"token: {token}", flush=True)
    # Stopped by a service manager (SIGTERM), it removes its temporary folder as on Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # Every file the runtimes (and torch, and the C++ runner it starts) write goes to a folder
    # of its own, removed when it stops: set before the runtimes load, which make theirs then.
    with tempfile.TemporaryDirectory(prefix="composer_agent_") as folder:
        tempfile.tempdir = os.environ["TMPDIR"] = folder
        said = hello(max_bytes)
        runtimes = ", ".join(said["backends"]) or f"no pip runtime ({said['runtime']})"
        print(f"runtimes: {runtimes}" + ("; the C++ runner" if said["runner"] else ""), flush=True)
        agent.serve_forever()
    return 0
