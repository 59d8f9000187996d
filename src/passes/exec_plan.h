// What the fusion pass hands to the later passes and to lowering: the
// graph's nodes grouped into the steps the engine will run (each a
// ops::PlannedOp that lowers itself), plus the views' storage aliases.
#pragma once

#include <map>
#include <vector>

#include "ir/graph.h"
#include "ops/step_plan.h"

namespace kiln::passes {

using ops::AffineMap;
using ops::ConvPlan;
using ops::DepthwisePlan;
using ops::GemmPlan;
using ops::PlannedOp;
using ops::PointwisePlan;
using ops::PoolPlan;
using ops::ReducePlan;

struct ExecPlan {
  std::vector<PlannedOp> ops;
  // value -> the value whose storage it reinterprets (views); resolved to the
  // root, so alias_of never maps to another alias.
  std::map<int, int> alias_of;

  int storage_of(int value) const {
    auto it = alias_of.find(value);
    return it == alias_of.end() ? value : it->second;
  }
};

// Per storage (value id): whether it must hold its values after the plan
// runs, as a graph output or a state's update.
std::vector<bool> kept_storage(const ir::Graph& graph, const ExecPlan& plan);

// The one step reading `storage` besides step `producer` and the steps
// `skip` marks (empty: none): its index; -1 when no step reads it, -2 when
// several do.
int sole_step_reader(const ExecPlan& plan, size_t producer, int storage, const std::vector<bool>& skip = {});

// Drops the steps `remove` marks (a pass that folded them into others).
void erase_steps(ExecPlan& plan, const std::vector<bool>& remove);

}  // namespace kiln::passes
