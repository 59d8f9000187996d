#include "ops/state_ops.h"

#include <algorithm>
#include <sstream>
#include <variant>

#include "codegen/cuda_dtype.h"
#include "ops/gather_kernel.h"
#include "ops/layout_ops.h"
#include "ops/op_registry.h"
#include "ops/rotary_ops.h"

namespace kiln::ops {
namespace {

using Shape = std::vector<int64_t>;

constexpr const char* kIndexPut = "aten.index_put.default";

using codegen::ll;

// The one indexed dim of the node, or an error message.
std::string indexed_dim(const std::map<std::string, ir::Attr>& attrs, size_t rank, int64_t* dim) {
  auto count = attrs.find("indices_count");
  auto positions = attrs.find("indices_positions");  // absent: the list has no None
  if (count == attrs.end()) return "index_put needs its index list";
  const auto* n = std::get_if<int64_t>(&count->second);
  static const std::vector<int64_t> kFirst{0};
  const auto* p = positions == attrs.end() ? &kFirst : std::get_if<std::vector<int64_t>>(&positions->second);
  if (n == nullptr || p == nullptr || *n != 1 || p->size() != 1)
    return "index_put with more than one index tensor is not supported (one position dim only)";
  if ((*p)[0] < 0 || static_cast<size_t>((*p)[0]) >= rank) return "index_put index position out of range";
  *dim = (*p)[0];
  return "";
}

std::string describe(const std::map<std::string, ir::Attr>& attrs, const std::vector<TensorInfo>& in,
                     const TensorInfo& out, int64_t* dim) {
  if (in.size() != 3) return "index_put needs a destination, one index tensor and values";
  auto acc = attrs.find("accumulate");
  if (acc != attrs.end()) {
    const auto* b = std::get_if<bool>(&acc->second);
    if (b != nullptr && *b) return "index_put with accumulate=True is not supported";
  }
  const Shape& dst = in[0].shape;
  std::string why = indexed_dim(attrs, dst.size(), dim);
  if (!why.empty()) return why;
  if (!codegen::is_integer(in[1].dtype) || in[1].shape.size() != 1) return "index_put needs a 1-D int64/int32 index";
  Shape want = dst;
  want[static_cast<size_t>(*dim)] = in[1].shape[0];
  // Leading 1-dims change no element's place (`cache[:, :, pos] = x` gives
  // x without the batch dim); other broadcasting is not supported.
  auto strip = [](Shape s) {
    while (!s.empty() && s.front() == 1) s.erase(s.begin());
    return s;
  };
  if (strip(in[2].shape) != strip(want))
    return "index_put values must have the destination's shape with the index's length (broadcasting only "
           "over leading 1-dims)";
  if (in[2].dtype != in[0].dtype || out.dtype != in[0].dtype || out.shape != dst)
    return "index_put dtypes or output shape do not match the destination";
  return "";
}

}  // namespace

std::string check_index_put(const OpQuery& q) {
  if (q.outputs.size() != 1) return "index_put needs one output";
  int64_t dim = 0;
  return describe(q.attrs, q.inputs, q.outputs[0], &dim);
}

bool is_state_update_of(const ir::Graph& graph, int node, int values) {
  const ir::Node& n = graph.nodes()[static_cast<size_t>(node)];
  return n.op == kIndexPut && n.inputs.size() == 3 && n.inputs[2] == values && n.inputs[0] != values &&
         n.inputs[1] != values;
}

StateScatterPlan plan_state_update(PlanContext& ctx, int node) {
  const ir::Node& n = ctx.graph().nodes()[static_cast<size_t>(node)];
  const ir::Graph& g = ctx.graph();
  std::vector<TensorInfo> in;
  for (int id : n.inputs) in.push_back({g.value(id).dtype, g.value(id).shape, false});
  StateScatterPlan p;
  std::string why = describe(n.attrs, in, {g.value(n.outputs[0]).dtype, g.value(n.outputs[0]).shape, false}, &p.dim);
  if (!why.empty()) throw CompileError("node '" + n.name + "': " + why);
  p.state = n.inputs[0];
  if (!g.value(p.state).is_state)
    throw CompileError("node '" + n.name + "': index_put into '" + g.value(p.state).name +
                       "', which is not a mutable buffer of the program (only in-place cache updates are "
                       "supported)");
  // In place: nothing may read the state's old value after this step.
  for (int user : ctx.consumers(p.state))
    if (user != node)
      throw CompileError("node '" + n.name + "': the old value of state '" + g.value(p.state).name +
                         "' is read by '" + g.nodes()[static_cast<size_t>(user)].name +
                         "' too; an in-place update cannot keep it");
  p.index = n.inputs[1];
  p.values = n.inputs[2];
  p.out = n.outputs[0];
  return p;
}

GridLoop StateScatterPlan::grid_loop(LowerContext& ctx) const {
  const ir::Graph& g = ctx.graph();
  const ir::Value& dst = g.value(state);
  const ir::Value& idx = g.value(index);
  const ir::Value& val = g.value(values);
  const size_t rank = dst.shape.size(), d = static_cast<size_t>(dim);
  int64_t inner = 1;  // elements after `dim`
  for (size_t j = d + 1; j < rank; ++j) inner *= dst.shape[j];
  const int64_t n = idx.shape[0], size = dst.shape[d];
  const bool rotary = rotary_cos >= 0;
  const size_t elem = engine::dtype_size(dst.dtype);
  // A plain update moves bits; one computing a rotary stores its float result.
  const std::string unit = rotary ? codegen::storage_type(dst.dtype)
                                  : elem == 8 ? "unsigned long long" : elem == 4 ? "unsigned int"
                                  : elem == 2 ? "unsigned short" : "unsigned char";
  const int source = values_storage >= 0 ? values_storage : values;
  GridLoop loop;
  loop.count = val.numel();
  loop.params = {{unit + "* __restrict__", "state", ctx.tensor_arg(out)},
                 {std::string("const ") + codegen::storage_type(idx.dtype) + "* __restrict__", "index", ctx.tensor_arg(index)}};
  if (rotary)
    loop.params.insert(loop.params.end(),
                       {{std::string("const ") + codegen::storage_type(g.value(source).dtype) + "* __restrict__", "x",
                         ctx.tensor_arg(source)},
                        {std::string("const ") + codegen::storage_type(g.value(rotary_cos).dtype) + "* __restrict__", "cs",
                         ctx.tensor_arg(rotary_cos)},
                        {std::string("const ") + codegen::storage_type(g.value(rotary_sin).dtype) + "* __restrict__", "sn",
                         ctx.tensor_arg(rotary_sin)}});
  else
    loop.params.push_back({"const " + unit + "* __restrict__", "values", ctx.tensor_arg(source)});
  std::ostringstream s;
  // values[o, t, w] -> state[o, index[t], w]: one iteration an element of values.
  s << "    const long long w = i % " << ll(inner) << ", t = (i / " << ll(inner) << ") % " << ll(n)
    << ", o = i / " << ll(inner * n) << ";\n"
    << "    long long p = (long long)index[t];\n"
    << wrap_clamp_index("p", size, "    ");
  if (rotary) {
    s << rotary_value_code(g, values, rotary_cos, rotary_sin, values_storage, values_map, val.shape, "    ")
      << "    state[(o * " << ll(size) << " + p) * " << ll(inner) << " + w] = " << codegen::store_expr(dst.dtype, "v")
      << ";\n";
  } else {
    // values' element i: contiguous, or through its source's strides
    const std::string vo = values_storage >= 0 ? codegen::affine_offset(values_map, val.shape) : "i";
    s << "    state[(o * " << ll(size) << " + p) * " << ll(inner) << " + w] = values[" << vo << "];\n";
  }
  loop.body = s.str();
  return loop;
}

void StateScatterPlan::lower(LowerContext& ctx, engine::Step& step) const {
  lower_grid_loop(ctx, step, rotary_cos >= 0 ? "kiln_rotary_state_scatter" : "kiln_state_scatter", grid_loop(ctx));
}

KILN_REGISTER_OPS(state) {
  OpDef def;
  def.name = kIndexPut;
  def.role = OpRole::kStep;
  def.check = check_index_put;
  def.any_dtype = true;
  def.index_inputs = {1};
  // index_put wraps negative positions as Python does: [-size, size) of the indexed dim.
  def.index_ranges = [](const ir::Graph& g, const ir::Node& n) {
    std::vector<TensorInfo> in;
    for (int id : n.inputs) in.push_back({g.value(id).dtype, g.value(id).shape, false});
    int64_t dim = 0;
    std::vector<IndexRange> ranges;
    if (n.outputs.size() != 1 ||
        !describe(n.attrs, in, {g.value(n.outputs[0]).dtype, g.value(n.outputs[0]).shape, false}, &dim).empty())
      return ranges;
    const ir::Value& dst = g.value(n.inputs[0]);
    const int64_t size = dst.shape[static_cast<size_t>(dim)];
    ranges.push_back({1, -size, size,
                      "dim " + std::to_string(dim) + " (size " + std::to_string(size) + ") of " +
                          (dst.is_state ? "state '" : "'") + dst.name + "'"});
    return ranges;
  };
  def.plan = [](PlanContext& ctx, int node) {
    StateScatterPlan p = plan_state_update(ctx, node);
    if (!strided_source(ctx, p.values, &p.values_storage, &p.values_map)) p.values_storage = -1;
    ctx.alias(p.out, p.state);
    ctx.emit(PlannedOp("state_update", std::move(p)));
  };
  register_op(std::move(def));
}

}  // namespace kiln::ops
