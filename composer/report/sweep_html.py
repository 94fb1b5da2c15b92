"""A sweep's records as one HTML page: how many composed, failed, came from the cache and
differ from their golden plans; then a row a job (what composed, how it was proven, where it
moved against its golden plan, why a job failed), with a filter."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from composer.lower.atomic import html_marker

HEAD = ("model", "stack", "result", "cache", "nodes per backend", "proof or error", "golden",
        "program digest", "seconds", "median us")  # fmt: skip

# Rows hidden by the filter box (any text of the row) and the "only failures" box: no
# framework, the page is one file that opens anywhere.
FILTER = """<p><input id=q placeholder="filter: model, stack, error..." size=40 oninput=f()>
<label><input id=bad type=checkbox onchange=f()> only failures and golden differences</label></p>
<script>function f(){const q=document.getElementById('q').value.toLowerCase(),
b=document.getElementById('bad').checked;for(const r of document.querySelectorAll('tbody tr'))
{r.hidden=(q&&!r.textContent.toLowerCase().includes(q))||(b&&!r.classList.contains('bad'))}}
</script>"""

STYLE = (
    "body{font:14px system-ui}td,th{border:1px solid #ccc;padding:3px 6px;vertical-align:top}"
    "table{border-collapse:collapse}tr.bad{background:#fde8e8}tfoot td{font-weight:600}"
)


def sweep_html(records: Sequence[dict[str, Any]]) -> str:
    """The page: the counts, the filter, one row per job, failures and golden differences
    marked, and the counts again under the table."""
    counts = sweep_counts(records)
    total = (
        f"{len(records)} job(s): {counts['composed']} composed ({counts['cached']} from the "
        f"cache), {counts['failed']} failed, {counts['differ']} differ from their golden plan"
    )
    foot = f'<tfoot><tr><td colspan="{len(HEAD)}">{html.escape(total)}</td></tr></tfoot>'
    return (
        f"<!doctype html><meta charset=utf-8>{html_marker('sweep page')}<title>composer sweep</title>"
        f"<style>{STYLE}</style>"
        f"<h1>composer sweep: {len(records)} job(s)</h1><p>{html.escape(total)}</p>{FILTER}"
        "<table><thead><tr>"
        + "".join(f"<th>{h}</th>" for h in HEAD)
        + "</tr></thead><tbody>"
        + "".join(_row(record) for record in records)
        + f"</tbody>{foot}</table>\n"
    )


def sweep_counts(records: Sequence[dict[str, Any]]) -> dict[str, int]:
    """How many jobs composed, failed, came from composer's cache, and differ from golden."""
    return {
        "composed": sum(1 for r in records if r["ok"]),
        "failed": sum(1 for r in records if not r["ok"]),
        "cached": sum(1 for r in records if r.get("from_cache")),
        "differ": sum(1 for r in records if differs_from_golden(r)),
    }


def differs_from_golden(record: dict[str, Any]) -> bool:
    """Whether a job's plan moved against its golden plan (``composer sweep --golden``)."""
    return record.get("golden_check", "").startswith("differs")


def _row(record: dict[str, Any]) -> str:
    summary = record.get("golden", {}).get("ops", {})
    where = "; ".join(f"{b}: {sum(c.values())}" for b, c in summary.items()) if summary else ""
    latency = record.get("latency_us")
    timed = (f"{latency['median_us']:g}" if isinstance(latency, dict)
             else html.escape(str(latency or "")))  # fmt: skip
    state = "ok" if record["ok"] and not differs_from_golden(record) else "bad"
    cells = [
        record["model"], record["stack"], "ok" if record["ok"] else "failed",
        "hit" if record.get("from_cache") else "", where,
        record.get("proof") or record.get("error", ""), record.get("golden_check", ""),
        record.get("digest", ""), f"{record.get('seconds', '')}",
    ]  # fmt: skip
    return (
        f'<tr class="{state}">'
        + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells)
        + f"<td>{timed}</td></tr>"
    )
