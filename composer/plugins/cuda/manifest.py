"""The CUDA delegate's manifest: what ExecuTorch 1.5.1's ``CudaBackend`` stores as a delegate's
processed bytes (``ETCUDAFQN3``, written by ``backends/cuda/cuda_weight_collector.py``): the key
of its AOTInductor ``.so`` and, per weight, where its bytes live in the named data (.pte or .ptd)
and how to view them. A private ExecuTorch format that this module pins: a change raises
:class:`ManifestFormatError`.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping

import attrs
import torch

from composer.contract.errors import ComposerError

CUDA_BACKEND_ID = "CudaBackend"
MANIFEST_MAGIC = b"ETCUDAFQN3"
# ExecuTorch ScalarType values (equal to c10's) that the manifest reader accepts.
MANIFEST_DTYPES = {
    0: torch.uint8,
    1: torch.int8,
    2: torch.int16,
    3: torch.int32,
    4: torch.int64,
    5: torch.float16,
    6: torch.float32,
    11: torch.bool,
    15: torch.bfloat16,
}
MANIFEST_DEVICES = {0: "cpu", 1: "cuda"}
_ENTRY_FIXED = struct.Struct("<QiiqI")  # storage_nbytes, dtype, device_type, offset, ndim


class ManifestFormatError(ComposerError):
    """A CudaBackend delegate's processed bytes are not the manifest format composer reads."""


def _format_error(expected: str, found: str) -> ManifestFormatError:
    return ManifestFormatError(
        "ExecuTorch's private CudaBackend manifest format changed (or this is not a CudaBackend "
        f"delegate): expected {expected}, found {found}. composer reads the format ExecuTorch "
        "1.5.1 writes (backends/cuda/cuda_weight_collector.py:encode_cuda_weight_metadata); "
        "update composer/plugins/cuda/manifest.py:parse_manifest for this ExecuTorch."
    )


@attrs.frozen
class WeightEntry:
    """One constant of a compiled delegate: where its bytes live and how to view them."""

    fqn: str
    storage_key: str  # named-data key of its storage, in the .ptd
    storage_nbytes: int
    dtype: torch.dtype
    device: str  # "cpu" or "cuda"
    storage_offset: int  # in elements
    sizes: tuple[int, ...]
    strides: tuple[int, ...]


@attrs.frozen
class Manifest:
    """A CudaBackend delegate's processed bytes: its .so's named-data key and its weights."""

    so_blob_key: str
    entries: tuple[WeightEntry, ...]


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, size: int, what: str) -> bytes:
        if self.at + size > len(self.data):
            raise _format_error(
                f"{what} ({size} bytes) at byte {self.at}",
                f"only {len(self.data) - self.at} bytes left of {len(self.data)}",
            )
        chunk = self.data[self.at : self.at + size]
        self.at += size
        return chunk

    def unpack(self, layout: str, what: str) -> tuple:
        return struct.unpack(layout, self.take(struct.calcsize(layout), what))

    def string(self, what: str) -> str:
        (size,) = self.unpack("<I", f"the length of {what}")
        raw = self.take(size, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _format_error(f"{what} as UTF-8", repr(raw[:40])) from None


def parse_manifest(data: bytes) -> Manifest:
    """Read a CudaBackend delegate's processed bytes (ExecuTorch 1.5.1's ``ETCUDAFQN3``).

    Strict like ExecuTorch's own C++ reader: any difference raises ManifestFormatError.
    """
    data = bytes(data)
    if not data.startswith(MANIFEST_MAGIC):
        raise _format_error(f"the magic {MANIFEST_MAGIC!r}", repr(data[:16]))
    reader = _Reader(data)
    reader.take(len(MANIFEST_MAGIC), "magic")
    so_blob_key = reader.string("the .so key")
    if not so_blob_key:
        raise _format_error("a non-empty .so key", "an empty one")
    (count,) = reader.unpack("<I", "the weight count")
    entries = []
    for index in range(count):
        what = f"weight {index} of {count}"
        fqn = reader.string(f"the name of {what}")
        storage_key = reader.string(f"the storage key of {what}")
        nbytes, dtype, device, offset, ndim = reader.unpack(_ENTRY_FIXED.format, what)
        if dtype not in MANIFEST_DTYPES:
            raise _format_error(f"a dtype code in {sorted(MANIFEST_DTYPES)} for {fqn!r}", dtype)
        if device not in MANIFEST_DEVICES:
            raise _format_error(f"a device code 0 or 1 for {fqn!r}", device)
        sizes = reader.unpack(f"<{ndim}q", f"the sizes of {fqn!r}")
        strides = reader.unpack(f"<{ndim}q", f"the strides of {fqn!r}")
        if offset < 0 or min(sizes + strides, default=0) < 0 or not fqn or not storage_key:
            raise _format_error(f"non-negative metadata for {fqn!r}", f"{sizes}, {strides}")
        entries.append(
            WeightEntry(
                fqn,
                storage_key,
                nbytes,
                MANIFEST_DTYPES[dtype],
                MANIFEST_DEVICES[device],
                offset,
                sizes,
                strides,
            )
        )
    if reader.at != len(data):
        raise _format_error("the end of the manifest", f"{len(data) - reader.at} more bytes")
    return Manifest(so_blob_key, tuple(entries))


def cuda_manifests(buffer: bytes) -> list[Manifest]:
    """The manifest of every CudaBackend delegate in a .pte, in delegate order."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(buffer).program
    return [
        parse_manifest(program.backend_delegate_data[delegate.processed.index].data)
        for plan in program.execution_plan
        for delegate in plan.delegates
        if delegate.id == CUDA_BACKEND_ID
    ]


def missing_weights(manifest: Manifest, data: Mapping[str, bytes]) -> list[str]:
    """What of a delegate's .so and weights is not in ``data`` with the size it should have."""
    problems = [] if manifest.so_blob_key in data else [f"{manifest.so_blob_key}: no .so"]
    for entry in manifest.entries:
        if entry.storage_key not in data:
            problems.append(f"{entry.storage_key}: not in the named data")
        elif len(data[entry.storage_key]) != entry.storage_nbytes:
            problems.append(
                f"{entry.storage_key}: {len(data[entry.storage_key])} bytes, manifest says "
                f"{entry.storage_nbytes}"
            )
    return problems


def weights_check(buffer: bytes, data: Mapping[str, bytes]) -> list[list[str]]:
    """Per CudaBackend delegate of a .pte: which of its .so and weights are missing or the
    wrong size in the program's named ``data`` (the .pte's and its .ptd files'). Empty lists:
    all there."""
    return [missing_weights(manifest, data) for manifest in cuda_manifests(buffer)]
