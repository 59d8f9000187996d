// ExecutionContext::execute: host staging, device-resident I/O and CUDA graph
// replay. Creation, bindings and run() are in execution_context.cpp.
#include <algorithm>
#include <cstring>
#include <mutex>

#include "runtime/cuda_check.h"
#include "runtime/device.h"
#include "runtime/execution_context.h"

namespace kiln::runtime {

using engine::TensorDesc;

namespace {
constexpr size_t kDeviceIoAlignment = 256;  // cudaMalloc's; engine.cpp's address_alignment assumes it
}  // namespace

Status ExecutionContext::check_io(const IoBuffer* io, bool inputs) const {
  const char* what = inputs ? "input" : "output";
  const size_t count = inputs ? num_inputs() : num_outputs();
  if (count > 0 && io == nullptr)
    return make_status(StatusCode::kInvalidArgument, "execute: null %s array", what);
  for (size_t i = 0; i < count; ++i) {
    const TensorDesc& t = inputs ? input_desc(i) : output_desc(i);
    if (io[i].nbytes != t.nbytes)
      return make_status(StatusCode::kInvalidArgument,
                         "%s %zu ('%s'): expected %llu bytes, got %zu", what, i, t.name.c_str(),
                         static_cast<unsigned long long>(t.nbytes), io[i].nbytes);
    if (t.nbytes > 0 && io[i].data == nullptr)
      return make_status(StatusCode::kInvalidArgument, "%s %zu ('%s'): null data pointer", what,
                         i, t.name.c_str());
    // A device tensor is used in place, and the engine's kernels and library
    // calls were planned for cudaMalloc's alignment (16-byte vector loads,
    // cuBLASLt algorithms chosen for 256-byte operands): a view into the
    // middle of an allocation is refused rather than read misaligned.
    const auto address = reinterpret_cast<uintptr_t>(io[i].data);
    if (io[i].on_device && t.nbytes > 0 && address % kDeviceIoAlignment != 0)
      return make_status(StatusCode::kInvalidArgument,
                         "%s %zu ('%s'): device pointer %p is not %zu-byte aligned (the start of a CUDA "
                         "allocation is); pass a tensor that owns its storage, e.g. x.contiguous().clone()",
                         what, i, t.name.c_str(), io[i].data, kDeviceIoAlignment);
  }
  // Index inputs on the host hold values the kernels would clamp: refuse those PyTorch refuses.
  // Device-resident ones are not read here (that would wait for the GPU).
  if (inputs)
    for (const engine::InputBound& b : engine_->input_bounds())
      if (!io[b.input].on_device)
        KILN_RETURN_IF_ERROR(engine::check_index_values(b, input_desc(b.input).dtype, io[b.input].data,
                                                        io[b.input].nbytes, input_desc(b.input).name));
  return Status::ok();
}

Status ExecutionContext::enqueue(const IoBuffer* inputs, const IoBuffer* outputs,
                                 cudaStream_t stream) {
  for (size_t i = 0; i < num_inputs(); ++i) {
    if (inputs[i].on_device || inputs[i].nbytes == 0) continue;
    KILN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(input_device_[i], input_pinned_[i],
                                              inputs[i].nbytes, cudaMemcpyHostToDevice, stream));
  }
  KILN_RETURN_IF_ERROR(run(stream));
  for (size_t i = 0; i < num_outputs(); ++i) {
    if (outputs[i].on_device || outputs[i].nbytes == 0) continue;
    KILN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(output_pinned_[i], output_device_[i],
                                              outputs[i].nbytes, cudaMemcpyDeviceToHost, stream));
  }
  return Status::ok();
}

