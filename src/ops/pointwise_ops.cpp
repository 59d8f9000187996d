#include "ops/pointwise_ops.h"

#include "ops/op_registry.h"

#include <cmath>
#include <map>
#include <cstdio>

namespace kiln::ops {
namespace {

// Prints a double as a CUDA float literal that round-trips.

double scalar_attr(const std::map<std::string, ir::Attr>& attrs, const std::string& key, double fallback,
                   bool* ok) {
  auto it = attrs.find(key);
  if (it == attrs.end()) return fallback;
  if (auto* d = std::get_if<double>(&it->second)) return *d;
  if (auto* i = std::get_if<int64_t>(&it->second)) return static_cast<double>(*i);
  if (auto* b = std::get_if<bool>(&it->second)) return *b ? 1.0 : 0.0;
  *ok = false;
  return fallback;
}

struct PointwiseOp {
  const char* name;   // edge-dialect op name, e.g. "aten.add.Tensor"
  int tensor_inputs;  // 1 or 2
};

const std::vector<PointwiseOp>& pointwise_ops() {
  static const std::vector<PointwiseOp> kOps = {
      {"aten.add.Tensor", 2},  {"aten.add.Scalar", 1},  {"aten.sub.Tensor", 2},
      {"aten.sub.Scalar", 1},  {"aten.mul.Tensor", 2},  {"aten.mul.Scalar", 1},
      {"aten.div.Tensor", 2},  {"aten.div.Scalar", 1},  {"aten.neg.default", 1},
      {"aten.relu.default", 1}, {"aten.gelu.default", 1}, {"aten.sigmoid.default", 1},
      {"aten.tanh.default", 1}, {"aten.exp.default", 1}, {"aten.abs.default", 1},
      {"aten.sqrt.default", 1}, {"aten.rsqrt.default", 1}, {"aten.log.default", 1},
      {"aten.reciprocal.default", 1}, {"aten.clamp.default", 1}, {"aten.hardtanh.default", 1},
      {"aten.hardswish.default", 1}, {"aten.hardsigmoid.default", 1}, {"aten.silu.default", 1},
      {"aten.maximum.default", 2}, {"aten.minimum.default", 2},
      {"aten.log1p.default", 1}, {"aten.expm1.default", 1}, {"aten.erf.default", 1},
      {"aten.softplus.default", 1}, {"aten.mish.default", 1}, {"aten.leaky_relu.default", 1},
      {"aten.elu.default", 1}, {"aten.pow.Tensor_Scalar", 1}, {"aten.pow.Tensor_Tensor", 2},
      {"aten.sin.default", 1}, {"aten.cos.default", 1}, {"aten.floor.default", 1}, {"aten.ceil.default", 1},
      {"aten.round.default", 1}, {"aten.trunc.default", 1}, {"aten.sign.default", 1},
      {"aten.square.default", 1}, {"aten.log2.default", 1}, {"aten.exp2.default", 1},
      {"aten.fmod.Scalar", 1}, {"aten.fmod.Tensor", 2},
      // A constant of the input's shape (safe softmax's zeros): the input's
      // value is not used.
      {"aten.full_like.default", 1},
      // Comparisons and selection: bool values are 1.0f / 0.0f inside a kernel
      // and one byte in memory.
      {"aten.eq.Tensor", 2}, {"aten.ne.Tensor", 2}, {"aten.lt.Tensor", 2}, {"aten.le.Tensor", 2},
      {"aten.gt.Tensor", 2}, {"aten.ge.Tensor", 2}, {"aten.eq.Scalar", 1}, {"aten.ne.Scalar", 1},
      {"aten.lt.Scalar", 1}, {"aten.le.Scalar", 1}, {"aten.gt.Scalar", 1}, {"aten.ge.Scalar", 1},
      {"aten.logical_not.default", 1}, {"aten.logical_and.default", 2}, {"aten.logical_or.default", 2},
      {"aten.where.self", 3}, {"aten.masked_fill.Scalar", 2},
      // On bool tensors (the generic check refuses integer ones).
      {"aten.bitwise_and.Tensor", 2}, {"aten.bitwise_or.Tensor", 2}, {"aten.bitwise_xor.Tensor", 2},
      {"aten.bitwise_not.default", 1},
      // A 0-d constant made by the program (where(c, x, 0.0) exports one).
      {"aten.scalar_tensor.default", 0},
      // Copies and casts: the store converts to the output dtype.
      {"aten._to_copy.default", 1}, {"aten.clone.default", 1}, {"kiln.cast", 1}, {"kiln.copy", 1},
      // Broadcasts its input to the output shape; the generated indexing does it.
      {"aten.expand_copy.default", 1},
  };
  return kOps;
}

}  // namespace

std::string check_pointwise_attrs(const std::string& op, const std::map<std::string, ir::Attr>& attrs) {
  bool ok = true;
  if (op == "aten.div.Tensor" || op == "aten.div.Scalar") {
    auto it = attrs.find("rounding_mode");
    if (it != attrs.end()) {
      auto* s = std::get_if<std::string>(&it->second);
      if (!s || !s->empty()) return "div with a rounding mode is not supported";
    }
  }
  if (op == "aten.gelu.default") {
    auto it = attrs.find("approximate");
    if (it != attrs.end()) {
      auto* s = std::get_if<std::string>(&it->second);
      if (!s || (*s != "none" && *s != "tanh")) return "gelu approximate must be 'none' or 'tanh'";
    }
  }
  for (const char* key : {"alpha", "other", "min", "max", "min_val", "max_val", "beta", "threshold",
                          "negative_slope", "scale", "input_scale", "exponent", "value", "s", "fill_value"})
    scalar_attr(attrs, key, 0.0, &ok);
  if (!ok) return "scalar arguments (alpha/other/min/max/exponent/...) must be numbers";
  if (op == "aten.round.default" && attrs.count("decimals")) return "round with decimals is not supported";
  return "";
}

std::string pointwise_expression(const ir::Node& node, const std::vector<std::string>& x) {
  const std::string& op = node.op;
  bool ok = true;
  auto attr = [&](const char* key, double fallback) {
    double v = scalar_attr(node.attrs, key, fallback, &ok);
    if (!ok) throw CompileError("node '" + node.name + "': attribute '" + key + "' is not a number");
    return codegen::float_literal(v);
  };
  auto scaled = [&](const std::string& b) {
    double alpha = scalar_attr(node.attrs, "alpha", 1.0, &ok);
    return alpha == 1.0 ? b : "(" + codegen::float_literal(alpha) + " * " + b + ")";
  };
  if (op == "aten.add.Tensor") return "(" + x[0] + " + " + scaled(x[1]) + ")";
  if (op == "aten.add.Scalar") return "(" + x[0] + " + " + scaled(attr("other", 0)) + ")";
  if (op == "aten.sub.Tensor") return "(" + x[0] + " - " + scaled(x[1]) + ")";
  if (op == "aten.sub.Scalar") return "(" + x[0] + " - " + scaled(attr("other", 0)) + ")";
  if (op == "aten.mul.Tensor") return "(" + x[0] + " * " + x[1] + ")";
  if (op == "aten.mul.Scalar") return "(" + x[0] + " * " + attr("other", 1) + ")";
  if (op == "aten.div.Tensor") return "(" + x[0] + " / " + x[1] + ")";
  if (op == "aten.div.Scalar") return "(" + x[0] + " / " + attr("other", 1) + ")";
  if (op == "aten.neg.default") return "(-" + x[0] + ")";
  if (op == "aten.relu.default") return "kiln_relu(" + x[0] + ")";
  if (op == "aten.gelu.default") {
    return node.string_attr("approximate", "none") == "tanh" ? "kiln_gelu_tanh(" + x[0] + ")"
                                                             : "kiln_gelu(" + x[0] + ")";
  }
  if (op == "aten.sigmoid.default") return "kiln_sigmoid(" + x[0] + ")";
  if (op == "aten.tanh.default") return "tanhf(" + x[0] + ")";
  if (op == "aten.exp.default") return "expf(" + x[0] + ")";
  if (op == "aten.abs.default") return "fabsf(" + x[0] + ")";
  if (op == "aten.sqrt.default") return "sqrtf(" + x[0] + ")";
  if (op == "aten.rsqrt.default") return "(1.0f / sqrtf(" + x[0] + "))";
  if (op == "aten.log.default") return "logf(" + x[0] + ")";
  if (op == "aten.reciprocal.default") return "(1.0f / " + x[0] + ")";
  if (op == "aten.maximum.default") return "kiln_maximum(" + x[0] + ", " + x[1] + ")";
  if (op == "aten.minimum.default") return "kiln_minimum(" + x[0] + ", " + x[1] + ")";
  if (op == "aten.hardswish.default") return "kiln_hardswish(" + x[0] + ")";
  if (op == "aten.hardsigmoid.default") return "kiln_hardsigmoid(" + x[0] + ")";
  if (op == "aten.silu.default") return "kiln_silu(" + x[0] + ")";
  if (op == "aten.clamp.default" || op == "aten.hardtanh.default") {
    bool hard = op == "aten.hardtanh.default";
    const char* lo_key = hard ? "min_val" : "min";
    const char* hi_key = hard ? "max_val" : "max";
    std::string lo = node.has_attr(lo_key) || hard ? attr(lo_key, -1.0) : "-__int_as_float(0x7f800000)";
    std::string hi = node.has_attr(hi_key) || hard ? attr(hi_key, 1.0) : "__int_as_float(0x7f800000)";
    return "kiln_clamp(" + x[0] + ", " + lo + ", " + hi + ")";
  }
  if (op == "aten.log1p.default") return "log1pf(" + x[0] + ")";
  if (op == "aten.expm1.default") return "expm1f(" + x[0] + ")";
  if (op == "aten.erf.default") return "erff(" + x[0] + ")";
  if (op == "aten.sin.default") return "sinf(" + x[0] + ")";
  if (op == "aten.cos.default") return "cosf(" + x[0] + ")";
  if (op == "aten.floor.default") return "floorf(" + x[0] + ")";
  if (op == "aten.ceil.default") return "ceilf(" + x[0] + ")";
  if (op == "aten.round.default") return "rintf(" + x[0] + ")";  // half to even, as torch.round
  if (op == "aten.trunc.default") return "truncf(" + x[0] + ")";
  if (op == "aten.square.default") return "(" + x[0] + " * " + x[0] + ")";
  if (op == "aten.log2.default") return "log2f(" + x[0] + ")";
  if (op == "aten.exp2.default") return "exp2f(" + x[0] + ")";
  if (op == "aten.sign.default") return "kiln_sign(" + x[0] + ")";
  if (op == "aten.softplus.default")
    return "kiln_softplus(" + x[0] + ", " + attr("beta", 1.0) + ", " + attr("threshold", 20.0) + ")";
  if (op == "aten.mish.default") return "kiln_mish(" + x[0] + ")";
  if (op == "aten.leaky_relu.default") return "kiln_leaky_relu(" + x[0] + ", " + attr("negative_slope", 0.01) + ")";
  if (op == "aten.elu.default")
    return "kiln_elu(" + x[0] + ", " + attr("alpha", 1.0) + ", " + attr("scale", 1.0) + ", " +
           attr("input_scale", 1.0) + ")";
  if (op == "aten.pow.Tensor_Scalar") {
    double e = scalar_attr(node.attrs, "exponent", 1.0, &ok);
    if (e == 2.0) return "(" + x[0] + " * " + x[0] + ")";
    if (e == 1.0) return x[0];
    if (e == 0.5) return "sqrtf(" + x[0] + ")";
    if (e == -1.0) return "(1.0f / " + x[0] + ")";
    return "powf(" + x[0] + ", " + attr("exponent", 1.0) + ")";
  }
  if (op == "aten.pow.Tensor_Tensor") return "powf(" + x[0] + ", " + x[1] + ")";
  // C fmod: the remainder has the dividend's sign, as torch.fmod.
  if (op == "aten.fmod.Scalar") return "fmodf(" + x[0] + ", " + attr("other", 1.0) + ")";
  if (op == "aten.fmod.Tensor") return "fmodf(" + x[0] + ", " + x[1] + ")";
  if (op == "aten.full_like.default") return attr("fill_value", 0.0);
  static const std::map<std::string, const char*> kCompare = {
      {"eq", "=="}, {"ne", "!="}, {"lt", "<"}, {"le", "<="}, {"gt", ">"}, {"ge", ">="}};
  const std::string base = op.substr(5, op.find('.', 5) - 5);  // "aten.lt.Scalar" -> "lt"
  if (auto it = kCompare.find(base); it != kCompare.end()) {
    const std::string rhs = node.inputs.size() == 2 ? x[1] : attr("other", 0.0);
    return "((" + x[0] + " " + it->second + " " + rhs + ") ? 1.0f : 0.0f)";
  }
  if (op == "aten.scalar_tensor.default") return attr("s", 0.0);
  if (op == "aten.bitwise_not.default") return "((" + x[0] + " != 0.0f) ? 0.0f : 1.0f)";
  if (op == "aten.bitwise_xor.Tensor") return "(((" + x[0] + " != 0.0f) != (" + x[1] + " != 0.0f)) ? 1.0f : 0.0f)";
  if (op == "aten.bitwise_and.Tensor") return "((" + x[0] + " != 0.0f && " + x[1] + " != 0.0f) ? 1.0f : 0.0f)";
  if (op == "aten.bitwise_or.Tensor") return "((" + x[0] + " != 0.0f || " + x[1] + " != 0.0f) ? 1.0f : 0.0f)";
  if (op == "aten.logical_not.default") return "((" + x[0] + " != 0.0f) ? 0.0f : 1.0f)";
  if (op == "aten.logical_and.default") return "((" + x[0] + " != 0.0f && " + x[1] + " != 0.0f) ? 1.0f : 0.0f)";
  if (op == "aten.logical_or.default") return "((" + x[0] + " != 0.0f || " + x[1] + " != 0.0f) ? 1.0f : 0.0f)";
  if (op == "aten.where.self") return "((" + x[0] + " != 0.0f) ? " + x[1] + " : " + x[2] + ")";
  if (op == "aten.masked_fill.Scalar") return "((" + x[1] + " != 0.0f) ? " + attr("value", 0.0) + " : " + x[0] + ")";
  if (op == "aten._to_copy.default" || op == "aten.clone.default" || op == "kiln.cast" || op == "kiln.copy" ||
      op == "aten.expand_copy.default")
    return x[0];
  throw CompileError("node '" + node.name + "': " + op + " is not an elementwise op");
}

KILN_REGISTER_OPS(elementwise) {
  for (const PointwiseOp& p : pointwise_ops()) {
    OpDef def;
    def.name = p.name;
    def.role = OpRole::kElementwise;
    def.tensor_inputs = p.tensor_inputs;
    def.check = [tensor_inputs = p.tensor_inputs](const OpQuery& q) -> std::string {
      if (static_cast<int>(q.inputs.size()) != tensor_inputs)
        return q.op + " with " + std::to_string(q.inputs.size()) + " tensor inputs is not supported";
      if (q.outputs.size() != 1) return "ops with several outputs are not supported yet";
      return check_pointwise_attrs(q.op, q.attrs);
    };
    def.expression = pointwise_expression;
    // Casting a constant (e.g. an integer scalar lifted by export) to a
    // float dtype is folded at export.
    def.folds_constant_inputs = std::string(p.name) == "aten._to_copy.default";
    register_op(std::move(def));
  }
}

}  // namespace kiln::ops
