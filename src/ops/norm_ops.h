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

}  // namespace kiln::ops
