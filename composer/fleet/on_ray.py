"""Jobs as Ray tasks, on every node of a cluster (``composer sweep --ray auto|ADDRESS``).

Ray is an optional extra (``executorch-composer[ray]``). A task whose node dies is run again
elsewhere (``max_retries``); the driver writes each job's record once, as it comes. A job that
needs a GPU asks Ray for one (``num_gpus``), and a sweep timed on a named device asks every job
for the custom resource the node that has it declares (``ray start --resources
'{"device:h100": 1}'``), so CPU nodes compose while device nodes time. Where nodes declare what
they run (``runtime:NAME``, :mod:`composer.fleet.runtime_labels`), a job goes only to a node
that proves every backend of its stack.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from composer.contract.environment import shortened
from composer.contract.errors import ComposerError
from composer.fleet.jobs import Job, run_job
from composer.fleet.runtime_labels import labels_asked

RETRIES = 3  # runs of a task whose worker or node died, beyond the first

# A cluster of this machine's processes that listens on, and connects to, 127.0.0.1 only. Ray
# takes the machine's network address for a node, and rewrites a driver's "127.0.0.1:PORT" to
# it (so a driver on a loopback-only cluster waits for a GCS at an address nothing listens on),
# unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which Ray reads once, when it is imported; and it
# reports usage to Ray's server unless told not to.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


def run_on_ray(
    jobs: Sequence[Job],
    address: str,
    bench: int,
    done: Callable[[dict[str, Any]], None],
    resources: Callable[[Job], Mapping[str, Any]],
    placement: str = "priority",
) -> None:
    """Run ``jobs`` on the Ray cluster at ``address`` ("auto": the one this machine joined),
    handing each record to ``done`` as it comes."""
    ray = connect(address)
    task = ray.remote(max_retries=RETRIES)(run_job)
    # every job's asks before any runs: a backend no node proves is refused with nothing sent
    declared = set(ray.cluster_resources())
    asks = [with_labels(resources(job), job, declared) for job in jobs]
    pending = {
        task.options(**asked).remote(
            {"model": job.model, "stack": job.stack}, bench, placement
        ): job
        for job, asked in zip(jobs, asks, strict=True)
    }
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            job = pending.pop(ref)
            try:
                record = ray.get(ref)
            except ray.exceptions.RayError as error:  # its retries spent
                record = {"model": job.model, "stack": job.stack, "ok": False,
                          "worker_died": True,  # --resume runs it again
                          "error": f"the Ray task failed: {type(error).__name__}: {error}"[:2000]}  # fmt: skip
            done(record)


def with_labels(asks: Mapping[str, Any], job: Job, declared: set[str]) -> dict[str, Any]:
    """``asks`` with the ``runtime:NAME`` labels of the job's backends, where the cluster's
    nodes declare such labels (:mod:`composer.fleet.runtime_labels`)."""
    labels = labels_asked(job.stack.split(","), declared)
    if not labels:
        return dict(asks)
    return {**asks, "resources": {**asks.get("resources", {}), **labels}}


def connect(address: str) -> Any:
    """Ray, connected to the cluster at ``address``; a ComposerError, within seconds, where
    Ray is not installed or nothing answers there."""
    try:
        import ray
    except ImportError as error:
        raise ComposerError(
            "--ray needs Ray: pip install 'executorch-composer[ray]' (or ray==2.60.0), or leave "
            "--ray out to run the jobs in local processes."
        ) from error
    if not ray.is_initialized():
        check_reachable(address)
        try:
            ray.init(address=address, log_to_driver=False, ignore_reinit_error=True)
        except ConnectionError as error:
            raise ComposerError(
                f"no Ray cluster at {address!r}: start one with `ray start --head` (workers join "
                f"with `ray start --address HEAD:6379`), or leave --ray out. ({error})"
            ) from error
    return ray


CONNECT_SECONDS = 3.0  # a GCS that does not accept a connection in this long is not there


def check_reachable(address: str) -> None:
    """Refuse ``address`` ("auto": the cluster this machine last joined) unless its GCS accepts
    a connection: Ray itself retries an address nothing answers at for minutes."""
    source = ""
    if address == "auto":
        address, source = _auto_address()
        if not address:
            return  # no cluster recorded here: Ray says so at once
    check_address(address, source)
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # "local", or a form Ray reads its own way
    try:
        socket.create_connection((host.strip("[]"), int(port)), CONNECT_SECONDS).close()
    except OSError as error:
        raise ComposerError(
            f"no Ray cluster answers at {address} ({error.strerror or error}{source}): start one "
            "with `ray start --head`, pass the address of one that runs, or leave --ray out."
        ) from error


def check_address(address: str, source: str = "") -> None:
    """Refuse what is no address of a Ray cluster: ``auto``, ``local``, ``HOST:PORT`` or
    ``ray://HOST[:PORT]``, a port from 1 to 65535 (``source``: where the address came from)."""
    rest = address.removeprefix("ray://")
    host, colon, port = rest.rpartition(":")
    if not colon:
        host, port = rest, None
    fine = address in ("auto", "local") or (
        bool(host.strip("[]"))
        and not any(c.isspace() for c in address)
        and (port is None and address.startswith("ray://") or port is not None and port.isdigit()
             and 0 < int(port) < 65536)
    )  # fmt: skip
    if not fine:
        raise ComposerError(
            f"--ray {shortened(address)!r} is no Ray address{source}: write auto, or HOST:PORT "
            "of the cluster's head (10.0.0.5:6379; ray://10.0.0.5:10001 for Ray Client), the "
            "port from 1 to 65535."
        )


