"""A program's named data: the blobs ExecuTorch stores by key in the .pte and its .ptd files
(a backend's weights kept apart from its processed bytes, a compiled .so)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any


def ptd_named_data(data: bytes) -> dict[str, bytes]:
    """The named-data blobs of one .ptd file's contents, by key."""
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    payload = FlatTensorSerializer().deserialize(data)
    return {key: bytes(payload.buffers[e.buffer_index]) for key, e in payload.named_data.items()}


def named_data(buffer: bytes, data_files: Mapping[str, bytes]) -> dict[str, bytes]:
    """Every named-data blob of a program, by key: the .pte's own and each .ptd's."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    found = stored_blobs(deserialize_pte_binary(buffer).named_data)
    for data in data_files.values():
        found.update(ptd_named_data(data))
    return found


def stored_blobs(stored: Any) -> dict[str, bytes]:
    """The blobs of a named-data store by key (a deserialized program's ``named_data``, or a
    lowered delegate's ``NamedDataStoreOutput``: both keep ``buffers`` and ``pte_data``, and
    the latter ``external_data`` for .ptd files too); empty for ``None``."""
    if stored is None:
        return {}
    entries = [stored.pte_data, *getattr(stored, "external_data", {}).values()]
    return {key: bytes(stored.buffers[e.buffer_index]) for d in entries for key, e in d.items()}


class LazyNamedData(Mapping[str, bytes]):
    """:func:`named_data`, read on first use: most delegates' runtimes never look."""

    def __init__(self, buffer: bytes, data_files: Mapping[str, bytes]) -> None:
        self._buffer, self._data_files = buffer, data_files
        self._read: dict[str, bytes] | None = None

    def _all(self) -> dict[str, bytes]:
        if self._read is None:
            self._read = named_data(self._buffer, self._data_files)
        return self._read

    def __getitem__(self, key: str) -> bytes:
        return self._all()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())
