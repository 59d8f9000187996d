// Micro-benchmark (benchmarks/micro/README.md): why does the streamed GEMV chain of
// gemv_chain_stream.cu read its 755 MB of weights at only 1.9 TB/s (0.40 ms on an H100, 3.35 TB/s
// peak) even with its grid barriers removed? What can ONE streaming kernel reach on this GPU, and
// which part limits it: the DRAM read itself, direct loads plus the dot products, or the
// cp.async.bulk ring (producer or consumers)? Every variant reads the same 755 MB bf16 weight
// buffer (the 96 phases of the 410M Llama decode, 24 x [2048x1024, 1024x1024, 8192x1024,
// 1024x4096], output columns x K, each column's K weights contiguous) and, where it computes, the
// same 4096-element bf16 x for every phase (no dependency between phases: timing only).
//   A  plain read: grid-stride uint4 loads, 4 or 8 in flight a thread, a sum a block (ceiling).
//   B  persistent direct-load GEMV: a block owns a contiguous slice of each phase's columns, warps
//      take 4 KB tasks (8 uint4 loads in flight a lane) against x in shared memory; no barriers.
//   C  cp.async.bulk ring as gemv_chain_stream.cu without barriers, parameterised: stage size,
//      stages, consumer warps, one or four bulk copies a stage; consumers compute, or only touch
//      a word a stage (the producer's ceiling); one line with a consumer sync at each phase end.
//   D  as B, but each phase cut into chunks dealt round-robin over the blocks (then warps).
// B, C and D are checked against a plain reference kernel (a warp a column) on phases 0 and 3.
//   nvcc -O3 -arch=sm_90 -o /tmp/srp benchmarks/micro/stream_read_peak.cu && /tmp/srp
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "micro_util.cuh"

constexpr int kPhases = 96;
constexpr int kMaxK = 4096;
constexpr int kRuns = 25;    // timed runs a variant (median reported)
constexpr int kWarmup = 3;

struct PhaseDesc {
  long long w_off;  // first weight (elements) in the shared buffer
  int n, k;         // output columns, inputs
  int out_off;      // first output of the phase in the float output buffer
};
__constant__ PhaseDesc c_ph[kPhases];

// ---------------------------------------------------------------- helpers
__device__ __forceinline__ uint4 ld_nc16(const uint4* p) {  // streaming 16-byte load, not kept in L1
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ float dot8(const uint4& w, const uint4& x, float s) {
  const __nv_bfloat162* we = reinterpret_cast<const __nv_bfloat162*>(&w);
  const __nv_bfloat162* xe = reinterpret_cast<const __nv_bfloat162*>(&x);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 wf = __bfloat1622float2(we[e]), xf = __bfloat1622float2(xe[e]);
    s = fmaf(wf.x, xf.x, fmaf(wf.y, xf.y, s));
  }
  return s;
}
__device__ __forceinline__ float warp_sum(float s) {
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// ---------------------------------------------------------------- A: plain read
template <int U>
__global__ void plain_read(const uint4* __restrict__ p, size_t n, unsigned* sink) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  unsigned acc = 0;
  for (; i + (U - 1) * stride < n; i += U * stride) {
    uint4 v[U];
#pragma unroll
    for (int j = 0; j < U; ++j) v[j] = ld_nc16(p + i + j * stride);
#pragma unroll
    for (int j = 0; j < U; ++j) acc += v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = ld_nc16(p + i);
    acc += v.x ^ v.y ^ v.z ^ v.w;
  }
  __shared__ unsigned block_sum;
  if (threadIdx.x == 0) block_sum = 0;
  __syncthreads();
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) atomicAdd(&block_sum, acc);
  __syncthreads();
  if (threadIdx.x == 0) sink[blockIdx.x] = block_sum;
}

