"""Sweeps (composer.fleet, ``composer sweep``): one record a job, written once, a table, the
golden comparison, resuming; local processes by default, Ray tasks on a cluster whose worker
node dies mid-sweep."""

from __future__ import annotations

import json
import os
import threading

import pytest

import composer
from composer.cli import main
from composer.report.sweep_html import sweep_html


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# CI time (about 2 minutes on 2 cores): the default suite's local sweeps are the failing job's
# below and tests/test_sweep_hardening.py's, whose guards resume a sweep and count its records.
@pytest.mark.slow
def test_a_local_sweep_writes_a_record_a_job_and_a_resumed_one_runs_only_the_rest(tmp_path):
    results, table = tmp_path / "sweep.jsonl", tmp_path / "sweep.html"
    first = composer.sweep(["zoo:mlp", "zoo:cumsum_mlp"], ["xnnpack"], results=results,
                           html=table, workers=2)  # fmt: skip
    assert first.ok and first.ran == 2 and first.skipped == 0
    records = lines(results)
    assert sorted(r["model"] for r in records) == ["zoo:cumsum_mlp", "zoo:mlp"]
    for record in records:
        assert record["ok"] and record["proof"].startswith("ran and matched eager"), record
        assert len(record["digest"]) == 16 and record["plan"]["backends"] == ["xnnpack"]
        assert isinstance(record["from_cache"], bool)
    assert "zoo:cumsum_mlp" in table.read_text() and "<table>" in table.read_text()
    again = composer.sweep(["zoo:mlp", "zoo:cumsum_mlp"], ["xnnpack", "xnnpack,openvino"],
                           results=results, resume=True, workers=2)  # fmt: skip
    assert again.ran == 2 and again.skipped == 2
    keys = [(r["model"], r["stack"]) for r in lines(results)]
    assert len(keys) == 4 == len(set(keys))


def test_golden_plans_are_written_then_compared_and_a_moved_op_fails_the_sweep(tmp_path, capsys):
    golden, results = tmp_path / "golden", tmp_path / "r.jsonl"
    args = ["sweep", "zoo:cumsum_mlp", "--stacks", "xnnpack", "--results", str(results),
            "--golden", str(golden), "--workers", "1"]  # fmt: skip
    assert main([*args, "--update-golden"]) == 0
    (written,) = golden.glob("*.json")
    assert written.name == "zoo_cumsum_mlp.xnnpack.json"
    assert main(args) == 0
    assert "matches its golden plan" in capsys.readouterr().out
    pinned = json.loads(written.read_text())
    pinned["ops"].setdefault("portable", {})["aten.linear.default"] = 2  # a pin from before
    written.write_text(json.dumps(pinned))
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "differs from zoo_cumsum_mlp.xnnpack.json: aten.linear.default: " in out
    assert "1 differ from their golden plan" in out


def test_a_job_that_fails_is_a_record_and_the_sweep_goes_on(tmp_path):
    summary = composer.sweep(["zoo:no_such_model", "zoo:mlp"], ["xnnpack"],
                             results=tmp_path / "r.jsonl", workers=1)  # fmt: skip
    by_model = {r["model"]: r for r in summary.records}
    assert not summary.ok and by_model["zoo:mlp"]["ok"]
    assert by_model["zoo:no_such_model"]["error"].startswith("ModelError: ")
    assert "internal error" not in by_model["zoo:no_such_model"]["error"]


def test_device_resources_need_ray(tmp_path):
    with pytest.raises(composer.ComposerError, match="pass --ray too"):
        composer.sweep(["zoo:mlp"], ["xnnpack"], results=tmp_path / "r.jsonl",
                       device_resource="device:h100")  # fmt: skip


