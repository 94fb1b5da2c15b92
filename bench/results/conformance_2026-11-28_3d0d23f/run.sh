#!/bin/bash
# The 1d442c0 run's run.sh, its records here: usage as there (NAME SNAPSHOT FLOWS SUITE [args]).
OUT=$(cd "$(dirname "$0")" && pwd) exec "$(dirname "$0")/../conformance_2026-11-27_336ec22/run.sh" "$@"
