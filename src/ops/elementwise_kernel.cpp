#include "ops/elementwise_kernel.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <sstream>
#include <variant>

#include "codegen/cuda_dtype.h"
#include "ops/op_registry.h"

namespace kiln::ops {
using codegen::affine_offset;
using codegen::is_integer;
using codegen::load_expr;
using codegen::storage_type;
using codegen::store_expr;
using codegen::value_type;

namespace {

bool is_comparison(const std::string& op) {
  for (const char* base : {"aten.eq.", "aten.ne.", "aten.lt.", "aten.le.", "aten.gt.", "aten.ge."})
    if (op.rfind(base, 0) == 0) return true;
  return false;
}

// An integer scalar attribute as a C literal; CompileError for a fraction
// (torch gives a float result then, so an integer node never has one).
std::string integer_literal(const ir::Node& node, const std::string& key, int64_t fallback) {
  auto it = node.attrs.find(key);
  if (it == node.attrs.end()) return codegen::ll(fallback);
  if (auto* i = std::get_if<int64_t>(&it->second)) return codegen::ll(*i);
  if (auto* b = std::get_if<bool>(&it->second)) return *b ? "1LL" : "0LL";
  if (auto* d = std::get_if<double>(&it->second)) {
    if (std::nearbyint(*d) == *d && std::fabs(*d) < 9.0e18) return codegen::ll(static_cast<int64_t>(*d));
  }
  throw CompileError("node '" + node.name + "': attribute '" + key + "' is not an integer");
}

// A node whose output is int64/int32, computed exactly in that type;
// operands that are floats (bool as 1.0f / 0.0f) are converted first.
std::string integer_expression(const ir::Node& node, const std::vector<std::string>& x,
                               const std::vector<engine::DType>& types, engine::DType out) {
  const std::string t = value_type(out);
  auto arg = [&](size_t i) {
    return is_integer(types.at(i)) ? "((" + t + ")" + x.at(i) + ")" : "((" + t + ")(" + x.at(i) + "))";
  };
  const std::string& op = node.op;
  auto scaled = [&](const std::string& b) {
    std::string alpha = integer_literal(node, "alpha", 1);
    return alpha == "1LL" ? b : "(" + alpha + " * " + b + ")";
  };
  if (op == "aten.add.Tensor") return "(" + arg(0) + " + " + scaled(arg(1)) + ")";
  if (op == "aten.add.Scalar") return "(" + arg(0) + " + " + scaled(integer_literal(node, "other", 0)) + ")";
  if (op == "aten.sub.Tensor") return "(" + arg(0) + " - " + scaled(arg(1)) + ")";
  if (op == "aten.sub.Scalar") return "(" + arg(0) + " - " + scaled(integer_literal(node, "other", 0)) + ")";
  if (op == "aten.mul.Tensor") return "(" + arg(0) + " * " + arg(1) + ")";
  if (op == "aten.mul.Scalar") return "(" + arg(0) + " * " + integer_literal(node, "other", 1) + ")";
  if (op == "aten.neg.default") return "(-" + arg(0) + ")";
  if (op == "aten.abs.default") return "(" + arg(0) + " < 0 ? -" + arg(0) + " : " + arg(0) + ")";
  if (op == "aten.maximum.default") return "(" + arg(0) + " > " + arg(1) + " ? " + arg(0) + " : " + arg(1) + ")";
  if (op == "aten.minimum.default") return "(" + arg(0) + " < " + arg(1) + " ? " + arg(0) + " : " + arg(1) + ")";
  if (op == "aten.bitwise_and.Tensor") return "(" + arg(0) + " & " + arg(1) + ")";
  if (op == "aten.bitwise_or.Tensor") return "(" + arg(0) + " | " + arg(1) + ")";
  if (op == "aten.bitwise_xor.Tensor") return "(" + arg(0) + " ^ " + arg(1) + ")";
  if (op == "aten.bitwise_not.default") return "(~" + arg(0) + ")";
  if (op == "aten.where.self") return "((" + x.at(0) + " != 0) ? " + arg(1) + " : " + arg(2) + ")";
  if (op == "aten.masked_fill.Scalar")
    return "((" + x.at(1) + " != 0) ? (" + t + ")" + integer_literal(node, "value", 0) + " : " + arg(0) + ")";
  if (op == "aten.scalar_tensor.default") return "((" + t + ")" + integer_literal(node, "s", 0) + ")";
  if (op == "aten._to_copy.default" || op == "aten.clone.default" || op == "kiln.cast" || op == "kiln.copy" ||
      op == "aten.expand_copy.default")
    return arg(0);  // a float operand truncates toward zero, as torch's cast
  throw CompileError("node '" + node.name + "': " + op + " with an integer result is not supported");
}

// A comparison of integer operands, exact (a float scalar compares as float,
// as torch promotes).
std::string integer_comparison(const ir::Node& node, const std::vector<std::string>& x) {
  static const std::map<std::string, const char*> kCompare = {
      {"eq", "=="}, {"ne", "!="}, {"lt", "<"}, {"le", "<="}, {"gt", ">"}, {"ge", ">="}};
  const std::string base = node.op.substr(5, node.op.find('.', 5) - 5);
  std::string rhs;
  if (node.inputs.size() == 2) {
    rhs = x.at(1);
  } else {
    auto it = node.attrs.find("other");
    if (it != node.attrs.end() && std::holds_alternative<double>(it->second))
      return "(((float)" + x.at(0) + " " + kCompare.at(base) + " " + elementwise_scalar(std::get<double>(it->second)) +
             ") ? 1.0f : 0.0f)";
    rhs = integer_literal(node, "other", 0);
  }
  return "((" + x.at(0) + " " + kCompare.at(base) + " " + rhs + ") ? 1.0f : 0.0f)";
}

}  // namespace

bool integer_elementwise_supported(const std::string& op) {
  static const char* kOps[] = {
      "aten.add.Tensor", "aten.add.Scalar", "aten.sub.Tensor", "aten.sub.Scalar", "aten.mul.Tensor",
      "aten.mul.Scalar", "aten.neg.default", "aten.abs.default", "aten.maximum.default", "aten.minimum.default",
      "aten.bitwise_and.Tensor", "aten.bitwise_or.Tensor", "aten.bitwise_xor.Tensor", "aten.bitwise_not.default",
      "aten.where.self", "aten.masked_fill.Scalar", "aten.scalar_tensor.default", "aten._to_copy.default",
      "aten.clone.default", "kiln.cast", "kiln.copy", "aten.expand_copy.default"};
  for (const char* name : kOps)
    if (op == name) return true;
  return false;
}

std::string elementwise_scalar(double v) {
  if (std::isnan(v)) return "__int_as_float(0x7fc00000)";
  if (std::isinf(v)) return v > 0 ? "__int_as_float(0x7f800000)" : "__int_as_float(0xff800000)";
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.9ef", static_cast<double>(static_cast<float>(v)));
  return buffer;
}

std::string typed_expression(const ir::Node& node, std::vector<std::string> operands,
                             const std::vector<engine::DType>& types, engine::DType out) {
  if (is_integer(out)) return integer_expression(node, operands, types, out);
  bool integer_operands = !types.empty();
  for (engine::DType d : types) integer_operands = integer_operands && is_integer(d);
  if (integer_operands && is_comparison(node.op)) return integer_comparison(node, operands);
  // A float (or bool) result: integer operands convert to float first, as
  // torch promotes them.
  for (size_t i = 0; i < operands.size() && i < types.size(); ++i)
    if (is_integer(types[i])) operands[i] = "((float)" + operands[i] + ")";
  return elementwise_expression(node, operands);
}

std::string broadcast_offset(const std::vector<int64_t>& in, const std::vector<int64_t>& out) {
  if (in == out) return "i";
  if (ir::numel_of(in) == 1) return "0";
  if (in.size() > out.size()) throw CompileError("input of rank " + std::to_string(in.size()) + " cannot broadcast to " + ir::shape_to_string(out));
  size_t lead = out.size() - in.size();
  std::ostringstream expr;
  int64_t out_stride = 1, in_stride = 1;
  bool first = true;
  for (size_t d = out.size(); d-- > 0;) {
    int64_t in_dim = d >= lead ? in[d - lead] : 1;
    if (in_dim != 1 && in_dim != out[d])
      throw CompileError("cannot broadcast " + ir::shape_to_string(in) + " to " + ir::shape_to_string(out));
    if (in_dim != 1) {
      if (!first) expr << " + ";
      first = false;
      expr << "((i / " << out_stride << "LL) % " << out[d] << "LL)";
      if (in_stride != 1) expr << " * " << in_stride << "LL";
    }
    in_stride *= in_dim;
    out_stride *= out[d];
  }
  return first ? "0" : expr.str();
}


std::string pointwise_prelude() {
  return R"(// Generated by Kiln. Loads widen to float, stores narrow with round-to-nearest-even.
__device__ __forceinline__ float kiln_ld_f16(unsigned short h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ unsigned short kiln_st_f16(float f) {
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
__device__ __forceinline__ float kiln_ld_bf16(unsigned short h) {
  return __uint_as_float(((unsigned int)h) << 16);
}
__device__ __forceinline__ unsigned short kiln_st_bf16(float f) {
  unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
// relu keeps NaN, as torch.relu does.
__device__ __forceinline__ float kiln_relu(float x) { return (x > 0.0f || x != x) ? x : 0.0f; }
__device__ __forceinline__ float kiln_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f)); }
__device__ __forceinline__ float kiln_gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float kiln_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float kiln_silu(float x) { return x / (1.0f + expf(-x)); }
// clamp, maximum and minimum propagate NaN, as PyTorch's do (fminf/fmaxf would drop it).
__device__ __forceinline__ float kiln_clamp(float x, float lo, float hi) {
  return x != x ? x : fminf(fmaxf(x, lo), hi);
}
__device__ __forceinline__ float kiln_maximum(float a, float b) { return (a != a || b != b) ? a + b : fmaxf(a, b); }
__device__ __forceinline__ float kiln_minimum(float a, float b) { return (a != a || b != b) ? a + b : fminf(a, b); }
__device__ __forceinline__ float kiln_hardsigmoid(float x) { return kiln_clamp(x + 3.0f, 0.0f, 6.0f) / 6.0f; }
__device__ __forceinline__ float kiln_hardswish(float x) { return x * kiln_hardsigmoid(x); }
// softplus as torch: linear above threshold (in beta * x), log1p(exp) below.
__device__ __forceinline__ float kiln_softplus(float x, float beta, float threshold) {
  return x * beta > threshold ? x : log1pf(expf(beta * x)) / beta;
}
__device__ __forceinline__ float kiln_mish(float x) { return x * tanhf(kiln_softplus(x, 1.0f, 20.0f)); }
__device__ __forceinline__ float kiln_leaky_relu(float x, float slope) { return x > 0.0f ? x : x * slope; }
__device__ __forceinline__ float kiln_elu(float x, float alpha, float scale, float input_scale) {
  return x > 0.0f ? scale * x : scale * alpha * expm1f(x * input_scale);
}
__device__ __forceinline__ float kiln_sign(float x) { return x != x ? x : (x > 0.0f) - (x < 0.0f); }
)";
}

