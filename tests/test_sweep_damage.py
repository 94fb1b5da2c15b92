"""Sweeps lose nothing to damage: records edited or cut by hand are run again on ``--resume``
(and said to be), a golden file spoiled mid-sweep is named in the record that is kept, and
``composer.sweep()`` called at the top of a script, with no ``if __name__ == "__main__":``
guard, runs as the documented example is written."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_bad_input import run

import composer.fleet
from composer.fleet.jobs import run_job


def records(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def stand_in_jobs(todo, ray, workers, bench, done, device_resource, placement):
    """Each job recorded as composed, at once: what the driver reads and writes is tested, not
    how a job composes."""
    for job in todo:
        done({"model": job.model, "stack": job.stack, "ok": True, "proof": "stand-in"})


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_resume_runs_again_the_jobs_of_damaged_records_and_says_so(in_tmp, capsys, monkeypatch):
    monkeypatch.setattr(composer.fleet, "_run", stand_in_jobs)
    damaged = [
        {"model": "zoo:mlp", "stack": "xnnpack"},  # no "ok": KeyError
        {"model": "zoo:cnn", "stack": "xnnpack", "ok": True, "golden": ["moved"]},  # AttributeError
        {"model": "zoo:gru", "stack": "xnnpack", "ok": "yes"},
    ]
    kept = {"model": "zoo:cond", "stack": "xnnpack", "ok": True, "proof": "an earlier run's"}
    Path("r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*damaged, kept]))
    argv = ["sweep", "zoo:mlp", "zoo:cnn", "zoo:gru", "zoo:cond", "--stacks", "xnnpack",
            "--results", "r.jsonl", "--html", "r.html", "--resume"]  # fmt: skip
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    assert '3 damaged record(s) in r.jsonl (line 1: no "ok"): their job(s) run again' in out
    assert "4 job(s): 4 composed, 0 failed" in out and "(3 run now, 1 from an earlier run)" in out
    by_model = {r["model"]: r for r in records("r.jsonl")}
    assert len(by_model) == 4 and by_model["zoo:cond"] == kept  # one record each, none lost
    assert all(r["ok"] is True for r in by_model.values())


def test_a_golden_file_spoiled_while_the_sweep_runs_is_named_and_the_record_kept(
    in_tmp, capsys, monkeypatch
):
    def composing(todo, ray, workers, bench, done, device_resource, placement):
        for job in todo:  # in this process: what is written is tested, not how jobs run
            done(run_job({"model": job.model, "stack": job.stack}))

    def spoiling_then_composing(*args):
        Path("golden/zoo_mlp.xnnpack.json").write_text("{not json")
        composing(*args)

    argv = ["sweep", "zoo:mlp", "--stacks", "xnnpack", "--results", "r.jsonl", "--golden", "golden"]
    monkeypatch.setattr(composer.fleet, "_run", composing)
    assert run(capsys, *argv)[0] == 0  # writes the golden plan
    monkeypatch.setattr(composer.fleet, "_run", spoiling_then_composing)
    code, out, err = run(capsys, *argv)
    assert code == 1, err  # not compared is not a match
    (record,) = records("r.jsonl")
    assert record["ok"] and record["digest"]  # the job's work is kept
    assert record["golden_check"].startswith(
        "differs from zoo_mlp.xnnpack.json: not compared, JSONDecodeError"
    ), record["golden_check"]
    assert "1 differ from their golden plan" in out


# The module docstring's example, as a user pastes it into a file and runs it.
UNGUARDED = textwrap.dedent("""
    import composer

    summary = composer.sweep(["zoo:mlp"], ["xnnpack"], results="sweep.jsonl", workers=1)
    print("SWEPT:", summary.describe(), flush=True)
""")


def test_sweep_called_from_a_script_without_a_main_guard_runs_as_documented(in_tmp):
    Path("my_sweep.py").write_text(UNGUARDED)
    done = subprocess.run([sys.executable, "my_sweep.py"], capture_output=True, text=True,
                          timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    # the script ran once: its workers did not run it again
    assert done.stdout.count("SWEPT:") == 1, done.stdout
    assert "1 job(s): 1 composed, 0 failed" in done.stdout, done.stdout + done.stderr[-2000:]
    (record,) = records("sweep.jsonl")
    assert record["ok"] and "worker" not in record.get("error", "")
