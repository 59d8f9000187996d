// Micro-benchmark (benchmarks/micro/README.md): can ONE persistent kernel run the *dependent*
// decode-shaped bf16 GEMV chain (24 x [2048x1024, 1024x1024, 8192x1024, 1024x4096], 96 phases,
// 755 MB; phase p+1 reads phase p's whole output) near the streaming rate, if every warp loads its
// own weights ahead of the dependencies with direct loads (no bulk ring, no cross-warp handoff)?
// stream_read_peak.cu measured 3.0 TB/s for a direct-load GEMV over the 96 phases with no
// dependency at all (variant D: 4-8 KB chunks dealt round-robin over the grid's warps);
// gemv_chain_stream.cu, whose consumers wait behind a cp.async.bulk ring and a grid-wide counter,
// took 0.558 ms; the chain of kernels with programmatic dependent launch 0.405 ms.
//
// Work split (every variant): a phase's output columns are cut into tasks of TASK bytes of weights
// (k=1024: TASK/2048 whole columns; k=4096: one 8 KB column, so a task is never part of a column
// and no partial sums cross warps). Task g, counted over all phases in order, belongs to global
// warp g % NW (NW = blocks x warps), global warp gw being warp gw / blocks of block gw % blocks, as
// in stream_read_peak.cu's variant D: consecutive tasks land on different SMs. The assignment is
// static; each warp walks its own tasks phase after phase. Lane l of a warp always handles the
// 16-byte chunks u*32+l (u = 0, 1, ...) of a task: it loads them, and it alone reads them back.
//
//   ring  run-ahead through shared memory: each warp owns a byte ring of RING bytes and keeps
//         filling it with its next tasks (cp.async.cg.shared.global 16-byte copies, one commit
//         group a task) as long as they fit, including tasks of later phases, BEFORE it waits
//         for the phase its oldest task belongs to. Then cp.async.wait_group(in flight - 1)
//         (a switch over immediates: the count is a runtime value), compute from the ring,
//         free the bytes. Since a task is a multiple of 2 KB and lane l copies and reads the
//         bytes at ring offsets = 16*l (mod 512) only, a lane never reads another lane's copy
//         and never overwrites bytes another lane still has to read: no __syncwarp, no mbarrier
//         is needed for the ring.
//   regs  run-ahead through registers: two register buffers of up to 8 KB a warp (16 uint4 a
//         lane), used alternately: the loads of the warp's next task are issued before it waits
//         for the dependency of the current one and computes it (one task ahead).
//
// Dependency: a global arrival counter per phase (128 bytes apart). After its last task of
// phase p, a warp does __syncwarp (the lanes' output stores before lane 0's fence, the pattern of
// a cooperative-groups grid sync), and lane 0 does __threadfence() and adds the number of tasks it
// did to counter[p] ("warp arrive"), or adds it to a shared-memory count
// of the block and the warp that completes the block's share adds the block's total after a
// __threadfence() ("block arrive": fewer atomics on one address). Before its first task of phase
// p > 0 a warp spins, all 32 lanes on ld.acquire.gpu of counter[p-1] (one request a poll, and
// every lane has its own acquire), until it reaches gen * tasks(p-1), then reads phase p-1's
// output (x of phase p, k bf16) into registers with __ldcg (past L1). Counters count up across
// the runs of one variant (gen = 1, 2, ... passed to each launch) and are zeroed with
// cudaMemset before each variant's first run, outside all timing.
// Every spin is bounded (~2e8 clock cycles, about 0.1 s); on timeout, or when another warp has
// already set the error flag, the warp sets the flag, drains its copies and returns; the host
// prints "TIMEOUT in <variant>" and skips the variant. Launches are cooperative, so a grid whose
// blocks could not all be resident is refused rather than deadlocked; configurations the
// occupancy calculator rejects are skipped before launching.
//
// Variants (about 22 rows, a few seconds in all):
//   ring, TASK 2/4/8 KB, on three grid shapes with ~192 KB of ring an SM (all warps' rings
//         together ~25 MB over 132 SMs, about three phases of weights on average): a block of 8
//         warps x 24 KB, a block of 16 warps x 12 KB, two blocks of 8 warps x 12 KB; then ring
//         depth (8 and 16 KB a warp); then "block arrive" instead of "warp arrive".
//         The ring is counted in bytes, not in slots, because tasks are 2-8 KB depending on k;
//         R slots of the brief correspond to RING/TASK.
//   regs  TASK 4 and 8 KB, a block of 8 warps an SM (the two buffers and x take 230 registers).
//   nodep the same kernels with no waits and no arrivals (wrong results, timing only): the
//         streaming ceiling of each access pattern.
//   chain the baseline, one kernel a phase (a warp a column, 4 warps a block, griddepcontrol.wait
//         at the top then launch_dependents: gemv_chain_prefetch.cu's mode 0) with programmatic
//         dependent launch, replayed from a CUDA graph; timed first and last in the same process.
// Timing: CUDA events around each launch (a cooperative launch for the persistent kernels, a graph
// launch for the chain), median of 30 runs after 5 warm-up runs; nothing else is in the timed span.
//
// Weights uniform in +-sqrt(3/k) (a phase keeps its input's scale), x of phase 0 uniform in
// +-sqrt(3); no nonlinearity; fp32 accumulation, bf16 outputs. Every phase writes its own output
// region, and phase p reads the first k(p) outputs of phase p-1 (8192 -> 4096 as in the other
// files). Numerics: each checked variant's outputs of phases 0, 3 (after one layer) and 95 are
// compared with a chain of plain reference kernels (a warp a column, fp32, bf16 between phases);
// norm-relative difference must stay below 1e-2, 2e-2 and 2e-1 (the chain is chaotic over 96
// phases; gemv_chain_stream.cu's limits).
//
//   nvcc -O3 -arch=sm_90 -o /tmp/gr benchmarks/micro/gemv_chain_runahead.cu && timeout 150 /tmp/gr
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
constexpr int kXPad = 8192;              // activation elements before phase 0's output (x of phase 0)
constexpr int kCtrStride = 32;           // unsigned a counter: one 128-byte line each
constexpr int kMaxInFlight = 16;         // tasks in flight a warp (ring): wait_group immediates 0..15
constexpr int kArrBytes = 512;           // shared memory for the block-arrive counts (96 unsigned)
constexpr long long kSpinCycles = 200000000LL;  // ~0.1 s at 1.7-2 GHz
constexpr int kRuns = 30;
constexpr int kWarmup = 5;

