"""Sweeps that lose no work and say what they did: a dead worker's jobs
run again, Ctrl-C stops promptly and counts what was written, workers die with their driver,
a Ray address that does not answer and a bad flag get one line before any work, and workers
keep upstream chatter off the terminal as ``lower`` does."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import composer
from composer.cli import main

MODELS = ["zoo:mlp", "zoo:cumsum_mlp", "zoo:cnn", "zoo:cond"]

# Models a user's own module gives (``module:function``, imported from the working folder):
# one whose loading kills the process that loads it, one that loads for ten minutes.
MODEL_MODULE = """
import os, signal, time


def dies():
    os.kill(os.getpid(), signal.SIGKILL)


def sleeps():
    time.sleep(600)
"""


def lines(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def keys(path) -> list[tuple[str, str]]:
    return [(r["model"], r["stack"]) for r in lines(path)]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """The working folder is ``tmp_path``, with ``user_models.py`` in it."""
    (tmp_path / "user_models.py").write_text(MODEL_MODULE)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def worker_pids(driver: int) -> list[int]:
    """The sweep workers ``driver`` spawned (not its resource tracker)."""
    return [pid for pid in descendants(driver) if b"spawn_main" in _cmdline(pid)]


def descendants(root: int) -> list[int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [root]
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# --- item 2: a dead worker's jobs run again -------------------------------------------------


def test_a_worker_killed_mid_sweep_loses_no_job_and_records_none_twice(in_tmp):
    seen: list[str] = []

    def kill_the_worker(line: str) -> None:
        seen.append(line)
        if len(seen) == 2:  # the worker has the third job now
            for pid in worker_pids(os.getpid()):
                os.kill(pid, signal.SIGKILL)

    summary = composer.sweep(MODELS, ["xnnpack"], results="r.jsonl", workers=1,
                             progress=kill_the_worker)  # fmt: skip
    assert sorted(keys("r.jsonl")) == sorted((m, "xnnpack") for m in MODELS)
    assert all(r["ok"] for r in lines("r.jsonl")), lines("r.jsonl")
    assert summary.ok and summary.ran == 4


# CI time (about 80 s): a killed worker's jobs are guarded by the test above, a failing job's
# one record by test_fleet's.
@pytest.mark.slow
def test_a_job_that_kills_its_worker_each_time_is_recorded_failed_once_with_why(in_tmp, capsys):
    args = ["sweep", "user_models:dies", "zoo:mlp", "--stacks", "xnnpack", "--workers", "1",
            "--results", "r.jsonl"]  # fmt: skip
    assert main(args) == 1
    by_model = {r["model"]: r for r in lines("r.jsonl")}
    assert sorted(by_model) == ["user_models:dies", "zoo:mlp"]  # one record each
    assert by_model["zoo:mlp"]["ok"]
    error = by_model["user_models:dies"]["error"]
    assert error.startswith("the worker process died running this job 2 times"), error
    assert "SIGKILL" in error
    out = capsys.readouterr().out
    assert "2 job(s): 1 composed, 1 failed" in out
    # A job its worker died running was never done: --resume runs it again (and it dies again).
    assert main([*args, "--resume"]) == 1
    assert "1 run now, 1 from an earlier run" in capsys.readouterr().out
    assert sorted(keys("r.jsonl")) == [("user_models:dies", "xnnpack"), ("zoo:mlp", "xnnpack")]


def test_resume_runs_again_the_jobs_an_older_sweep_recorded_as_lost(in_tmp):
    # What an older sweep wrote when its worker died: every pending job "FAILED".
    lost = {"model": "zoo:cumsum_mlp", "stack": "xnnpack", "ok": False,
            "error": "the worker process died: A process in the process pool was terminated"}  # fmt: skip
    first = composer.sweep(["zoo:mlp"], ["xnnpack"], results="r.jsonl", workers=1)
    with open("r.jsonl", "a") as out:
        out.write(json.dumps(lost) + "\n")
    again = composer.sweep(["zoo:mlp", "zoo:cumsum_mlp"], ["xnnpack"], results="r.jsonl",
                           resume=True, workers=1)  # fmt: skip
    assert first.ok and again.ok and (again.ran, again.skipped) == (1, 1)
    assert sorted(keys("r.jsonl")) == [("zoo:cumsum_mlp", "xnnpack"), ("zoo:mlp", "xnnpack")]


# --- items 3 and 4: Ctrl-C, and a killed driver ---------------------------------------------

SWEEP = [sys.executable, "-m", "composer.cli", "sweep", "zoo:mlp", "user_models:sleeps",
         "--stacks", "xnnpack", "--workers", "1", "--results", "r.jsonl"]  # fmt: skip


@pytest.fixture
def started_sweep(in_tmp):
    """`composer sweep` in its own process group (as a shell runs it), once its first job is in
    the results file and its second (ten minutes long) is running; the group killed after."""
    process = subprocess.Popen(SWEEP, cwd=in_tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)  # fmt: skip
    try:
        first = process.stdout.readline()
        assert first.startswith("zoo:mlp @ xnnpack: ok"), first + process.stderr.read()
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_ctrl_c_stops_a_local_sweep_promptly_and_says_what_was_written(in_tmp, started_sweep):
    process = started_sweep
    time.sleep(1)
    os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    code = process.wait(timeout=20)
    stderr = process.stderr.read()
    assert code == 130, stderr
    assert stderr.rstrip().splitlines()[-1] == (
        "composer: interrupted after writing 1 record(s) to r.jsonl; 1 job(s) not done: "
        "the same command with --resume runs them"
    ), stderr
    assert "Traceback" not in stderr, stderr
    assert keys(in_tmp / "r.jsonl") == [("zoo:mlp", "xnnpack")]


def test_the_workers_of_a_killed_sweep_die_with_it(started_sweep):
    process = started_sweep
    left = descendants(process.pid)  # the worker, running the long job, and the resource tracker
    assert left
    process.kill()
    process.wait()
    deadline = time.monotonic() + 20
    while any(map(alive, left)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in left if alive(pid)], [_cmdline(pid) for pid in left]


# --- item 5: a Ray address nothing answers at -----------------------------------------------


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # free once closed: nothing listens there


def test_a_ray_address_that_does_not_answer_is_one_line_within_seconds(tmp_path, monkeypatch):
    from composer.fleet.on_ray import check_reachable

    port = closed_port()
    started = time.monotonic()
    with pytest.raises(
        composer.ComposerError, match=rf"no Ray cluster answers at 127.0.0.1:{port}"
    ):
        check_reachable(f"127.0.0.1:{port}")
    # "auto" reads the address the last `ray start` on this machine left, which may be stale
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{port}\n")
    with pytest.raises(composer.ComposerError, match="ray_current_cluster") as stale:
        check_reachable("auto")
    assert f"127.0.0.1:{port}" in str(stale.value) and "\n" not in str(stale.value)
    assert time.monotonic() - started < 20


def test_sweep_on_a_ray_address_nothing_answers_at_exits_2_within_seconds(in_tmp, capsys):
    pytest.importorskip("ray")
    started = time.monotonic()
    code = main(["sweep", "zoo:mlp", "--stacks", "xnnpack", "--ray", f"127.0.0.1:{closed_port()}"])
    assert code == 2 and time.monotonic() - started < 30
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("composer: error: no Ray cluster answers at 127.0.0.1:"), line


# --- item 6: every flag checked before any work ---------------------------------------------


def refused(args: list[str], capsys) -> str:
    """The one line ``composer sweep ARGS`` printed as it exited 2, having run nothing."""
    code = main(["sweep", "zoo:mlp", "--stacks", "xnnpack", "--results", "r.jsonl", *args])
    captured = capsys.readouterr()
    assert code == 2, captured
    assert captured.out == "", captured.out  # no job ran
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("composer: error: "), line
    return line


def test_bad_sweep_flags_are_one_line_and_exit_2_before_any_work(in_tmp, capsys):
    earlier = '{"model": "zoo:cnn", "stack": "xnnpack", "ok": true}\n'
    Path("r.jsonl").write_text(earlier)
    Path("a_file").write_text("")
    assert "cannot write a_file/x.html" in refused(["--html", "a_file/x.html"], capsys)
    assert "the directory missing does not exist" in refused(["--html", "missing/x.html"], capsys)
    assert "cannot write the golden plans to a_file/golden" in refused(
        ["--golden", "a_file/golden"], capsys
    )
    assert "--workers must be 1 or more, not -1" in refused(["--workers", "-1"], capsys)
    assert "--workers must be 1 or more, not 0" in refused(["--workers", "0"], capsys)
    assert "--bench must be 1 or more" in refused(["--bench", "-3"], capsys)
    assert Path("r.jsonl").read_text() == earlier  # the results of the earlier sweep are kept
    Path("r.jsonl").write_text(earlier + "{}\n")
    line = refused(["--resume"], capsys)
    assert "r.jsonl line 2 is not a sweep record" in line and "--results" in line, line
    assert Path("r.jsonl").read_text() == earlier + "{}\n"


def test_a_stack_named_twice_is_one_job(in_tmp, capsys):
    assert main(["sweep", "zoo:mlp", "--stacks", "xnnpack", "xnnpack", "--workers", "1",
                 "--results", "r.jsonl"]) == 0  # fmt: skip
    assert "1 job(s): 1 composed" in capsys.readouterr().out
    assert keys("r.jsonl") == [("zoo:mlp", "xnnpack")]


# --- item 7: workers keep upstream chatter off the terminal, as `lower` does ----------------


def test_sweep_workers_print_no_upstream_chatter(in_tmp):
    run = subprocess.run(
        [sys.executable, "-m", "composer.cli", "sweep", "zoo:mlp", "zoo:cumsum_mlp",
         "--stacks", "xnnpack", "--workers", "1", "--results", "r.jsonl"],
        check=False, cwd=in_tmp, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    for chatter in ("FutureWarning", "Failed to load", "_pytree"):
        assert chatter not in run.stderr, run.stderr
