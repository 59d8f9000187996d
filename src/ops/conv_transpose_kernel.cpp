#include <algorithm>
#include <sstream>

#include "codegen/cuda_dtype.h"
#include "ops/conv_transpose_ops.h"

namespace kiln::ops {
using codegen::load_expr;
using codegen::storage_type;
using codegen::store_expr;

ConvTransposeKernel generate_conv_transpose_kernel(const ir::Graph& graph, const ConvTransposePlan& plan,
                                                   const std::string& name) {
  const ir::Value& x = graph.value(plan.x);
  const ir::Value& w = graph.value(plan.w);
  const ir::Value& y = graph.value(plan.out);
  if (x.shape.size() != 4 || w.shape.size() != 4 || y.shape.size() != 4)
    throw CompileError("transposed convolution '" + y.name + "': needs 4-D NHWC input, [r, s, c, k/groups] weight "
                       "and output");
  const int64_t H = x.shape[1], W = x.shape[2], C = x.shape[3];
  const int64_t R = w.shape[0], S = w.shape[1], KG = w.shape[3];
  const int64_t P = y.shape[1], Q = y.shape[2], K = y.shape[3];
  const int64_t G = plan.groups, CG = C / std::max<int64_t>(G, 1);
  if (G < 1 || C % G != 0 || w.shape[2] != C || KG * G != K || y.shape[0] != x.shape[0])
    throw CompileError("transposed convolution '" + y.name + "': input " + ir::shape_to_string(x.shape) +
                       ", weight " + ir::shape_to_string(w.shape) + " and output " + ir::shape_to_string(y.shape) +
                       " do not match groups=" + std::to_string(G));
  const int64_t kIntMax = 0x7fffffff;
  if (x.numel() > kIntMax || w.numel() > kIntMax || P * Q * K > kIntMax)
    throw CompileError("transposed convolution '" + y.name + "': tensors over 2^31 elements are not supported");

  ConvTransposeKernel gen;
  gen.tensor_args = {plan.out, plan.x, plan.w};
  if (plan.bias >= 0) gen.tensor_args.push_back(plan.bias);
  gen.n = y.numel();
  gen.block = kConvTransposeBlock;
  gen.grid = static_cast<uint32_t>(
      std::min<int64_t>(std::max<int64_t>(1, (gen.n + kConvTransposeBlock - 1) / kConvTransposeBlock), 65536));

  std::ostringstream s;
  s << "extern \"C\" __global__ void __launch_bounds__(" << kConvTransposeBlock << ") " << name << "(\n    "
    << storage_type(y.dtype) << "* __restrict__ out,\n    const " << storage_type(x.dtype) << "* __restrict__ x,\n"
    << "    const " << storage_type(w.dtype) << "* __restrict__ wt";
  if (plan.bias >= 0) s << ",\n    const " << storage_type(graph.value(plan.bias).dtype) << "* __restrict__ bias";
  s << ",\n    long long n_out) {\n"
    << "  const long long step = (long long)gridDim.x * " << kConvTransposeBlock << ";\n"
    << "  for (long long i = (long long)blockIdx.x * " << kConvTransposeBlock << " + threadIdx.x; i < n_out; i += step) {\n"
    << "    const int k = (int)(i % " << K << "LL);\n"
    << "    const long long pix = i / " << K << "LL;\n"
    << "    const int q = (int)(pix % " << Q << "LL);\n"
    << "    const int p = (int)((pix / " << Q << "LL) % " << P << "LL);\n"
    << "    const long long n = pix / " << P * Q << "LL;\n";
  if (G > 1)
    s << "    const int g = k / " << KG << ", kk = k - g * " << KG << ";\n";
  else
    s << "    const int g = 0, kk = k;\n";
  s << "    // x[n, h, w, g*cg + c] and weight [r, s, g*cg + c, kk]\n"
    << "    const " << storage_type(x.dtype) << "* xn = x + n * " << H * W * C << "LL + g * " << CG << ";\n"
    << "    const " << storage_type(w.dtype) << "* wk = wt + g * " << CG * KG << " + kk;\n"
    << "    float acc = 0.0f;\n"
    << "    for (int r = 0; r < " << R << "; ++r) {\n"
    << "      const int hs = p + " << plan.pad_h << " - r * " << plan.dilation_h << ";\n"
    << "      if (hs < 0" << (plan.stride_h > 1 ? " || hs % " + std::to_string(plan.stride_h) + " != 0" : "")
    << ") continue;\n"
    << "      const int h = hs / " << plan.stride_h << ";\n"
    << "      if (h >= " << H << ") continue;\n"
    << "      for (int s = 0; s < " << S << "; ++s) {\n"
    << "        const int ws = q + " << plan.pad_w << " - s * " << plan.dilation_w << ";\n"
    << "        if (ws < 0" << (plan.stride_w > 1 ? " || ws % " + std::to_string(plan.stride_w) + " != 0" : "")
    << ") continue;\n"
    << "        const int wi = ws / " << plan.stride_w << ";\n"
    << "        if (wi >= " << W << ") continue;\n"
    << "        const " << storage_type(x.dtype) << "* xp = xn + (h * " << W << " + wi) * " << C << "LL;\n"
    << "        const " << storage_type(w.dtype) << "* wp = wk + (r * " << S << " + s) * " << C * KG << "LL;\n"
    << "        for (int c = 0; c < " << CG << "; ++c) acc += " << load_expr(x.dtype, "xp[c]") << " * "
    << load_expr(w.dtype, "wp[c * " + std::to_string(KG) + "]") << ";\n"
    << "      }\n"
    << "    }\n";
  if (plan.bias >= 0) s << "    acc += " << load_expr(graph.value(plan.bias).dtype, "bias[k]") << ";\n";
  if (plan.relu) s << "    acc = kiln_relu(acc);\n";
  s << "    out[i] = " << store_expr(y.dtype, "acc") << ";\n  }\n}\n";
  gen.source = s.str();
  return gen;
}

}  // namespace kiln::ops
