"""A sweep's records as one HTML table: a row a job, what composed, how it was proven, where
it moved against its golden plan, and why a job failed."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any


def sweep_html(records: Sequence[dict[str, Any]]) -> str:
    """The page: one row per job, failures and golden differences marked."""
    rows = []
    for record in records:
        summary = record.get("golden", {}).get("ops", {})
        where = "; ".join(f"{b}: {sum(c.values())}" for b, c in summary.items()) if summary else ""
        latency = record.get("latency_us")
        timed = (f"{latency['median_us']:g}" if isinstance(latency, dict)
                 else html.escape(str(latency or "")))  # fmt: skip
        check = record.get("golden_check", "")
        state = "ok" if record["ok"] and not check.startswith("differs") else "bad"
        cells = [
            record["model"], record["stack"], "ok" if record["ok"] else "failed", where,
            record.get("proof") or record.get("error", ""), check, record.get("digest", ""),
            f"{record.get('seconds', '')}",
        ]  # fmt: skip
        rows.append(
            f'<tr class="{state}">'
            + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells)
            + f"<td>{timed}</td></tr>"
        )
    head = ("model", "stack", "result", "nodes per backend", "proof or error", "golden",
            "program digest", "seconds", "median us")  # fmt: skip
    return (
        "<!doctype html><meta charset=utf-8><title>composer sweep</title><style>"
        "body{font:14px system-ui}td,th{border:1px solid #ccc;padding:3px 6px;vertical-align:top}"
        "table{border-collapse:collapse}tr.bad{background:#fde8e8}</style>"
        f"<h1>composer sweep: {len(records)} job(s)</h1><table><tr>"
        + "".join(f"<th>{h}</th>" for h in head)
        + "</tr>"
        + "".join(rows)
        + "</table>\n"
    )
