"""Run an ExecuTorch program in ExecuTorch's own C++ runtime, from Python.

The runtime is ``composer_et_runner`` (``bench/et_runtime/runner/runner.cpp``, built by
``bench/et_runtime/build.sh`` on the GPU machine, with the CUDA and XNNPACK backends): it loads
a ``.pte`` and its ``.ptd`` data files with ``extension/module``, runs one method on inputs this
module writes, and prints its per-call times as one JSON line. ``$COMPOSER_ET_RUNNER`` names
the built runner; where it is set, ``Composition.verify()``, the proof at compose time and
``composer run`` run programs with CUDA delegates in it (the pip runtime has no CUDA backend).

    outputs, seconds = run_pte(runner, "m.pte", ["aoti_cuda_blob.ptd"], (x,), repeats=50)

The tensor file both sides read and write (little-endian):
``b"ETRUNIO1" | u32 count | count x (i32 dtype | u32 ndim | i64 sizes[ndim] | u64 nbytes |
data)``, dtype being ExecuTorch's ScalarType code (that of c10), data contiguous.
"""

from __future__ import annotations

import json
import os
import re
import signal
import struct
import subprocess
import tempfile
from collections.abc import Mapping, Sequence

import torch

from composer.contract import environment
from composer.contract.errors import ComposerError
from composer.contract.machine import KilledChild
from composer.lower.atomic import ptd_name
from composer.lower.runtime_kernels import RUNNER_VARIABLE

MAGIC = b"ETRUNIO1"
EXECUTOR = "ExecuTorch C++ runtime"
# ExecuTorch ScalarType codes (equal to c10's).
DTYPES = {
    0: torch.uint8,
    1: torch.int8,
    2: torch.int16,
    3: torch.int32,
    4: torch.int64,
    5: torch.float16,
    6: torch.float32,
    7: torch.float64,
    11: torch.bool,
    15: torch.bfloat16,
}
CODES = {dtype: code for code, dtype in DTYPES.items()}


class RunnerError(RuntimeError):
    """The runner could not load or run the program; the message names the operators it found
    no kernel for (``missing_kernels``) and the errors it logged, then has its stderr's end."""


class RunnerKilled(RunnerError, KilledChild):
    """The runner was killed (SIGKILL: the kernel's out-of-memory killer, as a rule): the
    machine's doing, not the program's."""


# ExecuTorch's registry logs "kernel 'aten::foo.out' not found." before the method's
# "Missing operator: [3] aten::foo.out" (error 20 at load): the lines that say what to fix,
# often thousands of characters before the end of stderr.
_MISSING = re.compile(r"kernel '([^']+)' not found|Missing operator: \[\d+\] (\S+)")


def errors_logged(stderr: str, most: int = 4) -> list[str]:
    """The last ``most`` error (and fatal) lines ExecuTorch's runtime logged ("E 00:00:00.17 executorch:
    tensor_impl.cpp:135] Attempted to resize a static tensor..."), without their prefix: the
    cause of a failed load or call, which the end of stderr (info lines) often is not."""
    lines = []
    for line in stderr.splitlines():
        if line.startswith(("E ", "F ")) and "] " in line:  # errors, and fatal ones (aborts)
            lines.append(line.split("] ", 1)[1].strip())
    return list(dict.fromkeys(lines))[-most:]


# What to do about an op no delegate of a program took and ExecuTorch's portable kernels cannot
# run (they lack it, or refuse its inputs): said alike wherever a runtime refuses one.
NO_KERNEL_ADVICE = "add a backend that takes it to the stack, or change the model to avoid it"


def no_kernel(missing: Sequence[str]) -> str:
    """Why a runtime refuses a program that keeps ``missing`` (operators, from
    :func:`missing_kernels`) outside its delegates, and what to do: one text for the pip
    runtime and the C++ runner."""
    return (
        f"it has no kernel for {', '.join(missing)}, and no delegate of the program runs it "
        f"(ExecuTorch's portable kernels lack it). {NO_KERNEL_ADVICE.capitalize()}"
    )


