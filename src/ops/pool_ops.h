// 2-D pooling: max_pool2d (with or without indices; indices are not
// computed), avg_pool2d and adaptive_avg_pool2d. The channels-last pass
// (passes/channels_last.cpp) turns each into a "kiln.<op>_nhwc" node with the
// same attributes; plan_pool reads those into a PoolPlan for the generated
// kernel (pool_kernel.h).
#pragma once

#include <cstdint>
#include <string>

#include "ops/op_query.h"
#include "ir/graph.h"
#include "ops/step_plan.h"

namespace kiln::ops {

bool is_pool_op(const std::string& op);       // the ATen pooling ops
bool is_nhwc_pool_op(const std::string& op);  // their kiln.*_nhwc forms
std::string nhwc_pool_op(const std::string& aten_op);

// Empty when the compiler takes the node, else why not.
std::string check_pool(const OpQuery& query);

// Output extent of a pooling window along one dimension, PyTorch's rule
// (ceil_mode drops a last window that would start in the right padding).
int64_t pool_output_size(int64_t in, int64_t kernel, int64_t pad, int64_t stride, int64_t dilation, bool ceil_mode);

// The plan of a kiln.*_nhwc pooling node ([n,h,w,c] -> [n,p,q,c]); throws
// CompileError when its attributes or shapes do not agree.
PoolPlan plan_pool(const ir::Graph& graph, const ir::Node& node);

}  // namespace kiln::ops
