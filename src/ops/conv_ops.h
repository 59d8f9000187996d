// Convolution and batch norm: the capability checks (op_support.cpp asks
// them) and the attribute normalization the passes share. A 2-D convolution
// (and a 1-D one, as a 2-D convolution of height 1) becomes a channels-last
// "kiln.conv2d_nhwc" node (passes/channels_last.cpp), a transposed one a
// "kiln.conv_transpose2d_nhwc" node (conv_transpose_ops.h);
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
// kiln.conv2d_nhwc / kiln.conv_transpose2d_nhwc node (same attribute names).
// A single value is repeated (read a 1-D convolution's from index 1).
struct ConvParams {
  std::array<int64_t, 2> stride{1, 1}, padding{0, 0}, dilation{1, 1}, output_padding{0, 0};
  int64_t groups = 1;
  bool transposed = false;
};
ConvParams conv_params(const ir::Node& node);

// Output extent of a convolution along one dimension (floor rule).
int64_t conv_output_size(int64_t in, int64_t kernel, int64_t pad, int64_t stride, int64_t dilation);
// Output extent of a transposed convolution along one dimension.
int64_t conv_transpose_output_size(int64_t in, int64_t kernel, int64_t pad, int64_t stride, int64_t dilation,
                                   int64_t output_padding);

}  // namespace kiln::ops
