#include "ops/norm_ops.h"

#include "ops/gemm_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "codegen/cuda_dtype.h"
#include "ops/layout_ops.h"
#include "ops/norm_kernel.h"
#include "ops/op_registry.h"

namespace kiln::ops {
using codegen::is_float;
namespace {

constexpr const char* kLayerNorm = "aten.native_layer_norm.default";
constexpr const char* kGroupNorm = "aten.native_group_norm.default";
constexpr const char* kBatchNormStats = "aten._native_batch_norm_legit.no_stats";

enum class Kind { kLayer, kGroup, kBatchStats };

Kind kind_of(const std::string& op) {
  if (op == kLayerNorm || op == "kiln.layer_norm_nhwc") return Kind::kLayer;
  if (op == kGroupNorm || op == "kiln.group_norm_nhwc") return Kind::kGroup;
  return Kind::kBatchStats;
}

const char* label_of(Kind k) {
  switch (k) {
    case Kind::kLayer: return "layer_norm";
    case Kind::kGroup: return "group_norm";
    default: return "batch_norm_stats";
  }
}


// Which of inputs[1..] is the weight and which the bias: in schema order,
// skipping an optional tensor the front end marked absent ("<name>_absent",
// python/kiln/_fx_nodes.py). Index into the inputs, -1 when absent.
struct Operands {
  int weight = -1, bias = -1;
};
Operands operands(const ir::Node& node, size_t input_count) {
  Operands o;
  size_t next = 1;
  for (const char* name : {"weight", "bias"}) {
    if (node.int_attr(std::string(name) + "_absent", 0) != 0 || next >= input_count) continue;
    (std::string(name) == "weight" ? o.weight : o.bias) = static_cast<int>(next++);
  }
  if (next != input_count)
    throw CompileError(node.op + " has " + std::to_string(input_count) +
                       " tensor inputs; expected the input and at most a weight and a bias");
  return o;
}

// Checks the attributes against the (NCHW-order) input shape `x`; returns
// the shape the weight and bias must have.
std::vector<int64_t> param_shape(Kind kind, const std::vector<int64_t>& x, const ir::Node& node) {
  const std::string what = node.op;
  if (kind == Kind::kLayer) {
    std::vector<int64_t> normalized = node.ints_attr("normalized_shape");
    if (normalized.empty()) throw CompileError(what + " needs a non-empty normalized_shape");
    if (normalized.size() > x.size() || !std::equal(normalized.begin(), normalized.end(), x.end() - normalized.size()))
      throw CompileError(what + ": normalized_shape " + ir::shape_to_string(normalized) +
                         " is not the trailing dims of the input " + ir::shape_to_string(x));
    if (ir::numel_of(normalized) == 0) throw CompileError(what + " over an empty shape");
    return normalized;
  }
  if (x.size() < 2) throw CompileError(what + " needs an input of rank 2 or more (got " + ir::shape_to_string(x) + ")");
  const int64_t n = x[0], c = x[1], spatial = ir::numel_of(std::vector<int64_t>(x.begin() + 2, x.end()));
  if (kind == Kind::kGroup) {
    const int64_t group = node.int_attr("group", 0);
    if (node.int_attr("N", n) != n || node.int_attr("C", c) != c || node.int_attr("HxW", spatial) != spatial)
      throw CompileError(what + ": N, C, HxW do not match the input " + ir::shape_to_string(x));
    if (group < 1 || c % group != 0)
      throw CompileError(what + ": " + std::to_string(c) + " channels do not split into " + std::to_string(group) +
                         " groups");
    if (n * spatial == 0 || c == 0) throw CompileError(what + " of an empty input");
  } else {
    if (node.has_attr("training") && node.int_attr("training", 1) == 0)
      throw CompileError(what + " without training=True (batch statistics) is not supported");
    if (n * spatial == 0 || c == 0) throw CompileError(what + " of an empty input");
  }
  return {c};
}

// Drops size-1 dims and merges neighbours that both coefficient lists walk
// contiguously, so the kernel divides by as few constants as it can.
void simplify(std::vector<int64_t>& shape, std::vector<int64_t>& data, std::vector<int64_t>& param) {
  std::vector<int64_t> s, d, p;
  for (size_t j = 0; j < shape.size(); ++j) {
    if (shape[j] == 1) continue;
    if (!s.empty() && d.back() == data[j] * shape[j] && p.back() == param[j] * shape[j]) {
      s.back() *= shape[j];
      d.back() = data[j];
      p.back() = param[j];
      continue;
    }
    s.push_back(shape[j]);
    d.push_back(data[j]);
    p.push_back(param[j]);
  }
  shape = std::move(s);
  data = std::move(d);
  param = std::move(p);
}

}  // namespace

bool is_norm_op(const std::string& op) { return op == kLayerNorm || op == kGroupNorm || op == kBatchNormStats; }

bool is_nhwc_norm_op(const std::string& op) {
  return op == "kiln.layer_norm_nhwc" || op == "kiln.group_norm_nhwc" || op == "kiln.batch_norm_stats_nhwc";
}

std::string nhwc_norm_op(const std::string& aten_op) {
  return std::string("kiln.") + label_of(kind_of(aten_op)) + "_nhwc";
}

bool norm_prefers_nhwc(const ir::Node& node) {
  if (kind_of(node.op) != Kind::kLayer) return true;
  // Over [c, h, w] the NHWC row is contiguous; over [w] or [h, w] its
  // elements are c apart.
  return node.has_attr("normalized_shape") && node.ints_attr("normalized_shape").size() == 3;
}

std::string check_norm(const OpQuery& q) {
  if (q.inputs.empty()) return q.op + " needs a tensor input";
  if (q.outputs.empty() || q.outputs[0].shape != q.inputs[0].shape)
    return q.op + ": output 0 does not have the input's shape";
  ir::Node node;
  node.op = q.op;
  node.name = q.op;
  node.attrs = q.attrs;
  try {
    const Kind kind = kind_of(q.op);
    Operands o = operands(node, q.inputs.size());
    std::vector<int64_t> shape = param_shape(kind, q.inputs[0].shape, node);
    for (int i : {o.weight, o.bias}) {
      if (i < 0) continue;
      const auto& p = q.inputs[static_cast<size_t>(i)].shape;
      bool ok = kind == Kind::kLayer ? p == shape : ir::numel_of(p) == shape[0] && p.size() == 1;
      if (!ok)
        return q.op + ": " + (i == o.weight ? "weight " : "bias ") + ir::shape_to_string(p) + " does not match " +
               ir::shape_to_string(shape);
    }
    node.float_attr("eps", 0.0);
  } catch (const CompileError& e) {
    return e.what();
  }
  return "";
}

NormPlan plan_norm(const ir::Graph& graph, const ir::Node& node) {
  const Kind kind = kind_of(node.op);
  const bool nhwc = is_nhwc_norm_op(node.op);
  const ir::Value& x = graph.value(node.inputs.at(0));
  const ir::Value& y = graph.value(node.outputs.at(0));
  if (y.shape != x.shape)
    throw CompileError("node '" + node.name + "': output " + ir::shape_to_string(y.shape) +
                       " does not match the input " + ir::shape_to_string(x.shape));
  // The op's (NCHW-order) dims and where each lives in the tensor.
  std::vector<int64_t> shape = x.shape, strides = ir::contiguous_strides(x.shape);
  if (nhwc) {
    if (x.shape.size() != 4) throw CompileError("node '" + node.name + "': " + node.op + " needs a 4-D NHWC input");
    const std::vector<int64_t> s = strides;
    shape = {x.shape[0], x.shape[3], x.shape[1], x.shape[2]};
    strides = {s[0], s[3], s[1], s[2]};
  }
  std::vector<int64_t> params;
  Operands o;
  try {
    params = param_shape(kind, shape, node);
    o = operands(node, node.inputs.size());
  } catch (const CompileError& e) {
    throw CompileError("node '" + node.name + "': " + e.what());
  }
  NormPlan p;
  p.input = x.id;
  p.out = y.id;
  p.weight = o.weight >= 0 ? node.inputs[static_cast<size_t>(o.weight)] : -1;
  p.bias = o.bias >= 0 ? node.inputs[static_cast<size_t>(o.bias)] : -1;
  for (int v : {p.weight, p.bias})
    if (v >= 0 && graph.value(v).numel() != ir::numel_of(params))
      throw CompileError("node '" + node.name + "': '" + graph.value(v).name + "' has " +
                         std::to_string(graph.value(v).numel()) + " elements, expected " +
                         std::to_string(ir::numel_of(params)));
  p.eps = node.float_attr("eps", 1e-5);
  std::vector<int64_t> row_data, row_param, elem_data, elem_param;
  const size_t rank = shape.size();
  if (kind == Kind::kLayer) {
    const size_t lead = rank - params.size();
    const std::vector<int64_t> pstrides = ir::contiguous_strides(params);
    for (size_t d = 0; d < rank; ++d) {
      if (d < lead) {
        p.row_shape.push_back(shape[d]);
        row_data.push_back(strides[d]);
        row_param.push_back(0);
      } else {
        p.elem_shape.push_back(shape[d]);
        elem_data.push_back(strides[d]);
        elem_param.push_back(pstrides[d - lead]);
      }
    }
  } else if (kind == Kind::kGroup) {
    // Row (n, g); element (channel within the group, spatial...).
    const int64_t groups = node.int_attr("group", 1), per_group = shape[1] / groups;
    p.row_shape = {shape[0], groups};
    row_data = {strides[0], per_group * strides[1]};
    row_param = {0, per_group};
    p.elem_shape = {per_group};
    elem_data = {strides[1]};
    elem_param = {1};
  } else {
    // Row c; element (n, spatial...).
    p.row_shape = {shape[1]};
    row_data = {strides[1]};
    row_param = {1};
    p.elem_shape = {shape[0]};
    elem_data = {strides[0]};
    elem_param = {0};
  }
  if (kind != Kind::kLayer)
    for (size_t d = 2; d < rank; ++d) {
      p.elem_shape.push_back(shape[d]);
      elem_data.push_back(strides[d]);
      elem_param.push_back(0);
    }
  simplify(p.row_shape, row_data, row_param);
  simplify(p.elem_shape, elem_data, elem_param);
  p.data_coef = row_data;
  p.data_coef.insert(p.data_coef.end(), elem_data.begin(), elem_data.end());
  p.param_coef = row_param;
  p.param_coef.insert(p.param_coef.end(), elem_param.begin(), elem_param.end());
  return p;
}

int64_t NormPlan::rows() const { return ir::numel_of(row_shape); }
int64_t NormPlan::row_size() const { return ir::numel_of(elem_shape); }

std::vector<int> NormPlan::reads() const {
  std::vector<int> r = {input};
  if (weight >= 0) r.push_back(weight);
  if (bias >= 0) r.push_back(bias);
  return r;
}

void NormPlan::lower(LowerContext& ctx, engine::Step& step) const {
  step.kind = engine::StepKind::kKernel;
  engine::KernelStep& k = step.kernel;
  k.function = ctx.kernel_name("kiln_norm");
  NormKernel gen = generate_norm_kernel(ctx.graph(), *this, k.function);
  ctx.add_source(gen.source);
  k.grid[0] = gen.launch.grid;
  k.block[0] = gen.launch.block;
  k.args = {ctx.tensor_arg(out), ctx.tensor_arg(input)};
  if (weight >= 0) k.args.push_back(ctx.tensor_arg(weight));
  if (bias >= 0) k.args.push_back(ctx.tensor_arg(bias));
  k.args.push_back(LowerContext::int_arg(ctx.graph().value(out).numel()));
}

void RmsNormPlan::lower(LowerContext& ctx, engine::Step& step) const {
  step.kind = engine::StepKind::kKernel;
  engine::KernelStep& k = step.kernel;
  k.function = ctx.kernel_name("kiln_rms_norm");
  NormKernel gen = generate_norm_kernel(ctx.graph(), norm, k.function, 0, 0, /*rms=*/true);
  ctx.add_source(gen.source);
  k.grid[0] = gen.launch.grid;
  k.block[0] = gen.launch.block;
  k.args = {ctx.tensor_arg(norm.out), ctx.tensor_arg(norm.input)};
  if (norm.weight >= 0) k.args.push_back(ctx.tensor_arg(norm.weight));
  k.args.push_back(LowerContext::int_arg(ctx.graph().value(norm.out).numel()));
}

namespace {

const ir::Node& node_at(PlanContext& ctx, int index) { return ctx.graph().nodes()[static_cast<size_t>(index)]; }

bool is_cast(const std::string& op) {
  return op == "aten._to_copy.default" || op == "kiln.cast" || op == "aten._to_dim_order_copy.default";
}

// The value of a one-element float constant; false when `v` is not one.
bool constant_scalar(const ir::Value& v, double& out) {
  if (!v.is_constant || v.numel() != 1 || v.data.size() != engine::dtype_size(v.dtype)) return false;
  if (v.dtype == engine::DType::kFloat32) {
    float f;
    std::memcpy(&f, v.data.data(), 4);
    out = f;
    return true;
  }
  uint16_t h;
  std::memcpy(&h, v.data.data(), 2);
  if (v.dtype == engine::DType::kBFloat16) {
    const uint32_t bits = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    out = f;
    return true;
  }
  if (v.dtype != engine::DType::kFloat16) return false;
  const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exp == 31) return false;  // inf/NaN: no eps
  out = sign * (exp == 0 ? std::ldexp(mant, -24) : std::ldexp(mant | 0x400, exp - 25));
  return true;
}

// The other operand of a two-input node one of whose inputs is `v`; -1 if neither is.
int other_operand(const ir::Node& n, int v) {
  if (n.inputs.size() != 2) return -1;
  return n.inputs[0] == v ? n.inputs[1] : n.inputs[1] == v ? n.inputs[0] : -1;
}

}  // namespace

