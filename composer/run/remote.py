"""The client of ``composer agent`` (:mod:`composer.run.agent`): a runtime on another machine.

``compose(..., runtime="HOST:PORT")`` and ``composer lower|run --runtime HOST:PORT`` make the
proof, ``verify`` and ``run --bench`` run programs on that machine's agent; the token comes from
``--runtime-token-file``, else ``$COMPOSER_RUNTIME_TOKEN``. Each request is one connection.
Where the agent cannot be reached, is killed, is too slow, refuses the token or answers with
something that is no reply, the request ends in one :class:`AgentError`: a fault of the machine,
not of the program, so the proof blames no delegate and nothing is written.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import socket
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from composer.contract.errors import ComposerError
from composer.contract.machine import MachineError
from composer.contract.runtime import Delegate, DelegateRuntime, Run
from composer.run import cpp_runtime
from composer.run.agent import DEFAULT_MAX_BYTES, FrameError, encode, listed, read_frame, values_in
from composer.run.runtime import RUNTIME, program_backend_ids

TOKEN_VARIABLE = "COMPOSER_RUNTIME_TOKEN"
TIMEOUT_VARIABLE = "COMPOSER_RUNTIME_TIMEOUT"
DEFAULT_TIMEOUT_S = 600.0

_ACTIVE: contextvars.ContextVar[RemoteRuntime | None] = contextvars.ContextVar(
    "composer_remote_runtime", default=None
)


class AgentError(MachineError):
    """The agent could not answer (unreachable, killed, too slow, the token refused, no reply):
    the program was not run there, and says nothing about its backends."""


class RemoteRuntime(DelegateRuntime):
    """The runtimes ``composer agent`` serves at ``address`` (``HOST:PORT``), reached with
    ``token`` (default ``$COMPOSER_RUNTIME_TOKEN``); a request not answered within
    ``timeout_s`` seconds (default ``$COMPOSER_RUNTIME_TIMEOUT``, else 600) fails."""

    def __init__(
        self, address: str, token: str | None = None, timeout_s: float | None = None
    ) -> None:
        self.host, self.port = parse_address(address)
        self.address = f"{self.host}:{self.port}"
        self.token = token if token is not None else os.environ.get(TOKEN_VARIABLE, "")
        if not self.token:
            raise ComposerError(
                f"the agent at {self.address} needs its token: pass --runtime-token-file FILE "
                f"(the file `composer agent --token-file FILE` wrote) or set ${TOKEN_VARIABLE}."
            )
        self.timeout_s = timeout_s if timeout_s is not None else _timeout_from_environment()
        self._hello: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return f"agent {self.address}"

    def executor(self, ran_in: str) -> str:
        """The proof line's executor: the agent and the runtime there (``ran_in``)."""
        return f"agent {self.address} ({ran_in})"

    def hello(self) -> dict[str, Any]:
        """What the agent's runtimes are (asked once)."""
        if self._hello is None:
            reply, _ = self._request({"op": "hello"}, [], "asking what it runs")
            backends = reply.get("backends")
            if not isinstance(backends, list) or not all(isinstance(b, str) for b in backends):
                raise self._not_a_reply("its hello lists no backends")
            self._hello = reply
        return self._hello

    def can_run(self, program: bytes) -> tuple[bool, str, str]:
        """(whether the agent runs ``program`` whole, why, the executor there)."""

        said = self.hello()
        missing = sorted(program_backend_ids(program) - set(said["backends"]))
        if not missing and said.get("runtime") is None:
            return True, "the agent's runtime has every delegate's backend", RUNTIME
        if said.get("runner"):
            return True, "the agent runs it in its C++ runner", cpp_runtime.EXECUTOR
        lacks = f"has no {', '.join(missing)}" if missing else f"cannot: {said.get('runtime')}"
        return False, f"the agent at {self.address} {lacks} and names no C++ runner", ""

    def run_program(
        self,
        program: bytes,
        data_files: Mapping[str, bytes],
        inputs: Sequence[torch.Tensor],
        method: str = "forward",
    ) -> list:
        """``method`` of ``program`` run once on the agent: its outputs. A ComposerError where
        the program fails there (with the agent's reason), an AgentError where the agent does."""
        reply, blobs = self._request(
            *self._program_request("run", program, data_files, inputs, method), "running a program"
        )
        try:
            return values_in(reply, "outputs", blobs)
        except FrameError as error:
            raise self._not_a_reply(str(error)) from error

    def time_program(
        self,
        program: bytes,
        data_files: Mapping[str, bytes],
        inputs: Sequence[torch.Tensor],
        calls: int,
        method: str = "forward",
    ) -> tuple[str, list[float]]:
        """(the executor there, the seconds of each of ``calls`` calls after a warm-up)."""
        header, blobs = self._program_request("time", program, data_files, inputs, method)
        reply, _ = self._request({**header, "calls": calls}, blobs, "timing a program")
        seconds = reply.get("seconds")
        if not isinstance(seconds, list) or not all(isinstance(s, int | float) for s in seconds):
            raise self._not_a_reply("its timing holds no seconds")
        return self.executor(str(reply.get("executor", "?"))), [float(s) for s in seconds]

    def load(self, delegate: Delegate) -> Run:
        """One delegate alone, as a program of its own on the agent."""
        program = delegate.standalone()
        return lambda operands: self.run_program(program, {}, list(operands))

    def _program_request(
        self, op: str, program: bytes, data_files: Mapping[str, bytes], inputs: Sequence[Any],
        method: str,
    ) -> tuple[dict, list]:  # fmt: skip
        blobs: list = [program]
        files = {}
        for name, data in data_files.items():
            files[name] = len(blobs)
            blobs.append(data)
        inputs = [t.cpu() if isinstance(t, torch.Tensor) else t for t in inputs]
        header = {"op": op, "program": 0, "data_files": files, "method": method,
                  "inputs": listed(inputs, blobs)}  # fmt: skip
        limit = self.hello().get("max_bytes", DEFAULT_MAX_BYTES)
        size = sum(b.nbytes if isinstance(b, torch.Tensor) else len(b) for b in blobs)
        if isinstance(limit, int) and size > limit:
            raise AgentError(
                f"the program and inputs are {size:,} bytes, more than the agent at "
                f"{self.address} takes ({limit:,}): start it with a larger --max-bytes."
            )
        return header, blobs

    def _request(self, header: dict, blobs: Sequence[Any], doing: str) -> tuple[dict, list]:
        """The agent's reply to one request: an AgentError where there is none, a ComposerError
        where the reply says the request failed."""
        frame = encode({**header, "token": self.token}, blobs)
        try:
            with socket.create_connection((self.host, self.port), timeout=self.timeout_s) as link:
                link.settimeout(self.timeout_s)
                link.sendall(frame)
                reply, got = read_frame(link, DEFAULT_MAX_BYTES)
        except TimeoutError as error:
            raise AgentError(
                f"the composer agent at {self.address} did not answer within "
                f"{self.timeout_s:g} s while {doing}: it is too slow or stuck. Give it longer "
                f"(--runtime-timeout, ${TIMEOUT_VARIABLE}) or check the agent."
            ) from error
        except ConnectionRefusedError as error:
            raise AgentError(
                f"cannot reach the composer agent at {self.address}: the connection was "
                f"refused. Start it there (`composer agent --port {self.port}`) or fix --runtime."
            ) from error
        except (EOFError, ConnectionError) as error:
            raise AgentError(
                f"the composer agent at {self.address} closed the connection while {doing}, "
                "before it replied (it was stopped or killed, or its runtime crashed): check "
                "the agent and run again."
            ) from error
        except OSError as error:
            raise AgentError(
                f"cannot reach the composer agent at {self.address}: "
                f"{error.strerror or error}. Check the address and the network."
            ) from error
        except FrameError as error:
            raise self._not_a_reply(str(error)) from error
        if reply.get("denied"):
            raise AgentError(
                f"the composer agent at {self.address} refused the token: pass the one it "
                f"printed or wrote (--runtime-token-file FILE, or ${TOKEN_VARIABLE})."
            )
        if reply.get("ok") is not True:
            error = reply.get("error")
            if not isinstance(error, str):
                raise self._not_a_reply("it says neither ok nor an error")
            if error.startswith("the request is no request"):
                raise AgentError(f"the composer agent at {self.address} refused the request: "
                                 f"{error.partition(': ')[2]}")  # fmt: skip
            raise ComposerError(f"on the agent at {self.address}: {error}")
        return reply, got

    def _not_a_reply(self, detail: str) -> AgentError:
        return AgentError(
            f"what {self.address} sent back is no reply of a composer agent ({detail}): check "
            "that --runtime names a `composer agent` of this composer version."
        )


