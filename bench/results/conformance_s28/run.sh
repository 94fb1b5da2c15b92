#!/bin/bash
# Session 27's run.sh, its records here: usage as there (NAME SNAPSHOT FLOWS SUITE [args]).
OUT=$(cd "$(dirname "$0")" && pwd) exec "$(dirname "$0")/../conformance_s27/run.sh" "$@"
