// cpp_module_app: loads a .pte with ExecuTorch's Module and runs it once on
// inputs filled with a fixed pattern. No Kiln header is needed: linking
// executorch::backend_kiln registers "KilnBackend" before main() starts.
//
//   cpp_module_app model.pte [method]
//
// exit codes: 0 ran, 1 could not load or run, 2 usage or unsupported input,
//             3 the model needs KilnBackend and this machine has no usable CUDA GPU,
//             4 KilnBackend is not registered (the delegate library was not linked)
#include <cstdio>
#include <string>
#include <vector>

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor_ptr_maker.h>
#include <executorch/runtime/backend/interface.h>

#ifdef APP_USE_CALLER_STREAM
#include <cuda_runtime_api.h>
#include <kiln/caller_stream.h>
#endif

namespace et = executorch::runtime;
using executorch::aten::ScalarType;
using executorch::extension::Module;

namespace {

constexpr const char* kKiln = "KilnBackend";

// Inputs are float32 here for brevity; a real app passes its own data.
bool make_inputs(const et::MethodMeta& meta, std::vector<executorch::extension::TensorPtr>* tensors) {
  for (size_t i = 0; i < meta.num_inputs(); ++i) {
    et::Result<et::TensorInfo> info = meta.input_tensor_meta(i);
    if (!info.ok() || info->scalar_type() != ScalarType::Float) {
      std::fprintf(stderr, "cpp_module_app: input %zu is not a float32 tensor; this example fills only those\n", i);
      return false;
    }
    std::vector<executorch::aten::SizesType> sizes(info->sizes().begin(), info->sizes().end());
    size_t numel = 1;
    for (auto s : sizes) numel *= static_cast<size_t>(s);
    std::vector<float> data(numel);
    for (size_t k = 0; k < numel; ++k) data[k] = static_cast<float>(k % 7) * 0.25f - 0.75f;
    tensors->push_back(executorch::extension::make_tensor_ptr(std::move(sizes), std::move(data)));
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: cpp_module_app model.pte [method]\n");
    return 2;
  }
  const std::string method = argc == 3 ? argv[2] : "forward";

  et::BackendInterface* kiln = et::get_backend_class(kKiln);
  if (kiln == nullptr) {
    std::printf("KilnBackend: NOT registered (link executorch::backend_kiln)\n");
    return 4;
  }
  const bool gpu = kiln->is_available();
  std::printf("KilnBackend: registered, %s\n", gpu ? "CUDA GPU available" : "no usable CUDA GPU");

  Module module(argv[1], Module::LoadMode::Mmap);
  // Verify the whole program before reading it: with ExecuTorch's default
  // (Minimal) a damaged file can crash the process instead of failing here.
  if (et::Error error = module.load(et::Program::Verification::InternalConsistency);
      error != et::Error::Ok) {
    std::fprintf(stderr, "cpp_module_app: cannot load %s: %s (error 0x%x)\n", argv[1],
                 et::to_string(error), static_cast<unsigned>(error));
    return 1;
  }
  et::Result<et::MethodMeta> meta = module.method_meta(method);
  if (!meta.ok()) {
    std::fprintf(stderr, "cpp_module_app: cannot read method '%s' of %s (error 0x%x)\n", method.c_str(),
                 argv[1], static_cast<unsigned>(meta.error()));
    return 1;
  }
  if (meta->uses_backend(kKiln) && !gpu) {
    std::fprintf(stderr, "cpp_module_app: '%s' uses KilnBackend, which needs an NVIDIA GPU; none is usable here\n",
                 method.c_str());
    return 3;
  }

  std::vector<executorch::extension::TensorPtr> tensors;
  if (!make_inputs(*meta, &tensors)) return 2;
  std::vector<et::EValue> inputs(tensors.begin(), tensors.end());

#ifdef APP_USE_CALLER_STREAM
  // Every Kiln delegate run while the guard lives uses the app's stream.
  cudaStream_t stream = nullptr;
  if (cudaStreamCreate(&stream) != cudaSuccess) {
    std::fprintf(stderr, "cpp_module_app: cudaStreamCreate failed\n");
    return 1;
  }
  auto outputs = [&] {
    kiln::CallerStreamGuard guard(stream);
    return module.execute(method, inputs);
  }();
  cudaStreamDestroy(stream);
#else
  auto outputs = module.execute(method, inputs);
#endif
  if (!outputs.ok()) {
    std::fprintf(stderr, "cpp_module_app: execute('%s') failed (error 0x%x)\n", method.c_str(),
                 static_cast<unsigned>(outputs.error()));
    return 1;
  }
  for (size_t i = 0; i < outputs->size(); ++i) {
    const auto& value = (*outputs)[i];
    if (!value.isTensor()) continue;
    const auto& t = value.toTensor();
    std::printf("output %zu: %zd elements, first %g\n", i, static_cast<ssize_t>(t.numel()),
                t.scalar_type() == ScalarType::Float && t.numel() > 0 ? t.const_data_ptr<float>()[0] : 0.0);
  }
  return 0;
}
