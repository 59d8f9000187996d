// AOTInductor's C++ loader (torch::inductor::AOTIModelPackageLoader) on a
// .pt2 package, for the benchmark's AOTInductor peer when the Python loaders
// crash (benchmarks/aoti_peer.py --loader cpp builds and runs this against
// the installed torch's libtorch). Times each synchronized call with CUDA
// events on torch's current stream and prints one line per run:
//   ms <milliseconds>
// Usage: aoti_cpp_loader PACKAGE SHAPE(comma-separated) CHANNELS_LAST(0|1) WARMUP RUNS
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s PACKAGE SHAPE CHANNELS_LAST WARMUP RUNS\n", argv[0]);
    return 2;
  }
  std::vector<int64_t> shape;
  std::stringstream dims(argv[2]);
  for (std::string d; std::getline(dims, d, ',');) shape.push_back(std::stoll(d));
  const bool channels_last = std::string(argv[3]) == "1";
  const int warmup = std::atoi(argv[4]), runs = std::atoi(argv[5]);

  std::printf("stage: load (cpp)\n");
  std::fflush(stdout);
  torch::inductor::AOTIModelPackageLoader loader(argv[1]);
  torch::NoGradGuard no_grad;
  torch::Tensor x = torch::randn(shape, torch::dtype(torch::kHalf).device(torch::kCUDA));
  if (channels_last && shape.size() == 4) x = x.contiguous(at::MemoryFormat::ChannelsLast);
  std::vector<torch::Tensor> inputs = {x};
  std::printf("stage: run\n");
  std::fflush(stdout);
  for (int i = 0; i < warmup; ++i) (void)loader.run(inputs);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  cudaEvent_t start, stop;
  if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess) return 1;
  if (cudaStreamSynchronize(stream) != cudaSuccess) return 1;
  for (int i = 0; i < runs; ++i) {
    cudaEventRecord(start, stream);
    std::vector<torch::Tensor> out = loader.run(inputs);
    cudaEventRecord(stop, stream);
    if (cudaEventSynchronize(stop) != cudaSuccess) return 1;
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    std::printf("ms %.6f\n", ms);
  }
  std::fflush(stdout);
  return 0;
}
