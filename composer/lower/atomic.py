"""Writing the files of one run (.pte, .ptd, report) so that all of them appear or none does.

Each file goes to a temporary beside its target first; the renames then run with interrupts
held back, under a lock on the program's directory (two runs writing the same paths do not
interleave), and a rename that fails puts back what the earlier ones replaced. What this
cannot cover is the machine dying between two renames: rename is atomic per file only.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import stat
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from composer.contract.errors import ComposerError

# Temporaries and backups carry their writer's pid: a later save removes those whose writer
# died (SIGKILL, a power cut) and, should the pid live on in another process, old ones.
_OURS = re.compile(r"^\..+\.composer-(\d+)\.[^.]+\.(tmp|previous)$")
STALE_S = 24 * 3600


def ptd_name(name: str) -> str:
    """The file name of a program's external tensor data ``name`` (as ExecuTorch names it, with
    or without ``.ptd``): what the runtime looks for beside the .pte."""
    return name if name.endswith(".ptd") else f"{name}.ptd"


def check_writable(paths: Sequence[Path]) -> None:
    """Refuse, before any work starts, output paths that cannot be written as regular files.

    Each directory is probed by creating (and removing) a file in it: permission bits say
    nothing for root, and a read-only or special file system refuses only when asked.
    """
    seen: dict[str, Path] = {}
    for path in paths:
        key = os.path.join(os.path.realpath(path.parent), path.name)
        if key in seen:
            raise ComposerError(
                f"{path} is named twice as an output (also as {seen[key]}); one would "
                "overwrite the other. Give each output its own path."
            )
        seen[key] = path
        _check_target(path)
    probed: set[str] = set()
    for path in paths:
        directory = os.path.realpath(path.parent)
        if directory not in probed:
            probed.add(directory)
            Path(_write_temporary(path, b"")).unlink()


def check_not_inputs(outputs: Sequence[Path], inputs: Sequence[Path]) -> None:
    """Refuse an output that is one of the run's input files (by any name or link)."""
    for output in outputs:
        for source in inputs:
            if _same_file(output, source):
                raise ComposerError(
                    f"{output} is the input {source}: writing it would destroy what this "
                    "command reads. Name another output file."
                )


FORCE_FLAG = (
    "composer replaces only its own outputs: name a new file, or pass --force to replace it."
)
FORCE_ARGUMENT = (
    "composer replaces only its own outputs: name a new file, or pass force=True to replace it."
)


def check_outputs(
    outputs: Sequence[tuple[Path, str]], inputs: Sequence[Path] = (), *, force: bool = False,
    remedy: str = FORCE_ARGUMENT,
) -> None:  # fmt: skip
    """Refuse, before any work starts, what one command would write wrongly: an output that
    is one of its inputs, two outputs of one path, a path that cannot be written, and (unless
    ``force``) an existing file that is not composer's own output of the kind it would be
    replaced by (``outputs``: each path with a kind of ``OUTPUT_KINDS``). ``remedy`` ends the
    line of that last refusal: how the user goes on."""
    paths = [path for path, _ in outputs]
    check_not_inputs(paths, inputs)
    check_writable(paths)
    check_owned(outputs, force=force, remedy=remedy)


def check_owned(
    outputs: Sequence[tuple[Path, str]], *, force: bool = False, remedy: str = FORCE_ARGUMENT
) -> None:
    """``check_ours`` for each output and its kind, unless ``force``."""
    if not force:
        for path, kind in outputs:
            check_ours(path, kind, remedy)


def output_kinds(program: Path, files: Iterable[Path]) -> list[tuple[Path, str]]:
    """Each file a program's save writes with its kind: the program, its tensor data (.ptd),
    and its reports."""
    return [
        (path, "program" if path == program else "data" if path.suffix == ".ptd" else "report")
        for path in files
    ]


def check_ours(path: Path, kind: str, remedy: str = FORCE_ARGUMENT) -> None:
    """Refuse to replace ``path`` unless it is absent, empty where composer writes empty files,
    or composer's own output of ``kind`` (recognized by its content, not its name): a model's
    source, a config or a user's notes are never overwritten without being told to."""
    what, recognized, whole_file = OUTPUT_KINDS[kind]
    try:
        if not stat.S_ISREG(path.lstat().st_mode):
            return  # a link, a folder, a device: check_writable refuses those
        with open(path, "rb") as file:
            data = file.read() if whole_file else file.read(_HEAD_BYTES)
    except FileNotFoundError:
        return
    except OSError as error:
        raise ComposerError(f"cannot read {path} to see what it is: {error.strerror}.") from error
    if not recognized(data):
        raise ComposerError(f"{path} exists and is not {what} composer wrote; {remedy}")


# An HTML page composer writes says so in its head; the kind tells a plan report from a
# sweep's page, so that neither replaces the other.
def html_marker(kind: str) -> str:
    """The ``<meta>`` tag that marks an HTML page as composer's output of ``kind``."""
    return f'<meta name="generator" content="composer {kind}">'


