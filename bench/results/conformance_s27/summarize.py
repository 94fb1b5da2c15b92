"""The table and differences of session 27's conformance records.

    python bench/results/conformance_s27/summarize.py RUN.json[.xz] [RERUN.json ...]

A later file's cases replace the earlier's (same flow and case): a rerun of composer's failures
with a fixed flow. A run stopped before its end (SIGINT) still writes its JSON report."""

import json
import lzma
import sys

from composer.conformance import command, results

cases: dict[tuple[str, str], results.Case] = {}
for path in sys.argv[1:]:
    if path.endswith(".xz"):
        # the large reports are kept xz-compressed (a tenth the size: the GPU machine's carry)
        with lzma.open(path) as compressed:
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
