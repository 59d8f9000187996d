// Generates the fused attention kernel of an AttentionPlan. Two variants:
//  * tensor cores (float16/bfloat16, head dims a multiple of 16 up to 128,
//    every SM targeted sm_80 or newer): a warp owns 16 query rows, a block
//    kAttnWarps of them; key/value tiles of 64 rows go through shared memory;
//    Q K^T and P V are mma.sync m16n8k16 products with float accumulators;
//    the online softmax (base 2, scale folded in) runs on the accumulators;
//  * SIMT (float32, other head dims, older SMs): a warp owns one query row,
//    a block 8 of them; tiles of 32 keys in shared memory as float; each lane
//    scores one key, then every lane accumulates its slice of the output.
//  * decode (at most kAttnDecodeMaxRows query rows per head, 128 keys or
//    more: one new token over a KV cache): a block's warps split the keys,
//    32 at a time, and merge their partial softmax states at the end; with
//    few heads the keys are also split over blocks (flash-decoding), each
//    writing its partial state, merged by a second, combine kernel.
// All keep the running max/sum per row in float and write 0 for a row whose
// keys are all masked (as PyTorch's safe softmax). Shapes, strides, scale
// and mask layout are baked in as constants.
#pragma once

#include <cstdint>
#include <string>

#include "ops/attention_ops.h"

namespace kiln::ops {

constexpr int64_t kAttnMaxHeadDim = 128;
constexpr int64_t kAttnDecodeMaxRows = 8;

struct AttentionKernel {
  std::string source;
  uint32_t grid[3] = {1, 1, 1};
  uint32_t block = 32;
};

// Whether `plan` is decode-shaped (few rows, many keys): the decode variant.
bool attention_is_decode(const AttentionPlan& plan);

// Whether the tensor-core variant can run `plan` (dtype, head dims, strides).
bool attention_uses_mma(const AttentionPlan& plan);

// How many blocks a head's keys are split over (1: one block a head), for a
// decode-shaped plan: enough blocks to cover an H100-class GPU, at least
// kAttnSplitMinKeys keys each.
int64_t attention_decode_splits(const AttentionPlan& plan);
constexpr int64_t kAttnSplitMinKeys = 64;

// Kernel `name` with parameters (q, k, v, [mask], out), or (..., partials)
// when plan.splits > 1.
AttentionKernel generate_attention_kernel(const AttentionPlan& plan, const std::string& name);

// The combine kernel of a split plan: parameters (partials, out).
AttentionKernel generate_attention_combine_kernel(const AttentionPlan& plan, const std::string& name);

}  // namespace kiln::ops
