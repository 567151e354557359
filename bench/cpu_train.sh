#!/usr/bin/env bash
# CPU training throughput, tandem (C++) against PyTorch eager (Python), same
# wheel, same model, data, batch and optimizer, interleaved in one run.
#
#   bench/cpu_train.sh [ROUNDS]        (default 5 rounds per pair)
#
# For each case it alternates the two implementations ROUNDS times (one
# process each, a few timed windows per process) and prints the medians and
# their ratio. The current figure goes in docs/PERFORMANCE.md, each run's record in
# bench/results/cpu_train.md (newest first).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
rounds=${1:-5}

ips() { grep -o '"images_per_second": [0-9.]*' | awk '{print $2}'; }

run_case() {
  local label=$1; shift
  local t=() p=()
  for ((i = 0; i < rounds; i++)); do
    t+=($("$build/bench/train_throughput" "$@" | ips))
    p+=($("$py" -W ignore "$repo/bench/train_throughput.py" "$@" | ips))
  done
  local tm pm
  tm=$(printf '%s\n' "${t[@]}" | median)
  pm=$(printf '%s\n' "${p[@]}" | median)
  printf '%-44s tandem %8.1f img/s   pytorch %8.1f img/s   ratio %.3f   (n=%d each)\n' \
    "$label" "$tm" "$pm" "$(awk -v a="$tm" -v b="$pm" 'BEGIN {print a / b}')" "${#t[@]}"
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "torch: $("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null), threads: default"
run_case "convnet, Fashion-MNIST, batch 256" --model convnet --data fashion-mnist --batch 256 --steps 20 --rounds 3
# Activation checkpointing: tandem's Sequence segments against checkpoint_sequential
# (use_reentrant=False) over the same 12 layers, 3 segments (4 + 4 recomputed).
run_case "convnet, Fashion-MNIST, 256, checkpointed (3)" --model convnet --data fashion-mnist --batch 256 --steps 20 --rounds 3 \
  --checkpoint-activations 3
run_case "resnet18 (CIFAR stem), random 3x32, batch 256" --model resnet18 --data random:3x32 --batch 256 --steps 2 --warmup 1 --rounds 1
