// The persistent decode-layers kernel's source (decode_layers_kernel.h). Written once, with the
// shape's sizes as constants; first measured as benchmarks/micro/decode_layers_persistent.cu,
// which now compiles this source.
#include "ops/decode_layers_kernel.h"

#include <cmath>
#include <cstdio>
#include <sstream>

namespace kiln::ops {
namespace {

constexpr int64_t kStageBytes = kDecodeLayersStageBytes;
constexpr int64_t kCluster = kDecodeLayersCluster;
constexpr int64_t kMaxTasks = 16;  // a block's MLP tasks a layer (its S.h staging)

// Bytes of the block's state beside the ring: the source's struct Smem (16.5 KB with 13 stages),
// which a static_assert in the source holds to this.
constexpr int64_t kStateBytes = 17 * 1024;

std::string float_literal(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  std::string s = buf;
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s + "f";
}

// The kernel body; @TOKENS@ are replaced by generate().
constexpr const char* kBody = R"KILN(
namespace kiln_dl_@NAME@ {
constexpr int kHidden = 1024, kInter = @INTER@, kLayers = @LAYERS@, kKvHeads = @KV_HEADS@, kHeadDim = 64;
constexpr int kMaxLen = @MAX_LEN@;
constexpr float kEps = @EPS@, kScale = 0.125f;  // 1 / sqrt(head_dim)
constexpr int kCluster = 8, kABlocks = kKvHeads * kCluster;  // phase A: a cluster a kv head
constexpr int kConsumers = 8, kThreads = 32 * (kConsumers + 1), kCT = 32 * kConsumers;
static_assert(kHidden % kCT == 0, "a consumer thread normalizes kHidden / kCT elements");
constexpr int kStageBytes = 16384, kStageElems = kStageBytes / 2;
constexpr int kTasks = kInter / 4, kMaxTasks = 16, kATasks = @A_TASKS@;
constexpr int kAStages = 6;  // a phase-A block's packed stages: q (2 heads), k, v, o (2 halves)
constexpr int kGuRegion = kABlocks * kAStages, kDownRegion = kGuRegion + kTasks;
constexpr int kStagesPerLayer = kDownRegion + kTasks / 2;
constexpr int kStages = @STAGES@, kMaxInflight = @MAX_INFLIGHT@, kReleaseInflight = @RELEASE_INFLIGHT@;
constexpr int kHeadInflight = @HEAD_INFLIGHT@;  // the lm_head's stages once the layers have arrived (0: the ring)
constexpr int kCompute = @COMPUTE@, kMarks = 8;
// kCounted > 0: a phase's output row is counted (see the sync area below), so a phase needs no
// arrival: its readers poll the row itself (1: every thread its own elements; 2: one thread an
// element first, then every thread its own).
constexpr int kCounted = @COUNTED@;
// A counted row element is a u64: the sum of its contributions in fixed point (units of 2^-28,
// two's complement) plus 2^57 a contribution, so it holds every contribution exactly when
// (element - N * 2^57) lies in [-2^56, 2^56) for the N it expects (N < 64): one fewer leaves it at
// least 2^56 below. A contribution of magnitude 2^23 or more (or NaN) is not added; it sets the
// overflow flag instead, which makes the output NaN.
constexpr int kCountShift = 57;
constexpr float kFixScale = 268435456.f, kFixUnit = 1.f / 268435456.f, kFixLimit = 8388608.f;
// A block's cached rows come in stages of 64 rows (keys and values share a ring slot) or 128 (the
// keys fill one slot and the values the next): kKvRows, or with 0 by position, 128 past 8 x 64
// (where a block's share of the rows would be two 64-row stages).
constexpr int kKvRows = @KV_ROWS@;
static_assert(kKvRows == 0 || kKvRows == 64 || kKvRows == 128, "64 or 128 cached rows a stage, or 0");
template <int N>
struct Rows {
  static constexpr int value = N;
};
// The head (kVocab > 0): the final RMSNorm, the lm_head rows in 8-row stages, their argmax.
constexpr int kVocab = @VOCAB@, kHeadStages = kVocab / 8;
// kEmbedRows > 0: x_in is the embedding table [kEmbedRows][hidden] and the token (token_in) picks
// the row, wrapped once when negative and clamped, as Kiln's gather does.
constexpr long long kEmbedRows = @EMBED_ROWS@;
constexpr float kHeadEps = @HEAD_EPS@;
typedef unsigned short T;  // @DTYPE@ storage

__device__ __forceinline__ float2 pair(unsigned w) {  // two packed elements, low first
@PAIR@
}
__device__ __forceinline__ float ld1(T h) {
@LD1@
}
__device__ __forceinline__ T st1(float f) {
@ST1@
}
__device__ __forceinline__ float rounded(float f) { return ld1(st1(f)); }
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_bytes(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
  unsigned done = 0;
  while (!done)
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
}
// Waits with cluster scope: what the cluster's other blocks wrote before arriving is visible.
__device__ __forceinline__ void mbar_wait_cluster(unsigned long long* bar, unsigned parity) {
  unsigned done = 0;
  while (!done)
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
}
__device__ __forceinline__ void mbar_arrive_remote(unsigned long long* bar, unsigned rank) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_u32(bar)), "r"(rank));
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}
// A bulk copy global -> shared memory completing `bytes` of the barrier's transaction count.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)) : "memory");
}
// 16 (4) bytes into block `rank`'s shared memory at `dst`'s offset, completing as many bytes of
// that block's barrier at `bar`'s offset: the data and the signal travel together.
__device__ __forceinline__ void push_v4(float* dst, unsigned long long* bar, unsigned rank, float4 v) {
  unsigned rd, rb;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rd) : "r"(smem_u32(dst)), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rb) : "r"(smem_u32(bar)), "r"(rank));
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
               ::"r"(rd), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(rb) : "memory");
}
__device__ __forceinline__ void push_b32(float* dst, unsigned long long* bar, unsigned rank, float v) {
  unsigned rd, rb;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rd) : "r"(smem_u32(dst)), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rb) : "r"(smem_u32(bar)), "r"(rank));
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
               ::"r"(rd), "r"(__float_as_uint(v)), "r"(rb) : "memory");
}
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned atom_add_acq_rel(unsigned* p, unsigned v) {
  unsigned old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
__device__ __forceinline__ void red_add_u64(unsigned long long* p, unsigned long long v) {
  asm volatile("red.relaxed.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ ulonglong2 ld_relaxed_v2(const unsigned long long* p) {
  ulonglong2 v;
  asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(v.x), "=l"(v.y) : "l"(p) : "memory");
  return v;
}
// A counted row's element holds its N contributions (see kCountShift).
__device__ __forceinline__ bool counted_done(unsigned long long e, unsigned long long want) {
  return (unsigned long long)((long long)(e - want) + (1ll << (kCountShift - 1))) < (1ull << kCountShift);
}
__device__ __forceinline__ float counted_value(unsigned long long e, unsigned long long want) {
  return static_cast<float>(static_cast<long long>(e - want)) * kFixUnit;
}
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_sync_all() {  // every thread of every block of the cluster
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ void consumers_sync() {  // named barrier 1: the consumer warps only
  asm volatile("bar.sync 1, %0;" ::"n"(kCT) : "memory");
}
__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Head dim of a block's w-th q|k|v column: 4 dims and their rotary partners 32 away.
__device__ __forceinline__ int head_dim_of(int rank, int w) { return w < 4 ? 4 * rank + w : 4 * rank + 28 + w; }
// N staged 1024-long rows (one from each of N stages) times the phase's normalized x, a warp:
// lane `lane` owns elements 8v..8v+7 for v = lane + 32j, held in registers (xr) all phase.
template <int N>
__device__ __forceinline__ void rows_dot(const T* const (&rows)[N], const float (&xr)[32], int lane, float (&out)[N]) {
  float s[N][2];
#pragma unroll
  for (int n = 0; n < N; ++n) s[n][0] = s[n][1] = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int n = 0; n < N; ++n) {
      const uint4 w = reinterpret_cast<const uint4*>(rows[n])[lane + 32 * j];
      const unsigned e[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float2 f = pair(e[q]);
        s[n][j & 1] = fmaf(f.x, xr[8 * j + 2 * q], fmaf(f.y, xr[8 * j + 2 * q + 1], s[n][j & 1]));
      }
    }
#pragma unroll
  for (int n = 0; n < N; ++n) out[n] = s[n][0] + s[n][1];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
#pragma unroll
    for (int n = 0; n < N; ++n) out[n] += __shfl_xor_sync(0xffffffffu, out[n], o);
}
__device__ __forceinline__ void load_x(float (&xr)[32], const float* xn, int lane) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float4 a = reinterpret_cast<const float4*>(xn)[2 * (lane + 32 * j)];
    const float4 b = reinterpret_cast<const float4*>(xn)[2 * (lane + 32 * j) + 1];
    xr[8 * j] = a.x, xr[8 * j + 1] = a.y, xr[8 * j + 2] = a.z, xr[8 * j + 3] = a.w;
    xr[8 * j + 4] = b.x, xr[8 * j + 5] = b.y, xr[8 * j + 6] = b.z, xr[8 * j + 7] = b.w;
  }
}
// Eight consecutive weights (one uint4) times eight floats.
__device__ __forceinline__ float dot8(const uint4& w, const float* x) {
  const unsigned e[4] = {w.x, w.y, w.z, w.w};
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = pair(e[i]);
    s = fmaf(f.x, x[2 * i], fmaf(f.y, x[2 * i + 1], s));
  }
  return s;
}