// ---------------------------------------------------------------- B / D: direct-load GEMV
// A warp's task: TASK/K whole columns (or one column if K >= TASK), i.e. TASK*2 bytes; lane l
// reads uint4 number u*32+l of the task for u = 0..TASK/256-1, in batches of 8 loads in flight.
// Tasks t0, t0+step, ... of columns [c0, c1) belong to this warp.
template <int K, int TASK>
__device__ __forceinline__ void gemv_tasks(const __nv_bfloat16* w, const uint4* xs4, float* out, int c0, int c1,
                                           int t0, int step, int lane) {
  constexpr int TC = TASK / K;    // columns a task
  constexpr int VPC = K / 256;    // uint4 a lane per column
  constexpr int VPL = TASK / 256; // uint4 a lane per task
  constexpr int BATCH = VPL < 8 ? VPL : 8;
  const int tasks = (c1 - c0 + TC - 1) / TC;
  for (int t = t0; t < tasks; t += step) {
    const int col0 = c0 + t * TC;
    const uint4* base = reinterpret_cast<const uint4*>(w + (size_t)col0 * K);
    float sum[TC];
#pragma unroll
    for (int q = 0; q < TC; ++q) sum[q] = 0.f;
#pragma unroll
    for (int b = 0; b < VPL; b += BATCH) {
      uint4 v[BATCH];
#pragma unroll
      for (int j = 0; j < BATCH; ++j) {
        const int u = b + j;
        if (TC == 1 || col0 + u / VPC < c1)
          v[j] = ld_nc16(base + u * 32 + lane);
        else
          v[j] = make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int j = 0; j < BATCH; ++j) {
        const int u = b + j;
        sum[u / VPC] = dot8(v[j], xs4[(u % VPC) * 32 + lane], sum[u / VPC]);
      }
    }
#pragma unroll
    for (int q = 0; q < TC; ++q) {
      const float s = warp_sum(sum[q]);
      if (lane == 0 && col0 + q < c1) out[col0 + q] = s;
    }
  }
}

// round_robin 0 (B): block b owns columns [n*b/B, n*(b+1)/B) of each phase; its tasks go to its
// warps in turn, the turn carried over from phase to phase. round_robin 1 (D): a phase's tasks are
// dealt over all warps of the grid, task g (counted over all phases) to global warp g % (B*W),
// global warp gw being warp gw / B of block gw % B (so consecutive chunks go to consecutive blocks).
template <int TASK_MIN>
__global__ void __launch_bounds__(512, 2) gemv_direct(const __nv_bfloat16* w, const __nv_bfloat16* x, float* out,
                                                   int round_robin) {
  __shared__ __align__(16) __nv_bfloat16 xs[kMaxK];
  uint4* xs4 = reinterpret_cast<uint4*>(xs);
  for (int v = threadIdx.x; v < kMaxK / 8; v += blockDim.x) xs4[v] = reinterpret_cast<const uint4*>(x)[v];
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, W = blockDim.x >> 5, B = gridDim.x;
  unsigned done = 0;  // tasks dealt before this phase (in this block, or in the grid)
  for (int p = 0; p < kPhases; ++p) {
    const PhaseDesc ph = c_ph[p];
    int c0 = 0, c1 = ph.n, t0, step;
    if (!round_robin) {
      c0 = static_cast<int>((long long)ph.n * blockIdx.x / B);
      c1 = static_cast<int>((long long)ph.n * (blockIdx.x + 1) / B);
      step = W;
      t0 = (warp - static_cast<int>(done % W) + W) % W;
    } else {
      step = B * W;
      const int gw = warp * B + blockIdx.x;
      t0 = (gw - static_cast<int>(done % step) + step) % step;
    }
    const __nv_bfloat16* wp = w + ph.w_off;
    float* op = out + ph.out_off;
    int tc;
    if (ph.k == 1024) {
      constexpr int T = TASK_MIN > 1024 ? TASK_MIN : 1024;
      gemv_tasks<1024, T>(wp, xs4, op, c0, c1, t0, step, lane);
      tc = T / 1024;
    } else {  // the host checks that every K is 1024 or 4096
      constexpr int T = TASK_MIN > 4096 ? TASK_MIN : 4096;
      gemv_tasks<4096, T>(wp, xs4, op, c0, c1, t0, step, lane);
      tc = T / 4096;
    }
    done += (c1 - c0 + tc - 1) / tc;
  }
}

