#!/usr/bin/env bash
# test.sh — the whole test suite: release build + ctest, ASan/UBSan build + ctest, and (with clang) a short
# libFuzzer run of every fuzz target. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=$(nproc)
# The Python tests run with .venv's python, torch and torchrun when scripts/install-python.sh made it (without
# torch they skip, unless HP_REQUIRE_TORCH=1).
VENV=${HP_VENV:-.venv}
if [ -x "$VENV/bin/python" ]; then
    export VIRTUAL_ENV="$PWD/$VENV" PATH="$PWD/$VENV/bin:$PATH"
fi

echo "== build (RelWithDebInfo, warnings as errors)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHP_WERROR=ON >/dev/null
cmake --build build -j"$JOBS"
echo "== tests"
(cd build && ctest --output-on-failure -j"$JOBS")

echo "== build (ASan + UBSan)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DHP_SANITIZE=ON -DHP_WERROR=ON >/dev/null
cmake --build build-asan -j"$JOBS"
echo "== tests under ASan + UBSan"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j"$JOBS")

if command -v clang >/dev/null 2>&1; then
    echo "== fuzz smoke (libFuzzer, ${HP_FUZZ_SECONDS:-20} s per target)"
    cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DHP_FUZZ=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
    cmake --build build-fuzz -j"$JOBS" --target fuzz_all >/dev/null
    for target in build-fuzz/fuzz/fuzz_*; do
        name=$(basename "$target")
        corpus="fuzz/corpus/${name#fuzz_}"
        scratch=$(mktemp -d)
        "$target" -max_total_time="${HP_FUZZ_SECONDS:-20}" -rss_limit_mb=4096 "$scratch" "$corpus" >"$scratch.log" 2>&1 \
            || { tail -40 "$scratch.log"; echo "fuzz target $name failed"; exit 1; }
        echo "$name: $(grep -o 'Done [0-9]* runs' "$scratch.log" || echo ok)"
        rm -rf "$scratch" "$scratch.log"
    done
fi
echo "== all tests passed"
