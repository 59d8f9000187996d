// Reading and writing .ktensors files (docs/tensor_file_format.md): the
// runner's --inputs, --expected and --save_outputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine_format/engine_desc.h"

namespace kiln::tools {

// One tensor held in host memory, contiguous row-major; owns its bytes.
struct HostTensor {
  engine::DType dtype = engine::DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;

  int64_t numel() const;
};

// Largest tensor count a reader accepts (a corrupt count fails fast).
constexpr uint32_t kMaxTensorFileCount = 1u << 16;

// Reads every tensor in `path`. Failures are kInvalidArgument (cannot open)
// or kCorruptData, with a message naming the file and the tensor.
Result<std::vector<HostTensor>> read_tensor_file(const std::string& path);

// Writes `tensors` to `path`, replacing it.
Status write_tensor_file(const std::string& path, const std::vector<HostTensor>& tensors);

// "float32 [8, 512]".
std::string describe_tensor(engine::DType dtype, const std::vector<int64_t>& shape);

}  // namespace kiln::tools
