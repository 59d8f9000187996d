// Running generated kernels on the CPU, for the kernel numerics tests: the
// generated CUDA source (the module prelude plus a kernel, as lowering makes
// them) is compiled as host C++ against a shim header (cuda_host_shim.h for
// thread-by-thread kernels, cuda_block_shim.h for kernels whose threads
// cooperate) into a shared library and loaded. Also the element helpers the
// references share.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "engine_format/engine_desc.h"

namespace kiln::testing {

// Compiles `source` (which must #include nothing itself) as host C++ after
// `#include "<shim_header>"`; returns the dlopen handle, or nullptr after
// reporting a GoogleTest failure with the compiler's log. Each call builds a
// new library (its path is fresh), whatever `tag` is.
void* build_host_module(const std::string& source, const std::string& tag, const std::string& shim_header);

// Compiles kernel `fn` (its source `src`, after host_prelude()) through
// `shim_header` and launches it once over `grid` x `block` threads with
// `args`; a GoogleTest failure when it does not build. `tag` names the
// module's temporary folder (a library holding the shim's thread_locals is
// never unloaded).
void run_host_kernel(const std::string& src, const std::string& fn, const std::string& tag, void** args,
                     unsigned grid, unsigned block, const std::string& shim_header);

// Kernel `fn` of `source` (after host_prelude()) built with cuda_block_shim.h
// at `block_shim_header` (its threads cooperate), as a launcher of its whole
// grid, blocks in order and each block's warps in `order` (a kiln_shim::Order
// spelled as C++); nullptr after a GoogleTest failure when it does not build.
using BlockLaunch = void (*)(void** args, unsigned grid, unsigned block);
BlockLaunch block_launcher(const std::string& source, const std::string& fn, const std::string& tag,
                           const std::string& block_shim_header,
                           const std::string& order = "kiln_shim::Order::kLowWarpFirst");

// ops::pointwise_prelude() without its PTX-asm functions (the shim defines those).
std::string host_prelude();

// Element i of `bytes` in dtype `d`, widened; and the store that narrows
// with round-to-nearest-even.
double read_elem(engine::DType d, const std::vector<uint8_t>& bytes, size_t i);
void write_elem(engine::DType d, std::vector<uint8_t>& bytes, size_t i, float v);
// Rounds to `d`'s precision, as a store would.
double round_to(engine::DType d, double v);

// `count` elements of dtype `d`, uniform in [lo, hi) (rounded to `d`).
std::vector<uint8_t> random_elems(engine::DType d, int64_t count, std::mt19937& rng, float lo, float hi);

}  // namespace kiln::testing
