// What the GPU test drivers (tests/gpu/*_test.cpp, built by
// tests/cpp/runtime_tests.cmake, run on the GPU machine) share: one PASS/FAIL
// line per check, the failure count for the exit status, the ScalarType of a
// tensor-file dtype, and a method's output copied into a HostTensor for
// compare_tensors.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include <executorch/runtime/core/exec_aten/exec_aten.h>

#include "tensor_file.h"

namespace kiln::gpu_test {

inline int& failures() {
  static int count = 0;
  return count;
}

inline void report(bool ok, const std::string& what) {
  std::printf("%s  %s\n", ok ? "PASS" : "FAIL", what.c_str());
  std::fflush(stdout);
  failures() += ok ? 0 : 1;
}

// The ExecuTorch scalar type of a Kiln tensor-file dtype (inputs built with
// from_blob).
inline executorch::aten::ScalarType scalar_type(engine::DType d) {
  switch (d) {
    case engine::DType::kFloat16: return executorch::aten::ScalarType::Half;
    case engine::DType::kBFloat16: return executorch::aten::ScalarType::BFloat16;
    case engine::DType::kInt64: return executorch::aten::ScalarType::Long;
    case engine::DType::kInt32: return executorch::aten::ScalarType::Int;
    case engine::DType::kBool: return executorch::aten::ScalarType::Bool;
    default: return executorch::aten::ScalarType::Float;
  }
}

// `out`'s bytes and shape, labelled `dtype` (the expected tensor's).
inline tools::HostTensor to_host(const executorch::aten::Tensor& out, engine::DType dtype) {
  tools::HostTensor got;
  got.dtype = dtype;
  got.shape.assign(out.sizes().begin(), out.sizes().end());
  const auto* p = static_cast<const uint8_t*>(out.const_data_ptr());
  got.data.assign(p, p + out.nbytes());
  return got;
}

}  // namespace kiln::gpu_test
