// Micro-benchmark (benchmarks/micro/README.md): the decode-shaped bf16 GEMV chain of
// gemv_chain_prefetch.cu (24 x [2048x1024, 1024x1024, 8192x1024, 1024x4096], 755 MB) as ONE
// persistent kernel in which the weights do not wait for the activations. A block per SM owns a
// contiguous slice of every phase's output columns, so its weights for a phase are one contiguous
// range; a producer warp streams those ranges, phase after phase, into a ring of shared-memory
// stages (cp.async.bulk, completion on an mbarrier) and never waits for a phase barrier, only for
// a free stage. Eight consumer warps compute a phase from the ring once the previous phase's
// output is complete (a grid-wide arrival counter). gemv_chain_persistent.cu showed that a grid
// barrier with the loads behind it costs more than a kernel boundary with programmatic dependent
// launch (0.59 ms against 0.405 ms); the question here is whether streaming the weights across
// the barriers brings the chain near the bandwidth bound instead.
//   nvcc -O3 -arch=sm_90 -o /tmp/s benchmarks/micro/gemv_chain_stream.cu && /tmp/s
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "micro_util.cuh"

constexpr int kConsumers = 8;  // consumer warps a block; one more warp produces
constexpr int kThreads = 32 * (kConsumers + 1);
constexpr int kStageBytes = 16384;
constexpr int kMaxK = 4096;
constexpr int kMaxCols = 256;  // a block's output columns in one phase

struct Phase {
  const __nv_bfloat16* w;
  int n, k;
};

__device__ __forceinline__ void consumers_sync() {  // named barrier 1: the consumer warps only
  asm volatile("bar.sync 1, %0;" ::"n"(32 * kConsumers) : "memory");
}

// A block's columns of a phase, and how they are cut into ring stages (whole columns a stage).
struct Slice {
  int c0, c1, cols_per_stage;
};
__device__ __forceinline__ Slice slice_of(const Phase& ph, int block, int blocks) {
  Slice s;
  s.c0 = static_cast<int>((long long)ph.n * block / blocks);
  s.c1 = static_cast<int>((long long)ph.n * (block + 1) / blocks);
  s.cols_per_stage = max(1, kStageBytes / (ph.k * 2));
  return s;
}

