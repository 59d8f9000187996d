// Micro-benchmark (benchmarks/micro/README.md): can a decode layer's MLP run as one kernel without a
// grid barrier? The gate|up product and the down product depend on each other only through a sum:
// out[j] = x1[j] + sum_i Wd[j, i] * h[i], with h[i] = silu(g[i]) * u[i]. A block that computes its
// slice of h (the gate and up rows of that slice) can multiply it at once by its slice of Wd's
// columns and add the partial sums into an fp32 accumulator with atomics (split-k); the kernel before
// it (the o-projection + residual) initialises that accumulator with the residual, and the kernel
// after it (the next layer's q|k|v product, whose RMSNorm prologue reads the hidden state) reads it
// in fp32. The layer goes from 4 products (q|k|v, o, gate|up, down) to 3 kernels.
//
// The chain is the 410M Llama's 24 layers without attention (o reads the first 1024 q|k|v outputs):
//   baseline: q|k|v (RMSNorm prologue) -> o + residual (wide shape) -> gate|up (RMSNorm, SiLU * up)
//             -> down + residual (wide shape): the engine's kernel shapes, 96 kernels;
//   fused:    q|k|v (RMSNorm prologue, fp32 hidden state) -> o + residual, initialising the
//             accumulator -> MLP split-k: 72 kernels.
// Every kernel triggers its successor first and issues its first weight loads before
// griddepcontrol.wait, as the engine's products do; all launches use programmatic stream
// serialization inside one CUDA graph. Random bf16 weights; the fused chain is checked against the
// baseline after 1 and 24 layers.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "micro_util.cuh"

using bf16 = __nv_bfloat16;
constexpr int kHidden = 1024, kInter = 4096, kQkv = 2048, kLayers = 24;

__device__ __forceinline__ void dot8(const uint4& w, const float* x, float& acc) {
  const bf16* we = reinterpret_cast<const bf16*>(&w);
#pragma unroll
  for (int e = 0; e < 8; ++e) acc = fmaf(__bfloat162float(we[e]), x[e], acc);
}
// Eight hidden-state values at vector v, from bf16 or fp32 storage.
template <bool F32>
__device__ __forceinline__ void load_x8(const void* x, int v, float* o) {
  if (F32) {
    const float4 a = __ldcg(reinterpret_cast<const float4*>(x) + 2 * v);
    const float4 b = __ldcg(reinterpret_cast<const float4*>(x) + 2 * v + 1);
    o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w; o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
    // The hidden state the baseline stores is bf16: round as it does.
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] = __bfloat162float(__float2bfloat16(o[e]));
  } else {
    const uint4 u = __ldcg(reinterpret_cast<const uint4*>(x) + v);
    const bf16* e8 = reinterpret_cast<const bf16*>(&u);
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] = __bfloat162float(e8[e]);
  }
}
__device__ __forceinline__ float warp_sum(float a) {
  for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
  return a;
}
__device__ __forceinline__ void trigger() { asm volatile("griddepcontrol.launch_dependents;"); }
__device__ __forceinline__ void wait_predecessor() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// x (k = 1024) through RMSNorm (no weight): each lane's 4 vectors of x * rsqrt(mean(x^2) + eps).
template <bool F32>
__device__ __forceinline__ void normed_x(const void* x, int lane, float xs[4][8]) {
  float ss = 0.f;
#pragma unroll
  for (int g = 0; g < 4; ++g) {
    load_x8<F32>(x, lane + 32 * g, xs[g]);
#pragma unroll
    for (int e = 0; e < 8; ++e) ss = fmaf(xs[g][e], xs[g][e], ss);
  }
  const float rs = rsqrtf(warp_sum(ss) / kHidden + 1e-6f);
#pragma unroll
  for (int g = 0; g < 4; ++g)
#pragma unroll
    for (int e = 0; e < 8; ++e) xs[g][e] *= rs;
}

