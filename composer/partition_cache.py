"""Lowered partitions reused by content: a backend compiles only partitions it has not seen.

ExecuTorch finds a backend by class name among ``BackendDetails`` subclasses, in
``backend_api.lower_all_submodules_to_backend``, and hands its ``preprocess_multimethod`` every
partition that backend took; there is no hook to answer from elsewhere. So for the length of
one lowering (``reusing``), composer wraps that function, and inside it the classmethod of the
backend class it finds (a plugin may import that class only while partitioning), and restores
both after. The wrapper digests each partition (its edge
subgraph with shapes, dtypes, debug handles and the bytes of the constants it owns), the
compile specs, the backend's code and the versions that lower it (``composer.fingerprint``);
a hit returns the stored ``PreprocessResult`` (processed bytes, named data, debug handle map)
instead of calling ``preprocess``.

The unit of reuse is one partition when the backend keeps ExecuTorch's default
``preprocess_multimethod`` (each partition compiled on its own), and the whole call when the
backend overrides it: CudaBackend, for one, gathers every partition's weights into one store.
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Callable, Iterator, Mapping

import attrs
from executorch.exir.backend import backend_api
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult

from composer.cache import Store
from composer.fingerprint import Unfingerprintable, code_digest, digest, program_digest, versions


@attrs.define
class Reuse:
    """How many partitions (or whole calls, for backends that lower all at once) each backend
    class took from the cache and how many it lowered."""

    reused: dict[str, int] = attrs.field(factory=dict)
    lowered: dict[str, int] = attrs.field(factory=dict)

    def count(self, backend: str, reused: int, lowered: int) -> None:
        self.reused[backend] = self.reused.get(backend, 0) + reused
        self.lowered[backend] = self.lowered.get(backend, 0) + lowered

    def lines(self) -> list[str]:
        return [
            f"{name}: {self.reused[name]} of {self.reused[name] + self.lowered[name]} "
            "lowered partition(s) reused from the cache"
            for name in self.reused
            if self.reused[name]
        ]


def per_partition(backend_class: type) -> bool:
    """Whether the class lowers each partition on its own (ExecuTorch's default)."""
    method = getattr(backend_class.preprocess_multimethod, "__func__", None)
    return method is BackendDetails.preprocess_multimethod.__func__


@contextlib.contextmanager
def reusing(
    backends: Mapping[str, str],
    store: Store,
    progress: Callable[[str], None] | None = None,
) -> Iterator[Reuse]:
    """Answer the preprocessing of the backends ``{ExecuTorch backend id: composer name}``
    from ``store`` while inside."""
    reuse = Reuse()
    original = backend_api.lower_all_submodules_to_backend

    def lower_all_submodules_to_backend(backend_id, *args, **kwargs):
        backend_class = next(
            (c for c in BackendDetails.__subclasses__() if c.__name__ == backend_id), None
        )
        if backend_id not in backends or backend_class is None:
            return original(backend_id, *args, **kwargs)
        saved = backend_class.__dict__.get("preprocess_multimethod")
        wrapper = _wrapper(backend_class, backends[backend_id], store, reuse)
        backend_class.preprocess_multimethod = classmethod(wrapper)
        try:
            return original(backend_id, *args, **kwargs)
        finally:
            if saved is None:
                del backend_class.preprocess_multimethod
            else:
                backend_class.preprocess_multimethod = saved

    backend_api.lower_all_submodules_to_backend = lower_all_submodules_to_backend
    try:
        yield reuse
    finally:
        backend_api.lower_all_submodules_to_backend = original
    if progress is not None:
        for line in reuse.lines():
            progress(line)


def _wrapper(cls: type, name: str, store: Store, reuse: Reuse):
    # The class's own lowering, as ExecuTorch would have called it.
    original = cls.preprocess_multimethod.__func__
    whole_call = not per_partition(cls)
    try:
        code = code_digest([cls])
    except Unfingerprintable:
        code = None

    def preprocess_multimethod(klass, edge_programs, compile_specs):
        if code is None:
            return original(klass, edge_programs, compile_specs)
        if whole_call:
            key = _key(code, cls, [p for m in edge_programs for p in edge_programs[m]],
                       [s for m in edge_programs for s in compile_specs[m]])  # fmt: skip
            cached = _load(store, key)
            if cached is not None:
                reuse.count(name, sum(map(len, edge_programs.values())), 0)
                return cached
            results = original(klass, edge_programs, compile_specs)
            reuse.count(name, 0, sum(map(len, edge_programs.values())))
            _save(store, key, results)
            return results
        results = {}
        for method, programs in edge_programs.items():
            results[method] = []
            for program, specs in zip(programs, compile_specs[method], strict=True):
                key = _key(code, cls, [program], [specs])
                result = _load(store, key)
                if result is None:
                    result = klass.preprocess(program, specs)
                    reuse.count(name, 0, 1)
                    _save(store, key, result)
                else:
                    reuse.count(name, 1, 0)
                results[method].append(result)
        return results

    return preprocess_multimethod


def _key(code: str, cls: type, programs: list, specs: list) -> str | None:
    try:
        programs_digests = [program_digest(program) for program in programs]
    except Unfingerprintable:
        return None
    spec_text = repr([[(s.key, bytes(s.value)) for s in each] for each in specs])
    return digest(versions(), f"{cls.__module__}.{cls.__qualname__}", code, spec_text,
                  *programs_digests)  # fmt: skip


def _load(store: Store, key: str | None):
    if key is None:
        return None
    payload = store.get(key)
    if payload is None:
        return None
    try:
        return pickle.loads(payload)
    except Exception:  # noqa: BLE001 - an entry this version cannot read: lower again
        return None


def _save(store: Store, key: str | None, results) -> None:
    """Store what preprocessing returned, if it is whole: anything other than
    PreprocessResults is left for ExecuTorch to reject with its own error."""
    if isinstance(results, PreprocessResult):
        flat = [results]
    elif isinstance(results, dict):
        flat = [r for method in results.values() for r in method]
    else:
        return
    if key is None or not all(_self_contained(r) for r in flat):
        return
    try:
        payload = pickle.dumps(results, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - what cannot be stored is lowered again next time
        return
    store.put(key, payload)


def _self_contained(result: PreprocessResult) -> bool:
    """Whether the result holds its bytes itself: a file-backed buffer (CudaBackend's low
    memory mode) points to a file that will be gone."""
    if not isinstance(result, PreprocessResult):
        return False
    output = result.data_store_output
    return output is None or all(isinstance(b, bytes | bytearray) for b in output.buffers)