__global__ void __launch_bounds__(kThreads, 1)
    chain(const Phase* phases, int count, __nv_bfloat16* a, __nv_bfloat16* b, unsigned* arrivals, unsigned base,
          int stages, int barrier) {
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  uint64_t* empty = full + stages;
  float* acc = reinterpret_cast<float*>(empty + stages);
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(acc + kMaxCols);
  unsigned char* ring = reinterpret_cast<unsigned char*>(xs + kMaxK);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kConsumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warp == kConsumers) {  // producer: every phase's weights, in order, as fast as stages free up
    if (lane != 0) return;
    unsigned i = 0;
    for (int p = 0; p < count; ++p) {
      const Phase ph = phases[p];
      const Slice sl = slice_of(ph, blockIdx.x, gridDim.x);
      for (int c = sl.c0; c < sl.c1; c += sl.cols_per_stage, ++i) {
        const int s = i % stages;
        const unsigned bytes = static_cast<unsigned>(min(sl.cols_per_stage, sl.c1 - c) * ph.k * 2);
        mbar_wait(&empty[s], ((i / stages) & 1) ^ 1);
        mbar_expect_bytes(&full[s], bytes);
        bulk_load(ring + (size_t)s * kStageBytes, ph.w + (size_t)c * ph.k, bytes, &full[s]);
      }
    }
    return;
  }

  unsigned i = 0;
  for (int p = 0; p < count; ++p) {
    const Phase ph = phases[p];
    const Slice sl = slice_of(ph, blockIdx.x, gridDim.x);
    __nv_bfloat16* out = p % 2 ? a : b;
    const __nv_bfloat16* x = p % 2 ? b : a;
    // x was written by other blocks in the previous phase: read it past L1.
    for (int v = threadIdx.x; v < ph.k / 8; v += 32 * kConsumers)
      reinterpret_cast<uint4*>(xs)[v] = __ldcg(reinterpret_cast<const uint4*>(x) + v);
    for (int c = threadIdx.x; c < sl.c1 - sl.c0; c += 32 * kConsumers) acc[c] = 0.f;
    consumers_sync();
    for (int c = sl.c0; c < sl.c1; c += sl.cols_per_stage, ++i) {
      const int s = i % stages;
      const int cols = min(sl.cols_per_stage, sl.c1 - c);
      const int parts = max(1, kConsumers / cols), seg = ph.k / parts;
      mbar_wait(&full[s], (i / stages) & 1);
      const __nv_bfloat16* w = reinterpret_cast<const __nv_bfloat16*>(ring + (size_t)s * kStageBytes);
      for (int t = warp; t < cols * parts; t += kConsumers) {
        const int col = t / parts, part = t % parts;
        const uint4* wr = reinterpret_cast<const uint4*>(w + (size_t)col * ph.k + part * seg);
        const uint4* xr = reinterpret_cast<const uint4*>(xs + part * seg);
        float sum = 0.f;
        for (int v = lane; v < seg / 8; v += 32) {
          const uint4 wv = wr[v], xv = xr[v];
          const __nv_bfloat162* we = reinterpret_cast<const __nv_bfloat162*>(&wv);
          const __nv_bfloat162* xe = reinterpret_cast<const __nv_bfloat162*>(&xv);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float2 wf = __bfloat1622float2(we[e]), xf = __bfloat1622float2(xe[e]);
            sum = fmaf(wf.x, xf.x, fmaf(wf.y, xf.y, sum));
          }
        }
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (lane == 0) atomicAdd(&acc[c - sl.c0 + col], sum);
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);
    }
    consumers_sync();
    for (int c = threadIdx.x; c < sl.c1 - sl.c0; c += 32 * kConsumers) out[sl.c0 + c] = __float2bfloat16(acc[c]);
    if (p + 1 == count) break;
    consumers_sync();
    if (threadIdx.x == 0 && barrier) {  // grid-wide: every block's slice of this phase is written
      __threadfence();
      atomicAdd(arrivals, 1u);
      const unsigned target = base + (p + 1) * gridDim.x;
      while (ld_acquire(arrivals) < target) {
      }
    }
    consumers_sync();
  }
}

// Reference: one plain kernel a phase (a warp a column, float accumulation, bf16 between phases).
__global__ void reference(const __nv_bfloat16* w, const __nv_bfloat16* x, __nv_bfloat16* out, int n, int k) {
  const int col = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (col >= n) return;
  float sum = 0.f;
  for (int e = lane; e < k; e += 32) sum += __bfloat162float(w[(size_t)col * k + e]) * __bfloat162float(x[e]);
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0) out[col] = __float2bfloat16(sum);
}

