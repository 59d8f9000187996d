// Generates the kernel of a SoftmaxPlan. Accumulates in float; the row max
// is subtracted before exp. Forms:
//  * contiguous rows (inner == 1): a group of threads owns a row, the
//    smallest of 32, 64, ..., 1024 threads that leaves each at most
//    kSoftmaxTargetPerThread elements; a warp-sized group is one warp
//    (shuffles only, kSoftmaxWarpRowsPerBlock rows a block), a larger one
//    the whole block. Rows of at most kSoftmaxMaxCachedPerThread elements a
//    thread stay in registers (max, then sum of exp, then store: one read,
//    one write), loaded 16 bytes at a time where the row length allows, with
//    a scalar path for misaligned device-resident tensors. Longer rows
//    stream: an online (max, sum) per thread, one combination, a second
//    read to write;
//  * strided rows (softmax over a non-last dim, inner > 1): a block of 32 x
//    Y threads takes 32 neighbouring rows (coalesced loads across threads);
//    its Y thread rows split the row's elements, keep an online (max, sum)
//    each and combine them through shared memory, then write.
#pragma once

#include <cstdint>
#include <string>

#include "ops/softmax_ops.h"

namespace kiln::ops {

constexpr int64_t kSoftmaxMaxThreadsPerRow = 1024;
constexpr int64_t kSoftmaxTargetPerThread = 8;
constexpr int64_t kSoftmaxMaxCachedPerThread = 32;
constexpr int64_t kSoftmaxWarpRowsPerBlock = 4;

struct SoftmaxLaunch {
  bool strided = false;
  int64_t threads_per_row = 32;  // contiguous form
  int64_t rows_per_block = 1;
  int64_t per_thread = 1;        // elements a thread holds (cached) or walks
  bool cached = true;
  int64_t vector = 1;            // elements a load/store, 1: scalars
  uint32_t grid = 1, block_x = 32, block_y = 1;  // the strided form: 32 x (block_x / 32), flat
};

// The launch of `plan` with elements of `elem_bytes` (the wider of input and
// output); threads_per_row (power of two, 32..1024, contiguous form only)
// and vector (0: widest allowed) override the choice, for tests.
SoftmaxLaunch softmax_launch(const SoftmaxPlan& plan, size_t elem_bytes, int64_t threads_per_row = 0,
                             int64_t vector = 0);

struct SoftmaxKernel {
  std::string source;
  SoftmaxLaunch launch;
};

// Kernel `name` with parameters (out, in, long long n), n = the element count.
SoftmaxKernel generate_softmax_kernel(const ir::Graph& graph, const SoftmaxPlan& plan, const std::string& name,
                                      int64_t threads_per_row = 0, int64_t vector = 0);

}  // namespace kiln::ops
