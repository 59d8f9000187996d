// Softmax and log-softmax over one dim (aten._softmax / aten._log_softmax),
// each one SoftmaxPlan, one generated kernel (softmax_kernel.h). PyTorch's
// "safe softmax" that exported attention wraps around _softmax (rows whose
// every input is -inf give 0, not NaN:
//   where(!any(!(x == -inf), dim), full_like(sm, 0), sm))
// is absorbed into the same kernel when the chain matches exactly; any other
// shape of it compiles node by node (any.dim, full_like, where).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ops/op_query.h"
#include "ops/step_plan.h"

namespace kiln::ops {

// out = softmax(input) over a dim of `length` elements: the input viewed as
// [outer, length, inner] (contiguous), rows are (outer, inner) pairs and a
// row's elements lie `inner` apart. log: log_softmax. safe: rows whose
// inputs are all -inf give 0 (the absorbed safe-softmax chain).
struct SoftmaxPlan : StepPlanBase<SoftmaxPlan> {
  int input = -1, out = -1;
  int64_t outer = 1, length = 1, inner = 1;
  bool log = false;
  bool safe = false;

  int64_t rows() const { return outer * inner; }
  std::vector<int> reads() const override { return {input}; }
  int writes() const override { return out; }
  void lower(LowerContext& ctx, engine::Step& step) const override;
};

// Empty when the compiler takes the node, else why not.
std::string check_softmax(const OpQuery& query);

// The plan of a _softmax/_log_softmax node (without the safe chain); throws
// CompileError when its attributes and shapes disagree.
SoftmaxPlan plan_softmax(const ir::Graph& graph, const ir::Node& node);

}  // namespace kiln::ops
