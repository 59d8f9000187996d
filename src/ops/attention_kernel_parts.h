// Pieces the attention kernel generators share (attention_kernel.cpp: the
// tensor-core and SIMT kernels; attention_decode_kernel.cpp: the decode
// kernels). Internal to src/ops; attention_kernel.h is the interface.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "codegen/cuda_dtype.h"
#include "ops/attention_kernel.h"

namespace kiln::ops::attention_detail {

constexpr double kLog2e = 1.4426950408889634;

// CUDA helpers every attention kernel of a module uses, guarded to be emitted once.
extern const char* const kHelpers;

using codegen::ll;

// The mask's contribution to score (row, key), in base-2 units, as
// statements updating float `x` (both in range).
std::string mask_update(const AttentionPlan& p, const std::string& row, const std::string& key);

// Shared prologue: block coordinates and the base pointers of this
// (batch, head).
void emit_bases(std::ostream& s, const AttentionPlan& p);

// The element offset of output row `row` (an expression) from the head's base.
std::string out_row_offset(const AttentionPlan& p, const std::string& row);

// The kernel's signature, up to its body.
std::string signature(const AttentionPlan& p, const std::string& name, int threads);

// The decode variant's kernel (attention_decode_kernel.cpp).
void emit_decode(std::ostream& s, const AttentionPlan& p, const std::string& name, AttentionKernel& k);

}  // namespace kiln::ops::attention_detail
