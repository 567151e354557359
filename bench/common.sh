# Shared by the bench/*.sh scripts (sourced, not run): sets up and builds,
# the benchmarks included (scripts/setup, then `ninja benches`; with
# TANDEM_PYTHON and TANDEM_BUILD set, uses those instead), then defines repo, build, cache, py and median.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${TANDEM_BUILD:-$repo/build}
cache=${TANDEM_CACHE:-$HOME/.cache/tandem}
if [ -n "${TANDEM_PYTHON:-}" ]; then
  # Another machine's build and Python (scripts/gpu-check's "cpu" section):
  # nothing to set up, and no registry to set up from.
  py=$TANDEM_PYTHON
  [ -x "$build/tandem" ] || { echo "bench: no $build/tandem (TANDEM_BUILD)" >&2; exit 1; }
else
  "$repo/scripts/setup" >&2
  ninja -C "$build" benches >&2  # not part of the default build
  py=$cache/venv-torch-2.11.0/bin/python
fi

# The median of the numbers on standard input, one a line.
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
