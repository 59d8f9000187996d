// Hand-built engines in tests: one tensor appended to an EngineDesc, its byte size from its shape.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine_format/engine_desc.h"

namespace kiln::testing {

// Appends a tensor (name, dtype, shape, storage, io_index, offset) and returns its index.
inline uint32_t add_tensor(engine::EngineDesc& d, std::string name, engine::DType dtype, std::vector<int64_t> shape,
                           engine::StorageKind storage, uint32_t io, uint64_t offset) {
  engine::TensorDesc t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.storage = storage;
  t.io_index = io;
  t.offset = offset;
  t.nbytes = engine::dtype_size(dtype);
  for (int64_t s : t.shape) t.nbytes *= static_cast<uint64_t>(s);
  d.tensors.push_back(std::move(t));
  return static_cast<uint32_t>(d.tensors.size() - 1);
}

}  // namespace kiln::testing
