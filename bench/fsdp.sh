#!/usr/bin/env bash
# Fully sharded data parallelism (ZeRO-3): tandem's --mode fsdp of
# build/bench/ddp_step (parallel::FullyShardedDataParallel) against PyTorch's
# FSDP (fully_shard, FSDP2) from the same wheel, and each against its own
# DDP, on W ranks (Gloo on 127.0.0.1, one compute thread per rank, started by
# `tandem launch` and torchrun), the four interleaved in every round.
#
#   bench/fsdp.sh [ROUNDS] [RANKS] [GLOBAL_BATCH] [STEPS] [SHARDING]
#                                            (defaults: 5, 2, 64, 4, full)
#
# resnet18 (CIFAR stem, random 3x32 inputs). Units: tandem's default plan
# (conv1..layer1.1 | layer2.0 | layer2.1 | layer3.0 | layer3.1 | layer4.0 |
# layer4.1..fc); PyTorch: fully_shard on layer1, on each block of layer2 to
# layer4, and on the root (conv1, bn1, fc). SHARDING: full (reshard after
# forward, ZeRO-3) or grad-op (ZeRO-2). Prints the medians over rounds of:
# the step, what rank 0 holds between steps for training (parameters or
# shards, gradients, momentum: held MiB), rank 0's peak resident memory
# (max RSS: the runtime, the activations and what malloc keeps) and, for
# tandem, the peak of live bytes in its CPU allocator over the timed steps
# (ddp_step --count-memory; PyTorch has no such counter on the CPU); then
# FSDP's step tandem / PyTorch, and each one's FSDP step / DDP step.
# The current figure goes in docs/PERFORMANCE.md, each run's record in
# bench/results/fsdp.md (newest first).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
rounds=${1:-5}
ranks=${2:-2}
batch=${3:-64}
steps=${4:-4}
sharding=${5:-full}
common=(--model resnet18 --batch "$batch" --steps "$steps" --warmup 1 --threads 1)

field() { grep -o "\"$1\": [0-9.]*" | awk '{print $2}'; }
tandem_run() {  # --mode ddp|fsdp ...
  "$build/tandem" launch --nproc-per-node "$ranks" -- "$build/bench/ddp_step" "${common[@]}" --count-memory "$@" |
    sed 's/^\[rank 0\] //'
}
pytorch_run() {
  OMP_NUM_THREADS=1 "$py" -W ignore -m torch.distributed.run --standalone --nproc-per-node "$ranks" \
    "$repo/bench/ddp_step.py" "${common[@]}" "$@" 2>/dev/null
}

declare -A step held rss live
for ((i = 0; i < rounds; i++)); do
  for impl in tandem pytorch; do
    for mode in ddp fsdp; do
      flag=(--mode "$mode")
      [[ $mode == fsdp ]] && flag+=(--fsdp-sharding "$sharding")
      out=$(${impl}_run "${flag[@]}")
      key="$impl $mode"
      step[$key]+="$(echo "$out" | field step_ms) "
      held[$key]+="$(echo "$out" | field held_mib) "
      rss[$key]+="$(echo "$out" | field max_rss_mib) "
      [[ $impl == tandem ]] && live[$key]+="$(echo "$out" | field peak_live_mib) "
    done
  done
done

med() { local -n table=$1; printf '%s\n' ${table[$2]} | median; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a / b}'; }
keys=("tandem ddp" "tandem fsdp" "pytorch ddp" "pytorch fsdp")
for key in "${keys[@]}"; do
  echo "rounds, $key: step ms ${step[$key]}; held MiB ${held[$key]}; max RSS MiB ${rss[$key]}; peak live MiB ${live[$key]:-}"
done
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "torch: $("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null); resnet18 (CIFAR stem), 3x32, global batch $batch, $ranks ranks, 1 thread per rank, FSDP sharding $sharding, $rounds rounds"
for key in "${keys[@]}"; do
  peak=-
  [[ $key == tandem* ]] && peak=$(med live "$key")
  printf '%-13s step %8.1f ms   held %7.2f MiB   max RSS %7.1f MiB   peak live %s MiB\n' "$key" \
    "$(med step "$key")" "$(med held "$key")" "$(med rss "$key")" "$peak"
done
echo "fsdp step, tandem / pytorch: $(ratio "$(med step "tandem fsdp")" "$(med step "pytorch fsdp")")"
for impl in tandem pytorch; do
  echo "$impl: fsdp step / ddp step $(ratio "$(med step "$impl fsdp")" "$(med step "$impl ddp")"), held $(ratio "$(med held "$impl fsdp")" "$(med held "$impl ddp")") of ddp's"
done
