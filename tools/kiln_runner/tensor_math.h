// Host-side numerics for kiln_runner: 16-bit float conversions, random inputs
// and the output-vs-reference comparison.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>

#include "tensor_file.h"

namespace kiln::tools {

// IEEE binary16 and bfloat16 from/to float, round-to-nearest-even; NaN and
// infinities are preserved, values beyond the range become infinities.
uint16_t float_to_half(float value);
float half_to_float(uint16_t bits);
uint16_t float_to_bfloat16(float value);
float bfloat16_to_float(uint16_t bits);

// Element `i` of `t` as a double (bool -> 0/1).
double element_as_double(const HostTensor& t, size_t i);

// Fills `t` (shape and dtype already set, data sized here): floating types
// uniform in [-1, 1), integers uniform in [0, 16), bools 0/1.
void fill_random(HostTensor* t, std::mt19937* rng);

// The result of comparing an output with its reference of the same dtype and
// shape. rel_err = ||out - ref||_2 / ||ref||_2 (0 when both are all zero,
// infinity when only ref is); non_finite counts NaN/Inf in either tensor.
struct Comparison {
  double rel_err = 0.0;
  double max_abs_err = 0.0;
  size_t non_finite = 0;
  size_t mismatches = 0;  // elements that differ at all
};
Comparison compare_tensors(const HostTensor& out, const HostTensor& ref);

// The default tolerance on rel_err: 1e-5 for float32, 1e-2 for float16 and
// bfloat16, 0 (exact) for integer and bool outputs.
double default_rtol(engine::DType dtype);

}  // namespace kiln::tools
