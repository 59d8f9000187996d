// The CUDA spellings shared by the kernel generators: storage types, loads
// that widen to float, stores that narrow, and affine index expressions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine_format/engine_desc.h"

namespace kiln::codegen {

// Where element `idx` of an iteration space lives in a contiguous tensor:
// offset = base + sum_j idx_j * coef[j]. Permutes, slices, selects, and the
// pieces of cat and split are all such maps.
struct AffineMap {
  int64_t base = 0;
  std::vector<int64_t> coef;  // one per iteration dimension
};

// Storage: float, unsigned short (float16/bfloat16), unsigned char (bool),
// long long (int64), int (int32).
const char* storage_type(engine::DType d);
bool is_integer(engine::DType d);  // int64 or int32
bool is_float(engine::DType d);    // float32, float16 or bfloat16
// The type a value of dtype `d` has inside a kernel: integers keep their own
// type (exact), every other dtype is a float (bool as 1.0f / 0.0f).
const char* value_type(engine::DType d);
// Loads widen float dtypes to float and bool to 1.0f / 0.0f, and leave
// integers as they are; stores narrow to the storage type (C conversion
// from a float: truncation toward zero, as torch's casts).
std::string load_expr(engine::DType d, const std::string& ref);
std::string store_expr(engine::DType d, const std::string& value);

// A float constant as CUDA source: %.9e of the value rounded to float (exact
// round trip), NaN and infinities as bit patterns.
std::string float_literal(double v);

// An integer constant as CUDA source, typed long long: "123LL" (index
// arithmetic stays 64-bit).
std::string ll(int64_t v);

// `map`'s offset for flat index `i` over the row-major `shape`, as a C++
// expression of long longs with the shape baked in.
std::string affine_offset(const AffineMap& map, const std::vector<int64_t>& shape);

}  // namespace kiln::codegen