// q|k|v: RMSNorm prologue, one column a warp, 4 warps a block (k = 1024: a lane's 4 loads are the row).
template <bool F32>
__global__ void __launch_bounds__(128) qkv_kernel(bf16* out, const void* x, const bf16* w) {
  const int lane = threadIdx.x & 31, col = blockIdx.x * 4 + (threadIdx.x >> 5);
  const uint4* wr = reinterpret_cast<const uint4*>(w + (long long)col * kHidden);
  trigger();
  uint4 wv[4];
#pragma unroll
  for (int g = 0; g < 4; ++g) wv[g] = __ldg(wr + lane + 32 * g);
  wait_predecessor();
  float xs[4][8];
  normed_x<F32>(x, lane, xs);
  float acc = 0.f;
#pragma unroll
  for (int g = 0; g < 4; ++g) dot8(wv[g], xs[g], acc);
  acc = warp_sum(acc);
  if (lane == 0) out[col] = __float2bfloat16(acc);
}

// gate|up: RMSNorm prologue, a warp owns gate row i and up row i + 4096, stores silu(g) * u.
__global__ void __launch_bounds__(128) gate_up_kernel(bf16* h, const bf16* x, const bf16* w) {
  const int lane = threadIdx.x & 31, i = blockIdx.x * 4 + (threadIdx.x >> 5);
  const uint4* wg = reinterpret_cast<const uint4*>(w + (long long)i * kHidden);
  const uint4* wu = reinterpret_cast<const uint4*>(w + (long long)(i + kInter) * kHidden);
  trigger();
  uint4 a[4], b[4];
#pragma unroll
  for (int g = 0; g < 4; ++g) { a[g] = __ldg(wg + lane + 32 * g); b[g] = __ldg(wu + lane + 32 * g); }
  wait_predecessor();
  float xs[4][8];
  normed_x<false>(x, lane, xs);
  float ga = 0.f, ua = 0.f;
#pragma unroll
  for (int g = 0; g < 4; ++g) { dot8(a[g], xs[g], ga); dot8(b[g], xs[g], ua); }
  ga = __bfloat162float(__float2bfloat16(warp_sum(ga)));
  ua = __bfloat162float(__float2bfloat16(warp_sum(ua)));
  if (lane == 0) h[i] = __float2bfloat16(ga / (1.f + __expf(-ga)) * ua);
}

// The engine's wide shape (o and down): 4 columns a warp, 8 warps a block, a row split over 4 warps,
// up to 4 loads a column in flight a lane. out = W x + c; c is the bf16 residual, or (CF32) the fp32
// accumulator of the fused chain, which INIT then re-initialises (acc_out = the bf16 output).
template <int K, bool CF32, bool INIT>
__global__ void __launch_bounds__(256) wide_kernel(bf16* out, const bf16* x, const bf16* w, const void* c,
                                                   float* acc_out) {
  constexpr int kSlice = K / 8 / 4, kG = kSlice / 32 < 4 ? kSlice / 32 : 4;
  __shared__ float partial[8][4];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, part = warp % 4;
  const int col0 = (blockIdx.x * 2 + warp / 4) * 4;
  const int v0 = part * kSlice;
  trigger();
  uint4 wv[4][kG];
  auto load = [&](int base) {
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int g = 0; g < kG; ++g)
        wv[j][g] = __ldg(reinterpret_cast<const uint4*>(w + (long long)(col0 + j) * K) + v0 + base + 32 * g);
  };
  load(lane);
  wait_predecessor();
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int base = lane; base < kSlice; base += 32 * kG) {
    if (base != lane) load(base);
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      float xv[8];
      load_x8<false>(x, v0 + base + 32 * g, xv);
#pragma unroll
      for (int j = 0; j < 4; ++j) dot8(wv[j][g], xv, acc[j]);
    }
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float a = warp_sum(acc[j]);
    if (lane == 0) partial[warp][j] = a;
  }
  __syncthreads();
  if (part != 0 || lane >= 4) return;
  const int col = col0 + lane;
  float r = partial[warp][lane] + partial[warp + 1][lane] + partial[warp + 2][lane] + partial[warp + 3][lane];
  r = __bfloat162float(__float2bfloat16(r));  // the product's own bf16 output, then the residual
  if (CF32) r += __bfloat162float(__float2bfloat16(reinterpret_cast<const float*>(c)[col]));
  else r += __bfloat162float(reinterpret_cast<const bf16*>(c)[col]);
  const bf16 q = __float2bfloat16(r);
  out[col] = q;
  if (INIT) acc_out[col] = __bfloat162float(q);
}

