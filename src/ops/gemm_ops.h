// Matrix products lowered to cuBLASLt: linear, addmm, mm, bmm (batched). The capability
// check lives here beside the lowering (passes/fuse.cpp builds GemmPlans from
// these nodes).
#pragma once

#include <string>

#include "ops/op_query.h"
#include "ops/step_plan.h"

namespace kiln::ops {

bool is_gemm_op(const std::string& op);

// Empty when the compiler takes the node, else why not.
std::string check_gemm(const OpQuery& query);

// Plans `gemm_node`, an aten.linear reading the output of the RMSNorm `norm`
// (nothing else reads it), as one matrix-vector kernel that normalizes its
// rows first (GemmPlan::rms_norm), absorbing the linear; false, planning
// nothing, when the product is not a matrix-vector kernel of those rows
// (then the norm plans its own kernel). A decode step's RMSNorm -> q|k|v and
// RMSNorm -> gate|up: one kernel each instead of two.
bool plan_gemm_after_rms_norm(PlanContext& ctx, int gemm_node, const NormPlan& norm);

}  // namespace kiln::ops
