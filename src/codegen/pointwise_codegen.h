// Generates the CUDA source of one fused elementwise kernel. Shapes are baked
// in as constants, so broadcast indexing divides by compile-time numbers.
// Loads convert any float dtype to float, math runs in float, the store
// converts to the output dtype.
#pragma once

#include <string>

#include "ir/graph.h"
#include "passes/exec_plan.h"

namespace kiln::codegen {

constexpr unsigned kPointwiseBlock = 256;

// Helpers every generated module starts with (dtype conversion, activations).
std::string pointwise_prelude();

// Kernel `name` with parameters (out, inputs..., long long n), in that order.
std::string generate_pointwise_kernel(const ir::Graph& graph, const passes::PointwisePlan& plan,
                                      const std::string& name);

}  // namespace kiln::codegen