std::string emit_elementwise_chain(const ir::Graph& graph, const std::vector<int>& nodes,
                                   std::map<int, std::string>& name_of, const std::string& suffix,
                                   const std::string& indent, const std::string& where, std::ostream& out) {
  std::string last;
  for (size_t t = 0; t < nodes.size(); ++t) {
    const ir::Node& node = graph.nodes().at(static_cast<size_t>(nodes[t]));
    // A pass that rebuilt this node with extra operands would otherwise
    // compute a silently wrong expression (the mobilenet div/6 bug).
    if (const OpDef* op = find_op(node.op);
        op && op->role == OpRole::kElementwise && static_cast<int>(node.inputs.size()) != op->tensor_inputs)
      throw CompileError("internal: node '" + node.name + "' (" + node.op + ") has " +
                         std::to_string(node.inputs.size()) + " tensor inputs, expected " +
                         std::to_string(op->tensor_inputs));
    std::vector<std::string> operands;
    std::vector<engine::DType> types;
    for (int in : node.inputs) {
      auto it = name_of.find(in);
      if (it == name_of.end())
        throw CompileError("node '" + node.name + "': operand '" + graph.value(in).name + "' is not available in " +
                           where);
      operands.push_back(it->second);
      types.push_back(graph.value(in).dtype);
    }
    const std::string var = "t" + std::to_string(t) + suffix;
    const engine::DType out_dtype = graph.value(node.outputs.at(0)).dtype;
    out << indent << "const " << value_type(out_dtype) << " " << var << " = "
        << typed_expression(node, operands, types, out_dtype) << ";  // " << node.name << "\n";
    name_of[node.outputs.at(0)] = var;
    last = var;
  }
  return last;
}

