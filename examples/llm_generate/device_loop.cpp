#include "device_loop.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>

namespace llm {
namespace {

namespace et = executorch::runtime;
using executorch::aten::ScalarType;
using executorch::extension::make_tensor_ptr;

// The delegate runs on the calling thread's default stream when the caller sets none.
const cudaStream_t kStream = cudaStreamPerThread;

std::string cuda_error(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

size_t element_bytes(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return 4;
    case ScalarType::Half:
    case ScalarType::BFloat16: return 2;
    default: return 0;
  }
}

float to_float(ScalarType t, const unsigned char* p) {
  if (t == ScalarType::Float) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  if (t == ScalarType::BFloat16) {
    const uint32_t w = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &w, 4);
    return f;
  }
  executorch::aten::Half h;
  h.x = bits;
  return static_cast<float>(h);
}

}  // namespace

#define LLM_CUDA(call)                                        \
  do {                                                        \
    const cudaError_t e_ = (call);                            \
    if (e_ != cudaSuccess) return cuda_error(#call, e_);      \
  } while (0)

DeviceLoop::~DeviceLoop() {
  (void)cudaStreamSynchronize(kStream);
  for (executorch::extension::TensorPtr* t :
       {&prompt_tokens_, &prompt_positions_, &token_, &position_, &out_token_, &out_logits_})
    t->reset();
  for (void* p : device_buffers_) (void)cudaFree(p);
  for (void* p : host_buffers_) (void)cudaFreeHost(p);
}

void* DeviceLoop::allocate(size_t nbytes, bool pinned_host, std::string* error) {
  void* p = nullptr;
  const cudaError_t e = pinned_host ? cudaMallocHost(&p, nbytes == 0 ? 1 : nbytes) : cudaMalloc(&p, nbytes == 0 ? 1 : nbytes);
  if (e != cudaSuccess) {
    *error = cuda_error(pinned_host ? "cudaMallocHost" : "cudaMalloc", e);
    return nullptr;
  }
  (pinned_host ? host_buffers_ : device_buffers_).push_back(p);
  return p;
}

std::string DeviceLoop::prepare(executorch::extension::Module& module, const std::vector<int64_t>& prompt,
                                int new_tokens, const std::vector<int64_t>& forced, bool want_logits) {
  module_ = &module;
  prompt_len_ = static_cast<int64_t>(prompt.size());
  new_tokens_ = new_tokens;
  const executorch::aten::Device cuda(executorch::aten::DeviceType::CUDA, 0);
  const size_t s = prompt.size(), n = static_cast<size_t>(new_tokens);
  std::string error;
  auto* d_prompt = static_cast<int64_t*>(allocate(8 * s, false, &error));
  auto* d_prompt_pos = d_prompt ? static_cast<int64_t*>(allocate(8 * s, false, &error)) : nullptr;
  d_out_ = d_prompt_pos ? static_cast<int64_t*>(allocate(8, false, &error)) : nullptr;
  d_token_ = d_out_ ? static_cast<int64_t*>(allocate(8, false, &error)) : nullptr;
  d_position_ = d_token_ ? static_cast<int64_t*>(allocate(8, false, &error)) : nullptr;
  d_record_ = d_position_ ? static_cast<int64_t*>(allocate(8 * n, false, &error)) : nullptr;
  h_positions_ = d_record_ ? static_cast<int64_t*>(allocate(8 * n, true, &error)) : nullptr;
  h_forced_ = h_positions_ ? static_cast<int64_t*>(allocate(8 * n, true, &error)) : nullptr;
  if (h_forced_ == nullptr) return error;
  std::vector<int64_t> positions(s);
  for (size_t i = 0; i < s; ++i) positions[i] = static_cast<int64_t>(i);
  LLM_CUDA(cudaMemcpy(d_prompt, prompt.data(), 8 * s, cudaMemcpyHostToDevice));
  LLM_CUDA(cudaMemcpy(d_prompt_pos, positions.data(), 8 * s, cudaMemcpyHostToDevice));
  for (size_t i = 0; i < n; ++i) {
    h_positions_[i] = prompt_len_ + static_cast<int64_t>(i) - 1;  // step i's position (i >= 1)
    h_forced_[i] = i >= 1 && i - 1 < forced.size() ? forced[i - 1] : 0;
  }
  forced_ = !forced.empty();
  const auto sz = static_cast<executorch::aten::SizesType>(s);
  prompt_tokens_ = make_tensor_ptr({1, sz}, d_prompt, ScalarType::Long, cuda);
  prompt_positions_ = make_tensor_ptr({sz}, d_prompt_pos, ScalarType::Long, cuda);
  token_ = make_tensor_ptr({1, 1}, d_token_, ScalarType::Long, cuda);
  position_ = make_tensor_ptr({1}, d_position_, ScalarType::Long, cuda);
  out_token_ = make_tensor_ptr({1}, d_out_, ScalarType::Long, cuda);

  for (const char* method : {"prefill", "decode"}) {
    et::Result<et::MethodMeta> meta = module.method_meta(method);
    if (!meta.ok()) return std::string("cannot read method '") + method + "''s metadata";
    const size_t outputs = meta->num_outputs();
    et::Result<et::TensorInfo> first = meta->output_tensor_meta(0);
    if (outputs == 0 || !first.ok() || first->scalar_type() != ScalarType::Long || first->nbytes() != 8)
      return std::string("method '") + method + "' must return the next token as int64 [1] first";
    if (outputs > 1) {
      et::Result<et::TensorInfo> lg = meta->output_tensor_meta(1);
      if (!lg.ok() || element_bytes(lg->scalar_type()) == 0 || lg->sizes().size() != 2)
        return std::string("method '") + method + "''s second output is not the logits [1, vocab]";
      if (d_logits_ == nullptr) {
        logits_type_ = lg->scalar_type();
        logits_row_bytes_ = lg->nbytes();
        vocab_ = lg->sizes()[1];
        if ((d_logits_ = allocate(logits_row_bytes_, false, &error)) == nullptr) return error;
        out_logits_ = make_tensor_ptr({1, static_cast<executorch::aten::SizesType>(vocab_)}, d_logits_, logits_type_, cuda);
        if (want_logits &&
            (h_logits_ = static_cast<unsigned char*>(allocate(logits_row_bytes_ * n, true, &error))) == nullptr)
          return error;
      } else if (lg->nbytes() != logits_row_bytes_) {
        return "prefill and decode return logits of different sizes";
      }
    }
    for (size_t i = 0; i < outputs && i < 2; ++i) {
      const et::Error set = module.set_output(method, et::EValue(i == 0 ? *out_token_ : *out_logits_), i);
      if (set != et::Error::Ok)
        return std::string("Module::set_output('") + method + "', " + std::to_string(i) + ") failed (error " +
               std::to_string(static_cast<int>(set)) +
               "): the program must be saved with device-resident I/O (export_llama.py --device-io)";
    }
  }
  if (want_logits && h_logits_ == nullptr) return "the methods return no logits (export with --logits)";
  return "";
}

std::string DeviceLoop::run(const char* method, executorch::extension::TensorPtr& tokens,
                            executorch::extension::TensorPtr& positions) {
  auto out = module_->execute(method, {et::EValue(*tokens), et::EValue(*positions)});
  if (out.ok()) return "";
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s failed (error 0x%x; a program saved without device-resident I/O refuses "
                "CUDA tensors: export it with --device-io)", method, static_cast<unsigned>(out.error()));
  return buf;
}

std::string DeviceLoop::prefill() {
  if (std::string why = run("prefill", prompt_tokens_, prompt_positions_); !why.empty()) return why;
  LLM_CUDA(cudaMemcpyAsync(d_record_, d_out_, 8, cudaMemcpyDeviceToDevice, kStream));
  if (h_logits_) LLM_CUDA(cudaMemcpyAsync(h_logits_, d_logits_, logits_row_bytes_, cudaMemcpyDeviceToHost, kStream));
  LLM_CUDA(cudaStreamSynchronize(kStream));
  return "";
}

std::string DeviceLoop::decode(int i) {
  if (i < 1 || i >= new_tokens_) return "decode step " + std::to_string(i) + " is outside 1.." + std::to_string(new_tokens_ - 1);
  if (forced_)
    LLM_CUDA(cudaMemcpyAsync(d_token_, h_forced_ + i, 8, cudaMemcpyHostToDevice, kStream));
  else
    LLM_CUDA(cudaMemcpyAsync(d_token_, d_out_, 8, cudaMemcpyDeviceToDevice, kStream));
  LLM_CUDA(cudaMemcpyAsync(d_position_, h_positions_ + i, 8, cudaMemcpyHostToDevice, kStream));
  if (std::string why = run("decode", token_, position_); !why.empty()) return why;
  LLM_CUDA(cudaMemcpyAsync(d_record_ + i, d_out_, 8, cudaMemcpyDeviceToDevice, kStream));
  if (h_logits_)
    LLM_CUDA(cudaMemcpyAsync(h_logits_ + static_cast<size_t>(i) * logits_row_bytes_, d_logits_, logits_row_bytes_,
                             cudaMemcpyDeviceToHost, kStream));
  return "";
}

std::string DeviceLoop::finish(std::vector<int64_t>* tokens, std::vector<float>* logits) {
  LLM_CUDA(cudaStreamSynchronize(kStream));
  tokens->assign(static_cast<size_t>(new_tokens_), 0);
  LLM_CUDA(cudaMemcpy(tokens->data(), d_record_, 8 * tokens->size(), cudaMemcpyDeviceToHost));
  if (logits != nullptr && h_logits_ != nullptr) {
    const size_t elem = element_bytes(logits_type_), count = static_cast<size_t>(vocab_) * tokens->size();
    logits->resize(count);
    for (size_t j = 0; j < count; ++j) (*logits)[j] = to_float(logits_type_, h_logits_ + j * elem);
  }
  return "";
}

}  // namespace llm
