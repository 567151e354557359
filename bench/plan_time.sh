#!/usr/bin/env bash
# tandem plan's predicted step time against tandem train's measured median,
# with profiles of this machine made by tandem plan --calibrate, for
# layouts of llama-tiny, gpt2-tiny and resnet18 on 2 and 4 CPU ranks; and
# whether the planner ranks each job's three fastest layouts as the runs do.
#
#   bench/plan_time.sh      (about 12 min on 2 cores)
#
# The current figure goes in docs/PERFORMANCE.md, each run's record in
# bench/results/plan_time.md (newest first).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cmake --build "$build" --target tandem >&2
"$py" "$repo/bench/plan_time.py" "$build/tandem"