bool ExecutionContext::graph_matches(const IoBuffer* inputs, const IoBuffer* outputs) const {
  if (!graph_.ready()) return false;
  // Host I/O goes through our own fixed buffers; device I/O is baked into the
  // graph by address, so a new address needs a new recording.
  for (size_t i = 0; i < num_inputs(); ++i) {
    if (graph_input_on_device_[i] != static_cast<uint8_t>(inputs[i].on_device)) return false;
    if (inputs[i].on_device && inputs[i].data != graph_inputs_[i]) return false;
  }
  for (size_t i = 0; i < num_outputs(); ++i) {
    if (graph_output_on_device_[i] != static_cast<uint8_t>(outputs[i].on_device)) return false;
    if (outputs[i].on_device && outputs[i].data != graph_outputs_[i]) return false;
  }
  return true;
}

namespace {

struct CaptureArgs {
  ExecutionContext* self;
  const IoBuffer* inputs;
  const IoBuffer* outputs;
  Status (*enqueue)(ExecutionContext*, const IoBuffer*, const IoBuffer*, cudaStream_t);
};

}  // namespace

Status ExecutionContext::replay(const IoBuffer* inputs, const IoBuffer* outputs,
                                cudaStream_t stream) {
  if (!graph_matches(inputs, outputs)) {
    // Shapes are static (the caller checked sizes); what changes is where
    // device-resident I/O lives. Record again and update the executable
    // graph in place, which keeps cuBLASLt's (opaque) kernels correct too.
    KILN_RETURN_IF_ERROR(rebind(bound_arena_, inputs, outputs));
    struct Trampoline {
      static Status call(void* user, cudaStream_t s) {
        auto* a = static_cast<CaptureArgs*>(user);
        return a->enqueue(a->self, a->inputs, a->outputs, s);
      }
    };
    CaptureArgs args{this, inputs, outputs,
                     [](ExecutionContext* self, const IoBuffer* in, const IoBuffer* out,
                        cudaStream_t s) { return self->enqueue(in, out, s); }};
    bool updated = false;
    KILN_RETURN_IF_ERROR(graph_.record(capture_stream_, &Trampoline::call, &args, &updated));
    ++stats_.graph_records;
    if (updated) ++stats_.graph_updates;
    for (size_t i = 0; i < num_inputs(); ++i) {
      graph_input_on_device_[i] = inputs[i].on_device;
      graph_inputs_[i] = inputs[i].data;
    }
    for (size_t i = 0; i < num_outputs(); ++i) {
      graph_output_on_device_[i] = outputs[i].on_device;
      graph_outputs_[i] = outputs[i].data;
    }
  }
  KILN_RETURN_IF_ERROR(graph_.launch(stream));
  ++stats_.graph_launches;
  return Status::ok();
}