int main() {
  std::vector<Phase> host;
  unsigned seed = 1;
  for (int l = 0; l < 24; ++l)
    for (auto nk : {std::pair{2048, 1024}, {1024, 1024}, {8192, 1024}, {1024, 4096}}) {
      __nv_bfloat16* w = nullptr;
      const size_t count = (size_t)nk.first * nk.second;
      CK(cudaMalloc(&w, count * 2));
      fill_uniform_bf16<<<1024, 256>>>(w, count, seed++ * 7919u, std::sqrt(3.f / nk.second));
      host.push_back({w, nk.first, nk.second});
    }
  // The chain multiplies 8192-long outputs into 1024-long inputs as written; only the first
  // k of an 8192-long output feed the next phase, as in gemv_chain_prefetch.cu.
  double bytes = 0;
  for (const Phase& p : host) bytes += (double)p.n * p.k * 2;
  Phase* phases = nullptr;
  CK(cudaMalloc(&phases, host.size() * sizeof(Phase)));
  CK(cudaMemcpy(phases, host.data(), host.size() * sizeof(Phase), cudaMemcpyHostToDevice));
  __nv_bfloat16 *a, *b, *ra, *rb, *x0;
  for (auto** p : {&a, &b, &ra, &rb, &x0}) CK(cudaMalloc(p, 8192 * 2));
  fill_uniform_bf16<<<8, 256>>>(x0, 8192, 12345u, 1.7f);
  unsigned* arrivals = nullptr;
  CK(cudaMalloc(&arrivals, 4));
  CK(cudaMemset(arrivals, 0, 4));
  unsigned base = 0;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  for (const Phase& p : host)
    if ((p.n + sms - 1) / sms > kMaxCols || p.k > kMaxK) {
      std::printf("phase %dx%d does not fit the block's buffers\n", p.n, p.k);
      return 1;
    }
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

  // barrier 0 leaves the grid-wide wait out (wrong results; the weight streaming's time alone).
  auto launch = [&](int count, int stages, int barrier) {
    const size_t shared = 2 * stages * sizeof(uint64_t) + kMaxCols * 4 + kMaxK * 2 + (size_t)stages * kStageBytes;
    CK(cudaFuncSetAttribute(chain, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
    CK(cudaMemcpyAsync(a, x0, 8192 * 2, cudaMemcpyDeviceToDevice, st));
    unsigned blocks = static_cast<unsigned>(sms);
    void* args[] = {&phases, &count, &a, &b, &arrivals, &base, &stages, &barrier};
    CK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(chain), blocks, kThreads, args, shared, st));
    if (barrier) base += (count - 1) * blocks;  // the last phase does not arrive
  };
  // Check against the reference after one layer (4 phases) and after the whole chain.
  for (int count : {4, static_cast<int>(host.size())}) {
    launch(count, 8, 1);
    CK(cudaMemcpyAsync(ra, x0, 8192 * 2, cudaMemcpyDeviceToDevice, st));
    for (int p = 0; p < count; ++p)
      reference<<<(host[p].n + 3) / 4, 128, 0, st>>>(host[p].w, p % 2 ? rb : ra, p % 2 ? ra : rb, host[p].n,
                                                      host[p].k);
    CK(cudaStreamSynchronize(st));
    const int n = host[count - 1].n;
    std::vector<__nv_bfloat16> got(n), want(n);
    CK(cudaMemcpy(got.data(), count % 2 ? b : a, n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(want.data(), count % 2 ? rb : ra, n * 2, cudaMemcpyDeviceToHost));
    double diff = 0, norm = 0;
    for (int c = 0; c < n; ++c) {
      const double g = __bfloat162float(got[c]), w = __bfloat162float(want[c]);
      diff += (g - w) * (g - w);
      norm += w * w;
    }
    const double rel = std::sqrt(diff / std::max(norm, 1e-30));
    std::printf("check after %d phases: norm-relative difference %.2e from the reference (|ref| %.3g)%s\n", count,
                rel, std::sqrt(norm), rel < (count == 4 ? 2e-2 : 2e-1) ? "" : "  <-- WRONG");
  }
  for (int rep = 0; rep < 2; ++rep)
    for (int stages : {4, 8, 12})
      for (int barrier : {1, 0}) {
      cudaEvent_t e0, e1;
      CK(cudaEventCreate(&e0));
      CK(cudaEventCreate(&e1));
      std::vector<float> ts;
      const int count = static_cast<int>(host.size());
      for (int it = 0; it < 60; ++it) {
        CK(cudaEventRecord(e0, st));
        launch(count, stages, barrier);
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (it >= 10) ts.push_back(ms);
      }
      std::sort(ts.begin(), ts.end());
      const float med = ts[ts.size() / 2];
      std::printf("streamed persistent, %d blocks, %d stages of %d KB%s: %d phases, %.1f MB, median %.3f ms, %.0f GB/s"
                  " (includes a 16 KB input copy)\n",
                  sms, stages, kStageBytes / 1024, barrier ? "" : ", NO grid barrier (timing only)", count,
                  bytes / 1e6, med, bytes / med / 1e6);
    }
  return 0;
}
