// Reductions: sum, mean and amax over a list of dimensions. Each becomes one
// generated kernel (codegen/reduce_codegen.h).
#pragma once

#include <string>

#include "ops/op_query.h"
#include "ir/graph.h"
#include "ops/step_plan.h"

namespace kiln::ops {

bool is_reduce_op(const std::string& op);

// Empty when the compiler takes the node, else why not.
std::string check_reduce(const OpQuery& query);

ReducePlan plan_reduce(const ir::Graph& graph, const ir::Node& node);

}  // namespace kiln::ops