struct Smem {
  unsigned long long full[kStages], empty[kStages], csync, pushed, got_qkv, got_state;
  alignas(16) float xs[kHidden], xn[kHidden], part[kHidden];  // read as float4
  float qf[2][kHeadDim], kf[kHeadDim], vf[kHeadDim];  // written by the whole cluster (pushes)
  float loc[32], sc[2][128], stat[2][3], state[2][2 + kHeadDim], ored[2][2][kHeadDim], attn[2 * kHeadDim];
  float h[2 * 4 * kMaxTasks], red[kConsumers];
  unsigned long long best[kConsumers];  // the head's argmax keys, a warp each
  unsigned flag;
  unsigned ends;  // the block's phase arrivals so far (written by consumer thread 0, polled by the producer)
};
static_assert(sizeof(Smem) <= @STATE_BYTES@, "the block's state outgrew decode_layers_shared_bytes()");
}  // namespace kiln_dl_@NAME@

extern "C" __global__ void __cluster_dims__(8, 1, 1) __launch_bounds__(kiln_dl_@NAME@::kThreads, 1)
@NAME@(@OUT_T@* out, const unsigned short* __restrict__ x_in, const unsigned short* __restrict__ packed,
       const long long* pos_in, const unsigned short* __restrict__ cos_tab, const unsigned short* __restrict__ sin_tab, unsigned* sync,
       @CACHE_PARAMS@) {
  using namespace kiln_dl_@NAME@;
@HEAD_LOCALS@
  T* const kcs[kLayers] = {@K_CACHES@};
  T* const vcs[kLayers] = {@V_CACHES@};
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* ring = smem_raw;
  Smem& S = *reinterpret_cast<Smem*>(smem_raw + kStages * kStageBytes);
  const int rank = static_cast<int>(cluster_rank()), c = blockIdx.x / kCluster, b = blockIdx.x;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, nblocks = gridDim.x;
  // Whole pairs of MLP tasks a block: the phase-A blocks kATasks, the others the rest, evenly.
  const bool has_a = b < kABlocks;  // cluster c < kKvHeads: kv head g = c
  const int nb = nblocks - kABlocks, rest = kTasks / 2 - kATasks / 2 * kABlocks;
  const int per = nb > 0 ? rest / nb : 0, extra = nb > 0 ? rest % nb : 0;  // decode_layers_grid_unfit() checked these
  const int task0 = has_a ? kATasks * b : kATasks * kABlocks + 2 * ((b - kABlocks) * per + min(b - kABlocks, extra));
  const int tasks = has_a ? kATasks : 2 * (per + (b - kABlocks < extra ? 1 : 0));
  const int g = c, down_stages = tasks / 2;
  const long long pos = *pos_in;
  const T* x_row = x_in;  // the first layer's input row
  if (kEmbedRows > 0) {
    long long t = *token_in;
    if (t < 0) t += kEmbedRows;
    t = t < 0 ? 0 : (t >= kEmbedRows ? kEmbedRows - 1 : t);
    x_row = x_in + (size_t)t * kHidden;
  }
  const bool bad_pos = pos < 0 || pos >= kMaxLen;  // no cache row written, the output NaN
  const int P = bad_pos ? 0 : static_cast<int>(pos);  // cached rows before the token; its own row is P
  // The cached rows [0, P) in kv_rows-row stages, split evenly among the cluster's blocks: this
  // block attends over stages [kv_first, kv_first + kv_count), kv_per ring slots each.
  const int kv_rows = kKvRows ? kKvRows : (P > kCluster * 64 ? 128 : 64), kv_per = kv_rows / 64;
  const int kv_stages = (P + kv_rows - 1) / kv_rows, kv_first = has_a ? kv_stages * rank / kCluster : 0;
  const int kv_count = has_a ? kv_stages * (rank + 1) / kCluster - kv_first : 0, kv_slots = kv_count * kv_per;
  // A layer's stages: phase A's q, q, k, v, the block's cached rows, o, o; then phase B's.
  const int a_stages = has_a ? kAStages + kv_slots : 0, per_layer = a_stages + tasks + down_stages;
  // The head: this block's lm_head stages [h0, h0 + head_count), an even share of them.
  const int h0 = kHeadStages * b / nblocks, head_count = kHeadStages * (b + 1) / nblocks - h0;
  // The rotary factors of this thread's head dim at position P, the same in every layer: read once
  // here, not after each q|k|v product (a dependent global load on the layer's chain).
  float rot_cos = 0.f, rot_sin = 0.f;
  if (has_a && tid < 32) {
    const int d = head_dim_of(rank, tid % 8);
    rot_cos = ld1(cos_tab[(size_t)P * kHeadDim + d]);
    rot_sin = ld1(sin_tab[(size_t)P * kHeadDim + d]);
  }
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&S.full[s], 1);
      mbar_init(&S.empty[s], kConsumers);
    }
    mbar_init(&S.csync, kCluster);
    mbar_init(&S.pushed, 1);
    mbar_init(&S.got_qkv, 1);
    mbar_init(&S.got_state, 1);
    S.ends = 0;
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cluster_sync_all();  // every block's barriers exist before any remote arrival

  if (warp == kConsumers) {  // producer: the block's stages, layer after layer, as fast as slots free
    if (lane != 0) return;
    unsigned i = 0;
    // Waits until stage i may be issued: its ring slot free, and at most kMaxInflight copies in
    // flight. A release (the phase's arrival) waits for the SM's copies still in flight, and a deep
    // queue makes each late. With kReleaseInflight >= 0, a stage of a phase whose predecessor's
    // arrival (the block's `ends_before`-th) has not been made yet goes with at most that many in
    // flight (0: only after the arrival), so the arrival finds few copies to wait for while the
    // rest of the phase streams deeper.
    auto wait_slot = [&](unsigned i, unsigned ends_before, int deep = kMaxInflight) {
      int cap = deep;
      if (kReleaseInflight >= 0 && kCompute != 2 && *reinterpret_cast<volatile unsigned*>(&S.ends) < ends_before) {
        if (kReleaseInflight == 0)
          while (*reinterpret_cast<volatile unsigned*>(&S.ends) < ends_before) {
          }
        else
          cap = kReleaseInflight;
      }
      if (cap && i >= (unsigned)cap) {
        const unsigned j = i - cap;
        mbar_wait(&S.full[j % kStages], (j / kStages) & 1);
      }
      mbar_wait(&S.empty[i % kStages], ((i / kStages) & 1) ^ 1);
    };
    for (int l = 0; l < kLayers; ++l) {
      // The layer's three regions: this block's phase-A stages, its tasks' gate|up and down stages.
      const T* layer = packed + (size_t)l * kStagesPerLayer * kStageElems;
      const T* a_src = layer + (size_t)b * kAStages * kStageElems;
      const T* gu_src = layer + (size_t)(kGuRegion + task0) * kStageElems;
      const T* down_src = layer + (size_t)(kDownRegion + task0 / 2) * kStageElems;
      for (int k = 0; k < per_layer; ++k, ++i) {
        const int s = i % kStages;
        wait_slot(i, has_a ? 2 * l + (k >= a_stages ? 1 : 0) : l);
        unsigned char* dst = ring + (size_t)s * kStageBytes;
        const int cached = k - 4;  // this block's cached-row slot, when 0 <= cached < kv_slots
        if (has_a && cached >= 0 && cached < kv_slots) {  // up to kv_rows key rows and as many value rows
          const int j = kv_first + cached / kv_per, rows = P - kv_rows * j < kv_rows ? P - kv_rows * j : kv_rows;
          const unsigned bytes = rows * kHeadDim * 2;
          const size_t off = ((size_t)g * kMaxLen + kv_rows * j) * kHeadDim;
          if (kv_per == 1) {  // keys in the first half of the slot, values in the second
            mbar_expect_bytes(&S.full[s], 2 * bytes);
            bulk_load(dst, kcs[l] + off, bytes, &S.full[s]);
            bulk_load(dst + kStageBytes / 2, vcs[l] + off, bytes, &S.full[s]);
          } else {  // keys in this slot, values in the next
            mbar_expect_bytes(&S.full[s], bytes);
            bulk_load(dst, (cached % 2 ? vcs[l] : kcs[l]) + off, bytes, &S.full[s]);
          }
          continue;
        }
        const T* src = k < a_stages ? a_src + (size_t)(k < 4 ? k : k - kv_slots) * kStageElems
                       : k < a_stages + tasks ? gu_src + (size_t)(k - a_stages) * kStageElems
                                              : down_src + (size_t)(k - a_stages - tasks) * kStageElems;
        mbar_expect_bytes(&S.full[s], kStageBytes);
        bulk_load(dst, src, kStageBytes, &S.full[s]);
      }
    }
    // The head's lm_head rows: 8 consecutive rows of the model's own weight are one stage.
    for (int k = 0; k < head_count; ++k, ++i) {
      wait_slot(i, has_a ? 2 * kLayers : kLayers, kHeadInflight);
      const int s = i % kStages;
      mbar_expect_bytes(&S.full[s], kStageBytes);
      bulk_load(ring + (size_t)s * kStageBytes, head_w + (size_t)(h0 + k) * kStageElems, kStageBytes, &S.full[s]);
    }
    return;
  }

  unsigned i = 0;
  auto stage = [&](void) -> const T* {
    mbar_wait(&S.full[i % kStages], (i / kStages) & 1);
    return reinterpret_cast<const T*>(ring + (size_t)(i % kStages) * kStageBytes);
  };
  auto peek = [&](int k) -> const T* {  // the k-th stage from here, waited for, not taken
    const unsigned j = i + k;
    mbar_wait(&S.full[j % kStages], (j / kStages) & 1);
    return reinterpret_cast<const T*>(ring + (size_t)(j % kStages) * kStageBytes);
  };
  auto release = [&]() {
    __syncwarp();
    if (lane == 0) mbar_arrive(&S.empty[i % kStages]);
    ++i;
  };
  auto mark = [&](int p, int k) {
@MARK@
  };
  // The sync area: [0] phase-A arrivals, [1] phase-B arrivals, [2] the launch epoch (launches
  // completed), then 3 residual rows and the last phase's row (floats). Arrival targets and the
  // rows' ring position count from the epoch, which the last block of the previous launch wrote
  // before it completed, so a CUDA graph replays the same arguments every token.
  float* const rows = reinterpret_cast<float*>(sync + 4);
  float* const fin = rows + 3 * kHidden;
  const unsigned epoch = __ldcg(sync + 2);
  const unsigned base_a = epoch * kLayers * kABlocks, base_b = epoch * kLayers * nblocks;
  const int ring0 = static_cast<int>((epoch % 3) * ((2 * kLayers) % 3) % 3);
  constexpr int kPhases = 2 * kLayers;
  // Phase p's output row: a ring of three (p + 1), the last phase's its own.
  auto row = [&](int p) { return p == kPhases ? fin : rows + ((ring0 + p) % 3) * kHidden; };
  // Counted rows (kCounted): after the head's key, an overflow flag, then two sets of kPhases rows
  // of u64 elements; a launch adds into the set of its epoch's parity (phase p into crow(p + 1))
  // and zeroes the other one, which the previous launch used and the next will.
  unsigned* const overflow = reinterpret_cast<unsigned*>(fin + kHidden + 4);
  unsigned long long* const csets = reinterpret_cast<unsigned long long*>(fin + kHidden + 8);
  auto crow = [&](int p) { return csets + ((size_t)(epoch & 1) * kPhases + p - 1) * kHidden; };
  // The contributions a counted row's element gets: phase A's from each kv head's cluster, phase
  // B's from every cluster.
  auto want_of = [&](int p) {
    return (unsigned long long)((p - 1) % 2 == 0 ? kKvHeads : nblocks / kCluster) << kCountShift;
  };
  auto add_row = [&](int p, int j, float v) {  // phase p's contribution v to element j of its output row
    if (kCounted) {
      if (!(fabsf(v) < kFixLimit)) {
        atomicOr(overflow, 1u);
        v = 0.f;
      }
      red_add_u64(crow(p + 1) + j, (1ull << kCountShift) + (unsigned long long)__float2ll_rn(v * kFixScale));
    } else {
      atomicAdd(row(p + 1) + j, v);
    }
  };
  // The elements a consumer thread reads and normalizes: strided, or with counted rows pairs (one
  // 16-byte load of two u64 elements).
  constexpr int kPer = kHidden / kCT;
  auto elem = [&](int q) { return kCounted ? 2 * tid + (q & 1) + 2 * kCT * (q >> 1) : tid + q * kCT; };
  // Phase p reads row(p) (p == 0: the embedding) and adds into row(p + 1), which block 0 zeroed at
  // the start of phase p-1, after every reader of it in phase p-2 had arrived; the previous
  // launch's last phase zeroed this launch's first output row. It ends with the normalized row in
  // the warp's registers (xr, as load_x lays them out) and the raw row in S.xs (the residual). The
  // row is read once a block: every warp reading it itself (the session-38 "warp_norm") made the
  // 960 warps hit the same 32 L2 lines at once, 2.9 against 1.2 us, 0.469 against 0.381 ms a token.
  auto begin_phase = [&](int p, const T* gamma, float (&xr)[32]) {
    // The norm weights do not depend on the wait: read before it, not after the reduction (a
    // dependent global load on the chain).
    float gam[kPer], vals[kPer];
#pragma unroll
    for (int q = 0; q < kPer; ++q) gam[q] = ld1(gamma[elem(q)]);
    if (p == 0) {
#pragma unroll
      for (int q = 0; q < kPer; ++q) vals[q] = ld1(x_row[elem(q)]);
    } else if (kCounted) {  // the row itself is the wait: each thread polls its elements until complete
      const unsigned long long want = want_of(p);
      const unsigned long long* src = crow(p);
      if (kCounted == 2 && tid == 0)
        while (!counted_done(ld_relaxed_v2(src + kHidden - 2).y, want)) {
        }
      if (kCounted == 2) consumers_sync();
#pragma unroll
      for (int h = 0; h < kPer / 2; ++h) {
        ulonglong2 e = ld_relaxed_v2(src + elem(2 * h));
        while (!counted_done(e.x, want) || !counted_done(e.y, want)) e = ld_relaxed_v2(src + elem(2 * h));
        vals[2 * h] = counted_value(e.x, want);
        vals[2 * h + 1] = counted_value(e.y, want);
      }
    } else if (tid == 0) {
      const unsigned* counter = sync + (p % 2 ? 0 : 1);
      const unsigned target = p % 2 ? base_a + (unsigned)(p / 2 + 1) * kABlocks : base_b + (unsigned)(p / 2) * nblocks;
      while (static_cast<int>(ld_acquire(counter) - target) < 0) {
      }
    }
    mark(p, 0);
    consumers_sync();
    if (!kCounted && b == 0 && p < kPhases) {  // row(p + 2) was phase p-1's input, read by every block before it arrived
      float* zero = p + 2 == kPhases ? fin : rows + ((ring0 + p + 2) % 3) * kHidden;
      for (int j = tid; j < kHidden; j += kCT) zero[j] = 0.f;
    }
    float ss = 0.f;
#pragma unroll
    for (int q = 0; q < kPer; ++q) {
      if (!kCounted && p > 0) vals[q] = __ldcg(row(p) + elem(q));
      S.xs[elem(q)] = vals[q];
      ss += vals[q] * vals[q];
    }
    ss = warp_sum(ss);
    if (lane == 0) S.red[warp] = ss;
    consumers_sync();
    float tot = 0.f;
#pragma unroll
    for (int w = 0; w < kConsumers; ++w) tot += S.red[w];
    const float rstd = rsqrtf(tot / kHidden + (p == kPhases ? kHeadEps : kEps));
#pragma unroll
    for (int q = 0; q < kPer; ++q) S.xn[elem(q)] = vals[q] * rstd * gam[q];
    consumers_sync();
    mark(p, 1);
    load_x(xr, S.xn, lane);
  };
  // The phase's arrival; the launch's last arrival of all converts the output row and advances
  // the epoch.
  // With counted rows only the launch's last phase arrives (the readers poll the rows); its last
  // arrival also writes the fp32 row into `fin`.
  auto end_phase = [&](int p) {
    const bool last_phase = p == kPhases - 1 && kVocab == 0;
    if (!kCounted || last_phase) consumers_sync();
    if (tid == 0) {
      if (last_phase) {
        const unsigned last = kCounted ? epoch * nblocks + nblocks - 1 : base_b + (unsigned)kLayers * nblocks - 1;
        S.flag = atom_add_acq_rel(sync + 1, 1u) == last;
      } else if (!kCounted) {
        red_release(sync + (p % 2), 1u);
      }
      *reinterpret_cast<volatile unsigned*>(&S.ends) = S.ends + 1;
      mark(p, kMarks - 1);
    }
    if (last_phase) {
      consumers_sync();
      if (S.flag) {
        const bool nan = bad_pos || (kCounted && *reinterpret_cast<volatile unsigned*>(overflow));
        for (int j = tid; j < kHidden; j += kCT) {
          float v = kCounted ? counted_value(__ldcg(crow(kPhases) + j), want_of(kPhases)) : __ldcg(fin + j);
          if (kCounted) fin[j] = v;
          out[j] = (@OUT_T@)st1(nan ? __int_as_float(0x7fc00000) : v);
        }
        if (tid == 0) {
          if (kCounted) *overflow = 0u;
          sync[2] = epoch + 1;
        }
      }
    }
  };
  const T* const norms = packed + (size_t)kLayers * kStagesPerLayer * kStageElems;  // [layer][2][hidden]

  if (kCompute == 2) {  // the stream alone: every stage waited for and released, nothing else
    for (int l = 0; l < kLayers; ++l)
      for (int k = 0; k < per_layer; ++k) {
        stage();
        release();
      }
    return;
  }
  if (kCounted) {  // the other set of counted rows, a slice a block (16 bytes a store); every block, phase A or not
    ulonglong2* other = reinterpret_cast<ulonglong2*>(csets + (size_t)((epoch + 1) & 1) * kPhases * kHidden);
    const int n = kPhases * kHidden / 2, from = (int)((long long)n * b / nblocks), to = (int)((long long)n * (b + 1) / nblocks);
    for (int k = from + tid; k < to; k += kCT) other[k] = make_ulonglong2(0ull, 0ull);
  }
  for (int l = 0; l < kLayers; ++l) {
    int p = 2 * l;
    if (has_a) {  // ---------------- phase A: kv head g, query heads 2g and 2g+1 ----------------
      float xr[32];
      begin_phase(p, norms + (size_t)(2 * l) * kHidden, xr);
      // The cluster's exchanges in this phase are pushes (st.async) that complete these
      // barriers' byte counts: q|k|v, 32 floats from each block; the attention's partial states,
      // 2 x 64 outputs into S.xn (dead after load_x) and 2 x (max, sum) into S.loc.
      if (tid == 0) {
        mbar_expect_bytes(&S.got_qkv, kCluster * 32 * 4);
        mbar_expect_bytes(&S.got_state, kCluster * (2 * kHeadDim + 4) * 4);
      }
      {  // q (head 2g), q (2g+1), k, v, the four stages at once: warp w computes head dim head_dim_of(rank, w)
        const T* const qkv[4] = {peek(0) + warp * kHidden, peek(1) + warp * kHidden, peek(2) + warp * kHidden,
                                 peek(3) + warp * kHidden};
        float v[4] = {0.f, 0.f, 0.f, 0.f};
        if (kCompute) rows_dot<4>(qkv, xr, lane, v);
        if (lane == 0)
          for (int t = 0; t < 4; ++t) S.loc[t * 8 + warp] = v[t];
        for (int t = 0; t < 4; ++t) release();
      }
      consumers_sync();
      mark(p, 2);
      if (tid < 32) {  // rotary on q and k (partner column w ^ 4 in this block), k/v rounded, to the cluster
        const int t = tid / 8, w = tid % 8, d = head_dim_of(rank, w);
        float v = S.loc[tid];
        if (t < 3) {
          const float partner = S.loc[t * 8 + (w ^ 4)];
          v = w < 4 ? v * rot_cos - partner * rot_sin : v * rot_cos + partner * rot_sin;
        }
        if (t > 1) v = rounded(v);
        float* arr = t < 2 ? S.qf[t] : t == 2 ? S.kf : S.vf;
        for (int q = 0; q < kCluster; ++q) push_b32(arr + d, &S.got_qkv, q, v);
        if (t > 1 && !bad_pos) (t == 2 ? kcs[l] : vcs[l])[((size_t)g * kMaxLen + P) * kHeadDim + d] = st1(v);
      }
      mbar_wait(&S.got_qkv, l & 1);
      mark(p, 3);
      {  // attention of both query heads over this block's cached rows, a 64-row stage at a time
        // (online softmax: warp h keeps head h's running max and sum), then the new position
        const int head = tid >> 7, part = (tid >> 6) & 1, d = tid & 63;  // this thread's output in the PV product
        float acc = 0.f, m_run = neg_inf(), l_run = 0.f;
        // One stage of R rows (R a compile-time constant: both sizes are compiled when kv_rows goes by position).
        auto attend = [&](int s, auto rows_c) {
          constexpr int kKvRows = decltype(rows_c)::value, kKvSlots = kKvRows / 64;
          const int j = kv_first + s, nrows = P - kKvRows * j < kKvRows ? P - kKvRows * j : kKvRows;
          const T* kvs = peek(0);  // the keys; the values follow them in the slot, or fill the next
          const T* v = kKvSlots == 1 ? kvs + 64 * kHeadDim : peek(1);
          if (tid < 2 * kKvRows) {  // a thread a (head, row)
            const int hh = tid / kKvRows, pp = tid % kKvRows;
            float a = neg_inf();
            if (pp < nrows) {
              const float2* q2 = reinterpret_cast<const float2*>(S.qf[hh]);
              const unsigned* k2 = reinterpret_cast<const unsigned*>(kvs) + pp * 32;
              float a0 = 0.f, a1 = 0.f;
#pragma unroll 8
              for (int c2 = 0; c2 < 32; ++c2) {  // rotated start: the 32 rows of a warp hit 32 banks
                const int col = (c2 + tid) & 31;
                const float2 k = pair(k2[col]), q = q2[col];
                a0 = fmaf(q.x, k.x, a0);
                a1 = fmaf(q.y, k.y, a1);
              }
              a = (a0 + a1) * kScale;
            }
            S.sc[hh][pp] = a;
          }
          consumers_sync();
          if (warp < 2) {  // head `warp`: the new running max, the stage's weights, the old sums' scale
            float* sc = S.sc[warp];
            float e[kKvRows / 32], mx = neg_inf();
#pragma unroll
            for (int r = 0; r < kKvRows / 32; ++r) mx = fmaxf(mx, e[r] = sc[lane + 32 * r]);
            const float m_new = fmaxf(m_run, warp_max(mx));  // finite: a stage has a row
            float sum = 0.f;
#pragma unroll
            for (int r = 0; r < kKvRows / 32; ++r) sum += e[r] = __expf(e[r] - m_new);
            const float scale = __expf(m_run - m_new);
            l_run = fmaf(l_run, scale, warp_sum(sum));
            m_run = m_new;
            __syncwarp();
#pragma unroll
            for (int r = 0; r < kKvRows / 32; ++r) sc[lane + 32 * r] = e[r];
            if (lane == 0) S.stat[warp][2] = scale;
          }
          consumers_sync();
          {  // this thread's half of the stage's rows
            constexpr int kHalf = kKvRows / 2;
            const int end = min(kHalf * part + kHalf, nrows);
            float acc2 = 0.f;
            acc *= S.stat[head][2];
            int pp = kHalf * part;
            if (kKvRows == 128)  // two chains over the 64 rows: the sum's dependent adds halve
              for (; pp + 1 < end; pp += 2) {
                acc = fmaf(S.sc[head][pp], ld1(v[pp * kHeadDim + d]), acc);
                acc2 = fmaf(S.sc[head][pp + 1], ld1(v[(pp + 1) * kHeadDim + d]), acc2);
              }
            for (; pp < end; ++pp) acc = fmaf(S.sc[head][pp], ld1(v[pp * kHeadDim + d]), acc);
            acc += acc2;
          }
          for (int r = 0; r < kKvSlots; ++r) release();
          consumers_sync();  // S.sc and S.stat are the next stage's
        };
        for (int s = 0; s < kv_count; ++s) {
          if (kKvRows == 64 || (kKvRows == 0 && kv_rows == 64))
            attend(s, Rows<64>{});
          else
            attend(s, Rows<128>{});
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
            sn *= kScale;
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
          push_v4(S.loc + 4 * rank, &S.got_state, tid, make_float4(S.state[0][0], S.state[0][1], S.state[1][0], S.state[1][1]));
        mbar_wait(&S.got_state, l & 1);
        if (tid < 2 * kHeadDim) {  // a block with no rows sent (-inf, 0): its weight is 0
          const int hh = tid >> 6, dd = tid & 63;
          float M = neg_inf();
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
          float v = kCompute ? dot8(w[idx], S.attn + 8 * chunk) : 0.f;
          v += __shfl_xor_sync(0xffffffffu, v, 1);
          v += __shfl_xor_sync(0xffffffffu, v, 2);
          v += __shfl_xor_sync(0xffffffffu, v, 4);
          v += __shfl_xor_sync(0xffffffffu, v, 8);
          if (chunk == 0) {
            const int j = 128 * rank + 64 * s + r;
            add_row(p, j, g == 0 ? v + S.xs[j] : v);
          }
        }
        release();
      }
      mark(p, 6);
      end_phase(p);
    }

    // ---------------- phase B: this block's intermediate columns, every block ----------------
    p = 2 * l + 1;
    float xr[32];
    begin_phase(p, norms + (size_t)(2 * l + 1) * kHidden, xr);
    for (int t = 0; t < tasks; t += 2) {  // a pair of tasks (two stages) at once; warp w < 4: gate column 4t+w, else up
      const T* const gu[2] = {peek(0) + warp * kHidden, peek(1) + warp * kHidden};
      float v[2] = {0.f, 0.f};
      if (kCompute) rows_dot<2>(gu, xr, lane, v);
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
      if (kCompute)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[q] += dot8(w[tid + kCT * q], S.h + 8 * s);
      release();
    }
    // Each block pushes its partial sums of every 128-row slice to the slice's owner (st.async: no
    // release fence, no cluster barrier); S.xn (dead after load_x) stages them so that a thread
    // pushes 4 consecutive rows, and S.part receives [sender][128].
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
      add_row(p, j, v);
    }
    mark(p, 5);
    end_phase(p);
  }
  if (kVocab > 0) {  // ---------------- the head: final RMSNorm, lm_head, argmax ----------------
    const int p = kPhases;
    float xr[32];
    begin_phase(p, head_norm, xr);
    // Each logit rounded to the model's dtype (as the lm_head's output is), written out and ranked
    // by a key whose order is PyTorch's argmax: larger value, NaN above all, then smaller index.
    unsigned long long best = 0;
    auto rank_row = [&](float v, int r) {
      const T h = st1(bad_pos ? __int_as_float(0x7fc00000) : v);
      if (lane == 0) logits[r] = h;
      float f = ld1(h);
      unsigned bits = f != f ? 0x7fffffffu : __float_as_uint(f == 0.f ? 0.f : f);
      bits ^= (bits & 0x80000000u) ? 0xffffffffu : 0x80000000u;
      const unsigned long long key = ((unsigned long long)bits << 32) | (0xffffffffu - (unsigned)r);
      best = key > best ? key : best;
    };
    for (int s = 0; s < head_count; s += 2) {
      if (s + 1 < head_count) {
        const T* const r2[2] = {peek(0) + warp * kHidden, peek(1) + warp * kHidden};
        float v[2] = {0.f, 0.f};
        if (kCompute) rows_dot<2>(r2, xr, lane, v);
        rank_row(v[0], 8 * (h0 + s) + warp);
        rank_row(v[1], 8 * (h0 + s + 1) + warp);
        release();
        release();
      } else {
        const T* const r1[1] = {stage() + warp * kHidden};
        float v[1] = {0.f};
        if (kCompute) rows_dot<1>(r1, xr, lane, v);
        rank_row(v[0], 8 * (h0 + s) + warp);
        release();
      }
    }
    if (lane == 0) S.best[warp] = best;
    consumers_sync();
    if (tid == 0) {
      unsigned long long* const top = reinterpret_cast<unsigned long long*>(fin + kHidden);  // the sync area's key
      for (int w = 0; w < kConsumers; ++w) best = S.best[w] > best ? S.best[w] : best;
      atomicMax(top, best);
      // The launch's last arrival of all reads the winner (and clears it for the next launch).
      if (atom_add_acq_rel(sync + 3, 1u) == epoch * (unsigned)nblocks + nblocks - 1) {
        const unsigned long long won = atomicExch(top, 0ull);
        unsigned idx = 0xffffffffu - (unsigned)won;
        if (kCounted && *reinterpret_cast<volatile unsigned*>(overflow)) {  // a residual too large: NaN logits, as PyTorch's argmax of them
          for (int r = 0; r < kVocab; ++r) logits[r] = st1(__int_as_float(0x7fc00000));
          idx = 0u;
          *overflow = 0u;
        }
        out[0] = (@OUT_T@)(idx < (unsigned)kVocab ? idx : 0u);
        sync[2] = epoch + 1;
      }
      mark(p, kMarks - 1);
    }
  }
  // No block leaves while another may still push into it: the consumers of the whole cluster
  // meet on each block's csync barrier (remote arrivals; the producer warps have left).
  consumers_sync();
  if (tid < kCluster) mbar_arrive_remote(&S.csync, tid);
  mbar_wait_cluster(&S.csync, 0);
}
)KILN";

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
}

}  // namespace