// ---------------------------------------------------------------- C: bulk ring
// Block = C consumer warps + one producer warp (the last). Block b owns the same column slices as
// in B; the producer lane streams them, phase after phase, into `stages` ring stages of whole
// columns (copies bulk copies a stage), waiting only for a free stage. Consumers wait for a stage,
// split it into (column, part) items dealt to the warps in turn (a part when there are fewer
// columns than warps; parts are summed with atomicAdd), then release it. touch: consumers only read
// one word of the stage. phase_sync: the consumers meet at a named barrier at each phase end, as
// gemv_chain_stream.cu's consumers do.
__global__ void __launch_bounds__(544, 1)
    ring_gemv(const __nv_bfloat16* w, const __nv_bfloat16* x, float* out, unsigned* sink, int stage_bytes,
              int stages, int copies, int touch, int phase_sync) {
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* ring = smem;
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(smem + (size_t)stages * stage_bytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(xs + kMaxK);
  uint64_t* empty = full + stages;
  const int C = (blockDim.x >> 5) - 1, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, B = gridDim.x;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], C);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warp == C) {  // producer
    if (lane != 0) return;
    unsigned i = 0;
    for (int p = 0; p < kPhases; ++p) {
      const PhaseDesc ph = c_ph[p];
      const int c0 = static_cast<int>((long long)ph.n * blockIdx.x / B);
      const int c1 = static_cast<int>((long long)ph.n * (blockIdx.x + 1) / B);
      const int cps = max(1, stage_bytes / (ph.k * 2));
      for (int c = c0; c < c1; c += cps, ++i) {
        const int s = i % stages;
        const unsigned bytes = static_cast<unsigned>(min(cps, c1 - c) * ph.k * 2);
        mbar_wait(&empty[s], ((i / stages) & 1) ^ 1);
        mbar_expect_bytes(&full[s], bytes);
        const unsigned char* src = reinterpret_cast<const unsigned char*>(w + ph.w_off + (size_t)c * ph.k);
        unsigned char* dst = ring + (size_t)s * stage_bytes;
        const unsigned part = bytes / copies;  // bytes is a multiple of 2048
        for (int q = 0; q < copies; ++q) bulk_load(dst + q * part, src + q * part, part, &full[s]);
      }
    }
    return;
  }

  for (int v = threadIdx.x; v < kMaxK / 8; v += 32 * C)
    reinterpret_cast<uint4*>(xs)[v] = reinterpret_cast<const uint4*>(x)[v];
  named_sync(1, 32 * C);
  unsigned i = 0, rot = 0, touched = 0;
  for (int p = 0; p < kPhases; ++p) {
    const PhaseDesc ph = c_ph[p];
    const int c0 = static_cast<int>((long long)ph.n * blockIdx.x / B);
    const int c1 = static_cast<int>((long long)ph.n * (blockIdx.x + 1) / B);
    const int cps = max(1, stage_bytes / (ph.k * 2));
    for (int c = c0; c < c1; c += cps, ++i) {
      const int s = i % stages;
      const int cols = min(cps, c1 - c);
      mbar_wait(&full[s], (i / stages) & 1);
      const unsigned char* st = ring + (size_t)s * stage_bytes;
      if (touch) {
        if (lane == 0) touched += reinterpret_cast<const volatile unsigned*>(st)[warp];
      } else {
        int parts = 1;  // a power of two, so that K / parts stays a multiple of 8
        while (parts * 2 * cols <= C) parts *= 2;
        const int seg = ph.k / parts, items = cols * parts;
        for (int t = (warp - static_cast<int>(rot % C) + C) % C; t < items; t += C) {
          const int col = t / parts, part = t % parts;
          const uint4* wr = reinterpret_cast<const uint4*>(st) + ((size_t)col * ph.k + part * seg) / 8;
          const uint4* xr = reinterpret_cast<const uint4*>(xs) + part * seg / 8;
          float sum = 0.f;
#pragma unroll 4
          for (int v = lane; v < seg / 8; v += 32) sum = dot8(wr[v], xr[v], sum);
          sum = warp_sum(sum);
          if (lane == 0) {
            float* o = out + ph.out_off + c + col;
            if (parts == 1)
              *o = sum;
            else
              atomicAdd(o, sum);
          }
        }
        rot += items;
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);
    }
    if (phase_sync) named_sync(1, 32 * C);
  }
  if (touch && lane == 0) sink[blockIdx.x * C + warp] = touched;
}

// ---------------------------------------------------------------- reference and fill
__global__ void reference(const __nv_bfloat16* w, const __nv_bfloat16* x, float* out, int n, int k) {
  const int col = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (col >= n) return;
  float sum = 0.f;
  for (int e = lane; e < k; e += 32) sum += __bfloat162float(w[(size_t)col * k + e]) * __bfloat162float(x[e]);
  sum = warp_sum(sum);
  if (lane == 0) out[col] = sum;
}

__global__ void fill(__nv_bfloat16* w, size_t count, unsigned seed) {  // uniform in [-1, 1)
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = static_cast<unsigned>(i) * 2654435761u ^ static_cast<unsigned>(i >> 32) * 40503u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    h *= 3266489917u;
    h ^= h >> 16;
    w[i] = __float2bfloat16_rz((h & 0xffffu) / 32768.f - 1.f);  // toward 0: stays below 1
  }
}

// ---------------------------------------------------------------- host

static double g_bytes = 0, g_peak = 0;  // bytes read a run (weights), theoretical peak (B/s; 0 unknown)
static void row(const char* variant, const char* cfg, float ms) {
  const double tbs = g_bytes / (ms * 1e-3) / 1e12;
  std::printf("%-2s %-68s %8.4f ms %6.3f TB/s", variant, cfg, ms, tbs);
  if (g_peak > 0) std::printf("  %5.1f%% of peak", 100.0 * tbs * 1e12 / g_peak);
  std::printf("\n");
}

