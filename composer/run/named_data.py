"""A program's named data: the blobs ExecuTorch stores by key in the .pte and its .ptd files
(a backend's weights kept apart from its processed bytes, a compiled .so)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping


def ptd_named_data(data: bytes) -> dict[str, bytes]:
    """The named-data blobs of one .ptd file's contents, by key."""
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    payload = FlatTensorSerializer().deserialize(data)
    return {key: bytes(payload.buffers[e.buffer_index]) for key, e in payload.named_data.items()}


def named_data(buffer: bytes, data_files: Mapping[str, bytes]) -> dict[str, bytes]:
    """Every named-data blob of a program, by key: the .pte's own and each .ptd's."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    found: dict[str, bytes] = {}
    stored = deserialize_pte_binary(buffer).named_data
    if stored is not None:
        for key, entry in stored.pte_data.items():
            found[key] = bytes(stored.buffers[entry.buffer_index])
    for data in data_files.values():
        found.update(ptd_named_data(data))
    return found


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