struct PhaseDesc {
  long long w_off;  // first weight (elements): n columns of k contiguous weights
  int n, k;
  int in_off, out_off;  // activation offsets (elements): x of this phase, its output
};
__constant__ PhaseDesc c_ph[kPhases];

// ---------------------------------------------------------------- small helpers
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(__cvta_generic_to_global(src))
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Wait until at most n of this thread's newest commit groups are pending (n clamped to 15, which
// only waits for more).
__device__ __forceinline__ void cp_async_wait_dyn(int n) {
  switch (n) {
#define KILN_WAIT(N) \
  case N:            \
    asm volatile("cp.async.wait_group " #N ";" ::: "memory"); \
    break;
    KILN_WAIT(0) KILN_WAIT(1) KILN_WAIT(2) KILN_WAIT(3) KILN_WAIT(4) KILN_WAIT(5) KILN_WAIT(6) KILN_WAIT(7)
    KILN_WAIT(8) KILN_WAIT(9) KILN_WAIT(10) KILN_WAIT(11) KILN_WAIT(12) KILN_WAIT(13) KILN_WAIT(14)
#undef KILN_WAIT
    default:
      asm volatile("cp.async.wait_group 15;" ::: "memory");
  }
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
__device__ __forceinline__ uint4 ld_nc16(const uint4* p) {  // weights: read-only, not kept in L1
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

// Columns a task: whole columns adding up to TASK bytes, at least one.
template <int TASK>
__device__ __forceinline__ int cols_per_task(int k) {
  return TASK >= 2 * k ? TASK / (2 * k) : 1;
}
template <int TASK>
__device__ __forceinline__ int tasks_of(int p) {
  const int tc = cols_per_task<TASK>(c_ph[p].k);
  return (c_ph[p].n + tc - 1) / tc;
}

// A warp's walk over its tasks: phase p, task t of the phase; start = index of phase p's first
// task counted over all phases (only start % NW matters).
struct Walk {
  int p, t;
  unsigned start;
};
template <int TASK>
__device__ __forceinline__ void seek(Walk& it, int gw, int NW) {  // first own task at or after it.p
  while (it.p < kPhases) {
    const int nt = tasks_of<TASK>(it.p);
    const int t0 = (gw - static_cast<int>(it.start % NW) + NW) % NW;
    if (t0 < nt) {
      it.t = t0;
      return;
    }
    it.start += nt;
    ++it.p;
  }
}
template <int TASK>
__device__ __forceinline__ void advance(Walk& it, int gw, int NW) {
  it.t += NW;
  const int nt = tasks_of<TASK>(it.p);
  if (it.t >= nt) {
    it.start += nt;
    ++it.p;
    seek<TASK>(it, gw, NW);
  }
}

// Tasks of phase p (first task index start) that belong to the warps of this block.
__device__ __forceinline__ unsigned block_share(int nt, unsigned start, int W, int B, int NW) {
  unsigned total = 0;
  for (int w = 0; w < W; ++w) {
    const int t0 = (w * B + static_cast<int>(blockIdx.x) - static_cast<int>(start % NW) + NW) % NW;
    if (t0 < nt) total += (nt - 1 - t0) / NW + 1;
  }
  return total;
}

// Phase p's outputs written by this warp (mine tasks): publish them.
__device__ __forceinline__ void arrive(unsigned* ctr, unsigned* s_arr, int p, unsigned mine, unsigned block_total,
                                       int block_arrive, int lane) {
  __syncwarp();  // orders the other lanes' output stores before lane 0's fence (as a grid sync does)
  if (lane != 0) return;
  __threadfence();
  unsigned* c = ctr + p * kCtrStride;
  if (!block_arrive) {
    atomicAdd(c, mine);
  } else if (atomicAdd(&s_arr[p], mine) + mine == block_total) {  // the block's last warp of phase p
    __threadfence();
    atomicAdd(c, block_total);
  }
}

// All lanes spin until counter >= target. false: timed out, or another warp failed (flag set).
__device__ __forceinline__ bool wait_count(const unsigned* c, unsigned target, int* err, int lane) {
  if (__all_sync(0xffffffffu, ld_acquire(c) >= target)) return true;
  const long long t0 = clock64();
  unsigned it = 0;
  while (true) {
    if (__all_sync(0xffffffffu, ld_acquire(c) >= target)) return true;
    if ((++it & 255) == 0) {
      int stop = 0;
      if (lane == 0) stop = *reinterpret_cast<volatile int*>(err) != 0 || clock64() - t0 > kSpinCycles;
      if (__shfl_sync(0xffffffffu, stop, 0)) {
        if (lane == 0) atomicOr(err, 1);
        return false;
      }
    }
  }
}

// x of phase p into registers: lane l holds x chunks v*32+l, v < k/256.
__device__ __forceinline__ void load_x(uint4 (&xr)[16], const __nv_bfloat16* act, const PhaseDesc& ph, int lane) {
  const uint4* x4 = reinterpret_cast<const uint4*>(act + ph.in_off);
  const int vpc = ph.k >> 8;
#pragma unroll
  for (int v = 0; v < 16; ++v)
    if (v < vpc) xr[v] = __ldcg(x4 + v * 32 + lane);
}

// Dot products of one task whose lane chunks come from get(u); writes the task's bf16 outputs.
template <int K, int TASK, class Get>
__device__ __forceinline__ void compute_task(Get&& get, const uint4 (&xr)[16], __nv_bfloat16* out, int cols,
                                             int lane) {
  constexpr int VPC = K / 256;  // chunks a lane per column
  constexpr int TC = TASK >= 2 * K ? TASK / (2 * K) : 1;
  constexpr int VPL = TC * VPC;
  float s0[TC], s1[TC];  // two chains a column
#pragma unroll
  for (int q = 0; q < TC; ++q) s0[q] = s1[q] = 0.f;
#pragma unroll
  for (int u = 0; u < VPL; ++u) {
    if (TC == 1 || u / VPC < cols) {
      const uint4 wv = get(u);
      if (u & 1)
        s1[u / VPC] = dot8(wv, xr[u % VPC], s1[u / VPC]);
      else
        s0[u / VPC] = dot8(wv, xr[u % VPC], s0[u / VPC]);
    }
  }
#pragma unroll
  for (int q = 0; q < TC; ++q) {
    const float s = warp_sum(s0[q] + s1[q]);
    if (lane == q && q < cols) out[q] = __float2bfloat16(s);
  }
}

// ---------------------------------------------------------------- ring: run-ahead via shared memory
template <int TASK>
__global__ void __launch_bounds__(512, 1)
    ring_chain(const __nv_bfloat16* __restrict__ w, __nv_bfloat16* act, unsigned* ctr, int* err, unsigned gen,
               int ring_bytes, int dep, int block_arrive) {
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned* s_arr = reinterpret_cast<unsigned*>(smem);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, W = blockDim.x >> 5, B = gridDim.x, NW = W * B;
  const int gw = warp * B + blockIdx.x;
  unsigned char* ring = smem + kArrBytes + (size_t)warp * ring_bytes;
  const unsigned ring_s = smem_u32(ring);
  for (int i = threadIdx.x; i < kPhases; i += blockDim.x) s_arr[i] = 0;
  __syncthreads();

  Walk is{0, 0, 0u};
  seek<TASK>(is, gw, NW);
  Walk cs = is;
  int head = 0, tail = 0, bytes_in = 0, tasks_in = 0;  // ring state (bytes; tail = oldest task)
  int cur = -1;
  unsigned cur_start = 0, mine = 0;
  uint4 xr[16];
  while (cs.p < kPhases) {
    // Run ahead: issue every next task that fits, whatever its phase.
    while (is.p < kPhases && tasks_in < kMaxInFlight) {
      const PhaseDesc& ph = c_ph[is.p];
      const int tc = cols_per_task<TASK>(ph.k), c0 = is.t * tc;
      const int bytes = min(tc, ph.n - c0) * ph.k * 2;
      if (bytes_in + bytes > ring_bytes) break;
      const unsigned char* src = reinterpret_cast<const unsigned char*>(w + ph.w_off + (size_t)c0 * ph.k) + lane * 16;
      for (int u = 0, n = bytes >> 9; u < n; ++u) {
        int off = head + u * 512 + lane * 16;
        if (off >= ring_bytes) off -= ring_bytes;
        cp_async16(ring_s + off, src + u * 512);
      }
      cp_async_commit();
      head += bytes;
      if (head >= ring_bytes) head -= ring_bytes;
      bytes_in += bytes;
      ++tasks_in;
      advance<TASK>(is, gw, NW);
    }
    // The oldest task: its phase's dependency, then its data.
    const PhaseDesc& ph = c_ph[cs.p];
    if (cs.p != cur) {
      if (dep && cs.p > 0 &&
          !wait_count(ctr + (cs.p - 1) * kCtrStride, gen * static_cast<unsigned>(tasks_of<TASK>(cs.p - 1)), err,
                      lane)) {
        cp_async_wait_all();
        return;
      }
      load_x(xr, act, ph, lane);
      cur = cs.p;
      cur_start = cs.start;
      mine = 0;
    }
    cp_async_wait_dyn(tasks_in - 1);
    const int tc = cols_per_task<TASK>(ph.k), c0 = cs.t * tc, cols = min(tc, ph.n - c0);
    const int bytes = cols * ph.k * 2;
    auto get = [&](int u) {
      int off = tail + u * 512 + lane * 16;
      if (off >= ring_bytes) off -= ring_bytes;
      return *reinterpret_cast<const uint4*>(ring + off);
    };
    __nv_bfloat16* out = act + ph.out_off + c0;
    if (ph.k == 1024)
      compute_task<1024, TASK>(get, xr, out, cols, lane);
    else  // the host checks that every k is 1024 or 4096
      compute_task<4096, TASK>(get, xr, out, cols, lane);
    tail += bytes;
    if (tail >= ring_bytes) tail -= ring_bytes;
    bytes_in -= bytes;
    --tasks_in;
    ++mine;
    advance<TASK>(cs, gw, NW);
    if (dep && cs.p != cur)
      arrive(ctr, s_arr, cur, mine, block_arrive ? block_share(tasks_of<TASK>(cur), cur_start, W, B, NW) : 0u,
             block_arrive, lane);
  }
  cp_async_wait_all();
}

// ---------------------------------------------------------------- regs: run-ahead via registers
// Load task `it` (16-byte chunk u*32+lane for u < bytes/512) into r.
template <int TASK>
__device__ __forceinline__ void load_task(uint4 (&r)[16], const __nv_bfloat16* w, const Walk& it, int lane) {
  const PhaseDesc& ph = c_ph[it.p];
  const int tc = cols_per_task<TASK>(ph.k), c0 = it.t * tc;
  const int n = (min(tc, ph.n - c0) * ph.k * 2) >> 9;
  const uint4* src = reinterpret_cast<const uint4*>(w + ph.w_off + (size_t)c0 * ph.k) + lane;
#pragma unroll
  for (int u = 0; u < 16; ++u)
    if (u < n) r[u] = ld_nc16(src + u * 32);
}

struct RegState {
  Walk cs;  // the task whose weights are in (or on their way to) the current buffer
  int cur;
  unsigned cur_start, mine;
};

// One task: issue the next task's loads into nxt, wait for the current task's phase, compute it
// from cur. false: the walk is over, or a wait failed.
template <int TASK>
__device__ __forceinline__ bool reg_step(uint4 (&cur)[16], uint4 (&nxt)[16], uint4 (&xr)[16], RegState& s,
                                         const __nv_bfloat16* w, __nv_bfloat16* act, unsigned* ctr, int* err,
                                         unsigned gen, int dep, int block_arrive, unsigned* s_arr, int lane, int gw,
                                         int W, int B, int NW) {
  Walk ns = s.cs;
  advance<TASK>(ns, gw, NW);
  if (ns.p < kPhases) load_task<TASK>(nxt, w, ns, lane);
  const PhaseDesc& ph = c_ph[s.cs.p];
  if (s.cs.p != s.cur) {
    if (dep && s.cs.p > 0 &&
        !wait_count(ctr + (s.cs.p - 1) * kCtrStride, gen * static_cast<unsigned>(tasks_of<TASK>(s.cs.p - 1)), err,
                    lane))
      return false;
    load_x(xr, act, ph, lane);
    s.cur = s.cs.p;
    s.cur_start = s.cs.start;
    s.mine = 0;
  }
  const int tc = cols_per_task<TASK>(ph.k), c0 = s.cs.t * tc, cols = min(tc, ph.n - c0);
  auto get = [&](int u) { return cur[u]; };
  __nv_bfloat16* out = act + ph.out_off + c0;
  if (ph.k == 1024)
    compute_task<1024, TASK>(get, xr, out, cols, lane);
  else
    compute_task<4096, TASK>(get, xr, out, cols, lane);
  ++s.mine;
  s.cs = ns;
  if (dep && s.cs.p != s.cur)
    arrive(ctr, s_arr, s.cur, s.mine, block_arrive ? block_share(tasks_of<TASK>(s.cur), s.cur_start, W, B, NW) : 0u,
           block_arrive, lane);
  return s.cs.p < kPhases;
}

template <int TASK>
__global__ void __launch_bounds__(256, 1)
    reg_chain(const __nv_bfloat16* __restrict__ w, __nv_bfloat16* act, unsigned* ctr, int* err, unsigned gen,
              int dep, int block_arrive) {
  __shared__ unsigned s_arr[kPhases];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, W = blockDim.x >> 5, B = gridDim.x, NW = W * B;
  const int gw = warp * B + blockIdx.x;
  for (int i = threadIdx.x; i < kPhases; i += blockDim.x) s_arr[i] = 0;
  __syncthreads();
  RegState s;
  s.cs = Walk{0, 0, 0u};
  seek<TASK>(s.cs, gw, NW);
  s.cur = -1;
  s.cur_start = s.mine = 0;
  if (s.cs.p >= kPhases) return;
  uint4 a[16], b[16], xr[16];
  load_task<TASK>(a, w, s.cs, lane);
  while (reg_step<TASK>(a, b, xr, s, w, act, ctr, err, gen, dep, block_arrive, s_arr, lane, gw, W, B, NW) &&
         reg_step<TASK>(b, a, xr, s, w, act, ctr, err, gen, dep, block_arrive, s_arr, lane, gw, W, B, NW)) {
  }
}

// ---------------------------------------------------------------- baseline and reference
// A kernel a phase, a warp a column, 4 warps a block; waits for the previous kernel at the top.
template <int K>
__global__ void __launch_bounds__(128) pdl_phase(const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* x,
                                                  __nv_bfloat16* out, int n) {
  constexpr int VECS = K / 8, G = VECS / 32 < 8 ? VECS / 32 : 8;
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  const int lane = threadIdx.x & 31;
  const int col = blockIdx.x * 4 + (threadIdx.x >> 5);
  if (col >= n) return;
  const uint4* wr = reinterpret_cast<const uint4*>(w + (size_t)col * K);
  const uint4* x4 = reinterpret_cast<const uint4*>(x);
  float acc = 0.f;
  for (int base = lane; base < VECS; base += 32 * G) {
    uint4 wv[G];
#pragma unroll
    for (int g = 0; g < G; ++g) wv[g] = ld_nc16(wr + base + 32 * g);
#pragma unroll
    for (int g = 0; g < G; ++g) acc = dot8(wv[g], x4[base + 32 * g], acc);
  }
  acc = warp_sum(acc);
  if (lane == 0) out[col] = __float2bfloat16(acc);
}

// Reference: plain, a warp a column, element by element, fp32 accumulation.
__global__ void ref_phase(const __nv_bfloat16* w, const __nv_bfloat16* x, __nv_bfloat16* out, int n, int k) {
  const int col = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (col >= n) return;
  float sum = 0.f;
  for (int e = lane; e < k; e += 32) sum += __bfloat162float(w[(size_t)col * k + e]) * __bfloat162float(x[e]);
  sum = warp_sum(sum);
  if (lane == 0) out[col] = __float2bfloat16(sum);
}

// Uniform in +-scale (hash of the index and a seed).
__global__ void fill(__nv_bfloat16* p, size_t count, unsigned seed, float scale) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = static_cast<unsigned>(i) * 0x9E3779B1u + static_cast<unsigned>(i >> 32) * 0x85EBCA77u + seed;
    h ^= h >> 16;
    h *= 0x7FEB352Du;
    h ^= h >> 15;
    h *= 0x846CA68Bu;
    h ^= h >> 16;
    p[i] = __float2bfloat16(((h >> 8) * (1.f / 8388608.f) - 1.f) * scale);
  }
}

// ---------------------------------------------------------------- host
static double g_bytes = 0, g_peak = 0;
static void row(const char* name, float ms) {
  const double tbs = g_bytes / (ms * 1e-3) / 1e12;
  std::printf("%-60s %8.4f ms %6.3f TB/s", name, ms, tbs);
  if (g_peak > 0) std::printf(" %5.1f%% of peak", 100.0 * tbs * 1e12 / g_peak);
  std::printf("\n");
}

struct Variant {
  int regs;          // 0 ring, 1 registers
  int task;          // TASK bytes: 2048, 4096 or 8192
  int mult, warps;   // blocks an SM, warps a block
  int ring_kb;       // ring only
  int dep;           // 0: no waits, no arrivals (timing only)
  int block_arrive;  // 1: one atomic a block and phase
};

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines survive a `timeout` kill
  int dev = 0, sms = 0, clock_khz = 0, bus_bits = 0, smem_optin = 0, coop = 0;
  CK(cudaGetDevice(&dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  CK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
  // CUDA 13 dropped memoryClockRate from cudaDeviceProp: ask for the attributes.
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, dev) != cudaSuccess) clock_khz = 0;
  if (cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev) != cudaSuccess) bus_bits = 0;
  cudaGetLastError();
  std::printf("device: %s, %d SMs, %d KB shared memory a block (opt-in), cooperative launch %s\n", prop.name, sms,
              smem_optin / 1024, coop ? "yes" : "NO");
  if (!coop) return 1;
  if (clock_khz > 0 && bus_bits > 0) {
    g_peak = clock_khz * 1e3 * 2.0 * bus_bits / 8.0;  // double data rate
    std::printf("theoretical peak: %.3f TB/s (memory clock %d MHz x 2 x %d-bit bus)\n", g_peak / 1e12,
                clock_khz / 1000, bus_bits);
  } else {
    std::printf("theoretical peak: unknown\n");
  }

  // ---- the chain: weights in one buffer; activations: x of phase 0, then each phase's output
  std::vector<PhaseDesc> ph;
  long long w_elems = 0;
  int act_elems = kXPad;
  for (int l = 0; l < 24; ++l)
    for (auto nk : {std::pair{2048, 1024}, {1024, 1024}, {8192, 1024}, {1024, 4096}}) {
      const int in_off = ph.empty() ? 0 : ph.back().out_off;
      ph.push_back({w_elems, nk.first, nk.second, in_off, act_elems});
      w_elems += (long long)nk.first * nk.second;
      act_elems += nk.first;
    }
  for (int p = 0; p < kPhases; ++p) {
    const int avail = p ? ph[p - 1].n : kXPad;
    if ((ph[p].k != 1024 && ph[p].k != 4096) || ph[p].k > avail || ph[p].n % 8 || ph[p].out_off % 8) {
      std::printf("phase %d (%dx%d) does not fit this benchmark's assumptions\n", p, ph[p].n, ph[p].k);
      return 1;
    }
  }
  g_bytes = static_cast<double>(w_elems) * 2;
  CK(cudaMemcpyToSymbol(c_ph, ph.data(), sizeof(PhaseDesc) * kPhases));

  __nv_bfloat16 *w = nullptr, *act = nullptr, *ref = nullptr;
  unsigned* ctr = nullptr;
  int* err = nullptr;
  CK(cudaMalloc(&w, w_elems * 2));
  CK(cudaMalloc(&act, (size_t)act_elems * 2));
  CK(cudaMalloc(&ref, (size_t)act_elems * 2));
  CK(cudaMalloc(&ctr, kPhases * kCtrStride * sizeof(unsigned)));
  CK(cudaMalloc(&err, sizeof(int)));
  CK(cudaMemset(err, 0, sizeof(int)));
  for (int p = 0; p < kPhases; ++p)
    fill<<<4 * sms, 256>>>(w + ph[p].w_off, (size_t)ph[p].n * ph[p].k, 7919u * (p + 1), std::sqrt(3.f / ph[p].k));
  fill<<<8, 256>>>(act, kXPad, 12345u, std::sqrt(3.f));
  CK(cudaGetLastError());
  CK(cudaMemcpy(ref, act, kXPad * 2, cudaMemcpyDeviceToDevice));
  CK(cudaDeviceSynchronize());  // the stream below does not wait for the default stream
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

  // Reference chain.
  for (int p = 0; p < kPhases; ++p)
    ref_phase<<<(ph[p].n + 3) / 4, 128, 0, st>>>(w + ph[p].w_off, ref + ph[p].in_off, ref + ph[p].out_off, ph[p].n,
                                                   ph[p].k);
  CK(cudaGetLastError());
  CK(cudaStreamSynchronize(st));
  const size_t out_bytes = (size_t)(act_elems - kXPad) * 2;
  std::vector<__nv_bfloat16> want(act_elems), got(act_elems);
  CK(cudaMemcpy(want.data(), ref, (size_t)act_elems * 2, cudaMemcpyDeviceToHost));
  std::printf("weights: %d phases, %.1f MB bf16; median of %d runs after %d warm-up runs\n\n", kPhases, g_bytes / 1e6,
              kRuns, kWarmup);

  // Compare act's outputs of phases 0, 3 and 95 with the reference chain.
  auto check = [&](const char* name) {
    CK(cudaMemcpy(got.data(), act, (size_t)act_elems * 2, cudaMemcpyDeviceToHost));
    const int phases[] = {0, 3, kPhases - 1};
    const double limit[] = {1e-2, 2e-2, 2e-1};
    bool ok = true;
    std::printf("  check %s:", name);
    for (int i = 0; i < 3; ++i) {
      const PhaseDesc& q = ph[phases[i]];
      double diff2 = 0, norm2 = 0, maxd = 0;
      for (int c = 0; c < q.n; ++c) {
        const double g = __bfloat162float(got[q.out_off + c]), r = __bfloat162float(want[q.out_off + c]);
        diff2 += (g - r) * (g - r);
        norm2 += r * r;
        const double d = std::fabs(g - r);
        maxd = d > maxd || d != d ? d : maxd;
      }
      const double rel = std::sqrt(diff2 / std::max(norm2, 1e-30));
      const bool pass = rel < limit[i];  // false for NaN
      ok = ok && pass;
      std::printf("  phase %d rel %.2e max|diff| %.2e (|ref| %.3g)%s", phases[i], rel, maxd, std::sqrt(norm2),
                  pass ? "" : " FAIL");
    }
    std::printf("%s\n", ok ? "  ok" : "  <-- FAIL");
  };
  auto median = [&](auto&& launch) { return median_ms(st, launch, kWarmup, kRuns); };

  // ---- baseline: chain of kernels with programmatic dependent launch, in a graph
  cudaGraphExec_t chain_exec;
  {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int p = 0; p < kPhases; ++p) {
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3((ph[p].n + 3) / 4);
      cfg.blockDim = dim3(128);
      cfg.stream = st;
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[0].val.programmaticStreamSerializationAllowed = 1;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
      const __nv_bfloat16* wp = w + ph[p].w_off;
      const __nv_bfloat16* xp = act + ph[p].in_off;
      __nv_bfloat16* op = act + ph[p].out_off;
      if (ph[p].k == 1024)
        CK(cudaLaunchKernelEx(&cfg, pdl_phase<1024>, wp, xp, op, ph[p].n));
      else
        CK(cudaLaunchKernelEx(&cfg, pdl_phase<4096>, wp, xp, op, ph[p].n));
    }
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&chain_exec, g, 0));
    CK(cudaGraphDestroy(g));
  }
  auto run_chain = [&](const char* name, bool do_check) {
    if (do_check) {
      CK(cudaMemsetAsync(act + kXPad, 0xff, out_bytes, st));  // NaN: stale outputs cannot pass
      CK(cudaGraphLaunch(chain_exec, st));
      CK(cudaStreamSynchronize(st));
      check(name);
    }
    row(name, median([&] { CK(cudaGraphLaunch(chain_exec, st)); }));
  };
  std::printf("%-60s %11s %11s\n", "variant", "median", "bandwidth");
  run_chain("chain: 96 kernels, PDL, graph (first)", true);

  // ---- persistent variants
  auto run_variant = [&](const Variant& v) {
    char name[160], ring_txt[32] = "";
    if (!v.regs) std::snprintf(ring_txt, sizeof ring_txt, " R=%dKB", v.ring_kb);
    std::snprintf(name, sizeof name, "%s T=%dKB%s %dx%dw %s", v.regs ? "regs" : "ring", v.task / 1024, ring_txt,
                  v.mult * sms, v.warps, v.dep ? (v.block_arrive ? "block-arrive" : "warp-arrive") : "NODEP (timing only)");
    const void* fn = nullptr;
    if (v.regs)
      fn = v.task == 4096 ? reinterpret_cast<const void*>(reg_chain<4096>) : reinterpret_cast<const void*>(reg_chain<8192>);
    else
      fn = v.task == 2048   ? reinterpret_cast<const void*>(ring_chain<2048>)
           : v.task == 4096 ? reinterpret_cast<const void*>(ring_chain<4096>)
                            : reinterpret_cast<const void*>(ring_chain<8192>);
    const int ring_bytes = v.ring_kb * 1024;
    const size_t shared = v.regs ? 0 : kArrBytes + (size_t)v.warps * ring_bytes;
    if (!v.regs && (ring_bytes < 8192 || ring_bytes % 512)) {
      std::printf("%-60s skipped: the ring must hold an 8 KB task\n", name);
      return;
    }
    if (shared > (size_t)smem_optin) {
      std::printf("%-60s skipped: %zu B shared memory\n", name, shared);
      return;
    }
    CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
    if (!v.regs)  // the whole carveout as shared memory, so that two 97 KB blocks fit an SM
      CK(cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
    int resident = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, fn, 32 * v.warps, shared));
    if (resident < v.mult) {
      std::printf("%-60s skipped: %d block(s) an SM resident, %d wanted\n", name, resident, v.mult);
      return;
    }
    CK(cudaMemsetAsync(ctr, 0, kPhases * kCtrStride * sizeof(unsigned), st));
    unsigned gen = 0;
    int dep = v.dep, ba = v.block_arrive, rb = ring_bytes;
    auto launch = [&]() -> cudaError_t {
      ++gen;
      if (v.regs) {
        void* args[] = {&w, &act, &ctr, &err, &gen, &dep, &ba};
        return cudaLaunchCooperativeKernel(fn, v.mult * sms, 32 * v.warps, args, 0, st);
      }
      void* args[] = {&w, &act, &ctr, &err, &gen, &rb, &dep, &ba};
      return cudaLaunchCooperativeKernel(fn, v.mult * sms, 32 * v.warps, args, shared, st);
    };
    auto timed_out = [&]() {
      int flag = 0;
      CK(cudaMemcpyAsync(&flag, err, sizeof(int), cudaMemcpyDeviceToHost, st));
      CK(cudaStreamSynchronize(st));
      if (flag) {
        std::printf("TIMEOUT in variant %s\n", name);
        CK(cudaMemsetAsync(err, 0, sizeof(int), st));
        CK(cudaStreamSynchronize(st));
      }
      return flag != 0;
    };
    // One run alone, synchronised and checked, before timing.
    CK(cudaMemsetAsync(act + kXPad, 0xff, out_bytes, st));
    const cudaError_t e = launch();
    if (e != cudaSuccess) {
      std::printf("%-60s skipped: launch: %s\n", name, cudaGetErrorString(e));
      cudaGetLastError();
      return;
    }
    CK(cudaStreamSynchronize(st));
    CK(cudaGetLastError());
    if (timed_out()) return;
    if (v.dep) check(name);
    const float ms = median([&] { CK(launch()); });
    if (timed_out()) return;
    row(name, ms);
  };

  const int M = 1;  // shorthand
  std::vector<Variant> vs = {
      // ring: task size x grid shape, ~192 KB of ring an SM
      {0, 2048, M, 8, 24, 1, 0},  {0, 4096, M, 8, 24, 1, 0},  {0, 8192, M, 8, 24, 1, 0},
      {0, 2048, M, 16, 12, 1, 0}, {0, 4096, M, 16, 12, 1, 0}, {0, 8192, M, 16, 12, 1, 0},
      {0, 2048, 2, 8, 12, 1, 0},  {0, 4096, 2, 8, 12, 1, 0},  {0, 8192, 2, 8, 12, 1, 0},
      // ring depth
      {0, 4096, M, 8, 8, 1, 0},   {0, 4096, M, 8, 16, 1, 0},  {0, 4096, M, 16, 8, 1, 0},
      // one atomic a block and phase
      {0, 4096, M, 8, 24, 1, 1},  {0, 4096, M, 16, 12, 1, 1}, {0, 4096, 2, 8, 12, 1, 1},
      // streaming ceilings
      {0, 4096, M, 8, 24, 0, 0},  {0, 4096, M, 16, 12, 0, 0}, {0, 4096, 2, 8, 12, 0, 0},
      // registers, one task ahead
      {1, 4096, M, 8, 0, 1, 0},   {1, 8192, M, 8, 0, 1, 0},   {1, 8192, M, 8, 0, 1, 1},
      {1, 8192, M, 8, 0, 0, 0},
  };
  for (const Variant& v : vs) run_variant(v);

  run_chain("chain: 96 kernels, PDL, graph (last)", false);
  CK(cudaDeviceSynchronize());
  std::printf("\nTB/s counts the %.1f MB of weights a run (activations not counted). ring T=task bytes, R=ring a\n"
              "warp; NxWw = blocks x warps a block.\n",
              g_bytes / 1e6);
  return 0;
}
