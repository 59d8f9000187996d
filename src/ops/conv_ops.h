// Convolution and batch norm: the capability checks (op_support.cpp asks
// them) and the attribute normalization the passes share. A 2-D convolution
// becomes a channels-last "kiln.conv2d_nhwc" node (passes/channels_last.cpp),
// lowered to a cuDNN ConvStep or, for 1x1 stride-1 convolutions, a cuBLASLt
// GEMM (passes/fuse_conv.cpp). Batch norm folds into the convolution before
// it (passes/fold_batch_norm.cpp) or becomes a per-channel multiply-add.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "ops/op_query.h"
#include "ir/graph.h"

namespace kiln::ops {

constexpr const char* kConvNhwc = "kiln.conv2d_nhwc";
constexpr const char* kBatchNorm = "aten._native_batch_norm_legit_no_training.default";

bool is_conv_op(const std::string& op);        // aten.convolution.default / conv2d
bool is_batch_norm_op(const std::string& op);  // inference batch norm

// Empty when the compiler takes the node, else why not.
std::string check_conv(const OpQuery& query);
std::string check_batch_norm(const OpQuery& query);

// A 2-D convolution's hyper-parameters, from an ATen convolution node or a
// kiln.conv2d_nhwc node (same attribute names).
struct ConvParams {
  std::array<int64_t, 2> stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;
};
ConvParams conv_params(const ir::Node& node);

// Output extent of a convolution along one dimension (floor rule).
int64_t conv_output_size(int64_t in, int64_t kernel, int64_t pad, int64_t stride, int64_t dilation);

}  // namespace kiln::ops
