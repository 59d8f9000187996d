// Generates a channels-last depthwise convolution kernel (groups == c == k,
// channel multiplier 1) with the bias, the conv's ReLU and a following
// elementwise chain fused as an epilogue: one thread per (n, p, q, channel
// vector), channels innermost so a warp reads contiguous bytes of x and of
// the [r, s, c] weight. Shapes and the window are baked in as constants;
// loads widen to float, the conv accumulates in float, its value is rounded
// to the conv's dtype (what a separate epilogue kernel would have read), the
// chain runs in float and the store narrows to the output's dtype.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ops/step_plan.h"

namespace kiln::ops {

constexpr unsigned kDepthwiseBlock = 256;
constexpr int64_t kDepthwiseMaxVector = 4;  // channels per thread (4 floats = 16 B, 4 halves = 8 B)

struct DepthwiseKernel {
  std::string source;  // needs pointwise_prelude() before it in the module
  // Tensor parameters in order (out, x, weight, [bias], epilogue inputs...),
  // then one long long: `n`, the number of output elements.
  std::vector<int> tensor_args;
  int64_t n = 0;
  int64_t vector = 1;  // channels per thread when every pointer is aligned
  uint32_t grid = 1, block = kDepthwiseBlock;
};

// True when the epilogue can read `operand` next to a conv output of shape
// `out` (one value, one per channel, or one per output element).
bool depthwise_epilogue_operand_ok(const std::vector<int64_t>& operand, const std::vector<int64_t>& out);

// Kernel `name`; throws CompileError for plans it cannot generate.
DepthwiseKernel generate_depthwise_kernel(const ir::Graph& graph, const DepthwisePlan& plan,
                                          const std::string& name);

}  // namespace kiln::ops
