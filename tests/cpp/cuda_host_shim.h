// Lets a generated Kiln kernel module compile as host C++ so a test can run
// it on the CPU: CUDA qualifiers vanish, blockIdx/threadIdx/blockDim/gridDim
// are thread-local structs the launcher sets, vector types are aligned
// structs, and the prelude's PTX-asm conversions (which the test strips from
// pointwise_prelude()) get host versions with the same round-to-nearest-even.
// Not a CUDA emulator: one thread at a time, no shared memory, no warps.
#pragma once

#include <math.h>

#include <cstdint>
#include <cstring>
#include <utility>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)

struct kiln_shim_dim3 {
  unsigned x = 0, y = 1, z = 1;
};
inline thread_local kiln_shim_dim3 blockIdx, threadIdx, blockDim, gridDim;

struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(4) ushort2 { unsigned short x, y; };
struct alignas(8) ushort4 { unsigned short x, y, z, w; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
// The read-only cache load is a plain load here.
template <class T>
inline T __ldg(const T* p) { return *p; }
#define __align__(n) alignas(n)

// CUDA's integer min/max overloads (generated index arithmetic uses them).
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }

inline float __uint_as_float(unsigned int u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}

// _Float16 (GCC >= 12, Clang) converts with round-to-nearest-even, as cvt.rn does.
inline float kiln_ld_f16(unsigned short h) {
  _Float16 v;
  std::memcpy(&v, &h, 2);
  return static_cast<float>(v);
}
inline unsigned short kiln_st_f16(float f) {
  _Float16 v = static_cast<_Float16>(f);
  unsigned short h;
  std::memcpy(&h, &v, 2);
  return h;
}
inline unsigned short kiln_st_bf16(float f) {
  unsigned int u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<unsigned short>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<unsigned short>(u >> 16);
}

// cuLaunchKernel's convention: args[i] points at the i-th parameter's value.
template <class... A, size_t... I>
void kiln_shim_call(void (*f)(A...), void** args, std::index_sequence<I...>) {
  f(*static_cast<A*>(args[I])...);
}
template <class... A>
void kiln_shim_launch(void (*f)(A...), void** args, unsigned grid, unsigned block) {
  gridDim = {grid, 1, 1};
  blockDim = {block, 1, 1};
  for (unsigned b = 0; b < grid; ++b)
    for (unsigned t = 0; t < block; ++t) {
      blockIdx = {b, 0, 0};
      threadIdx = {t, 0, 0};
      kiln_shim_call(f, args, std::index_sequence_for<A...>{});
    }
}
