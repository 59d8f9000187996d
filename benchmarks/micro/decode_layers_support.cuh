// decode_layers_persistent.cu's support: the model's shapes and the kernel's layout constants,
// the reference (a plain kernel an op on the logical weights), the repacking of those weights
// into the kernel's stages, the random fills and the trace summary. Included by that file only;
// the kernel itself is src/ops/decode_layers_kernel.cpp's source.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "micro_util.cuh"

// The benchmark model (examples/llm_generate/llama_kv.py "bench").
constexpr int kHidden = 1024, kInter = 4096, kLayers = 24, kHeads = 16, kKvHeads = 8, kHeadDim = 64;
constexpr int kMaxLen = 2048;  // the cache's rows a kv head: positions 0..2047
constexpr int kPos = 512;      // the position the traces and most timings run at (512 cached rows)
constexpr int kCluster = 8, kABlocks = kKvHeads * kCluster;  // phase A: a cluster a kv head
constexpr int kThreads = 288;  // eight consumer warps and a producer
constexpr int kStageBytes = 16384, kStageElems = kStageBytes / 2;
constexpr int kTasks = kInter / 4;  // phase-B task: 4 gate + 4 up columns (one stage), 4 down columns
constexpr int kAStages = 6;         // packed phase-A stages: q (2 heads), k, v, o (2 halves)
// A layer's packed stages, in three regions that do not depend on the grid: the phase-A blocks'
// (6 each), a gate|up stage a task, a down stage a pair of tasks. A block's phase-B tasks are a
// run of whole pairs, so its stages are a run in each region: any co-resident cluster count can
// read the same copy (an engine packs once at load, then sizes the grid to the GPU it runs on).
constexpr int kGuRegion = kABlocks * kAStages, kDownRegion = kGuRegion + kTasks;
constexpr int kStagesPerLayer = kDownRegion + kTasks / 2;
constexpr int kMarks = 8;           // traced points a phase (globaltimer)

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// Head dim of a phase-A block's w-th q|k|v row: 4 dims and their rotary partners 32 away (the
// kernel's head_dim_of, src/ops/decode_layers_kernel.cpp).
__host__ __device__ __forceinline__ int head_dim_of(int rank, int w) { return w < 4 ? 4 * rank + w : 4 * rank + 28 + w; }

struct Weights {  // logical layout, [out][in], per layer contiguous
  const __nv_bfloat16 *wq, *wk, *wv, *wo, *wg, *wu, *wd;
  const float *g1, *g2;  // RMSNorm weights [layers][1024], bf16 values
};

// ---------------- reference: a plain kernel an op, logical weights ----------------
__global__ void ref_norm(const float* x, const float* gamma, float* xn) {
  __shared__ float red[32];
  float ss = 0.f;
  for (int j = threadIdx.x; j < kHidden; j += blockDim.x) ss += x[j] * x[j];
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
  __syncthreads();
  float tot = 0.f;
  for (int w = 0; w < (int)blockDim.x / 32; ++w) tot += red[w];
  const float rstd = rsqrtf(tot / kHidden + 1e-5f);
  for (int j = threadIdx.x; j < kHidden; j += blockDim.x) xn[j] = x[j] * rstd * gamma[j];
}
// y[n] = W[n][k] x (+ res); a warp a row
__global__ void ref_gemv(const __nv_bfloat16* w, const float* x, float* y, int n, int k, const float* res) {
  const int row = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= n) return;
  float s = 0.f;
  for (int e = lane; e < k; e += 32) s += __bfloat162float(w[(size_t)row * k + e]) * x[e];
  s = warp_sum(s);
  if (lane == 0) y[row] = s + (res ? res[row] : 0.f);
}
__global__ void ref_rotary_cache(float* q, float* k, const float* v, const float* cos_tab, const float* sin_tab,
                                 __nv_bfloat16* kc, __nv_bfloat16* vc, int l, int P) {
  const float *cosv = cos_tab + 32 * P, *sinv = sin_tab + 32 * P;
  const int head = blockIdx.x, i = threadIdx.x;  // 24 blocks (16 q heads, 8 k heads), 32 threads
  float* x = head < kHeads ? q + head * kHeadDim : k + (head - kHeads) * kHeadDim;
  const float a = x[i], bb = x[i + 32];
  __syncwarp();
  x[i] = a * cosv[i] - bb * sinv[i];
  x[i + 32] = bb * cosv[i] + a * sinv[i];
  if (head >= kHeads) {
    const int g = head - kHeads;
    const size_t off = (((size_t)l * kKvHeads + g) * kMaxLen + P) * kHeadDim;
    kc[off + i] = __float2bfloat16(x[i]);
    kc[off + i + 32] = __float2bfloat16(x[i + 32]);
    vc[off + i] = __float2bfloat16(v[g * kHeadDim + i]);
    vc[off + i + 32] = __float2bfloat16(v[g * kHeadDim + i + 32]);
  }
}
__global__ void ref_attention(const float* q, const __nv_bfloat16* kc, const __nv_bfloat16* vc, int l, int P, float* o) {
  __shared__ float sc[kMaxLen];
  const int h = blockIdx.x, g = h / 2, t = threadIdx.x;  // 64 threads
  const size_t base = ((size_t)l * kKvHeads + g) * kMaxLen * kHeadDim;
  for (int p = t; p <= P; p += blockDim.x) {
    float s = 0.f;
    for (int d = 0; d < kHeadDim; ++d) s += q[h * kHeadDim + d] * __bfloat162float(kc[base + (size_t)p * kHeadDim + d]);
    sc[p] = s * 0.125f;
  }
  __syncthreads();
  float m = -INFINITY;
  for (int p = 0; p <= P; ++p) m = fmaxf(m, sc[p]);
  float sum = 0.f, acc = 0.f;
  for (int p = 0; p <= P; ++p) {
    const float e = expf(sc[p] - m);
    sum += e;
    acc += e * __bfloat162float(vc[base + (size_t)p * kHeadDim + t]);
  }
  o[h * kHeadDim + t] = acc / sum;
}
__global__ void ref_silu_mul(const float* gt, const float* up, float* h) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < kInter) h[i] = gt[i] / (1.f + expf(-gt[i])) * up[i];
}

