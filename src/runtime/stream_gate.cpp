#include "runtime/stream_gate.h"

#include <chrono>
#include <thread>

#include "runtime/cuda_check.h"

namespace kiln::runtime {

StreamGate::~StreamGate() {
  if (holding_) (void)release_and_sync();
}

Status StreamGate::release_and_sync() {
  gate_.store(1, std::memory_order_release);
  if (!holding_) return Status::ok();
  holding_ = false;
  KILN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(held_));
  return Status::ok();
}

// Runs on CUDA's callback thread.
void CUDART_CB StreamGate::wait_for_release(void* gate) {
  auto* flag = static_cast<std::atomic<int>*>(gate);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (flag->load(std::memory_order_acquire) == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
}

Status StreamGate::hold(cudaStream_t stream) {
  gate_.store(0, std::memory_order_release);
  KILN_CUDA_RETURN_IF_ERROR(cudaLaunchHostFunc(stream, &StreamGate::wait_for_release, &gate_));
  held_ = stream;
  holding_ = true;
  return Status::ok();
}

}  // namespace kiln::runtime
