#!/usr/bin/env bash
# The CPU fuzz harness (tests/fuzz/README.md): exports the small sample .pte
# files (tests/fuzz/export_samples.py), builds kiln_fuzz with ASan + UBSan into
# build-fuzz/, and runs it: damaged .pte files through kiln_runner's load path,
# damaged engines through parse_engine + validate_engine. Needs the compiler
# extension built by scripts/setup.sh. Exits non-zero on any crash, sanitizer
# report or hang; its last line reads "fuzz: N passed, N failed".
#   KILN_FUZZ_CASES (default 20000)  KILN_FUZZ_SEED (default 13)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
cases=${KILN_FUZZ_CASES:-20000}
seed=${KILN_FUZZ_SEED:-13}
cmake_bin=$($python -c 'import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, "cmake"))')
et_prefix=$($python -c 'import executorch; print(list(executorch.__path__)[0])')
out=build-fuzz
samples=$out/samples
mkdir -p "$out"

# Samples: exported again when the exporter or the compiler extension changed.
compiler_ext=$(ls python/kiln/_kiln_compiler*.so 2>/dev/null | head -1)
if [ ! -f "$samples/samples.json" ] || [ tests/fuzz/export_samples.py -nt "$samples/samples.json" ] ||
   { [ -n "$compiler_ext" ] && [ "$compiler_ext" -nt "$samples/samples.json" ]; }; then
  echo "fuzz: exporting the sample programs into $samples"
  rm -rf "$samples"
  PYTHONPATH=python $python tests/fuzz/export_samples.py --out "$samples" >"$out/export.log" 2>&1 || {
    tail -30 "$out/export.log" >&2; exit 1; }
fi

echo "fuzz: building kiln_fuzz (ASan + UBSan) in $out"
"$cmake_bin" -S tests/fuzz -B "$out" -G Ninja -DCMAKE_PREFIX_PATH="$et_prefix" \
  >"$out/configure.log" 2>&1 || { cat "$out/configure.log" >&2; exit 1; }
"$cmake_bin" --build "$out" -j2 >"$out/build.log" 2>&1 || { tail -40 "$out/build.log" >&2; exit 1; }

# handle_abort: an abort() (std::terminate, ET_CHECK) counts as a crash.
# Leaks are not checked here: ExecuTorch's registries live for the process.
export ASAN_OPTIONS=${ASAN_OPTIONS:-handle_abort=1:detect_leaks=0:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
mkdir -p "$out/crashes"
timeout 900 "$out/kiln_fuzz" --cases="$cases" --seed="$seed" --out="$out/crashes" "$samples"/*.pte
