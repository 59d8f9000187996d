// Micro-benchmark (benchmarks/micro/README.md): can the 410M Llama's 24 decode layers reach 60%
// of the memory roofline as ONE persistent kernel with only TWO grid-wide dependencies a layer?
// Every earlier persistent experiment kept one grid-wide dependency per product (96-151 a token)
// and found each costs about as much as a kernel boundary (dependency_latency.cu: ~1.1 us), which
// alone is most of the H200's 0.178 ms roofline. Here the dependencies that are not all-to-all
// stay inside a thread-block cluster, and the all-to-all ones become split-k reductions:
//
//   phase A, clusters 0-7 (cluster g of 8 blocks = kv head g and its two query heads):
//     RMSNorm(x) -> q|k|v (each block 8 head dims of each, rotary pairs in one block) -> DSMEM
//     to the cluster -> cache write -> attention over 512 cached positions + the new one (each
//     block 64 positions, both query heads, merged through DSMEM) -> the two heads' slice of the
//     o-projection, added into the next residual row with red.global.add (split-k over kv heads;
//     cluster 0 adds the residual itself).
//   phase B, every block: RMSNorm(x) -> gate|up of its intermediate columns -> SiLU * up -> those
//     columns of the down projection for all 1024 outputs -> summed across the cluster (each
//     block pushes its partial sums to the rows' owners with st.async, or, sync kind 0, every
//     block reads the others' after a cluster sync) -> red.global.add into the next residual row. Blocks that have no phase-A work take
//     more columns, so every block streams about the same bytes a layer.
//   Two arrival counters separate the phases (2 grid-wide dependencies a layer, 48 a token);
//   cluster syncs are mbarriers arrived at remotely, so the producer warps never join them.
//   Only as many clusters of 8 as can be co-resident are launched (15 on a 132-SM H100).
//
// The weights never wait for a dependency: a producer warp a block streams the block's whole
// token of weights (repacked per block at load time) and its cached key/value rows into a
// 13-stage shared-memory ring (cp.async.bulk, 16 KB stages), running ahead across the waits as
// far as the ring allows; eight consumer warps compute from the ring. Copies in flight are capped
// (2 is best): a release (a remote arrival, the phase's closing arrival) waits for the SM's
// copies in flight, and a deep queue makes each copy microseconds late.
//
// Checked against a plain kernel an op (logical, unpacked weights) after 1 and 24 layers: the
// residual row and the cache rows written. Timed: median of CUDA-event-timed launches; also a
// variant without the grid-wide waits (wrong results; how fast the stream alone goes), and a
// trace of every block's phase times (globaltimer).
// Shapes, device helpers, repacking and the trace summary: decode_layers_support.cuh; weights,
// reference, check and timing: decode_layers_model.cuh.
//   nvcc -O3 -arch=sm_90 -std=c++17 -o /tmp/dlp benchmarks/micro/decode_layers_persistent.cu && /tmp/dlp [tasks [cap]]
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "micro_util.cuh"

namespace cg = cooperative_groups;

#include "decode_layers_model.cuh"

// The ring's depth; -DDLP_STAGES=13 is the most that fits beside Smem in 227 KB.
#ifndef DLP_STAGES
#define DLP_STAGES 13
#endif
struct Smem {
  uint64_t full[DLP_STAGES], empty[DLP_STAGES], csync[2], pushed, got_qkv, got_state;
  alignas(16) float xs[kHidden], xn[kHidden], part[kHidden];  // read as float4
  float qf[2][kHeadDim], kf[kHeadDim], vf[kHeadDim];  // written by the whole cluster (DSMEM)
  float loc[32], sc[2][72], stat[2][2], state[2][2 + kHeadDim], ored[2][2][kHeadDim], attn[2 * kHeadDim];
  float h[2 * 4 * kMaxTasks], red[kConsumers];
};

__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

