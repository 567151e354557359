#!/usr/bin/env bash
# tandem plan's predicted step time against tandem train's measured median,
# with a profile of this machine made by tandem plan --calibrate, for
# layouts of llama-tiny and gpt2-tiny on 2 and 4 CPU ranks; and whether the
# planner ranks each job's three fastest layouts as the runs do.
#
#   bench/plan_time.sh      (about 6 min on 2 cores)
#
# The current figure goes in docs/PERFORMANCE.md, each run's record in
# bench/results/plan_time.md (newest first).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cmake --build "$build" --target tandem >&2
"$py" "$repo/bench/plan_time.py" "$build/tandem"