def missing_kernels(stderr: str) -> list[str]:
    """The operators ``stderr`` of a failed load says the runtime has no kernel for."""
    found = (a or b for a, b in _MISSING.findall(stderr))
    return list(dict.fromkeys(found))


def write_tensors(path: str | os.PathLike, tensors: Sequence[torch.Tensor]) -> None:
    """Write ``tensors`` (any device; copied to the CPU) in the runner's tensor file format."""
    with open(path, "wb") as out:
        out.write(MAGIC + struct.pack("<I", len(tensors)))
        for tensor in tensors:
            tensor = tensor.detach().to("cpu").contiguous()
            if tensor.dtype not in CODES:
                raise TypeError(f"the runner's file format has no {tensor.dtype}")
            raw = tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
            out.write(struct.pack("<iI", CODES[tensor.dtype], tensor.dim()))
            out.write(struct.pack(f"<{tensor.dim()}q", *tensor.shape))
            out.write(struct.pack("<Q", len(raw)))
            out.write(raw)


def read_tensors(path: str | os.PathLike) -> list[torch.Tensor | None]:
    """Read a tensor file; a non-tensor output reads as ``None``."""
    with open(path, "rb") as file:
        data = file.read()
    if data[:8] != MAGIC:
        raise RunnerError(f"{path} is not a tensor file of the runner")
    (count,), at = struct.unpack_from("<I", data, 8), 12
    tensors: list[torch.Tensor | None] = []
    for _ in range(count):
        code, ndim = struct.unpack_from("<iI", data, at)
        at += 8
        sizes = struct.unpack_from(f"<{ndim}q", data, at)
        at += 8 * ndim
        (nbytes,) = struct.unpack_from("<Q", data, at)
        at += 8
        raw = data[at : at + nbytes]
        at += nbytes
        if code < 0:
            tensors.append(None)
        elif nbytes == 0:
            tensors.append(torch.empty(sizes, dtype=DTYPES[code]))
        else:
            flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(DTYPES[code])
            tensors.append(flat.reshape(sizes))
    return tensors


def run_pte_detailed(
    runner: str | os.PathLike,
    pte: str | os.PathLike,
    data_files: Sequence[str | os.PathLike],
    inputs: Sequence[torch.Tensor] | None,
    repeats: int = 20,
    warmup: int = 3,
    threads: int | None = None,
    method: str = "forward",
    timeout: float = 600,
    steps: Sequence[Sequence[torch.Tensor]] = (),
    mempool_keep: bool = False,
) -> dict:
    """Run ``method`` of ``pte`` ``warmup + repeats`` times in the runner (``inputs`` None: not
    at all); return its outputs (CPU tensors), the seconds of each timed call, load times and
    the runner's stderr. ``steps``: inputs run once each, in order, before the timed calls, in
    the same loaded program (state it keeps carries over); their outputs are
    ``report["step_outputs"]``. ``mempool_keep``: the CUDA memory pool keeps freed memory."""
    with tempfile.TemporaryDirectory(prefix="et_runner_") as directory:
        inputs_path = os.path.join(directory, "inputs.bin")
        outputs_path = os.path.join(directory, "outputs.bin")
        command = [os.fspath(runner), "--model", os.fspath(pte), "--method", method,
                   "--warmup", str(warmup), "--repeats", str(repeats)]  # fmt: skip
        if inputs is not None:
            write_tensors(inputs_path, inputs)
            command += ["--inputs", inputs_path, "--outputs", outputs_path]
        step_paths = []
        for index, step in enumerate(steps):
            step_paths.append((os.path.join(directory, f"step{index}.in"),
                               os.path.join(directory, f"step{index}.out")))  # fmt: skip
            write_tensors(step_paths[-1][0], step)
            command += ["--step", *step_paths[-1]]
        for data_file in data_files:
            command += ["--data", os.fspath(data_file)]
        if threads:
            command += ["--threads", str(threads)]
        if mempool_keep:
            command += ["--mempool-keep"]
        done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=timeout)
        report = None
        for line in done.stdout.splitlines():
            if line.startswith("{"):
                report = json.loads(line)
        if done.returncode == -signal.SIGKILL:
            raise RunnerKilled(f"{runner} was killed (SIGKILL); stderr ends: {done.stderr[-300:]}")
        if done.returncode != 0 or report is None or not report.get("ok"):
            why = report.get("error") if report else f"exit status {done.returncode}"
            missing = missing_kernels(done.stderr)
            if missing:
                why += f" ({no_kernel(missing)})"
            said = errors_logged(done.stderr)
            if said:
                why += f"; it logged: {' | '.join(said)}"
            raise RunnerError(f"{why}; stderr ends: {done.stderr[-3000:]}")
        report["outputs"] = read_tensors(outputs_path) if inputs is not None else None
        report["step_outputs"] = [read_tensors(out) for _, out in step_paths]
    report["seconds"] = report.pop("times_s")
    report["stderr"] = done.stderr
    report["command"] = command
    return report


