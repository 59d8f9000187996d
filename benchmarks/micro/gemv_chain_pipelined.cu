// Micro-benchmark (benchmarks/micro/README.md): can a chain of bf16 GEMV kernels shaped like the 410M
// Llama's decode (24 x q|k|v 2048x1024, o 1024x1024, gate|up 8192x1024, down 1024x4096; 755 MB) stream
// its weights while the previous kernel still runs, if each kernel is sized to leave room for the next?
//
// The engine's GEMV (the baseline here) launches n/4 blocks of 128 threads: they fill every SM, so its
// successor's blocks, though launched early by programmatic dependent launch, find no slot until the
// last wave retires, and a load issued before griddepcontrol.wait gains nothing
// (gemv_chain_prefetch.cu). Here a kernel is one block a SM (or two) whose shared memory takes a third
// to a half of the SM: it lets its successor launch at once (griddepcontrol.launch_dependents first),
// copies its own slice of weight rows into shared memory (cp.async) and the first rows beyond that into
// registers, and only then waits for its predecessor (griddepcontrol.wait), reads x and computes. Two
// kernels share each SM: one computing, the next streaming its weights, and the shared memory keeps
// a third from starting. Checked against the baseline after 1, 4 and 96 phases.
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

// The engine's shape: one column a warp, 4 warps a block, 8 loads in flight a lane, the wait at the top.
// EARLY (what the engine's shape would become): the successor may launch at once, and the first group
// of weight loads is issued before the wait.
template <int K, bool EARLY>
__global__ void __launch_bounds__(128) gemv_base(bf16* out, const bf16* x, const bf16* w, int n, float scale) {
  constexpr int VECS = K / 8, G = VECS / 32 < 8 ? VECS / 32 : 8;
  const int lane = threadIdx.x & 31;
  const long long col = (long long)blockIdx.x * 4 + (threadIdx.x >> 5);
  const uint4* wr = reinterpret_cast<const uint4*>(w + col * K);
  uint4 first[G];
  if (EARLY) {
    asm volatile("griddepcontrol.launch_dependents;");
    if (col < n) {
#pragma unroll
      for (int g = 0; g < G; ++g) first[g] = __ldg(wr + lane + 32 * g);
    }
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (!EARLY) asm volatile("griddepcontrol.launch_dependents;");
  if (col >= n) return;
  float acc = 0.f;
  for (int base = lane; base < VECS; base += 32 * G) {
    uint4 wv[G];
#pragma unroll
    for (int g = 0; g < G; ++g) wv[g] = EARLY && base == lane ? first[g] : __ldg(wr + base + 32 * g);
#pragma unroll
    for (int g = 0; g < G; ++g) dot8(wv[g], __ldcg(reinterpret_cast<const uint4*>(x) + base + 32 * g), acc);
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) out[col] = __float2bfloat16(acc * scale);
}

constexpr int RG = 8;  // 16-byte register loads a lane holds for its first row beyond shared memory

struct PipeArgs {
  bf16* out;
  const bf16* x;
  const bf16* w;
  int n, k, rows_per_block, smem_rows;
  float scale;
};

// EARLY: launch_dependents before the weight copy (else after the wait, as the engine does).
// REGS: the first row beyond shared memory is loaded into registers before the wait.
// Two blocks a SM must fit in the registers (the successor's beside this one).
template <int THREADS, bool EARLY, bool REGS>
__global__ void __launch_bounds__(THREADS, 2) gemv_pipe(PipeArgs a) {
  extern __shared__ __align__(16) uint4 sm[];
  constexpr int WARPS = THREADS / 32;
  if (EARLY) asm volatile("griddepcontrol.launch_dependents;");
  const int vecs = a.k >> 3, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const long long r0 = (long long)blockIdx.x * a.rows_per_block;
  const int rows = (int)min((long long)a.rows_per_block, (long long)a.n - r0);
  const int pre = min(rows, a.smem_rows);
  const uint4* src = reinterpret_cast<const uint4*>(a.w) + r0 * vecs;
  const unsigned sbase = (unsigned)__cvta_generic_to_shared(sm);
  for (int i = threadIdx.x; i < pre * vecs; i += THREADS)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sbase + i * 16), "l"(src + i) : "memory");
  asm volatile("cp.async.commit_group;" ::: "memory");
  // The first row beyond shared memory this warp owns, its first RG x 32 vectors in registers.
  uint4 held[RG];
  const int first_direct = pre + warp;
  if (REGS && first_direct < rows) {
#pragma unroll
    for (int g = 0; g < RG; ++g) {
      const int v = lane + 32 * g;
      held[g] = v < vecs ? __ldg(src + (long long)first_direct * vecs + v) : make_uint4(0, 0, 0, 0);
    }
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (!EARLY) asm volatile("griddepcontrol.launch_dependents;");
  uint4* xs = sm + a.smem_rows * vecs;
  for (int i = threadIdx.x; i < vecs; i += THREADS) xs[i] = __ldcg(reinterpret_cast<const uint4*>(a.x) + i);
  __syncthreads();  // x staged (the weight copy is waited for below, after the direct rows' loads)
  // Rows beyond shared memory first: their loads have the longest way to come.
  for (int r = first_direct; r < rows; r += WARPS) {
    float acc = 0.f;
    const uint4* wr = src + (long long)r * vecs;
    for (int base = 0; base < vecs; base += 32 * RG) {
      uint4 wv[RG];
#pragma unroll
      for (int g = 0; g < RG; ++g) {
        const int v = base + lane + 32 * g;
        wv[g] = (REGS && r == first_direct && base == 0) ? held[g]
                : v < vecs                                 ? __ldg(wr + v)
                                                           : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int g = 0; g < RG; ++g) {
        const int v = base + lane + 32 * g;
        if (v < vecs) dot8(wv[g], xs[v], acc);
      }
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) a.out[r0 + r] = __float2bfloat16(acc * a.scale);
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();
  for (int r = warp; r < pre; r += WARPS) {
    float acc = 0.f;
    const uint4* wr = sm + (long long)r * vecs;
    for (int v = lane; v < vecs; v += 32) dot8(wr[v], xs[v], acc);
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) a.out[r0 + r] = __float2bfloat16(acc * a.scale);
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
  int threads;          // 0: the baseline kernel
  bool early, regs;
  int blocks_per_sm;    // blocks of one kernel a SM
  int kernels_per_sm;   // kernels whose blocks may share a SM (sets the shared memory a block asks)
};

int main() {
  int dev = 0, sms = 0, smem_optin = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  int smem_sm = 0;
  CK(cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  printf("%s, %d SMs, %d KB shared memory a SM (%d a block)\n", prop.name, sms, smem_sm / 1024, smem_optin / 1024);

  std::vector<Layer> layers;
  unsigned seed = 1;
  for (int l = 0; l < 24; ++l)
    for (auto nk : {std::pair{2048, 1024}, {1024, 1024}, {8192, 1024}, {1024, 4096}}) {
      Layer L{nk.first, nk.second, nullptr};
      CK(cudaMalloc(&L.w, (size_t)L.n * L.k * 2));
      fill<<<1024, 256>>>(L.w, (size_t)L.n * L.k, seed++ * 7919u, 1.0f);
      layers.push_back(L);
    }
  bf16 *x0, *a, *b;
  CK(cudaMalloc(&x0, 8192 * 2)); CK(cudaMalloc(&a, 8192 * 2)); CK(cudaMalloc(&b, 8192 * 2));
  fill<<<8, 256>>>(x0, 8192, 12345u, 1.0f);
  CK(cudaDeviceSynchronize());
  double bytes = 0;
  for (auto& L : layers) bytes += (double)L.n * L.k * 2;
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  // Every pipelined kernel may ask for a block's whole opt-in shared memory (set before any capture).
  for (const void* k : {(const void*)gemv_pipe<256, true, true>, (const void*)gemv_pipe<512, true, true>,
                        (const void*)gemv_pipe<512, false, true>, (const void*)gemv_pipe<512, true, false>})
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin));
  // Launch phase i of variant v reading `x`, writing `out`.
  auto launch = [&](const Variant& v, const Layer& L, bf16* out, const bf16* x) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr; cfg.numAttrs = 1; cfg.stream = s;
    const float scale = sqrtf(3.0f / L.k);
    if (v.threads == 0) {
      cfg.gridDim = dim3((L.n + 3) / 4); cfg.blockDim = dim3(128);
      if (L.k == 1024)
        CK(cudaLaunchKernelEx(&cfg, v.early ? gemv_base<1024, true> : gemv_base<1024, false>, out, x, (const bf16*)L.w,
                              L.n, scale));
      else
        CK(cudaLaunchKernelEx(&cfg, v.early ? gemv_base<4096, true> : gemv_base<4096, false>, out, x, (const bf16*)L.w,
                              L.n, scale));
      return;
    }
    const int blocks = sms * v.blocks_per_sm;
    PipeArgs p{out, x, L.w, L.n, L.k, (L.n + blocks - 1) / blocks, 0, scale};
    // Each SM's shared memory split between kernels_per_sm x blocks_per_sm blocks (1 KB a block reserved).
    const int smem = std::min(smem_optin, smem_sm / (v.kernels_per_sm * v.blocks_per_sm) - 1024) & ~15;
    const int x_bytes = L.k * 2;
    p.smem_rows = std::max(0, std::min(p.rows_per_block, (smem - x_bytes) / (L.k * 2)));
    const int ask = p.smem_rows * L.k * 2 + x_bytes;
    // Ask for the whole share even when fewer rows need it: the share is what keeps a third kernel out.
    cfg.gridDim = dim3((L.n + p.rows_per_block - 1) / p.rows_per_block);
    cfg.blockDim = dim3(v.threads);
    cfg.dynamicSmemBytes = std::max(ask, smem);
#define KILN_PIPE(T, E, R)                                      \
  if (v.threads == T && v.early == E && v.regs == R) {          \
    CK(cudaLaunchKernelEx(&cfg, gemv_pipe<T, E, R>, p));        \
    return;                                                     \
  }
    KILN_PIPE(256, true, true) KILN_PIPE(512, true, true) KILN_PIPE(512, false, true) KILN_PIPE(512, true, false)
#undef KILN_PIPE
    printf("no kernel for variant %s\n", v.name);
    exit(1);
  };
  // A graph of the first `phases` kernels from x0; returns the buffer holding the last output.
  auto build = [&](const Variant& v, int phases, cudaGraphExec_t* ge) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    bf16* last = nullptr;
    for (int i = 0; i < phases; ++i) {
      bf16* out = i % 2 ? a : b;
      const bf16* x = i == 0 ? x0 : (i % 2 ? b : a);
      launch(v, layers[i], out, x);
      last = out;
    }
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(ge, g, 0));
    CK(cudaGraphDestroy(g));
    return last;
  };
  auto result = [&](const Variant& v, int phases) {
    cudaGraphExec_t ge;
    bf16* last = build(v, phases, &ge);
    CK(cudaMemset(a, 0, 8192 * 2)); CK(cudaMemset(b, 0, 8192 * 2));
    CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    std::vector<bf16> h(layers[phases - 1].n);
    CK(cudaMemcpy(h.data(), last, h.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaGraphExecDestroy(ge));
    std::vector<float> f(h.size());
    for (size_t i = 0; i < h.size(); ++i) f[i] = __bfloat162float(h[i]);
    return f;
  };
  auto time = [&](const Variant& v) {
    cudaGraphExec_t ge;
    build(v, (int)layers.size(), &ge);
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
      {"baseline: engine shape, n/4 blocks x 128, wait first", 0, false, false, 1, 1},
      {"engine shape, trigger first, first loads before the wait", 0, true, false, 1, 1},
      {"pipe 256 thr, 1 blk/SM, 2 kernels/SM, early, regs", 256, true, true, 1, 2},
      {"pipe 512 thr, 1 blk/SM, 2 kernels/SM, early, regs", 512, true, true, 1, 2},
      {"pipe 512 thr, 1 blk/SM, 2 kernels/SM, trigger after wait", 512, false, true, 1, 2},
      {"pipe 512 thr, 1 blk/SM, 2 kernels/SM, early, no regs", 512, true, false, 1, 2},
      {"pipe 256 thr, 1 blk/SM, a third of the SM smem, early, regs", 256, true, true, 1, 3},
      {"pipe 256 thr, 2 blk/SM, 2 kernels/SM, early, regs", 256, true, true, 2, 2},
  };
  // Numerics: every variant against the baseline after 1, 4 and 96 phases (the chain is chaotic in
  // bf16, so 96 phases only bound the drift).
  bool ok = true;
  for (int phases : {1, 4, 96}) {
    const std::vector<float> ref = result(variants[0], phases);
    double ref_norm = 0;
    for (float r : ref) ref_norm += (double)r * r;
    for (size_t vi = 1; vi < variants.size(); ++vi) {
      const std::vector<float> got = result(variants[vi], phases);
      double diff = 0, maxabs = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        diff += (double)(got[i] - ref[i]) * (got[i] - ref[i]);
        maxabs = std::max(maxabs, (double)fabsf(got[i] - ref[i]));
      }
      const double rel = sqrt(diff / std::max(ref_norm, 1e-30));
      const double limit = phases == 96 ? 0.25 : 2e-2;
      const bool pass = rel <= limit && std::isfinite(rel) && ref_norm > 0;
      ok = ok && pass;
      if (!pass || phases == 96)
        printf("check %-58s phases %2d: norm-rel %.2e (limit %.0e) max abs %.2e %s\n", variants[vi].name, phases, rel,
               limit, maxabs, pass ? "ok" : "FAIL");
    }
  }
  printf("numerics: %s\n", ok ? "all variants within limits" : "FAILED");
  printf("%d kernels, %.1f MB of weights a chain (bf16)\n", (int)layers.size(), bytes / 1e6);
  for (int round = 0; round < 2; ++round)
    for (const Variant& v : variants) {
      const float ms = time(v);
      printf("round %d  %-58s %.3f ms  %.0f GB/s\n", round + 1, v.name, ms, bytes / ms / 1e6);
    }
  return ok ? 0 : 1;
}
