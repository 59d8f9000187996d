// Transposed convolution (aten.convolution.default with transposed=True, 1-D
// and 2-D; a 1-D one is a 2-D one of height 1). The channels-last pass
// (passes/channels_last.cpp) rewrites it into "kiln.conv_transpose2d_nhwc":
//   inputs  x [n, h, w, c] (NHWC), weight [r, s, c, k/groups] (the ATen
//           weight [c, k/groups, r, s] permuted at export), optional bias [k];
//   attrs   stride, padding, dilation, output_padding (two integers each), groups;
//   output  [n, p, q, k] with p = (h-1)*stride - 2*pad + dilation*(r-1) + output_padding + 1.
// It plans one generated kernel (conv_transpose_kernel.cpp) that absorbs a
// following ReLU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ops/step_plan.h"

namespace kiln::ops {

constexpr const char* kConvTransposeNhwc = "kiln.conv_transpose2d_nhwc";
constexpr unsigned kConvTransposeBlock = 256;

// out = act(conv_transpose(x, weight) + bias), channels-last.
struct ConvTransposePlan : StepPlanBase<ConvTransposePlan> {
  int x = -1, w = -1, bias = -1, out = -1;
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dilation_h = 1, dilation_w = 1, groups = 1;
  bool relu = false;

  std::vector<int> reads() const override;
  int writes() const override { return out; }
  void lower(LowerContext& ctx, engine::Step& step) const override;
};

struct ConvTransposeKernel {
  std::string source;  // needs pointwise_prelude() before it in the module
  // Tensor parameters in order (out, x, weight, [bias]), then one long long:
  // `n`, the number of output elements.
  std::vector<int> tensor_args;
  int64_t n = 0;
  uint32_t grid = 1, block = kConvTransposeBlock;
};

// Kernel `name`: one thread per output element (a grid-stride loop), channels
// innermost; each sums over its group's input channels and the taps whose
// source position (o + pad - tap*dilation) is a multiple of the stride and in
// range. Loads widen to float, accumulation in float, the store narrows.
ConvTransposeKernel generate_conv_transpose_kernel(const ir::Graph& graph, const ConvTransposePlan& plan,
                                                   const std::string& name);

}  // namespace kiln::ops
