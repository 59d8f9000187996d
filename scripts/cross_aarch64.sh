#!/usr/bin/env bash
# Cross-builds Kiln's run side (caller-stream library, runtime, ExecuTorch
# delegate, kiln_runner) for aarch64 Linux on an x86_64 Debian/Ubuntu machine,
# then runs the aarch64 kiln_runner under qemu-user on an exported .pte and
# checks that it gives the clear no-GPU answer (exit 3, "this machine has no
# usable CUDA GPU"), as the x86 runner does on a machine without a GPU.
# docs/jetson.md says what a Jetson needs; this is what CI checks of it.
#
# What it uses (nothing else is downloaded):
#   Debian packages   g++-aarch64-linux-gnu, qemu-user (installed if missing)
#   PyPI, aarch64     executorch (C++ runtime, headers, CMake package),
#                     nvidia-cuda-runtime (libcudart.so.13), nvidia-cublas
#                     (libcublasLt.so.13), nvidia-cudnn-cu13 (libcudnn.so.9 and
#                     its headers), fetched with `pip download` and unpacked
#                     (only the files the build and the run need) into
#                     $KILN_CROSS_CACHE (default ~/.cache/kiln/aarch64)
#   the host's CUDA toolkit headers ($CUDA_HOME/include; they do not depend on
#   the architecture) and nvcc (only asked for its version by CMake)
#   the host build (build/, python/kiln) to export the .pte: it runs
#   scripts/setup.sh first if the compiler extension is not built yet
#
# The driver library libcuda.so.1 is not linked (src/runtime/CMakeLists.txt):
# libcudart loads it when first needed, so under qemu, where there is none, the
# runner starts and says why it cannot run the model.
#
# It also installs the CMake package (build-aarch64/install) and builds and runs
# examples/cpp_module_app against it the same way.
#
# Output: build-aarch64/ and lines "cross_aarch64: PASS ..." / "... FAIL ...";
# exit 0 when everything passed. KILN_CROSS_SKIP_QEMU=1 stops after the build.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

log() { echo "cross_aarch64: $*"; }
fail() { echo "cross_aarch64: FAIL $*" >&2; exit 1; }
t_start=$SECONDS
phase_start=$SECONDS
phase_done() { log "$1 done in $((SECONDS - phase_start)) s"; phase_start=$SECONDS; }

