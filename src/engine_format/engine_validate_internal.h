// Pieces of validate_engine shared with the step kinds' validators
// (steps/*_step_format.cpp); private to src/engine_format.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "engine_format/engine_desc.h"

namespace kiln::engine {

// kInvalidArgument with a printf-formatted message.
Status invalid(const char* format, ...) __attribute__((format(printf, 1, 2)));

}  // namespace kiln::engine
