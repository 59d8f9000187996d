// Micro-benchmark (benchmarks/micro/README.md): can the 410M Llama's 24 decode layers reach 60%
// of the memory roofline as ONE persistent kernel with only TWO grid-wide dependencies a layer?
// Every earlier persistent experiment kept one grid-wide dependency per product (96-151 a token)
// and found each costs about as much as a kernel boundary (dependency_latency.cu: ~1.1 us), which
// alone is most of the H200's 0.178 ms roofline. Here the dependencies that are not all-to-all
// stay inside a thread-block cluster, and the all-to-all ones become split-k reductions:
//
//   phase A, clusters 0-7 (cluster g of 8 blocks = kv head g and its two query heads):
//     RMSNorm(x) -> q|k|v (each block 8 head dims of each, rotary pairs in one block) -> DSMEM
//     to the cluster -> cache write -> attention over the P cached positions + the new one (each
//     block an eighth of them, both query heads, merged through DSMEM) -> the two heads' slice of the
//     o-projection, added into the next residual row with red.global.add (split-k over kv heads;
//     cluster 0 adds the residual itself).
//   phase B, every block: RMSNorm(x) -> gate|up of its intermediate columns -> SiLU * up -> those
//     columns of the down projection for all 1024 outputs -> summed across the cluster (each
//     block pushes its partial sums to the rows' owners with st.async) -> red.global.add into
//     the next residual row. Blocks that have no phase-A work take more columns.
//   Two arrival counters separate the phases (2 grid-wide dependencies a layer, 48 a token).
//   Only as many clusters of 8 as can be co-resident are launched (15 on a 132-SM H100).
//
// The weights never wait for a dependency: a producer warp a block streams the block's whole
// token of weights (repacked per block at load time) and its cached key/value rows into a
// 13-stage shared-memory ring (cp.async.bulk, 16 KB stages), running ahead across the waits as
// far as the ring allows; eight consumer warps compute from the ring. Copies in flight are capped
// (1 is best on the H100): a release (the phase's closing arrival) waits for the SM's copies in
// flight, and a deep queue makes each copy microseconds late. The cluster's exchanges are
// st.async pushes onto the receivers' own barriers, never a cluster barrier with release arrivals.
//
// What an engine step needs and this kernel now does (seventh session): the position P comes
// from device memory (a graph replays the same arguments every token): the cluster splits the
// cached rows [0, P) into 64-row stages among its blocks (online softmax across a block's
// stages), the producer streams that many, and the last block takes the new position; the
// arrival counters, the launch's epoch and the residual rows live in a sync area zeroed once,
// every target counted from the epoch the last block of the previous launch wrote.
// The variants measured before (cluster syncs, relaxed arrivals, pushes in phase B only; sixth
// session, benchmarks/results/decode_layers_*_h100.txt) are in the history at 0c3586a.
//
// Checked against a plain kernel an op (logical, unpacked weights): after 1 and 24 layers by
// direct launches, then one captured CUDA graph replayed at positions 0 to 2047. Timed: median of
// CUDA-event-timed launches and graph replays; also the stream alone and a trace of every block's
// phase times (globaltimer).
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
  uint64_t full[DLP_STAGES], empty[DLP_STAGES], csync, pushed, got_qkv, got_state;
  alignas(16) float xs[kHidden], xn[kHidden], part[kHidden];  // read as float4
  float qf[2][kHeadDim], kf[kHeadDim], vf[kHeadDim];  // written by the whole cluster (pushes)
  float loc[32], sc[2][64], stat[2][3], state[2][2 + kHeadDim], ored[2][2][kHeadDim], attn[2 * kHeadDim];
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
  const int g = c, task0 = st.task0[b], tasks = st.tasks[b], down_stages = tasks / 2;
  const int P = *st.pos;  // cached rows before the token; the token's own row is P
  const KvSplit kv = has_a ? kv_split(P, rank) : KvSplit{0, 0};
  // A layer's stages: phase A's q, q, k, v, the block's cached rows, o, o; then phase B's.
  const int per_layer = (has_a ? kAStages + kv.count : 0) + tasks + down_stages;
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&S.full[s], 1);
      mbar_init(&S.empty[s], kConsumers);
    }
    mbar_init(&S.csync, kCluster);
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
      // The layer's three regions: this block's phase-A stages, its tasks' gate|up and down stages.
      const __nv_bfloat16* layer = st.packed + (size_t)l * kStagesPerLayer * kStageElems;
      const __nv_bfloat16* a_src = layer + (size_t)b * kAStages * kStageElems;
      const __nv_bfloat16* gu_src = layer + (size_t)(kGuRegion + task0) * kStageElems;
      const __nv_bfloat16* down_src = layer + (size_t)(kDownRegion + task0 / 2) * kStageElems;
      const int a_stages = has_a ? kAStages + kv.count : 0;
      for (int k = 0; k < per_layer; ++k, ++i) {
        const int s = i % STAGES;
        // At most max_inflight copies in flight: a release fence (the phase's arrival) waits for
        // the SM's copies still in flight, and a deep queue makes each late.
        if (max_inflight && i >= (unsigned)max_inflight) {
          const unsigned j = i - max_inflight;
          mbar_wait(&S.full[j % STAGES], (j / STAGES) & 1);
        }
        mbar_wait(&S.empty[s], ((i / STAGES) & 1) ^ 1);
        unsigned char* dst = ring + (size_t)s * kStageBytes;
        const int cached = k - 4;  // this block's cached-row stage, when 0 <= cached < kv.count
        if (has_a && cached >= 0 && cached < kv.count) {  // up to 64 key rows, then as many value rows
          const int j = kv.first + cached, bytes = kv_rows(P, j) * kHeadDim * 2;
          const size_t off = (((size_t)l * kKvHeads + g) * kMaxLen + 64 * j) * kHeadDim;
          mbar_expect_bytes(&S.full[s], 2 * bytes);
          bulk_load(dst, st.kc + off, bytes, &S.full[s]);
          bulk_load(dst + kStageBytes / 2, st.vc + off, bytes, &S.full[s]);
          continue;
        }
        const __nv_bfloat16* src = k < a_stages ? a_src + (size_t)(k < 4 ? k : k - kv.count) * kStageElems
                                   : k < a_stages + tasks ? gu_src + (size_t)(k - a_stages) * kStageElems
                                                          : down_src + (size_t)(k - a_stages - tasks) * kStageElems;
        mbar_expect_bytes(&S.full[s], kStageBytes);
        bulk_load(dst, src, kStageBytes, &S.full[s]);
      }
    }
    return;
  }

  unsigned i = 0;
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
  auto mark = [&](int p, int k) {
    if (tid == 0 && st.trace) st.trace[((size_t)b * 2 * st.layers + p) * kMarks + k] = globaltimer();
  };
  // This launch's epoch (written by the last block of the previous launch, which completed before
  // this one started): the counters' targets and the residual rows' ring position count from it.
  const unsigned epoch = __ldcg(st.sync + 2);
  const unsigned base_a = epoch * st.layers * kABlocks, base_b = epoch * st.layers * nblocks;
  const int ring0 = static_cast<int>((epoch % 3) * ((2 * st.layers) % 3) % 3);
  auto row = [&](int p) { return st.rows + ((ring0 + p) % 3) * kHidden; };
  // Residual row of phase p: p == 0 reads the embedding; phase p adds into row(p + 1) (zeroed by
  // block 0 at the start of phase p-1, after every reader of it in phase p-2 had arrived; the
  // previous launch's last phase zeroed this launch's first output row).
  auto begin_phase = [&](int p, const float* gamma) {
    if (p > 0 && st.grid_wait && tid == 0) {
      const unsigned* counter = st.sync + (p % 2 ? 0 : 1);
      const unsigned target = p % 2 ? base_a + (unsigned)(p / 2 + 1) * kABlocks
                                    : base_b + (unsigned)(p / 2) * nblocks;
      while (static_cast<int>(ld_acquire(counter) - target) < 0) {
      }
    }
    mark(p, 0);
    consumers_sync();
    if (b == 0) {  // row(p + 2) was phase p-1's input, read by every block before it arrived
      float* zero = row(p + 2);
      for (int j = tid; j < kHidden; j += kCT) zero[j] = 0.f;
    }
    const float* x = p == 0 ? st.x0 : row(p);
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
      if (p == 2 * st.layers - 1) {  // the launch's last arrival of all advances the epoch
        const unsigned last = base_b + (unsigned)st.layers * nblocks - 1;
        if (atom_add_release(st.sync + 1, 1u) == last) st.sync[2] = epoch + 1;
      } else {
        red_release(st.sync + (p % 2), 1u);
      }
      mark(p, kMarks - 1);
    }
  };

  if (st.compute == 2) {  // the stream alone: every stage waited for and released, nothing else
    for (int l = 0; l < st.layers; ++l)
      for (int k = 0; k < per_layer; ++k) {
        stage();
        release();
      }
    return;
  }
  for (int l = 0; l < st.layers; ++l) {
    int p = 2 * l;
    float* out = row(p + 1);
    if (has_a) {  // ---------------- phase A: kv head g, query heads 2g and 2g+1 ----------------
      begin_phase(p, wt.g1 + (size_t)l * kHidden);
      // The cluster's exchanges in this phase are pushes (st.async) that complete these
      // barriers' byte counts: q|k|v, 32 floats from each block; the attention's partial states,
      // 2 x 64 outputs into S.xn (dead after load_x) and 2 x (max, sum) into S.loc.
      if (tid == 0) {
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
          const float partner = S.loc[t * 8 + (w ^ 4)], cs = st.cos_tab[32 * P + d % 32], sn = st.sin_tab[32 * P + d % 32];
          v = w < 4 ? v * cs - partner * sn : v * cs + partner * sn;
        }
        if (t > 1) v = round_bf16(v);
        float* arr = t < 2 ? S.qf[t] : t == 2 ? S.kf : S.vf;
        for (int q = 0; q < kCluster; ++q) push_b32(arr + d, &S.got_qkv, q, v);
        if (t > 1) {
          __nv_bfloat16* cache = t == 2 ? st.kc : st.vc;
          cache[(((size_t)l * kKvHeads + g) * kMaxLen + P) * kHeadDim + d] = __float2bfloat16(v);
        }
      }
      mbar_wait(&S.got_qkv, l & 1);
      mark(p, 3);
      {  // attention of both query heads over this block's cached rows, a 64-row stage at a time
        // (online softmax: warp h keeps head h's running max and sum), then the new position
        const int head = tid >> 7, part = (tid >> 6) & 1, d = tid & 63;  // this thread's output in the PV product
        float acc = 0.f, m_run = -INFINITY, l_run = 0.f;
        for (int s = 0; s < kv.count; ++s) {
          const int rows = kv_rows(P, kv.first + s);
          const __nv_bfloat16* kvs = stage();
          if (tid < 2 * 64) {  // a thread a (head, row)
            const int hh = tid >> 6, pp = tid & 63;
            float a = -INFINITY;
            if (pp < rows) {
              const float2* q2 = reinterpret_cast<const float2*>(S.qf[hh]);
              const __nv_bfloat162* k2 = reinterpret_cast<const __nv_bfloat162*>(kvs) + pp * 32;
              float a0 = 0.f, a1 = 0.f;
#pragma unroll 8
              for (int c2 = 0; c2 < 32; ++c2) {  // rotated start: the 32 rows of a warp hit 32 banks
                const int col = (c2 + tid) & 31;
                const float2 k = __bfloat1622float2(k2[col]), q = q2[col];
                a0 = fmaf(q.x, k.x, a0);
                a1 = fmaf(q.y, k.y, a1);
              }
              a = (a0 + a1) * 0.125f;
            }
            S.sc[hh][pp] = a;
          }
          consumers_sync();
          if (warp < 2) {  // head `warp`: the new running max, the stage's weights, the old sums' scale
            float* sc = S.sc[warp];
            const float s0 = sc[lane], s1 = sc[lane + 32];
            const float m_new = fmaxf(m_run, warp_max(fmaxf(s0, s1)));  // finite: a stage has a row
            const float e0 = __expf(s0 - m_new), e1 = __expf(s1 - m_new), scale = __expf(m_run - m_new);
            l_run = fmaf(l_run, scale, warp_sum(e0 + e1));
            m_run = m_new;
            __syncwarp();
            sc[lane] = e0;
            sc[lane + 32] = e1;
            if (lane == 0) S.stat[warp][2] = scale;
          }
          consumers_sync();
          {
            const __nv_bfloat16* v = kvs + 64 * kHeadDim;
            const int end = min(32 * part + 32, rows);
            acc *= S.stat[head][2];
            for (int pp = 32 * part; pp < end; ++pp) acc = fmaf(S.sc[head][pp], __bfloat162float(v[pp * kHeadDim + d]), acc);
          }
          release();
          consumers_sync();  // S.sc and S.stat are the next stage's
        }
        S.ored[head][part][d] = acc;
        if (warp < 2 && lane == 0) {
          S.stat[warp][0] = m_run;
          S.stat[warp][1] = l_run;
        }
        consumers_sync();
        if (tid < 2 * kHeadDim) {  // the block's state of head tid / 64; the last block adds the new position
          const int hh = tid >> 6, dd = tid & 63;
          float o = S.ored[hh][0][dd] + S.ored[hh][1][dd], M = S.stat[hh][0], L = S.stat[hh][1];
          if (rank == kCluster - 1) {
            float sn = 0.f;
            for (int e = 0; e < kHeadDim; ++e) sn = fmaf(S.qf[hh][e], S.kf[e], sn);
            sn *= 0.125f;
            const float Mn = fmaxf(M, sn), f = __expf(M - Mn), en = __expf(sn - Mn);
            o = fmaf(o, f, en * S.vf[dd]);
            L = fmaf(L, f, en);
            M = Mn;
          }
          S.state[hh][2 + dd] = o;
          if (dd == 0) {
            S.state[hh][0] = M;
            S.state[hh][1] = L;
          }
        }
        mark(p, 4);
        // Merge the cluster's eight partial states of each head: every block pushes its own to all
        // eight, (max, sum) of both heads to S.loc[4q..] and the 2 x 64 outputs to S.xn[128q..].
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
        if (tid < 2 * kHeadDim) {  // a block with no rows sent (-inf, 0): its weight is 0
          const int hh = tid >> 6, dd = tid & 63;
          float M = -INFINITY;
          for (int q = 0; q < kCluster; ++q) M = fmaxf(M, S.loc[4 * q + 2 * hh]);
          float L = 0.f, O = 0.f;
          for (int q = 0; q < kCluster; ++q) {
            const float f = __expf(S.loc[4 * q + 2 * hh] - M);
            L = fmaf(f, S.loc[4 * q + 2 * hh + 1], L);
            O = fmaf(f, S.xn[128 * q + 64 * hh + dd], O);
          }
          S.attn[tid] = O / L;
        }
        consumers_sync();
        mark(p, 5);
      }
      for (int s = 0; s < 2; ++s) {  // o-projection rows 128*rank+64s.., both heads' 128 columns; 16 threads a row
        const uint4* w = reinterpret_cast<const uint4*>(stage());
        for (int q = 0; q < 4; ++q) {
          const int idx = tid + kCT * q, r = idx >> 4, chunk = idx & 15;
          float v = st.compute ? dot8(w[idx], S.attn + 8 * chunk) : 0.f;
          v += __shfl_xor_sync(0xffffffffu, v, 1);
          v += __shfl_xor_sync(0xffffffffu, v, 2);
          v += __shfl_xor_sync(0xffffffffu, v, 4);
          v += __shfl_xor_sync(0xffffffffu, v, 8);
          if (chunk == 0) {
            const int j = 128 * rank + 64 * s + r;
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
    out = row(p + 1);
    begin_phase(p, wt.g2 + (size_t)l * kHidden);
    float xr[32];
    load_x(xr, S.xn, lane);
    for (int t = 0; t < tasks; t += 2) {  // a pair of tasks (two stages) at once; warp w < 4: gate column 4t+w, else up
      const __nv_bfloat16* const rows[2] = {peek(0) + warp * kHidden, peek(1) + warp * kHidden};
      float v[2] = {0.f, 0.f};
      if (st.compute) rows_dot<2>(rows, xr, lane, v);
      if (lane == 0)
        for (int u = 0; u < 2; ++u) S.h[warp < 4 ? 4 * (t + u) + warp : 4 * kMaxTasks + 4 * (t + u) + warp - 4] = v[u];
      release();
      release();
    }
    consumers_sync();
    mark(p, 2);
    if (tid < 4 * tasks) {
      const float gt = S.h[tid];
      S.h[tid] = gt / (1.f + __expf(-gt)) * S.h[4 * kMaxTasks + tid];
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
    // Each block pushes its partial sums of every 128-row slice to the slice's owner (st.async:
    // the data and the owner's transaction count travel together, no release fence, no cluster
    // barrier); S.xn (dead after load_x) stages them so that a thread pushes 4 consecutive rows,
    // and S.part receives [sender][128].
    if (tid == 0) mbar_expect_bytes(&S.pushed, kCluster * 128 * 4);
#pragma unroll
    for (int q = 0; q < 4; ++q) S.xn[tid + kCT * q] = acc[q];
    mark(p, 3);
    consumers_sync();
    mark(p, 6);  // phase B's mark 6: every warp of the block done (phase A uses 6 before its end)
    {
      const int r = 4 * tid, owner = r / 128;
      const float4 v = *reinterpret_cast<const float4*>(S.xn + r);
      push_v4(S.part + 128 * rank + r % 128, &S.pushed, owner, v);
    }
    mbar_wait(&S.pushed, l & 1);
    mark(p, 4);
    if (tid < 128) {  // rows 128*rank.. summed over the cluster's eight blocks
      const int j = 128 * rank + tid;
      float v = c == 0 ? S.xs[j] : 0.f;
#pragma unroll
      for (int q = 0; q < kCluster; ++q) v += S.part[128 * q + tid];
      atomicAdd(out + j, v);
    }
    mark(p, 5);
    end_phase(p);
  }
  // No block leaves while another may still push into it: the consumers of the whole cluster
  // meet on each block's csync barrier (remote arrivals; the producer warps have left).
  consumers_sync();
  if (tid < kCluster) mbar_arrive_remote(&S.csync, tid);
  mbar_wait_cluster(&S.csync, 0);
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
  CK(cudaDeviceSynchronize());

  // Bytes a token at position P: every weight once, the P cached rows and the new one (k and v).
  const double weight_bytes = (double)kLayers * 2 * (2 * kDq + 2 * kDkv + 3 * kDgu);
  auto bytes_at = [&](int P) { return weight_bytes + (double)kLayers * kKvHeads * (P + 1) * kHeadDim * 2 * 2; };
  // The datasheet bandwidth the issue's roofline uses (H200 4.8 TB/s, H100 SXM 3.35 TB/s).
  const double peak = std::strstr(prop.name, "H200") ? 4.8e12 : 3.35e12;
  std::printf("24 layers: %.1f MB of weights + %.1f MB of cache at position %d; datasheet bandwidth %.2f TB/s\n",
              weight_bytes / 1e6, (bytes_at(kPos) - weight_bytes) / 1e6, kPos, peak / 1e12);

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
  // Phase-B tasks a block: blocks without phase-A work take more. 8 for the phase-A blocks was
  // fastest of 5-10 on an H100 at position 512 (sixth session); argv[1] sets it.
  const int nblocks = clusters * kCluster, nb = nblocks - kABlocks;
  const Layout lay = pack_layout(wt, nblocks, argc > 1 ? std::atoi(argv[1]) : (nb == 0 ? kTasks / kABlocks : 8));
  if (!lay.packed) return 1;
  const int cap = argc > 2 ? std::atoi(argv[2]) : 1;  // the producer's copies in flight
  // The sync area: arrival counters and epoch, and the residual rows; zeroed once, as an engine
  // context would, and again only where a check or timing wants a clean start.
  unsigned* sync = alloc<unsigned>(4);
  float* rows = alloc<float>(3 * kHidden);
  int* d_pos = alloc<int>(1);
  auto reset = [&] {
    CK(cudaMemsetAsync(sync, 0, 16, stream));
    CK(cudaMemsetAsync(rows, 0, 3 * kHidden * 4, stream));
  };
  auto set_pos = [&](int P) { CK(cudaMemcpyAsync(d_pos, &P, 4, cudaMemcpyHostToDevice, stream)); };
  // The result row of the launch that ran at epoch E: phase 2L - 1's output, row(2L).
  auto out_row = [&](unsigned E, int layers) { return rows + (((E % 3) * ((2 * layers) % 3) + 2 * layers) % 3) * kHidden; };
  unsigned long long* trace = alloc<unsigned long long>((size_t)nblocks * 2 * kLayers * kMarks);
  int max_inflight = cap;
  auto launch = [&](int layers, int grid_wait, bool traced = false, int compute = 1) {
    Step st{lay.packed, lay.task0, lay.tasks, m.kc, m.vc, m.cos_tab, m.sin_tab, d_pos,
            m.x0, sync, rows, layers, grid_wait, compute, max_inflight, traced ? trace : nullptr};
    kernel<<<nblocks, kThreads, shared, stream>>>(wt, st);
    CK(cudaGetLastError());
  };
  char what[96];
  std::snprintf(what, sizeof what, "%d copies in flight", cap);
  bool ok = true;
  for (int layers : {1, kLayers}) {  // direct launches from a zeroed sync area
    reset();
    set_pos(kPos);
    launch(layers, 1);
    m.reference(stream, layers, kPos);
    CK(cudaStreamSynchronize(stream));
    ok = m.check(out_row(0, layers), layers, kPos, what) && ok;
  }
  // One captured launch replayed at every position below: the epoch and the position come from
  // device memory, as they would in an engine's CUDA graph.
  reset();
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  launch(kLayers, 1);
  CK(cudaStreamEndCapture(stream, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  std::snprintf(what, sizeof what, "graph replay, %d copies in flight", cap);
  unsigned epoch = 0;
  for (int P : {0, 1, 63, 64, 65, 300, 511, 512, 1000, 2047}) {
    set_pos(P);
    CK(cudaGraphLaunch(exec, stream));
    m.reference(stream, kLayers, P);
    CK(cudaStreamSynchronize(stream));
    ok = m.check(out_row(epoch++, kLayers), kLayers, P, what) && ok;
  }
  unsigned dev_epoch = 0;
  CK(cudaMemcpy(&dev_epoch, sync + 2, 4, cudaMemcpyDeviceToHost));
  if (dev_epoch != epoch) {
    std::printf("epoch after %u launches: %u <-- WRONG\n", epoch, dev_epoch);
    ok = false;
  }
  std::printf("%s\n", ok ? "numerics: ok" : "numerics: WRONG");

  set_pos(kPos);
  for (int compute : {1, 0}) {  // where a layer's time goes
    const size_t marks = (size_t)nblocks * 2 * kLayers * kMarks;
    CK(cudaMemsetAsync(trace, 0, marks * 8, stream));
    launch(kLayers, 1, true, compute);
    CK(cudaStreamSynchronize(stream));
    std::vector<unsigned long long> tr(marks);
    CK(cudaMemcpy(tr.data(), trace, marks * 8, cudaMemcpyDeviceToHost));
    std::printf("(position %d, %d copies in flight)\n", kPos, cap);
    print_trace(tr, nblocks, compute);
  }
  auto report = [&](int round, const char* label, int P, float ms) {
    std::printf("round %d: %s, position %d: median %.4f ms, %.0f GB/s, %.1f%% of peak\n", round, label, P, ms,
                bytes_at(P) / ms / 1e6, 100.0 * bytes_at(P) / ms / 1e-3 / peak);
  };
  for (int round = 0; round < 2; ++round) {
    set_pos(kPos);
    for (int c : {1, 2, 3}) {  // direct launches at each cap
      max_inflight = c;
      reset();
      std::snprintf(what, sizeof what, "persistent, %d copies in flight", c);
      report(round, what, kPos, median_ms(stream, [&] { launch(kLayers, 1); }, 10, 100));
    }
    max_inflight = cap;
    reset();
    report(round, "persistent, NO grid wait (wrong results)", kPos, median_ms(stream, [&] { launch(kLayers, 0); }, 10, 100));
    report(round, "the weight stream ALONE", kPos, median_ms(stream, [&] { launch(kLayers, 0, false, 2); }, 10, 100));
    reset();
    std::snprintf(what, sizeof what, "graph replay, %d copies in flight", cap);
    for (int P : {128, kPos, 1024, 2047}) {
      set_pos(P);
      report(round, what, P, median_ms(stream, [&] { CK(cudaGraphLaunch(exec, stream)); }, 10, 100));
    }
    report(round, "reference (plain kernels, not tuned, for scale)", kPos,
           median_ms(stream, [&] { m.reference(stream, kLayers, kPos); }, 3, 20));
  }
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  return ok ? 0 : 2;
}
