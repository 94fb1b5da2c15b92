"""What native code writes to file descriptor 2, captured: ExecuTorch's runtime logs CPU
probing on every load and the reason for a failure only there; a backend's libraries log on
import (pytorch_tokenizers' "Registering override fallback regex", pulled in by ExecuTorch's
OpenVINO module). Plugins import it from here, the contract, to keep such lines out of a
user's terminal.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator

from composer.contract import environment


class NativeLog:
    """Captures what C++ code writes to file descriptor 2 while the block runs.

    The runtime logs CPU probing and backend loading on every load, and the reason for a
    failure only there: kept out of a user's terminal, and put into the error message instead.
    ``COMPOSER_NATIVE_LOG=1`` lets it through.
    """

    def __init__(self) -> None:
        self.text = ""

    @contextlib.contextmanager
    def capture(self) -> Iterator[NativeLog]:
        if environment.switch(environment.NATIVE_LOG):
            yield self
            return
        sys.stderr.flush()
        saved = os.dup(2)
        with tempfile.TemporaryFile() as sink:
            os.dup2(sink.fileno(), 2)
            try:
                # The pip runtime logs through Python's sys.stderr, not the descriptor: under
                # pytest's capture (composer's pytest plugin) the reason went to pytest.
                with (
                    open(2, "w", closefd=False) as descriptor,
                    contextlib.redirect_stderr(descriptor),
                ):
                    yield self
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                sink.seek(0)
                self.text = sink.read().decode(errors="replace")

    def because(self) -> str:
        """`` (runtime log: ...)`` with :meth:`reasons`, to end an error message; or nothing."""
        reasons = self.reasons()
        return f" (runtime log: {reasons})" if reasons else ""

    def reasons(self) -> str:
        """The log lines that say what went wrong (errors and warnings), one line."""
        lines = [line.strip() for line in self.text.splitlines() if line.strip()]
        # After a kernel fails, the runtime lists its arguments' type ids, a line each: they
        # pushed the lines that say which kernel failed, and why, out of the last three.
        wanted = [
            ln
            for ln in lines
            if "cpuinfo" not in ln and "loaded successfully" not in ln and not _ARG_TYPE.search(ln)
        ]
        return " | ".join(wanted[-3:])


_ARG_TYPE = re.compile(r"\] arg \d+ with type id \d+$")
