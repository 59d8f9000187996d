#include "ops/depthwise_kernel.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "codegen/cuda_dtype.h"
#include "ops/elementwise_kernel.h"
#include "ops/op_registry.h"

namespace kiln::ops {
using codegen::affine_offset;
using codegen::load_expr;
using codegen::storage_type;
using codegen::store_expr;
namespace {

enum class OperandKind { kScalar, kChannel, kFull };

OperandKind operand_kind(const std::vector<int64_t>& operand, const std::vector<int64_t>& out) {
  if (ir::numel_of(operand) == 1) return OperandKind::kScalar;
  if (operand == out) return OperandKind::kFull;
  return OperandKind::kChannel;  // depthwise_epilogue_operand_ok checked it
}

const char* vector_type(engine::DType d, int64_t lanes) {
  const bool f32 = d == engine::DType::kFloat32;
  if (lanes == 2) return f32 ? "float2" : "ushort2";
  return f32 ? "float4" : "ushort4";
}

const char* const kLane[] = {"x", "y", "z", "w"};

}  // namespace

bool depthwise_epilogue_operand_ok(const std::vector<int64_t>& operand, const std::vector<int64_t>& out) {
  if (ir::numel_of(operand) == 1 || operand == out) return true;
  if (operand.empty() || out.empty() || operand.size() > out.size()) return false;
  return operand.back() == out.back() && ir::numel_of(operand) == out.back();
}

DepthwiseKernel generate_depthwise_kernel(const ir::Graph& graph, const DepthwisePlan& plan,
                                          const std::string& name) {
  const ConvPlan& cv = plan.conv;
  const ir::Value& x = graph.value(cv.x);
  const ir::Value& wt = graph.value(plan.weight);
  const ir::Value& y = graph.value(cv.out);
  const ir::Value& out = graph.value(plan.out);
  if (x.shape.size() != 4 || y.shape.size() != 4 || wt.shape.size() != 3)
    throw CompileError("internal: depthwise conv '" + y.name + "' needs x [n,h,w,c], weight [r,s,c], out [n,p,q,c]");
  const int64_t N = x.shape[0], H = x.shape[1], W = x.shape[2], C = x.shape[3];
  const int64_t P = y.shape[1], Q = y.shape[2], R = wt.shape[0], S = wt.shape[1];
  if (wt.shape[2] != C || y.shape[3] != C || y.shape[0] != N || cv.groups != C || out.shape != y.shape)
    throw CompileError("internal: depthwise conv '" + y.name + "' has mismatched shapes");
  for (int v : {cv.x, plan.weight, cv.bias})
    if (v >= 0 && graph.value(v).dtype != y.dtype)
      throw CompileError("depthwise conv '" + y.name + "': operand '" + graph.value(v).name + "' is " +
                         engine::dtype_name(graph.value(v).dtype) + ", result is " + engine::dtype_name(y.dtype));
  for (int v : plan.epilogue.inputs)
    if (!depthwise_epilogue_operand_ok(graph.value(v).shape, y.shape))
      throw CompileError("internal: depthwise epilogue operand '" + graph.value(v).name + "' of shape " +
                         ir::shape_to_string(graph.value(v).shape) + " does not broadcast per element or channel");

  DepthwiseKernel k;
  k.n = out.numel();
  k.vector = C % 4 == 0 ? std::min<int64_t>(4, kDepthwiseMaxVector) : C % 2 == 0 ? std::min<int64_t>(2, kDepthwiseMaxVector) : 1;
  k.tensor_args = {plan.out, cv.x, plan.weight};
  if (cv.bias >= 0) k.tensor_args.push_back(cv.bias);
  for (int v : plan.epilogue.inputs) k.tensor_args.push_back(v);
  const int64_t blocks = (k.n / k.vector + kDepthwiseBlock - 1) / kDepthwiseBlock;
  k.grid = static_cast<uint32_t>(std::clamp<int64_t>(blocks, 1, 65536));
  k.block = kDepthwiseBlock;

  // 32-bit indexing when every index (and the grid-stride overshoot) fits.
  const int64_t largest = std::max(x.numel(), k.n) + (int64_t{65536} * kDepthwiseBlock) * 2;
  const std::string I = largest < (int64_t{1} << 31) ? "int" : "long long";
  auto lit = [&](int64_t v) { return "(" + I + ")" + std::to_string(v) + (I == "int" ? "" : "LL"); };

  const std::string xt = storage_type(x.dtype), ot = storage_type(out.dtype);
  std::ostringstream s;
  s << "// depthwise " << R << "x" << S << " conv over " << ir::shape_to_string(x.shape) << " -> "
    << ir::shape_to_string(y.shape) << " (" << plan.epilogue.nodes.size() << " epilogue ops)\n";
  s << "extern \"C\" __global__ void __launch_bounds__(" << kDepthwiseBlock << ") " << name << "(\n    " << ot
    << "* __restrict__ out,\n    const " << xt << "* __restrict__ x,\n    const " << xt << "* __restrict__ wt";
  if (cv.bias >= 0) s << ",\n    const " << xt << "* __restrict__ bias";
  for (size_t j = 0; j < plan.epilogue.inputs.size(); ++j)
    s << ",\n    const " << storage_type(graph.value(plan.epilogue.inputs[j]).dtype) << "* __restrict__ e" << j;
  s << ",\n    long long n) {\n";

  // One grid-stride loop over (n, p, q, channel group) with `lanes` channels
  // per thread; vector loads and stores when lanes > 1.
  auto loop = [&](int64_t lanes) {
    const bool vec = lanes > 1;
    const int64_t CV = C / lanes;
    std::ostringstream b;
    b << "    const " << I << " count = (" << I << ")(n / " << lanes << "LL);\n"
      << "    const " << I << " stride = (" << I << ")gridDim.x * " << kDepthwiseBlock << ";\n"
      << "    for (" << I << " i = (" << I << ")blockIdx.x * " << kDepthwiseBlock
      << " + (" << I << ")threadIdx.x; i < count; i += stride) {\n"
      << "      const " << I << " c = (i % " << lit(CV) << ") * " << lanes << ";\n"
      << "      const " << I << " q = (i / " << lit(CV) << ") % " << lit(Q) << ";\n"
      << "      const " << I << " p = (i / " << lit(CV * Q) << ") % " << lit(P) << ";\n"
      << "      const " << I << " b = i / " << lit(CV * Q * P) << ";\n"
      << "      float";
    for (int64_t l = 0; l < lanes; ++l) b << (l ? ", " : " ") << "a" << l << " = 0.0f";
    b << ";\n"
      << "      #pragma unroll\n"
      << "      for (int r = 0; r < " << R << "; ++r) {\n"
      << "        const " << I << " h = p * " << lit(cv.stride_h) << " - " << lit(cv.pad_h) << " + (" << I << ")r * "
      << lit(cv.dilation_h) << ";\n"
      << "        if (h < 0 || h >= " << lit(H) << ") continue;\n"
      << "        #pragma unroll\n"
      << "        for (int s = 0; s < " << S << "; ++s) {\n"
      << "          const " << I << " w = q * " << lit(cv.stride_w) << " - " << lit(cv.pad_w) << " + (" << I
      << ")s * " << lit(cv.dilation_w) << ";\n"
      << "          if (w < 0 || w >= " << lit(W) << ") continue;\n";
    const std::string x_at = "x + ((b * " + lit(H) + " + h) * " + lit(W) + " + w) * " + lit(C) + " + c";
    const std::string w_at = "wt + ((" + I + ")r * " + lit(S) + " + (" + I + ")s) * " + lit(C) + " + c";
    if (vec) {
      const std::string vt = vector_type(x.dtype, lanes);
      b << "          const " << vt << " xv = *reinterpret_cast<const " << vt << "*>(" << x_at << ");\n"
        << "          const " << vt << " wv = *reinterpret_cast<const " << vt << "*>(" << w_at << ");\n";
      for (int64_t l = 0; l < lanes; ++l)
        b << "          a" << l << " += " << load_expr(x.dtype, std::string("xv.") + kLane[l]) << " * "
          << load_expr(x.dtype, std::string("wv.") + kLane[l]) << ";\n";
    } else {
      b << "          a0 += " << load_expr(x.dtype, "*(" + x_at + ")") << " * " << load_expr(x.dtype, "*(" + w_at + ")")
        << ";\n";
    }
    b << "        }\n      }\n";
    if (cv.bias >= 0 && vec) {
      const std::string vt = vector_type(x.dtype, lanes);
      b << "      const " << vt << " bv = *reinterpret_cast<const " << vt << "*>(bias + c);\n";
    }
    std::vector<std::string> last(static_cast<size_t>(lanes));
    for (int64_t l = 0; l < lanes; ++l) {
      const std::string L = std::to_string(l);
      std::string v = "a" + L;
      if (cv.bias >= 0)
        v += " + " + load_expr(x.dtype, vec ? std::string("bv.") + kLane[l] : std::string("bias[c]"));
      if (cv.relu) v = "kiln_relu(" + v + ")";
      // The conv's value as its dtype stores it: what a separate epilogue kernel would read.
      if (y.dtype != engine::DType::kFloat32) v = load_expr(y.dtype, store_expr(y.dtype, v));
      b << "      const float v" << L << " = " << v << ";\n";
      std::map<int, std::string> name_of = {{cv.out, "v" + L}};
      for (size_t j = 0; j < plan.epilogue.inputs.size(); ++j) {
        const ir::Value& e = graph.value(plan.epilogue.inputs[j]);
        std::string offset;
        switch (operand_kind(e.shape, y.shape)) {
          case OperandKind::kScalar: offset = "0"; break;
          case OperandKind::kChannel: offset = "c + " + L; break;
          case OperandKind::kFull: offset = "i * " + std::to_string(lanes) + " + " + L; break;
        }
        const std::string var = "e" + std::to_string(j) + "_" + L;
        b << "      const float " << var << " = " << load_expr(e.dtype, "e" + std::to_string(j) + "[" + offset + "]")
          << ";\n";
        name_of[plan.epilogue.inputs[j]] = var;
      }
      const std::string chain_last = emit_elementwise_chain(graph, plan.epilogue.nodes, name_of, "_" + L, "      ",
                                                            "the depthwise conv's epilogue", b);
      last[static_cast<size_t>(l)] = chain_last.empty() ? "v" + L : chain_last;
    }
    if (vec) {
      const std::string vt = vector_type(out.dtype, lanes);
      b << "      " << vt << " o;\n";
      for (int64_t l = 0; l < lanes; ++l)
        b << "      o." << kLane[l] << " = " << store_expr(out.dtype, last[static_cast<size_t>(l)]) << ";\n";
      b << "      *reinterpret_cast<" << vt << "*>(out + i * " << lanes << ") = o;\n";
    } else {
      b << "      out[i] = " << store_expr(out.dtype, last[0]) << ";\n";
    }
    b << "    }\n";
    return b.str();
  };

  if (k.vector > 1) {
    // Vector accesses need every vector-read pointer aligned to the vector's
    // size; device-resident engine inputs and outputs may not be.
    const int64_t xb = k.vector * static_cast<int64_t>(engine::dtype_size(x.dtype));
    const int64_t ob = k.vector * static_cast<int64_t>(engine::dtype_size(out.dtype));
    s << "  if (((unsigned long long)x % " << xb << "ULL) == 0 && ((unsigned long long)wt % " << xb << "ULL) == 0";
    if (cv.bias >= 0) s << " && ((unsigned long long)bias % " << xb << "ULL) == 0";
    s << " && ((unsigned long long)out % " << ob << "ULL) == 0) {\n"
      << loop(k.vector) << "  } else {\n"
      << loop(1) << "  }\n";
  } else {
    s << "  {\n" << loop(1) << "  }\n";
  }
  s << "}\n";
  k.source = s.str();
  return k;
}

std::vector<int> DepthwisePlan::reads() const {
  std::vector<int> r = {conv.x, weight};
  if (conv.bias >= 0) r.push_back(conv.bias);
  r.insert(r.end(), epilogue.inputs.begin(), epilogue.inputs.end());
  return r;
}

void DepthwisePlan::lower(LowerContext& ctx, engine::Step& step) const {
  step.kind = engine::StepKind::kKernel;
  engine::KernelStep& k = step.kernel;
  k.function = ctx.kernel_name("kiln_dw");
  DepthwiseKernel gen = generate_depthwise_kernel(ctx.graph(), *this, k.function);
  ctx.add_source(gen.source);
  k.grid[0] = gen.grid;
  k.block[0] = gen.block;
  for (int v : gen.tensor_args) k.args.push_back(ctx.tensor_arg(v));
  k.args.push_back(LowerContext::int_arg(gen.n));
}

}  // namespace kiln::ops
