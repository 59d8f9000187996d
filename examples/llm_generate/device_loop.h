// Greedy generation whose tokens never leave the GPU between steps (llm_generate --device_io).
//
// The program must be saved with ExecuTorch's device-resident configuration (export_llama.py
// --device-io): its methods then take and return CUDA tensors, and the Kiln delegate returns
// without waiting for the GPU. Each decode step is enqueued on the delegate's stream
// (cudaStreamPerThread) as: the last step's token copied into the fixed input buffer (or a
// forced token from pinned host memory), the position from pinned host memory, the method (one
// CUDA-graph replay: the buffers' addresses never change), the token appended to a device
// record. The host waits once, after the last step; the torch.compile loop of
// benchmarks/llm_bench.py keeps its tokens on the GPU the same way.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor_ptr.h>

namespace llm {

class DeviceLoop {
 public:
  DeviceLoop() = default;
  DeviceLoop(const DeviceLoop&) = delete;
  DeviceLoop& operator=(const DeviceLoop&) = delete;
  ~DeviceLoop();

  // Allocates the fixed buffers, uploads the prompt and the positions, and binds both methods'
  // outputs (the token, and the logits when the methods return them). `forced`, when not empty,
  // feeds decode step i its token i - 1 (teacher forcing). "" or why it cannot run.
  std::string prepare(executorch::extension::Module& module, const std::vector<int64_t>& prompt, int new_tokens,
                      const std::vector<int64_t>& forced, bool want_logits);
  // Enqueues prefill over the whole prompt and waits for it (the time to first token).
  std::string prefill();
  // Enqueues decode step i (1 <= i < new_tokens) at position prompt + i - 1; does not wait.
  std::string decode(int i);
  // Waits for the enqueued steps; the tokens chosen (prefill's, then each step's) and, when
  // asked for, every step's logits as floats [new_tokens][vocab].
  std::string finish(std::vector<int64_t>* tokens, std::vector<float>* logits);

 private:
  std::string run(const char* method, executorch::extension::TensorPtr& tokens,
                  executorch::extension::TensorPtr& positions);
  void* allocate(size_t nbytes, bool pinned_host, std::string* error);

  executorch::extension::Module* module_ = nullptr;
  std::vector<void*> device_buffers_, host_buffers_;
  executorch::extension::TensorPtr prompt_tokens_, prompt_positions_, token_, position_, out_token_, out_logits_;
  int64_t* d_out_ = nullptr;        // the methods' output token
  int64_t* d_token_ = nullptr;      // decode's input token
  int64_t* d_position_ = nullptr;   // decode's input position
  int64_t* d_record_ = nullptr;     // every token chosen, [new_tokens]
  int64_t* h_positions_ = nullptr;  // pinned: decode step i's position at [i]
  int64_t* h_forced_ = nullptr;     // pinned: decode step i's forced token at [i] (teacher forcing)
  void* d_logits_ = nullptr;        // the methods' logits output [1, vocab]
  unsigned char* h_logits_ = nullptr;  // pinned: every step's logits, [new_tokens][vocab] in the model's dtype
  size_t logits_row_bytes_ = 0;
  executorch::aten::ScalarType logits_type_ = executorch::aten::ScalarType::Float;
  int64_t vocab_ = 0, prompt_len_ = 0;
  int new_tokens_ = 0;
  bool forced_ = false;
};

}  // namespace llm