def run_pte(
    runner: str | os.PathLike,
    pte: str | os.PathLike,
    data_files: Sequence[str | os.PathLike],
    inputs: Sequence[torch.Tensor],
    repeats: int = 20,
    **options,
) -> tuple[list[torch.Tensor | None], list[float]]:
    """(outputs as CPU tensors, seconds of each timed call) of ``pte`` run in ExecuTorch's C++
    runtime; ``options`` as :func:`run_pte_detailed`."""
    report = run_pte_detailed(runner, pte, data_files, inputs, repeats, **options)
    return report["outputs"], report["seconds"]


def runner_path() -> str | None:
    """The runner ``$COMPOSER_ET_RUNNER`` names (``None`` where it is unset); a ComposerError
    where it names no executable file."""
    return environment.executable(RUNNER_VARIABLE, environment.RUNNER_HOW)


class RunnerProgram:
    """A program (``buffer`` and its .ptd ``data_files``) written where the runner loads it, a
    folder kept while this lives: each call of :meth:`report` loads it afresh (state it keeps
    starts as written); ``threads``: XNNPACK's."""

    def __init__(
        self,
        runner: str,
        buffer: bytes,
        data_files: Mapping[str, bytes],
        threads: int | None = None,
        method: str = "forward",
    ) -> None:
        self.runner, self.threads, self.method = runner, threads, method
        self._folder = tempfile.TemporaryDirectory(prefix="composer_pte_")
        self.pte = os.path.join(self._folder.name, "program.pte")
        with open(self.pte, "wb") as out:
            out.write(buffer)
        self.data_files = []
        for name, data in data_files.items():
            self.data_files.append(os.path.join(self._folder.name, ptd_name(name)))
            with open(self.data_files[-1], "wb") as out:
                out.write(data)

    def report(self, inputs: Sequence[torch.Tensor], repeats: int = 1, warmup: int = 0) -> dict:
        """:func:`run_pte_detailed` of this program; a ComposerError where the runner fails."""
        try:
            return run_pte_detailed(self.runner, self.pte, self.data_files, list(inputs),
                                    repeats=repeats, warmup=warmup, threads=self.threads,
                                    method=self.method)  # fmt: skip
        except RunnerError as error:
            raise ComposerError(f"{EXECUTOR} ({self.runner}) failed: {error}") from error

    def run(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor | None]:
        """The outputs of one call."""
        return self.report(inputs)["outputs"]

    def close(self) -> None:
        self._folder.cleanup()


def run_program(
    runner: str,
    buffer: bytes,
    data_files: Mapping[str, bytes],
    inputs: Sequence[torch.Tensor],
    threads: int | None = None,
    method: str = "forward",
) -> list[torch.Tensor | None]:
    """The outputs of one call of ``method`` of ``buffer`` (with its .ptd ``data_files``) in the
    runner, from a freshly loaded program (state it keeps starts as written); ``threads``:
    XNNPACK's."""
    program = RunnerProgram(runner, buffer, data_files, threads, method)
    try:
        return program.run(inputs)
    finally:
        program.close()
