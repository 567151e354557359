#!/usr/bin/env bash
# tandem tokenize against the `tokenizers` package's batch encoder on the
# same corpus, tokenizer and threads: MB of text a second, median of 3.
#
#   bench/tokenize.sh      (about 2 min on 2 cores)
#
# The current figure goes in docs/PERFORMANCE.md, each run's record in
# bench/results/tokenize.md (newest first).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cmake --build "$build" --target tandem >&2
"$py" "$repo/bench/tokenize_bench.py" "$build/tandem"