// The fused MLP. Block b owns the S intermediate rows [b*S, b*S + S): each of its W warps computes
// P = S / W of them (gate and up rows, RMSNorm prologue, silu(g) * u rounded to bf16 as the baseline
// stores h), then every thread multiplies the block's h slice by the down weights of O = 1024 / T
// consecutive outputs and adds the sums into acc. The down weights are packed per block so that a
// warp's loads are contiguous: wd[((b * SV + sv) * O + jj) * T + t] is the 8 inputs sv*8.. of the
// slice for output t * O + jj. Both weight sets are loaded before the wait.
// RED: 0 plain store (wrong sums; the atomics' cost only), 1 scalar red.add, 2 vector red.add.
template <int T, int S, int RED>
__global__ void __launch_bounds__(T) mlp_fused_kernel(float* acc, const bf16* x1, const bf16* wgu, const uint4* wd) {
  constexpr int W = T / 32, P = S / W, SV = S / 8, O = kHidden / T;
  static_assert(P >= 1 && S % W == 0 && S % 8 == 0 && kHidden % T == 0, "shape");
  __shared__ __align__(16) float hs[S];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t = threadIdx.x;
  const int i0 = blockIdx.x * S + warp * P;
  trigger();
  uint4 a[P][4], b[P][4], d[SV][O];
#pragma unroll
  for (int p = 0; p < P; ++p)
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      a[p][g] = __ldg(reinterpret_cast<const uint4*>(wgu + (long long)(i0 + p) * kHidden) + lane + 32 * g);
      b[p][g] = __ldg(reinterpret_cast<const uint4*>(wgu + (long long)(i0 + p + kInter) * kHidden) + lane + 32 * g);
    }
  const uint4* wb = wd + (long long)blockIdx.x * SV * O * T;
#pragma unroll
  for (int sv = 0; sv < SV; ++sv)
#pragma unroll
    for (int jj = 0; jj < O; ++jj) d[sv][jj] = __ldg(wb + (sv * O + jj) * T + t);
  wait_predecessor();
  float xs[4][8];
  normed_x<false>(x1, lane, xs);
#pragma unroll
  for (int p = 0; p < P; ++p) {
    float ga = 0.f, ua = 0.f;
#pragma unroll
    for (int g = 0; g < 4; ++g) { dot8(a[p][g], xs[g], ga); dot8(b[p][g], xs[g], ua); }
    ga = __bfloat162float(__float2bfloat16(warp_sum(ga)));
    ua = __bfloat162float(__float2bfloat16(warp_sum(ua)));
    if (lane == 0) hs[warp * P + p] = __bfloat162float(__float2bfloat16(ga / (1.f + __expf(-ga)) * ua));
  }
  __syncthreads();
  float r[O];
