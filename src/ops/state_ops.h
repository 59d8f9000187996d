// In-place updates of mutable state (a KV cache): `aten.index_put` whose
// destination is a state value (ir::State) with one index tensor on one dim,
// as torch.export writes `cache.index_copy_(d, pos, x)` or
// `cache[:, :, pos] = x`. The step writes only the indexed slices, straight
// into the state's storage (the node's output aliases the state): no copy of
// the cache, ever. An index_put into anything else is refused (the
// partitioner leaves it to the CPU).
//
// Index range as the gathers (gather_ops.h): negative indices wrap once, the
// rest is clamped, so a bad position writes a wrong slice of the cache,
// never memory outside it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ops/grid_loop.h"
#include "ops/op_query.h"
#include "ops/step_plan.h"

namespace kiln::ops {

struct StateScatterPlan : StepPlanBase<StateScatterPlan>, GridLoopStep {
  int state = -1;   // the destination's storage (a state value)
  int out = -1;     // the node's output, an alias of `state`
  int index = -1;   // int64/int32 positions along `dim`, 1-D
  int values = -1;  // the state's shape with dim `dim` of the index's length
  int64_t dim = 0;
  // values read through the slices/permutes that made it (layout_ops.h
  // strided_source: k and v as columns of one merged projection); -1: itself
  int values_storage = -1;
  AffineMap values_map;
  // >= 0: the values are kiln.rotary(values, rotary_cos, rotary_sin)
  // (rotary_ops.h), computed here: the rotary planned no kernel of its own.
  int rotary_cos = -1, rotary_sin = -1;

  std::vector<int> reads() const override {
    std::vector<int> r{index, values_storage >= 0 ? values_storage : values};
    if (rotary_cos >= 0) r.insert(r.end(), {rotary_cos, rotary_sin});
    return r;
  }
  int writes() const override { return out; }
  void lower(LowerContext& ctx, engine::Step& step) const override;
  GridLoop grid_loop(LowerContext& ctx) const override;
};

// Empty when the compiler takes the node's shapes and attributes, else why not.
std::string check_index_put(const OpQuery& query);

// True when `node` is an index_put whose values (and only those) are `values`.
bool is_state_update_of(const ir::Graph& graph, int node, int values);

// Plans index_put `node` as the in-place update of a state: state, out,
// index, values (the node's own input, read contiguously) and dim. Throws
// CompileError naming the node when it is not such an update (its
// destination is not a state, or the state's old value has other readers).
StateScatterPlan plan_state_update(PlanContext& ctx, int node);

}  // namespace kiln::ops
