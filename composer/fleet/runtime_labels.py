"""Ray nodes named by what they run: a sweep's job goes to a node whose runtimes prove its stack.

A node says which backends' programs it proves with one custom Ray resource a backend,
``runtime:NAME`` (``runtime:cuda``, ``runtime:vulkan``), declared when it joins the cluster::

    ray start --address HEAD:6379 --resources "$(composer backends --ray-resources)"

``composer backends --ray-resources`` prints the set for the machine it runs on: each backend
that lowers and runs there (:mod:`composer.run.backends_here`). A job then asks for a sliver of
each of its stack's labels, so Ray runs it only where all of them are, and as many jobs at once
as the node's CPUs allow. A cluster where no node declares any ``runtime:`` label is scheduled
as before (by GPU and ``--device-resource``); one where some do, but none proves a job's
backend, is refused before any job runs, naming the backend.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from composer.contract.errors import ComposerError
from composer.registry.discovery import Registry
from composer.run.backends_here import backends_here

PREFIX = "runtime:"
# What a node declares of each label: jobs ask for a sliver, so the label never limits how
# many run at once (the node's CPUs do).
DECLARED = 1000
ASKED = 0.001


def labels_here(registry: Registry | None = None) -> dict[str, int]:
    """The ``runtime:NAME`` resources this machine declares: a label for each backend that
    lowers and runs here, so that composer proves its programs here."""
    return {f"{PREFIX}{b.name}": DECLARED for b in backends_here(registry) if b.proves_here}


def ray_resources_line(registry: Registry | None = None) -> str:
    """``labels_here`` as ``ray start --resources`` takes it."""
    return json.dumps(labels_here(registry), sort_keys=True)


def labels_asked(backends: Sequence[str], declared: Iterable[str]) -> dict[str, float]:
    """The labels a job of a stack of ``backends`` asks Ray for, where the cluster's nodes
    declare the resources ``declared``: none where no node declares a ``runtime:`` label;
    else one for each backend, and ComposerError where no node declares one of them."""
    declared = set(declared)
    if not any(name.startswith(PREFIX) for name in declared):
        return {}
    missing = [b for b in backends if f"{PREFIX}{b}" not in declared]
    if missing:
        known = sorted(n[len(PREFIX) :] for n in declared if n.startswith(PREFIX))
        raise ComposerError(
            f"no node of the Ray cluster proves {', '.join(missing)} (none declares "
            f"{', '.join(PREFIX + b for b in missing)}; the nodes' labels: "
            f"{', '.join(known)}): join a machine that runs it with "
            'ray start --address ADDRESS --resources "$(composer backends --ray-resources)".'
        )
    return {f"{PREFIX}{b}": ASKED for b in backends}
