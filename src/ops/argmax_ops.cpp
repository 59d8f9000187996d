#include "ops/argmax_ops.h"

#include <algorithm>
#include <sstream>
#include <variant>

#include "codegen/cuda_dtype.h"
#include "ops/dim_arg.h"
#include "ops/op_registry.h"

namespace kiln::ops {
namespace {

// One block an output element. A long row (a language model's vocabulary:
// one output, 32000 logits) gets the largest block, and every thread keeps
// kArgmaxUnroll loads in flight before comparing: one thread walking its
// 125 elements one load at a time took 18 us on an H100.
constexpr unsigned kArgmaxBlock = 256, kArgmaxLongBlock = 1024;
constexpr int64_t kArgmaxLongRow = 8192;
constexpr int kArgmaxUnroll = 8;

using codegen::is_float;
using codegen::ll;

// The normalized dim, or -1 for "over everything"; "" or why not.
std::string argmax_dim(const std::map<std::string, ir::Attr>& attrs, size_t rank, int64_t* dim) {
  *dim = -1;
  auto it = attrs.find("dim");
  if (it == attrs.end()) return "";
  const auto* d = std::get_if<int64_t>(&it->second);
  if (d == nullptr) return "argmax needs an integer dim";
  int64_t normalized = 0;
  const std::string why = normalize_dim(*d, rank, "argmax", &normalized);
  if (why.empty()) *dim = rank == 0 ? -1 : normalized;
  return why;
}

}  // namespace

std::string check_argmax(const OpQuery& q) {
  if (q.inputs.size() != 1 || q.outputs.size() != 1) return q.op + " needs one tensor input and one output";
  if (!is_float(q.inputs[0].dtype)) return q.op + " is taken over float32, float16 and bfloat16 inputs";
  if (q.outputs[0].dtype != engine::DType::kInt64) return q.op + " must give int64";
  int64_t dim = 0;
  std::string why = argmax_dim(q.attrs, q.inputs[0].shape.size(), &dim);
  if (!why.empty()) return why;
  int64_t reduced = 1;
  if (dim < 0)
    for (int64_t s : q.inputs[0].shape) reduced *= s;
  else
    reduced = q.inputs[0].shape[static_cast<size_t>(dim)];
  if (reduced == 0) return q.op + " over an empty dim";
  return "";
}

void ArgmaxPlan::lower(LowerContext& ctx, engine::Step& step) const {
  const ir::Graph& g = ctx.graph();
  const ir::Value& in = g.value(input);
  step.kind = engine::StepKind::kKernel;
  engine::KernelStep& k = step.kernel;
  k.function = ctx.kernel_name("kiln_argmax");
  const unsigned block = reduced >= kArgmaxLongRow ? kArgmaxLongBlock : kArgmaxBlock;
  const unsigned warps = block / 32;
  const std::string T = codegen::storage_type(in.dtype);
  std::ostringstream s;
  // (v, i) beats (bv, bi) when larger, NaN over numbers, or equal (both
  // NaN too) at a smaller index: PyTorch's first-maximum rule.
  s << "__device__ __forceinline__ bool " << k.function << "_beats(float v, long long i, float bv, long long bi) {\n"
    << "  const bool vn = v != v, bn = bv != bv;\n"
    << "  if (vn || bn) return vn && (!bn || i < bi);\n"
    << "  return v > bv || (v == bv && i < bi);\n"
    << "}\n"
    << "extern \"C\" __global__ void __launch_bounds__(" << block << ") " << k.function << "(\n"
    << "    long long* __restrict__ out, const " << T << "* __restrict__ in) {\n"
    << "  constexpr long long kR = " << ll(reduced) << ", kB = " << block << ";\n"
    << "  constexpr int kU = " << kArgmaxUnroll << ";\n"
    << "  __shared__ float sv[" << warps << "];\n"
    << "  __shared__ long long si[" << warps << "];\n"
    << "  const long long o = blockIdx.x;\n"
    << "  const " << T << "* x = in + (o / " << ll(inner) << ") * " << ll(reduced * inner) << " + o % " << ll(inner)
    << ";\n"
    << "  float bv = -__int_as_float(0x7f800000);\n"
    << "  long long bi = kR;\n"
    << "  for (long long r0 = threadIdx.x; r0 < kR; r0 += kB * kU) {\n"
    << "    " << T << " raw[kU];\n"
    << "    #pragma unroll\n"
    << "    for (int u = 0; u < kU; ++u)\n"
    << "      if (r0 + u * kB < kR) raw[u] = x[(r0 + u * kB) * " << ll(inner) << "];\n"
    << "    #pragma unroll\n"
    << "    for (int u = 0; u < kU; ++u) {\n"
    << "      const long long r = r0 + u * kB;\n"
    << "      if (r >= kR) break;\n"
    << "      const float v = " << codegen::load_expr(in.dtype, "raw[u]") << ";\n"
    << "      if (" << k.function << "_beats(v, r, bv, bi)) { bv = v; bi = r; }\n"
    << "    }\n"
    << "  }\n"
    << "  for (int m = 16; m > 0; m >>= 1) {\n"
    << "    const float v = __shfl_xor_sync(0xffffffffu, bv, m);\n"
    << "    const long long i = __shfl_xor_sync(0xffffffffu, bi, m);\n"
    << "    if (" << k.function << "_beats(v, i, bv, bi)) { bv = v; bi = i; }\n"
    << "  }\n"
    << "  if ((threadIdx.x & 31) == 0) { sv[threadIdx.x >> 5] = bv; si[threadIdx.x >> 5] = bi; }\n"
    << "  __syncthreads();\n"
    << "  if (threadIdx.x != 0) return;\n"
    << "  for (int w = 1; w < " << warps << "; ++w)\n"
    << "    if (" << k.function << "_beats(sv[w], si[w], bv, bi)) { bv = sv[w]; bi = si[w]; }\n"
    // Only when every element is -inf does no element beat the start.
    << "  out[o] = bi == kR ? 0 : bi;\n"
    << "}\n";
  ctx.add_source(s.str());
  if (outer * inner > 0x7fffffff) throw CompileError("argmax of '" + in.name + "' has too many outputs");
  k.grid[0] = static_cast<uint32_t>(std::max<int64_t>(1, outer * inner));
  k.block[0] = block;
  k.args = {ctx.tensor_arg(out), ctx.tensor_arg(input)};
}

KILN_REGISTER_OPS(argmax) {
  OpDef def;
  def.name = "aten.argmax.default";
  def.role = OpRole::kStep;
  def.check = check_argmax;
  def.any_dtype = true;  // int64 output; check_argmax keeps the input float
  def.plan = [](PlanContext& ctx, int node) {
    const ir::Graph& g = ctx.graph();
    const ir::Node& n = g.nodes()[static_cast<size_t>(node)];
    const ir::Value& in = g.value(n.inputs.at(0));
    int64_t dim = 0;
    std::string why = argmax_dim(n.attrs, in.shape.size(), &dim);
    if (!why.empty()) throw CompileError("node '" + n.name + "': " + why);
    ArgmaxPlan p;
    p.input = n.inputs[0];
    p.out = n.outputs.at(0);
    if (dim < 0) {
      p.reduced = in.numel();
    } else {
      for (size_t d = 0; d < in.shape.size(); ++d) {
        const int64_t s = in.shape[d];
        if (static_cast<int64_t>(d) < dim) p.outer *= s;
        else if (static_cast<int64_t>(d) == dim) p.reduced = s;
        else p.inner *= s;
      }
    }
    if (p.reduced == 0) throw CompileError("node '" + n.name + "': argmax over an empty dim");
    if (g.value(p.out).numel() != p.outer * p.inner)
      throw CompileError("node '" + n.name + "': argmax output size does not match its input");
    ctx.emit(PlannedOp("argmax", std::move(p)));
  };
  register_op(std::move(def));
}

}  // namespace kiln::ops
