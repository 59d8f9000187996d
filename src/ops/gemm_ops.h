// Matrix products lowered to cuBLASLt: linear, addmm, mm, bmm (batched). The capability
// check lives here beside the lowering (passes/fuse.cpp builds GemmPlans from
// these nodes).
#pragma once

#include <string>

#include "ops/op_query.h"

namespace kiln::ops {

bool is_gemm_op(const std::string& op);

// Empty when the compiler takes the node, else why not.
std::string check_gemm(const OpQuery& query);

}  // namespace kiln::ops
