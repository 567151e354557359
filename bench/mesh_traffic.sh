#!/usr/bin/env bash
# Bytes per training step over each dimension of the layout (dp, pp),
# counted by tandem's process groups, against each parallelism's analytic
# figure: DDP, ZeRO-1, FSDP (ZeRO-3, ZeRO-2), a pipeline over 2 ranks and
# dp=2 x pp=2 (1F1B, interleaved). Deterministic: a 4-rank job cannot be
# timed meaningfully on 2 cores, but what it sends can be counted exactly.
#
#   bench/mesh_traffic.sh      (about 30 s)
#
# The current figure goes in docs/PERFORMANCE.md, each run's record in
# bench/results/mesh_traffic.md (newest first).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cmake --build "$build" --target tandem >&2
"$py" "$repo/bench/mesh_traffic.py" "$build/tandem"
