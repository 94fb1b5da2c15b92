"""The plan: which backend took which node, the partitions, crossings and duplicated bytes."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from typing import Any

import attrs

from composer.contract.backend_spec import Tolerance
from composer.scheduler.measured_placement import Placement, RegionSearch, TimedPartition
from composer.scheduler.plan_records import Repair

PORTABLE = "portable"
QUANTIZED_OPS = ("quantized_decomposed.", "torchao.")  # the namespaces of q/dq ops
HOST = "cpu"  # portable kernels, graph inputs and outputs run on the host


@attrs.frozen
class Partition:
    """One delegate: the backend that took it and the edge-program nodes inside it."""

    id: str
    backend: str
    device: str
    nodes: tuple[str, ...]
    ops: tuple[str, ...]
    # Mutated buffers (a KV cache) the delegate owns and keeps between calls.
    state: tuple[str, ...] = ()

    @property
    def op_counts(self) -> dict[str, int]:
        return dict(sorted(Counter(self.ops).items()))

    @property
    def quantized(self) -> bool:
        """Whether the delegate computes on quantized values: it holds quantize or dequantize
        nodes (PT2E's, or torchao's for activations quantized at run time)."""
        return any(op.startswith(QUANTIZED_OPS) for op in self.ops)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "backend": self.backend,
            "device": self.device,
            "nodes": list(self.nodes),
            "op_counts": self.op_counts,
            "quantized": self.quantized,
            **({"state": list(self.state)} if self.state else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], node_ops: Mapping[str, str]) -> Partition:
        """The partition ``to_dict`` wrote; its ops are its nodes' (``node_ops``: the plan's),
        which the JSON holds only as counts."""
        nodes = tuple(data["nodes"])
        return cls(data["id"], data["backend"], data["device"], nodes,
                   tuple(node_ops[n] for n in nodes), tuple(data.get("state", ())))  # fmt: skip


@attrs.frozen
class Fallback:
    """A node no backend took: it runs on ExecuTorch's portable CPU kernels."""

    node: str
    op: str
    reasons: tuple[tuple[str, str], ...]  # (backend, why it did not take the node)

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "op": self.op, "reasons": dict(self.reasons)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fallback:
        return cls(data["node"], data["op"], tuple(data["reasons"].items()))


def loosest_tolerance(
    tolerances: Mapping[str, Tolerance], quantization: Tolerance | None
) -> Tolerance | None:
    """One tolerance as loose as each backend's of ``tolerances`` and a quantized model's
    allowance (``None``: the default)."""
    declared = dict(tolerances)
    if quantization is not None:
        declared["quantized"] = quantization
    return Tolerance.loosest(declared)


def precision_of(tolerance: Tolerance | None) -> str | None:
    """The precision ``tolerance`` judges against eager in (``"bfloat16"``), or ``None``."""
    return tolerance.precision if tolerance is not None and tolerance.precision else None


