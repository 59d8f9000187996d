// Scans: aten.cumsum, the running sum along one dim. RoBERTa-family models
// number their positions with cumsum(mask) * mask + padding_idx, so their
// embeddings need it on the GPU.
//
// One thread a line (the elements along the dim at fixed other coordinates)
// walks its line in index order: element i is the sum of elements 0..i.
// As in PyTorch, each element is first converted to the output's kind (with
// cumsum's dtype, e.g. a float routing mask counted into int32 in Mixtral):
// an integer output sums exactly in 64-bit integers (int64, or int32
// wrapping as a cast does), floats truncated toward zero; a float output
// (float32, float16, bfloat16) sums in float, integers and bools converted,
// each element rounded once to the output dtype: as PyTorch's CUDA cumsum,
// which also sums float16/bfloat16 in float (its CPU cumsum sums float32 in
// double, so a long float32 line differs from CPU by float's rounding, about
// sqrt(length) * 2^-24 relative). A bool output stays on the CPU.
//
// Speed: consecutive threads take consecutive lines, so a scan over a
// leading or middle dim reads coalesced; a scan over the last dim of few
// rows (position ids: one row of the sequence length) runs one thread per
// row. A block-wide scan for that case waits for a measurement that needs
// it (docs/engineering_practice.md, item 12).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ops/op_query.h"
#include "ops/step_plan.h"

namespace kiln::ops {

// The input as [outer, len, inner] (row-major), summed over len: line l
// (l < outer * inner) is the elements (l / inner) * len * inner + i * inner
// + l % inner, i < len.
struct CumsumPlan : StepPlanBase<CumsumPlan> {
  int input = -1, out = -1;
  int64_t outer = 1, len = 1, inner = 1;

  std::vector<int> reads() const override { return {input}; }
  int writes() const override { return out; }
  void lower(LowerContext& ctx, engine::Step& step) const override;
};

// Threads a block of the scan kernel (one line each).
constexpr unsigned kScanBlock = 256;

// Empty when the compiler takes the cumsum node, else why not (the dtype
// pairing, the dim, the shapes).
std::string check_cumsum(const OpQuery& query);

}  // namespace kiln::ops
