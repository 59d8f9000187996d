#include "runtime/derived_weights.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <string>

#include "runtime/cuda_check.h"
#include "runtime/log.h"

namespace kiln::runtime {
namespace {

// The load stream, waited for and destroyed on every path out (an error
// included, so no copy is still running when the buffers are freed).
class LoadStream {
 public:
  ~LoadStream() {
    if (stream_ == nullptr) return;
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
    (void)cudaGetLastError();
  }
  // A blocking stream (not cudaStreamNonBlocking): it waits for the legacy
  // default stream, where the weights were uploaded with cudaMemcpy, whose
  // DMA from pageable memory may still be in flight when it returns.
  Status create() {
    KILN_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamDefault));
    return Status::ok();
  }
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// Zero `nbytes` at `base`, then every copy of `d`; enqueued on `stream`.
Status enqueue(const engine::EngineDesc& desc, const engine::DerivedWeight& d, void* base,
               const std::function<const void*(const engine::TensorDesc&)>& source_address,
               cudaStream_t stream) {
  KILN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(base, 0, d.nbytes, stream));
  for (size_t c = 0; c < d.copies.size(); ++c) {
    const engine::DerivedCopy& copy = d.copies[c];
    const engine::TensorDesc& source = desc.tensors[copy.source];  // validated: a weight
    const void* from = source_address(source);
    if (from == nullptr)
      return make_status(StatusCode::kInternal, "copy %zu: source tensor '%s' has no device address", c,
                         source.name.c_str());
    const uint8_t* src = static_cast<const uint8_t*>(from) + copy.offset;
    uint8_t* dst = static_cast<uint8_t*>(base) + copy.dst;
    // One row: the stride is not used (and may be anything the validator let through).
    const size_t src_pitch = copy.rows > 1 ? static_cast<size_t>(copy.stride) : copy.row_bytes;
    const cudaError_t error = cudaMemcpy2DAsync(dst, copy.row_bytes, src, src_pitch, copy.row_bytes, copy.rows,
                                                cudaMemcpyDeviceToDevice, stream);
    if (error != cudaSuccess)
      return cuda_error_status(error, "cudaMemcpy2DAsync", __FILE__, __LINE__)
          .with_context("copy " + std::to_string(c) + " (" + std::to_string(copy.rows) + " rows of " +
                        std::to_string(copy.row_bytes) + " bytes, " + std::to_string(copy.stride) +
                        " apart, from tensor '" + source.name + "')");
  }
  return Status::ok();
}

}  // namespace

DerivedWeights::~DerivedWeights() {
  for (const void* base : bases_)
    if (base != nullptr) (void)cudaFree(const_cast<void*>(base));
  (void)cudaGetLastError();  // leave no error behind for the caller's next check
}

Status DerivedWeights::make(const engine::EngineDesc& desc,
                            const std::function<const void*(const engine::TensorDesc&)>& source_address) {
  if (desc.derived_weights.empty()) return Status::ok();
  LoadStream stream;
  KILN_RETURN_IF_ERROR(stream.create().with_context("making the engine's derived weights"));
  bases_.reserve(desc.derived_weights.size());
  for (size_t i = 0; i < desc.derived_weights.size(); ++i) {
    const engine::DerivedWeight& d = desc.derived_weights[i];
    const std::string what = "making derived weight " + std::to_string(i) + " '" + d.name + "' (" +
                             std::to_string(d.nbytes) + " bytes from " + std::to_string(d.copies.size()) +
                             " copies)";
    const auto start = std::chrono::steady_clock::now();
    void* base = nullptr;
    const cudaError_t allocated = cudaMalloc(&base, d.nbytes);
    if (allocated != cudaSuccess)
      return cuda_error_status(allocated, "cudaMalloc", __FILE__, __LINE__).with_context(what);
    bases_.push_back(base);
    bytes_ += d.nbytes;
    KILN_RETURN_IF_ERROR(enqueue(desc, d, base, source_address, stream.get()).with_context(what));
    const cudaError_t done = cudaStreamSynchronize(stream.get());
    if (done != cudaSuccess)
      return cuda_error_status(done, "cudaStreamSynchronize", __FILE__, __LINE__).with_context(what);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    log_message(LogLevel::kInfo, "made derived weight '%s': %.1f MB from %zu copies in %.1f ms", d.name.c_str(),
                static_cast<double>(d.nbytes) / 1e6, d.copies.size(), ms);
  }
  return Status::ok();
}

}  // namespace kiln::runtime
