// kiln.rotary: rotary position embedding in Hugging Face's rotate_half form,
//   out = x * cos + cat(-x[..., h:], x[..., :h], -1) * sin,   h = x.shape[-1] / 2
// as one generated kernel (passes/fuse_rotary.cpp makes the node from those
// five ops: slice, slice, neg, cat and the multiply-add, each a launch).
// cos and sin broadcast to x's shape; math in float, one rounding at the end.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"
#include "ops/grid_loop.h"
#include "ops/step_plan.h"

namespace kiln::ops {

constexpr const char* kKilnRotaryOp = "kiln.rotary";

struct RotaryPlan : StepPlanBase<RotaryPlan>, GridLoopStep {
  int x = -1, cos = -1, sin = -1, out = -1;
  // x read through the slices/permutes that made it (layout_ops.h
  // strided_source: q and k as columns of one merged projection); -1: x itself
  int x_storage = -1;
  AffineMap x_map;

  std::vector<int> reads() const override { return {x_storage >= 0 ? x_storage : x, cos, sin}; }
  int writes() const override { return out; }
  void lower(LowerContext& ctx, engine::Step& step) const override;
  GridLoop grid_loop(LowerContext& ctx) const override;
};

// Kernel code defining `const float v`, the rotary of element `i` (a long
// long index into `out_shape`, the rotary's output shape), reading x (or its
// strided source `x_storage` through `x_map` when x_storage >= 0), cos and
// sin through the kernel's pointers `x`, `cs` and `sn`. Shared by the rotary
// kernel and the cache update that absorbs a rotary (state_ops.h).
std::string rotary_value_code(const ir::Graph& g, int x, int cos, int sin, int x_storage, const AffineMap& x_map,
                              const std::vector<int64_t>& out_shape, const std::string& indent);

}  // namespace kiln::ops
