// The one place a kiln::Status becomes an ExecuTorch Error. Every failure the
// delegate reports goes through here, so the mapping and the log line are the
// same everywhere.
#pragma once

#include <executorch/runtime/core/error.h>

#include "common/status.h"

namespace kiln::delegate {

// Logs "<prefix>: <message>" with ET_LOG(Error, ...) and returns:
//   kIncompatible                 -> DelegateInvalidCompatibility (wrong SM, format version)
//   kCorruptData                  -> InvalidProgram
//   kOutOfMemory                  -> MemoryAllocationFailed
//   kInvalidArgument              -> InvalidArgument
//   kUnavailable, kUnsupported    -> NotSupported
//   kInternal                     -> Internal
// An ok status returns Error::Ok and logs nothing.
executorch::runtime::Error to_executorch_error(const kiln::Status& status, const char* prefix);

}  // namespace kiln::delegate
