#!/usr/bin/env bash
# Installs what Kiln needs on a fresh Debian/Ubuntu machine (as root, or with
# sudo available), builds it into build/ and installs this checkout's Python
# packages (kiln, kiln_executorch_runtime, kiln_runtime) in place into the interpreter it
# used ($PYTHON, else python3), so `import kiln` and `python3 -m kiln` work
# without PYTHONPATH. Safe to run again: installed packages are kept and the
# build is incremental.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "setup: $*"; }

cuda_home=${CUDA_HOME:-/usr/local/cuda}
if [ ! -x "$cuda_home/bin/nvcc" ]; then
  echo "setup: the CUDA 13 toolkit (nvcc, cuBLASLt, NVRTC) is required; none at $cuda_home (set CUDA_HOME)" >&2
  exit 1
fi

# 1. System packages: a C++17 compiler, Ninja, GoogleTest.
need=()
command -v g++ >/dev/null || need+=(g++)
command -v ninja >/dev/null || need+=(ninja-build)
[ -f /usr/include/gtest/gtest.h ] || need+=(libgtest-dev)
if ((${#need[@]})); then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  log "installing Debian packages: ${need[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# 2. Python packages (ExecuTorch 1.5.1 + the torch it pairs with, CMake, nanobind, pytest).
python=${PYTHON:-python3}
if ! $python -c 'import executorch, torch, nanobind, pytest, cmake' 2>/dev/null ||
   [ "$($python -c 'import importlib.metadata as m; print(m.version("executorch"))')" != "1.5.1" ]; then
  log "installing Python packages from requirements.txt (a few minutes on a fresh machine)"
  $python -m pip install -q --disable-pip-version-check -r requirements.txt
fi

# 3. Build: compiler, Python extension, runtime, delegate, runner, tests.
cmake_bin=$($python -c 'import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, "cmake"))')
et_prefix=$($python -c 'import executorch; print(list(executorch.__path__)[0])')
mkdir -p build
log "configuring with $($cmake_bin --version | head -1), ExecuTorch at $et_prefix"
"$cmake_bin" -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$et_prefix" -DPython_EXECUTABLE="$(command -v $python)" \
  -DCUDAToolkit_ROOT="$cuda_home" >/tmp/kiln_configure.log 2>&1 || {
  cat /tmp/kiln_configure.log >&2; exit 1; }
log "building (log: build/build.log)"
"$cmake_bin" --build build -j"$(nproc)" >build/build.log 2>&1 || {
  tail -50 build/build.log >&2; exit 1; }
# 4. The Python packages, in place: a .pth naming this checkout's python/
#    (scripts/install_editable.py; replaces any other kiln in this interpreter).
$python scripts/install_editable.py || exit 1
log "done: build/ holds kiln_runner, the delegate and the tests; python/kiln holds the compiler extension;" \
  "kiln, kiln_executorch_runtime and kiln_runtime are installed from $PWD/python into $($python -c 'import sys; print(sys.executable)')"
