#include "passes/dtype_convert.h"

#include <cmath>
#include <cstring>

#include "ir/graph.h"

namespace kiln::passes {

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return static_cast<uint16_t>(sign | (abs > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {  // half subnormal (or zero): q = round(|f| / 2^-24)
    if (abs <= 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25 rounds to 0
    uint32_t exp = abs >> 23;
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;  // |f| = mant * 2^(exp - 150)
    uint32_t shift = 126 - exp;                     // >= 14, <= 24
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t q = ((abs - 0x38000000u) >> 13);
  uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

float half_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {
      float f = std::ldexp(static_cast<float>(mant), -24);
      std::memcpy(&x, &f, 4);
      x |= sign;
    }
  } else if (exp == 31) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t float_to_bfloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

float bfloat16_to_float(uint16_t b) {
  uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

namespace {

float load(const uint8_t* p, engine::DType d) {
  switch (d) {
    case engine::DType::kFloat32: { float f; std::memcpy(&f, p, 4); return f; }
    case engine::DType::kFloat16: { uint16_t h; std::memcpy(&h, p, 2); return half_to_float(h); }
    case engine::DType::kBFloat16: { uint16_t h; std::memcpy(&h, p, 2); return bfloat16_to_float(h); }
    case engine::DType::kInt64: { int64_t v; std::memcpy(&v, p, 8); return static_cast<float>(v); }
    case engine::DType::kInt32: { int32_t v; std::memcpy(&v, p, 4); return static_cast<float>(v); }
    case engine::DType::kBool: return *p ? 1.0f : 0.0f;
    default: throw CompileError(std::string("cannot convert constants of dtype ") + engine::dtype_name(d));
  }
}

void store(uint8_t* p, engine::DType d, float f) {
  switch (d) {
    case engine::DType::kFloat32: std::memcpy(p, &f, 4); return;
    case engine::DType::kFloat16: { uint16_t h = float_to_half(f); std::memcpy(p, &h, 2); return; }
    case engine::DType::kBFloat16: { uint16_t h = float_to_bfloat16(f); std::memcpy(p, &h, 2); return; }
    default: throw CompileError(std::string("cannot convert constants to dtype ") + engine::dtype_name(d));
  }
}

}  // namespace

std::vector<uint8_t> convert_float_data(const std::vector<uint8_t>& data, engine::DType from, engine::DType to) {
  if (from == to) return data;
  size_t in_size = engine::dtype_size(from), out_size = engine::dtype_size(to);
  size_t count = data.size() / in_size;
  std::vector<uint8_t> out(count * out_size);
  for (size_t i = 0; i < count; ++i) store(out.data() + i * out_size, to, load(data.data() + i * in_size, from));
  return out;
}

}  // namespace kiln::passes
