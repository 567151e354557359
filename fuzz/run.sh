#!/usr/bin/env bash
# Runs one libFuzzer target for a bounded time, as a CTest test:
#   fuzz/run.sh BINARY SECONDS [REGRESSIONS_DIR]
# The target writes its seeds (LLVMFuzzerInitialize, TANDEM_FUZZ_SEEDS) into
# a fresh corpus; committed inputs that once crashed (REGRESSIONS_DIR) run
# first. TANDEM_FUZZ_RSS_MB: the memory limit (default 4096). Exit 0 with a
# line of statistics, or non-zero with libFuzzer's report and the crashing
# input's path (keep it: it becomes a regression). A crash, a leak, an
# out-of-memory or a unit over -timeout fails; a slow unit (libFuzzer's
# slow-unit-*, over 10 s but under the timeout: a loaded machine, or the 4 GB
# allocation of docs/RELIABILITY.md's checkpoint finding) is only reported.
set -uo pipefail
bin=$1 seconds=$2 regressions=${3:-}
name=$(basename "$bin")
if [ ! -x "$bin" ]; then
  echo "$name: $bin is not built (the CTest fixture fuzz.build builds the fuzz tree with clang: ctest -L fuzz)" >&2
  exit 1
fi
work=$(mktemp -d /tmp/tandem-fuzz.XXXXXX)
mkdir -p "$work/corpus" "$work/findings"
dirs=("$work/corpus")
if [ -n "$regressions" ] && [ -d "$regressions" ]; then dirs+=("$regressions"); fi
# Leaks inside libtorch's own start-up are not ours: LeakSanitizer is off.
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0} TANDEM_FUZZ_SEEDS="$work/corpus" \
  "$bin" -max_total_time="$seconds" -timeout=20 -rss_limit_mb="${TANDEM_FUZZ_RSS_MB:-4096}" -print_final_stats=1 \
  -artifact_prefix="$work/findings/" "${dirs[@]}" > "$work/log" 2>&1
rc=$?
runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/log" | grep -o '[0-9]*$')
slow=$(ls "$work/findings" | grep -c '^slow-unit-')
found=$(ls "$work/findings" | grep -vc '^slow-unit-')
if [ $rc -ne 0 ] || [ "$found" -ne 0 ]; then
  tail -40 "$work/log"
  keep=/tmp/$name-findings-$$
  cp -r "$work/findings" "$keep"
  echo "$name: FAILED (exit $rc, $found finding(s) kept in $keep)"
  rm -rf "$work"
  exit 1
fi
note=""
[ "$slow" -gt 0 ] && note=" ($slow slow unit(s), reported, not failures)"
echo "$name: ${runs:-?} executions in $seconds s, corpus $(ls "$work/corpus" | wc -l) inputs, no findings$note"
rm -rf "$work"
