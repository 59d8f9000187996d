// Derived weights (engine format v6, engine_desc.h DerivedWeight): layouts one
// kernel reads faster than the model's (the persistent decode kernel's packed
// per-block stages), made on the device at Engine::load from the engine's
// inline and named weights instead of being stored in the .pte a second time.
//
// Owned by one Engine (never shared: they are cheap to remake from weights
// that are shared), freed with it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "common/status.h"
#include "engine_format/engine_desc.h"

namespace kiln::runtime {

class DerivedWeights {
 public:
  DerivedWeights() = default;
  ~DerivedWeights();  // frees every buffer; errors are ignored
  DerivedWeights(const DerivedWeights&) = delete;
  DerivedWeights& operator=(const DerivedWeights&) = delete;

  // Makes every derived weight of `desc` (validated) on the current device:
  // cudaMalloc, cudaMemsetAsync 0, one cudaMemcpy2DAsync (device to device)
  // per copy on a load stream, then waits for it. `source_address` gives a
  // source tensor's (inline or named weight) device address; those weights
  // must already be on the device. Logs one info line per derived weight
  // (size, copies, time). Errors name the derived weight (and the copy); what
  // was made before an error stays owned here and is freed by the destructor.
  Status make(const engine::EngineDesc& desc,
              const std::function<const void*(const engine::TensorDesc&)>& source_address);

  // Device base of derived weight `i` (EngineDesc::derived_weights order), in
  // an array valid for this object's life (StepLoadEnv::derived_weights).
  const void* const* bases() const { return bases_.data(); }
  size_t size() const { return bases_.size(); }
  // Bytes of device memory the derived weights take.
  uint64_t bytes() const { return bytes_; }

 private:
  std::vector<const void*> bases_;
  uint64_t bytes_ = 0;
};

}  // namespace kiln::runtime
