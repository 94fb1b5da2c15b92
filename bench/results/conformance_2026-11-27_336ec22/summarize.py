"""The table and differences of conformance records (the suite's JSON reports).

    python bench/results/conformance_2026-11-27_336ec22/summarize.py RUN.json[.gz|.xz] [RERUN.json ...]

A later file's cases replace the earlier's (same flow and case): a rerun of composer's failures
with a fixed flow. A run stopped before its end (SIGINT) still writes its JSON report."""

import gzip
import json
import lzma
import sys

from composer.conformance import command, results

cases: dict[tuple[str, str], results.Case] = {}
for path in sys.argv[1:]:
    if path.endswith((".xz", ".gz")):
        # the large reports are kept compressed (a tenth the size)
        with (lzma.open if path.endswith(".xz") else gzip.open)(path) as compressed:
            read = results.read_cases(json.loads(compressed.read()))
    else:
        read = results.load(path)
    cases.update({(c.flow, c.key): c for c in read})
merged = list(cases.values())
print("\n".join(command.flow_table(merged)))
print()
print("\n".join(command.difference_lines(merged) or ["composer and plain agree on every case"]))
lost = command.lost_cases(merged)
print(f"\nlost (plain passed, ran, composer did not): {len(lost)}")
