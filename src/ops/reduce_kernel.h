// Generates a reduction kernel. Accumulates in float; shapes are baked in as
// constants. Two forms:
//  * row: one warp per output element, lanes stride over the reduced
//    elements, a shuffle tree combines them (reduced dims innermost);
//  * column: when the reduced dims are one block with >= 16 kept elements
//    inside it (e.g. mean over h, w of NHWC [n, h, w, c]), each thread owns
//    one inner element (a channel), so a warp reads 32 neighbouring values;
//    8 thread rows split the reduced extent and combine in shared memory.
#pragma once

#include <string>

#include "ir/graph.h"
#include "ops/step_plan.h"

namespace kiln::ops {

constexpr unsigned kReduceBlock = 256;  // 8 warps: 8 output elements per block
constexpr unsigned kReduceOutputsPerBlock = kReduceBlock / 32;

struct ReduceKernel {
  std::string source;
  uint32_t grid[3] = {1, 1, 1};
  uint32_t block[3] = {1, 1, 1};
};

// The [outer, reduced, inner] view of `shape` that the column form uses (the
// reduced dims adjacent, inner >= 16, outer within one grid dimension); false
// when the row form applies.
bool reduce_column_shape(const std::vector<int64_t>& shape, const std::vector<int64_t>& dims, int64_t& outer,
                         int64_t& reduced, int64_t& inner);

// Blocks of the column form: 32 inner elements per block, per outer index.
inline int64_t reduce_column_blocks(int64_t outer, int64_t inner) { return (inner + 31) / 32 * outer; }

// Kernel `name` with parameters (out, in, long long n_out).
ReduceKernel generate_reduce_kernel(const ir::Graph& graph, const ReducePlan& plan, const std::string& name);

}  // namespace kiln::ops
