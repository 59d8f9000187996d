// Micro-benchmark (benchmarks/micro/README.md): does a GEMV whose warps stride over the columns, with
// the next column's weights in flight while the current one is summed, stream the decode's weights
// faster than the engine's shape (one column a warp, n/4 blocks of 128 threads)?
//
// The engine's shape issues a row's loads, waits for them, sums and exits: each warp has one row in
// flight at a time, and a product with more blocks than the SMs hold at once ends in a partial wave
// (gate|up: 2048 blocks over ~924 slots). Here a kernel has at most blocks_per_sm blocks a SM; each
// warp walks columns gw, gw + warps, ... and loads column c+1's first chunk before summing column c,
// so its loads stay in flight across columns and the grid has no partial wave. Both shapes trigger
// their successor first and issue their first weight loads before griddepcontrol.wait, as the engine
// does (89211e2). Chains: the 410M Llama's 96 layer products (24 x q|k|v 2048x1024, o 1024x1024,
// gate|up 8192x1024, down 1024x4096), and 4 lm_heads (32000x1024). Random bf16 weights; every variant
// is checked against the engine's shape after 1, 4 and all phases.
//   nvcc -O3 -arch=sm_90 -o /tmp/gs benchmarks/micro/gemv_chain_stride.cu && /tmp/gs
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "micro_util.cuh"

using bf16 = __nv_bfloat16;

__device__ __forceinline__ void dot8(const uint4& w, const uint4& x, float& acc) {
  const bf16* we = reinterpret_cast<const bf16*>(&w);
  const bf16* xe = reinterpret_cast<const bf16*>(&x);
#pragma unroll
  for (int e = 0; e < 8; ++e) acc = fmaf(__bfloat162float(we[e]), __bfloat162float(xe[e]), acc);
}

// The engine's shape (gemv_kernel.cpp, one column a warp): 4 warps a block, the trigger first, the
// first group of loads before the wait.
template <int K>
__global__ void __launch_bounds__(128) gemv_engine(bf16* out, const bf16* x, const bf16* w, int n, float scale) {
  constexpr int VECS = K / 8, G = VECS / 32 < 8 ? VECS / 32 : 8;
  const int lane = threadIdx.x & 31;
  const long long col = (long long)blockIdx.x * 4 + (threadIdx.x >> 5);
  const uint4* wr = reinterpret_cast<const uint4*>(w + col * K);
  uint4 first[G];
  asm volatile("griddepcontrol.launch_dependents;");
  if (col < n) {
#pragma unroll
    for (int g = 0; g < G; ++g) first[g] = __ldg(wr + lane + 32 * g);
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (col >= n) return;
  float acc = 0.f;
  for (int base = lane; base < VECS; base += 32 * G) {
    uint4 wv[G];
#pragma unroll
    for (int g = 0; g < G; ++g) wv[g] = base == lane ? first[g] : __ldg(wr + base + 32 * g);
#pragma unroll
    for (int g = 0; g < G; ++g) dot8(wv[g], __ldcg(reinterpret_cast<const uint4*>(x) + base + 32 * g), acc);
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) out[col] = __float2bfloat16(acc * scale);
}

// Strided: warp gw of the grid owns columns gw, gw + TW, ... (TW warps in all). Its work is a list of
// chunks (a column's G vectors a lane, CPR chunks a row); chunk j + 1's loads are issued before chunk
// j is summed. x is staged in shared memory after the wait.
template <int K, int W, int G0>
__global__ void __launch_bounds__(32 * W) gemv_stride(bf16* out, const bf16* x, const bf16* w, int n, float scale) {
  constexpr int VECS = K / 8, G = VECS / 32 < G0 ? VECS / 32 : G0, CPR = VECS / (32 * G);
  __shared__ uint4 xs[VECS];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gw = blockIdx.x * W + warp, tw = gridDim.x * W;
  const int cols = gw < n ? (n - 1 - gw) / tw + 1 : 0, chunks = cols * CPR;
  const uint4* w4 = reinterpret_cast<const uint4*>(w);
  auto ptr = [&](int j) { return w4 + (long long)(gw + (j / CPR) * tw) * VECS + (j % CPR) * 32 * G + lane; };
  uint4 cur[G], nxt[G];
  asm volatile("griddepcontrol.launch_dependents;");
  if (chunks > 0) {
    const uint4* p = ptr(0);
#pragma unroll
    for (int g = 0; g < G; ++g) cur[g] = __ldg(p + 32 * g);
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  for (int i = threadIdx.x; i < VECS; i += 32 * W) xs[i] = __ldcg(reinterpret_cast<const uint4*>(x) + i);
  __syncthreads();
  float acc = 0.f;
  for (int j = 0; j < chunks; ++j) {
    if (j + 1 < chunks) {
      const uint4* p = ptr(j + 1);
#pragma unroll
      for (int g = 0; g < G; ++g) nxt[g] = __ldg(p + 32 * g);
    }
    const int part = j % CPR;
#pragma unroll
    for (int g = 0; g < G; ++g) dot8(cur[g], xs[part * 32 * G + lane + 32 * g], acc);
    if (part == CPR - 1) {
      for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
      if (lane == 0) out[gw + (j / CPR) * tw] = __float2bfloat16(acc * scale);
      acc = 0.f;
    }
#pragma unroll
    for (int g = 0; g < G; ++g) cur[g] = nxt[g];
  }
}

__global__ void fill(bf16* p, size_t n, unsigned seed, float amp) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
    p[i] = __float2bfloat16(amp * ((h & 0xffffff) / 8388608.0f - 1.0f));
  }
}

