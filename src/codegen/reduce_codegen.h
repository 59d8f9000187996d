// Generates a reduction kernel: one warp per output element, lanes stride
// over the reduced elements, a shuffle tree combines them. Accumulates in
// float; shapes are baked in as constants.
#pragma once

#include <string>

#include "ir/graph.h"
#include "passes/exec_plan.h"

namespace kiln::codegen {

constexpr unsigned kReduceBlock = 256;  // 8 warps: 8 output elements per block
constexpr unsigned kReduceOutputsPerBlock = kReduceBlock / 32;

// Kernel `name` with parameters (out, in, long long n_out).
std::string generate_reduce_kernel(const ir::Graph& graph, const passes::ReducePlan& plan, const std::string& name);

}  // namespace kiln::codegen
