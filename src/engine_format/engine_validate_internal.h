// Pieces of validate_engine shared between engine_validate.cpp and
// engine_validate_conv.cpp (private to src/engine_format).
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "engine_format/engine_desc.h"

namespace kiln::engine {

// kInvalidArgument with a printf-formatted message.
Status invalid(const char* format, ...) __attribute__((format(printf, 1, 2)));

// Checks conv step `step` (`label` names it in messages); the tensors
// themselves are already checked.
Status check_conv(const EngineDesc& desc, uint32_t step, const std::string& label);

}  // namespace kiln::engine
