// Why this machine has no usable CUDA GPU, in words, for kiln_runner's
// message when a Kiln model cannot load (the delegate only answers yes/no
// through is_available()).
#pragma once

#include <string>

namespace kiln::tools {

// "" when the CUDA runtime sees at least one GPU; otherwise the cause, e.g.
// "no NVIDIA driver: libcuda.so.1 cannot be loaded (CUDA says: ...)". Never
// loads anything the process keeps: the driver is only probed with dlopen.
std::string describe_missing_gpu();

}  // namespace kiln::tools
