#!/usr/bin/env bash
# One device call (10 minutes at most), from the repository root on the GPU machine:
# build ExecuTorch's runtime (resuming a build carried back from an earlier call), compose the
# zoo programs meanwhile, then measure them (gpu_et_runtime.py) if time is left; put what the
# next call needs under $OUT. Carry bench/et_runtime/carry/ (the files an earlier call left in
# $OUT), bench/et_runtime/src/ and .whl/.
#   LIMIT=570 bash bench/et_runtime/device_run.sh [gpu_et_runtime.py options]
set -uo pipefail
start=$(date +%s)
LIMIT="${LIMIT:-570}"
left() { echo $(( start + LIMIT - $(date +%s) )); }
here=bench/et_runtime
carry=$here/carry
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT" /tmp/results
export ET_ROOT=/tmp/etb COMPOSER_CACHE_DIR=/tmp/composer_cache PYTHONUNBUFFERED=1
runner=$ET_ROOT/build/composer_runner/composer_et_runner
log=/tmp/results/device.log
exec > >(tee -a "$log") 2>&1
echo "device_run: $(date -u +%FT%TZ) $(nproc) cores; $(nvidia-smi -L | head -1)"

# What an earlier call left.
if ls "$carry"/composer_cache.tar.xz.* >/dev/null 2>&1; then
  mkdir -p "$COMPOSER_CACHE_DIR" && cat "$carry"/composer_cache.tar.xz.* | xz -d | tar -xf - -C "$COMPOSER_CACHE_DIR"
fi
if [ -f "$carry/runner.tar.xz" ]; then
  mkdir -p "$ET_ROOT" && tar -xJf "$carry/runner.tar.xz" -C /
elif ls "$carry"/etbuild.tar.xz.* >/dev/null 2>&1; then
  t0=$(date +%s); bash $here/build.sh unpack "$carry"; echo "piece unpack_carried_build $(( $(date +%s) - t0 )) s"
fi

t0=$(date +%s)
source bench/gpu_setup.sh >/tmp/results/setup.log 2>&1 || { echo "gpu_setup failed"; tail /tmp/results/setup.log; }
echo "setup (wheels + composer into /tmp/site): $(( $(date +%s) - t0 )) s"

compose_pid=""
if [ ! -x "$runner" ]; then
  # Compose (AOTInductor) while the runtime builds; fills composer's cache for the measurement.
  python3 $here/gpu_et_runtime.py --compose-only --out /tmp/programs "$@" \
    >/tmp/results/compose.log 2>&1 &
  compose_pid=$!
  ET_DEADLINE=$(( start + LIMIT - 75 )) bash $here/build.sh
  echo "build.sh exit $?"
fi
if [ -n "$compose_pid" ]; then
  timeout "$(( $(left) - 70 > 1 ? $(left) - 70 : 1 ))" tail --pid="$compose_pid" -f /dev/null
  kill "$compose_pid" 2>/dev/null && echo "compose stopped at the deadline"
  grep -c '"compose_s"' /tmp/results/compose.log | sed 's/^/programs composed: /'
fi

if [ -x "$runner" ] && [ "$(left)" -gt 90 ]; then
  ldd "$runner" | grep -E "not found|aoti|cuda|executorch" || true
  timeout "$(( $(left) - 45 ))" python3 $here/gpu_et_runtime.py --runner "$runner" --out /tmp/programs \
    --json /tmp/results/et_runtime.json "$@" 2>&1 | tee /tmp/results/measure.log | grep -v '^{' || true
  grep '^{' /tmp/results/measure.log | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    if "model" not in r: continue
    et, host = r.get("et_runtime", {}), r.get("composer_host", {})
    print(r["model"], r["stack"], r.get("delegates"), "ET:", et.get("median_us", et.get("error", "")[:300]),
          et.get("max_abs_error_vs_eager"), "host:", host.get("median_us", host.get("error", "")[:200]),
          "eager_gpu:", r.get("eager_gpu", {}).get("median_us"), r.get("error", "")[:300])
' || true
fi

# For the next call.
[ -d "$COMPOSER_CACHE_DIR" ] && tar -C "$COMPOSER_CACHE_DIR" -cf - . | xz -T0 -6 | split -b 15M -d - "$OUT/composer_cache.tar.xz."
if [ -x "$runner" ]; then
  libs=$(ldd "$runner" | awk '$3 ~ /^\/tmp\/etb/ {print $3}')
  tar -cf - "$runner" $libs 2>/dev/null | xz -T0 -6 >"$OUT/runner.tar.xz"
elif [ -d "$ET_ROOT/build" ]; then
  bash $here/build.sh pack "$OUT"
fi
cp "$ET_ROOT/configure.log" /tmp/results/ 2>/dev/null
tar -C /tmp -cf - results programs 2>/dev/null | xz -T0 -6 >"$OUT/results.tar.xz"
ls -l "$OUT"
echo "device_run: done, $(left) s of $LIMIT left"
