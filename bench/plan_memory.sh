#!/usr/bin/env bash
# tandem plan's predicted peak memory a rank against the peak tandem train
# measures (--count-memory: every tensor counted), for layouts of
# llama-tiny, gpt2-tiny, mixtral-tiny, resnet18 and convnet on 2 and 4 CPU
# ranks. Deterministic to about 1%
# (the allocation order of threads varies).
#
#   bench/plan_memory.sh      (about 4 min)
#
# The current figure goes in docs/PERFORMANCE.md, each run's record in
# bench/results/plan_memory.md (newest first).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cmake --build "$build" --target tandem >&2
"$py" "$repo/bench/plan_memory.py" "$build/tandem"
