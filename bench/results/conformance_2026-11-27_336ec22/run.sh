#!/bin/bash
# One run of ExecuTorch's backend test suite over composer's flows and plain's, at nice 19.
# usage: run.sh NAME SNAPSHOT FLOWS SUITE [pytest args...]
#   NAME: the run's record, bench/results/conformance_2026-11-27_336ec22/NAME.{json,csv,log}
#   SNAPSHOT: a `git archive HEAD composer` copy, so other sessions' edits do not reach the run
#   FLOWS: --composer-flows (e.g. xnnpack or openvino,openvino+xnnpack)
#   SUITE: operators or models
set -u
NAME=$1; SNAP=$2; FLOWS=$3; SUITE=$4; shift 4
OUT=${OUT:-/work/main/bench/results/conformance_2026-11-27_336ec22}  # OUT=DIR run.sh ...: records in DIR
INI=/tmp/conformance_ini_$NAME; mkdir -p $INI; printf '[pytest]\n' > $INI/pytest.ini
source /work/main/.venv/bin/activate
cd /tmp   # not the repo: cwd is first on sys.path, and the snapshot must win
echo "start $(date -u +%FT%TZ) snapshot=$SNAP flows=$FLOWS suite=$SUITE args=$*" > $OUT/$NAME.log
# A background job of a non-interactive shell ignores SIGINT: pytest.main under Python's own
# SIGINT handler, so `kill -INT` stops the run and it still writes its JSON report.
PYTHONPATH=$SNAP nice -n 19 python -c 'import signal, sys, pytest
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.exit(pytest.main(sys.argv[1:]))' --pyargs executorch.backends.test.suite.$SUITE \
  -c $INI/pytest.ini --rootdir $INI -p no:cacheprovider --composer-flows=$FLOWS \
  --json-report --json-report-file=$OUT/$NAME.json -v --tb=no --disable-warnings -rN -n 2 --max-worker-restart=1000 "$@" \
  >> $OUT/$NAME.log 2>&1
RC=$?; echo "end $(date -u +%FT%TZ) rc=$RC" >> $OUT/$NAME.log
