# Cross-compiles Kiln's run side (runtime, delegate, caller-stream library,
# kiln_runner) for 64-bit Arm Linux (Jetson, Grace) on an x86_64 Debian/Ubuntu
# host with the distribution's cross compiler (g++-aarch64-linux-gnu).
# scripts/cross_aarch64.sh uses it; by hand:
#
#   cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake \
#     -DKILN_BUILD_COMPILER=OFF -DKILN_BUILD_PYTHON=OFF -DKILN_BUILD_TESTS=OFF \
#     -DCMAKE_PREFIX_PATH=<aarch64 executorch package dir> \
#     -DCUDAToolkit_ROOT=<dir with bin/nvcc and targets/sbsa-linux/{include,lib}> \
#     -DCUDNN_ROOT=<dir with include/cudnn.h and lib/libcudnn.so.9 for aarch64>
#
# FindCUDAToolkit, when cross-compiling for aarch64, takes headers and libraries
# from <CUDAToolkit_ROOT>/targets/aarch64-linux or targets/sbsa-linux; nvcc
# (host) is only asked for its version. Every other aarch64 library comes from
# CMAKE_PREFIX_PATH / CUDNN_ROOT: nothing is looked up in the host's /usr/lib.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(KILN_CROSS_TRIPLE aarch64-linux-gnu CACHE STRING "GNU triple of the cross compiler")
set(CMAKE_C_COMPILER ${KILN_CROSS_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${KILN_CROSS_TRIPLE}-g++)

# Debian's cross toolchain has its own sysroot layout (/usr/aarch64-linux-gnu);
# programs (nvcc) are host ones, libraries and headers target ones.
list(APPEND CMAKE_FIND_ROOT_PATH /usr/${KILN_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