# A Ray cluster of local processes on the loopback address (composer.fleet.on_ray's
# loopback_cluster); gated while it is slow: COMPOSER_RAY_CLUSTER_TESTS=1.
@pytest.mark.skipif(
    not os.environ.get("COMPOSER_RAY_CLUSTER_TESTS"),
    reason="starts a Ray cluster of 3 nodes (about a minute); COMPOSER_RAY_CLUSTER_TESTS=1",
)
def test_a_ray_sweep_whose_worker_node_dies_still_has_one_record_a_job(tmp_path, monkeypatch):
    pytest.importorskip("ray")
    from composer.fleet.on_ray import loopback_cluster

    models = ["zoo:mlp", "zoo:cumsum_mlp", "zoo:cnn", "zoo:cond"]
    serial = composer.sweep(models, ["xnnpack"], results=tmp_path / "serial.jsonl", workers=1)
    # an empty cache for the nodes: their jobs compose (seconds), so the node dies mid-job
    monkeypatch.setenv("COMPOSER_CACHE_DIR", str(tmp_path / "nodes-cache"))
    with loopback_cluster(worker_nodes=2) as cluster:
        doomed = next(iter(cluster.worker_nodes))
        first_done = threading.Event()

        def kill_a_node() -> None:
            first_done.wait(300)
            cluster.remove_node(doomed)  # its running task is retried on the other node

        killer = threading.Thread(target=kill_a_node)
        killer.start()
        summary = composer.sweep(models, ["xnnpack"], results=tmp_path / "ray.jsonl",
                                 ray=cluster.address, progress=lambda line: first_done.set())  # fmt: skip
        killer.join()
    records = lines(tmp_path / "ray.jsonl")
    assert sorted(r["model"] for r in records) == sorted(models)  # one each, none twice
    assert summary.ok
    expected = {r["model"]: r["golden"] for r in serial.records}
    assert {r["model"]: r["golden"] for r in records} == expected


@pytest.mark.slow  # CI time (about 90 s): measured placement itself is tested in test_placement
def test_a_sweep_with_measured_placement_times_each_jobs_candidates_where_it_runs(tmp_path):
    # Each job's candidates composed and timed by the worker that runs it
    # (on Ray with --device-resource, the node that has the device); the record says the choice.
    results = tmp_path / "measured.jsonl"
    summary = composer.sweep(["zoo:mlp"], ["openvino,xnnpack"], results=results,
                             placement="measured", workers=1)  # fmt: skip
    assert summary.ok
    (record,) = lines(results)
    assert record["placement"] == "measured"
    timed = [c for c in record["plan"]["placement"]["candidates"] if c["median_us"] is not None]
    assert len(timed) >= 2 and record["chose"] == record["plan"]["placement"]["chosen"]
    with pytest.raises(
        composer.ComposerError,
        match="placement must be one of priority, strict, measured, not 'fastest'",
    ):
        composer.sweep(["zoo:mlp"], ["xnnpack"], results=results, placement="fastest")


def test_the_sweep_page_counts_the_jobs_filters_them_and_says_which_came_from_the_cache():
    """The page once had no summary, no filter, and did not say which jobs were cache
    hits."""
    records = [
        {"model": "zoo:mlp", "stack": "xnnpack", "ok": True, "from_cache": True, "proof": "ran"},
        {"model": "zoo:cnn", "stack": "xnnpack", "ok": True, "from_cache": False, "proof": "ran",
         "golden_check": "differs from zoo_cnn.xnnpack.json: aten.relu.default: 1 -> 0"},
        {"model": "zoo:nope", "stack": "xnnpack", "ok": False, "error": "ModelError: no"},
    ]  # fmt: skip
    page = sweep_html(records)
    summary = "3 job(s): 2 composed (1 from the cache), 1 failed, 1 differ from their golden plan"
    assert page.count(summary) == 2  # above the table and in its footer
    rows = page.split("<tbody>")[1].split("</tbody>")[0].split("</tr>")[:-1]
    assert [row.split('"')[1] for row in rows] == ["ok", "bad", "bad"]
    assert "<td>hit</td>" in rows[0] and "<td>hit</td>" not in rows[1]
    assert 'id=q placeholder="filter' in page and "only failures and golden differences" in page
