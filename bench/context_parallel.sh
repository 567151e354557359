#!/usr/bin/env bash
# A language model's CPU training step cut over context-parallel ranks,
# against one process on the same batches, interleaved in one run:
# llama-tiny (vocabulary 256) on sequences of 256 tokens, `tandem train`
# in one process and with --nproc-per-node 2 --mesh cp=2 (each rank half
# of every sequence, attention around the ring). No target: a figure.
#
#   bench/context_parallel.sh [ROUNDS]        (default 5 rounds per side)
#
# Prints the medians of the training tokens a second (--metrics-out) and
# their ratio. The current figure goes in docs/PERFORMANCE.md, each run's
# record in bench/results/context_parallel.md (newest first).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
rounds=${1:-5}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" - "$work/text.txt" <<'PY'
import random, sys
random.seed(1)
words = "the cat sat on a mat and dog ran far away with joy over hill under tree".split()
open(sys.argv[1], "w").write(" ".join(random.choice(words) for _ in range(60000)))
PY

tps() { grep -o '"tokens_per_second": *[0-9.]*' "$1" | tail -1 | cut -d: -f2 | tr -d ' '; }
run() {
  rm -f "$work/m.jsonl"
  "$build/tandem" train --model llama-tiny --data "text:$work/text.txt" --seq-len 256 --batch-size 16 \
    --max-steps 12 --epochs 1 --progress off --metrics-out "$work/m.jsonl" "$@" >/dev/null 2>&1
  tps "$work/m.jsonl"
}

one=() cp=()
for ((i = 0; i < rounds; i++)); do
  one+=($(run --nproc-per-node 0))
  cp+=($(run --nproc-per-node 2 --mesh cp=2))
done
om=$(printf '%s\n' "${one[@]}" | median)
cm=$(printf '%s\n' "${cp[@]}" | median)
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
printf 'llama-tiny, 16 x 256 tokens: one process %9.1f tok/s   cp=2 %9.1f tok/s   ratio %.3f   (n=%d each)\n' \
  "$om" "$cm" "$(awk -v a="$cm" -v b="$om" 'BEGIN {print a / b}')" "${#one[@]}"
printf '  one process: %s\n  cp=2:        %s\n' "${one[*]}" "${cp[*]}"
