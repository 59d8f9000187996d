// The CUDA spellings shared by the kernel generators: storage types, loads
// that widen to float, stores that narrow, and affine index expressions.
#pragma once

#include <string>
#include <vector>

#include "engine_format/engine_desc.h"
#include "passes/exec_plan.h"

namespace kiln::codegen {

const char* storage_type(engine::DType d);
std::string load_expr(engine::DType d, const std::string& ref);
std::string store_expr(engine::DType d, const std::string& value);

// `map`'s offset for flat index `i` over the row-major `shape`, as a C++
// expression of long longs with the shape baked in.
std::string affine_offset(const passes::AffineMap& map, const std::vector<int64_t>& shape);

}  // namespace kiln::codegen