namespace {

// Elements a thread handles in the vectorized form of a pointwise kernel:
// 16 bytes of every input read at the output's index and of the output, so
// all of those must share one element size; 1 when there is no such form
// (layout maps, odd sizes, nothing contiguous to read).
// `map` (over the dims of `in`) as a map over the dims of `out`, which `in`
// broadcasts to: a size-1 dim of `in` does not move.
AffineMap broadcast_map(const AffineMap& map, const std::vector<int64_t>& in, const std::vector<int64_t>& out) {
  if (in.size() > out.size() || map.coef.size() != in.size())
    throw CompileError("internal: a strided input of rank " + std::to_string(in.size()) + " read over " +
                       ir::shape_to_string(out));
  AffineMap m;
  m.base = map.base;
  const size_t lead = out.size() - in.size();
  for (size_t d = 0; d < out.size(); ++d)
    m.coef.push_back(d < lead || in[d - lead] == 1 ? 0 : map.coef[d - lead]);
  return m;
}

int pointwise_vector(const ir::Graph& graph, const PointwisePlan& plan) {
  if (!plan.input_map.coef.empty() || !plan.output_map.coef.empty()) return 1;
  const ir::Value& out = graph.value(plan.out);
  const size_t size = engine::dtype_size(out.dtype);
  if (size != 2 && size != 4) return 1;
  for (int in : plan.inputs) {
    const ir::Value& v = graph.value(in);
    if (v.shape == out.shape && engine::dtype_size(v.dtype) != size) return 1;
  }
  const int vector = static_cast<int>(16 / size);
  return out.numel() % vector == 0 && out.numel() >= 16 * vector ? vector : 1;
}

}  // namespace

