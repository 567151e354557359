#!/usr/bin/env bash
# Issue 4's goal (a), scaling efficiency from 1 to 2 ranks at a fixed global
# batch, tandem's DDP against PyTorch's, like for like.
#
#   bench/ddp_scaling.sh [ROUNDS] [GLOBAL_BATCH] [PAIRS]   (defaults: 5, 128, 5)
#
# Each process is `ddp_step --mode scaling` (C++ under `tandem launch`, Python
# under torchrun, 2 ranks, one compute thread each, Gloo on 127.0.0.1):
# the ranks alternate one DDP step at GLOBAL_BATCH / 2 images each with one
# plain step of an un-wrapped copy of resnet18 (CIFAR stem) on the whole
# batch on rank 0, and print the median over PAIRS pairs of
# t(plain) / (2 t(DDP)) (Note [paired scaling] in bench/ddp_step.cpp).
#
# The efficiency depends on how fast the one-process step is, and that
# depends on glibc's malloc settings: at batch 128 the first layers'
# activations (16 to 34 MB) are unmapped and mapped again every step under
# glibc's defaults, which slows the whole-batch step more than the half-batch
# one and so raises the ratio. tandem sets the thresholds itself (Note
# [malloc for training]); PyTorch in Python runs with the defaults. So each
# round runs both implementations under both settings, interleaved:
#   default: glibc's defaults (tandem with TANDEM_DEFAULT_MALLOC=1)
#   tuned:   tandem's settings (PyTorch with the same MALLOC_*_ variables)
# and prints the per-round efficiencies, their medians and the per-round
# differences tandem - PyTorch. The current figure goes in docs/PERFORMANCE.md, each run's record in
# bench/results/ddp.md (newest first).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
rounds=${1:-5}
batch=${2:-128}
pairs=${3:-5}
args=(--mode scaling --model resnet18 --batch "$batch" --steps "$pairs" --warmup 1 --threads 1)
# tandem's tune_malloc_for_training(), as glibc's environment variables.
tuned=(MALLOC_MMAP_THRESHOLD_=$((32 << 20)) MALLOC_TRIM_THRESHOLD_=$((1 << 30)) MALLOC_TOP_PAD_=$((64 << 20)))

field() { grep -o "\"$1\": [0-9.]*" | awk '{print $2}'; }
tandem_run() {  # default|tuned
  local env=(TANDEM_DEFAULT_MALLOC=1)
  [[ $1 == tuned ]] && env=()
  env "${env[@]}" "$build/tandem" launch --nproc-per-node 2 -- "$build/bench/ddp_step" "${args[@]}" |
    sed 's/^\[rank 0\] //'
}
pytorch_run() {  # default|tuned
  local env=()
  [[ $1 == tuned ]] && env=("${tuned[@]}")
  env "${env[@]}" OMP_NUM_THREADS=1 "$py" -W ignore -m torch.distributed.run --standalone \
    --nproc-per-node 2 "$repo/bench/ddp_step.py" "${args[@]}" 2>/dev/null
}

declare -A eff plain step
for ((i = 0; i < rounds; i++)); do
  for malloc in default tuned; do
    for impl in tandem pytorch; do
      out=$(${impl}_run "$malloc")
      eff[$impl-$malloc]+="$(echo "$out" | field efficiency) "
      plain[$impl-$malloc]+="$(echo "$out" | field plain_ms) "
      step[$impl-$malloc]+="$(echo "$out" | field step_ms) "
      # As it goes, on stderr: a run cut off by a time limit still leaves its rounds.
      echo "round $((i + 1)) malloc $malloc $impl: efficiency $(echo "$out" | field efficiency)" \
        "plain $(echo "$out" | field plain_ms) ms, DDP step $(echo "$out" | field step_ms) ms" >&2
    done
  done
done

med() { printf '%s\n' $1 | median; }
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "torch: $("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null); resnet18 (CIFAR stem), 3x32," \
  "global batch $batch, 2 ranks, 1 thread per rank, $rounds rounds of $pairs pairs"
for malloc in default tuned; do
  echo "malloc $malloc:"
  for impl in tandem pytorch; do
    k=$impl-$malloc
    printf '  %-8s efficiency per round: %s  median %.4f   (median plain %.1f ms, DDP step %.1f ms)\n' "$impl" \
      "${eff[$k]}" "$(med "${eff[$k]}")" "$(med "${plain[$k]}")" "$(med "${step[$k]}")"
  done
  diffs=$(paste -d' ' <(printf '%s\n' ${eff[tandem-$malloc]}) <(printf '%s\n' ${eff[pytorch-$malloc]}) |
    awk '{printf "%+.4f\n", $1 - $2}')
  echo "  tandem - pytorch per round: $(echo "$diffs" | xargs)  median $(echo "$diffs" | median)" \
    "  rounds where tandem >= pytorch: $(echo "$diffs" | grep -c '^+' || true) of $rounds"
done
