// CUDA green contexts for kiln_runner's --green_context_sms and
// --green_context_sweep: a stream whose kernels run on a fixed subset of the
// GPU's SMs.
//
// The driver API is reached through the CUDA runtime
// (cudaGetDriverEntryPointByVersion), never by linking libcuda, so a machine
// without a driver still starts the runner and gets a plain error message.
// Every function reports failure as a non-empty message saying why; there are
// no exceptions.
#pragma once

#include <memory>
#include <string>

#include <cuda_runtime_api.h>

namespace kiln::tools {

// The SM resource of the calling thread's current CUDA device, as the driver
// reports it (cuDeviceGetDevResource, CU_DEV_RESOURCE_TYPE_SM).
struct DeviceSmInfo {
  int ordinal = 0;
  std::string name;
  int driver_version = 0;          // e.g. 13000
  unsigned sm_count = 0;           // SMs of the whole device
  unsigned min_partition = 0;      // smallest group a split may create
  unsigned alignment = 0;          // groups are multiples of this
};

// Fills `info` for the current device; returns "" or why it cannot (no
// driver, no device, a driver too old for green contexts, ...). Initializes
// the device's primary context.
std::string query_device_sms(DeviceSmInfo* info);

// One green context on the current device holding a group of SMs, and one
// non-blocking stream in it. The destructor synchronizes and destroys the
// stream (cuStreamDestroy), then the green context (cuGreenCtxDestroy).
class GreenContext {
 public:
  // Creates a green context with `requested_sms` SMs: the request is rounded
  // up to the device's alignment (down, when rounding up would pass the
  // device's SM count). Fails when the request is below the device's minimum
  // partition or above its SM count, or when any driver call fails. Returns
  // "" and sets `*out`, or returns why not.
  static std::string create(unsigned requested_sms, std::unique_ptr<GreenContext>* out);

  ~GreenContext();
  GreenContext(const GreenContext&) = delete;
  GreenContext& operator=(const GreenContext&) = delete;

  // The green context's stream (a CUstream, usable as a cudaStream_t).
  cudaStream_t stream() const { return stream_; }
  unsigned requested_sms() const { return requested_sms_; }
  // SMs the green context actually holds (cuGreenCtxGetDevResource).
  unsigned obtained_sms() const { return obtained_sms_; }
  const DeviceSmInfo& device() const { return device_; }

  // Destroys the stream and the green context now; returns "" or the first
  // failure. Safe to call twice; the destructor calls it and drops the text.
  std::string destroy();

 private:
  GreenContext() = default;

  void* green_ctx_ = nullptr;  // CUgreenCtx
  cudaStream_t stream_ = nullptr;
  unsigned requested_sms_ = 0;
  unsigned obtained_sms_ = 0;
  DeviceSmInfo device_;
};

}  // namespace kiln::tools