// Repack the logical weights into the layers' stages (kStagesPerLayer a layer, 8192 bf16 each):
// stage k < kGuRegion is phase-A block k / 6's (0, 1: q of its kv head's two query heads, 8 head
// dims each; 2: k; 3: v; 4, 5: the o-projection's 64-row halves); then task t's gate|up (gate
// columns 4t..4t+3, then up); then pair u's down (all 1024 rows, intermediate columns 8u..8u+7);
// after the first `layers` layers' stages, their norm weights [layer][2][1024].
__global__ void pack(Weights wt, int layers, __nv_bfloat16* packed) {
  const size_t stage_elems = (size_t)layers * kStagesPerLayer * kStageElems, total = stage_elems + (size_t)layers * 2 * kHidden;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
    if (i >= stage_elems) {  // the norm weights, [layer][2][1024]
      const size_t j = i - stage_elems, l = j / (2 * kHidden), which = (j / kHidden) % 2;
      packed[i] = __float2bfloat16((which ? wt.g2 : wt.g1)[l * kHidden + j % kHidden]);
      continue;
    }
    const int e = static_cast<int>(i % kStageElems);
    const int k = static_cast<int>((i / kStageElems) % kStagesPerLayer);
    const int l = static_cast<int>(i / ((size_t)kStageElems * kStagesPerLayer));
    float v = 0.f;
    if (k < kGuRegion) {
      const int b = k / kAStages, kind = k % kAStages, r = b % kCluster, g = b / kCluster;
      if (kind < 4) {  // 8 rows (head dims) of 1024
        const int row = e / kHidden, col = e % kHidden, d = head_dim_of(r, row);
        if (kind < 2)
          v = __bfloat162float(wt.wq[(size_t)l * kHidden * kHidden + (size_t)((2 * g + kind) * kHeadDim + d) * kHidden + col]);
        else
          v = __bfloat162float((kind == 2 ? wt.wk : wt.wv)[(size_t)l * kKvHeads * kHeadDim * kHidden +
                                                          (size_t)(g * kHeadDim + d) * kHidden + col]);
      } else {  // o: 64 rows, the two query heads' 128 columns
        const int row = 128 * r + 64 * (kind - 4) + e / 128, col = 2 * g * kHeadDim + e % 128;
        v = __bfloat162float(wt.wo[(size_t)l * kHidden * kHidden + (size_t)row * kHidden + col]);
      }
    } else if (k < kDownRegion) {  // gate columns 4t..4t+3, then up columns 4t..4t+3
      const int row = e / kHidden, col = e % kHidden, n = 4 * (k - kGuRegion) + (row & 3);
      v = __bfloat162float((row < 4 ? wt.wg : wt.wu)[(size_t)l * kInter * kHidden + (size_t)n * kHidden + col]);
    } else {  // down: all 1024 output rows, 8 intermediate columns
      const int row = e / 8, col = 8 * (k - kDownRegion) + e % 8;
      v = __bfloat162float(wt.wd[(size_t)l * kHidden * kInter + (size_t)row * kInter + col]);
    }
    packed[i] = __float2bfloat16(v);
  }
}

__global__ void fill_f32(float* w, size_t count, unsigned seed, float center, float scale) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = static_cast<unsigned>(i) * 2246822519u ^ seed;
    h ^= h >> 13;
    h *= 2654435761u;
    h ^= h >> 16;
    w[i] = center + ((h & 0xffffu) / 32767.5f - 1.f) * scale;
  }
}

__global__ void round_bf16_values(float* w, size_t count) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
    w[i] = __bfloat162float(__float2bfloat16(w[i]));
}
__global__ void to_bf16(const float* w, size_t count, __nv_bfloat16* out) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
    out[i] = __float2bfloat16(w[i]);
}

