#include "tensor_math.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace kiln::tools {

using engine::DType;

uint16_t float_to_half(float value) {
  uint32_t x;
  std::memcpy(&x, &value, sizeof(x));
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t exponent = (x >> 23) & 0xffu;
  uint32_t mantissa = x & 0x7fffffu;
  if (exponent == 0xffu)  // Inf stays Inf, NaN stays a (quiet) NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (mantissa != 0 ? 0x200u : 0u));
  const int e = static_cast<int>(exponent) - 127 + 15;  // rebiased exponent
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (e <= 0) {
    // Subnormal half (or zero): value = m * 2^-24 with m = M >> (14 - e),
    // where M is the 24-bit significand with its implicit bit.
    if (e < -10) return sign;
    mantissa |= 0x800000u;
    const int shift = 14 - e;
    uint32_t half = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = (static_cast<uint32_t>(e) << 10) | (mantissa >> 13);
  const uint32_t rest = mantissa & 0x1fffu;
  // A carry out of the mantissa correctly bumps the exponent (up to Inf).
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

float half_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign != 0 ? -magnitude : magnitude;
  }
  uint32_t x;
  if (exponent == 31)
    x = sign | 0x7f800000u | (mantissa << 13);
  else
    x = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  float value;
  std::memcpy(&value, &x, sizeof(value));
  return value;
}

uint16_t float_to_bfloat16(float value) {
  uint32_t x;
  std::memcpy(&x, &value, sizeof(x));
  if ((x & 0x7fffffffu) > 0x7f800000u)  // NaN: keep it a quiet NaN
    return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

float bfloat16_to_float(uint16_t bits) {
  const uint32_t x = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &x, sizeof(value));
  return value;
}

double element_as_double(const HostTensor& t, size_t i) {
  const uint8_t* p = t.data.data() + i * engine::dtype_size(t.dtype);
  switch (t.dtype) {
    case DType::kFloat32: {
      float v;
      std::memcpy(&v, p, sizeof(v));
      return v;
    }
    case DType::kFloat16: {
      uint16_t v;
      std::memcpy(&v, p, sizeof(v));
      return half_to_float(v);
    }
    case DType::kBFloat16: {
      uint16_t v;
      std::memcpy(&v, p, sizeof(v));
      return bfloat16_to_float(v);
    }
    case DType::kInt64: {
      int64_t v;
      std::memcpy(&v, p, sizeof(v));
      return static_cast<double>(v);
    }
    case DType::kInt32: {
      int32_t v;
      std::memcpy(&v, p, sizeof(v));
      return v;
    }
    case DType::kBool:
      return *p != 0 ? 1.0 : 0.0;
  }
  return 0.0;
}

void fill_random(HostTensor* t, std::mt19937* rng) {
  const size_t n = static_cast<size_t>(t->numel());
  const size_t element = engine::dtype_size(t->dtype);
  t->data.assign(n * element, 0);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::uniform_int_distribution<int32_t> small_int(0, 15);
  for (size_t i = 0; i < n; ++i) {
    uint8_t* p = t->data.data() + i * element;
    switch (t->dtype) {
      case DType::kFloat32: {
        const float v = uniform(*rng);
        std::memcpy(p, &v, sizeof(v));
        break;
      }
      case DType::kFloat16: {
        const uint16_t v = float_to_half(uniform(*rng));
        std::memcpy(p, &v, sizeof(v));
        break;
      }
      case DType::kBFloat16: {
        const uint16_t v = float_to_bfloat16(uniform(*rng));
        std::memcpy(p, &v, sizeof(v));
        break;
      }
      case DType::kInt64: {
        const int64_t v = small_int(*rng);
        std::memcpy(p, &v, sizeof(v));
        break;
      }
      case DType::kInt32: {
        const int32_t v = small_int(*rng);
        std::memcpy(p, &v, sizeof(v));
        break;
      }
      case DType::kBool:
        *p = static_cast<uint8_t>(small_int(*rng) & 1);
        break;
    }
  }
}

Comparison compare_tensors(const HostTensor& out, const HostTensor& ref) {
  Comparison result;
  const size_t n = static_cast<size_t>(ref.numel());
  double diff_sq = 0.0, ref_sq = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double o = element_as_double(out, i);
    const double r = element_as_double(ref, i);
    if (!std::isfinite(o) || !std::isfinite(r)) {
      ++result.non_finite;
      continue;
    }
    const double d = o - r;
    if (d != 0.0) ++result.mismatches;
    diff_sq += d * d;
    ref_sq += r * r;
    result.max_abs_err = std::max(result.max_abs_err, std::fabs(d));
  }
  if (ref_sq > 0.0)
    result.rel_err = std::sqrt(diff_sq) / std::sqrt(ref_sq);
  else
    result.rel_err = diff_sq > 0.0 ? std::numeric_limits<double>::infinity() : 0.0;
  return result;
}

double default_rtol(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 1e-5;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 1e-2;
    default:
      return 0.0;
  }
}

}  // namespace kiln::tools
