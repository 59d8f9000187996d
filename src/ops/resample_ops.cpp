#include "ops/resample_ops.h"

#include <algorithm>
#include <cmath>
#include <variant>

#include "ops/op_registry.h"
#include "ops/resample_kernel.h"

namespace kiln::ops {
namespace {

using Attrs = std::map<std::string, ir::Attr>;

bool is_nearest(const std::string& op) {
  return op == "aten.upsample_nearest2d.vec" || op == "aten.upsample_nearest2d.default";
}
bool is_bilinear(const std::string& op) {
  return op == "aten.upsample_bilinear2d.vec" || op == "aten.upsample_bilinear2d.default";
}
bool is_reflect(const std::string& op) { return op.rfind("aten.reflection_pad", 0) == 0; }
bool is_replicate(const std::string& op) { return op.rfind("aten.replication_pad", 0) == 0; }
// A constant/reflection/replication pad whose every width is 0 (negative
// widths crop, so a same-shaped result is not enough).
bool is_zero_pad(const ir::Node& n) {
  const char* key = n.op == "aten.constant_pad_nd.default" ? "pad"
                    : (is_reflect(n.op) || is_replicate(n.op)) ? "padding" : nullptr;
  if (key == nullptr || !n.has_attr(key)) return false;
  for (int64_t w : n.ints_attr(key))
    if (w != 0) return false;
  return true;
}
// 1, 2 or 3 for reflection_pad{1,2,3}d / replication_pad{1,2,3}d.
int padded_dims(const std::string& op) {
  size_t at = op.find("_pad");
  return at == std::string::npos ? 0 : op[at + 4] - '0';
}

// A list attribute as doubles (ints widen); empty when absent.
std::vector<double> doubles(const Attrs& attrs, const std::string& key) {
  auto it = attrs.find(key);
  if (it == attrs.end()) return {};
  if (auto* d = std::get_if<std::vector<double>>(&it->second)) return *d;
  if (auto* i = std::get_if<std::vector<int64_t>>(&it->second)) return {i->begin(), i->end()};
  if (auto* s = std::get_if<double>(&it->second)) return {*s};
  if (auto* s = std::get_if<int64_t>(&it->second)) return {static_cast<double>(*s)};
  return {};
}

std::vector<int64_t> ints(const Attrs& attrs, const std::string& key, bool* ok) {
  *ok = true;
  auto it = attrs.find(key);
  if (it == attrs.end()) return {};
  if (auto* v = std::get_if<std::vector<int64_t>>(&it->second)) return *v;
  if (auto* i = std::get_if<int64_t>(&it->second)) return {*i};
  *ok = false;
  return {};
}

// A scalar attribute (optional float) as a double; `fallback` when absent.
bool number(const Attrs& attrs, const std::string& key, double fallback, double* out) {
  *out = fallback;
  auto it = attrs.find(key);
  if (it == attrs.end()) return true;
  if (auto* d = std::get_if<double>(&it->second)) *out = *d;
  else if (auto* i = std::get_if<int64_t>(&it->second)) *out = static_cast<double>(*i);
  else if (auto* b = std::get_if<bool>(&it->second)) *out = *b ? 1.0 : 0.0;
  else return false;
  return true;
}

bool flag(const Attrs& attrs, const std::string& key) {
  auto it = attrs.find(key);
  if (it == attrs.end()) return false;
  if (auto* b = std::get_if<bool>(&it->second)) return *b;
  if (auto* i = std::get_if<int64_t>(&it->second)) return *i != 0;
  return false;
}

// Reads `op`'s attributes against its input and output shapes into `p`
// (kind, before/value or the two axes); an error message or "".
std::string describe(const std::string& op, const Attrs& attrs, const std::vector<int64_t>& in,
                     const std::vector<int64_t>& out, ResamplePlan& p) {
  const std::string name = op.substr(5, op.find('.', 5) - 5);  // "upsample_nearest2d"
  if (in.size() != out.size()) return name + ": input and output ranks differ";
  for (int64_t d : in)
    if (d < 1) return name + " of an empty tensor is not supported";
  for (int64_t d : out)
    if (d < 1) return name + " with an empty output is not supported";

  if (is_nearest(op) || is_bilinear(op)) {
    if (in.size() != 4) return name + " needs a 4-D [n, c, h, w] input (got " + ir::shape_to_string(in) + ")";
    if (out[0] != in[0] || out[1] != in[1]) return name + ": output batch/channels differ from the input's";
    bool ok = true;
    std::vector<int64_t> size = ints(attrs, "output_size", &ok);
    if (!ok) return name + ": output_size must be a list of integers";
    if (!size.empty() && (size.size() != 2 || size[0] != out[2] || size[1] != out[3]))
      return name + ": output_size does not match the output shape " + ir::shape_to_string(out);
    // The scales ATen's kernels are given: .vec passes scale_factors on (when
    // no output_size is given), .default has scales_h / scales_w.
    double scale[2] = {0.0, 0.0};
    if (op.size() > 4 && op.compare(op.size() - 4, 4, ".vec") == 0) {
      std::vector<double> factors = doubles(attrs, "scale_factors");
      if (!factors.empty()) {
        if (factors.size() != 2) return name + ": scale_factors must have two entries";
        if (!size.empty()) return name + ": both output_size and scale_factors are given";
        for (int i = 0; i < 2; ++i) {
          // ATen's compute_output_size: the size is (int64)(in * scale).
          if (!(factors[i] > 0.0) || static_cast<int64_t>(static_cast<double>(in[2 + i]) * factors[i]) != out[2 + i])
            return name + ": scale_factors do not match the output shape " + ir::shape_to_string(out);
          scale[i] = factors[i];
        }
      } else if (size.empty()) {
        return name + ": neither output_size nor scale_factors is given";
      }
    } else {
      if (size.empty()) return name + ": output_size is missing";
      if (!number(attrs, "scales_h", 0.0, &scale[0]) || !number(attrs, "scales_w", 0.0, &scale[1]))
        return name + ": scales_h / scales_w must be numbers";
    }
    if (is_nearest(op)) {
      p.kind = ResamplePlan::Kind::kNearest;
      p.h = nearest_axis(in[2], out[2], scale[0]);
      p.w = nearest_axis(in[3], out[3], scale[1]);
    } else {
      p.kind = ResamplePlan::Kind::kBilinear;
      bool align = flag(attrs, "align_corners");
      p.h = linear_axis(in[2], out[2], align, scale[0]);
      p.w = linear_axis(in[3], out[3], align, scale[1]);
    }
    return "";
  }

  const size_t rank = in.size();
  std::vector<int64_t> pads;
  bool ok = true;
  if (op == "aten.constant_pad_nd.default") {
    p.kind = ResamplePlan::Kind::kConstantPad;
    pads = ints(attrs, "pad", &ok);
    if (!ok) return name + ": pad must be a list of integers";
    if (pads.size() % 2 != 0 || pads.size() > 2 * rank)
      return name + ": pad must have an even length of at most twice the rank";
    double value = 0.0;
    if (!number(attrs, "value", 0.0, &value)) return name + ": the pad value must be a number";
    p.value = static_cast<float>(value);
  } else {
    p.kind = is_reflect(op) ? ResamplePlan::Kind::kReflectPad : ResamplePlan::Kind::kReplicatePad;
    pads = ints(attrs, "padding", &ok);
    const size_t dims = static_cast<size_t>(padded_dims(op));
    if (!ok || pads.size() != 2 * dims) return name + ": padding must be " + std::to_string(2 * dims) + " integers";
    if (rank != dims + 1 && rank != dims + 2)
      return name + " needs a " + std::to_string(dims + 1) + "-D or " + std::to_string(dims + 2) + "-D input (got " +
             ir::shape_to_string(in) + ")";
    for (int64_t v : pads)
      if (v < 0) return name + " with negative padding (cropping) is not supported";
  }
  p.before.assign(rank, 0);
  for (size_t j = 0; j < pads.size() / 2; ++j) {  // pairs from the last dim backwards
    const size_t d = rank - 1 - j;
    const int64_t b = pads[2 * j], a = pads[2 * j + 1];
    if (in[d] + b + a != out[d])
      return name + ": padding does not match the output shape " + ir::shape_to_string(out);
    if (p.kind == ResamplePlan::Kind::kReflectPad && (b >= in[d] || a >= in[d]))
      return name + ": padding must be smaller than the padded dimension (" + std::to_string(in[d]) + ")";
    p.before[d] = b;
  }
  for (size_t d = 0; d + pads.size() / 2 < rank; ++d)
    if (in[d] != out[d]) return name + ": an unpadded dimension changes size";
  return "";
}

}  // namespace

float compute_scales_value(double scale, int64_t in, int64_t out) {
  return scale > 0.0 ? static_cast<float>(1.0 / scale) : static_cast<float>(in) / static_cast<float>(out);
}

InterpAxis nearest_axis(int64_t in, int64_t out, double scale) {
  InterpAxis a;
  if (out == in) return a;  // ATen's nearest_idx copies, whatever the scale
  if (out == 2 * in) {
    a.mode = InterpAxis::Mode::kHalf;
    return a;
  }
  a.mode = InterpAxis::Mode::kNearest;
  a.scale = compute_scales_value(scale, in, out);
  return a;
}

InterpAxis linear_axis(int64_t in, int64_t out, bool align_corners, double scale) {
  InterpAxis a;
  a.align_corners = align_corners;
  if (out == in) return a;  // compute_source_index_and_lambda copies
  a.mode = InterpAxis::Mode::kLinear;
  // area_pixel_compute_scale<float>
  if (align_corners)
    a.scale = out > 1 ? static_cast<float>(in - 1) / static_cast<float>(out - 1) : 0.0f;
  else
    a.scale = compute_scales_value(scale, in, out);
  return a;
}

bool is_resample_op(const std::string& op) {
  return is_nearest(op) || is_bilinear(op) || op == "aten.constant_pad_nd.default" || is_reflect(op) ||
         is_replicate(op);
}

std::string check_resample(const OpQuery& q) {
  if (q.inputs.size() != 1 || q.outputs.size() != 1) return q.op + " needs one tensor input and one output";
  ResamplePlan p;
  return describe(q.op, q.attrs, q.inputs[0].shape, q.outputs[0].shape, p);
}

ResamplePlan plan_resample(const ir::Graph& graph, const ir::Node& node) {
  if (node.inputs.size() != 1 || node.outputs.size() != 1)
    throw CompileError("node '" + node.name + "': " + node.op + " needs one tensor input and one output");
  ResamplePlan p;
  p.input = node.inputs[0];
  p.out = node.outputs[0];
  std::string why = describe(node.op, node.attrs, graph.value(p.input).shape, graph.value(p.out).shape, p);
  if (!why.empty()) throw CompileError("node '" + node.name + "': " + why);
  return p;
}

void ResamplePlan::lower(LowerContext& ctx, engine::Step& step) const {
  step.kind = engine::StepKind::kKernel;
  engine::KernelStep& k = step.kernel;
  k.function = ctx.kernel_name("kiln_resample");
  ctx.add_source(generate_resample_kernel(ctx.graph(), *this, k.function));
  const int64_t n = ctx.graph().value(out).numel();
  k.grid[0] = resample_grid(n);
  k.block[0] = kResampleBlock;
  k.args = {ctx.tensor_arg(out), ctx.tensor_arg(input), LowerContext::int_arg(n)};
}

KILN_REGISTER_OPS(resample) {
  for (const char* name :
       {"aten.upsample_nearest2d.vec", "aten.upsample_nearest2d.default", "aten.upsample_bilinear2d.vec",
        "aten.upsample_bilinear2d.default", "aten.constant_pad_nd.default", "aten.reflection_pad1d.default",
        "aten.reflection_pad2d.default", "aten.reflection_pad3d.default", "aten.replication_pad1d.default",
        "aten.replication_pad2d.default", "aten.replication_pad3d.default"}) {
    OpDef def;
    def.name = name;
    def.role = OpRole::kStep;
    def.check = check_resample;
    def.plan = [](PlanContext& ctx, int node) {
      const ir::Node& n = ctx.graph().nodes()[static_cast<size_t>(node)];
      ResamplePlan plan = plan_resample(ctx.graph(), n);  // validates the node first
      // A pad of zero width on every side (Swin pads to whole windows, 0 at
      // 224x224) moves nothing: the output is the input's storage, as a view.
      const ir::Value& in = ctx.graph().value(n.inputs.at(0));
      const ir::Value& out = ctx.graph().value(n.outputs.at(0));
      if (is_zero_pad(n) && in.shape == out.shape && in.dtype == out.dtype) {
        ctx.alias(n.outputs[0], n.inputs[0]);
        return;
      }
      ctx.emit(PlannedOp(n.op.substr(5, n.op.find('.', 5) - 5), std::move(plan)));
    };
    register_op(std::move(def));
  }
}

}  // namespace kiln::ops