def parse_address(address: str) -> tuple[str, int]:
    """(host, port) of ``HOST:PORT`` (``[::1]:7070`` for IPv6)."""
    host, _, port = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ComposerError(
            f"--runtime takes HOST:PORT of a `composer agent` (192.168.1.7:7070), not {address!r}."
        )
    return host, int(port)


def _timeout_from_environment() -> float:
    text = os.environ.get(TIMEOUT_VARIABLE)
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise ComposerError(f"${TIMEOUT_VARIABLE} must be a number of seconds > 0, not {text!r}.")
    return value


def active() -> RemoteRuntime | None:
    """The agent the proof and ``verify`` run programs on, where one is in use."""
    return _ACTIVE.get()


@contextlib.contextmanager
def runtime_at(runtime: str | RemoteRuntime | None) -> Iterator[RemoteRuntime | None]:
    """Within it, programs run on the agent ``runtime`` names (``None``: as before)."""
    if runtime is None:
        yield active()
        return
    if not isinstance(runtime, str | RemoteRuntime):
        raise ComposerError(
            f"runtime must be 'HOST:PORT' of a composer agent, or a RemoteRuntime, not "
            f"{type(runtime).__name__}."
        )
    remote = runtime if isinstance(runtime, RemoteRuntime) else RemoteRuntime(runtime)
    reset = _ACTIVE.set(remote)
    try:
        yield remote
    finally:
        _ACTIVE.reset(reset)


def use(remote: RemoteRuntime) -> None:
    """Programs run on ``remote`` from now on in this context (the command line's, which
    runs each command in a context of its own)."""
    _ACTIVE.set(remote)
