#include "ops/pool_kernel.h"

#include <sstream>

#include "codegen/cuda_dtype.h"

namespace kiln::ops {
using codegen::affine_offset;
using codegen::load_expr;
using codegen::storage_type;
using codegen::store_expr;

std::string generate_pool_kernel(const ir::Graph& graph, const PoolPlan& plan, const std::string& name) {
  using Kind = PoolPlan::Kind;
  const ir::Value& in = graph.value(plan.input);
  const ir::Value& out = graph.value(plan.out);
  const int64_t H = in.shape.at(1), W = in.shape.at(2), C = in.shape.at(3);
  const int64_t P = out.shape.at(1), Q = out.shape.at(2);
  std::ostringstream s;
  s << "extern \"C\" __global__ void __launch_bounds__(" << kPoolBlock << ") " << name << "(\n    "
    << storage_type(out.dtype) << "* __restrict__ out, const " << storage_type(in.dtype)
    << "* __restrict__ in, long long n_out) {\n"
    << "  const long long stride = (long long)gridDim.x * " << kPoolBlock << ";\n"
    << "  for (long long i = (long long)blockIdx.x * " << kPoolBlock << " + threadIdx.x; i < n_out; i += stride) {\n"
    << "    const long long c = i % " << C << "LL;\n"
    << "    const long long q = (i / " << C << "LL) % " << Q << "LL;\n"
    << "    const long long p = (i / " << C * Q << "LL) % " << P << "LL;\n"
    << "    const long long n = i / " << C * Q * P << "LL;\n"
    << "    const " << storage_type(in.dtype) << "* x = in + n * " << H * W * C << "LL + c;\n";
  auto load = [&](const std::string& h, const std::string& w) {
    return load_expr(in.dtype, "x[(" + h + " * " + std::to_string(W) + "LL + " + w + ") * " + std::to_string(C) + "LL]");
  };
  if (plan.kind == Kind::kAdaptiveAvg) {
    s << "    const long long h0 = (p * " << H << "LL) / " << P << "LL, h1 = ((p + 1) * " << H << "LL + " << P - 1
      << "LL) / " << P << "LL;\n"
      << "    const long long w0 = (q * " << W << "LL) / " << Q << "LL, w1 = ((q + 1) * " << W << "LL + " << Q - 1
      << "LL) / " << Q << "LL;\n"
      << "    float acc = 0.0f;\n"
      << "    for (long long h = h0; h < h1; ++h)\n"
      << "      for (long long w = w0; w < w1; ++w) acc += " << load("h", "w") << ";\n"
      << "    const float v = acc / (float)((h1 - h0) * (w1 - w0));\n";
  } else if (plan.kind == Kind::kMax) {
    s << "    float v = -__int_as_float(0x7f800000);\n"
      << "    #pragma unroll\n"
      << "    for (int kh = 0; kh < " << plan.kernel_h << "; ++kh) {\n"
      << "      const long long h = p * " << plan.stride_h << "LL - " << plan.pad_h << "LL + kh * "
      << plan.dilation_h << "LL;\n"
      << "      if (h < 0 || h >= " << H << "LL) continue;\n"
      << "      #pragma unroll\n"
      << "      for (int kw = 0; kw < " << plan.kernel_w << "; ++kw) {\n"
      << "        const long long w = q * " << plan.stride_w << "LL - " << plan.pad_w << "LL + kw * "
      << plan.dilation_w << "LL;\n"
      << "        if (w < 0 || w >= " << W << "LL) continue;\n"
      << "        const float e = " << load("h", "w") << ";\n"
      << "        v = (e > v || e != e) ? e : v;  // NaN wins, as in PyTorch\n"
      << "      }\n"
      << "    }\n";
  } else {
    // PyTorch's avg_pool2d: the window may run into the padding (and, with
    // ceil_mode, past it); count_include_pad counts padded positions up to
    // the padded edge.
    s << "    long long h0 = p * " << plan.stride_h << "LL - " << plan.pad_h << "LL, w0 = q * " << plan.stride_w
      << "LL - " << plan.pad_w << "LL;\n"
      << "    long long h1 = min(h0 + " << plan.kernel_h << "LL, " << H + plan.pad_h << "LL), w1 = min(w0 + "
      << plan.kernel_w << "LL, " << W + plan.pad_w << "LL);\n"
      << "    const long long padded = (h1 - h0) * (w1 - w0);\n"
      << "    h0 = max(h0, 0LL); w0 = max(w0, 0LL); h1 = min(h1, " << H << "LL); w1 = min(w1, " << W << "LL);\n"
      << "    float acc = 0.0f;\n"
      << "    for (long long h = h0; h < h1; ++h)\n"
      << "      for (long long w = w0; w < w1; ++w) acc += " << load("h", "w") << ";\n";
    if (plan.divisor_override != 0)
      s << "    const float v = acc / " << plan.divisor_override << ".0f;\n";
    else if (plan.count_include_pad)
      s << "    const float v = acc / (float)padded;\n";
    else
      s << "    const float v = acc / (float)((h1 - h0) * (w1 - w0));\n";
  }
  s << "    out[i] = " << store_expr(out.dtype, "v") << ";\n  }\n}\n";
  return s.str();
}

}  // namespace kiln::ops