std::string decode_layers_unsupported(const DecodeLayersShape& s) {
  char buf[256];
  auto why = [&](const char* fmt, long long a, long long b) {
    std::snprintf(buf, sizeof buf, fmt, a, b);
    return std::string(buf);
  };
  if (s.dtype != engine::DType::kBFloat16 && s.dtype != engine::DType::kFloat16)
    return "the persistent decode kernel takes bf16 or fp16 weights";
  if (s.hidden != 1024) return why("hidden size %lld (this version takes %lld)", s.hidden, 1024);
  if (s.head_dim != 64) return why("head_dim %lld (this version takes %lld)", s.head_dim, 64);
  if (s.kv_heads < 1 || s.heads != 2 * s.kv_heads)
    return why("%lld query heads for %lld kv heads (this version takes two a kv head)", s.heads, s.kv_heads);
  if (s.intermediate <= 0 || s.intermediate % 8 != 0)
    return why("intermediate size %lld (a multiple of %lld)", s.intermediate, 8);
  if (s.layers < 1 || s.max_len < 1) return why("%lld layers, max_len %lld", s.layers, s.max_len);
  if (s.embed_rows < 0) return why("an embedding of %lld rows (%lld: none)", s.embed_rows, 0);
  if (s.vocab < 0 || s.vocab % 8 != 0 || s.vocab > (int64_t{1} << 30))
    return why("a vocabulary of %lld (the head takes a multiple of %lld)", s.vocab, 8);
  return "";
}

