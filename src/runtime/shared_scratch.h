// One grow-only activation buffer per device, shared by every context created
// with it (runtime option use_shared_activation_scratch). A model split into
// many engines then holds one arena the size of the largest engine's instead
// of one per engine. The price: contexts using it run one at a time per
// device (the lock is held from binding the buffer until the run has
// finished on the GPU), so it suits memory-bound deployments, not throughput.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>

#include "common/status.h"

namespace kiln::runtime {

class SharedScratch {
 public:
  // The scratch of `device`, made on first use; it lives while any context
  // holds it and frees its buffer with the last one.
  static std::shared_ptr<SharedScratch> for_device(int device);

  ~SharedScratch();  // cudaFree; errors ignored
  SharedScratch(const SharedScratch&) = delete;
  SharedScratch& operator=(const SharedScratch&) = delete;

  // Held by a run for its whole duration (see the class comment).
  std::mutex& mutex() { return mutex_; }

  // With mutex() held: a buffer of at least `bytes` on the device. Grows by
  // freeing and reallocating (cudaFree waits for the device to be idle, and
  // the lock guarantees no context is using the old buffer), so the base
  // address may change; callers rebind when it does.
  Result<void*> acquire(size_t bytes);

  int device() const { return device_; }
  size_t capacity() const { return capacity_; }  // read with mutex() held

 private:
  explicit SharedScratch(int device) : device_(device) {}

  int device_;
  std::mutex mutex_;
  void* buffer_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace kiln::runtime
