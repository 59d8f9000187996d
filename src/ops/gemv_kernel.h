// Matrix-vector products as one generated kernel: a linear (or mm with a
// constant, pre-transposed right operand) over at most kGemvMaxRows rows of
// activations, as in a language model's decode step. At these shapes
// cuBLASLt tiles the weight into a handful of blocks (n / 128 of them) and
// the product is latency-bound; here one warp owns one output column, reads
// its weight row once in 16-byte vectors (all of a chunk's loads in flight
// before any product), and a row's bias, residual addend (C) and ReLU are
// applied before the one store. A plain product with few columns (no norm
// prologue, no pair) takes a wide shape instead: four columns a warp, each
// row split over four warps whose partial sums meet in shared memory. Chosen at planning (gemm_ops.cpp) when
// OpOptions::gemv_kernels is on and gemv_applies() holds. With GemmPlan::early_weights (a constant
// weight, programmatic launch) each lane's first group of weight loads comes before the kernel's
// grid-dependency wait (codegen/grid_dependency.h). With GemmPlan::loop_members (a decode layer's
// q|k|v: q's rotary and the k and v cache writes) a warp computes a column and its partner half a
// head away and runs the members' iterations of both; its successor is triggered after the products.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine_format/engine_desc.h"
#include "ir/graph.h"

namespace kiln::ops {

struct GemmPlan;
struct GridLoop;

constexpr int64_t kGemvMaxRows = 4;

// Whether a product of `dtype` with these sizes and epilogue is one the
// kernel computes: batch 1, B in nn.Linear's [n, k] layout, alpha 1, beta 0
// or 1 (a residual addend), at most kGemvMaxRows rows and k a whole number of
// 16-byte vectors, at least 16 of them.
bool gemv_applies(const GemmPlan& plan, engine::DType dtype);

struct GemvKernel {
  std::string source;
  uint32_t grid = 1;
  uint32_t block = 1;
};

// The kernel `name`: out[m, n] = act(x[m, :] . w[n, :] + bias[n] + c[m, n]);
// parameters (out, x, w[, bias][, c][, nw]) in that order. With
// plan.rms_norm, x[m, :] is first normalized: x * rsqrt(mean(x^2) + eps),
// times nw (of `norm_weight_dtype`) when plan.norm_weight is set.
// With plan.paired (`graph` given), a warp computes columns j and j + n/2
// and stores the elementwise epilogue plan.pair_nodes of the two (as the
// dtype stores them) into out[m, n/2] (out's dtype: the epilogue's).
// With `loops` (the plan's loop_members' grid loops, in order), a warp
// computes columns c and c + plan.loop_half, stores both, and runs the
// members' iterations of those columns; their parameters follow the
// kernel's own, member j's named m<j>_<name>.
GemvKernel generate_gemv_kernel(const GemmPlan& plan, engine::DType dtype, const std::string& name,
                                engine::DType norm_weight_dtype = engine::DType::kFloat32,
                                const ir::Graph* graph = nullptr, const std::vector<GridLoop>* loops = nullptr);

}  // namespace kiln::ops
