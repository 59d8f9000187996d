// Planning of channels-last convolutions (kiln.conv2d_nhwc) for fuse.cpp:
// the conv absorbs a following per-channel bias add, a residual add of a
// same-shape tensor and a ReLU (engine::ConvStep's bias, z and activation).
// A 1x1, stride-1, unpadded, ungrouped conv over NHWC is the GEMM
// [n*h*w, c] x w[k, c]^T and becomes a cuBLASLt step with the same epilogues
// (residual through c with beta = 1). A strided 1x1 conv (resnet's
// downsample, 10-27 us each through cuDNN at batch 1 on an H200) becomes a
// strided gather kernel plus that GEMM (4-6 us each). KILN_CONV_GEMM=0 in the
// environment keeps every 1x1 conv on cuDNN, =unstrided the strided ones,
// for comparison.
#pragma once

#include <vector>

#include "ir/graph.h"
#include "passes/exec_plan.h"

namespace kiln::passes {

struct ConvFusion {
  std::vector<PlannedOp> before;  // run at the conv's own position, ahead of `op`
  PlannedOp op;
  std::vector<int> absorbed;  // node indices folded into the step (not the conv itself)
  int emit_at = -1;           // node index after which the step can run (z must exist)
};

// May add a reshaped bias constant to `graph`. `consumers[v]` lists the nodes reading value v; `is_output[v]` marks graph
// outputs; nodes already `absorbed` by another step are not taken again.
ConvFusion plan_conv(ir::Graph& graph, int node_index, const std::vector<std::vector<int>>& consumers,
                     const std::vector<bool>& is_output, const std::vector<bool>& absorbed);

// After fuse() unless KILN_DEPTHWISE_KERNEL=0 (read by the compiler):
// depthwise kConv steps (groups == c == k, no residual) become kDepthwise
// generated kernels, taking over the elementwise kernel that is the conv
// value's only reader as their epilogue. Adds [r,s,c] weight constants.
void plan_depthwise_kernels(ir::Graph& graph, ExecPlan& plan);

}  // namespace kiln::passes
