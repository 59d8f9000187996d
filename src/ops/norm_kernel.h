// Generates the row-normalization kernel of a NormPlan (layer norm, group
// norm, batch norm on batch statistics). A group of threads owns one row:
//  * threads per row: the smallest of 32, 64, ..., 1024 that leaves each
//    thread at most 8 elements (1024 past 8192 elements);
//  * rows of at most 32 elements a thread are held in registers: each
//    thread's count, mean and M2 over its values (two passes over the
//    registers), combined across the row in one round (Chan), then
//    normalize and store: one read, one write. Where the row's innermost
//    dim is contiguous, loads and stores move 16 bytes (4 floats, 8 halves)
//    at a time, with a scalar path for misaligned device-resident tensors;
//  * longer rows (over 32768 elements, e.g. a group norm of 16+ channels a
//    group over 56x56 maps) stream: Welford per thread, the same
//    combination, then a second read to normalize;
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
constexpr int64_t kNormMaxCachedPerThread = 32;
constexpr int64_t kNormWarpRowsPerBlock = 4;  // rows of one warp each, per block

struct NormLaunch {
  int64_t threads_per_row = 32;
  int64_t rows_per_block = 1;
  int64_t per_thread = 1;  // elements a thread holds (cached) or walks (streaming), at most
  bool cached = true;
  int64_t vector = 1;  // elements a load/store (cached rows over contiguous elements), 1: scalars
  uint32_t grid = 1, block = 32;
};

// The launch shape for `rows` rows of `row_size` elements; threads_per_row
// (a power of two, 32..1024) overrides the choice (0: choose), for tests
// that run both the warp and the block forms.
NormLaunch norm_launch(int64_t rows, int64_t row_size, int64_t threads_per_row = 0, int64_t vector = 1);

// The widest vector (elements, 16 bytes at most) the plan's rows allow: the
// innermost element dim contiguous and a multiple of it, every other offset
// a multiple of it. 1 when none.
int64_t norm_vector_width(const ir::Graph& graph, const NormPlan& plan);

struct NormKernel {
  std::string source;
  NormLaunch launch;
};

// Kernel `name` with parameters (out, in, [weight], [bias], long long n),
// n = the output's element count (rows = n / row size).
// threads_per_row and vector (0: choose; a vector wider than the plan
// allows is narrowed) are for tests and measurements. rms: RMS
// normalization (no mean subtracted: out = x * rsqrt(mean(x^2) + eps) *
// weight + bias), the same kernel with the row mean held at 0.
NormKernel generate_norm_kernel(const ir::Graph& graph, const NormPlan& plan, const std::string& name,
                                int64_t threads_per_row = 0, int64_t vector = 0, bool rms = false);

}  // namespace kiln::ops