// The globaltimer trace of one launch ([block][phase][mark]), summarized: each segment between
// two marks averaged over layers 1-22, then its median and maximum over the phase-A blocks and
// over the others (us).
void print_trace(const std::vector<unsigned long long>& tr, int nblocks, int compute) {
  auto at = [&](int blk, int p, int k) { return static_cast<double>(tr[((size_t)blk * 2 * kLayers + p) * kMarks + k]); };
  // A segment (mark k0 -> k1 of phase A or B) averaged over layers 1-22, then its median and
  // maximum over a set of blocks (us).
  auto seg = [&](int b0, int b1, int phase, int k0, int k1, bool mx) {
    std::vector<double> v;
    for (int blk = b0; blk < b1; ++blk) {
      double t = 0;
      for (int l = 1; l < kLayers - 1; ++l) t += at(blk, 2 * l + phase, k1) - at(blk, 2 * l + phase, k0);
      v.push_back(t / (kLayers - 2) / 1e3);
    }
    std::sort(v.begin(), v.end());
    return mx ? v.back() : v[v.size() / 2];
  };
  // End of the block's previous phase (a B-only block's previous phase B) -> this phase's start.
  auto wait_seg = [&](int b0, int b1, int phase, bool mx) {
    std::vector<double> v;
    for (int blk = b0; blk < b1; ++blk) {
      double t = 0;
      for (int l = 1; l < kLayers - 1; ++l)
        t += at(blk, 2 * l + phase, 0) -
             (phase && blk < kABlocks ? at(blk, 2 * l, kMarks - 1) : at(blk, 2 * l - 1, kMarks - 1));
      v.push_back(t / (kLayers - 2) / 1e3);
    }
    std::sort(v.begin(), v.end());
    return mx ? v.back() : v[v.size() / 2];
  };
  std::printf("trace%s, us a layer (layers 1-22), median / max over blocks:\n", compute ? "" : ", products not computed");
  const int a_ends[] = {1, 2, 3, 4, 5, 6, 7};
  const char* a_names[] = {"x+norm", "q|k|v", "rotary+DSMEM+sync", "attention", "sync+merge", "o-proj", "end"};
  std::printf("  phase A (A blocks): wait %.2f/%.2f", wait_seg(0, kABlocks, 0, false), wait_seg(0, kABlocks, 0, true));
  for (int k = 0; k < 7; ++k)
    std::printf(" | %s %.2f/%.2f", a_names[k], seg(0, kABlocks, 0, k == 0 ? 0 : a_ends[k - 1], a_ends[k], false),
                seg(0, kABlocks, 0, k == 0 ? 0 : a_ends[k - 1], a_ends[k], true));
  std::printf("\n");
  const int b_from[] = {0, 1, 2, 3, 6, 4, 5}, b_to[] = {1, 2, 3, 6, 4, 5, 7};
  const char* b_names[] = {"x+norm", "gate|up", "down", "block sync", "cluster sync", "reduce+atomics", "end"};
  for (int set = 0; set < 2; ++set) {
    const int b0 = set ? kABlocks : 0, b1 = set ? nblocks : kABlocks;
    if (b0 == b1) continue;
    std::printf("  phase B (%s): wait %.2f/%.2f", set ? "B-only blocks" : "A blocks", wait_seg(b0, b1, 1, false),
                wait_seg(b0, b1, 1, true));
    for (int k = 0; k < 7; ++k)
      std::printf(" | %s %.2f/%.2f", b_names[k], seg(b0, b1, 1, b_from[k], b_to[k], false),
                  seg(b0, b1, 1, b_from[k], b_to[k], true));
    std::printf("\n");
  }
  // Phase B's cluster sync, a cluster and a layer at a time: how far apart its blocks finish
  // (the last block's mark 6 less the first's), and the sync's own latency (the first block out,
  // mark 4, less the last block in), averaged over layers 1-22, median / max over clusters.
  {
    std::vector<double> spread, own;
    for (int c0 = 0; c0 + kCluster <= nblocks; c0 += kCluster) {
      double sp = 0, ow = 0;
      for (int l = 1; l < kLayers - 1; ++l) {
        double in0 = 1e300, in1 = 0, out0 = 1e300;
        for (int blk = c0; blk < c0 + kCluster; ++blk) {
          in0 = std::min(in0, at(blk, 2 * l + 1, 6));
          in1 = std::max(in1, at(blk, 2 * l + 1, 6));
          out0 = std::min(out0, at(blk, 2 * l + 1, 4));
        }
        sp += in1 - in0;
        ow += out0 - in1;
      }
      spread.push_back(sp / (kLayers - 2) / 1e3);
      own.push_back(ow / (kLayers - 2) / 1e3);
    }
    std::sort(spread.begin(), spread.end());
    std::sort(own.begin(), own.end());
    std::printf("  phase B cluster sync, a cluster: blocks' arrival spread %.2f/%.2f | last in -> first out %.2f/%.2f\n",
                spread[spread.size() / 2], spread.back(), own[own.size() / 2], own.back());
  }
  std::printf("  whole token (block 0) %.1f us\n", (at(0, 2 * kLayers - 1, kMarks - 1) - at(0, 0, 0)) / 1e3);
}
