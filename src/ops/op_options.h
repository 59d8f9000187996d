// Compile options that change how ops are planned. Each one is a
// kiln.compile option, recorded in the engine's metadata (compiler.cpp) and
// shown by `kiln inspect`; nothing here is read from the environment.
#pragma once

#include <string>

#include "ops/decode_layers_kernel.h"

namespace kiln::ops {

struct OpOptions {
  // 1x1 convolutions as cuBLASLt GEMMs: "all" (strided ones through a gather
  // kernel, and so are convolutions whose kernel equals their stride, see
  // passes/patchify_conv.cpp), "unstrided" (stride 1 only) or "none" (every
  // conv on cuDNN).
  enum class ConvGemm { kAll, kUnstrided, kNone } conv_gemm = ConvGemm::kAll;
  // Depthwise convolutions as generated NHWC kernels with the elementwise
  // chain after them fused in; false keeps them on cuDNN.
  bool depthwise_kernels = true;
  // Products of at most 4 activation rows with a [n, k] weight (a decode
  // step's linears) as generated matrix-vector kernels (gemv_kernel.h)
  // instead of cuBLASLt; false keeps every product on cuBLASLt.
  bool gemv_kernels = true;
  // The oldest SM the engine's kernels are built for (from target_sms, which
  // the engine records): kernels with sm_80 instructions (mma.sync on
  // bfloat16, ldmatrix) are planned only when it is 80 or newer.
  int min_target_sm = 80;
  // kiln.compile's overlap_launches: the sm_90+ cubins' kernels launch while
  // their predecessor runs (codegen/grid_dependency.h), so a kernel may read
  // its constants before it waits (a matrix-vector product's first weight
  // loads; a decode attention's L2 prefetch of its cache rows). Set by the
  // compiler from CompileOptions::overlap_launches.
  bool overlap_launches = false;
  // kiln.compile's persistent_decode: a language model's decode layers (Llama-style, the shapes
  // ops/decode_layers_kernel.h takes) become one persistent kernel (passes/fold_decode_layers.cpp).
  // Needs every target SM to be sm_90 or newer; off by default until it has run on the GPU in
  // the generation example.
  bool persistent_decode = false;
  // kiln.compile(persistent_decode={...}): the persistent kernel's tuning options (set through
  // set_decode_layers_option; the defaults are the ones measured best).
  DecodeLayersKernelOptions decode_layers;
};

const char* conv_gemm_name(OpOptions::ConvGemm mode);  // "all", "unstrided", "none"
// Throws CompileError for an unknown name.
OpOptions::ConvGemm parse_conv_gemm(const std::string& name);

}  // namespace kiln::ops
