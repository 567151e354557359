#!/usr/bin/env bash
# Data-parallel step time, tandem's DistributedDataParallel against PyTorch's
# (same wheel, Gloo on 127.0.0.1, one compute thread per rank, processes
# started by `tandem launch` and torchrun), interleaved in one run.
#
#   bench/ddp.sh [ROUNDS] [GLOBAL_BATCH] [STEPS]   (defaults: 5 rounds, batch 64, 4 steps)
#
# Per round and implementation: one process without DDP, one rank of DDP,
# two ranks of DDP, each at the same global batch on resnet18 (CIFAR stem,
# random 3x32 inputs); and, as the compute-only bound of (a), one tandem
# process without DDP at the per-rank batch. Prints the medians and:
#  (a) scaling efficiency 1 -> 2 ranks: t(1 rank, no DDP) / (2 t(2 ranks)),
#      from the medians, and per round (with the median of those)
#  (b) step time at 2 ranks, tandem / PyTorch
#  (c) share of all-reduce time hidden behind backward (tandem's timeline)
#  (d) DDP overhead on one rank: t(1 rank DDP) / t(no DDP) - 1, from separate
#      processes, and from --mode paired: one process alternating steps of a
#      plain model and of the same model under DDP in a group of one (batch
#      16, 15 pairs a process, the median of the per-pair ratios), which
#      cancels the machine's drift
# The current figure goes in docs/PERFORMANCE.md, each run's record in
# bench/results/ddp.md (newest first).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
rounds=${1:-5}
batch=${2:-64}
steps=${3:-4}
common=(--model resnet18 --batch "$batch" --steps "$steps" --warmup 1 --threads 1)

field() { grep -o "\"$1\": [0-9.]*" | awk '{print $2}'; }
tandem_run() {  # RANKS MODE
  if [[ $2 == none ]]; then
    "$build/bench/ddp_step" --mode none "${common[@]}"
  else
    "$build/tandem" launch --nproc-per-node "$1" -- "$build/bench/ddp_step" --mode "$2" "${common[@]}" |
      sed 's/^\[rank 0\] //'
  fi
}
pytorch_run() {  # RANKS MODE
  if [[ $2 == none ]]; then
    "$py" -W ignore "$repo/bench/ddp_step.py" --mode none "${common[@]}"
  else
    OMP_NUM_THREADS=1 "$py" -W ignore -m torch.distributed.run --standalone --nproc-per-node "$1" \
      "$repo/bench/ddp_step.py" --mode "$2" "${common[@]}" 2>/dev/null
  fi
}

declare -A ms
hidden=() exposed=() half=()
for ((i = 0; i < rounds; i++)); do
  half+=("$("$build/bench/ddp_step" --mode none "${common[@]}" --batch $((batch / 2)) | field step_ms)")
  for impl in tandem pytorch; do
    for config in "1 none" "1 ddp" "2 ddp"; do
      out=$(${impl}_run $config)
      key="$impl ${config// /-}"
      ms[$key]+="$(echo "$out" | field step_ms) "
      if [[ $impl == tandem && $config == "2 ddp" ]]; then
        hidden+=("$(echo "$out" | field hidden_share)")
        exposed+=("$(echo "$out" | field exposed_ms)")
      fi
    done
  done
done

paired_t=() paired_p=()
for ((i = 0; i < rounds; i++)); do
  paired_t+=("$("$build/bench/ddp_step" --mode paired --model resnet18 --batch 16 --steps 15 --warmup 1 | field ratio)")
  paired_p+=("$("$py" -W ignore "$repo/bench/ddp_step.py" --mode paired --model resnet18 --batch 16 --steps 15 --warmup 1 | field ratio)")
done

med() { printf '%s\n' ${ms[$1]} | median; }
for key in "tandem 1-none" "tandem 1-ddp" "tandem 2-ddp" "pytorch 1-none" "pytorch 1-ddp" "pytorch 2-ddp"; do
  echo "rounds, $key (ms): ${ms[$key]}"
done
echo "rounds, tandem without DDP at the per-rank batch (ms): ${half[*]}"
echo "rounds, paired ratios DDP / plain: tandem ${paired_t[*]}; pytorch ${paired_p[*]}"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "torch: $("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null); resnet18 (CIFAR stem), 3x32, global batch $batch, 1 thread per rank, $rounds rounds"
for impl in tandem pytorch; do
  printf '%-8s no DDP %8.1f ms   DDP 1 rank %8.1f ms   DDP 2 ranks %8.1f ms\n' "$impl" \
    "$(med "$impl 1-none")" "$(med "$impl 1-ddp")" "$(med "$impl 2-ddp")"
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a / b}'; }
t1=$(med "tandem 1-none"); t1d=$(med "tandem 1-ddp"); t2=$(med "tandem 2-ddp")
p1=$(med "pytorch 1-none"); p1d=$(med "pytorch 1-ddp"); p2=$(med "pytorch 2-ddp")
echo "(a) scaling efficiency 1->2 ranks: tandem $(ratio "$t1" "$(awk -v x="$t2" 'BEGIN {print 2 * x}')")   pytorch $(ratio "$p1" "$(awk -v x="$p2" 'BEGIN {print 2 * x}')")"
# Per round, each implementation's 1-process and 2-rank runs are minutes
# apart at most, so their ratio escapes the drift between rounds that the
# ratio of medians above carries; both are printed.
per_round() {  # IMPL: that implementation's efficiency in each round
  paste -d' ' <(printf '%s\n' ${ms["$1 1-none"]}) <(printf '%s\n' ${ms["$1 2-ddp"]}) |
    awk '{printf "%.3f\n", $1 / (2 * $2)}'
}
echo "(a) per round: tandem $(per_round tandem | xargs)   pytorch $(per_round pytorch | xargs);" \
  "medians: tandem $(per_round tandem | median | xargs printf '%.3f')   pytorch $(per_round pytorch | median | xargs printf '%.3f')"
h=$(printf '%s\n' "${half[@]}" | median)
printf '(a) bound from compute alone: tandem without DDP at the per-rank batch %s takes %.1f ms, so t(1)/(2 x that) = %s\n' \
  "$((batch / 2))" "$h" "$(ratio "$t1" "$(awk -v x="$h" 'BEGIN {print 2 * x}')")"
echo "(b) step time at 2 ranks, tandem / pytorch: $(ratio "$t2" "$p2")"
echo "(c) all-reduce time hidden behind backward (tandem, 2 ranks, median of rounds): $(printf '%s\n' "${hidden[@]}" | median); exposed after backward: $(printf '%s\n' "${exposed[@]}" | median) ms"
echo "(d) DDP overhead on one rank: tandem $(awk -v a="$t1d" -v b="$t1" 'BEGIN {printf "%+.1f%%", (a / b - 1) * 100}')   pytorch $(awk -v a="$p1d" -v b="$p1" 'BEGIN {printf "%+.1f%%", (a / b - 1) * 100}')"
pt=$(printf '%s\n' "${paired_t[@]}" | median); pp=$(printf '%s\n' "${paired_p[@]}" | median)
echo "(d) paired, one process: tandem $(awk -v a="$pt" 'BEGIN {printf "%+.1f%%", (a - 1) * 100}')   pytorch $(awk -v a="$pp" 'BEGIN {printf "%+.1f%%", (a - 1) * 100}')"
