// Host-side conversion of constant bytes between float dtypes (export time).
#pragma once

#include <cstdint>
#include <vector>

#include "engine_format/engine_desc.h"

namespace kiln::passes {

uint16_t float_to_half(float f);     // round to nearest even
float half_to_float(uint16_t h);
uint16_t float_to_bfloat16(float f);  // round to nearest even
float bfloat16_to_float(uint16_t b);

// Converts the elements of `data` from `from` to `to`. `to` must be a float
// dtype; `from` may also be int64, int32 or bool (scalar constants that
// export lifts as integer tensors).
std::vector<uint8_t> convert_float_data(const std::vector<uint8_t>& data, engine::DType from,
                                        engine::DType to);

}  // namespace kiln::passes