struct Layer { int n, k; bf16* w; };
struct Variant {
  const char* name;
  int warps;  // 0: the engine's shape
  int group, blocks_per_sm;
};

template <int K, int W, int G>
void launch_stride(cudaLaunchConfig_t& cfg, bf16* out, const bf16* x, const bf16* w, int n, float scale) {
  CK(cudaLaunchKernelEx(&cfg, gemv_stride<K, W, G>, out, x, w, n, scale));
}

int main() {
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  printf("%s, %d SMs\n", prop.name, sms);
  unsigned seed = 1;
  auto make = [&](int n, int k) {
    Layer L{n, k, nullptr};
    CK(cudaMalloc(&L.w, (size_t)n * k * 2));
    fill<<<1024, 256>>>(L.w, (size_t)n * k, seed++ * 7919u, 1.0f);
    return L;
  };
  std::vector<Layer> decode, heads;
  for (int l = 0; l < 24; ++l)
    for (auto nk : {std::pair{2048, 1024}, {1024, 1024}, {8192, 1024}, {1024, 4096}}) decode.push_back(make(nk.first, nk.second));
  for (int l = 0; l < 4; ++l) heads.push_back(make(32000, 1024));
  bf16 *x0, *a, *b;
  CK(cudaMalloc(&x0, 32000 * 2)); CK(cudaMalloc(&a, 32000 * 2)); CK(cudaMalloc(&b, 32000 * 2));
  fill<<<8, 256>>>(x0, 32000, 12345u, 1.0f);
  CK(cudaDeviceSynchronize());
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  auto launch = [&](const Variant& v, const Layer& L, bf16* out, const bf16* x) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr; cfg.numAttrs = 1; cfg.stream = s;
    const float scale = sqrtf(3.0f / L.k);
    if (v.warps == 0) {
      cfg.gridDim = dim3((L.n + 3) / 4); cfg.blockDim = dim3(128);
      if (L.k == 1024) CK(cudaLaunchKernelEx(&cfg, gemv_engine<1024>, out, x, (const bf16*)L.w, L.n, scale));
      else CK(cudaLaunchKernelEx(&cfg, gemv_engine<4096>, out, x, (const bf16*)L.w, L.n, scale));
      return;
    }
    cfg.gridDim = dim3(std::min((L.n + v.warps - 1) / v.warps, sms * v.blocks_per_sm));
    cfg.blockDim = dim3(32 * v.warps);
#define KILN_STRIDE(W, G)                                                             \
  if (v.warps == W && v.group == G) {                                                 \
    if (L.k == 1024) launch_stride<1024, W, G>(cfg, out, x, L.w, L.n, scale);          \
    else launch_stride<4096, W, G>(cfg, out, x, L.w, L.n, scale);                      \
    return;                                                                           \
  }
    KILN_STRIDE(4, 4) KILN_STRIDE(8, 4) KILN_STRIDE(8, 8) KILN_STRIDE(16, 4) KILN_STRIDE(4, 8)
#undef KILN_STRIDE
    printf("no kernel for %s\n", v.name);
    exit(1);
  };
  auto build = [&](const Variant& v, const std::vector<Layer>& chain, int phases, cudaGraphExec_t* ge) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    bf16* last = nullptr;
    for (int i = 0; i < phases; ++i) {
      bf16* out = i % 2 ? a : b;
      const bf16* x = i == 0 ? x0 : (i % 2 ? b : a);
      // lm_head chain: every head reads x0 (its output is 32000 wide, not an input of the next)
      launch(v, chain[i], out, chain[i].n == 32000 ? x0 : x);
      last = out;
    }
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(ge, g, 0));
    CK(cudaGraphDestroy(g));
    return last;
  };
  auto result = [&](const Variant& v, const std::vector<Layer>& chain, int phases) {
    cudaGraphExec_t ge;
    bf16* last = build(v, chain, phases, &ge);
    CK(cudaMemset(a, 0, 32000 * 2)); CK(cudaMemset(b, 0, 32000 * 2));
    CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    std::vector<bf16> h(chain[phases - 1].n);
    CK(cudaMemcpy(h.data(), last, h.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaGraphExecDestroy(ge));
    std::vector<float> f(h.size());
    for (size_t i = 0; i < h.size(); ++i) f[i] = __bfloat162float(h[i]);
    return f;
  };
  auto time = [&](const Variant& v, const std::vector<Layer>& chain) {
    cudaGraphExec_t ge;
    build(v, chain, (int)chain.size(), &ge);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    for (int i = 0; i < 20; ++i) CK(cudaGraphLaunch(ge, s));
    std::vector<float> ts;
    for (int i = 0; i < 100; ++i) {
      CK(cudaEventRecord(e0, s)); CK(cudaGraphLaunch(ge, s)); CK(cudaEventRecord(e1, s));
      CK(cudaEventSynchronize(e1));
      float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); ts.push_back(ms);
    }
    std::sort(ts.begin(), ts.end());
    CK(cudaGraphExecDestroy(ge));
    return ts[ts.size() / 2];
  };

  const std::vector<Variant> variants = {
      {"engine: n/4 blocks x 128, 1 column a warp", 0, 0, 0},
      {"stride 4 warps, 4 vec a lane, 2 blk/SM", 4, 4, 2},
      {"stride 4 warps, 4 vec a lane, 4 blk/SM", 4, 4, 4},
      {"stride 4 warps, 4 vec a lane, 8 blk/SM", 4, 4, 8},
      {"stride 8 warps, 4 vec a lane, 1 blk/SM", 8, 4, 1},
      {"stride 8 warps, 4 vec a lane, 2 blk/SM", 8, 4, 2},
      {"stride 8 warps, 4 vec a lane, 4 blk/SM", 8, 4, 4},
      {"stride 8 warps, 8 vec a lane, 2 blk/SM", 8, 8, 2},
      {"stride 16 warps, 4 vec a lane, 1 blk/SM", 16, 4, 1},
      {"stride 16 warps, 4 vec a lane, 2 blk/SM", 16, 4, 2},
      {"stride 4 warps, 8 vec a lane, 4 blk/SM", 4, 8, 4},
  };
  bool ok = true;
  for (const auto* chain : {&decode, &heads}) {
    const int all = (int)chain->size();
    for (int phases : {1, std::min(4, all), all}) {
      const std::vector<float> ref = result(variants[0], *chain, phases);
      double ref_norm = 0;
      for (float r : ref) ref_norm += (double)r * r;
      for (size_t vi = 1; vi < variants.size(); ++vi) {
        const std::vector<float> got = result(variants[vi], *chain, phases);
        double diff = 0;
        for (size_t i = 0; i < ref.size(); ++i) diff += (double)(got[i] - ref[i]) * (got[i] - ref[i]);
        const double rel = sqrt(diff / std::max(ref_norm, 1e-30));
        const double limit = phases > 4 && chain == &decode ? 0.25 : 2e-2;
        const bool pass = rel <= limit && std::isfinite(rel) && ref_norm > 0;
        ok = ok && pass;
        if (!pass) printf("check %-44s phases %2d: norm-rel %.2e (limit %.0e) FAIL\n", variants[vi].name, phases, rel, limit);
      }
    }
  }
  printf("numerics: %s\n", ok ? "all variants within limits" : "FAILED");
  for (const auto* chain : {&decode, &heads}) {
    double bytes = 0;
    for (auto& L : *chain) bytes += (double)L.n * L.k * 2;
    printf("== %s: %d kernels, %.1f MB\n", chain == &decode ? "decode layers" : "lm_heads", (int)chain->size(), bytes / 1e6);
    for (int round = 0; round < 2; ++round)
      for (const Variant& v : variants) {
        const float ms = time(v, *chain);
        printf("round %d  %-44s %.3f ms  %.0f GB/s\n", round + 1, v.name, ms, bytes / ms / 1e6);
      }
  }
  return ok ? 0 : 1;
}
