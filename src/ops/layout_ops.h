// Ops that move elements without arithmetic: permute/transpose of
// activations, slice, select, cat and split. Each becomes one or more layout
// kernels (an affine read and an affine write, see passes/exec_plan.h).
#pragma once

#include <string>
#include <vector>

#include "ops/op_query.h"
#include "ir/graph.h"
#include "ops/step_plan.h"

namespace kiln::ops {

bool is_layout_op(const std::string& op);

// Empty when the compiler takes the node, else why not.
std::string check_layout(const OpQuery& query);

// The layout kernels computing `node` (cat and split give one per piece).
std::vector<PointwisePlan> plan_layout(const ir::Graph& graph, const ir::Node& node);

}  // namespace kiln::ops
