#!/usr/bin/env bash
# Configures (once) and builds the fuzzing tree, as the CTest fixture that
# the fuzz tests require (fuzz.build): clang, libFuzzer and AddressSanitizer
# over the readers of untrusted input and fuzz/ alone.
#   fuzz/build.sh SOURCE_DIR BUILD_DIR PREFIX_PATH [CUDA_COMPILER]
# PREFIX_PATH is the main tree's CMAKE_PREFIX_PATH, ':'-separated (torch).
# Run by ctest beside the other tests, it compiles one file at a time
# (TANDEM_FUZZ_JOBS, default 1) so that it takes the cycles the other
# tests leave rather than theirs; nothing but the fuzz tests waits for it.
# Each target's sources compile as one unit (CMake's unity build), which
# parses libtorch's headers once per target: 108 s alone on the 2-core
# machine rather than 166 s. It compiles at -O1, as libFuzzer's documentation
# advises (CMakeLists.txt): a fresh tree takes 192 s of CPU at -j2 against
# 217 s at -O2, the fuzzers' executions in 6 s about the same. Beside the
# tests (one compile at a time) it took 509 s in a fresh-clone CI run.
# Of the data layer it compiles the readers alone (fuzz/CMakeLists.txt):
# a fresh tree at -j2 took 197 s of CPU (143 s) against 275 s (188 s)
# with the whole layer.
set -euo pipefail
src=$1 build=$2 prefix=$3 cuda=${4:-}
if [ ! -f "$build/build.ninja" ]; then
  # No build.ninja: any cache there is from a configure that failed.
  rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
  args=(-S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++
        -DTANDEM_FUZZ=ON -DBUILD_TESTING=OFF -DCMAKE_UNITY_BUILD=ON "-DCMAKE_PREFIX_PATH=${prefix//:/;}")
  [ -n "$cuda" ] && args+=("-DCMAKE_CUDA_COMPILER=$cuda")
  cmake "${args[@]}" > "$build.configure.log" 2>&1 || { tail -30 "$build.configure.log"; exit 1; }
fi
ninja -C "$build" -j "${TANDEM_FUZZ_JOBS:-1}" | tail -3