#pragma unroll
  for (int jj = 0; jj < O; ++jj) {
    r[jj] = 0.f;
#pragma unroll
    for (int sv = 0; sv < SV; ++sv) dot8(d[sv][jj], hs + sv * 8, r[jj]);
  }
  float* dst = acc + t * O;
  if (RED == 0) {
#pragma unroll
    for (int jj = 0; jj < O; ++jj) dst[jj] = r[jj];
  } else if (RED == 1 || O == 1) {
#pragma unroll
    for (int jj = 0; jj < O; ++jj) atomicAdd(dst + jj, r[jj]);
  } else if (O % 4 == 0) {
#pragma unroll
    for (int jj = 0; jj < O; jj += 4)
      asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst + jj), "f"(r[jj]), "f"(r[jj + 1]),
                   "f"(r[jj + 2]), "f"(r[jj + 3])
                   : "memory");
  } else {
#pragma unroll
    for (int jj = 0; jj < O; jj += 2)
      asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(dst + jj), "f"(r[jj]), "f"(r[jj + 1]) : "memory");
  }
}

// Packs Wd [1024][4096] for blocks of S rows and T threads (see mlp_fused_kernel).
__global__ void pack_down(uint4* dst, const bf16* wd, int S, int T) {
  const int SV = S / 8, O = kHidden / T;
  const long long total = (long long)kInter / 8 * kHidden;  // uint4s
  for (long long q = blockIdx.x * (long long)blockDim.x + threadIdx.x; q < total; q += (long long)gridDim.x * blockDim.x) {
    long long r = q;
    const int t = (int)(r % T); r /= T;
    const int jj = (int)(r % O); r /= O;
    const int sv = (int)(r % SV); r /= SV;
    const long long blk = r;
    const int j = t * O + jj;
    const long long i = blk * S + sv * 8;
    dst[q] = *reinterpret_cast<const uint4*>(wd + (long long)j * kInter + i);
  }
}

__global__ void fill(bf16* p, size_t n, unsigned seed, float amp) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
    p[i] = __float2bfloat16(amp * ((h & 0xffffff) / 8388608.0f - 1.0f));
  }
}
__global__ void to_f32(float* d, const bf16* s, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) d[i] = __bfloat162float(s[i]);
}

