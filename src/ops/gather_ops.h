// Gathers: embedding, index_select, gather and index.Tensor (advanced
// indexing with one or more index tensors, broadcast together). All four are
// one plan, GatherPlan: every data dim's coordinate is either an output
// coordinate or an element of an index tensor read at an affine offset of
// the output coordinates; one generated kernel (gather_kernel.h) computes it.
//
// Index range: PyTorch raises on an out-of-range index; a GPU kernel cannot,
// so negative indices wrap once (index.Tensor's semantics: i + size) and
// anything still outside [0, size) is clamped to the nearest edge. A bad
// index therefore reads a wrong row of the data, never memory outside it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ops/op_query.h"
#include "ops/step_plan.h"

namespace kiln::ops {

struct GatherIndex {
  int value = -1;   // an int64 or int32 index tensor
  AffineMap map;    // its element offset, over the output coordinates
};

// out[o] = data[c_0(o), ..., c_{n-1}(o)], c_s = o[source[s]] when source[s]
// >= 0, else the value of indices[-source[s] - 1] at its map(o) (wrapped and
// clamped into [0, data.shape[s])).
struct GatherPlan : StepPlanBase<GatherPlan> {
  int data = -1, out = -1;
  std::vector<GatherIndex> indices;
  std::vector<int> source;  // one per data dim

  std::vector<int> reads() const override;
  int writes() const override { return out; }
  void lower(LowerContext& ctx, engine::Step& step) const override;
};

bool is_gather_op(const std::string& op);

// Empty when the compiler takes the node, else why not.
std::string check_gather(const OpQuery& query);

// The plan of a node; throws CompileError when its attributes and shapes do
// not agree.
GatherPlan plan_gather(const ir::Graph& graph, const ir::Node& node);

}  // namespace kiln::ops
