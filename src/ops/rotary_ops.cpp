#include "ops/rotary_ops.h"

#include <algorithm>
#include <sstream>

#include "codegen/cuda_dtype.h"
#include "ops/elementwise_kernel.h"
#include "ops/layout_ops.h"
#include "ops/op_registry.h"
#include "ops/state_ops.h"

namespace kiln::ops {
namespace {

constexpr unsigned kRotaryBlock = 256;

std::string ll(int64_t v) { return std::to_string(v) + "LL"; }

std::string check_rotary(const OpQuery& q) {
  if (q.inputs.size() != 3 || q.outputs.size() != 1) return "kiln.rotary needs x, cos, sin and one output";
  const TensorInfo& x = q.inputs[0];
  if (x.shape.empty() || x.shape.back() % 2 != 0) return "kiln.rotary needs an even last dim";
  if (q.outputs[0].shape != x.shape || q.outputs[0].dtype != x.dtype) return "kiln.rotary output must match x";
  return "";
}

}  // namespace

std::string rotary_value_code(const ir::Graph& g, int x, int cos, int sin, int x_storage, const AffineMap& x_map,
                              const std::vector<int64_t>& out_shape, const std::string& indent) {
  const ir::Value& xv = g.value(x);
  const ir::Value& cv = g.value(cos);
  const ir::Value& sv = g.value(sin);
  const int64_t d = xv.shape.back(), h = d / 2;
  using codegen::load_expr;
  // x's element i: contiguous, or through the strides of its source
  const std::string xo = x_storage >= 0 ? codegen::affine_offset(x_map, out_shape) : "i";
  const int64_t step_last = x_storage >= 0 ? x_map.coef.back() : 1;
  std::ostringstream s;
  s << indent << "const long long j = i % " << ll(d) << ";\n"
    << indent << "const long long xi = " << xo << ";\n"
    // rotate_half: the first half takes minus the second, the second the first.
    << indent << "const float r = j < " << ll(h) << " ? -" << load_expr(xv.dtype, "x[xi + " + ll(h * step_last) + "]")
    << " : " << load_expr(xv.dtype, "x[xi - " + ll(h * step_last) + "]") << ";\n"
    << indent << "const float v = " << load_expr(xv.dtype, "x[xi]") << " * "
    << load_expr(cv.dtype, "cs[" + broadcast_offset(cv.shape, out_shape) + "]") << " + r * "
    << load_expr(sv.dtype, "sn[" + broadcast_offset(sv.shape, out_shape) + "]") << ";\n";
  return s.str();
}

void RotaryPlan::lower(LowerContext& ctx, engine::Step& step) const {
  const ir::Graph& g = ctx.graph();
  const ir::Value& xv = g.value(x);
  const ir::Value& cv = g.value(cos);
  const ir::Value& sv = g.value(sin);
  const ir::Value& ov = g.value(out);
  const int64_t n = ov.numel();
  step.kind = engine::StepKind::kKernel;
  engine::KernelStep& k = step.kernel;
  k.function = ctx.kernel_name("kiln_rotary");
  using codegen::storage_type;
  std::ostringstream s;
  s << "extern \"C\" __global__ void __launch_bounds__(" << kRotaryBlock << ") " << k.function << "(\n"
    << "    " << storage_type(ov.dtype) << "* __restrict__ out, const " << storage_type(xv.dtype)
    << "* __restrict__ x,\n    const " << storage_type(cv.dtype) << "* __restrict__ cs, const "
    << storage_type(sv.dtype) << "* __restrict__ sn) {\n"
    << "  const long long stride = (long long)gridDim.x * " << kRotaryBlock << ";\n"
    << "  for (long long i = (long long)blockIdx.x * " << kRotaryBlock << " + threadIdx.x; i < " << ll(n)
    << "; i += stride) {\n"
    << rotary_value_code(g, x, cos, sin, x_storage, x_map, ov.shape, "    ")
    << "    out[i] = " << codegen::store_expr(ov.dtype, "v") << ";\n"
    << "  }\n}\n";
  ctx.add_source(s.str());
  k.grid[0] = static_cast<uint32_t>(std::min<int64_t>(std::max<int64_t>(1, (n + kRotaryBlock - 1) / kRotaryBlock), 65536));
  k.block[0] = kRotaryBlock;
  k.args = {ctx.tensor_arg(out), ctx.tensor_arg(x_storage >= 0 ? x_storage : x), ctx.tensor_arg(cos),
            ctx.tensor_arg(sin)};
}

KILN_REGISTER_OPS(rotary) {
  OpDef def;
  def.name = kKilnRotaryOp;
  def.role = OpRole::kStep;
  def.check = check_rotary;
  def.plan = [](PlanContext& ctx, int node) {
    const ir::Node& n = ctx.graph().nodes()[static_cast<size_t>(node)];
    RotaryPlan p;
    p.x = n.inputs.at(0);
    p.cos = n.inputs.at(1);
    p.sin = n.inputs.at(2);
    p.out = n.outputs.at(0);
    if (!strided_source(ctx, p.x, &p.x_storage, &p.x_map)) p.x_storage = -1;
    // A rotary whose only reader writes it into a KV cache (k in a decode
    // step) is computed by that cache update: one kernel instead of two.
    const int user = ctx.sole_consumer(p.out);
    if (user >= 0 && is_state_update_of(ctx.graph(), user, p.out)) {
      StateScatterPlan update = plan_state_update(ctx, user);
      update.values = p.x;
      update.values_storage = p.x_storage;
      update.values_map = p.x_map;
      update.rotary_cos = p.cos;
      update.rotary_sin = p.sin;
      ctx.alias(update.out, update.state);
      ctx.absorb(user);
      ctx.emit_at(user, PlannedOp("rotary_state_update", std::move(update)));
      return;
    }
    ctx.emit(PlannedOp("rotary", std::move(p)));
  };
  register_op(std::move(def));
}

}  // namespace kiln::ops