std::string decode_layers_grid_unfit(const DecodeLayersShape& s, const DecodeLayersKernelOptions& o, int64_t blocks) {
  char buf[256];
  const int64_t a_blocks = s.kv_heads * kCluster, pairs = s.intermediate / 8, a_pairs = o.a_tasks / 2 * a_blocks;
  if (o.kv_rows != 0 && o.kv_rows != 64 && o.kv_rows != 128) {
    std::snprintf(buf, sizeof buf, "kv_rows %d (a stage of cached rows is 64 or 128 rows; 0: by position)", o.kv_rows);
    return buf;
  }
  if (o.counted_rows < 0 || o.counted_rows > 2) {
    std::snprintf(buf, sizeof buf, "counted_rows %d (0: arrival counters; 1 or 2: counted rows)", o.counted_rows);
    return buf;
  }
  if (o.head_inflight < 0) {
    std::snprintf(buf, sizeof buf, "head_inflight %d (copies in flight: 0 for the ring's depth, or more)", o.head_inflight);
    return buf;
  }
  if (o.a_tasks < 2 || o.a_tasks % 2 != 0 || o.a_tasks > kMaxTasks) {
    std::snprintf(buf, sizeof buf, "a phase-A block's MLP tasks are %d (an even number, 2 to %lld)", o.a_tasks,
                  static_cast<long long>(kMaxTasks));
    return buf;
  }
  if (blocks % kCluster != 0 || blocks < a_blocks) {
    std::snprintf(buf, sizeof buf, "%lld blocks: the kernel needs whole clusters of 8 and at least %lld (a cluster a kv head)",
                  static_cast<long long>(blocks), static_cast<long long>(a_blocks));
    return buf;
  }
  const int64_t others = blocks - a_blocks, rest = pairs - a_pairs;
  const int64_t most = others > 0 ? 2 * ((rest + others - 1) / others) : 0;
  if (rest < 0 || (others == 0 && rest > 0) || most > kMaxTasks) {
    std::snprintf(buf, sizeof buf,
                  "%lld blocks cannot share %lld MLP tasks with %d a phase-A block (at most %lld a block)",
                  static_cast<long long>(blocks), static_cast<long long>(2 * pairs), o.a_tasks,
                  static_cast<long long>(kMaxTasks));
    return buf;
  }
  return "";
}

