// State behind the C API's opaque handles, shared by its source files. Not
// installed: only include/kiln/c_api.h is the interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <executorch/extension/module/module.h>
#include <executorch/runtime/core/portable_type/tensor_impl.h>
#include <executorch/runtime/executor/method.h>

#include "device_io.h"  // tools/kiln_runner (kiln_runner_support)
#include "kiln/c_api.h"

namespace kiln::c_api {

// The name the Kiln delegate registers under (its load options are keyed by it).
constexpr const char* kKilnBackendName = "KilnBackend";

// Sets this thread's last error and returns `status`.
kiln_status fail(kiln_status status, std::string message);
// Clears this thread's last error and returns KILN_OK.
kiln_status ok();

// "float32 [8, 512] on the CPU" / "... on CUDA device 0".
std::string describe(int32_t dtype, const int64_t* shape, int32_t ndim, int32_t device_type,
                     int32_t device_index);

struct MethodState;

// One loaded .pte. `module` is used under `mutex` for loading methods; the
// Method objects it owns live as long as it does.
struct ProgramState {
  std::unique_ptr<executorch::extension::Module> module;
  std::string path;
  std::vector<std::string> method_names;  // sorted
  std::vector<uint8_t> flatbuffer;        // for the I/O devices (program_check.h)
  std::string state_scope;                // the KilnBackend load option for its methods
  std::string first_loaded;               // the first method loaded ("": none yet)
  std::mutex mutex;
  // Handles opened on one method share its state (and its inputs and outputs).
  std::unordered_map<std::string, std::weak_ptr<MethodState>> methods;
};

// One input or output of a method's signature.
struct IoSlot {
  bool is_tensor = false;
  bool memory_planned = true;  // false: the caller provides the memory
  int32_t dtype = 0;
  int32_t device_type = KILN_DEVICE_CPU;
  int32_t device_index = 0;
  std::vector<int64_t> shape;  // the signature's shape (kiln_tensor_info)
  size_t nbytes = 0;
  // The tensor handed to ExecuTorch for an input: sizes, dim order and
  // strides fixed at open, only the data pointer changes per call.
  std::vector<executorch::aten::SizesType> sizes;
  std::vector<executorch::aten::DimOrderType> dim_order;
  std::vector<executorch::aten::StridesType> strides;
  std::unique_ptr<executorch::aten::TensorImpl> impl;
  bool set = false;               // an input set since load
  void* own_buffer = nullptr;     // an output the method provides (device or host)
  std::vector<uint8_t> host_buffer;
  std::vector<int64_t> out_shape;  // the last execution's shape (KILN_MAX_DIMS)
};

struct MethodState {
  std::shared_ptr<ProgramState> program;
  std::string name;
  bool uses_kiln = false;
  bool any_device_io = false;
  executorch::runtime::Method* method = nullptr;  // set by load; owned by program->module
  std::vector<IoSlot> inputs, outputs;
  kiln::tools::DeviceIo device_buffers;  // the method's own device output buffers
  bool executed = false;

  // "method 'forward': input 0: " and the like.
  std::string where(const char* what, size_t index) const;
};

}  // namespace kiln::c_api

// The opaque handles of c_api.h.
struct kiln_program {
  std::shared_ptr<kiln::c_api::ProgramState> state;
};
struct kiln_method {
  std::shared_ptr<kiln::c_api::MethodState> state;
};
