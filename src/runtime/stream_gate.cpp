#include "runtime/stream_gate.h"

#include <atomic>

#include "runtime/cuda_check.h"
#include "runtime/log.h"

namespace kiln::runtime {
namespace {

// Waits until (int32)(*flag - target) >= 0 (a cyclic >=, so the generation
// counter may wrap), for at most timeout_ns of %globaltimer or max_polls
// polls. Checked with ptxas for sm_75 … sm_120; JIT-compiled by the driver.
constexpr char kGatePtx[] = R"(
.version 7.0
.target sm_75
.address_size 64

.visible .entry kiln_stream_gate_wait(
    .param .u64 kiln_gate_flag,
    .param .u32 kiln_gate_target,
    .param .u64 kiln_gate_timeout_ns,
    .param .u32 kiln_gate_max_polls)
{
    .reg .pred %p<4>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<8>;

    ld.param.u64 %rd1, [kiln_gate_flag];
    ld.param.u32 %r1, [kiln_gate_target];
    ld.param.u64 %rd2, [kiln_gate_timeout_ns];
    ld.param.u32 %r5, [kiln_gate_max_polls];
    cvta.to.global.u64 %rd3, %rd1;
    mov.u64 %rd4, %globaltimer;
    mov.u32 %r4, 0;
LOOP:
    ld.volatile.global.u32 %r2, [%rd3];
    sub.s32 %r3, %r2, %r1;
    setp.ge.s32 %p1, %r3, 0;
    @%p1 bra DONE;
    add.u32 %r4, %r4, 1;
    setp.ge.u32 %p3, %r4, %r5;
    @%p3 bra DONE;
    nanosleep.u32 1000;
    mov.u64 %rd5, %globaltimer;
    sub.u64 %rd6, %rd5, %rd4;
    setp.lt.u64 %p2, %rd6, %rd2;
    @%p2 bra LOOP;
DONE:
    ret;
}
)";

constexpr uint64_t kTimeoutNs = 2000000000ull;  // 2 s
constexpr uint32_t kMaxPolls = 4u << 20;         // ~4 s of 1 us sleeps: a second bound

// The gate kernel, loaded once per process (a cudaLibrary_t serves every
// device). Leaked on purpose: gates may be destroyed during static teardown.
struct GateKernel {
  cudaKernel_t kernel = nullptr;
  bool ok = false;
};

const GateKernel& gate_kernel() {
  static const GateKernel loaded = [] {
    GateKernel k;
    cudaLibrary_t library = nullptr;
    cudaError_t error = cudaLibraryLoadData(&library, kGatePtx, nullptr, nullptr, 0, nullptr,
                                            nullptr, 0);
    if (error == cudaSuccess)
      error = cudaLibraryGetKernel(&k.kernel, library, "kiln_stream_gate_wait");
    if (error != cudaSuccess) {
      (void)cudaGetLastError();
      KILN_LOG_DEBUG("stream gate: the gate kernel cannot be loaded (%s: %s); timings will "
                     "include launch gaps",
                     cudaGetErrorName(error), cudaGetErrorString(error));
      return k;
    }
    k.ok = true;
    return k;
  }();
  return loaded;
}

}  // namespace

StreamGate::~StreamGate() {
  if (holding_) (void)release_and_sync();
  if (flag_ != nullptr) (void)cudaFreeHost(flag_);
  (void)cudaGetLastError();
}

Status StreamGate::release_and_sync() {
  if (!holding_) return Status::ok();
  holding_ = false;
  // Pinned memory is coherent with the GPU; the fence orders the earlier
  // enqueues' host-side writes before the release.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  __atomic_store_n(flag_, generation_, __ATOMIC_SEQ_CST);
  KILN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(held_));
  return Status::ok();
}

Status StreamGate::hold(cudaStream_t stream) {
  KILN_RETURN_IF_ERROR(release_and_sync());
  const GateKernel& k = gate_kernel();
  if (!k.ok) return Status::ok();  // ungated: timed with launch gaps
  if (flag_ == nullptr) {
    void* host = nullptr;
    KILN_CUDA_RETURN_IF_ERROR(
        cudaHostAlloc(&host, sizeof(uint32_t), cudaHostAllocMapped | cudaHostAllocPortable));
    flag_ = static_cast<uint32_t*>(host);
    __atomic_store_n(flag_, 0u, __ATOMIC_SEQ_CST);
    generation_ = 0;
    KILN_CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(&flag_device_, host, 0));
  }
  // Loads the kernel onto the current device now: lazy loading at the launch
  // below could otherwise wait for the device while something is held.
  cudaFuncAttributes attributes{};
  KILN_CUDA_RETURN_IF_ERROR(
      cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(k.kernel)));

  uint32_t target = generation_ + 1;
  uint64_t flag_address = reinterpret_cast<uint64_t>(flag_device_);
  uint64_t timeout_ns = kTimeoutNs;
  uint32_t max_polls = kMaxPolls;
  void* args[] = {&flag_address, &target, &timeout_ns, &max_polls};
  KILN_CUDA_RETURN_IF_ERROR(cudaLaunchKernel(reinterpret_cast<const void*>(k.kernel), dim3(1),
                                             dim3(1), args, 0, stream));
  generation_ = target;
  held_ = stream;
  holding_ = true;
  return Status::ok();
}

}  // namespace kiln::runtime
