"""Lowered partitions reused by content: a backend compiles only partitions it has not seen.

ExecuTorch finds a backend by class name among ``BackendDetails`` subclasses, in
``backend_api.lower_all_submodules_to_backend``, and hands its ``preprocess_multimethod`` every
partition that backend took; there is no hook to answer from elsewhere. So for the length of
one lowering (``reusing``), composer wraps that function, and inside it the classmethod of the
backend class it finds (a plugin may import that class only while partitioning), and restores
both after. The wrapper digests each partition (its edge
subgraph with shapes, dtypes, debug handles and the bytes of the constants it owns), the
compile specs, the backend's code and the versions that lower it (``composer.lower.fingerprint``);
a hit returns the stored ``PreprocessResult`` (processed bytes, named data, debug handle map)
instead of calling ``preprocess``.

The unit of reuse is one partition when the backend keeps ExecuTorch's default
``preprocess_multimethod`` (each partition compiled on its own), and the whole call when the
backend overrides it: CudaBackend, for one, gathers every partition's weights into one store.

The same unit is what a failure names: a compiler that raises comes out as ``CompilerRaised``
with the partition programs it was handed, so a repair moves those partitions and no others.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import io
import multiprocessing
import pickle
from collections.abc import Callable, Iterator, Mapping

import attrs
from executorch.exir._serialize._cord import FileBackedData
from executorch.exir.backend import backend_api
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult

from composer.contract.machine import MachineError, retried_once
from composer.lower.cache import Store
from composer.lower.compiler_raised import CompilerRaised, handed_nodes
from composer.lower.fingerprint import (
    Unfingerprintable,
    code_digest,
    digest,
    program_digest,
    versions,
)
from composer.lower.pending_symbols import pending_symbols_set_aside
from composer.registry.discovery import Backend


@attrs.define
class Reuse:
    """How many partitions (or whole calls, for backends that lower all at once) each backend
    class took from the cache and how many it lowered."""

    reused: dict[str, int] = attrs.field(factory=dict)
    lowered: dict[str, int] = attrs.field(factory=dict)
    unstored: int = 0  # lowered but not stored: lowering again may not give the same bytes

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
    backends: Mapping[str, Backend],
    store: Store | None,
    progress: Callable[[str], None] | None = None,
    jobs: int = 1,
) -> Iterator[Reuse]:
    """Answer the preprocessing of the backends ``{ExecuTorch backend id: Backend}`` from
    ``store`` (None: no cache) while inside; partitions still to lower go to ``jobs``
    processes where the backend lowers each partition on its own."""
    reuse = Reuse()
    original = backend_api.lower_all_submodules_to_backend

    def lower_all_submodules_to_backend(backend_id, *args, **kwargs):
        backend_class = next(
            (c for c in BackendDetails.__subclasses__() if c.__name__ == backend_id), None
        )
        if backend_id not in backends or backend_class is None:
            return original(backend_id, *args, **kwargs)
        saved = backend_class.__dict__.get("preprocess_multimethod")
        wrapper = _wrapper(backend_class, backends[backend_id], store, reuse, jobs)
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


def _wrapper(cls: type, backend: Backend, store: Store | None, reuse: Reuse, jobs: int):
    # The class's own lowering, as ExecuTorch would have called it.
    original = cls.preprocess_multimethod.__func__
    whole_call = not per_partition(cls)
    code = None
    if store is not None:  # without a cache nothing is digested: digests read every weight
        try:
            # The class's code, and the compiler library it drives (OpenVINO's version...).
            code = digest(code_digest([cls]), backend.spec.library)
        except Unfingerprintable:
            code = None

    def preprocess_multimethod(klass, edge_programs, compile_specs):
        if whole_call:
            everything = [p for m in edge_programs for p in edge_programs[m]]
            key = _key(code, cls, everything, [s for m in edge_programs for s in compile_specs[m]])
            cached = _load(store, key)
            if cached is not None:
                reuse.count(backend.name, len(everything), 0)
                return cached
            # each partition's nodes, read before a compiler may rewrite what it is given
            singles = [
                (method, program, specs, handed_nodes([program]))
                for method, programs in edge_programs.items()
                for program, specs in zip(programs, compile_specs[method], strict=True)
            ]
            nodes = {name: origin for *_, each in singles for name, origin in each.items()}
            try:
                with pending_symbols_set_aside(everything):
                    # the machine's errors are retried, never the backend's refusal
                    results = retried_once(
                        functools.partial(original, klass, edge_programs, compile_specs),
                        f"lowering partitions with {cls.__name__}",
                    )
            except MachineError:
                raise
            except Exception as error:
                failures = _failing_alone(klass, original, singles)
                raise CompilerRaised(cls, failures or [(nodes, error)]) from error
            reuse.count(backend.name, 0, len(everything))
            if not _save(store, key, results):
                reuse.unstored += 1
            return results
        results = {method: [None] * len(programs) for method, programs in edge_programs.items()}
        pending = []  # (method, index, program, compile specs, key) of what must be lowered
        for method, programs in edge_programs.items():
            for index, (program, specs) in enumerate(zip(programs, compile_specs[method], strict=True)):  # fmt: skip
                key = _key(code, cls, [program], [specs])
                results[method][index] = _load(store, key)
                if results[method][index] is None:
                    pending.append((method, index, program, specs, key))
        with pending_symbols_set_aside(p for _, _, p, _, _ in pending):
            lowered = _preprocess_each(klass, [(p, s) for _, _, p, s, _ in pending], jobs)
        for (method, index, _program, _specs, key), result in zip(pending, lowered, strict=True):
            results[method][index] = result
            if not _save(store, key, result):
                reuse.unstored += 1
        reuse.count(
            backend.name, sum(map(len, edge_programs.values())) - len(pending), len(pending)
        )
        return results

    return preprocess_multimethod


def _failing_alone(klass: type, original, singles: list) -> list:
    """Where a class that lowers every partition in one call (ExecuTorch's CUDA backend, for
    one store of weights) raised on them together: each of ``singles`` (method, partition,
    compile specs, nodes handed) lowered alone by that same call, and those that raise then,
    with their errors; empty where there was one partition, or none raises alone. A repair then
    moves the partitions that failed, not every partition lowered with them (deit_tiny with
    ``xnnpack,cuda`` on an H200: one CUDA partition failed to compile and the 340 nodes of the
    call moved). It costs one more lowering, and only after a failure."""
    if len(singles) < 2:
        return []
    failures = []
    for method, program, specs, nodes in singles:
        try:
            with pending_symbols_set_aside([program]):
                retried_once(
                    functools.partial(original, klass, {method: [program]}, {method: [specs]}),
                    f"lowering a partition with {klass.__name__}",
                )
        except MachineError:
            raise
        except Exception as error:  # noqa: BLE001 - each partition is tried, then raised
            failures.append((nodes, error))
    return failures


def _key(code: str | None, cls: type, programs: list, specs: list) -> str | None:
    if code is None:
        return None
    try:
        programs_digests = [program_digest(program) for program in programs]
    except Unfingerprintable:
        return None
    spec_text = repr([[(s.key, bytes(s.value)) for s in each] for each in specs])
    return digest(versions(), f"{cls.__module__}.{cls.__qualname__}", code, spec_text,
                  *programs_digests)  # fmt: skip


def _load(store: Store | None, key: str | None):
    return None if store is None or key is None else store.load(key)


def _save(store: Store | None, key: str | None, results) -> bool:
    """Store what preprocessing returned; whether it was stored. Anything other than
    PreprocessResults is left for ExecuTorch to reject with its own error."""
    if store is None or key is None:
        return False
    if isinstance(results, dict):
        flat = [r for method in results.values() for r in method]
    else:
        flat = [results]
    if not all(isinstance(r, PreprocessResult) for r in flat):
        return False
    payload = io.BytesIO()
    try:
        _SelfContained(payload, protocol=pickle.HIGHEST_PROTOCOL).dump(results)
    except Exception:  # noqa: BLE001 - what cannot be stored is lowered again next time
        return False
    return store.put(key, payload.getvalue())


class _SelfContained(pickle.Pickler):
    """Pickles file-backed buffers (CudaBackend keeps weights in temporary files that are
    gone after the program is written) as the bytes they hold."""

    def reducer_override(self, obj):
        if isinstance(obj, FileBackedData):
            return bytes, (obj.to_bytes(),)
        return NotImplemented


# What the forked workers lower: set before the pool forks, read by index in the children.
_WORK: tuple[type, list] | None = None


def _preprocess_each(cls: type, work: list, jobs: int) -> list:
    """``cls.preprocess`` of each ``(program, compile specs)``, in ``jobs`` forked processes
    when there is more than one; the children inherit the programs, only results travel."""
    if jobs <= 1 or len(work) <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return _preprocess_serially(cls, work)
    global _WORK
    _WORK = (cls, work)
    try:
        context = multiprocessing.get_context("fork")
        with concurrent.futures.ProcessPoolExecutor(
            min(jobs, len(work)), mp_context=context, initializer=_one_thread
        ) as pool:
            return list(pool.map(_preprocess_forked, range(len(work))))
    except Exception:  # noqa: BLE001
        # Lowered again here, where a backend's error names the partition that raised it and
        # a result that could not travel needs not.
        return _preprocess_serially(cls, work)
    finally:
        _WORK = None


def _preprocess_serially(cls: type, work: list) -> list:
    results, failures = [], []
    for program, specs in work:
        nodes = handed_nodes([program])
        try:
            # the machine's errors are retried, never the backend's refusal
            doing = f"lowering a partition with {cls.__name__}"
            results.append(retried_once(functools.partial(cls.preprocess, program, specs), doing))
        except MachineError:
            raise
        except Exception as error:  # noqa: BLE001 - every partition is tried, then raised
            # The rest are still lowered: DenseNet's four concatenations each failed
            # OpenVINO's conversion, and found one at a time they cost four more lowerings.
            failures.append((nodes, error))
    if failures:
        raise CompilerRaised(cls, failures) from failures[0][1]
    return results


def _one_thread() -> None:
    # The parent's intra-op thread pool does not survive fork; the workers are the
    # parallelism.
    import torch

    torch.set_num_threads(1)


def _preprocess_forked(index: int):
    assert _WORK is not None
    cls, work = _WORK
    program, specs = work[index]
    return cls.preprocess(program, specs)
