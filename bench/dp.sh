#!/usr/bin/env bash
# DataParallel on repeated CPU devices against one device, per training step
# (bench/dp_step.cpp says which configurations and why).
#
#   bench/dp.sh [ROUNDS] [BATCH]   (defaults: 5 rounds, batch 256; convnet on 1x28x28)
#
# Prints the medians over rounds of each configuration's median step time,
# DataParallel's own overhead (one replica against the plain model, one
# thread) and DataParallel over cpu,cpu against the plain model on the same
# two cores. libtorch's own data_parallel is tried as the peer; it refuses
# CPU tensors, which the script reports. The current figure goes in docs/PERFORMANCE.md, each run's record in
# bench/results/dp.md (newest first).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
rounds=${1:-5}
batch=${2:-256}

field() { grep -o "\"$1\": [-0-9.]*" | awk '{print $2}'; }
out=""
for ((i = 0; i < rounds; i++)); do
  out+="$("$build/bench/dp_step" --batch "$batch" --steps 10)"$'\n'
done
med() { echo -n "$out" | field "$1" | median; }
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "convnet, 1x28x28, batch $batch, $rounds rounds of 10 interleaved steps"
for c in plain-1 dp-cpu plain-2 dp-cpu2 dp-cpu2-t2; do
  printf '%-11s %8.1f ms\n' "$c" "$(med "${c}_ms")"
done
echo "libtorch data_parallel over cpu,cpu: $(echo -n "$out" | grep -o '"torch-dp2_error": "[^"]*"' | head -1 | cut -d'"' -f4)"
printf 'DataParallel overhead, one replica vs plain (1 thread): %+.1f%%\n' "$(awk -v x="$(med dp_overhead)" 'BEGIN {print 100 * x}')"
printf 'DataParallel cpu,cpu vs plain on 2 threads: %.3f (1 thread per replica), %.3f (2 threads)\n' \
  "$(med dp2_vs_plain2)" "$(med dp2t2_vs_plain2)"