_HEAD_BYTES = 64 * 1024  # where a program's identifier and an HTML page's marker are

# `composer run --save-outputs` writes torch.save's zip archive with this as the zip's comment
# (its last bytes), which torch.load passes over: a user's own tensors are never replaced.
_OUTPUTS_MARKER = b"composer run outputs"
_END_OF_ZIP = b"PK\x05\x06"  # the end of central directory record: 22 bytes and a comment


def marked_outputs(saved: bytes) -> bytes:
    """``saved`` (torch.save's bytes) marked as composer's outputs, in the zip's comment;
    as it is where it already has a comment."""
    if saved[-22:-18] != _END_OF_ZIP or saved[-2:] != b"\0\0":
        return saved
    return saved[:-2] + len(_OUTPUTS_MARKER).to_bytes(2, "little") + _OUTPUTS_MARKER


def _is_outputs(data: bytes) -> bool:
    return data.startswith(b"PK\x03\x04") and data.endswith(_OUTPUTS_MARKER)


def _is_program(data: bytes) -> bool:
    # An ExecuTorch program is a flatbuffer with the identifier "ET" and a version at 4:8.
    return data[4:6] == b"ET" and data[4:8].isalnum()


def _is_tensor_data(data: bytes) -> bool:
    # ExecuTorch's external tensor data (flat_tensor.fbs): the identifier "FT01" at 4:8.
    return data[4:6] == b"FT" and data[4:8].isalnum()


def _json(data: bytes) -> object:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None


def _has_keys(value: object, *keys: str) -> bool:
    return isinstance(value, dict) and all(key in value for key in keys)


def _marked(data: bytes, kind: str, legacy: bytes) -> bool:
    # Pages written before the marker are known by their first bytes.
    return html_marker(kind).encode() in data or data.startswith(legacy)


def _is_report(data: bytes) -> bool:
    if data.lstrip()[:1] == b"<":
        return _marked(data, "report", b'<!DOCTYPE html>\n<html lang="en"><head><meta charset')
    value = _json(data)
    # a plan's JSON (Plan.to_json), or a program of several methods' (one plan each)
    return _has_keys(value, "backends", "partitions", "fallbacks", "nodes") or _has_keys(
        value, "methods", "constant_methods"
    )


def _is_sweep_page(data: bytes) -> bool:
    return _marked(data, "sweep page", b"<!doctype html><meta charset=utf-8><title>composer sweep")


def _is_results(data: bytes) -> bool:
    """A sweep's records, one JSON object a line with "model" and "stack"; its last line may
    be torn (a killed driver), and an empty file is what a sweep leaves before its first."""
    lines = [line for line in data.splitlines() if line.strip()]
    parsed = [_json(line) for line in lines]
    if any(value is None for value in parsed[:-1]):
        return False
    return not lines or any(_has_keys(value, "model", "stack") for value in parsed)


def _is_golden(data: bytes) -> bool:
    return _has_keys(_json(data), "backends", "ops", "partitions", "delegate_calls")


def _is_suite_report(data: bytes) -> bool:
    # pytest-json-report's file
    return _has_keys(_json(data), "created", "exitcode", "summary")


def _is_suite_table(data: bytes) -> bool:
    # the CSV of ExecuTorch's backend test suite (its CSV_FIELD_NAMES first)
    return data.startswith(b"Test ID,Test Case,")


def _is_pytest_ini(data: bytes) -> bool:
    return data == b"[pytest]\n"


# kind -> (what it is, in words; whether bytes are composer's output of that kind; whether
# that is judged on the whole file rather than its first bytes)
OUTPUT_KINDS = {
    "program": ("an ExecuTorch program (.pte)", _is_program, False),
    "data": ("ExecuTorch tensor data (.ptd)", _is_tensor_data, False),
    "report": ("a plan report", _is_report, True),
    "sweep page": ("a sweep's page", _is_sweep_page, False),
    "results": ("a sweep's results", _is_results, True),
    "golden": ("a golden plan", _is_golden, True),
    "suite report": ("a backend test suite's JSON report", _is_suite_report, True),
    "suite table": ("a backend test suite's table", _is_suite_table, False),
    "pytest ini": ("the suite's pytest.ini", _is_pytest_ini, False),
    "outputs": ("a program's outputs", _is_outputs, True),
}


def _same_file(output: Path, source: Path) -> bool:
    try:
        return os.path.samefile(output, source)
    except OSError:  # an output that does not exist yet is no input
        return False


def _check_target(path: Path) -> None:
    if not path.parent.is_dir():
        raise ComposerError(f"cannot write {path}: the directory {path.parent} does not exist.")
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    except OSError as error:
        raise ComposerError(f"cannot write {path}: {error.strerror}.") from error
    if stat.S_ISLNK(mode):
        raise ComposerError(
            f"cannot write {path}: it is a symbolic link; composer replaces only regular "
            "files. Name the file it points to, or remove the link."
        )
    if stat.S_ISDIR(mode):
        raise ComposerError(f"cannot write {path}: it is a directory. Name a file in it.")
    if not stat.S_ISREG(mode):
        raise ComposerError(
            f"cannot write {path}: it is not a regular file (a device, pipe or socket); "
            "composer replaces only regular files."
        )


