#!/usr/bin/env bash
# The measured pipeline bubble against the textbook (p-1)/(m+p-1), for GPipe,
# 1F1B and interleaved 1F1B (2 chunks per stage, textbook (p-1)/(2m+p-1)
# where p divides m) and m = 1, 2, 4, 8 (bench/pipeline_step.cpp says how).
#
#   bench/pipeline.sh [ROUNDS] [STAGES] [HOLD_US]
#     (defaults: 5 rounds, 2 stages, 0; a computing stage needs a core)
#
# HOLD_US 0: stages of Linear(512, 512) + ReLU blocks that compute. HOLD_US
# > 0: held stages (Note [held stages]): each block holds its thread for
# HOLD_US us per 64 rows in forward and twice that in backward, around a
# Linear(16, 16), so the stages cost the same whatever else the machine
# runs and the figures are the schedule's and the executor's.
#
# Each round runs pipeline_step once per schedule (15 timed steps per m);
# the script prints, per schedule and m, the medians over rounds of: the
# mean idle share of the stages, its ratio to the textbook share (goal:
# within 10%), the least and the most idle stage's own ratio, the speed-up
# over the unsplit model in one thread (and the ideal p m / (m + p - 1)),
# and how much longer a step took than its own measured actions replayed
# with instant hand-offs (the executor's cost),
# and how much longer than the textbook step time for the stages' busy time;
# then per stage its median forward and backward action, beside one piece's
# forward + backward of a micro-batch alone (unequal or mutually slowed
# stages are the machine's doing, not the schedule's).
# The current figure goes in docs/PERFORMANCE.md, each run's record in
# bench/results/pipeline.md (newest first).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
rounds=${1:-5}
stages=${2:-2}
hold=${3:-0}
model=(--width 512)
describe="Linear(512,512)+ReLU blocks, 1 thread per stage"
if ((hold > 0)); then
  model=(--width 16 --hold-us "$hold")
  describe="held blocks (${hold} us forward, $((2 * hold)) us backward per 64 rows)"
fi

field() { grep -o "\"$1\": [0-9.]*" | awk '{print $2}'; }
declare -A lines
for ((i = 0; i < rounds; i++)); do
  for schedule in gpipe 1f1b interleaved; do
    while read -r line; do
      m=$(echo "$line" | field m)
      lines[$schedule-$m]+="$line"$'\n'
      echo "round $((i + 1)) $line" >&2  # as it goes: a run cut off still leaves its rounds
    done < <("$build/bench/pipeline_step" --schedule "$schedule" --stages "$stages" "${model[@]}" \
               --micro-batches 1,2,4,8)
  done
done
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "$stages stages of $describe on cpu x $stages, 64 rows per micro-batch, $rounds rounds"
printf '%-11s %3s %10s %9s %7s %11s %10s %9s %7s %12s %14s\n' schedule m idle textbook ratio least_idle most_idle speedup ideal \
  over_replay over_textbook
# Each stage's median forward and backward action over the rounds, and one
# piece's forward + backward alone: unequal stages, or stages slowed by
# running beside each other, are the machine's doing, not the schedule's.
per_stage() {  # KEY: the per-stage medians of a list-valued field
  local rows out="" i n
  rows=$(echo -n "$all" | grep -o "\"$1\": \[[^]]*\]" | sed 's/.*\[//; s/\]//; s/,/ /g')
  n=$(echo "$rows" | head -1 | wc -w)
  for ((i = 1; i <= n; i++)); do
    out+=$(printf '%s%.3f' "${out:+ }" "$(echo "$rows" | awk -v i="$i" '{print $i}' | median)")
  done
  echo "$out"
}
summary=$(
for schedule in gpipe 1f1b interleaved; do
  for m in 1 2 4 8; do
    all=${lines[$schedule-$m]}
    med() { echo -n "$all" | field "$1" | median; }
    printf '%-11s %3s %10.3f %9.3f %7.3f %11.3f %10.3f %9.3f %7.3f %12.3f %14.3f\n' "$schedule" "$m" \
      "$(med idle_share)" "$(med textbook)" "$(med ratio)" "$(med least_idle_ratio)" "$(med most_idle_ratio)" \
      "$(med speedup)" "$(med ideal_speedup)" "$(med over_replay)" "$(med over_textbook)"
  done
done)
echo "$summary"
echo "per stage, ms (medians over rounds): forward, backward, and one piece's forward + backward alone"
for schedule in gpipe 1f1b interleaved; do
  for m in 1 2 4 8; do
    all=${lines[$schedule-$m]}
    printf '%-11s %3s  forward %-24s backward %-24s alone %s\n' "$schedule" "$m" "$(per_stage stage_forward_ms)" \
      "$(per_stage stage_backward_ms)" "$(echo -n "$all" | field alone_forward_backward_ms | median)"
  done
done