bool stored_before(PlanContext& ctx, int v) {
  // An elementwise value is kept in registers only when fusion put all its
  // readers in the kernel computing it; a value with one reader, which is
  // elementwise, may be such. Anything else is in memory: graph inputs and
  // constants, step and view results, graph outputs, and values with
  // several readers (the caller's reader, a cast, holds one input only, so
  // its kernel cannot also hold the others).
  const int producer = ctx.graph().value(v).producer;
  if (producer < 0 || ctx.is_output(v) || ctx.consumers(v).size() != 1) return true;
  const OpDef* def = find_op(node_at(ctx, producer).op);
  if (def == nullptr || def->role != OpRole::kElementwise) return true;
  const OpDef* reader = find_op(node_at(ctx, ctx.consumers(v)[0]).op);
  return reader == nullptr || reader->role != OpRole::kElementwise;
}

bool plan_rms_norm(PlanContext& ctx, int mean_node) {
  const ir::Graph& g = ctx.graph();
  const ir::Node& m = node_at(ctx, mean_node);
  if (m.op != "aten.mean.dim" || m.inputs.size() != 1 || m.int_attr("keepdim", 0) == 0 || !m.has_attr("dim"))
    return false;
  const int sq = m.inputs[0];
  const int p = g.value(sq).producer;
  if (p < 0 || ctx.consumers(sq).size() != 1 || ctx.is_output(sq)) return false;
  const ir::Node& pn = node_at(ctx, p);
  int a = -1;
  if (pn.op == "aten.pow.Tensor_Scalar" && pn.inputs.size() == 1 && pn.float_attr("exponent", 0.0) == 2.0)
    a = pn.inputs[0];
  else if (pn.op == "aten.mul.Tensor" && pn.inputs.size() == 2 && pn.inputs[0] == pn.inputs[1])
    a = pn.inputs[0];
  if (a < 0) return false;
  const ir::Value& av = g.value(a);
  const int64_t rank = static_cast<int64_t>(av.shape.size());
  const std::vector<int64_t> dims = m.ints_attr("dim");
  if (rank < 1 || dims.size() != 1 || (dims[0] != -1 && dims[0] != rank - 1) || !is_float(av.dtype)) return false;
  const int64_t D = av.shape.back();
  if (D < 1 || av.numel() == 0) return false;
  // add(eps) -> rsqrt -> mul(a, r)
  const int add = ctx.sole_consumer(m.outputs[0]);
  if (add < 0) return false;
  const ir::Node& an = node_at(ctx, add);
  double eps = 0.0;
  if (an.op == "aten.add.Scalar" && an.inputs.size() == 1 && an.float_attr("alpha", 1.0) == 1.0) {
    eps = an.float_attr("other", -1.0);
  } else if (an.op == "aten.add.Tensor" && an.float_attr("alpha", 1.0) == 1.0) {
    const int e = other_operand(an, m.outputs[0]);
    if (e < 0 || !constant_scalar(g.value(e), eps)) return false;
  } else {
    return false;
  }
  if (!(eps >= 0.0)) return false;
  const int rs = ctx.sole_consumer(an.outputs[0]);
  if (rs < 0 || node_at(ctx, rs).op != "aten.rsqrt.default") return false;
  const int mul = ctx.sole_consumer(node_at(ctx, rs).outputs[0]);
  if (mul < 0 || node_at(ctx, mul).op != "aten.mul.Tensor" ||
      other_operand(node_at(ctx, mul), node_at(ctx, rs).outputs[0]) != a)
    return false;
  std::vector<int> absorbed = {add, rs, mul};
  int y = node_at(ctx, mul).outputs[0];
  if (g.value(y).shape != av.shape) return false;
  // [cast] -> [mul(weight) -> [cast]] (HF Llama casts before the weight,
  // nn.RMSNorm in float16 after it)
  int next = ctx.sole_consumer(y);
  auto take_cast = [&] {
    if (next >= 0 && is_cast(node_at(ctx, next).op) && is_float(g.value(node_at(ctx, next).outputs[0]).dtype)) {
      absorbed.push_back(next);
      y = node_at(ctx, next).outputs[0];
      next = ctx.sole_consumer(y);
    }
  };
  take_cast();
  int weight = -1;
  if (next >= 0 && node_at(ctx, next).op == "aten.mul.Tensor") {
    const int w = other_operand(node_at(ctx, next), y);
    const ir::Value* wv = w >= 0 ? &g.value(w) : nullptr;
    if (wv != nullptr && w != y && is_float(wv->dtype) && !wv->shape.empty() && wv->numel() == D &&
        wv->shape.back() == D &&
        g.value(node_at(ctx, next).outputs[0]).shape == av.shape) {
      weight = w;
      absorbed.push_back(next);
      y = node_at(ctx, next).outputs[0];
      next = ctx.sole_consumer(y);
      take_cast();
    }
  }
  // Read x itself where `a` is a widening (or same-dtype) cast of it read by
  // nothing else than the pattern, and x is in memory.
  int x = a, uncast = -1;  // uncast: what `a` is a widening cast of, read by nothing but the pattern
  if (av.producer >= 0) {
    const ir::Node& cn = node_at(ctx, av.producer);
    const std::vector<int>& ac = ctx.consumers(a);
    const bool only_pattern = !ctx.is_output(a) && ac.size() == 2 &&
                              std::find(ac.begin(), ac.end(), p) != ac.end() &&
                              std::find(ac.begin(), ac.end(), mul) != ac.end();
    if (is_cast(cn.op) && cn.inputs.size() == 1 && only_pattern && is_float(g.value(cn.inputs[0]).dtype) &&
        (av.dtype == engine::DType::kFloat32 || av.dtype == g.value(cn.inputs[0]).dtype))
      uncast = cn.inputs[0];
    if (uncast >= 0 && stored_before(ctx, uncast)) x = uncast;
  }
  NormPlan plan;
  plan.input = x;
  plan.out = y;
  plan.weight = weight;
  plan.eps = eps;
  const int64_t rows = av.numel() / D;
  if (rows > 1) {
    plan.row_shape = {rows};
    plan.data_coef = {D};
    plan.param_coef = {0};
  }
  plan.elem_shape = {D};
  plan.data_coef.push_back(1);
  plan.param_coef.push_back(1);
  for (int n : absorbed) ctx.absorb(n);
  // A matrix-vector product reading only the norm (a decode step's q|k|v or
  // gate|up) normalizes its rows itself: no norm kernel.
  if (next >= 0 && plan_gemm_after_rms_norm(ctx, next, plan)) return true;
  // Rows that are a slice (through views) of another tensor are read in place, e.g. Qwen3's
  // per-head q and k norms over columns of the merged q|k|v projection: the slice's layout
  // kernel, left without readers, is dropped.
  const int rows_of = uncast >= 0 ? uncast : a;
  int storage = -1;
  AffineMap map;
  // (`a`'s readers are the pattern's square and product, both taken here; `uncast`'s, the cast.)
  if (strided_source(ctx, rows_of, &storage, &map, /*all_readers=*/true)) {
    const std::vector<int64_t>& shape = g.value(rows_of).shape;
    plan.input = storage;
    plan.input_base = map.base;
    plan.row_shape.assign(shape.begin(), shape.end() - 1);
    plan.data_coef = ir::contiguous_strides(shape);
    plan.param_coef.assign(shape.size(), 0);
    plan.param_coef.back() = 1;
    plan.input_coef = map.coef;
  }
  RmsNormPlan step;
  step.norm = plan;
  ctx.emit(PlannedOp("rms_norm", std::move(step)));
  return true;
}

