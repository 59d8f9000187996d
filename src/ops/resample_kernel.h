// Generates the resample / pad gather kernel of a ResamplePlan: one thread
// per output element (grid-stride loop over row-major output indices), its
// source coordinates computed with PyTorch's formulas, shapes and scales
// baked in as constants (scales as exact float bit patterns); loads widen to
// float, math in float, the store narrows.
#pragma once

#include <cstdint>
#include <string>

#include "ir/graph.h"
#include "ops/resample_ops.h"

namespace kiln::ops {

constexpr unsigned kResampleBlock = 256;

// Blocks for `n` output elements (at least 1, at most 65536).
uint32_t resample_grid(int64_t n);

// Kernel `name` with parameters (out, in, long long n_out).
std::string generate_resample_kernel(const ir::Graph& graph, const ResamplePlan& plan, const std::string& name);

}  // namespace kiln::ops