int64_t decode_layers_fewest_blocks(const DecodeLayersShape& s, const DecodeLayersKernelOptions& o) {
  for (int64_t blocks = s.kv_heads * kCluster; blocks <= kDecodeLayersMaxClusters * kCluster; blocks += kCluster)
    if (decode_layers_grid_unfit(s, o, blocks).empty()) return blocks;
  return 0;
}

int64_t decode_layers_stages_per_layer(const DecodeLayersShape& s) {
  const int64_t tasks = s.intermediate / 4;
  return s.kv_heads * kCluster * 6 + tasks + tasks / 2;
}
int64_t decode_layers_packed_elems(const DecodeLayersShape& s) {
  return s.layers * decode_layers_stages_per_layer(s) * (kStageBytes / 2) + s.layers * 2 * s.hidden;
}
int64_t decode_layers_sync_bytes(const DecodeLayersShape& s, const DecodeLayersKernelOptions& o) {
  // counters and epoch, 3 rows and the last (fp32), the head's key; with counted rows an overflow
  // flag (padded to 16 bytes) and two sets of 2 * layers u64 rows
  if (o.counted_rows) return 16 + 4 * 4 * s.hidden + 32 + 2 * (2 * s.layers) * s.hidden * 8;
  return 16 + 4 * 4 * s.hidden + (s.vocab > 0 ? 16 : 0);
}
int64_t decode_layers_shared_bytes(const DecodeLayersKernelOptions& o) { return o.stages * kStageBytes + kStateBytes; }