@attrs.frozen
class Plan:
    """How a model is composed over a backend stack. ``to_json`` has stable keys, and
    ``from_dict`` reads them back (composer.report.plan_text renders it as text)."""

    backends: tuple[str, ...]
    node_backends: dict[str, str]  # every compute node of the edge program -> backend
    node_ops: dict[str, str]
    partitions: tuple[Partition, ...]
    fallbacks: tuple[Fallback, ...]
    delegate_calls: int
    crossings: int
    duplicated_constant_bytes: int
    stand_ins: tuple[str, ...] = ()  # backends planned with a stand-in (cannot lower here)
    edges: tuple[tuple[str, str], ...] = ()  # data edges between the nodes, for pictures
    # backends whose results may differ from eager's by more than the dtype's default
    tolerances: dict[str, Tolerance] = attrs.field(factory=dict)
    libraries: dict[str, str] = attrs.field(factory=dict)  # backend -> "openvino 2025.4.1"
    # how placement was decided when it was measured: the candidates and their times
    # (``None``: not measured)
    placement: Placement | None = None
    # how the program was proven before it was written (composer.run.proof): ran and matched
    # eager, not run here (and why), or not checked; empty for a plan (nothing runs)
    proof: str = ""
    # partitions moved after their delegate failed: backend, partition, nodes, why, moved_to
    repairs: tuple[Repair, ...] = ()
    # the program's dynamic input dims and their ranges (composer.scheduler.dynamic_dims)
    dynamic_dims: tuple[dict[str, Any], ...] = ()
    # how far integer kernels may be from a quantized model's q/dq simulation (quantized.py)
    quantization: Tolerance | None = None
    # backend -> the options it declares safer (BackendSpec.safer_options; not in to_json)
    safer_options: dict[str, dict[str, str]] = attrs.field(factory=dict, eq=False)
    # backend -> the ops those options change (BackendSpec.safer_for; not in to_json)
    safer_for: dict[str, tuple[str, ...]] = attrs.field(factory=dict, eq=False)
    # node -> what each backend, in order, answered when offered it (not in to_json)
    decisions: dict[str, tuple[tuple[str, str], ...]] = attrs.field(factory=dict, eq=False)

    def device_of(self, node_name: str) -> str:
        """Where ``node_name`` runs: its partition's device, else the host."""
        return self._node_devices().get(node_name, HOST)

    def device_of_backend(self, backend: str) -> str | None:
        """The device of ``backend``'s partitions (the host for portable; None if it took none)."""
        if backend == PORTABLE:
            return HOST
        return next((p.device for p in self.partitions if p.backend == backend), None)

    def crossing_edges(self) -> list[tuple[str, str]]:
        """The data edges between ops whose two ends run on different devices."""
        return [(a, b) for a, b in self.edges if self.device_of(a) != self.device_of(b)]

    def _node_devices(self) -> dict[str, str]:
        return {node: p.device for p in self.partitions for node in p.nodes}

    def explain(self, node_name: str) -> list[tuple[str, str]]:
        """(backend, what it answered) for each backend in priority order; for a measured plan,
        then ("measured", what the node's partition cost here and elsewhere)."""
        answers = list(self.decisions.get(node_name, ()))
        timed = self.partition_time(node_name)
        if timed is not None:
            answers.append(("measured", describe_partition_time(timed)))
        searched = self.placement.regions if self.placement is not None else None
        regions = (searched.regions or ()) if searched is not None else ()
        index = next((i for i, r in enumerate(regions) if node_name in r.nodes), None)
        if index is not None:
            answers.append(("per region", describe_region(searched, index)))
        return answers

    def partition_time(self, node_name: str) -> TimedPartition | None:
        """The traced time of the partition ``node_name`` runs in (for a node on portable
        kernels, of its kernel call), with the alternatives measured; ``None`` if not traced."""
        if self.placement is None:
            return None
        unit = next((p.id for p in self.partitions if node_name in p.nodes), node_name)
        return self.placement.timed_partition(unit)

    def backend_of(self, node_name: str) -> str:
        return self.node_backends[node_name]

    def nodes_on(self, backend: str) -> list[str]:
        return [name for name, b in self.node_backends.items() if b == backend]

    def ops_on(self, backend: str) -> Counter[str]:
        return Counter(self.node_ops[name] for name in self.nodes_on(backend))

    def partitions_of(self, backend: str) -> list[Partition]:
        return [p for p in self.partitions if p.backend == backend]

    def partition_count(self, backend: str) -> str:
        """``5``, or ``5 (3 quantized)`` where some compute on quantized values."""
        partitions = self.partitions_of(backend)
        quantized = sum(p.quantized for p in partitions)
        return f"{len(partitions)}" + (f" ({quantized} quantized)" if quantized else "")

    def tolerance(self) -> Tolerance | None:
        """The loosest tolerance among the backends that took a node (``None``: the default)."""
        taking = {b: t for b, t in self.tolerances.items() if self.nodes_on(b)}
        return loosest_tolerance(taking, self.quantization)

    def computes_in(self) -> str | None:
        """The lowest precision a backend that took a node computes float models in by design
        (``"bfloat16"``), or ``None``: the model's own."""
        return precision_of(self.tolerance())

    def to_dict(self) -> dict[str, Any]:
        return {
            "backends": list(self.backends),
            "stand_ins": list(self.stand_ins),
            "summary": {
                backend: {
                    "nodes": len(self.nodes_on(backend)),
                    "partitions": len(self.partitions_of(backend)),
                }
                for backend in (*self.backends, PORTABLE)
            },
            "delegate_calls": self.delegate_calls,
            "crossings": self.crossings,
            "duplicated_constant_bytes": self.duplicated_constant_bytes,
            "partitions": [p.to_dict() for p in self.partitions],
            "fallbacks": [f.to_dict() for f in self.fallbacks],
            "nodes": {
                name: {"op": self.node_ops[name], "backend": backend}
                for name, backend in self.node_backends.items()
            },
            "edges": [list(edge) for edge in self.edges],
            # added later: new keys go last, so readers of the old order keep working
            "libraries": dict(self.libraries),
            "tolerances": {b: t.to_dict() for b, t in self.tolerances.items()},
            "placement": {} if self.placement is None else self.placement.to_dict(),
            "proof": self.proof,
            "repairs": [r.to_dict() for r in self.repairs],
            "dynamic_dims": [dict(d) for d in self.dynamic_dims],
            "quantization": None if self.quantization is None else self.quantization.to_dict(),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        """The plan ``to_dict`` wrote (``summary``, ``op_counts`` and ``quantized`` are read off
        the rest; ``safer_options``, ``safer_for`` and ``decisions`` are not in the JSON)."""
        nodes = data["nodes"]
        node_ops = {name: node["op"] for name, node in nodes.items()}
        quantization = data.get("quantization")
        return cls(
            backends=tuple(data["backends"]),
            node_backends={name: node["backend"] for name, node in nodes.items()},
            node_ops=node_ops,
            partitions=tuple(Partition.from_dict(p, node_ops) for p in data["partitions"]),
            fallbacks=tuple(Fallback.from_dict(f) for f in data["fallbacks"]),
            delegate_calls=data["delegate_calls"],
            crossings=data["crossings"],
            duplicated_constant_bytes=data["duplicated_constant_bytes"],
            stand_ins=tuple(data.get("stand_ins", ())),
            edges=tuple((a, b) for a, b in data.get("edges", ())),
            tolerances={b: Tolerance.from_dict(t) for b, t in data.get("tolerances", {}).items()},
            libraries=dict(data.get("libraries", {})),
            placement=Placement.from_dict(data.get("placement", {})),
            proof=data.get("proof", ""),
            repairs=tuple(Repair.from_dict(r) for r in data.get("repairs", ())),
            dynamic_dims=tuple(dict(d) for d in data.get("dynamic_dims", ())),
            quantization=None if quantization is None else Tolerance.from_dict(quantization),
        )

    @classmethod
    def from_json(cls, text: str) -> Plan:
        """The plan ``to_json`` wrote."""
        return cls.from_dict(json.loads(text))


def describe_dynamic_dims(dims) -> str:
    """``input 0 dim 1 = s27 in [2, 128]; ...``: what a report says of a dynamic program."""
    parts = []
    for entry in dims:
        ranges = ", ".join(
            f"{symbol} in [{low}, {'inf' if high is None else high}]"
            for symbol, (low, high) in entry["ranges"].items()
        )
        parts.append(f"input {entry['input']} dim {entry['dim']} = {entry['size']} ({ranges})")
    return "; ".join(parts)


def describe_repair(repair: Repair) -> str:
    """One line for a moved partition: "openvino:1 failed at run time: ...; its 18 nodes went
    to portable"."""
    if repair.options:
        options = ", ".join(f"{k}={v}" for k, v in repair.options.items())
        return f"{repair.partition} ({repair.backend}) {repair.why}; tried {options}"
    went = ", ".join(f"{b} x{n}" for b, n in repair.moved_to.items()) or "nowhere"
    return (
        f"{repair.partition} ({repair.backend}) {repair.why}; its "
        f"{len(repair.nodes)} node(s) went to {went}"
    )


def describe_region(searched: RegionSearch, index: int) -> str:
    """One region of the per-region search: its nodes, its time on each option, the option
    chosen."""
    region = (searched.regions or ())[index]
    times = searched.region_us or ()
    chosen = searched.chosen or ()
    nodes = region.nodes
    named = nodes[0] + (f" .. {nodes[-1]} ({len(nodes)} nodes)" if len(nodes) > 1 else "")
    cost = times[index] if index < len(times) else {}
    options = ", ".join(
        f"{o} {cost[o]:.1f} us" if o in cost else f"{o} not timed" for o in region.options
    )
    pick = f" -> {chosen[index]}" if index < len(chosen) else ""
    return f"region {index}: {named}: {options}{pick}"


def describe_partition_time(timed: TimedPartition) -> str:
    """One line: a partition's traced time on its backend, then on each alternative."""
    nodes = f"{timed.nodes} node{'s' if timed.nodes != 1 else ''}"
    line = f"{timed.partition} ({nodes}) on {timed.backend}: {timed.median_us:.1f} us"
    for other in timed.alternatives:
        extra = other.extra_nodes
        larger = f", in a partition with {extra} more node(s)" if extra else ""
        line += f"; on {other.backend} {other.median_us:.1f} us ({other.candidate}{larger})"
    return line


def partition_of(plan, inside: set[str]) -> str | None:
    """The partition of ``plan`` that shares the most nodes with a lowered module whose graph
    has the nodes ``inside`` (a delegate keeps the names of the plan nodes it holds);
    ``None`` where it shares none."""
    best = max(plan.partitions, key=lambda p: len(inside.intersection(p.nodes)), default=None)
    return best.id if best is not None and inside.intersection(best.nodes) else None
