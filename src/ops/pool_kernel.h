// Generates a channels-last pooling kernel (max, average, adaptive average)
// over [n, h, w, c] -> [n, p, q, c]: one thread per output element, channels
// innermost so neighbouring threads read neighbouring bytes. Shapes and the
// window are baked in as constants; math in float.
#pragma once

#include <string>

#include "ir/graph.h"
#include "ops/step_plan.h"

namespace kiln::ops {

constexpr unsigned kPoolBlock = 256;

// Kernel `name` with parameters (out, in, long long n_out); a grid-stride
// loop over the output elements.
std::string generate_pool_kernel(const ir::Graph& graph, const PoolPlan& plan, const std::string& name);

}  // namespace kiln::ops
