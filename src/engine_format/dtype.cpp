#include "engine_format/engine_desc.h"

namespace kiln::engine {

// Returns 0 for a value outside the enum (possible after a cast from file
// data), which validate_engine reports; callers must not divide by it.
size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kFloat16: return 2;
    case DType::kBFloat16: return 2;
    case DType::kInt64: return 8;
    case DType::kInt32: return 4;
    case DType::kBool: return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kInt64: return "int64";
    case DType::kInt32: return "int32";
    case DType::kBool: return "bool";
  }
  return "invalid";
}

}  // namespace kiln::engine