def _auto_address() -> tuple[str, str]:
    """The address "auto" means, as Ray finds it, and where it was found: RAY_ADDRESS, else
    the file the last `ray start` on this machine wrote (left behind when a cluster dies)."""
    if os.environ.get("RAY_ADDRESS", "auto") != "auto":
        return os.environ["RAY_ADDRESS"], "; the address is RAY_ADDRESS's"
    # Ray's temporary folder: RAY_TMPDIR, else TMPDIR on Linux, else /tmp (ray._private.utils)
    temporary = os.environ.get("RAY_TMPDIR") or (
        os.environ.get("TMPDIR") if sys.platform.startswith("linux") else None
    )
    if temporary is None:
        temporary = "/tmp" if sys.platform != "win32" else tempfile.gettempdir()
    recorded = Path(temporary) / "ray" / "ray_current_cluster"
    try:
        return (
            recorded.read_text().strip(),
            f"; the address is from {recorded}, which an earlier `ray start` wrote",
        )
    except OSError:
        return "", ""


@contextlib.contextmanager
def loopback_cluster(worker_nodes: int, cpus: int = 1) -> Iterator[Any]:
    """A Ray cluster of local processes on 127.0.0.1 alone, for tests and benchmarks of the Ray
    executor: a head node of no CPUs (it schedules, runs no job) and ``worker_nodes`` nodes of
    ``cpus`` each; yields ``ray.cluster_utils.Cluster`` (``.address`` for ``sweep(ray=...)``,
    ``.add_node`` / ``.remove_node``), shut down with its driver connection on exit. The node
    processes inherit this process's environment as it is here: set ``COMPOSER_CACHE_DIR``
    (and the like) before entering."""
    import ray
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    before = {name: os.environ.get(name) for name in LOOPBACK_ENV}
    os.environ.update(LOOPBACK_ENV)  # for the node processes, and their workers
    # for this process, where Ray may have been imported before the variable was set
    multi_host, ray_constants.ENABLE_RAY_CLUSTER = ray_constants.ENABLE_RAY_CLUSTER, False
    local = {"node_ip_address": "127.0.0.1", "include_dashboard": False}
    cluster = Cluster(shutdown_at_exit=True)
    try:
        cluster.add_node(num_cpus=0, **local)  # the head
        for _ in range(worker_nodes):
            cluster.add_node(num_cpus=cpus, **local)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        ray_constants.ENABLE_RAY_CLUSTER = multi_host
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
