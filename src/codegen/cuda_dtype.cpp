#include "codegen/cuda_dtype.h"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "ir/graph.h"

namespace kiln::codegen {

const char* storage_type(engine::DType d) {
  switch (d) {
    case engine::DType::kFloat32: return "float";
    case engine::DType::kFloat16:
    case engine::DType::kBFloat16: return "unsigned short";
    case engine::DType::kBool: return "unsigned char";  // torch.bool: one byte, 0 or 1
    case engine::DType::kInt64: return "long long";
    case engine::DType::kInt32: return "int";
  }
  throw CompileError(std::string("elementwise kernels do not handle dtype ") + std::to_string(static_cast<int>(d)));
}

bool is_integer(engine::DType d) { return d == engine::DType::kInt64 || d == engine::DType::kInt32; }

bool is_float(engine::DType d) {
  return d == engine::DType::kFloat32 || d == engine::DType::kFloat16 || d == engine::DType::kBFloat16;
}

const char* value_type(engine::DType d) {
  switch (d) {
    case engine::DType::kInt64: return "long long";
    case engine::DType::kInt32: return "int";
    default: return "float";
  }
}

std::string load_expr(engine::DType d, const std::string& ref) {
  switch (d) {
    case engine::DType::kFloat32: return ref;
    case engine::DType::kFloat16: return "kiln_ld_f16(" + ref + ")";
    case engine::DType::kBFloat16: return "kiln_ld_bf16(" + ref + ")";
    case engine::DType::kBool: return "((" + ref + ") ? 1.0f : 0.0f)";
    case engine::DType::kInt64:
    case engine::DType::kInt32: return ref;  // integers stay integers (exact)
    default: throw CompileError("unsupported load dtype");
  }
}

std::string store_expr(engine::DType d, const std::string& value) {
  switch (d) {
    case engine::DType::kFloat32: return value;
    case engine::DType::kFloat16: return "kiln_st_f16(" + value + ")";
    case engine::DType::kBFloat16: return "kiln_st_bf16(" + value + ")";
    case engine::DType::kBool: return "(unsigned char)((" + value + ") != 0)";
    // From a float value: truncation toward zero, as torch's casts.
    case engine::DType::kInt64: return "(long long)(" + value + ")";
    case engine::DType::kInt32: return "(int)(" + value + ")";
    default: throw CompileError("unsupported store dtype");
  }
}

std::string ll(int64_t v) { return std::to_string(v) + "LL"; }

std::string float_literal(double v) {
  if (std::isnan(v)) return "__int_as_float(0x7fc00000)";
  if (std::isinf(v)) return v > 0 ? "__int_as_float(0x7f800000)" : "__int_as_float(0xff800000)";
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.9ef", static_cast<double>(static_cast<float>(v)));
  return buffer;
}

std::string affine_offset(const AffineMap& map, const std::vector<int64_t>& shape) {
  if (map.coef.size() != shape.size())
    throw CompileError("internal: affine map of rank " + std::to_string(map.coef.size()) + " over shape " +
                       ir::shape_to_string(shape));
  std::ostringstream expr;
  bool first = true;
  if (map.base != 0) {
    expr << map.base << "LL";
    first = false;
  }
  int64_t stride = 1;
  for (size_t j = shape.size(); j-- > 0;) {
    if (shape[j] != 1 && map.coef[j] != 0) {
      if (!first) expr << " + ";
      first = false;
      expr << "((i / " << stride << "LL) % " << shape[j] << "LL) * " << map.coef[j] << "LL";
    }
    stride *= shape[j];
  }
  return first ? "0" : expr.str();
}

}  // namespace kiln::codegen
