// Attention: softmax(Q K^T * scale + mask) V as one step that never writes
// the score matrix to memory (flash-attention style: key tiles streamed
// through shared memory, an online softmax kept in registers).
//
// Ops: aten.scaled_dot_product_attention.default (kept whole by the
// partitioner, see KEPT_WHEN_TAKEN in python/kiln/partitioner.py) and
// kiln.attention, the same node made by passes/fuse_attention.cpp from the
// unfused bmm -> scale -> mask -> softmax -> bmm pattern many models emit.
//
// Operands are read and the output written through strides, so the
// head split/merge permutes around attention cost nothing:
//  * passes/attention_layout.cpp replaces a q/k/v/mask operand reached
//    through views, permutes and expands by their root value and records the
//    strides ("<operand>_strides" attributes, element strides of the
//    operand's [batch, head, row] dims (mask: [batch, head, row, key]));
//  * planning absorbs a permute after the attention that only moves the head
//    dim (e.g. [B,H,L,D] -> [B,L,H,D]) by writing the permuted layout.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "ir/graph.h"
#include "ops/op_query.h"
#include "ops/step_plan.h"

namespace kiln::ops {

constexpr const char* kSdpaOp = "aten.scaled_dot_product_attention.default";
constexpr const char* kKilnAttentionOp = "kiln.attention";

bool is_attention_op(const std::string& op);

struct AttentionPlan : StepPlanBase<AttentionPlan> {
  enum class Mask { kNone, kAdditive, kBool };
  int q = -1, k = -1, v = -1, mask = -1, out = -1;
  engine::DType dtype = engine::DType::kFloat32;
  int64_t batch = 1, heads = 1, kv_heads = 1, rows = 1, keys = 1, head_dim = 1, value_dim = 1;
  // Element strides of [batch, head, row] (q, out) or [batch, kv head, key]
  // (k, v); the last dim is contiguous. A stride of 0 broadcasts.
  std::array<int64_t, 3> q_strides{}, k_strides{}, v_strides{}, out_strides{};
  // > 0: the output's rows are [blocks, out_row_block] with different
  // strides: row r is written at (r / out_row_block) * out_row_block_stride
  // + (r % out_row_block) * out_strides[2]. Grouped-query attention runs a
  // kv head's q heads as one block of rows ([group * tokens]); the heads
  // merge after it ([B, tokens, heads * D]) puts each back at its head.
  int64_t out_row_block = 0, out_row_block_stride = 0;
  // Where each operand starts inside its tensor (slices and selects read
  // through): q, k, v, mask, in elements.
  std::array<int64_t, 4> offsets{};
  Mask mask_kind = Mask::kNone;
  engine::DType dtype_mask = engine::DType::kBool;
  std::array<int64_t, 4> mask_strides{};  // [batch, head, row, key]
  bool causal = false;                     // key j <= row i (top-left aligned, as PyTorch)
  double scale = 1.0;
  // The tensor-core kernel may be used: every targeted SM is sm_80 or newer.
  bool tensor_cores = true;
  // Decode attention over many keys with few heads: the keys are split over
  // `splits` blocks a head, each writing its rows' (max, sum, unnormalized
  // output) to `partials` (float32 [batch, heads, splits, rows, value_dim +
  // 2]); an AttentionCombinePlan step then merges them into `out`.
  int64_t splits = 1;
  int partials = -1;
  // Decode attention with programmatic launch (OpOptions::overlap_launches):
  // each block prefetches its keys' and values' cache rows into L2, then
  // waits for its predecessor (attention_decode_kernel.cpp says why that is
  // safe while the predecessor writes the cache).
  bool prefetch_before_wait = false;

  std::vector<int> reads() const override;
  int writes() const override { return splits > 1 ? partials : out; }
  void lower(LowerContext& ctx, engine::Step& step) const override;
};

// The second step of a split decode attention: merges the splits' partial
// softmax states into the output (attention_kernel.cpp).
struct AttentionCombinePlan : StepPlanBase<AttentionCombinePlan> {
  AttentionPlan attention;  // its partials, out, strides and sizes

  std::vector<int> reads() const override { return {attention.partials}; }
  int writes() const override { return attention.out; }
  void lower(LowerContext& ctx, engine::Step& step) const override;
};

// Empty when the compiler takes the node, else why not.
std::string check_attention(const OpQuery& query);

// The plan of an attention node, its operands read as its attributes say
// (contiguous unless "<operand>_strides" is set). Throws CompileError when the
// shapes and attributes disagree.
AttentionPlan plan_attention(const ir::Graph& graph, const ir::Node& node);

}  // namespace kiln::ops
