// Ops that only reinterpret a contiguous tensor (view, reshape, squeeze,
// unsqueeze) and ops that reorder constants (permute, t, transpose), which the
// compiler folds at export time.
#pragma once

#include <string>

namespace kiln::ops {

// Pure reinterpretations: the output aliases the input's storage.
bool is_view_op(const std::string& op);

// Dimension reorders the compiler supports on constants only (folded).
bool is_constant_permute_op(const std::string& op);

}  // namespace kiln::ops
