#include "ops/conv_ops.h"

#include <algorithm>
#include <variant>

#include "ops/op_registry.h"

namespace kiln::ops {
namespace {

// Two values from an int list attribute of length 1 or 2 (PyTorch repeats a
// single value); empty for anything else.
bool pair_attr(const std::map<std::string, ir::Attr>& attrs, const std::string& key, std::array<int64_t, 2>& out) {
  auto it = attrs.find(key);
  if (it == attrs.end()) return true;
  if (auto* i = std::get_if<int64_t>(&it->second)) {
    out = {*i, *i};
    return true;
  }
  auto* v = std::get_if<std::vector<int64_t>>(&it->second);
  if (!v || v->empty() || v->size() > 2) return false;
  out = {(*v)[0], v->size() == 2 ? (*v)[1] : (*v)[0]};
  return true;
}

bool bool_attr(const std::map<std::string, ir::Attr>& attrs, const std::string& key, bool fallback) {
  auto it = attrs.find(key);
  if (it == attrs.end()) return fallback;
  if (auto* b = std::get_if<bool>(&it->second)) return *b;
  if (auto* i = std::get_if<int64_t>(&it->second)) return *i != 0;
  return fallback;
}


bool unit_alpha(const ir::Node& n) { return n.float_attr("alpha", 1.0) == 1.0; }

// A constant that adds one value per output channel of an [n,p,q,k] tensor.
bool is_channel_bias(const ir::Value& v, int64_t k) {
  if (!v.is_constant || v.numel() != k || v.shape.empty() || v.shape.back() != k) return false;
  return v.shape.size() <= 4;
}

// A channels-last conv (kiln.conv2d_nhwc) absorbs a following per-channel
// bias add, a residual add of a same-shape tensor and a ReLU
// (engine::ConvStep's bias, z and activation), each the previous value's only
// use. A 1x1, stride-1, unpadded, ungrouped conv over NHWC is the GEMM
// [n*h*w, c] x w[k, c]^T and becomes a cuBLASLt step with the same epilogues
// (residual through c with beta = 1). A strided 1x1 conv (resnet's
// downsample, 10-27 us each through cuDNN at batch 1 on an H200) becomes a
// strided gather kernel plus that GEMM (4-6 us each). The conv_gemm option
// keeps them on cuDNN, for comparison.
void plan_conv(PlanContext& ctx, int node_index) {
  ir::Graph& g = ctx.graph();
  const ir::Node& node = g.nodes()[static_cast<size_t>(node_index)];
  const ir::Value& x = g.value(node.inputs.at(0));
  const ir::Value& w = g.value(node.inputs.at(1));
  if (x.shape.size() != 4 || w.shape.size() != 4)
    throw CompileError("node '" + node.name + "': convolution needs a 4-D input and weight");
  ConvParams params = conv_params(node);
  int emit_at = node_index;
  ConvPlan c;
  std::string label = "conv";
  c.x = x.id;
  c.w = w.id;
  c.bias = node.inputs.size() > 2 ? node.inputs[2] : -1;
  c.pad_h = params.padding[0];
  c.pad_w = params.padding[1];
  c.stride_h = params.stride[0];
  c.stride_w = params.stride[1];
  c.dilation_h = params.dilation[0];
  c.dilation_w = params.dilation[1];
  c.groups = params.groups;
  int out = node.outputs.at(0);
  const ir::Value& y = g.value(out);
  const int64_t k = w.shape[0];
  if (y.shape.size() != 4 || y.shape[3] != k || y.shape[0] != x.shape[0])
    throw CompileError("node '" + node.name + "': output " + ir::shape_to_string(y.shape) + " does not match weight " +
                       ir::shape_to_string(w.shape));
  for (int i = 0; i < 2; ++i) {
    int64_t expect = conv_output_size(x.shape[1 + static_cast<size_t>(i)], w.shape[1 + static_cast<size_t>(i)],
                                      params.padding[i], params.stride[i], params.dilation[i]);
    if (y.shape[1 + static_cast<size_t>(i)] != expect)
      throw CompileError("node '" + node.name + "': output " + ir::shape_to_string(y.shape) +
                         " does not match the convolution of " + ir::shape_to_string(x.shape));
  }
  if (x.shape[3] != w.shape[3] * params.groups)
    throw CompileError("node '" + node.name + "': input channels do not match weight and groups");
  // add_constant/add_node below may move the graph's values and nodes: keep copies.
  const std::vector<int64_t> x_shape = x.shape, w_shape = w.shape, y_shape = y.shape;
  const std::string x_name = x.name;
  const engine::DType x_dtype = x.dtype, y_dtype = y.dtype;

  int index = ctx.sole_consumer(out);
  auto at = [&](int i) -> const ir::Node& { return g.nodes()[static_cast<size_t>(i)]; };
  auto other_operand = [&](const ir::Node& add, int v) { return add.inputs[0] == v ? add.inputs[1] : add.inputs[0]; };
  auto is_add = [&](int i) {
    return i >= 0 && at(i).op == "aten.add.Tensor" && unit_alpha(at(i)) && at(i).inputs.size() == 2 &&
           at(i).inputs[0] != at(i).inputs[1];
  };
  if (c.bias < 0 && is_add(index)) {
    const ir::Value& b = g.value(other_operand(at(index), out));
    if (is_channel_bias(b, k) && b.dtype == y_dtype && g.value(at(index).outputs[0]).shape == y_shape) {
      c.bias = b.shape.size() == 1 ? b.id : g.add_constant(b.name + "_k", b.dtype, {k}, b.data);
      out = at(index).outputs[0];
      ctx.absorb(index);
      emit_at = index;
      label += "+bias";
      index = ctx.sole_consumer(out);
    }
  }
  if (is_add(index)) {
    const ir::Value& z = g.value(other_operand(at(index), out));
    const ir::Value& sum = g.value(at(index).outputs[0]);
    if (z.shape == y_shape && z.dtype == y_dtype && sum.shape == y_shape && sum.dtype == y_dtype) {
      c.z = z.id;
      out = at(index).outputs[0];
      ctx.absorb(index);
      emit_at = index;  // z exists once the add could run
      label += "+add";
      index = ctx.sole_consumer(out);
    }
  }
  if (index >= 0 && at(index).op == "aten.relu.default" && g.value(at(index).outputs[0]).dtype == y_dtype) {
    c.relu = true;
    out = at(index).outputs[0];
    ctx.absorb(index);
    emit_at = std::max(emit_at, index);
    label += "+relu";
  }
  c.out = out;

  auto place = [&](PlannedOp op) {
    if (emit_at == node_index) ctx.emit(std::move(op));
    else ctx.emit_at(emit_at, std::move(op));
  };
  const OpOptions::ConvGemm mode = ctx.options().conv_gemm;
  const bool unstrided = c.stride_h == 1 && c.stride_w == 1;
  const bool one_by_one = w_shape[1] == 1 && w_shape[2] == 1 && c.pad_h == 0 && c.pad_w == 0 && c.groups == 1;
  if (one_by_one && mode != OpOptions::ConvGemm::kNone && (unstrided || mode == OpOptions::ConvGemm::kAll)) {
    int a = c.x;
    if (!unstrided) {
      // xs[n, i, j, :] = x[n, i*stride_h, j*stride_w, :]: a layout kernel,
      // then the same GEMM over the [n*p*q, c] rows.
      const std::vector<int64_t> sub = {x_shape[0], y_shape[1], y_shape[2], x_shape[3]};
      const std::string name = x_name + "_stride" + std::to_string(c.stride_h) + "x" + std::to_string(c.stride_w);
      int copy = g.add_node("kiln.copy", name, {c.x}, {}, {{x_dtype, sub}});
      a = g.nodes()[static_cast<size_t>(copy)].outputs[0];
      PointwisePlan gather;
      gather.inputs = {c.x};
      gather.out = a;
      const int64_t row = x_shape[2] * x_shape[3];  // elements per input row (w * c)
      gather.input_map.coef = {x_shape[1] * row, c.stride_h * row, c.stride_w * x_shape[3], 1};
      ctx.emit(PlannedOp("strided_gather", std::move(gather)));
    }
    // [n*p*q, c] x w[k, c]^T: the OHWI weight of a 1x1 conv is nn.Linear's layout.
    GemmPlan gp;
    gp.a = a;
    gp.b = c.w;
    gp.b_transposed = true;
    gp.m = y_shape[0] * y_shape[1] * y_shape[2];
    gp.k = x_shape[3];
    gp.n = k;
    gp.bias = c.bias;
    if (c.z >= 0) {
      gp.c = c.z;
      gp.beta = 1.0f;
    }
    gp.epilogue = c.bias >= 0 ? (c.relu ? engine::GemmEpilogue::kReluBias : engine::GemmEpilogue::kBias)
                              : (c.relu ? engine::GemmEpilogue::kRelu : engine::GemmEpilogue::kNone);
    gp.out = c.out;
    place(PlannedOp(label + (unstrided ? "(1x1 gemm)" : "(strided 1x1 gemm)"), std::move(gp)));
    return;
  }
  place(PlannedOp(label, std::move(c)));
}

}  // namespace

bool is_conv_op(const std::string& op) { return op == "aten.convolution.default" || op == "aten.conv2d.default"; }

bool is_batch_norm_op(const std::string& op) { return op == kBatchNorm; }

int64_t conv_output_size(int64_t in, int64_t kernel, int64_t pad, int64_t stride, int64_t dilation) {
  return (in + 2 * pad - dilation * (kernel - 1) - 1) / stride + 1;
}

int64_t conv_transpose_output_size(int64_t in, int64_t kernel, int64_t pad, int64_t stride, int64_t dilation,
                                   int64_t output_padding) {
  return (in - 1) * stride - 2 * pad + dilation * (kernel - 1) + output_padding + 1;
}

std::string check_conv(const OpQuery& q) {
  if (q.inputs.size() < 2 || q.inputs.size() > 3 || q.outputs.size() != 1)
    return "convolution needs an input, a weight, an optional bias and one output";
  const bool transposed = bool_attr(q.attrs, "transposed", false);
  const auto& x = q.inputs[0].shape;
  const auto& w = q.inputs[1].shape;
  const auto& y = q.outputs[0].shape;
  if ((x.size() != 3 && x.size() != 4) || w.size() != x.size() || y.size() != x.size())
    return "only 1-D and 2-D convolutions ([n, c, l] or [n, c, h, w] input) are supported (input is " +
           ir::shape_to_string(x) + ")";
  if (q.op == "aten.conv2d.default" && x.size() != 4)
    return "conv2d needs a batched 4-D [n, c, h, w] input (input is " + ir::shape_to_string(x) + ")";
  const size_t spatial = x.size() - 2;
  if (!q.inputs[1].is_constant) return "convolution weights must be constant (parameters), not computed";
  if (q.inputs.size() == 3 && (!q.inputs[2].is_constant || q.inputs[2].shape.size() != 1))
    return "convolution bias must be a constant 1-D tensor";
  for (const auto& t : q.inputs)
    if (t.dtype != q.inputs[0].dtype) return "convolution operands have different dtypes";
  // A 1-D convolution's lists have one value (read as its width), a 2-D one's one or two.
  for (const char* key : {"stride", "padding", "dilation", "output_padding"}) {
    auto it = q.attrs.find(key);
    if (it == q.attrs.end()) continue;
    auto* v = std::get_if<std::vector<int64_t>>(&it->second);
    if (v && spatial == 1 && v->size() > 1)
      return std::string("1-D convolution ") + key + " must be one integer";
  }
  std::array<int64_t, 2> stride{1, 1}, padding{0, 0}, dilation{1, 1}, output_padding{0, 0};
  if (!pair_attr(q.attrs, "stride", stride) || !pair_attr(q.attrs, "padding", padding) ||
      !pair_attr(q.attrs, "dilation", dilation) || !pair_attr(q.attrs, "output_padding", output_padding))
    return "convolution stride/padding/dilation must be lists of one or two integers";
  for (int i = 0; i < 2; ++i) {
    if (stride[i] < 1 || dilation[i] < 1 || padding[i] < 0)
      return "convolution needs stride >= 1, dilation >= 1 and padding >= 0";
    if (transposed && (output_padding[i] < 0 || (output_padding[i] >= stride[i] && output_padding[i] >= dilation[i])))
      return "transposed convolution output_padding must be smaller than the stride or the dilation";
  }
  auto it = q.attrs.find("groups");
  int64_t groups = 1;
  if (it != q.attrs.end()) {
    auto* g = std::get_if<int64_t>(&it->second);
    if (!g) return "convolution groups must be an integer";
    groups = *g;
  }
  // Transposed weights are [c_in, k_out / groups, kernel...], others [k_out, c_in / groups, kernel...].
  const int64_t k_out = transposed ? w[1] * groups : w[0];
  const bool groups_ok = groups >= 1 && x[1] % groups == 0 &&
                         (transposed ? w[0] == x[1] : w[0] % groups == 0 && w[1] * groups == x[1]);
  if (!groups_ok)
    return std::string(transposed ? "transposed " : "") + "convolution groups=" + std::to_string(groups) +
           " does not match input channels " + std::to_string(x[1]) + " and weight " + ir::shape_to_string(w);
  if (q.inputs.size() == 3 && q.inputs[2].shape[0] != k_out) return "convolution bias size does not match the weight";
  if (y[0] != x[0] || y[1] != k_out) return "convolution output " + ir::shape_to_string(y) + " does not match the weight";
  for (size_t i = 0; i < spatial; ++i) {
    const size_t a = 2 - spatial + i;  // index into the pair attributes
    const int64_t in = x[2 + i], kernel = w[2 + i];
    const int64_t expect =
        transposed ? conv_transpose_output_size(in, kernel, padding[a], stride[a], dilation[a], output_padding[a])
                   : conv_output_size(in, kernel, padding[a], stride[a], dilation[a]);
    if (expect < 1 || y[2 + i] != expect)
      return "convolution output " + ir::shape_to_string(y) + " does not match the input " + ir::shape_to_string(x);
  }
  return "";
}

std::string check_batch_norm(const OpQuery& q) {
  if (q.inputs.size() != 5)
    return "batch norm without an affine weight and bias is not supported";
  const auto& x = q.inputs[0].shape;
  if (x.size() < 2) return "batch norm needs an input of rank 2 or more";
  for (size_t i = 1; i < 5; ++i) {
    if (!q.inputs[i].is_constant) return "batch norm parameters and running statistics must be constant";
    if (q.inputs[i].shape.size() != 1 || q.inputs[i].shape[0] != x[1])
      return "batch norm parameter " + std::to_string(i) + " does not have " + std::to_string(x[1]) + " channels";
  }
  return "";
}

ConvParams conv_params(const ir::Node& node) {
  ConvParams p;
  if (!pair_attr(node.attrs, "stride", p.stride) || !pair_attr(node.attrs, "padding", p.padding) ||
      !pair_attr(node.attrs, "dilation", p.dilation) || !pair_attr(node.attrs, "output_padding", p.output_padding))
    throw CompileError("node '" + node.name + "': convolution stride/padding/dilation are not 1 or 2 integers");
  p.groups = node.int_attr("groups", 1);
  p.transposed = bool_attr(node.attrs, "transposed", false);
  return p;
}

std::vector<int> ConvPlan::reads() const {
  std::vector<int> r = {x, w};
  if (bias >= 0) r.push_back(bias);
  if (z >= 0) r.push_back(z);
  return r;
}

void ConvPlan::lower(LowerContext& ctx, engine::Step& step) const {
  const ir::Graph& graph = ctx.graph();
  const ir::Value& xv = graph.value(x);
  const ir::Value& wv = graph.value(w);
  const ir::Value& y = graph.value(out);
  for (int v : {x, w, bias, z})
    if (v >= 0 && graph.value(v).dtype != y.dtype)
      throw CompileError("convolution '" + y.name + "': operand '" + graph.value(v).name + "' is " +
                         engine::dtype_name(graph.value(v).dtype) + ", result is " + engine::dtype_name(y.dtype));
  step.kind = engine::StepKind::kConv;
  engine::ConvStep& s = step.conv;
  s.x = ctx.tensor(x);
  s.w = ctx.tensor(w);
  s.bias = bias >= 0 ? ctx.tensor(bias) : engine::kNoTensor;
  s.z = z >= 0 ? ctx.tensor(z) : engine::kNoTensor;
  s.out = ctx.tensor(out);
  s.n = xv.shape[0];
  s.h = xv.shape[1];
  s.w_in = xv.shape[2];
  s.c = xv.shape[3];
  s.k = wv.shape[0];
  s.r = wv.shape[1];
  s.s = wv.shape[2];
  s.p = y.shape[1];
  s.q = y.shape[2];
  s.pad_h = pad_h;
  s.pad_w = pad_w;
  s.stride_h = stride_h;
  s.stride_w = stride_w;
  s.dilation_h = dilation_h;
  s.dilation_w = dilation_w;
  s.groups = groups;
  s.activation = relu ? engine::ConvActivation::kRelu : engine::ConvActivation::kNone;
}

// aten convolutions (1-D ones as height-1 2-D ones) become kiln.conv2d_nhwc
// in the channels-last pass, transposed ones kiln.conv_transpose2d_nhwc
// (conv_transpose_ops.cpp); batch
// norm folds into the conv before it or becomes a per-channel multiply-add
// (passes/fold_batch_norm.cpp).
KILN_REGISTER_OPS(conv) {
  for (const char* name : {"aten.convolution.default", "aten.conv2d.default"}) {
    OpDef def;
    def.name = name;
    def.role = OpRole::kRewritten;
    def.check = check_conv;
    register_op(std::move(def));
  }
  OpDef nhwc;
  nhwc.name = kConvNhwc;
  nhwc.role = OpRole::kStep;
  nhwc.plan = plan_conv;
  register_op(std::move(nhwc));

  OpDef bn;
  bn.name = kBatchNorm;
  bn.role = OpRole::kRewritten;
  bn.check = check_batch_norm;
  bn.first_output_only = "batch norm's saved mean/invstd are used; Kiln computes only the normalized output";
  register_op(std::move(bn));
}

}  // namespace kiln::ops
