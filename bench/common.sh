# Shared by the bench/*.sh scripts (sourced, not run): sets up and builds
# (scripts/setup), then defines repo, build, cache, py and median.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$repo/scripts/setup" >&2
build=${TANDEM_BUILD:-$repo/build}
cache=${TANDEM_CACHE:-$HOME/.cache/tandem}
py=$cache/venv-torch-2.11.0/bin/python

# The median of the numbers on standard input, one a line.
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