std::string decode_layers_kernel_source(const DecodeLayersShape& shape, const DecodeLayersKernelOptions& o,
                                        const std::string& name) {
  std::string src = kBody;
  const bool bf16 = shape.dtype == engine::DType::kBFloat16;
  replace_all(src, "@NAME@", name);
  replace_all(src, "@INTER@", std::to_string(shape.intermediate));
  replace_all(src, "@LAYERS@", std::to_string(shape.layers));
  replace_all(src, "@KV_HEADS@", std::to_string(shape.kv_heads));
  replace_all(src, "@MAX_LEN@", std::to_string(shape.max_len));
  replace_all(src, "@EPS@", float_literal(shape.eps));
  replace_all(src, "@A_TASKS@", std::to_string(o.a_tasks));
  replace_all(src, "@STAGES@", std::to_string(o.stages));
  replace_all(src, "@STATE_BYTES@", std::to_string(kStateBytes));
  replace_all(src, "@MAX_INFLIGHT@", std::to_string(o.max_inflight));
  replace_all(src, "@RELEASE_INFLIGHT@", std::to_string(o.release_inflight));
  replace_all(src, "@COMPUTE@", std::to_string(o.compute));
  replace_all(src, "@COUNTED@", std::to_string(o.counted_rows));
  replace_all(src, "@KV_ROWS@", std::to_string(o.kv_rows));
  replace_all(src, "@HEAD_INFLIGHT@", std::to_string(o.head_inflight));
  replace_all(src, "@VOCAB@", std::to_string(shape.vocab));
  replace_all(src, "@EMBED_ROWS@", std::to_string(shape.embed_rows));
  replace_all(src, "@HEAD_EPS@", float_literal(shape.vocab > 0 ? shape.head_eps : shape.eps));
  replace_all(src, "@OUT_T@", shape.vocab > 0 ? "long long" : "unsigned short");
  std::string locals = shape.vocab > 0 ? "" : "  unsigned short* const logits = nullptr;\n  const unsigned short* const head_w = nullptr;\n"
                                               "  const unsigned short* const head_norm = nullptr;\n";
  if (shape.embed_rows == 0) locals += "  const long long* const token_in = nullptr;\n";
  replace_all(src, "@HEAD_LOCALS@", locals);
  replace_all(src, "@DTYPE@", bf16 ? "bf16" : "fp16");
  replace_all(src, "@PAIR@",
              bf16 ? "  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));"
                   : "  float lo, hi;\n  asm(\"{ .reg .b16 a, b; mov.b32 {a, b}, %2; cvt.f32.f16 %0, a; cvt.f32.f16 %1, b; }\""
                     " : \"=f\"(lo), \"=f\"(hi) : \"r\"(w));\n  return make_float2(lo, hi);");
  replace_all(src, "@LD1@",
              bf16 ? "  return __uint_as_float(((unsigned)h) << 16);"
                   : "  float f; asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h)); return f;");
  replace_all(src, "@ST1@",
              bf16 ? "  T h; asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h;"
                   : "  T h; asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h;");
  std::ostringstream params, ks, vs;
  for (int64_t l = 0; l < shape.layers; ++l) {
    params << (l ? ", " : "") << "unsigned short* k_cache_" << l;
    ks << (l ? ", " : "") << "k_cache_" << l;
    vs << (l ? ", " : "") << "v_cache_" << l;
  }
  for (int64_t l = 0; l < shape.layers; ++l) params << ", unsigned short* v_cache_" << l;
  if (shape.vocab > 0)
    params << ", unsigned short* logits, const unsigned short* __restrict__ head_w, "
              "const unsigned short* __restrict__ head_norm";
  if (shape.embed_rows > 0) params << ", const long long* token_in";
  if (o.trace) params << ", unsigned long long* trace";
  replace_all(src, "@CACHE_PARAMS@", params.str());
  replace_all(src, "@K_CACHES@", ks.str());
  replace_all(src, "@V_CACHES@", vs.str());
  replace_all(src, "@MARK@",
              o.trace ? "    if (tid == 0 && p < 2 * kLayers) trace[((size_t)b * 2 * kLayers + p) * kMarks + k] = globaltimer();"
                      : "    (void)p;\n    (void)k;");
  return src;
}

}  // namespace kiln::ops
