#include "delegate/status_to_error.h"

#include <executorch/runtime/platform/log.h>

namespace kiln::delegate {

using executorch::runtime::Error;

executorch::runtime::Error to_executorch_error(const kiln::Status& status, const char* prefix) {
  Error error = Error::Internal;
  switch (status.code()) {
    case StatusCode::kOk:
      return Error::Ok;
    case StatusCode::kIncompatible:
      error = Error::DelegateInvalidCompatibility;
      break;
    case StatusCode::kCorruptData:
      error = Error::InvalidProgram;
      break;
    case StatusCode::kOutOfMemory:
      error = Error::MemoryAllocationFailed;
      break;
    case StatusCode::kInvalidArgument:
      error = Error::InvalidArgument;
      break;
    case StatusCode::kUnavailable:
    case StatusCode::kUnsupported:
      error = Error::NotSupported;
      break;
    case StatusCode::kInternal:
      error = Error::Internal;
      break;
  }
  ET_LOG(Error, "%s: %s", prefix, status.message().c_str());
  return error;
}

}  // namespace kiln::delegate
