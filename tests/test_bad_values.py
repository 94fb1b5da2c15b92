"""Every value composer reads, wrong: one line naming the value and what to do, exit 2, nothing
written. One row per kind of value (environment variable, config, manifest, flag, path, size);
each is refused before any export or lowering."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import composer
from composer.cli import main
from composer.config import stack_from
from composer.contract import environment
from composer.contract.errors import ComposerError
from composer.fleet.jobs import ResultsFile
from composer.models import zoo
from tests.test_bad_input import assert_one_line_error

PLAN = ["plan", "zoo:mlp", "--backends", "xnnpack"]
LOWER = ["lower", "zoo:mlp", "--backends", "xnnpack", "-o", "out.pte", "--quiet"]
SWEEP = ["sweep", "zoo:mlp", "--stacks", "xnnpack", "--results", "r.jsonl", "--quiet"]
LONG_NAME = "n" * 300  # beyond NAME_MAX (255) on every file system composer runs on
LONG_PATH = "/".join(["d" * 200] * 25) + "/x"  # beyond PATH_MAX (4096)

# (class, argv, environment, files written first, what the one line must say)
ROWS = [
    ("env", PLAN, {"COMPOSER_CACHE_SIZE": "inf"}, {}, ["COMPOSER_CACHE_SIZE='inf'", "e.g. 2G"]),
    ("env", PLAN, {"COMPOSER_CACHE_SIZE": "-1G"}, {}, ["COMPOSER_CACHE_SIZE='-1G'", "a size"]),
    (
        "env",
        PLAN,
        {"COMPOSER_SLOW_ANSWER_S": "abc"},
        {},
        ["COMPOSER_SLOW_ANSWER_S='abc'", "seconds > 0"],
    ),
    ("env", PLAN, {"COMPOSER_SLOW_ANSWER_S": "nan"}, {}, ["COMPOSER_SLOW_ANSWER_S='nan'"]),
    ("env", PLAN, {"COMPOSER_NO_CACHE": "maybe"}, {}, ["COMPOSER_NO_CACHE='maybe'", "1 or 0"]),
    ("env", PLAN, {"COMPOSER_NATIVE_LOG": "loud"}, {}, ["COMPOSER_NATIVE_LOG='loud'", "1 or 0"]),
    ("env", PLAN, {"COMPOSER_CACHE_DIR": LONG_NAME}, {}, ["COMPOSER_CACHE_DIR='nnn", "too long"]),
    (
        "env",
        PLAN,
        {"COMPOSER_ET_RUNNER": "no-such-runner"},
        {},
        ["$COMPOSER_ET_RUNNER is 'no-such-runner'", "no executable file", "unset it"],
    ),
    ("env", ["cache", "info"], {"COMPOSER_CACHE_SIZE": "2X"}, {}, ["COMPOSER_CACHE_SIZE='2X'"]),
    (
        "config",
        ["plan", "zoo:mlp"],
        {},
        {"composer.toml": b'backends = ["xnn\xffpack"]\n'},
        ["composer.toml", "not UTF-8", "byte 16", "save it so"],
    ),
    (
        "config",
        ["plan", "zoo:mlp"],
        {},
        {"pyproject.toml": b'[tool.composer]\nbackends = ["\xe9"]\n'},
        ["pyproject.toml", "not UTF-8"],
    ),
    (
        "config",
        PLAN,
        {},
        {"pyproject.toml": b"tool = 3\n"},
        ["pyproject.toml: tool must be a table", "not 3"],
    ),
    (
        "config",
        ["plan", "zoo:mlp", "--config", "pyproject.toml"],
        {},
        {"pyproject.toml": b'[tool]\ncomposer = "x"\n'},
        ["tool.composer must be a table", "[tool.composer] section", "not 'x'"],
    ),
    (
        "config",
        ["plan", "zoo:mlp"],
        {},
        {"composer.toml": b"backends = ['xnnpack']\nthreads = 1e9\n"},
        ["threads must be a whole number from 1 to 1024", "not 1000000000.0"],
    ),
    (
        "manifest",
        ["sweep", "models.txt", "--stacks", "xnnpack", "--results", "r.jsonl"],
        {},
        {"models.txt": b"zoo:ml\xffp\n"},
        ["the manifest models.txt", "not UTF-8", "b'\\xff'", "save it as UTF-8"],
    ),
    (
        "manifest",
        ["sweep", "m.txt", "--stacks", "xnnpack", "--results", "r.jsonl"],
        {},
        {},
        ["no such manifest: m.txt"],
    ),
    (
        "flag",
        [*PLAN, "--threads", "10000000000"],
        {},
        {},
        ["--threads", "from 1 to 1024", "'10000000000'"],
    ),
    (
        "flag",
        [*SWEEP, "--ray", "head:99999"],
        {},
        {},
        ["--ray 'head:99999' is no Ray address", "port from 1 to 65535"],
    ),
    ("flag", [*SWEEP, "--ray", "head"], {}, {}, ["--ray 'head' is no Ray address"]),
    (
        "path",
        ["lower", "zoo:mlp", "--backends", "xnnpack", "-o", "outdir/"],
        {},
        {},
        ["-o/--output", "'outdir/' ends in a separator", "name the file", "outdir/model.pte"],
    ),
    ("path", [*LOWER, "--report", "plans/"], {}, {}, ["--report", "e.g. plans/plan.html"]),
    (
        "path",
        ["lower", "zoo:mlp", "--backends", "xnnpack", "-o", LONG_NAME + ".pte"],
        {},
        {},
        ["-o/--output", "'nnnnn", "more characters", "name a shorter path"],
    ),
    (
        "path",
        ["lower", "zoo:mlp", "--backends", "xnnpack", "-o", LONG_PATH],
        {},
        {},
        ["-o/--output", "longer than this system allows"],
    ),
    ("path", [*PLAN, "--config", LONG_NAME + ".toml"], {}, {}, ["--config", "name a shorter"]),
    (
        "path",
        ["plan", LONG_NAME + ".pt2", "--backends", "xnnpack"],
        {},
        {},
        ["argument model", "longer than this system allows"],
    ),
    ("path", ["run", LONG_NAME + ".pte"], {}, {}, ["argument program", "name a shorter path"]),
    (
        "path",
        ["sweep", LONG_NAME + ".txt", "--stacks", "xnnpack"],
        {},
        {},
        ["argument models", "name a shorter path"],
    ),
    (
        "path",
        ["sweep", "zoo:mlp", "--stacks", "xnnpack", "--results", "out/"],
        {},
        {},
        ["--results", "e.g. out/sweep.jsonl"],
    ),
    (
        "size",
        [*PLAN, "--dynamic", "0=1..99999999999999999999"],
        {},
        {},
        ["--dynamic '0=1..99999999999999999999'", "at most 2,147,483,647", "smaller MAX"],
    ),
    ("size", [*PLAN, "--dynamic", "0=1..4294967296"], {}, {}, ["--dynamic '0=1..4294967296'"]),
]


def _id(row) -> str:
    kind, argv, env, files, _ = row
    what = next(iter(env), None) or next(iter(files), None) or " ".join(argv[-2:])
    return f"{kind}:{what[:40]}"


def run_cli(argv) -> int:
    """``composer ARGV`` in this process: its exit status (argparse's errors exit)."""
    try:
        return main(list(argv))
    except SystemExit as exited:
        return int(exited.code or 0)


@pytest.mark.parametrize(("kind", "argv", "env", "files", "wanted"), ROWS, ids=map(_id, ROWS))
def test_a_bad_value_is_one_line_and_exit_2_with_nothing_written(
    tmp_path, capsys, monkeypatch, kind, argv, env, files, wanted
):
    monkeypatch.chdir(tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    code = run_cli(argv)
    out, err = capsys.readouterr()
    assert_one_line_error(code, err, *wanted)
    assert "Traceback" not in out
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(files), kind


@contextlib.contextmanager
def files_at_most(limit: int) -> Iterator[None]:
    """Within it, a file may grow to ``limit`` bytes and no further: a write beyond fails with
    EFBIG, as one on a full disk fails with ENOSPC (SIGXFSZ, sent first, is ignored)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def test_a_full_disk_while_saving_a_program_and_report_is_one_line_and_nothing_written(tmp_path):
    model, inputs = zoo.load("mlp")
    composition = composer.compose(model, "xnnpack", inputs, check=False)
    report = {tmp_path / "plan.json": composition.plan.to_json().encode()}
    assert len(composition.buffer) > 4096
    with files_at_most(4096), pytest.raises(ComposerError) as raised:
        composition.save(tmp_path / "out.pte", extra=report)
    (line,) = str(raised.value).splitlines()
    assert f"cannot write {tmp_path / 'out.pte'} ({len(composition.buffer):,} bytes)" in line
    assert "File too large; no file was changed. Free space there" in line
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_while_writing_sweep_results_keeps_the_records_before(tmp_path):
    # /dev/full takes the open and an empty write; every byte after is "No space left".
    results = ResultsFile("/dev/full", resume=False)
    with pytest.raises(ComposerError) as raised:
        results.write({"model": "zoo:mlp", "stack": "xnnpack", "ok": True})
    (line,) = str(raised.value).splitlines()
    assert "cannot write the results to /dev/full: No space left on device" in line
    assert "then run the same command with --resume" in line


# Values as a careless or hostile user sets them: numbers of every form, words, blanks,
# control characters, very long text.
TEXT = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        [
            "inf",
            "-inf",
            "nan",
            "1e999",
            "0",
            "-0",
            "1K",
            "2G",
            "0x10",
            " 5 ",
            "1_000",
            "true",
            "FALSE",
            "yes",
            "Off",
            "٣",
            "5s",
            "x" * 5000,
        ]
    ),
).filter(lambda text: "\x00" not in text)


# A guard of docs/promises.md, in the default suite: 300 examples take about 2 s.
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(name=st.sampled_from(sorted(environment.READERS)), value=TEXT)
def test_fuzz_every_environment_variable_value_is_taken_or_refused_in_one_line(name, value):
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        try:
            environment.READERS[name]()
        except ComposerError as error:
            (line,) = str(error).splitlines() or [""]
            assert name in line and "unset it" in line, line
    finally:
        if saved is None:
            del os.environ[name]
        else:
            os.environ[name] = saved


TOML_VALUE = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1).map(str),
    st.floats().map(repr),
    st.booleans().map(lambda b: str(b).lower()),
    st.text(max_size=20).map(lambda t: '"' + t.replace("\\", "\\\\").replace('"', '\\"') + '"'),
    st.sampled_from(["[]", "[1, 2]", '["xnnpack"]', "{}", "{ x = 1 }", "[[1]]", '"x"']),
)
KEYS = [
    "backends",
    "threads",
    "placement",
    "tune_budget",
    "repair_time",
    "keep_whole",
    "consolidate",
    "options",
    "min_partition_size",
    "never",
    "tool",
    "nonsense",
]


# A guard of docs/promises.md, in the default suite: 300 examples take about 2 s.
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    where=st.sampled_from(["composer.toml", "pyproject.toml"]),
    fields=st.dictionaries(st.sampled_from(KEYS), TOML_VALUE, max_size=4),
    junk=st.binary(max_size=8),
    table=st.booleans(),
)
def test_fuzz_every_config_value_is_taken_or_refused_in_one_line(
    tmp_path_factory, where, fields, junk, table
):
    folder = tmp_path_factory.mktemp("config")
    # pyproject.toml's keys go under [tool.composer], or at its top (``tool = 3``)
    head = "[tool.composer]\n" if where == "pyproject.toml" and table else ""
    body = "".join(f"{key} = {value}\n" for key, value in fields.items())
    path = folder / where
    path.write_bytes((head + body).encode() + junk)
    try:
        stack_from(path, backends=None if "backends" in fields else "xnnpack")
    except ComposerError as error:
        (line,) = str(error).splitlines()
        assert line.strip(), error
