#include "common/status.h"

#include <vector>

namespace kiln {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kCorruptData: return "corrupt data";
    case StatusCode::kIncompatible: return "incompatible";
    case StatusCode::kUnavailable: return "unavailable";
    case StatusCode::kOutOfMemory: return "out of memory";
    case StatusCode::kInternal: return "internal error";
    case StatusCode::kUnsupported: return "unsupported";
  }
  return "unknown";
}

Status make_status(StatusCode code, const char* format, ...) {
  va_list args;
  va_start(args, format);
  va_list copy;
  va_copy(copy, args);
  int needed = std::vsnprintf(nullptr, 0, format, copy);
  va_end(copy);
  std::string message;
  if (needed > 0) {
    std::vector<char> buffer(static_cast<size_t>(needed) + 1);
    std::vsnprintf(buffer.data(), buffer.size(), format, args);
    message.assign(buffer.data(), static_cast<size_t>(needed));
  }
  va_end(args);
  return Status(code, std::move(message));
}

}  // namespace kiln
