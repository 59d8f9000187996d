// Which GPU the runtime is on. Uses the CUDA runtime API only (libcudart loads
// the driver itself), so a machine without a driver or GPU still starts the
// program and gets a kUnavailable Status from here instead of a loader error.
#pragma once

#include <cstddef>
#include <string>

#include "common/status.h"

namespace kiln::runtime {

struct DeviceInfo {
  int ordinal = 0;
  int sm = 0;  // major * 10 + minor, e.g. 87 (Orin), 90 (H200)
  std::string name;
  int sm_count = 0;
  size_t total_memory_bytes = 0;
  size_t max_shared_per_block_optin = 0;  // dynamic smem a kernel may opt in to
};

// Properties of device `ordinal`; kInvalidArgument when it does not exist,
// kUnavailable when there is no usable driver/GPU at all.
Result<DeviceInfo> query_device(int ordinal);

// ok when at least one CUDA device is usable; otherwise kUnavailable
// "no CUDA GPU: cudaGetDeviceCount returned <error>" or "... found 0 devices".
Status check_gpu_available();

// The calling thread's current device (cudaGetDevice).
Result<int> current_device();

// Makes `ordinal` the calling thread's current device if it is not already
// (CUDA's current device is per thread; callers may arrive on any thread).
Status ensure_current_device(int ordinal);

}  // namespace kiln::runtime
