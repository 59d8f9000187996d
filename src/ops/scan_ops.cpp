#include "ops/scan_ops.h"

#include <algorithm>
#include <sstream>
#include <variant>

#include "codegen/cuda_dtype.h"
#include "ops/dim_arg.h"
#include "ops/op_registry.h"

namespace kiln::ops {
namespace {

using codegen::ll;

// As PyTorch does, the input is first converted to the output's dtype (a
// float truncated toward zero into an integer, an integer or bool into a
// float), then summed: into an integer output exactly, in 64 bits; into a
// float one in float.
bool is_number(engine::DType d) { return codegen::is_integer(d) || codegen::is_float(d) || d == engine::DType::kBool; }

// The dim normalized into [0, rank) (0 for a 0-d tensor); "" or why not.
std::string scan_dim(const std::map<std::string, ir::Attr>& attrs, size_t rank, int64_t* dim) {
  auto it = attrs.find("dim");
  const int64_t* d = it == attrs.end() ? nullptr : std::get_if<int64_t>(&it->second);
  if (d == nullptr) return "cumsum needs an integer dim";
  return normalize_dim(*d, rank, "cumsum", dim);
}

}  // namespace

std::string check_cumsum(const OpQuery& q) {
  if (q.inputs.size() != 1 || q.outputs.size() != 1) return q.op + " needs one tensor input and one output";
  const engine::DType in = q.inputs[0].dtype, out = q.outputs[0].dtype;
  if (!is_number(in) || !(codegen::is_integer(out) || codegen::is_float(out)))
    return q.op + " from " + engine::dtype_name(in) + " to " + engine::dtype_name(out) +
           " is not taken (taken: a number or bool input to an integer or float output)";
  if (q.inputs[0].shape != q.outputs[0].shape) return q.op + " output shape differs from its input's";
  int64_t dim = 0;
  return scan_dim(q.attrs, q.inputs[0].shape.size(), &dim);
}

void CumsumPlan::lower(LowerContext& ctx, engine::Step& step) const {
  const ir::Graph& g = ctx.graph();
  const engine::DType in_dt = g.value(input).dtype, out_dt = g.value(out).dtype;
  const bool exact = codegen::is_integer(out_dt);  // an integer output sums exactly
  step.kind = engine::StepKind::kKernel;
  engine::KernelStep& k = step.kernel;
  k.function = ctx.kernel_name("kiln_cumsum");
  const int64_t lines = outer * inner;
  const std::string in_t = codegen::storage_type(in_dt), out_t = codegen::storage_type(out_dt);
  // Each element in the sum's type: integers and bools (0/1 bytes) widen
  // exactly, floats load as float (and truncate toward zero into an integer
  // sum, as PyTorch's conversion does).
  const std::string element =
      codegen::is_float(in_dt) ? codegen::load_expr(in_dt, "x[i * kInner]") : "x[i * kInner]";
  const std::string load = std::string(exact ? "(long long)" : "(float)") + "(" + element + ")";
  const std::string store = exact ? "(" + out_t + ")acc" : codegen::store_expr(out_dt, "acc");
  std::ostringstream s;
  s << "extern \"C\" __global__ void __launch_bounds__(" << kScanBlock << ") " << k.function << "(\n"
    << "    " << out_t << "* __restrict__ out, const " << in_t << "* __restrict__ in) {\n"
    << "  constexpr long long kLen = " << ll(len) << ", kInner = " << ll(inner) << ";\n"
    << "  const long long line = (long long)blockIdx.x * " << kScanBlock << " + threadIdx.x;\n"
    << "  if (line >= " << ll(lines) << ") return;\n"
    << "  const long long base = (line / kInner) * (kLen * kInner) + line % kInner;\n"
    << "  const " << in_t << "* x = in + base;\n"
    << "  " << out_t << "* y = out + base;\n"
    << "  " << (exact ? "long long" : "float") << " acc = 0;\n"
    << "  #pragma unroll 4\n"
    << "  for (long long i = 0; i < kLen; ++i) {\n"
    << "    acc += " << load << ";\n"
    << "    y[i * kInner] = " << store << ";\n"
    << "  }\n"
    << "}\n";
  ctx.add_source(s.str());
  const int64_t blocks = (lines + kScanBlock - 1) / kScanBlock;
  if (blocks > 0x7fffffff) throw CompileError("cumsum of '" + g.value(input).name + "' has too many lines");
  k.grid[0] = static_cast<uint32_t>(std::max<int64_t>(1, blocks));
  k.block[0] = kScanBlock;
  k.args = {ctx.tensor_arg(out), ctx.tensor_arg(input)};
}

KILN_REGISTER_OPS(scan) {
  OpDef def;
  def.name = "aten.cumsum.default";
  def.role = OpRole::kStep;
  def.check = check_cumsum;
  def.any_dtype = true;  // integer, bool and float inputs; check_cumsum checks the pair
  def.bool_inputs = true;
  def.plan = [](PlanContext& ctx, int node) {
    const ir::Graph& g = ctx.graph();
    const ir::Node& n = g.nodes()[static_cast<size_t>(node)];
    const ir::Value& in = g.value(n.inputs.at(0));
    int64_t dim = 0;
    std::string why = scan_dim(n.attrs, in.shape.size(), &dim);
    if (!why.empty()) throw CompileError("node '" + n.name + "': " + why);
    CumsumPlan p;
    p.input = n.inputs[0];
    p.out = n.outputs.at(0);
    for (size_t d = 0; d < in.shape.size(); ++d) {
      const int64_t s = in.shape[d];
      if (static_cast<int64_t>(d) < dim) p.outer *= s;
      else if (static_cast<int64_t>(d) == dim) p.len = s;
      else p.inner *= s;
    }
    if (g.value(p.out).shape != in.shape)
      throw CompileError("node '" + n.name + "': cumsum output shape differs from its input's");
    ctx.emit(PlannedOp("cumsum", std::move(p)));
  };
  register_op(std::move(def));
}

}  // namespace kiln::ops