namespace {

const char* kStatsUnused[] = {
    "layer_norm's saved mean/rstd are used; Kiln computes only the normalized output",
    "group_norm's saved mean/rstd are used; Kiln computes only the normalized output",
    "batch norm's saved mean/invstd are used; Kiln computes only the normalized output",
};

void plan_norm_step(PlanContext& ctx, int node_index) {
  const ir::Node& n = ctx.graph().nodes()[static_cast<size_t>(node_index)];
  for (size_t i = 1; i < n.outputs.size(); ++i)
    if (!ctx.consumers(n.outputs[i]).empty() || ctx.is_output(n.outputs[i]))
      throw CompileError("node '" + n.name + "': " + kStatsUnused[static_cast<int>(kind_of(n.op))]);
  ctx.emit(PlannedOp(label_of(kind_of(n.op)), plan_norm(ctx.graph(), n)));
}

}  // namespace

// The ATen ops plan in their own layout; the channels-last pass makes the
// kiln.*_nhwc forms where the input is a convolution's NHWC output.
KILN_REGISTER_OPS(norm) {
  for (const char* name : {kLayerNorm, kGroupNorm, kBatchNormStats}) {
    OpDef def;
    def.name = name;
    def.role = OpRole::kStep;
    def.check = check_norm;
    def.plan = plan_norm_step;
    def.first_output_only = kStatsUnused[static_cast<int>(kind_of(name))];
    register_op(std::move(def));
  }
  for (const char* name : {"kiln.layer_norm_nhwc", "kiln.group_norm_nhwc", "kiln.batch_norm_stats_nhwc"}) {
    OpDef def;
    def.name = name;
    def.role = OpRole::kStep;
    def.plan = plan_norm_step;
    register_op(std::move(def));
  }
}

}  // namespace kiln::ops