triple=aarch64-linux-gnu
cuda_home=${CUDA_HOME:-/usr/local/cuda}
python=${PYTHON:-python3}
cache=${KILN_CROSS_CACHE:-$HOME/.cache/kiln/aarch64}
build=${KILN_CROSS_BUILD:-build-aarch64}
case $build in /*) ;; *) build=$root/$build ;; esac

# The aarch64 wheels. The CUDA ones are the versions the x86 environment gets
# with torch 2.14.1 (requirements.txt), so both builds link the same libraries.
et_version=1.5.1
cudart_version=13.0.96
cublas_version=13.1.1.3
cudnn_version=9.24.0.43

[ -x "$cuda_home/bin/nvcc" ] || fail "no CUDA toolkit at $cuda_home (set CUDA_HOME): its headers are needed"

# ---- 1. Debian packages: the cross compiler and qemu-user -----------------------
need=()
command -v $triple-g++ >/dev/null || need+=(g++-$triple)
command -v qemu-aarch64 >/dev/null || command -v qemu-aarch64-static >/dev/null || need+=(qemu-user)
command -v ninja >/dev/null || need+=(ninja-build)
if ((${#need[@]})); then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  log "installing Debian packages: ${need[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
qemu=$(command -v qemu-aarch64 || command -v qemu-aarch64-static)
phase_done "packages"

# ---- 2. The aarch64 SDK: ExecuTorch and CUDA libraries from PyPI ----------------
# $cache/sdk-<versions>/
#   executorch/{include,lib,share/cmake}      the package dir, as in the x86 wheel
#   cuda/bin/nvcc -> host nvcc                (CMake asks it for the version)
#   cuda/targets/sbsa-linux/include -> host $CUDA_HOME/include
#   cuda/targets/sbsa-linux/lib/              libcudart.so.13, libcublasLt.so.13
#   cudnn/{include,lib}                       cudnn*.h, libcudnn.so.9
sdk=$cache/sdk-et$et_version-cudart$cudart_version-cublas$cublas_version-cudnn$cudnn_version
if [ ! -f "$sdk/.complete" ]; then
  rm -rf "$sdk" "$cache/wheels"
  mkdir -p "$cache/wheels"
  log "downloading the aarch64 wheels into $cache/wheels (about 1.2 GB: cuBLASLt and cuDNN are big)"
  platforms=()
  for tag in manylinux_2_28_aarch64 manylinux_2_27_aarch64 manylinux_2_17_aarch64 manylinux2014_aarch64; do
    platforms+=(--platform "$tag")
  done
  $python -m pip download -q --no-cache-dir --no-deps --only-binary=:all: "${platforms[@]}" \
    --python-version 3.11 -d "$cache/wheels" \
    "executorch==$et_version" "nvidia-cuda-runtime==$cudart_version" \
    "nvidia-cublas==$cublas_version" "nvidia-cudnn-cu13==$cudnn_version" ||
    fail "pip download of the aarch64 wheels"
  phase_done "download"
  log "unpacking the needed files into $sdk"
  $python - "$cache/wheels" "$sdk.tmp" <<'EOF'
import glob, os, re, shutil, sys, zipfile

wheels, out = sys.argv[1], sys.argv[2]
shutil.rmtree(out, ignore_errors=True)

# (wheel name prefix, member regex, destination relative to out, keep the path under this prefix)
rules = [
    ("executorch-", r"executorch/(include/.*|share/cmake/.*|lib/cmake/.*|"
                    r"lib/libexecutorch(_kernels_optimized|_threadpool)?\.so)",
     "executorch", "executorch/"),
    ("nvidia_cuda_runtime-", r"nvidia/cu13/lib/libcudart\.so\.13", "cuda/targets/sbsa-linux/lib",
     "nvidia/cu13/lib/"),
    ("nvidia_cublas-", r"nvidia/cu13/lib/libcublasLt\.so\.13", "cuda/targets/sbsa-linux/lib",
     "nvidia/cu13/lib/"),
    ("nvidia_cudnn_cu13-", r"nvidia/cudnn/(include/.*\.h|lib/libcudnn\.so\.9)", "cudnn",
     "nvidia/cudnn/"),
]
for prefix, pattern, dest, strip in rules:
    found = glob.glob(os.path.join(wheels, prefix + "*.whl"))
    if len(found) != 1:
        sys.exit(f"expected one {prefix}*.whl in {wheels}, found {found}")
    count = 0
    with zipfile.ZipFile(found[0]) as whl:
        for info in whl.infolist():
            if info.is_dir() or not re.fullmatch(pattern, info.filename):
                continue
            target = os.path.join(out, dest, info.filename[len(strip):])
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with whl.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            count += 1
    if count == 0:
        sys.exit(f"nothing matching {pattern} in {found[0]}")
    print(f"  {os.path.basename(found[0])}: {count} files -> {dest}")
EOF
  # Link-time names (the wheels carry only the sonames) and the toolkit shape
  # FindCUDAToolkit expects when cross-compiling.
  ln -s libcudart.so.13 "$sdk.tmp/cuda/targets/sbsa-linux/lib/libcudart.so"
  ln -s libcublasLt.so.13 "$sdk.tmp/cuda/targets/sbsa-linux/lib/libcublasLt.so"
  ln -s libcudnn.so.9 "$sdk.tmp/cudnn/lib/libcudnn.so"
  ln -s "$(readlink -f "$cuda_home/include")" "$sdk.tmp/cuda/targets/sbsa-linux/include"
  mkdir -p "$sdk.tmp/cuda/bin"
  ln -s "$(readlink -f "$cuda_home/bin/nvcc")" "$sdk.tmp/cuda/bin/nvcc"
  touch "$sdk.tmp/.complete"
  mv "$sdk.tmp" "$sdk"
  rm -rf "$cache/wheels"  # the unpacked files are what is kept
  phase_done "unpack"
else
  log "aarch64 SDK already in $sdk"
fi
cuda_lib=$sdk/cuda/targets/sbsa-linux/lib

# ---- 3. Cross build: runtime targets only ----------------------------------------
cmake_bin=$($python -c 'import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, "cmake"))')
# A build dir configured against another SDK (other versions or cache) keeps
# stale library paths in its CMake cache: start it afresh.
if [ -f "$build/CMakeCache.txt" ] && [ "$(cat "$build/.kiln_sdk" 2>/dev/null)" != "$sdk" ]; then
  rm -rf "$build"
fi
mkdir -p "$build"
echo "$sdk" >"$build/.kiln_sdk"
log "configuring $build (log: $build/configure.log)"
"$cmake_bin" -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_TOOLCHAIN_FILE="$root/cmake/toolchains/aarch64-linux-gnu.cmake" \
  -DKILN_BUILD_COMPILER=OFF -DKILN_BUILD_PYTHON=OFF -DKILN_BUILD_TESTS=OFF \
  -DCMAKE_PREFIX_PATH="$sdk/executorch" -DCUDAToolkit_ROOT="$sdk/cuda" \
  -DCUDNN_ROOT="$sdk/cudnn" -DPython_EXECUTABLE="$(command -v "$python")" \
  >"$build/configure.log" 2>&1 || { tail -40 "$build/configure.log" >&2; fail "configure"; }
log "building kiln_runner, the delegate and libkiln_c_api with $triple-g++ (log: $build/build.log)"
# Every target the install step installs must be built here (cmake --install
# does not build): the runner, the delegate (+ caller stream) and the C API.
nice "$cmake_bin" --build "$build" -j2 --target kiln_runner executorch_backend_kiln kiln_c_api \
  >"$build/build.log" 2>&1 || { tail -40 "$build/build.log" >&2; fail "build"; }
runner=$build/tools/kiln_runner/kiln_runner
delegate=$build/src/delegate/libexecutorch_backend_kiln.so
for bin in "$runner" "$delegate" "$build/src/caller_stream/libkiln_caller_stream.so" "$build/src/c_api/libkiln_c_api.so"; do
  $triple-readelf -h "$bin" | grep -q 'Machine: *AArch64' ||
    fail "$bin is not an aarch64 ELF file"
done
# What they need at load time: no libcuda, only the CUDA 13 libraries.
for bin in "$delegate" "$runner"; do
  needed=$($triple-readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
  log "$(basename "$bin") NEEDED: $needed"
  case " $needed " in
    *" libcuda.so"*) fail "$bin links libcuda: it would not start without a driver" ;;
  esac
done
log "PASS build: $runner, $delegate (aarch64)"
phase_done "build"

[ "${KILN_CROSS_SKIP_QEMU:-0}" = 1 ] && { log "KILN_CROSS_SKIP_QEMU=1: no qemu run"; exit 0; }

# ---- 4. A .pte for Jetson SMs, exported here (the file does not depend on the CPU) ---
if ! ls python/kiln/_kiln_compiler*.so >/dev/null 2>&1; then
  log "the compiler extension is not built: running scripts/setup.sh"
  bash scripts/setup.sh
fi
work=$build/qemu_check
mkdir -p "$work"
PYTHONPATH=python $python - "$work/mlp.pte" <<'EOF' || fail "export of the sample .pte"
import sys, torch, kiln
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 16)).eval()
x = torch.randn(4, 64)
# The SMs of a Jetson export (docs/jetson.md): Orin sm_87, Thor sm_110.
compiled = kiln.compile(torch.export.export(model, (x,)), arg_inputs=(x,), min_block_size=1,
                        target_sms=(87, 110))
assert compiled.delegates == ["KilnBackend"], compiled.delegates
kiln.save(compiled, sys.argv[1], output_format="executorch")
EOF
phase_done "export"

# ---- 5. Run it under qemu: the clear no-GPU answer ----------------------------
# The x86 runner's answer on a machine without a GPU is exit 3 with
# "this machine has no usable CUDA GPU" (tools/kiln_runner/README.md); the
# aarch64 runner must give the same, not a loader error.
export_libs=$build/src/delegate:$build/src/caller_stream:$sdk/executorch/lib:$cuda_lib:$sdk/cudnn/lib
log "running the aarch64 kiln_runner under $(basename "$qemu") ($("$qemu" --version | head -1))"
set +e
QEMU_LD_PREFIX=/usr/$triple LD_LIBRARY_PATH=$export_libs \
  "$qemu" "$runner" --model_path="$work/mlp.pte" --num_runs=1 --warmup=0 >"$work/qemu.out" 2>&1
rc=$?
set -e
sed 's/^/  | /' "$work/qemu.out"
if [ $rc -eq 3 ] && grep -q "KilnBackend: registered, no usable CUDA GPU" "$work/qemu.out" &&
   grep -q "this machine has no usable CUDA GPU (no NVIDIA driver: libcuda.so.1 cannot be loaded" \
     "$work/qemu.out"; then
  log "PASS qemu: the aarch64 kiln_runner starts, registers KilnBackend, finds no driver and exits 3 with the no-GPU message"
else
  fail "qemu: expected exit 3 and 'this machine has no usable CUDA GPU (no NVIDIA driver: ...', got exit $rc (output above)"
fi
# The same file through the x86 runner, when it is built and this machine has
# no GPU either: the two must agree.
if [ -x build/tools/kiln_runner/kiln_runner ] && ! command -v nvidia-smi >/dev/null; then
  set +e
  build/tools/kiln_runner/kiln_runner --model_path="$work/mlp.pte" --num_runs=1 --warmup=0 \
    >"$work/x86.out" 2>&1
  x86_rc=$?
  set -e
  # Same exit status and the same lines, ExecuTorch's log timestamps aside.
  strip_time() { sed 's/^\([A-Z]\) [0-9:.]* /\1 /' "$1"; }
  if [ $x86_rc -eq $rc ] && diff <(strip_time "$work/x86.out") <(strip_time "$work/qemu.out") >/dev/null; then
    log "PASS x86 and aarch64 runners agree: exit $rc, the same output"
  else
    sed 's/^/  x86 | /' "$work/x86.out"
    fail "x86 runner gave exit $x86_rc and the output above, aarch64 under qemu exit $rc"
  fi
fi
phase_done "qemu run"

# ---- 6. The CMake package, as an aarch64 app uses it ------------------------------
# `cmake --install` into build-aarch64/install, then examples/cpp_module_app built
# against it (find_package(executorch_backend_kiln)) and run under qemu: exit 3,
# the model needs KilnBackend and there is no GPU.
"$cmake_bin" --install "$build" --prefix "$build/install" >"$build/install.log" 2>&1 ||
  { cat "$build/install.log" >&2; fail "cmake --install $build"; }
app=$build/cpp_module_app
"$cmake_bin" -S examples/cpp_module_app -B "$app" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_TOOLCHAIN_FILE="$root/cmake/toolchains/aarch64-linux-gnu.cmake" \
  -DCMAKE_PREFIX_PATH="$build/install;$sdk/executorch" >"$app.configure.log" 2>&1 ||
  { tail -30 "$app.configure.log" >&2; fail "configure examples/cpp_module_app against the package"; }
nice "$cmake_bin" --build "$app" >"$app.build.log" 2>&1 ||
  { tail -30 "$app.build.log" >&2; fail "build examples/cpp_module_app"; }
set +e
QEMU_LD_PREFIX=/usr/$triple LD_LIBRARY_PATH=$build/install/lib:$sdk/executorch/lib:$cuda_lib:$sdk/cudnn/lib \
  "$qemu" "$app/cpp_module_app" "$work/mlp.pte" >"$work/app.out" 2>&1
app_rc=$?
set -e
sed 's/^/  | /' "$work/app.out"
if [ $app_rc -eq 3 ] && grep -q "KilnBackend: registered, no usable CUDA GPU" "$work/app.out"; then
  log "PASS package: cpp_module_app built against the installed aarch64 package runs under qemu, exit 3 (no GPU)"
else
  fail "package: cpp_module_app under qemu gave exit $app_rc, expected 3 (output above)"
fi
phase_done "package"
log "PASS all in $((SECONDS - t_start)) s"
