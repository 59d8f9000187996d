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

using codegen::ll;

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

GridLoop RotaryPlan::grid_loop(LowerContext& ctx) const {
  const ir::Graph& g = ctx.graph();
  const ir::Value& ov = g.value(out);
  const int source = x_storage >= 0 ? x_storage : x;
  using codegen::storage_type;
  GridLoop loop;
  loop.count = ov.numel();
  loop.params = {{std::string(storage_type(ov.dtype)) + "* __restrict__", "out", ctx.tensor_arg(out)},
                 {std::string("const ") + storage_type(g.value(source).dtype) + "* __restrict__", "x", ctx.tensor_arg(source)},
                 {std::string("const ") + storage_type(g.value(cos).dtype) + "* __restrict__", "cs", ctx.tensor_arg(cos)},
                 {std::string("const ") + storage_type(g.value(sin).dtype) + "* __restrict__", "sn", ctx.tensor_arg(sin)}};
  loop.body = rotary_value_code(g, x, cos, sin, x_storage, x_map, ov.shape, "    ") + "    out[i] = " +
              codegen::store_expr(ov.dtype, "v") + ";\n";
  return loop;
}

void RotaryPlan::lower(LowerContext& ctx, engine::Step& step) const {
  lower_grid_loop(ctx, step, "kiln_rotary", grid_loop(ctx));
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