Status ExecutionContext::execute_locked(const IoBuffer* inputs, const IoBuffer* outputs,
                                        cudaStream_t stream) {
  if (!stream_checked_ || stream != checked_stream_) {
    for (const std::unique_ptr<StepKindContext>& kind : kind_contexts_)
      if (kind != nullptr) KILN_RETURN_IF_ERROR(kind->check_stream(stream));
    checked_stream_ = stream;
    stream_checked_ = true;
  }
  void* arena = arena_;
  if (scratch_ != nullptr) {
    const size_t want = std::max<uint64_t>(engine_->desc().arena_bytes, 256);
    KILN_ASSIGN_OR_RETURN(arena, scratch_->acquire(want));
  }
  bool host_io = false;
  for (size_t i = 0; i < num_inputs(); ++i) {
    if (inputs[i].on_device) continue;
    host_io = true;
    if (inputs[i].nbytes > 0) {
      std::memcpy(input_pinned_[i], inputs[i].data, inputs[i].nbytes);
      ++stats_.h2d_copies;
      stats_.h2d_bytes += inputs[i].nbytes;
    }
  }
  for (size_t i = 0; i < num_outputs(); ++i) host_io |= !outputs[i].on_device;
  const bool must_wait = host_io || scratch_ != nullptr;

  // Runs of this context share its arena, workspace and I/O buffers. The
  // previous run may still be in flight on another stream (device-only I/O
  // returns without waiting), so this one waits for it on the GPU. A stream
  // being captured into the caller's own graph cannot wait on an event
  // recorded outside that capture: such a run is neither ordered nor
  // recorded here (the caller orders its graph's launches).
  bool capturing = false;
  if (run_pending_ || !must_wait) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    KILN_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture));
    capturing = capture != cudaStreamCaptureStatusNone;
  }
  if (run_pending_ && !capturing)
    KILN_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, run_done_, 0));

  Status status;
  if (graphs_enabled_) {
    status = replay(inputs, outputs, stream);
    if (!status.is_ok() && status.code() != StatusCode::kOutOfMemory) {
      // Recording or replay is not possible here: run normally from now on.
      // The delegate logs graph_disabled_reason() once.
      graphs_enabled_ = false;
      graph_disabled_reason_ = status.message();
      graph_.reset();
      (void)cudaStreamSynchronize(stream);
      (void)cudaGetLastError();
      status = Status::ok();
    }
  }
  if (!graphs_enabled_ && status.is_ok()) {
    status = rebind(arena, inputs, outputs);
    if (status.is_ok()) status = enqueue(inputs, outputs, stream);
  }
  if (!status.is_ok()) {
    // Wait for what was enqueued so the next call cannot race with it.
    (void)cudaStreamSynchronize(stream);
    (void)cudaGetLastError();
    return status;
  }
  ++stats_.runs;
  if (!must_wait) {
    if (capturing) return Status::ok();
    const cudaError_t recorded = cudaEventRecord(run_done_, stream);
    if (recorded != cudaSuccess) {
      // Unrecorded, this run could race with the next one: finish it here.
      (void)cudaStreamSynchronize(stream);
      return cuda_error_status(recorded, "cudaEventRecord(run_done_, stream)", __FILE__,
                               __LINE__);
    }
    run_pending_ = true;
    return Status::ok();
  }
  // Kernel faults surface here.
  KILN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  // This stream waited for the previous run (above), so both are done.
  run_pending_ = false;
  for (size_t i = 0; i < num_outputs(); ++i) {
    if (outputs[i].on_device || outputs[i].nbytes == 0) continue;
    std::memcpy(outputs[i].data, output_pinned_[i], outputs[i].nbytes);
    ++stats_.d2h_copies;
    stats_.d2h_bytes += outputs[i].nbytes;
  }
  return Status::ok();
}

Status ExecutionContext::execute(const IoBuffer* inputs, const IoBuffer* outputs,
                                 cudaStream_t stream) {
  KILN_RETURN_IF_ERROR(check_io(inputs, true));
  KILN_RETURN_IF_ERROR(check_io(outputs, false));
  KILN_RETURN_IF_ERROR(ensure_current_device(engine_->device()));
  if (scratch_ == nullptr) return execute_locked(inputs, outputs, stream);
  std::lock_guard<std::mutex> lock(scratch_->mutex());
  return execute_locked(inputs, outputs, stream);
}

Status ExecutionContext::execute_host(const void* const* inputs, const size_t* input_nbytes,
                                      void* const* outputs, const size_t* output_nbytes,
                                      cudaStream_t stream) {
  const size_t n_in = num_inputs(), n_out = num_outputs();
  if ((n_in > 0 && (inputs == nullptr || input_nbytes == nullptr)) ||
      (n_out > 0 && (outputs == nullptr || output_nbytes == nullptr)))
    return make_status(StatusCode::kInvalidArgument, "execute_host: null %s arrays",
                       n_in > 0 && (inputs == nullptr || input_nbytes == nullptr) ? "input"
                                                                                  : "output");
  for (size_t i = 0; i < n_in; ++i)
    host_io_[i] = IoBuffer{const_cast<void*>(inputs[i]), input_nbytes[i], false};
  for (size_t i = 0; i < n_out; ++i)
    host_io_[n_in + i] = IoBuffer{outputs[i], output_nbytes[i], false};
  return execute(host_io_.data(), host_io_.data() + n_in, stream);
}

}  // namespace kiln::runtime
