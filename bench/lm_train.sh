#!/usr/bin/env bash
# A language model's CPU training step, tandem (C++) against nanoGPT's GPT-2
# in PyTorch eager (Python), same wheel, sizes, tokens and AdamW,
# interleaved in one run.
#
#   bench/lm_train.sh [ROUNDS]        (default 5 rounds per pair)
#
# Prints the medians of tokens a second and their ratio per case. The
# current figure goes in docs/PERFORMANCE.md, each run's record in
# bench/results/lm_train.md (newest first).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
rounds=${1:-5}

tps() { grep -o '"tokens_per_second": [0-9.]*' | awk '{print $2}'; }

run_case() {
  local label=$1; shift
  local t=() p=()
  for ((i = 0; i < rounds; i++)); do
    t+=($("$build/bench/lm_throughput" "$@" | tps))
    p+=($("$py" -W ignore "$repo/bench/lm_throughput.py" "$@" | tps))
  done
  local tm pm
  tm=$(printf '%s\n' "${t[@]}" | median)
  pm=$(printf '%s\n' "${p[@]}" | median)
  printf '%-46s tandem %9.1f tok/s   pytorch %9.1f tok/s   ratio %.3f   (n=%d each)\n' \
    "$label" "$tm" "$pm" "$(awk -v a="$tm" -v b="$pm" 'BEGIN {print a / b}')" "${#t[@]}"
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "torch: $("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null), threads: default"
run_case "gpt2-tiny, bytes (vocab 256), 16 x 256" --model gpt2-tiny --vocab 256 --seq-len 256 --batch 16 --steps 5 --rounds 3
run_case "gpt2-tiny, GPT-2 vocab (50304), 8 x 128" --model gpt2-tiny --vocab 50304 --seq-len 128 --batch 8 --steps 3 --rounds 3