int main() {
  int dev = 0, sms = 0, clock_khz = 0, bus_bits = 0, smem_optin = 0;
  CK(cudaGetDevice(&dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, dev) != cudaSuccess) clock_khz = 0;
  if (cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev) != cudaSuccess) bus_bits = 0;
  cudaGetLastError();
  std::printf("device: %s, %d SMs, %d KB shared memory a block (opt-in)\n", prop.name, sms, smem_optin / 1024);
  if (clock_khz > 0 && bus_bits > 0) {
    g_peak = clock_khz * 1e3 * 2.0 * bus_bits / 8.0;
    std::printf("theoretical peak: %.3f TB/s (memory clock %d MHz x 2 x %d-bit bus)\n", g_peak / 1e12,
                clock_khz / 1000, bus_bits);
  } else {
    std::printf("theoretical peak: unknown\n");
  }

  // The 96 phases in one buffer, outputs of every phase in one float buffer.
  std::vector<PhaseDesc> ph;
  long long w_elems = 0;
  int out_elems = 0;
  for (int l = 0; l < 24; ++l)
    for (auto nk : {std::pair{2048, 1024}, {1024, 1024}, {8192, 1024}, {1024, 4096}}) {
      ph.push_back({w_elems, nk.first, nk.second, out_elems});
      w_elems += (long long)nk.first * nk.second;
      out_elems += nk.first;
    }
  for (const PhaseDesc& p : ph)
    if (p.k != 1024 && p.k != 4096) {
      std::printf("phase %dx%d: K must be 1024 or 4096\n", p.n, p.k);
      return 1;
    }
  g_bytes = static_cast<double>(w_elems) * 2;
  CK(cudaMemcpyToSymbol(c_ph, ph.data(), sizeof(PhaseDesc) * kPhases));
  __nv_bfloat16 *w = nullptr, *x = nullptr;
  float *out = nullptr, *ref = nullptr;
  unsigned* sink = nullptr;
  const size_t sink_count = 1 << 20;
  CK(cudaMalloc(&w, w_elems * 2));
  CK(cudaMalloc(&x, kMaxK * 2));
  CK(cudaMalloc(&out, out_elems * sizeof(float)));
  CK(cudaMalloc(&ref, out_elems * sizeof(float)));
  CK(cudaMalloc(&sink, sink_count * sizeof(unsigned)));
  fill<<<4 * sms, 256>>>(w, w_elems, 0x9e3779b9u);
  fill<<<8, 256>>>(x, kMaxK, 12345u);
  CK(cudaGetLastError());
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CK(cudaDeviceSynchronize());
  std::printf("weights: %d phases, %.1f MB (bf16); x: %d bf16, the same for every phase; median of %d runs\n",
              kPhases, g_bytes / 1e6, kMaxK, kRuns);

  // Reference outputs of the phases the checks compare: 0 (2048x1024) and 3 (1024x4096).
  const int checked[] = {0, 3};
  for (int p : checked)
    reference<<<(ph[p].n + 3) / 4, 128, 0, st>>>(w + ph[p].w_off, x, ref + ph[p].out_off, ph[p].n, ph[p].k);
  CK(cudaStreamSynchronize(st));
  auto check = [&](const char* what) {
    CK(cudaStreamSynchronize(st));
    double max_diff = 0, max_ref = 0;
    for (int p : checked) {
      std::vector<float> got(ph[p].n), want(ph[p].n);
      CK(cudaMemcpy(got.data(), out + ph[p].out_off, ph[p].n * 4, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(want.data(), ref + ph[p].out_off, ph[p].n * 4, cudaMemcpyDeviceToHost));
      for (int c = 0; c < ph[p].n; ++c) {
        max_diff = std::max(max_diff, (double)std::fabs(got[c] - want[c]));
        if (!(std::fabs(got[c] - want[c]) <= 1e30)) max_diff = INFINITY;  // NaN
        max_ref = std::max(max_ref, (double)std::fabs(want[c]));
      }
    }
    std::printf("check %-58s phases 0 and 3: max |diff| %.2e, max |ref| %.3g, relative %.2e%s\n", what, max_diff,
                max_ref, max_diff / std::max(max_ref, 1e-30),
                max_diff <= 1e-3 * max_ref && max_ref > 0 ? "" : "  <-- WRONG");
  };

  char cfg[160];
  std::printf("\n%-2s %-68s %11s %11s\n", "", "variant", "median", "bandwidth");

  // ---- A: plain read
  const uint4* w4 = reinterpret_cast<const uint4*>(w);
  const size_t n4 = static_cast<size_t>(w_elems) / 8;
  for (int u : {4, 8})
    for (int mult : {2, 4, 8})
      for (int threads : {256, 512}) {
        auto kern = u == 4 ? plain_read<4> : plain_read<8>;
        int resident = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kern, threads, 0));
        const int blocks = sms * mult;
        std::snprintf(cfg, sizeof cfg, "plain read: %d loads a thread, %d blocks (SMs x %d) x %d thr%s", u, blocks,
                      mult, threads, mult > resident ? " (>1 wave)" : "");
        row("A", cfg, median_ms(st, [&] { kern<<<blocks, threads, 0, st>>>(w4, n4, sink); }, kWarmup, kRuns));
      }

  // ---- B: direct-load GEMV, contiguous column slices
  auto run_direct = [&](const char* variant, int chunk_kb, int rr, int mult, int warps, bool do_check) {
    auto kern = chunk_kb == 4 ? gemv_direct<2048> : gemv_direct<4096>;
    const int blocks = sms * mult;
    if (rr)
      std::snprintf(cfg, sizeof cfg, "direct GEMV, round-robin %d KB chunks, %d blocks x %d warps", chunk_kb, blocks,
                    warps);
    else
      std::snprintf(cfg, sizeof cfg, "direct GEMV, contiguous slices, 4 KB/1-column tasks, %d blocks x %d warps", blocks,
                    warps);
    auto launch = [&] { kern<<<blocks, 32 * warps, 0, st>>>(w, x, out, rr); };
    if (do_check) {
      CK(cudaMemsetAsync(out, 0, out_elems * sizeof(float), st));
      launch();
      CK(cudaGetLastError());
      check(cfg);
    }
    row(variant, cfg, median_ms(st, launch, kWarmup, kRuns));
  };
  for (int mult : {1, 2})
    for (int warps : {8, 16}) run_direct("B", 4, 0, mult, warps, mult == 1 && warps == 8);

  // ---- C: bulk ring
  auto run_ring = [&](int stage_kb, int stages, int consumers, int copies, int touch, int phase_sync,
                      bool do_check) {
    const int stage_bytes = stage_kb * 1024;
    const size_t shared = (size_t)stages * stage_bytes + kMaxK * 2 + 2 * stages * sizeof(uint64_t);
    std::snprintf(cfg, sizeof cfg, "bulk ring %2d KB x %d stages, %2d consumers, %d cp/stage%s%s", stage_kb, stages,
                  consumers, copies, touch ? ", TOUCH ONLY" : "", phase_sync ? ", phase sync" : "");
    if (shared > (size_t)smem_optin) {
      std::printf("C  %-68s skipped (%zu KB shared memory)\n", cfg, shared / 1024);
      return;
    }
    CK(cudaFuncSetAttribute(ring_gemv, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
    auto launch = [&] {
      ring_gemv<<<sms, 32 * (consumers + 1), shared, st>>>(w, x, out, sink, stage_bytes, stages, copies, touch,
                                                           phase_sync);
    };
    if (do_check) {
      CK(cudaMemsetAsync(out, 0, out_elems * sizeof(float), st));
      launch();
      CK(cudaGetLastError());
      check(cfg);
    }
    row("C", cfg, median_ms(st, launch, kWarmup, kRuns));
  };
  for (int stage_kb : {16, 32})
    for (int stages : {4, 8}) {
      for (int consumers : {4, 8, 16})
        for (int copies : {1, 4})
          run_ring(stage_kb, stages, consumers, copies, 0, 0,
                   (stage_kb == 16 && stages == 8 && consumers == 8 && copies == 1) ||
                       (stage_kb == 32 && stages == 4 && consumers == 16 && copies == 4));
      for (int copies : {1, 4}) run_ring(stage_kb, stages, 8, copies, 1, 0, false);
    }
  run_ring(16, 8, 8, 1, 0, 1, false);  // gemv_chain_stream.cu's shape, with its per-phase consumer sync

  // ---- D: direct-load GEMV, round-robin chunks
  for (int chunk_kb : {8, 4})
    for (int mult : {1, 2})
      for (int warps : {8, 16}) run_direct("D", chunk_kb, 1, mult, warps, chunk_kb == 8 && mult == 1 && warps == 8);

  CK(cudaDeviceSynchronize());
  std::printf("\nTB/s counts the %.1f MB of weights a run (x, 8 KB a block, and the outputs not counted).\n",
              g_bytes / 1e6);
  return 0;
}