template <int STAGES>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kThreads, 1) decode_layers(Weights wt, Step st) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* ring = smem_raw;
  Smem& S = *reinterpret_cast<Smem*>(smem_raw + STAGES * kStageBytes);
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank()), c = blockIdx.x / kCluster, b = blockIdx.x;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, nblocks = gridDim.x;
  const bool has_a = b < kABlocks;  // cluster c < 8: kv head g = c
  const int g = c, tasks = st.tasks[b], down_stages = (tasks + 1) / 2;
  const int packed_per_layer = (has_a ? kAStages : 0) + tasks + down_stages;
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&S.full[s], 1);
      mbar_init(&S.empty[s], kConsumers);
    }
    mbar_init(&S.csync[0], kCluster);
    mbar_init(&S.csync[1], kCluster);
    mbar_init(&S.pushed, 1);
    mbar_init(&S.got_qkv, 1);
    mbar_init(&S.got_state, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cluster.sync();  // every block's barriers exist before any remote arrival

  if (warp == kConsumers) {  // producer: the block's stages, layer after layer, as fast as slots free
    if (lane != 0) return;
    const int max_inflight = st.max_inflight;
    unsigned i = 0;
    for (int l = 0; l < st.layers; ++l) {
      const __nv_bfloat16* src = st.packed + ((size_t)l * st.stages_per_layer + st.pre[b]) * kStageElems;
      for (int k = 0; k < packed_per_layer + (has_a ? 1 : 0); ++k, ++i) {
        const int s = i % STAGES;
        // At most max_inflight copies in flight: a release fence (a remote arrival, the phase's
        // arrival) waits for the SM's copies still in flight, and a deep queue makes each late.
        if (max_inflight && i >= (unsigned)max_inflight) {
          const unsigned j = i - max_inflight;
          mbar_wait(&S.full[j % STAGES], (j / STAGES) & 1);
        }
        mbar_wait(&S.empty[s], ((i / STAGES) & 1) ^ 1);
        unsigned char* dst = ring + (size_t)s * kStageBytes;
        mbar_expect_bytes(&S.full[s], kStageBytes);
        if (has_a && k == 4) {  // this block's 64 cached key rows, then value rows, of kv head g
          const size_t off = (((size_t)l * kKvHeads + g) * kMaxLen + 64 * rank) * kHeadDim;
          bulk_load(dst, st.kc + off, kStageBytes / 2, &S.full[s]);
          bulk_load(dst + kStageBytes / 2, st.vc + off, kStageBytes / 2, &S.full[s]);
          continue;
        }
        const int packed = has_a && k > 4 ? k - 1 : k;
        bulk_load(dst, src + (size_t)packed * kStageElems, kStageBytes, &S.full[s]);
      }
    }
    return;
  }

  unsigned i = 0, csyncs = 0;
  auto stage = [&](void) -> const __nv_bfloat16* {
    mbar_wait(&S.full[i % STAGES], (i / STAGES) & 1);
    return reinterpret_cast<const __nv_bfloat16*>(ring + (size_t)(i % STAGES) * kStageBytes);
  };
  auto peek = [&](int k) -> const __nv_bfloat16* {  // the k-th stage from here, waited for, not taken
    const unsigned j = i + k;
    mbar_wait(&S.full[j % STAGES], (j / STAGES) & 1);
    return reinterpret_cast<const __nv_bfloat16*>(ring + (size_t)(j % STAGES) * kStageBytes);
  };
  auto release = [&]() {
    __syncwarp();
    if (lane == 0) mbar_arrive(&S.empty[i % STAGES]);
    ++i;
  };
  auto cluster_arrive_wait = [&]() {  // after a consumers_sync: every block of the cluster there too
    const unsigned k = csyncs++;
    if (tid < kCluster) {
      if (st.sync_kind == 1)
        mbar_arrive_remote_relaxed(&S.csync[k & 1], tid);  // timing only: nothing orders the writes
      else
        mbar_arrive_remote(&S.csync[k & 1], tid);
    }
    mbar_wait_cluster(&S.csync[k & 1], (k >> 1) & 1);
  };
  auto cluster_sync = [&]() {  // consumers of the whole cluster; the producer warps do not join
    consumers_sync();
    cluster_arrive_wait();
  };
  auto mark = [&](int p, int k) {
    if (tid == 0 && st.trace) st.trace[((size_t)b * 2 * st.layers + p) * kMarks + k] = globaltimer();
  };
  // Residual row of phase p: p == 0 reads the embedding; phase p adds into rows[(p+1)%3] (zeroed
  // by block 0 at the start of phase p-1, after every reader of it in phase p-2 had arrived).
  auto begin_phase = [&](int p, const float* gamma) {
    if (p > 0 && st.grid_wait && tid == 0) {
      const unsigned* counter = st.counters + (p % 2 ? 0 : 1);
      const unsigned target = p % 2 ? st.base_a + (unsigned)(p / 2 + 1) * kABlocks
                                    : st.base_b + (unsigned)(p / 2) * nblocks;
      while (ld_acquire(counter) < target) {
      }
    }
    mark(p, 0);
    consumers_sync();
    if (b == 0) {  // rows[(p+2)%3] was phase p-1's input, read by every block before it arrived
      float* zero = st.rows + ((p + 2) % 3) * kHidden;
      for (int j = tid; j < kHidden; j += kCT) zero[j] = 0.f;
    }
    const float* x = p == 0 ? st.x0 : st.rows + (p % 3) * kHidden;
    float ss = 0.f;
    for (int j = tid; j < kHidden; j += kCT) {
      const float v = __ldcg(x + j);
      S.xs[j] = v;
      ss += v * v;
    }
    ss = warp_sum(ss);
    if (lane == 0) S.red[warp] = ss;
    consumers_sync();
    float tot = 0.f;
#pragma unroll
    for (int w = 0; w < kConsumers; ++w) tot += S.red[w];
    const float rstd = rsqrtf(tot / kHidden + 1e-5f);
    for (int j = tid; j < kHidden; j += kCT) S.xn[j] = S.xs[j] * rstd * __ldg(gamma + j);
    consumers_sync();
    mark(p, 1);
  };
  auto end_phase = [&](int p) {
    consumers_sync();
    if (tid == 0) {
      red_release(st.counters + (p % 2), 1u);
      mark(p, kMarks - 1);
    }
  };

  if (st.compute == 2) {  // the stream alone: every stage waited for and released, nothing else
    const int per_layer = packed_per_layer + (has_a ? 1 : 0);
    for (int l = 0; l < st.layers; ++l)
      for (int k = 0; k < per_layer; ++k) {
        stage();
        release();
      }
    return;
  }
  for (int l = 0; l < st.layers; ++l) {
    int p = 2 * l;
    float* out = st.rows + ((p + 1) % 3) * kHidden;
    if (has_a) {  // ---------------- phase A: kv head g, query heads 2g and 2g+1 ----------------
      begin_phase(p, wt.g1 + (size_t)l * kHidden);
      // Sync kind 3: the cluster's exchanges in this phase are pushes (st.async) that complete
      // these barriers' byte counts: q|k|v, 32 floats from each block; the attention's partial
      // states, 2 x 64 outputs into S.xn (dead after load_x) and 2 x (max, sum) into S.loc.
      const bool push_a = st.sync_kind == 3;
      if (push_a && tid == 0) {
        mbar_expect_bytes(&S.got_qkv, kCluster * 32 * 4);
        mbar_expect_bytes(&S.got_state, kCluster * (2 * kHeadDim + 4) * 4);
      }
      float xr[32];
      load_x(xr, S.xn, lane);
      {  // q (head 2g), q (2g+1), k, v, the four stages at once: warp w computes head dim head_dim_of(rank, w)
        const __nv_bfloat16* const rows[4] = {peek(0) + warp * kHidden, peek(1) + warp * kHidden,
                                              peek(2) + warp * kHidden, peek(3) + warp * kHidden};
        float v[4] = {0.f, 0.f, 0.f, 0.f};
        if (st.compute) rows_dot<4>(rows, xr, lane, v);
        if (lane == 0)
          for (int t = 0; t < 4; ++t) S.loc[t * 8 + warp] = v[t];
        for (int t = 0; t < 4; ++t) release();
      }
      consumers_sync();
      mark(p, 2);
      if (tid < 32) {  // rotary on q and k (partner column w ^ 4 in this block), k/v to bf16, to the cluster
        const int t = tid / 8, w = tid % 8, d = head_dim_of(rank, w);
        float v = S.loc[tid];
        if (t < 3) {
          const float partner = S.loc[t * 8 + (w ^ 4)], cs = st.cosv[d % 32], sn = st.sinv[d % 32];
          v = w < 4 ? v * cs - partner * sn : v * cs + partner * sn;
        }
        if (t > 1) v = round_bf16(v);
        float* arr = t < 2 ? S.qf[t] : t == 2 ? S.kf : S.vf;
        for (int q = 0; q < kCluster; ++q) {
          if (push_a)
            push_b32(arr + d, &S.got_qkv, q, v);
          else
            cluster.map_shared_rank(arr, q)[d] = v;
        }
        if (t > 1) {
          __nv_bfloat16* cache = t == 2 ? st.kc : st.vc;
          cache[(((size_t)l * kKvHeads + g) * kMaxLen + kPos) * kHeadDim + d] = __float2bfloat16(v);
        }
      }
      if (push_a)
        mbar_wait(&S.got_qkv, l & 1);
      else
        cluster_sync();
      mark(p, 3);
      const int n = rank == kCluster - 1 ? 65 : 64;  // the last block also takes the new position
      {  // attention of both query heads over this block's 64 cached positions
        const __nv_bfloat16* kv = stage();
        if (tid < 2 * 64 + 2) {  // a thread a (head, position); the last two take the new position
          const int head = tid < 128 ? tid >> 6 : tid - 128, pp = tid < 128 ? tid & 63 : 64;
          if (pp < n) {
            const float2* q2 = reinterpret_cast<const float2*>(S.qf[head]);
            float a0 = 0.f, a1 = 0.f;
            if (pp < 64) {
              const __nv_bfloat162* k2 = reinterpret_cast<const __nv_bfloat162*>(kv) + pp * 32;
#pragma unroll 8
              for (int c2 = 0; c2 < 32; ++c2) {  // rotated start: the 32 rows of a warp hit 32 banks
                const int col = (c2 + tid) & 31;
                const float2 k = __bfloat1622float2(k2[col]), q = q2[col];
                a0 = fmaf(q.x, k.x, a0);
                a1 = fmaf(q.y, k.y, a1);
              }
            } else {
              const float2* k2 = reinterpret_cast<const float2*>(S.kf);
              for (int c2 = 0; c2 < 32; ++c2) {
                const float2 k = k2[c2], q = q2[c2];
                a0 = fmaf(q.x, k.x, a0);
                a1 = fmaf(q.y, k.y, a1);
              }
            }
            S.sc[head][pp] = (a0 + a1) * 0.125f;
          }
        }
        consumers_sync();
        if (warp < 2) {  // softmax statistics of head `warp`
          float* sc = S.sc[warp];
          float m = fmaxf(sc[lane], sc[lane + 32]);
          if (n == 65) m = fmaxf(m, sc[64]);
          m = warp_max(m);
          const float e0 = __expf(sc[lane] - m), e1 = __expf(sc[lane + 32] - m);
          float e2 = 0.f;
          __syncwarp();
          sc[lane] = e0;
          sc[lane + 32] = e1;
          if (n == 65 && lane == 0) {
            e2 = __expf(sc[64] - m);
            sc[64] = e2;
          }
          const float sum = warp_sum(e0 + e1 + e2);
          if (lane == 0) {
            S.stat[warp][0] = m;
            S.stat[warp][1] = sum;
          }
        }
        consumers_sync();
        {
          const int head = tid >> 7, part = (tid >> 6) & 1, d = tid & 63;
          const __nv_bfloat16* v = kv + 64 * kHeadDim;
          float acc = 0.f;
          for (int pp = 32 * part; pp < 32 * part + 32; ++pp)
            acc = fmaf(S.sc[head][pp], __bfloat162float(v[pp * kHeadDim + d]), acc);
          S.ored[head][part][d] = acc;
        }
        release();
        consumers_sync();
        if (tid < 2 * kHeadDim) {
          const int head = tid >> 6, d = tid & 63;
          float o = S.ored[head][0][d] + S.ored[head][1][d];
          if (n == 65) o = fmaf(S.sc[head][64], S.vf[d], o);
          S.state[head][2 + d] = o;
          if (d == 0) {
            S.state[head][0] = S.stat[head][0];
            S.state[head][1] = S.stat[head][1];
          }
        }
        mark(p, 4);
        // Merge the cluster's eight partial states of each head: block q's (max, sum) at
        // stat_of(q)[0..1] and its 64 outputs at out_of(q). Pushed, every block sends its own to
        // all eight (S.loc[4q..], S.xn[128q..]); otherwise, after a cluster sync, each block reads
        // the others' S.state in place.
        auto merge = [&](auto&& stat_of, auto&& out_of) {
          if (tid >= 2 * kHeadDim) return;
          const int d = tid & 63;
          float M = -INFINITY;
          for (int q = 0; q < kCluster; ++q) M = fmaxf(M, stat_of(q)[0]);
          float L = 0.f, O = 0.f;
          for (int q = 0; q < kCluster; ++q) {
            const float f = __expf(stat_of(q)[0] - M);
            L = fmaf(f, stat_of(q)[1], L);
            O = fmaf(f, out_of(q)[d], O);
          }
          S.attn[tid] = O / L;
        };
        const int head = (tid >> 6) & 1;  // threads past 2 x 64 merge nothing
        if (push_a) {
          consumers_sync();
          {  // thread t: outputs 4(t%32).. of both heads to block t/32
            const int to = tid >> 5, hh = (tid >> 4) & 1, dd = 4 * (tid & 15);
            const float* o = &S.state[hh][2 + dd];
            push_v4(S.xn + 128 * rank + 64 * hh + dd, &S.got_state, to, make_float4(o[0], o[1], o[2], o[3]));
          }
          if (tid < kCluster)
            push_v4(S.loc + 4 * rank, &S.got_state, tid,
                    make_float4(S.state[0][0], S.state[0][1], S.state[1][0], S.state[1][1]));
          mbar_wait(&S.got_state, l & 1);
          merge([&](int q) -> const float* { return S.loc + 4 * q + 2 * head; },
                [&](int q) -> const float* { return S.xn + 128 * q + 64 * head; });
        } else {
          cluster_sync();
          merge([&](int q) -> const float* { return cluster.map_shared_rank(&S.state[head][0], q); },
                [&](int q) -> const float* { return cluster.map_shared_rank(&S.state[head][0], q) + 2; });
        }
        consumers_sync();
        mark(p, 5);
      }
      for (int s = 0; s < 2; ++s) {  // o-projection rows 128*rank+64s.., both heads' 128 columns; 16 threads a row
        const uint4* w = reinterpret_cast<const uint4*>(stage());
        for (int q = 0; q < 4; ++q) {
          const int idx = tid + kCT * q, row = idx >> 4, chunk = idx & 15;
          float v = st.compute ? dot8(w[idx], S.attn + 8 * chunk) : 0.f;
          v += __shfl_xor_sync(0xffffffffu, v, 1);
          v += __shfl_xor_sync(0xffffffffu, v, 2);
          v += __shfl_xor_sync(0xffffffffu, v, 4);
          v += __shfl_xor_sync(0xffffffffu, v, 8);
          if (chunk == 0) {
            const int j = 128 * rank + 64 * s + row;
            atomicAdd(out + j, g == 0 ? v + S.xs[j] : v);
          }
        }
        release();
      }
      mark(p, 6);
      end_phase(p);
    }

    // ---------------- phase B: this block's intermediate columns, every block ----------------
    p = 2 * l + 1;
    out = st.rows + ((p + 1) % 3) * kHidden;
    begin_phase(p, wt.g2 + (size_t)l * kHidden);
    float xr[32];
    load_x(xr, S.xn, lane);
    for (int t = 0; t < tasks; t += 2) {  // two stages at once; warp w < 4: gate column 4t+w, else up column 4t+w-4
      auto put = [&](int task, float v) {
        if (lane == 0) S.h[warp < 4 ? 4 * task + warp : 4 * kMaxTasks + 4 * task + warp - 4] = v;
      };
      if (t + 1 < tasks) {
        const __nv_bfloat16* const rows[2] = {peek(0) + warp * kHidden, peek(1) + warp * kHidden};
        float v[2] = {0.f, 0.f};
        if (st.compute) rows_dot<2>(rows, xr, lane, v);
        put(t, v[0]);
        put(t + 1, v[1]);
        release();
        release();
      } else {
        const __nv_bfloat16* const rows[1] = {peek(0) + warp * kHidden};
        float v[1] = {0.f};
        if (st.compute) rows_dot<1>(rows, xr, lane, v);
        put(t, v[0]);
        release();
      }
    }
    consumers_sync();
    mark(p, 2);
    if (tid < 4 * kMaxTasks) {  // columns past the block's own are the down stages' zero padding
      const float gt = S.h[tid];
      S.h[tid] = tid < 4 * tasks ? gt / (1.f + __expf(-gt)) * S.h[4 * kMaxTasks + tid] : 0.f;
    }
    consumers_sync();
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int s = 0; s < down_stages; ++s) {  // all 1024 down rows x 8 of this block's columns
      const uint4* w = reinterpret_cast<const uint4*>(stage());
      if (st.compute)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[q] += dot8(w[tid + kCT * q], S.h + 8 * s);
      release();
    }
    // Block q's partial sums of this block's 128 rows. Pushed: each block sends them to the rows'
    // owner (st.async: the data and the owner's transaction count travel together, no release
    // fence, no cluster barrier), S.xn (dead after load_x) staging them so that a thread pushes 4
    // consecutive rows, S.part receiving [sender][128]; otherwise each block keeps all 1024 in
    // S.part and reads the others' after a cluster sync.
    // The cluster's eight partial sums of this block's 128 rows, block q's at part_of(q)[0..127].
    auto reduce = [&](auto&& part_of) {
      if (tid >= 128) return;  // rows 128*rank.. summed over the cluster's eight blocks
      const int j = 128 * rank + tid;
      float v = c == 0 ? S.xs[j] : 0.f;
#pragma unroll
      for (int q = 0; q < kCluster; ++q) v += part_of(q)[tid];
      atomicAdd(out + j, v);
    };
    if (st.sync_kind >= 2) {
      // Pushed: each block sends its partial sums to the rows' owner (st.async: the data and the
      // owner's transaction count travel together, no release fence, no cluster barrier); S.xn
      // (dead after load_x) stages them so that a thread pushes 4 consecutive rows, and S.part
      // receives [sender][128].
      if (tid == 0) mbar_expect_bytes(&S.pushed, kCluster * 128 * 4);
#pragma unroll
      for (int q = 0; q < 4; ++q) S.xn[tid + kCT * q] = acc[q];
      mark(p, 3);
      consumers_sync();
      mark(p, 6);  // phase B's mark 6: every warp of the block done (phase A uses 6 before its end)
      {
        const int row = 4 * tid, owner = row / 128;
        const float4 v = *reinterpret_cast<const float4*>(S.xn + row);
        push_v4(S.part + 128 * rank + row % 128, &S.pushed, owner, v);
      }
      mbar_wait(&S.pushed, l & 1);
      mark(p, 4);
      reduce([&](int q) -> const float* { return S.part + 128 * q; });
    } else {  // each block keeps all 1024 in S.part; the others read them after a cluster sync
#pragma unroll
      for (int q = 0; q < 4; ++q) S.part[tid + kCT * q] = acc[q];
      mark(p, 3);
      consumers_sync();
      mark(p, 6);
      cluster_arrive_wait();
      mark(p, 4);
      reduce([&](int q) -> const float* { return cluster.map_shared_rank(S.part, q) + 128 * rank; });
    }
    mark(p, 5);
    end_phase(p);
  }
  cluster_sync();  // no block leaves while another may still read its shared memory
}

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs\n", prop.name, sms);
  Model m;  // random weights, cache, the token's embedding row, the reference's buffers
  const Weights wt = m.weights();
  __nv_bfloat16 *const kc = m.kc, *const vc = m.vc;
  const float *const cosv = m.cosv, *const sinv = m.sinv, *const x0 = m.x0;
  float* rows = alloc<float>(3 * kHidden);
  CK(cudaMemset(rows, 0, 3 * kHidden * 4));
  CK(cudaDeviceSynchronize());

  // Bytes a token: every weight once, the cached rows read (513 positions, k and v) once.
  const double weight_bytes = (double)kLayers * 2 * (2 * kDq + 2 * kDkv + 3 * kDgu);
  const double cache_bytes = (double)kLayers * kKvHeads * (kPos + 1) * kHeadDim * 2 * 2;
  // The datasheet bandwidth the issue's roofline uses (H200 4.8 TB/s, H100 SXM 3.35 TB/s).
  const double peak = std::strstr(prop.name, "H200") ? 4.8e12 : 3.35e12;
  std::printf("24 layers: %.1f MB of weights + %.1f MB of cache; datasheet bandwidth %.2f TB/s\n",
              weight_bytes / 1e6, cache_bytes / 1e6, peak / 1e12);

  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  constexpr int kStages = DLP_STAGES;
  const size_t shared = kStages * kStageBytes + sizeof(Smem);
  auto kernel = decode_layers<kStages>;
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
  int clusters = 0;
  {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(16 * kCluster);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = shared;
    CK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg));
  }
  clusters = std::min(clusters, 16);
  std::printf("%zu bytes of shared memory a block; %d clusters of %d co-resident\n", shared, clusters, kCluster);
  if (clusters < kKvHeads) {
    std::printf("fewer than %d co-resident clusters: phase A cannot be laid out\n", kKvHeads);
    return 1;
  }
  // Phase-B tasks a block: blocks without phase-A work take more. Streaming the same bytes a
  // block (112 KB of phase-A stages are about 4.7 tasks' worth) gives the phase-A blocks 6; with
  // phase A's exchanges pushed its chain is short enough that 8 is fastest (5-10 measured on an
  // H100, sixth session). argv[1] sets the phase-A blocks' count.
  const int nblocks = clusters * kCluster, nb = nblocks - kABlocks;
  const Layout lay = pack_layout(wt, nblocks, argc > 1 ? std::atoi(argv[1]) : (nb == 0 ? kTasks / kABlocks : 8));
  if (!lay.packed) return 1;
  const int spl = lay.stages_per_layer;
  int *const d_task0 = lay.task0, *const d_tasks = lay.tasks, *const d_pre = lay.pre;
  __nv_bfloat16* const packed = lay.packed;
  unsigned* counters = alloc<unsigned>(2);
  CK(cudaMemset(counters, 0, 8));
  unsigned long long* trace = alloc<unsigned long long>((size_t)nblocks * 2 * kLayers * kMarks);
  unsigned base_a = 0, base_b = 0;
  int sync_kind = 0, max_inflight = 0;  // the variants below set them
  auto launch = [&](int layers, int grid_wait, bool traced = false, int compute = 1) {
    Step st{packed, d_task0, d_tasks, d_pre, spl, kc, vc, cosv, sinv, x0, rows, counters, base_a, base_b,
            layers, grid_wait, compute, sync_kind, max_inflight, traced ? trace : nullptr};
    kernel<<<nblocks, kThreads, shared, stream>>>(wt, st);
    CK(cudaGetLastError());
    if (compute != 2) {  // the stream-alone variant arrives nowhere
      base_a += layers * kABlocks;
      base_b += layers * nblocks;
    }
  };
  bool ok = true;
  // Sync kind x 100 + layers: 2xx phase B's partials pushed, 3xx phase A's exchanges too.
  for (int variant : {1, kLayers, 200 + 1, 200 + kLayers, 300 + 1, 300 + kLayers}) {
    sync_kind = variant / 100;
    max_inflight = sync_kind ? 2 : 0;
    const int layers = variant % 100;
    CK(cudaMemsetAsync(rows, 0, 3 * kHidden * 4, stream));  // a launch of 2L phases leaves rows[(2L+1)%3] zero
    launch(layers, 1);
    m.reference(stream, layers);
    CK(cudaStreamSynchronize(stream));
    char what[64];
    std::snprintf(what, sizeof what, "%s", sync_kind == 3 ? "phases A and B pushed, 2 copies in flight"
                                           : sync_kind     ? "phase B pushed, 2 copies in flight"
                                                           : "cluster syncs");
    ok = m.check(rows + ((2 * layers) % 3) * kHidden, layers, what) && ok;
  }
  auto time_it = [&](auto&& body, int iters) { return median_ms(stream, body, 10, iters); };
  const double bytes = weight_bytes + cache_bytes;
  for (int variant : {1, 0, 3, 4}) {  // where a layer's time goes; 3: phase B pushed; 4: phases A and B pushed
    const int compute = variant == 0 ? 0 : 1;
    sync_kind = variant == 3 ? 2 : variant == 4 ? 3 : 0;
    max_inflight = variant >= 3 ? (argc > 2 ? std::atoi(argv[2]) : 1) : 0;
    if (variant >= 3)
      std::printf("(%s pushed, %d copies in flight)\n", variant == 3 ? "phase B's partials" : "phases A and B's exchanges",
                  max_inflight);
    CK(cudaMemsetAsync(rows, 0, 3 * kHidden * 4, stream));
    const size_t marks = (size_t)nblocks * 2 * kLayers * kMarks;
    CK(cudaMemsetAsync(trace, 0, marks * 8, stream));
    launch(kLayers, 1, true, compute);
    CK(cudaStreamSynchronize(stream));
    std::vector<unsigned long long> tr(marks);
    CK(cudaMemcpy(tr.data(), trace, marks * 8, cudaMemcpyDeviceToHost));
    print_trace(tr, nblocks, compute);
  }
  for (int round = 0; round < 2; ++round) {
    for (int compute : {1, 0, 2})
      for (int wait : {1, 0}) {
        if (compute == 2 && wait) continue;
        CK(cudaMemsetAsync(rows, 0, 3 * kHidden * 4, stream));
        sync_kind = 0;
        max_inflight = 0;  // as first built: cluster syncs, the ring's 13 copies in flight
        const float ms = time_it([&] { launch(kLayers, wait, false, compute); }, 100);
        std::printf("round %d: persistent, %d clusters of %d, 2 grid dependencies a layer%s%s: median %.4f ms, %.0f GB/s, "
                    "%.1f%% of peak\n",
                    round, clusters, kCluster, wait ? "" : ", NO grid wait", compute == 1 ? "" : compute == 0 ? ", products NOT computed" : ", the weight stream ALONE",
                    ms, bytes / ms / 1e6, 100.0 * bytes / ms / 1e-3 / peak);
      }
    // (sync kind, copies in flight, compute): the stream alone at a cap, then the full kernel.
    const int3 variants[] = {{0, 2, 2}, {0, 2, 1}, {2, 2, 1}, {3, 2, 1}, {3, 1, 1}, {3, 3, 1}, {1, 2, 1}};
    for (const int3 v : variants) {
      sync_kind = v.x;
      max_inflight = v.y;
      CK(cudaMemsetAsync(rows, 0, 3 * kHidden * 4, stream));
      const float ms = time_it([&] { launch(kLayers, v.z == 2 ? 0 : 1, false, v.z); }, 100);
      std::printf("round %d: persistent, %s, %d copies in flight: median %.4f ms, %.0f GB/s, %.1f%% of peak\n", round,
                  v.z == 2      ? "the weight stream ALONE"
                  : v.x == 3    ? "phases A and B pushed"
                  : v.x == 2    ? "phase B's partials pushed"
                  : v.x == 1    ? "relaxed arrivals (timing only)"
                                : "cluster syncs",
                  v.y, ms, bytes / ms / 1e6, 100.0 * bytes / ms / 1e-3 / peak);
    }
    max_inflight = 0;
    sync_kind = 0;
    const float ref_ms = time_it([&] { m.reference(stream, kLayers); }, 20);
    std::printf("round %d: reference (plain kernels, not tuned, for scale): %.4f ms\n", round, ref_ms);
  }
  std::printf("%s\n", ok ? "numerics: ok" : "numerics: WRONG");
  return ok ? 0 : 2;
}