struct LayerW { bf16 *qkv, *o, *gu, *d; };
struct Variant { const char* name; int threads, rows, red; };  // threads 0: the baseline chain

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("%s, %d SMs\n", prop.name, prop.multiProcessorCount);
  // Amplitudes keep the products' outputs near unit scale (uniform in +-amp, k terms).
  std::vector<LayerW> L(kLayers);
  unsigned seed = 1;
  auto alloc_fill = [&](size_t n, float amp) {
    bf16* p;
    CK(cudaMalloc(&p, n * 2));
    fill<<<1024, 256>>>(p, n, seed++ * 7919u, amp);
    return p;
  };
  for (auto& l : L) {
    l.qkv = alloc_fill((size_t)kQkv * kHidden, sqrtf(3.f / kHidden));
    l.o = alloc_fill((size_t)kHidden * kHidden, 0.5f * sqrtf(3.f / kHidden));
    l.gu = alloc_fill((size_t)2 * kInter * kHidden, sqrtf(3.f / kHidden));
    l.d = alloc_fill((size_t)kHidden * kInter, 0.5f * sqrtf(3.f / kInter));
  }
  bf16 *x0, *xa, *xb, *qkv, *x1, *h;
  float *acc0, *accs[2];
  CK(cudaMalloc(&x0, kHidden * 2)); CK(cudaMalloc(&xa, kHidden * 2)); CK(cudaMalloc(&xb, kHidden * 2));
  CK(cudaMalloc(&qkv, kQkv * 2)); CK(cudaMalloc(&x1, kHidden * 2)); CK(cudaMalloc(&h, kInter * 2));
  CK(cudaMalloc(&acc0, kHidden * 4)); CK(cudaMalloc(&accs[0], kHidden * 4)); CK(cudaMalloc(&accs[1], kHidden * 4));
  fill<<<4, 256>>>(x0, kHidden, 12345u, 1.0f);
  to_f32<<<4, 256>>>(acc0, x0, kHidden);
  CK(cudaDeviceSynchronize());
  double bytes = 0;
  bytes = (double)kLayers * ((double)kQkv * kHidden + kHidden * kHidden + 2.0 * kInter * kHidden + kHidden * kInter) * 2;

  const std::vector<Variant> variants = {
      {"baseline: 4 products a layer (engine shapes)", 0, 0, 0},
      {"fused: 256 thr, 16 rows a block (256 blk), red.v4", 256, 16, 2},
      {"fused: 256 thr, 16 rows a block, scalar red", 256, 16, 1},
      {"fused: 512 thr, 32 rows a block (128 blk), red.v2", 512, 32, 2},
      {"fused: 128 thr, 8 rows a block (512 blk), red.v4", 128, 8, 2},
      {"fused: 256 thr, 16 rows, plain store (timing only)", 256, 16, 0},
  };
  // Down weights packed per (rows, threads) shape.
  std::vector<std::vector<uint4*>> packed(variants.size(), std::vector<uint4*>(kLayers, nullptr));
  for (size_t v = 1; v < variants.size(); ++v)
    for (int l = 0; l < kLayers; ++l) {
      CK(cudaMalloc(&packed[v][l], (size_t)kHidden * kInter * 2));
      pack_down<<<1024, 256>>>(packed[v][l], L[l].d, variants[v].rows, variants[v].threads);
    }
  CK(cudaDeviceSynchronize());

  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  auto cfg_of = [&](int grid, int block) {
    cudaLaunchConfig_t c = {};
    c.gridDim = dim3(grid); c.blockDim = dim3(block); c.stream = s; c.attrs = attr; c.numAttrs = 1;
    return c;
  };
  // Launches `layers` layers of variant vi; returns the hidden state's buffer (bf16 or fp32).
  auto record = [&](size_t vi, int layers) -> void* {
    const Variant& v = variants[vi];
    void* last = nullptr;
    for (int l = 0; l < layers; ++l) {
      const LayerW& w = L[l];
      if (v.threads == 0) {
        const bf16* xin = l == 0 ? x0 : (l % 2 ? xa : xb);
        bf16* xout = l % 2 ? xb : xa;
        auto c = cfg_of(kQkv / 4, 128);
        CK(cudaLaunchKernelEx(&c, qkv_kernel<false>, qkv, (const void*)xin, (const bf16*)w.qkv));
        c = cfg_of(kHidden / 8, 256);
        CK(cudaLaunchKernelEx(&c, wide_kernel<kHidden, false, false>, x1, (const bf16*)qkv, (const bf16*)w.o,
                              (const void*)xin, (float*)nullptr));
        c = cfg_of(kInter / 4, 128);
        CK(cudaLaunchKernelEx(&c, gate_up_kernel, h, (const bf16*)x1, (const bf16*)w.gu));
        c = cfg_of(kHidden / 8, 256);
        CK(cudaLaunchKernelEx(&c, wide_kernel<kInter, false, false>, xout, (const bf16*)h, (const bf16*)w.d,
                              (const void*)x1, (float*)nullptr));
        last = xout;
      } else {
        const float* ain = l == 0 ? acc0 : accs[(l + 1) % 2];
        float* aout = accs[l % 2];
        auto c = cfg_of(kQkv / 4, 128);
        CK(cudaLaunchKernelEx(&c, qkv_kernel<true>, qkv, (const void*)ain, (const bf16*)w.qkv));
        c = cfg_of(kHidden / 8, 256);
        CK(cudaLaunchKernelEx(&c, wide_kernel<kHidden, true, true>, x1, (const bf16*)qkv, (const bf16*)w.o,
                              (const void*)ain, aout));
        c = cfg_of(kInter / v.rows, v.threads);
        const uint4* wd = packed[vi][l];
#define KILN_FUSED(T, S, R)                                                                            \
  if (v.threads == T && v.rows == S && v.red == R) {                                                   \
    CK(cudaLaunchKernelEx(&c, mlp_fused_kernel<T, S, R>, aout, (const bf16*)x1, (const bf16*)w.gu, wd)); \
  } else
        KILN_FUSED(256, 16, 2) KILN_FUSED(256, 16, 1) KILN_FUSED(512, 32, 2) KILN_FUSED(128, 8, 2)
        KILN_FUSED(256, 16, 0) { printf("no kernel for %s\n", v.name); exit(1); }
#undef KILN_FUSED
        last = aout;
      }
    }
    return last;
  };
  auto graph_of = [&](size_t vi, int layers, void** last) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    *last = record(vi, layers);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphDestroy(g));
    return ge;
  };
  auto result = [&](size_t vi, int layers) {
    void* last;
    cudaGraphExec_t ge = graph_of(vi, layers, &last);
    CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    std::vector<float> f(kHidden);
    if (variants[vi].threads == 0) {
      std::vector<bf16> hb(kHidden);
      CK(cudaMemcpy(hb.data(), last, kHidden * 2, cudaMemcpyDeviceToHost));
      for (int i = 0; i < kHidden; ++i) f[i] = __bfloat162float(hb[i]);
    } else {
      CK(cudaMemcpy(f.data(), last, kHidden * 4, cudaMemcpyDeviceToHost));
      for (auto& x : f) x = __bfloat162float(__float2bfloat16(x));
    }
    CK(cudaGraphExecDestroy(ge));
    return f;
  };
  auto time_of = [&](size_t vi) {
    void* last;
    cudaGraphExec_t ge = graph_of(vi, kLayers, &last);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    for (int i = 0; i < 30; ++i) CK(cudaGraphLaunch(ge, s));
    std::vector<float> ts;
    for (int i = 0; i < 200; ++i) {
      CK(cudaEventRecord(e0, s)); CK(cudaGraphLaunch(ge, s)); CK(cudaEventRecord(e1, s));
      CK(cudaEventSynchronize(e1));
      float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); ts.push_back(ms);
    }
    std::sort(ts.begin(), ts.end());
    CK(cudaGraphExecDestroy(ge));
    CK(cudaEventDestroy(e0)); CK(cudaEventDestroy(e1));
    return ts[ts.size() / 2];
  };

  bool ok = true;
  for (int layers : {1, kLayers}) {
    const std::vector<float> ref = result(0, layers);
    double rn = 0;
    for (float r : ref) rn += (double)r * r;
    for (size_t vi = 1; vi < variants.size(); ++vi) {
      if (variants[vi].red == 0) continue;  // timing only
      const std::vector<float> got = result(vi, layers);
      double d = 0;
      for (int i = 0; i < kHidden; ++i) d += (double)(got[i] - ref[i]) * (got[i] - ref[i]);
      const double rel = sqrt(d / std::max(rn, 1e-30));
      const double limit = layers == 1 ? 1e-2 : 5e-2;
      const bool pass = std::isfinite(rel) && rel <= limit && rn > 0;
      ok = ok && pass;
      printf("check %-52s layers %2d: norm-rel %.2e (limit %.0e, |ref| %.1f) %s\n", variants[vi].name, layers, rel,
             limit, sqrt(rn), pass ? "ok" : "FAIL");
    }
  }
  printf("numerics: %s\n", ok ? "fused variants within limits" : "FAILED");
  printf("%d layers, %.1f MB of weights a chain (bf16)\n", kLayers, bytes / 1e6);
  for (int round = 0; round < 3; ++round)
    for (size_t vi = 0; vi < variants.size(); ++vi) {
      const float ms = time_of(vi);
      printf("round %d  %-52s %.4f ms  %.0f GB/s  %.2f us a layer\n", round + 1, variants[vi].name, ms,
             bytes / ms / 1e6, ms * 1000 / kLayers);
    }
  return ok ? 0 : 1;
}