class InterruptedAfterWriting(KeyboardInterrupt):
    """Ctrl-C that arrived while the files were being renamed: they were all written."""

    def __init__(self, paths: Sequence[Path]) -> None:
        super().__init__(", ".join(map(str, paths)))
        self.paths = list(paths)


def write_all(files: Mapping[Path, bytes]) -> None:
    """Write every file to a temporary beside it, then rename them all into place.

    A failure or an interrupt leaves the targets as they were: no new file, partial or
    whole, and earlier files of the same names untouched. An interrupt during the renames
    is acted on once they are done (``InterruptedAfterWriting``).
    """
    paths = [Path(path) for path in files]
    check_writable(paths)
    for directory in {path.parent for path in paths}:
        remove_stale_temporaries(directory)
    temporaries: dict[Path, str] = {}
    held: list[int] = []
    renamed = False
    try:
        for path, data in zip(paths, files.values()):
            temporaries[path] = _write_temporary(path, data)
        with _locked(paths[0].parent), _interrupts_held(held):
            if not held:  # interrupted while waiting for the lock: write nothing
                _rename_all(temporaries)
                renamed = True
    finally:
        for temporary in temporaries.values():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
    try:
        for signum in held:
            signal.raise_signal(signum)
    except KeyboardInterrupt as interrupt:
        if renamed:
            raise InterruptedAfterWriting(paths) from interrupt
        raise


def _rename_all(temporaries: Mapping[Path, str]) -> None:
    replaced: list[tuple[Path, str | None]] = []  # target, the backup of what it held
    try:
        for path, temporary in temporaries.items():
            backup = _backup(path) if path.exists() else None
            replaced.append((path, backup))
            os.replace(temporary, path)
    except BaseException as error:
        for path, backup in reversed(replaced):
            if backup is not None:
                os.replace(backup, path)
            else:
                path.unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise ComposerError(
                f"cannot write {error.filename or path}: {error.strerror}; no file was changed."
            ) from error
        raise
    for _, backup in replaced:
        if backup is not None:
            os.unlink(backup)


def _backup(path: Path) -> str:
    """A second name for the file at ``path``, so that a later failure can put it back."""
    backup = str(
        path.parent / f".{path.name}.composer-{os.getpid()}.{secrets.token_hex(4)}.previous"
    )
    try:
        os.link(path, backup)
    except OSError:  # a file system without hard links
        shutil.copy2(path, backup)
    return backup


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``directory`` so two runs' renames do not interleave."""
    handle = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)


@contextlib.contextmanager
def _interrupts_held(held: list[int]) -> Iterator[None]:
    """Collect SIGINT and SIGTERM in ``held`` instead of acting on them, for a moment."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers (and only it gets KeyboardInterrupt)
        return
    previous = {
        sig: signal.signal(sig, lambda signum, frame: held.append(signum))
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def remove_stale_temporaries(directory: Path) -> list[Path]:
    """Remove the temporaries and backups of composer's saves into ``directory`` whose writer
    is dead or that are a day old; returns them."""
    removed = []
    for entry in os.scandir(directory):
        match = _OURS.match(entry.name)
        if match and _stale(entry, int(match.group(1))):
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
    return removed


def _stale(entry: os.DirEntry, pid: int) -> bool:
    try:
        if time.time() - entry.stat(follow_symlinks=False).st_mtime > STALE_S:
            return True
    except OSError:
        return False
    return pid != os.getpid() and not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, but another user's
        return True
    return True


def _umask() -> int:
    # The only portable way to read the umask is to set it; Linux also shows it in /proc.
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _write_temporary(path: Path, data: bytes) -> str:
    try:
        handle, temporary = tempfile.mkstemp(
            dir=path.parent, prefix=f".{path.name}.composer-{os.getpid()}.", suffix=".tmp"
        )
    except OSError as error:
        raise ComposerError(
            f"cannot write {path}: {error.strerror} (in the directory {path.parent})."
        ) from error
    try:
        # mkstemp makes the file private (0600); a written output gets the usual mode.
        os.fchmod(handle, 0o666 & ~_umask())
        with os.fdopen(handle, "wb") as out:
            out.write(data)
    except BaseException as error:
        Path(temporary).unlink(missing_ok=True)
        if isinstance(error, OSError):  # a full disk (ENOSPC), a quota or size limit (EFBIG)
            raise ComposerError(
                f"cannot write {path} ({len(data):,} bytes): {error.strerror}; no file was "
                "changed. Free space there, or write elsewhere."
            ) from error
        raise
    return temporary
