// Normalizations over rows: layer norm (aten.native_layer_norm), group norm
// (aten.native_group_norm) and batch norm on batch statistics
// (aten._native_batch_norm_legit.no_stats, what torch.export makes of
// nn.InstanceNorm2d: a [1, n*c, h, w] view normalized per channel). Each is
// one NormPlan, one generated kernel (norm_kernel.h). Of their three outputs
// Kiln computes output 0; the saved statistics are refused when used
// (OpDef::first_output_only).
//
// Where the input is channels-last (the output of a convolution), the
// channels-last pass (passes/channels_last.cpp) turns the node into its
// "kiln.<op>_nhwc" form with the same attributes and inputs: the input and
// output are the NHWC [n,h,w,c] tensors and the attributes still speak of
// the NCHW op, so the plan reads the same elements with NHWC strides and no
// layout kernel is needed.
#pragma once

#include <string>

#include "ir/graph.h"
#include "ops/op_query.h"
#include "ops/step_plan.h"

namespace kiln::ops {

bool is_norm_op(const std::string& op);       // the ATen ops above
bool is_nhwc_norm_op(const std::string& op);  // their kiln.*_nhwc forms
std::string nhwc_norm_op(const std::string& aten_op);

// Whether the channels-last pass should run `node` (an ATen norm whose 4-D
// input has an NHWC form) on the NHWC tensor: true unless that would read
// rows with strided loads (a layer norm over the trailing w or h, w only).
bool norm_prefers_nhwc(const ir::Node& node);

// Empty when the compiler takes the node, else why not.
std::string check_norm(const OpQuery& query);

// The plan of a norm node (ATen or kiln.*_nhwc); throws CompileError when its
// attributes and shapes disagree.
NormPlan plan_norm(const ir::Graph& graph, const ir::Node& node);

// RMS normalization over the last dim, the row kernel of NormPlan with the
// mean held at 0: out = x * rsqrt(mean(x^2) + eps) * weight (`norm.bias`
// unused).
struct RmsNormPlan : StepPlanBase<RmsNormPlan> {
  NormPlan norm;

  std::vector<int> reads() const override { return norm.reads(); }
  int writes() const override { return norm.out; }
  void lower(LowerContext& ctx, engine::Step& step) const override;
};

// At a mean.dim node: recognizes the RMSNorm torch.export writes out (HF
// Llama's LlamaRMSNorm, nn.RMSNorm):
//   [a = cast(x)]  sq = pow(a, 2) | mul(a, a)  m = mean(sq, -1, keepdim)
//   r = rsqrt(add(m, eps))  y = mul(a, r) | mul(r, a)  [y = cast(y)]
//   [y = mul(weight, y) | mul(y, weight)]
// every intermediate read only by the next. Emits one RmsNormPlan step
// (absorbing add..mul; the pow and the leading cast are left unread and
// dropped by fusion) and returns true; false, planning nothing, when the
// chain does not match.
bool plan_rms_norm(PlanContext& ctx, int mean_node);

// Whether value `v`, read by a cast the caller is about to bypass, was
// written to memory by an earlier step (fusion keeps an elementwise value
// whose only reader is elementwise inside that reader's kernel), so a later
// step may read it instead of the cast's result.
bool stored_before(PlanContext& ctx, int v);

}  // namespace kiln::ops
