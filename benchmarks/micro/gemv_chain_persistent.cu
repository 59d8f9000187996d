// Micro-benchmark (benchmarks/micro/README.md): the decode-shaped bf16 GEMV chain of
// gemv_chain_prefetch.cu (24 x [2048x1024, 1024x1024, 8192x1024, 1024x4096], 755 MB) as ONE
// persistent kernel: every block walks the phases in order, a warp per output column
// (grid-stride over the columns), and a grid-wide barrier separates the phases (the next phase
// reads the previous one's output). The question before building a persistent decode layer:
// does a barrier cost less than a kernel boundary (0.405 ms for the 96 kernels with
// programmatic dependent launch), and does issuing the next phase's weight loads before the
// barrier (MODE 1: into registers; MODE 2: L2 prefetch) hide the DRAM latency that a kernel
// boundary exposes?
//   nvcc -O3 -arch=sm_90 -o /tmp/p benchmarks/micro/gemv_chain_persistent.cu && /tmp/p
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "micro_util.cuh"

constexpr int kWarps = 8;  // warps a block
constexpr int kMaxK = 4096;

struct Phase {
  const __nv_bfloat16* w;
  int n, k;
};

// Sense-reversing grid barrier on a zeroed counter pair (count, generation); the
// last block to arrive resets the count and bumps the generation.
__device__ void grid_barrier(unsigned* count, volatile unsigned* generation, unsigned blocks) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned gen = *generation;
    __threadfence();
    if (atomicAdd(count, 1u) == blocks - 1) {
      *count = 0;
      __threadfence();
      atomicAdd(const_cast<unsigned*>(generation), 1u);
    } else {
      while (*generation == gen) {
      }
    }
    __threadfence();
  }
  __syncthreads();
}

// One warp's column: x . w[col, :], reduced over the warp.
template <int K>
__device__ float column(const uint4* wr, const __nv_bfloat16* x, const uint4* first, bool have_first) {
  constexpr int VECS = K / 8, G = VECS / 32 < 8 ? VECS / 32 : 8;
  const int lane = threadIdx.x & 31;
  float acc = 0.f;
  for (int base = lane; base < VECS; base += 32 * G) {
    uint4 wv[G];
#pragma unroll
    for (int g = 0; g < G; ++g) wv[g] = (have_first && base == lane) ? first[g] : __ldg(wr + base + 32 * g);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const uint4 xv = *reinterpret_cast<const uint4*>(x + (base + 32 * g) * 8);
      const __nv_bfloat16* we = reinterpret_cast<const __nv_bfloat16*>(&wv[g]);
      const __nv_bfloat16* xe = reinterpret_cast<const __nv_bfloat16*>(&xv);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc = fmaf(__bfloat162float(we[e]), __bfloat162float(xe[e]), acc);
    }
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  return acc;
}

template <int MODE>
__global__ void __launch_bounds__(32 * kWarps) chain(const Phase* phases, int count, __nv_bfloat16* a,
                                                     __nv_bfloat16* b, unsigned* sync) {
  const int lane = threadIdx.x & 31;
  const long long warp = (long long)blockIdx.x * kWarps + (threadIdx.x >> 5), warps = (long long)gridDim.x * kWarps;
  uint4 first[8];
  bool have_first = false;
  for (int p = 0; p < count; ++p) {
    const Phase ph = phases[p];
    __nv_bfloat16* out = p % 2 ? a : b;
    const __nv_bfloat16* x = p % 2 ? b : a;
    for (long long col = warp; col < ph.n; col += warps) {
      const uint4* wr = reinterpret_cast<const uint4*>(ph.w + col * ph.k);
      const bool use = have_first && col == warp;
      const float r = ph.k == 1024 ? column<1024>(wr, x, first, use) : column<kMaxK>(wr, x, first, use);
      if (lane == 0) out[col] = __float2bfloat16(r * 0.03f);
    }
    have_first = false;
    if (p + 1 < count) {
      // The next phase's weights do not depend on this phase: start them now.
      const Phase nx = phases[p + 1];
      if (MODE != 0 && warp < nx.n) {
        const uint4* wr = reinterpret_cast<const uint4*>(nx.w + warp * nx.k);
        const int vecs = nx.k / 8, g_count = vecs / 32 < 8 ? vecs / 32 : 8;
        if (MODE == 1) {
#pragma unroll
          for (int g = 0; g < 8; ++g)
            if (g < g_count) first[g] = __ldg(wr + lane + 32 * g);
          have_first = true;
        } else {
          for (int v = lane * 8; v < vecs; v += 256) asm volatile("prefetch.global.L2 [%0];" ::"l"(wr + v));
        }
      }
      grid_barrier(sync, sync + 1, gridDim.x);
    }
  }
}

int main() {
  std::vector<Phase> host;
  for (int l = 0; l < 24; ++l)
    for (auto nk : {std::pair{2048, 1024}, {1024, 1024}, {8192, 1024}, {1024, 4096}}) {
      __nv_bfloat16* w = nullptr;
      CK(cudaMalloc(&w, (size_t)nk.first * nk.second * 2));
      CK(cudaMemset(w, 0x3c, (size_t)nk.first * nk.second * 2));
      host.push_back({w, nk.first, nk.second});
    }
  double bytes = 0;
  for (const Phase& p : host) bytes += (double)p.n * p.k * 2;
  Phase* phases = nullptr;
  CK(cudaMalloc(&phases, host.size() * sizeof(Phase)));
  CK(cudaMemcpy(phases, host.data(), host.size() * sizeof(Phase), cudaMemcpyHostToDevice));
  __nv_bfloat16 *a, *b;
  unsigned* sync;
  CK(cudaMalloc(&a, 8192 * 2));
  CK(cudaMalloc(&b, 8192 * 2));
  CK(cudaMemset(a, 0x3c, 8192 * 2));
  CK(cudaMemset(b, 0x3c, 8192 * 2));
  CK(cudaMalloc(&sync, 8));
  CK(cudaMemset(sync, 0, 8));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  int count = static_cast<int>(host.size());
  auto run = [&](auto kernel, int mode, int per_sm) {
    int fit = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, 32 * kWarps, 0));
    if (fit < per_sm) {
      std::printf("mode %d, %d blocks a SM: only %d fit\n", mode, per_sm, fit);
      return;
    }
    unsigned blocks = static_cast<unsigned>(sms * per_sm);
    void* args[] = {&phases, &count, &a, &b, &sync};
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> ts;
    for (int i = 0; i < 60; ++i) {
      CK(cudaEventRecord(e0, st));
      CK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(kernel), blocks, 32 * kWarps, args, 0, st));
      CK(cudaEventRecord(e1, st));
      CK(cudaEventSynchronize(e1));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      if (i >= 10) ts.push_back(ms);
    }
    std::sort(ts.begin(), ts.end());
    const float med = ts[ts.size() / 2];
    std::printf("persistent mode %d (%s), %u blocks x %d warps: %d phases, %.1f MB, median %.3f ms, %.0f GB/s\n", mode,
                mode == 0 ? "barrier only" : mode == 1 ? "next weights in registers" : "next weights to L2", blocks,
                kWarps, count, bytes / 1e6, med, bytes / med / 1e6);
  };
  for (int rep = 0; rep < 2; ++rep)
    for (int per_sm : {1, 2, 4}) {
      run(chain<0>, 0, per_sm);
      run(chain<1>, 1, per_sm);
      run(chain<2>, 2, per_sm);
    }
  return 0;
}
