// Micro-benchmark (benchmarks/micro/README.md): GEMV structure variants on the decode chain (bf16, 24 x [2048x1024, 1024x1024, 8192x1024, 1024x4096]),
// all PDL (wait at top), CUDA graph. C = output columns per warp, W = warps per block,
// S = warps a row is split over (they share C columns and reduce in shared memory).
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cstdio>
#include <vector>
#include <algorithm>

#include "micro_util.cuh"

// Block = W warps; the block owns C*W/S columns; warp w takes column group (w / S) and K slice (w % S).
template <int K, int C, int W, int S, bool NC>
__global__ void __launch_bounds__(32 * W) gemv(__nv_bfloat16* out, const __nv_bfloat16* x, const __nv_bfloat16* w, int n) {
  constexpr int VECS = K / 8 / S;          // 16-byte vectors in this warp's slice of a row
  constexpr int G = VECS / 32 < 8 ? VECS / 32 : 8;
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int cg = warp / S, ks = warp % S;
  const long long col0 = ((long long)blockIdx.x * (W / S) + cg) * C;
  __shared__ float red[W][C];
  float acc[C];
#pragma unroll
  for (int c = 0; c < C; ++c) acc[c] = 0.f;
  const bool live = col0 < n;
  if (live) {
    for (int base = lane; base < VECS; base += 32 * G) {
      uint4 wv[C][G];
#pragma unroll
      for (int c = 0; c < C; ++c)
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const uint4* p = reinterpret_cast<const uint4*>(w + (col0 + c) * K) + ks * VECS + base + 32 * g;
          if (NC) asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(wv[c][g].x), "=r"(wv[c][g].y), "=r"(wv[c][g].z), "=r"(wv[c][g].w) : "l"(p));
          else wv[c][g] = __ldg(p);
        }
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const uint4 xv = *(reinterpret_cast<const uint4*>(x) + ks * VECS + base + 32 * g);
        const __nv_bfloat16* xe = reinterpret_cast<const __nv_bfloat16*>(&xv);
#pragma unroll
        for (int c = 0; c < C; ++c) {
          const __nv_bfloat16* we = reinterpret_cast<const __nv_bfloat16*>(&wv[c][g]);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[c] = fmaf(__bfloat162float(we[e]), __bfloat162float(xe[e]), acc[c]);
        }
      }
    }
  }
#pragma unroll
  for (int c = 0; c < C; ++c) for (int o = 16; o > 0; o >>= 1) acc[c] += __shfl_xor_sync(0xffffffffu, acc[c], o);
  if (S == 1) {
    if (lane == 0 && live)
#pragma unroll
      for (int c = 0; c < C; ++c) out[col0 + c] = __float2bfloat16(acc[c] * 0.03f);
    return;
  }
  if (lane == 0)
#pragma unroll
    for (int c = 0; c < C; ++c) red[warp][c] = acc[c];
  __syncthreads();
  if (ks == 0 && lane < C && live) {
    float r = 0.f;
    for (int s2 = 0; s2 < S; ++s2) r += red[cg * S + s2][lane];
    out[col0 + lane] = __float2bfloat16(r * 0.03f);
  }
}

struct Layer { int n, k; __nv_bfloat16* w; };

template <int C, int W, int S, bool NC>
void launch(cudaStream_t s, const Layer& L, __nv_bfloat16* out, const __nv_bfloat16* x) {
  cudaLaunchConfig_t cfg = {};
  const int cols_per_block = C * W / S;
  cfg.gridDim = dim3((L.n + cols_per_block - 1) / cols_per_block); cfg.blockDim = dim3(32 * W); cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr; cfg.numAttrs = 1;
  if (L.k == 1024) CK(cudaLaunchKernelEx(&cfg, gemv<1024, C, W, S, NC>, out, x, (const __nv_bfloat16*)L.w, L.n));
  else CK(cudaLaunchKernelEx(&cfg, gemv<4096, C, W, S, NC>, out, x, (const __nv_bfloat16*)L.w, L.n));
}

std::vector<Layer> layers;
__nv_bfloat16 *a, *b;
cudaStream_t st;
double bytes = 0;

template <int C, int W, int S, bool NC>
void run(const char* name, int only = -1) {
  cudaGraph_t g; cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  double by = 0; int cnt = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    if (only >= 0 && (int)(i % 4) != only) continue;
    __nv_bfloat16* out = cnt % 2 ? a : b; const __nv_bfloat16* x = cnt % 2 ? b : a; ++cnt;
    launch<C, W, S, NC>(st, layers[i], out, x); by += (double)layers[i].n * layers[i].k * 2;
  }
  CK(cudaStreamEndCapture(st, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  for (int i = 0; i < 10; ++i) CK(cudaGraphLaunch(ge, st));
  std::vector<float> ts;
  for (int i = 0; i < 40; ++i) { CK(cudaEventRecord(e0, st)); CK(cudaGraphLaunch(ge, st)); CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1)); float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); ts.push_back(ms); }
  std::sort(ts.begin(), ts.end());
  printf("%-28s only=%2d %3d kernels %6.1f MB median %.3f ms (%.2f us/kernel) %5.0f GB/s\n", name, only, cnt, by / 1e6, ts[20], ts[20] * 1e3 / cnt, by / ts[20] / 1e6);
}

int main() {
  for (int l = 0; l < 24; ++l) for (auto nk : {std::pair{2048, 1024}, {1024, 1024}, {8192, 1024}, {1024, 4096}}) {
    Layer L{nk.first, nk.second, nullptr};
    CK(cudaMalloc(&L.w, (size_t)L.n * L.k * 2)); CK(cudaMemset(L.w, 0x3c, (size_t)L.n * L.k * 2)); layers.push_back(L);
  }
  CK(cudaMalloc(&a, 8192 * 2)); CK(cudaMalloc(&b, 8192 * 2)); CK(cudaMemset(a, 0x3c, 8192 * 2)); CK(cudaMemset(b, 0x3c, 8192 * 2));
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (int rep = 0; rep < 2; ++rep) {
    run<1, 4, 1, false>("C1 W4 S1 (kiln today)");
    run<1, 4, 1, true>("C1 W4 S1 no_allocate");
    run<2, 4, 1, false>("C2 W4 S1");
    run<4, 4, 1, false>("C4 W4 S1");
    run<1, 8, 1, false>("C1 W8 S1");
    run<2, 8, 1, false>("C2 W8 S1");
    run<1, 8, 2, false>("C1 W8 S2");
    run<2, 8, 2, false>("C2 W8 S2");
    run<4, 8, 4, false>("C4 W8 S4");
    run<2, 4, 2, false>("C2 W4 S2");
  }
  for (int o = 0; o < 4; ++o) { run<1, 4, 1, false>("C1 W4 S1", o); run<2, 4, 1, false>("C2 W4 S1", o); run<2, 8, 2, false>("C2 W8 S2", o); run<4, 8, 4, false>("C4 W8 S4", o); }
}
