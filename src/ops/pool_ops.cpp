#include "ops/pool_ops.h"

#include <array>
#include <algorithm>
#include <variant>

#include "ops/op_registry.h"
#include "ops/pool_kernel.h"

namespace kiln::ops {
namespace {

bool is_max(const std::string& op) {
  return op == "aten.max_pool2d_with_indices.default" || op == "aten.max_pool2d.default" ||
         op == "kiln.max_pool2d_nhwc";
}
bool is_adaptive(const std::string& op) {
  return op == "aten._adaptive_avg_pool2d.default" || op == "aten.adaptive_avg_pool2d.default" ||
         op == "kiln.adaptive_avg_pool2d_nhwc";
}

// A list attribute of one or two integers (one is repeated); `fallback` when
// absent or empty (PyTorch's empty stride means "the kernel size").
std::string pair(const std::map<std::string, ir::Attr>& attrs, const std::string& key,
                 std::array<int64_t, 2> fallback, std::array<int64_t, 2>& out) {
  out = fallback;
  auto it = attrs.find(key);
  if (it == attrs.end()) return "";
  if (auto* i = std::get_if<int64_t>(&it->second)) {
    out = {*i, *i};
    return "";
  }
  auto* v = std::get_if<std::vector<int64_t>>(&it->second);
  if (!v || v->size() > 2) return "pooling " + key + " must be one or two integers";
  if (v->empty()) return "";
  out = {(*v)[0], v->size() == 2 ? (*v)[1] : (*v)[0]};
  return "";
}

bool flag(const std::map<std::string, ir::Attr>& attrs, const std::string& key, bool fallback) {
  auto it = attrs.find(key);
  if (it == attrs.end()) return fallback;
  if (auto* b = std::get_if<bool>(&it->second)) return *b;
  if (auto* i = std::get_if<int64_t>(&it->second)) return *i != 0;
  return fallback;
}

struct Window {
  std::array<int64_t, 2> kernel{1, 1}, stride{1, 1}, pad{0, 0}, dilation{1, 1};
  bool ceil_mode = false, count_include_pad = true;
  int64_t divisor_override = 0;
  std::array<int64_t, 2> output_size{1, 1};  // adaptive
};

// Reads and checks the window of a pooling op; an error message or "".
std::string read_window(const std::string& op, const std::map<std::string, ir::Attr>& attrs, Window& w) {
  if (is_adaptive(op)) {
    std::string why = pair(attrs, "output_size", {0, 0}, w.output_size);
    if (!why.empty()) return why;
    if (w.output_size[0] < 1 || w.output_size[1] < 1) return "adaptive_avg_pool2d output_size must be positive";
    return "";
  }
  for (auto [key, fallback, dst] : {std::tuple{"kernel_size", std::array<int64_t, 2>{0, 0}, &w.kernel},
                                    std::tuple{"padding", std::array<int64_t, 2>{0, 0}, &w.pad},
                                    std::tuple{"dilation", std::array<int64_t, 2>{1, 1}, &w.dilation}}) {
    std::string why = pair(attrs, key, fallback, *dst);
    if (!why.empty()) return why;
  }
  std::string why = pair(attrs, "stride", w.kernel, w.stride);
  if (!why.empty()) return why;
  w.ceil_mode = flag(attrs, "ceil_mode", false);
  w.count_include_pad = flag(attrs, "count_include_pad", true);
  auto it = attrs.find("divisor_override");
  if (it != attrs.end()) {
    auto* d = std::get_if<int64_t>(&it->second);
    if (!d || *d == 0) return "avg_pool2d divisor_override must be a non-zero integer";
    w.divisor_override = *d;
  }
  for (int i = 0; i < 2; ++i) {
    if (w.kernel[i] < 1) return "pooling kernel_size must be positive";
    if (w.stride[i] < 1) return "pooling stride must be positive";
    if (w.dilation[i] < 1) return "pooling dilation must be positive";
    if (w.pad[i] < 0 || w.pad[i] * 2 > w.kernel[i])
      return "pooling padding must be between 0 and half the kernel size";
  }
  if (!is_max(op) && (w.dilation[0] != 1 || w.dilation[1] != 1)) return "avg_pool2d has no dilation";
  return "";
}

}  // namespace

bool is_pool_op(const std::string& op) {
  return op == "aten.max_pool2d_with_indices.default" || op == "aten.max_pool2d.default" ||
         op == "aten.avg_pool2d.default" || op == "aten._adaptive_avg_pool2d.default" ||
         op == "aten.adaptive_avg_pool2d.default";
}

bool is_nhwc_pool_op(const std::string& op) {
  return op == "kiln.max_pool2d_nhwc" || op == "kiln.avg_pool2d_nhwc" || op == "kiln.adaptive_avg_pool2d_nhwc";
}

std::string nhwc_pool_op(const std::string& op) {
  if (is_max(op)) return "kiln.max_pool2d_nhwc";
  if (is_adaptive(op)) return "kiln.adaptive_avg_pool2d_nhwc";
  return "kiln.avg_pool2d_nhwc";
}

int64_t pool_output_size(int64_t in, int64_t kernel, int64_t pad, int64_t stride, int64_t dilation, bool ceil_mode) {
  int64_t span = in + 2 * pad - dilation * (kernel - 1) - 1;
  int64_t out = (ceil_mode ? (span + stride - 1) / stride : span / stride) + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

std::string check_pool(const OpQuery& q) {
  if (q.inputs.size() != 1) return q.op + " needs one tensor input";
  const auto& x = q.inputs[0].shape;
  if (x.size() != 4) return q.op + " needs a 4-D [n, c, h, w] input (got " + ir::shape_to_string(x) + ")";
  bool indices = q.op == "aten.max_pool2d_with_indices.default";
  if (q.outputs.size() != (indices ? 2u : 1u)) return q.op + " has an unexpected number of outputs";
  if (q.outputs[0].dtype != q.inputs[0].dtype) return q.op + " that changes dtype is not supported";
  Window w;
  std::string why = read_window(q.op, q.attrs, w);
  if (!why.empty()) return why;
  if (!is_adaptive(q.op)) {
    for (int i = 0; i < 2; ++i) {
      int64_t out = pool_output_size(x[2 + i], w.kernel[i], w.pad[i], w.stride[i], w.dilation[i], w.ceil_mode);
      if (out < 1) return q.op + ": the window does not fit the input " + ir::shape_to_string(x);
    }
  }
  return "";
}

PoolPlan plan_pool(const ir::Graph& graph, const ir::Node& node) {
  Window w;
  std::string why = read_window(node.op, node.attrs, w);
  if (!why.empty()) throw CompileError("node '" + node.name + "': " + why);
  const ir::Value& in = graph.value(node.inputs.at(0));
  const ir::Value& out = graph.value(node.outputs.at(0));
  if (in.shape.size() != 4 || out.shape.size() != 4)
    throw CompileError("node '" + node.name + "': pooling needs 4-D input and output");
  PoolPlan p;
  p.input = in.id;
  p.out = out.id;
  std::array<int64_t, 2> expect{};
  if (is_adaptive(node.op)) {
    p.kind = PoolPlan::Kind::kAdaptiveAvg;
    expect = w.output_size;
  } else {
    p.kind = is_max(node.op) ? PoolPlan::Kind::kMax : PoolPlan::Kind::kAvg;
    p.kernel_h = w.kernel[0];
    p.kernel_w = w.kernel[1];
    p.stride_h = w.stride[0];
    p.stride_w = w.stride[1];
    p.pad_h = w.pad[0];
    p.pad_w = w.pad[1];
    p.dilation_h = w.dilation[0];
    p.dilation_w = w.dilation[1];
    p.count_include_pad = w.count_include_pad;
    p.divisor_override = w.divisor_override;
    for (int i = 0; i < 2; ++i)
      expect[i] = pool_output_size(in.shape[1 + i], w.kernel[i], w.pad[i], w.stride[i], w.dilation[i], w.ceil_mode);
  }
  if (out.shape[0] != in.shape[0] || out.shape[3] != in.shape[3] || out.shape[1] != expect[0] ||
      out.shape[2] != expect[1])
    throw CompileError("node '" + node.name + "': pooling output " + ir::shape_to_string(out.shape) +
                       " does not match input " + ir::shape_to_string(in.shape) + " (expected spatial " +
                       std::to_string(expect[0]) + "x" + std::to_string(expect[1]) + ")");
  return p;
}

void PoolPlan::lower(LowerContext& ctx, engine::Step& step) const {
  step.kind = engine::StepKind::kKernel;
  engine::KernelStep& k = step.kernel;
  k.function = ctx.kernel_name("kiln_pool");
  ctx.add_source(generate_pool_kernel(ctx.graph(), *this, k.function));
  const int64_t n = ctx.graph().value(out).numel();
  k.grid[0] = static_cast<uint32_t>(std::min<int64_t>(std::max<int64_t>(1, (n + kPoolBlock - 1) / kPoolBlock), 65536));
  k.block[0] = kPoolBlock;
  k.args = {ctx.tensor_arg(out), ctx.tensor_arg(input), LowerContext::int_arg(n)};
}

// The ATen pooling ops are rewritten into their kiln.*_nhwc forms by the
// channels-last pass (passes/channels_last.cpp); those plan one kernel each.
KILN_REGISTER_OPS(pool) {
  for (const char* name : {"aten.max_pool2d_with_indices.default", "aten.max_pool2d.default",
                           "aten.avg_pool2d.default", "aten._adaptive_avg_pool2d.default",
                           "aten.adaptive_avg_pool2d.default"}) {
    OpDef def;
    def.name = name;
    def.role = OpRole::kRewritten;
    def.check = check_pool;
    if (def.name == "aten.max_pool2d_with_indices.default")
      def.first_output_only = "max_pool2d indices are used; Kiln computes only the pooled values";
    register_op(std::move(def));
  }
  for (const char* name : {"kiln.max_pool2d_nhwc", "kiln.avg_pool2d_nhwc", "kiln.adaptive_avg_pool2d_nhwc"}) {
    OpDef def;
    def.name = name;
    def.role = OpRole::kStep;
    def.plan = [](PlanContext& ctx, int node) {
      const ir::Node& n = ctx.graph().nodes()[static_cast<size_t>(node)];
      ctx.emit(PlannedOp(n.op.substr(5), plan_pool(ctx.graph(), n)));  // "max_pool2d_nhwc"
    };
    register_op(std::move(def));
  }
}

}  // namespace kiln::ops
