"""``composer agent`` and ``--runtime HOST:PORT``: programs proven, run and timed on another
machine's runtime, here a real agent process on loopback; each fault of the agent or the wire
is one line, and nothing is written."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from composer.cli import main
from composer.models import zoo
from composer.run import agent as wire
from composer.run.remote import RemoteRuntime
from composer.run.runtime import run_program

MAX_BYTES = 4_000_000


class Agent:
    """A ``composer agent`` process on loopback, its cwd, HOME and TMPDIR its own folders."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cwd, self.home, self.tmp = (root / "cwd", root / "home", root / "tmp")
        for folder in (self.cwd, self.home, self.tmp):
            folder.mkdir(parents=True)
        self.token_file = root / "token"
        env = {**os.environ, "HOME": str(self.home), "TMPDIR": str(self.tmp),
               "OMP_NUM_THREADS": "1"}  # fmt: skip
        self.process = subprocess.Popen(
            [sys.executable, "-m", "composer.cli", "agent", "--port", "0",
             "--token-file", str(self.token_file), "--max-bytes", str(MAX_BYTES)],
            cwd=self.cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self.lines: list[str] = []
        first = self._line()
        assert first.startswith("composer agent listening on 127.0.0.1:"), first
        self.address = first.split()[4]
        self.token = self.token_file.read_text().strip()
        self.said = threading.Event()
        self._wanted = ""
        threading.Thread(target=self._follow, daemon=True).start()

    def _line(self) -> str:
        line = self.process.stdout.readline()
        self.lines.append(line)
        return line

    def _follow(self) -> None:
        while line := self._line():
            if self._wanted and line.startswith(self._wanted):
                self.said.set()

    def when_it_says(self, start: str, then) -> threading.Thread:
        """Call ``then()`` once the agent logs a line starting with ``start``."""
        self._wanted = start

        def wait() -> None:
            if self.said.wait(120):
                then()

        watcher = threading.Thread(target=wait, daemon=True)
        watcher.start()
        return watcher

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    served = Agent(tmp_path_factory.mktemp("agent"))
    yield served
    served.stop()


@pytest.fixture(scope="module")
def proven(agent, tmp_path_factory):
    """zoo:mlp composed with xnnpack, proven on the agent: (the .pte, what lower printed)."""
    folder = tmp_path_factory.mktemp("proven")
    out = folder / "mlp.pte"
    code, printed = _cli(
        "lower", "zoo:mlp", "--backends", "xnnpack", "-o", str(out), "--quiet",
        "--runtime", agent.address, "--runtime-token-file", str(agent.token_file),
    )  # fmt: skip
    assert code == 0, printed
    return out, printed


def _cli(*argv: str) -> tuple[int, str]:
    """``composer ARGV`` in this process: (exit code, stdout and stderr)."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue() + err.getvalue()


def _one_error_line(printed: str) -> str:
    lines = [line for line in printed.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("composer: error: "), printed
    assert "Traceback" not in printed
    return lines[0]


def test_the_proof_runs_on_the_agent_and_names_it(proven, agent):
    _, printed = proven
    proof = next(line for line in printed.splitlines() if line.startswith("proof:"))
    assert proof.startswith("proof: ran and matched eager")
    assert f"(agent {agent.address} (executorch runtime))" in proof
    assert any(line.startswith("run from 127.0.0.1") for line in agent.lines)


def test_compose_with_runtime_proves_on_the_agent_and_only_within_the_call(agent, monkeypatch):
    import composer
    from composer.run import remote

    monkeypatch.setenv("COMPOSER_RUNTIME_TOKEN", agent.token)
    model, inputs = zoo.load("mlp")
    composition = composer.compose(model, "xnnpack", inputs, runtime=agent.address)
    assert f"(agent {agent.address} (executorch runtime))" in composition.plan.proof
    assert remote.active() is None
    assert composition.verify().executor == "executorch runtime"  # here, after the call


def test_run_on_the_agent_gives_the_outputs_run_here_gives(proven, agent):
    pte, _ = proven
    code, printed = _cli("run", str(pte), "--compare", "zoo:mlp", "--bench", "20",
                         "--runtime", agent.address, "--runtime-token-file",
                         str(agent.token_file))  # fmt: skip
    assert code == 0, printed
    assert f"executor: agent {agent.address} (executorch runtime)" in printed
    assert "compare with zoo:mlp: OK" in printed
    assert f"latency on the agent {agent.address} (executorch runtime), 20 calls" in printed
    _, inputs = zoo.load("mlp")
    there = RemoteRuntime(agent.address, agent.token).run_program(pte.read_bytes(), {}, inputs)
    here = run_program(pte.read_bytes(), list(inputs))
    assert len(there) == len(here) == 1 and torch.equal(there[0], here[0])


def test_a_wrong_token_is_one_line_and_nothing_is_written(agent, tmp_path):
    wrong = tmp_path / "wrong"
    wrong.write_text("not the token\n")
    out = tmp_path / "mlp.pte"
    code, printed = _cli("lower", "zoo:mlp", "--backends", "xnnpack", "-o", str(out),
                         "--runtime", agent.address, "--runtime-token-file", str(wrong))  # fmt: skip
    assert code == 2
    assert "refused the token" in _one_error_line(printed)
    assert list(tmp_path.iterdir()) == [wrong]


def test_no_agent_there_is_one_line_and_nothing_is_written(tmp_path, monkeypatch):
    with socket.socket() as free:  # a port no one listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    monkeypatch.setenv("COMPOSER_RUNTIME_TOKEN", "anything")
    code, printed = _cli("lower", "zoo:mlp", "--backends", "xnnpack", "-o",
                         str(tmp_path / "mlp.pte"), "--runtime", f"127.0.0.1:{port}")  # fmt: skip
    assert code == 2
    assert "connection was refused" in _one_error_line(printed)
    assert list(tmp_path.iterdir()) == []


def test_an_agent_killed_mid_request_is_one_line(proven, tmp_path):
    pte, _ = proven
    doomed = Agent(tmp_path / "doomed")
    try:
        # a billion timed calls: the agent is inside the request when it is killed
        doomed.when_it_says("time from", doomed.stop)
        code, printed = _cli("run", str(pte), "--compare", "zoo:mlp", "--bench", "1000000000",
                             "--runtime", doomed.address, "--runtime-token-file",
                             str(doomed.token_file))  # fmt: skip
    finally:
        doomed.stop()
    assert code == 2
    line = _one_error_line(printed[printed.index("composer: error") :])
    assert "closed the connection while timing a program" in line


class _FakeServer:
    """A plain socket on loopback that answers each connection with ``reply`` (None: never)."""

    def __init__(self, reply: bytes | None) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.reply, self.held = reply, []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            connection.recv(65536)
            if self.reply is None:
                self.held.append(connection)  # says nothing, keeps it open
            else:
                connection.sendall(self.reply)
                connection.close()

    def close(self) -> None:
        self.listener.close()
        for connection in self.held:
            connection.close()


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        (b"HTTP/1.1 400 Bad Request\r\n\r\n", "is no reply of a composer agent"),
        (struct.pack(">4sIQ", wire.MAGIC, 2, 1 << 40) + b"{}", "over the limit"),
        (None, "did not answer within 1 s"),
    ],
    ids=["garbage", "oversized", "silent"],
)
def test_a_reply_that_is_no_reply_or_none_is_one_line(proven, tmp_path, reply, said):
    pte, _ = proven
    fake = _FakeServer(reply)
    token = tmp_path / "token"
    token.write_text("t")
    try:
        code, printed = _cli("run", str(pte), "--compare", "zoo:mlp", "--runtime", fake.address,
                             "--runtime-token-file", str(token), "--runtime-timeout", "1")  # fmt: skip
    finally:
        fake.close()
    assert code == 2
    assert said in _one_error_line(printed)


def test_the_agent_refuses_an_oversized_frame_before_reading_it(agent):
    host, port = agent.address.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as link:
        # only the 16 bytes that announce a body over the limit are sent
        link.sendall(struct.pack(">4sIQ", wire.MAGIC, 2, MAX_BYTES + 1))
        reply, _ = wire.read_frame(link, MAX_BYTES)
    assert reply["ok"] is False
    assert f"it is {MAX_BYTES + 1:,} bytes, over the limit {MAX_BYTES:,}" in reply["error"]
    # and it serves the next request
    assert RemoteRuntime(agent.address, agent.token).hello()["ok"] is True


def test_the_agent_writes_nothing_outside_its_temporary_folder(proven, agent):
    pte, _ = proven
    _, inputs = zoo.load("mlp")
    there = RemoteRuntime(agent.address, agent.token)
    there.run_program(pte.read_bytes(), {"weights.ptd": b"\0" * 16}, inputs)
    there.time_program(pte.read_bytes(), {}, inputs, 5)
    assert list(agent.cwd.iterdir()) == []
    assert list(agent.home.iterdir()) == []
    # its TMPDIR holds its own folder alone, removed when it stops
    assert [p.name.startswith("composer_agent_") for p in agent.tmp.iterdir()] == [True]
