// Micro-benchmark (benchmarks/micro/README.md): a decode-like chain of bf16 GEMV kernels (one warp per output column),
// launched with programmatic dependent launch, captured in a CUDA graph.
// MODE 0: wait at top; 1: L2-prefetch weight row, then wait; 2: weight row into registers, then wait;
// 3: no PDL attribute (plain stream order). x is the previous kernel's output (so the chain is dependent).
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cstdio>
#include <vector>
#include <algorithm>

#include "micro_util.cuh"

template <int MODE, int K>
__global__ void __launch_bounds__(128) gemv(__nv_bfloat16* out, const __nv_bfloat16* x, const __nv_bfloat16* w, int n) {
  constexpr int VECS = K / 8, G = VECS / 32 < 8 ? VECS / 32 : 8;
  const int lane = threadIdx.x & 31;
  const long long col = (long long)blockIdx.x * 4 + (threadIdx.x >> 5);
  if (col >= n) return;
  const uint4* wr = reinterpret_cast<const uint4*>(w + col * K);
  uint4 first[G];
  if (MODE == 1) { for (int v = lane * 8; v < VECS; v += 256) asm volatile("prefetch.global.L2 [%0];" :: "l"(wr + v)); }
  if (MODE == 2) {
#pragma unroll
    for (int g = 0; g < G; ++g) first[g] = __ldg(wr + lane + 32 * g);
  }
  if (MODE != 3) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (MODE != 3) asm volatile("griddepcontrol.launch_dependents;");
  float acc = 0.f;
  for (int base = lane; base < VECS; base += 32 * G) {
    uint4 wv[G];
#pragma unroll
    for (int g = 0; g < G; ++g) wv[g] = (MODE == 2 && base == lane) ? first[g] : __ldg(wr + base + 32 * g);
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
  if (lane == 0) out[col] = __float2bfloat16(acc * 0.03f);
}

struct Layer { int n, k; __nv_bfloat16* w; };

template <int MODE>
void launch(cudaStream_t s, const Layer& L, __nv_bfloat16* out, const __nv_bfloat16* x) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((L.n + 3) / 4); cfg.blockDim = dim3(128); cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr; cfg.numAttrs = MODE == 3 ? 0 : 1;
  if (L.k == 1024) CK(cudaLaunchKernelEx(&cfg, gemv<MODE, 1024>, out, x, (const __nv_bfloat16*)L.w, L.n));
  else CK(cudaLaunchKernelEx(&cfg, gemv<MODE, 4096>, out, x, (const __nv_bfloat16*)L.w, L.n));
}

int main() {
  std::vector<Layer> layers;
  for (int l = 0; l < 24; ++l) for (auto nk : {std::pair{2048, 1024}, {1024, 1024}, {8192, 1024}, {1024, 4096}}) {
    Layer L{nk.first, nk.second, nullptr};
    CK(cudaMalloc(&L.w, (size_t)L.n * L.k * 2));
    CK(cudaMemset(L.w, 0x3c, (size_t)L.n * L.k * 2));
    layers.push_back(L);
  }
  __nv_bfloat16 *a, *b; CK(cudaMalloc(&a, 8192 * 2)); CK(cudaMalloc(&b, 8192 * 2));
  CK(cudaMemset(a, 0x3c, 8192 * 2)); CK(cudaMemset(b, 0x3c, 8192 * 2));
  double bytes = 0; for (auto& L : layers) bytes += (double)L.n * L.k * 2;
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto run = [&](int mode) {
    cudaGraph_t g; cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (size_t i = 0; i < layers.size(); ++i) {
      __nv_bfloat16* out = i % 2 ? a : b; const __nv_bfloat16* x = i % 2 ? b : a;
      switch (mode) { case 0: launch<0>(s, layers[i], out, x); break; case 1: launch<1>(s, layers[i], out, x); break;
                      case 2: launch<2>(s, layers[i], out, x); break; default: launch<3>(s, layers[i], out, x); }
    }
    CK(cudaStreamEndCapture(s, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    for (int i = 0; i < 10; ++i) CK(cudaGraphLaunch(ge, s));
    std::vector<float> ts;
    for (int i = 0; i < 50; ++i) { CK(cudaEventRecord(e0, s)); CK(cudaGraphLaunch(ge, s)); CK(cudaEventRecord(e1, s));
      CK(cudaEventSynchronize(e1)); float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); ts.push_back(ms); }
    std::sort(ts.begin(), ts.end());
    printf("mode %d: %d kernels, %.1f MB, median %.3f ms, %.0f GB/s\n", mode, (int)layers.size(), bytes / 1e6, ts[25], bytes / ts[25] / 1e6);
  };
  for (int rep = 0; rep < 2; ++rep) for (int m : {3, 0, 1, 2}) run(m);
}
