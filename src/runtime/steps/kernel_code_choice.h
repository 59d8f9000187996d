// Which code of a kernel module a GPU runs: the choice the kernel kind's load
// hook makes (kernel_step_exec.cpp), kept apart from CUDA so it is tested
// without a GPU (tests/cpp/kernel_code_choice_test.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "engine_format/engine_desc.h"

namespace kiln::runtime {

struct KernelCode {
  // Points into the module (a cubin image, or the NUL-terminated PTX); valid
  // while the module is.
  const void* image = nullptr;
  bool from_ptx = false;
  uint32_t arch = 0;   // the cubin's sm, or the PTX's compute_XX
  std::string which;   // "cubin sm_90" / "PTX compute_80", for messages
};

// For a GPU of SM `sm` (major * 10 + minor): the cubin for `sm`, else the
// newest cubin of the same major and an older minor (CUDA runs sm_X.y
// machine code on sm_X.z for z >= y), else the PTX when its compute_XX is no
// newer than `sm`. Neither: kIncompatible naming the GPU's SM and what the
// module carries.
Result<KernelCode> choose_kernel_code(const engine::KernelModule& m, uint32_t sm);

// "cubins for sm_80, sm_90 and PTX for compute_80": what a module carries.
std::string describe_kernel_code(const engine::KernelModule& m);

}  // namespace kiln::runtime
