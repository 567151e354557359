#!/usr/bin/env bash
# The optimizer sharded over the ranks (ZeRO stage 1): tandem's optim::ZeroSgd
# against PyTorch's ZeroRedundancyOptimizer(SGD) from the same wheel, both
# under their own DDP on W ranks (Gloo on 127.0.0.1, one compute thread per
# rank, started by `tandem launch` and torchrun), interleaved in one run.
#
#   bench/zero.sh [ROUNDS] [RANKS] [GLOBAL_BATCH] [STEPS]   (defaults: 5, 2, 64, 4)
#
# Per round and implementation: the DDP step on resnet18 (CIFAR stem, random
# 3x32 inputs) with the plain SGD and with the sharded one; PyTorch's sharded
# one twice, with its default (one broadcast per parameter) and with
# parameters_as_bucket_view=True (one per rank's bucket, as tandem). Prints the
# medians of: the whole step, the optimizer's step alone (where the sharded
# one broadcasts the shares), rank 0's momentum in MiB; then the sharded
# step tandem / PyTorch (against both), and each one's cost of sharding
# (sharded step / plain step - 1). The current figure goes in docs/PERFORMANCE.md, each run's record in
# bench/results/zero.md (newest first).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
rounds=${1:-5}
ranks=${2:-2}
batch=${3:-64}
steps=${4:-4}
common=(--mode ddp --model resnet18 --batch "$batch" --steps "$steps" --warmup 1 --threads 1)

field() { grep -o "\"$1\": [0-9.]*" | awk '{print $2}'; }
tandem_run() {  # [--shard-optimizer]
  "$build/tandem" launch --nproc-per-node "$ranks" -- "$build/bench/ddp_step" "${common[@]}" "$@" |
    sed 's/^\[rank 0\] //'
}
pytorch_run() {  # [--shard-optimizer]
  OMP_NUM_THREADS=1 "$py" -W ignore -m torch.distributed.run --standalone --nproc-per-node "$ranks" \
    "$repo/bench/ddp_step.py" "${common[@]}" "$@" 2>/dev/null
}

declare -A step optimizer state
for ((i = 0; i < rounds; i++)); do
  for impl in tandem pytorch; do
    for sharded in plain sharded bucket-view; do
      flag=()
      [[ $sharded == sharded ]] && flag=(--shard-optimizer)
      if [[ $sharded == bucket-view ]]; then
        [[ $impl == pytorch ]] || continue
        flag=(--shard-optimizer --zero-bucket-view)
      fi
      out=$(${impl}_run "${flag[@]}")
      key="$impl $sharded"
      step[$key]+="$(echo "$out" | field step_ms) "
      optimizer[$key]+="$(echo "$out" | field optimizer_ms) "
      state[$key]=$(echo "$out" | field state_mib)
    done
  done
done

med() { local -n table=$1; printf '%s\n' ${table[$2]} | median; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a / b}'; }
keys=("tandem plain" "tandem sharded" "pytorch plain" "pytorch sharded" "pytorch bucket-view")
for key in "${keys[@]}"; do
  echo "rounds, $key: step ms ${step[$key]}; optimizer ms ${optimizer[$key]}"
done
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "torch: $("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null); resnet18 (CIFAR stem), 3x32, global batch $batch, $ranks ranks, 1 thread per rank, $rounds rounds"
for key in "${keys[@]}"; do
  printf '%-20s step %8.1f ms   optimizer step %7.1f ms   rank 0 momentum %6.2f MiB\n' "$key" \
    "$(med step "$key")" "$(med optimizer "$key")" "${state[$key]}"
done
for peer in sharded bucket-view; do
  echo "sharded step, tandem / pytorch $peer: $(ratio "$(med step "tandem sharded")" "$(med step "pytorch $peer")")"
  echo "sharded optimizer step, tandem / pytorch $peer: $(ratio "$(med optimizer "tandem sharded")" "$(med optimizer "pytorch $peer")")"
done
for key in "tandem sharded" "pytorch sharded" "pytorch bucket-view"; do
  echo "cost of sharding, $key: $(awk -v a="$(med step "$key")" -v b="$(med step "${key%% *} plain")" \
    'BEGIN {printf "%+.1f%%", (a / b - 1) * 100}') of the step"
done
