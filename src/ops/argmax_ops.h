// aten.argmax: the index of the largest element along one dim (or over the
// whole tensor when dim is None), int64, one generated kernel. Greedy
// decoding uses it so that one int64 per token leaves the GPU instead of
// the vocabulary's logits. As PyTorch: the first index of the maximum wins
// ties, and NaN counts as larger than any number.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ops/op_query.h"
#include "ops/step_plan.h"

namespace kiln::ops {

// The input as [outer, reduced, inner] (row-major): output element o reads
// input[(o / inner) * reduced * inner + r * inner + o % inner], r < reduced.
struct ArgmaxPlan : StepPlanBase<ArgmaxPlan> {
  int input = -1;
  int out = -1;
  int64_t outer = 1, reduced = 1, inner = 1;

  std::vector<int> reads() const override { return {input}; }
  int writes() const override { return out; }
  void lower(LowerContext& ctx, engine::Step& step) const override;
};

// Empty when the compiler takes the node, else why not.
std::string check_argmax(const OpQuery& query);

}  // namespace kiln::ops