std::string generate_pointwise_kernel(const ir::Graph& graph, const PointwisePlan& plan,
                                      const std::string& name) {
  const ir::Value& out = graph.value(plan.out);
  const std::vector<int64_t>& iter = plan.iter_shape.empty() ? out.shape : plan.iter_shape;
  const bool layout = !plan.input_map.coef.empty() || !plan.output_map.coef.empty();
  const int vector = pointwise_vector(graph, plan);
  std::ostringstream src;
  src << "extern \"C\" __global__ void __launch_bounds__(" << kPointwiseBlock << ") " << name << "(\n    "
      << storage_type(out.dtype) << "* __restrict__ out";
  for (size_t j = 0; j < plan.inputs.size(); ++j)
    src << ",\n    const " << storage_type(graph.value(plan.inputs[j]).dtype) << "* __restrict__ in" << j;
  src << ",\n    long long n) {\n";
  src << "  const long long stride = (long long)gridDim.x * " << kPointwiseBlock << ";\n";

  // One element's loads, chain and store: `load(j)` names input j's value.
  auto body = [&](const std::string& indent, const std::function<std::string(size_t)>& load,
                  const std::string& store_to) {
    std::map<int, std::string> name_of;  // value id -> float variable
    for (size_t j = 0; j < plan.inputs.size(); ++j) {
      const ir::Value& in = graph.value(plan.inputs[j]);
      std::string var = "x" + std::to_string(j);
      src << indent << "const " << value_type(in.dtype) << " " << var << " = " << load_expr(in.dtype, load(j))
          << ";\n";
      name_of[plan.inputs[j]] = var;
    }
    std::string last = emit_elementwise_chain(graph, plan.nodes, name_of, "", indent, "its fused kernel", src);
    if (last.empty()) last = name_of.at(plan.inputs.at(0));  // plain copy
    src << indent << store_to << " = " << store_expr(out.dtype, last) << ";\n";
  };
  auto offset_of = [&](size_t j) {
    const ir::Value& in = graph.value(plan.inputs[j]);
    if (const PointwisePlan::StridedInput* s = plan.strided_input(plan.inputs[j]))
      return affine_offset(broadcast_map(s->map, in.shape, out.shape), out.shape);
    return layout ? affine_offset(plan.input_map, iter) : broadcast_offset(in.shape, out.shape);
  };
  auto scalar_load = [&](size_t j) { return "in" + std::to_string(j) + "[" + offset_of(j) + "]"; };
  const std::string out_offset = layout && !plan.output_map.coef.empty() ? affine_offset(plan.output_map, iter) : "i";

  if (vector > 1) {
    // 16-byte loads and stores of `vector` elements when every full-shape
    // operand is 16-byte aligned (arena tensors are; a caller's buffer may
    // not be); broadcast operands are read per element.
    // Wide operands: the output's shape, or broadcast over leading dims only
    // (a bias row), where `vector` elements in a row stay contiguous.
    const size_t size = engine::dtype_size(out.dtype);
    std::vector<size_t> wide;
    for (size_t j = 0; j < plan.inputs.size(); ++j) {
      const ir::Value& in = graph.value(plan.inputs[j]);
      const bool rows = !in.shape.empty() && in.shape.size() <= out.shape.size() && in.shape.back() == out.shape.back() &&
                        in.shape.back() % vector == 0 && engine::dtype_size(in.dtype) == size;
      if ((in.shape == out.shape || rows) && !plan.strided_input(plan.inputs[j])) wide.push_back(j);
    }
    src << "  const bool aligned = ((unsigned long long)out";
    for (size_t j : wide) src << " | (unsigned long long)in" << j;
    src << ") % 16 == 0;\n"
        << "  if (aligned) {\n"
        << "    for (long long v = (long long)blockIdx.x * " << kPointwiseBlock << " + threadIdx.x; v < n / "
        << vector << "; v += stride) {\n";
    for (size_t j : wide)
      src << "      __align__(16) " << storage_type(graph.value(plan.inputs[j]).dtype) << " w" << j << "[" << vector
          << "];\n      {\n        const long long i = v * " << vector << ";\n        *(uint4*)w" << j
          << " = *(const uint4*)(in" << j << " + " << offset_of(j) << ");\n      }\n";
    src << "      __align__(16) " << storage_type(out.dtype) << " o[" << vector << "];\n"
        << "      #pragma unroll\n"
        << "      for (int e = 0; e < " << vector << "; ++e) {\n"
        << "        const long long i = v * " << vector << " + e;\n";
    body("        ", [&](size_t j) {
      return std::find(wide.begin(), wide.end(), j) != wide.end() ? "w" + std::to_string(j) + "[e]" : scalar_load(j);
    }, "o[e]");
    src << "        (void)i;\n"
        << "      }\n"
        << "      *(uint4*)(out + v * " << vector << ") = *(const uint4*)o;\n"
        << "    }\n"
        << "    return;\n"
        << "  }\n";
  }
  src << "  for (long long i = (long long)blockIdx.x * " << kPointwiseBlock
      << " + threadIdx.x; i < n; i += stride) {\n";
  body("    ", scalar_load, "out[" + out_offset + "]");
  src << "  }\n}\n";
  return src.str();
}



void PointwisePlan::lower(LowerContext& ctx, engine::Step& step) const {
  const ir::Graph& graph = ctx.graph();
  step.kind = engine::StepKind::kKernel;
  engine::KernelStep& k = step.kernel;
  k.function = ctx.kernel_name("kiln_pw");
  ctx.add_source(generate_pointwise_kernel(graph, *this, k.function));
  const int64_t n = iter_shape.empty() ? graph.value(out).numel() : ir::numel_of(iter_shape);
  // Threads for the vectorized form; an unaligned call loops over the rest.
  const int64_t threads = n / pointwise_vector(graph, *this);
  const int64_t blocks = std::max<int64_t>(1, (threads + kPointwiseBlock - 1) / kPointwiseBlock);
  k.grid[0] = static_cast<uint32_t>(std::min<int64_t>(blocks, 65536));
  k.block[0] = kPointwiseBlock;
  k.args.push_back(ctx.tensor_arg(out));
  for (int in : inputs) k.args.push_back(ctx.tensor_arg(storage_read(in)));
  k.args.push_back(LowerContext::int_arg(n));
}

}  // namespace kiln::ops
