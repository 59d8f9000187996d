#!/usr/bin/env bash
# Copies the C++ runtime part of the installed executorch wheel (headers,
# libexecutorch.so, the CPU kernels, the thread pool and the CMake package)
# into DEST, so the runtime can be built on a machine without the Python wheel
# (the GPU test machine). Usage: scripts/make_executorch_sdk.sh DEST
set -euo pipefail
dest=${1:?usage: make_executorch_sdk.sh DEST}
src=$(python3 -c 'import executorch; print(list(executorch.__path__)[0])')
rm -rf "$dest"
mkdir -p "$dest/lib" "$dest/share"
cp -r "$src/include" "$dest/include"
cp -r "$src/share/cmake" "$dest/share/cmake"
cp -r "$src/lib/cmake" "$dest/lib/cmake"
for lib in libexecutorch.so libexecutorch_kernels_optimized.so libexecutorch_threadpool.so; do
  cp "$src/lib/$lib" "$dest/lib/"
done
echo "ExecuTorch C++ SDK from $src -> $dest ($(du -sh "$dest" | cut -f1))"
