"""Ctrl-C at any point of `composer lower`: one line, exit 130, and no file written.

A real subprocess gets a real SIGINT: at start-up, while a backend is partitioned and
lowered, and after lowering (to_executorch, rendering, saving).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

# Lowered for real each time (--no-cache): a program from the cache passes the stages the
# interrupts aim at in a blink.
LOWER = [
    sys.executable, "-m", "composer.cli", "lower", "zoo:transformer_block",
    "--backends", "xnnpack,tensorrt_stub", "-o", "out.pte", "--report", "out.json", "--no-cache",
]  # fmt: skip


def interrupted_run(cwd, wait_for: str | None, delay: float = 0.0) -> tuple[int, str]:
    """Start `composer lower`, send SIGINT once stderr shows ``wait_for`` (or after ``delay``)."""
    process = subprocess.Popen(
        LOWER, cwd=cwd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
    seen = []
    if wait_for is None:
        time.sleep(delay)
    else:
        for line in process.stderr:
            seen.append(line)
            if wait_for in line:
                break
        else:
            process.wait()
            pytest.fail(f"the run ended before {wait_for!r}: {''.join(seen)}")
    time.sleep(delay)
    process.send_signal(signal.SIGINT)
    rest = process.stderr.read()
    return process.wait(timeout=300), "".join(seen) + rest


@pytest.mark.parametrize(
    ("wait_for", "delay"),
    [
        (None, 1.5),  # importing torch and ExecuTorch
        ("partition(s)", 0.0),  # partitioning / lowering a backend
        ("lowered with", 0.0),  # to_executorch, rendering the report, saving
    ],
    ids=["start-up", "lowering", "after-lowering"],
)
def test_ctrl_c_exits_130_with_one_line_and_writes_nothing(tmp_path, wait_for, delay):
    code, stderr = interrupted_run(tmp_path, wait_for, delay)
    assert code == 130, stderr
    assert stderr.rstrip().splitlines()[-1] == "composer: interrupted; nothing was written"
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


FACTORY = """
import torch


class InterruptWhenCollected:
    def __del__(self):
        raise KeyboardInterrupt  # as Ctrl-C landing in a weakref callback during lowering


def model():
    InterruptWhenCollected()  # collected at once: Python only prints "Exception ignored"
    return torch.nn.Linear(4, 4), (torch.randn(2, 4),)
"""


def test_ctrl_c_that_python_swallows_still_stops_the_run(capsys, tmp_path, monkeypatch):
    from composer.cli import main

    (tmp_path / "swallowed.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    code = main(["lower", "swallowed:model", "--backends", "xnnpack", "-o", "m.pte"])
    err = capsys.readouterr().err
    assert code == 130
    assert err.rstrip().splitlines()[-1] == "composer: interrupted; nothing was written"
    assert "Exception ignored" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) in (
        ["swallowed.py"],
        ["__pycache__", "swallowed.py"],
    )


def test_ctrl_c_that_a_library_turns_into_an_error_is_still_an_interrupt(
    capsys, tmp_path, monkeypatch
):
    from composer.cli import main

    (tmp_path / "wrapped.py").write_text(
        FACTORY + "\n\ndef failing():\n    model()\n    raise ValueError('stopped')\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    code = main(["lower", "wrapped:failing", "--backends", "xnnpack", "-o", "m.pte"])
    err = capsys.readouterr().err
    assert code == 130
    assert err.strip() == "composer: interrupted; nothing was written"
