// Generates the row-normalization kernel of a NormPlan (layer norm, group
// norm, batch norm on batch statistics). A group of threads owns one row:
//  * threads per row: the smallest of 32, 64, ..., 1024 that leaves each
//    thread at most 8 elements (1024 past 8192 elements);
//  * rows of at most 16 elements a thread are held in registers: the sum
//    (mean), then the sum of squared deviations (variance) over the held
//    values, then normalize and store: one read, one write;
//  * longer rows (over 16384 elements, e.g. a group norm of 8+ channels a
//    group over 56x56 maps) stream: Welford per thread, combined across the
//    group, then a second read to normalize;
//  * a group of 32 threads is one warp (shuffles only) and a block holds
//    kNormWarpRowsPerBlock such rows; a larger group is the whole block (one
//    block per row; warp shuffles, then the warps' partials through shared
//    memory).
// Math in float; shapes, offsets and eps are baked in as constants.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ops/step_plan.h"

namespace kiln::ops {

constexpr int64_t kNormMaxThreadsPerRow = 1024;
constexpr int64_t kNormTargetPerThread = 8;   // elements a thread, when the row allows
constexpr int64_t kNormMaxCachedPerThread = 16;
constexpr int64_t kNormWarpRowsPerBlock = 4;  // rows of one warp each, per block

struct NormLaunch {
  int64_t threads_per_row = 32;
  int64_t rows_per_block = 1;
  int64_t per_thread = 1;  // elements a thread holds (cached) or walks (streaming), at most
  bool cached = true;
  uint32_t grid = 1, block = 32;
};

// The launch shape for `rows` rows of `row_size` elements.
NormLaunch norm_launch(int64_t rows, int64_t row_size);

struct NormKernel {
  std::string source;
  NormLaunch launch;
};

// Kernel `name` with parameters (out, in, [weight], [bias], long long n),
// n = the output's element count (rows = n / row size).
NormKernel generate_norm_kernel(const ir::Graph& graph, const NormPlan& plan, const std::string& name);

}  // namespace kiln::ops
