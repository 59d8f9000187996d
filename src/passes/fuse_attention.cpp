// Recognizes attention written out as ops and turns it into one kiln.attention
// node (ops/attention_ops.h): the pattern
//   scores = bmm(A, Bt) [-> view to 4-D] [-> mul/div by scalars] [-> add mask]
//   p      = softmax(scores, -1)  (or PyTorch's safe softmax: where(all -inf,
//            0, softmax), as the decomposition of scaled_dot_product_attention)
//   out    = bmm(view(expand(p)), V) [-> view to 4-D]
// which is what torch.export makes of F.scaled_dot_product_attention,
// nn.MultiheadAttention, Hugging Face eager attention and torchvision's
// Swin. Scalar multiplies of the bmm operands (SDPA scales q and k by
// sqrt(scale) each) fold into the scale. The node reads A, Bt (as K
// transposed) and V in their 3-D [batch*heads, rows, dim] form with the
// "heads_split" attribute [batch, heads]; attention_layout.cpp then reads
// them through the views and permutes that made them.
//
// Everything inside the pattern must have no reader outside it; otherwise
// the ops stay as they are (and still compile, unfused).
#include <cmath>
#include <cstring>
#include <optional>

#include "ops/attention_ops.h"
#include "ops/op_registry.h"
#include "ops/view_ops.h"
#include "passes/graph_rewriter.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

using Shape = std::vector<int64_t>;

double constant_element(const ir::Value& v, int64_t i);

class Matcher {
 public:
  explicit Matcher(ir::Graph& graph) : graph_(graph), consumers_(consumers_of(graph)) {}

  bool try_softmax(int s_index);

 private:
  ir::Node& node(int i) { return graph_.nodes()[static_cast<size_t>(i)]; }
  // The live node producing `v`, or -1.
  int producer(int v) const {
    const int p = graph_.value(v).producer;
    if (p < 0 || graph_.nodes()[static_cast<size_t>(p)].op == "kiln.folded") return -1;
    return p;
  }
  bool is_output(int v) const {
    for (int o : graph_.outputs())
      if (o == v) return true;
    return false;
  }
  // `v` is read by exactly the nodes in `allowed` (and is no graph output).
  bool read_only_by(int v, std::initializer_list<int> allowed) const {
    if (is_output(v)) return false;
    const auto& users = consumers_[static_cast<size_t>(v)];
    if (users.size() != allowed.size()) return false;
    for (int u : users)
      if (std::find(allowed.begin(), allowed.end(), u) == allowed.end()) return false;
    return true;
  }
  // A dtype conversion of a float tensor to `to` (aten._to_copy, nothing else changed).
  bool is_float_cast(const ir::Node& n, engine::DType to) const {
    if (n.op != "aten._to_copy.default" || n.inputs.size() != 1 || n.outputs.size() != 1) return false;
    const ir::Value& in = graph_.value(n.inputs[0]);
    const ir::Value& out = graph_.value(n.outputs[0]);
    auto is_float = [](engine::DType d) {
      return d == engine::DType::kFloat32 || d == engine::DType::kFloat16 || d == engine::DType::kBFloat16;
    };
    return out.dtype == to && is_float(in.dtype) && is_float(to) && in.shape == out.shape;
  }
  int sole_consumer(int v) const {
    const auto& users = consumers_[static_cast<size_t>(v)];
    return users.size() == 1 && !is_output(v) ? users[0] : -1;
  }
  // A single-element float constant's value.
  std::optional<double> constant_scalar(int v) const {
    const ir::Value& c = graph_.value(v);
    if (!c.is_constant || c.numel() != 1 || c.data.size() != c.nbytes()) return std::nullopt;
    const double x = constant_element(c, 0);
    if (std::isnan(x)) return std::nullopt;
    return x;
  }
  // The factor of a multiply or divide of the scores by a scalar (an
  // attribute, or a one-element constant tensor as torch.export lifts them);
  // the scores are input 0.
  std::optional<double> scalar_factor(const ir::Node& n) const {
    if ((n.op == "aten.mul.Tensor" || n.op == "aten.div.Tensor") && n.inputs.size() == 2) {
      auto c = constant_scalar(n.inputs[1]);
      if (!c || !std::isfinite(*c) || (n.op == "aten.div.Tensor" && *c == 0.0)) return std::nullopt;
      return n.op == "aten.mul.Tensor" ? *c : 1.0 / *c;
    }
    if (n.inputs.size() != 1) return std::nullopt;
    const double c = n.float_attr("other", std::nan(""));
    if (std::isnan(c) || c == 0.0) return std::nullopt;
    if (n.op == "aten.mul.Scalar") return c;
    if (n.op == "aten.div.Scalar") return 1.0 / c;
    return std::nullopt;
  }
  bool is_layout_copy(const ir::Node& n) const {
    return ops::is_view_op(n.op) || n.op == "aten.expand_copy.default" || ops::is_identity_copy(graph_, n);
  }
  bool match_safe_softmax(int x, int s_node, int& p_value, std::vector<int>& fold);
  // The value of a scalar_tensor node's output (or a one-element constant).
  std::optional<double> scalar_value(int v) const {
    if (auto c = constant_scalar(v)) return c;
    const int p = producer(v);
    if (p < 0 || graph_.nodes()[static_cast<size_t>(p)].op != "aten.scalar_tensor.default") return std::nullopt;
    return graph_.nodes()[static_cast<size_t>(p)].float_attr("s", std::nan(""));
  }
  // An additive mask made from a boolean one, where(keep, 0, -inf) (as the
  // SDPA decomposition turns boolean masks into float ones): the boolean
  // `keep`, with the where and its scalars to fold; -1 otherwise.
  int boolean_source(int mask, std::vector<int>& fold) const {
    const int w = producer(mask);
    if (w < 0 || is_output(mask) || consumers_[static_cast<size_t>(mask)].size() != 1) return -1;
    const ir::Node& where = graph_.nodes()[static_cast<size_t>(w)];
    if (where.op != "aten.where.self" || where.inputs.size() != 3) return -1;
    if (graph_.value(where.inputs[0]).dtype != engine::DType::kBool) return -1;
    auto keep = scalar_value(where.inputs[1]), drop = scalar_value(where.inputs[2]);
    if (!keep || !drop || *keep != 0.0 || !(std::isinf(*drop) && *drop < 0)) return -1;
    fold.push_back(w);
    for (int v : {where.inputs[1], where.inputs[2]}) {
      const int p = producer(v);
      if (p >= 0 && consumers_[static_cast<size_t>(v)].size() == 1 && !is_output(v)) fold.push_back(p);
    }
    return where.inputs[0];
  }
  // Folds a scalar multiply feeding operand `v` of a bmm (through layout
  // copies) into `scale`: the copy after it reads the multiply's input.
  void fold_operand_scale(int v, double& scale, std::vector<int>& fold);

  ir::Graph& graph_;
  std::vector<std::vector<int>> consumers_;
};

// where(logical_not(any(logical_not(eq(x, -inf)), -1, keepdim)), full_like(s, 0), s)
bool Matcher::match_safe_softmax(int x, int s_node, int& p_value, std::vector<int>& fold) {
  const int s = node(s_node).outputs[0];
  const auto& users = consumers_[static_cast<size_t>(s)];
  if (users.size() != 2 || is_output(s)) return false;
  int where = -1, full = -1;
  for (int u : users) {
    if (node(u).op == "aten.where.self") where = u;
    if (node(u).op == "aten.full_like.default") full = u;
  }
  if (where < 0 || full < 0) return false;
  const ir::Node& w = node(where);
  if (w.inputs.size() != 3 || w.inputs[2] != s || w.inputs[1] != node(full).outputs[0]) return false;
  if (node(full).float_attr("fill_value", 1.0) != 0.0 || !read_only_by(node(full).outputs[0], {where})) return false;
  // The condition: not(any(not(eq(x, -inf)))) along the last dim.
  int c = w.inputs[0];
  const char* chain[] = {"aten.logical_not.default", "aten.any.dim", "aten.logical_not.default", "aten.eq.Scalar"};
  std::vector<int> cond_nodes;
  for (const char* op : chain) {
    const int p = producer(c);
    if (p < 0 || node(p).op != op || node(p).inputs.size() != 1) return false;
    if (!read_only_by(c, {cond_nodes.empty() ? where : cond_nodes.back()})) return false;
    cond_nodes.push_back(p);
    c = node(p).inputs[0];
  }
  if (c != x || !std::isinf(node(cond_nodes.back()).float_attr("other", 0.0))) return false;
  if (!read_only_by(x, {s_node, cond_nodes.back()})) return false;
  fold.insert(fold.end(), cond_nodes.begin(), cond_nodes.end());
  fold.push_back(full);
  fold.push_back(where);
  p_value = w.outputs[0];
  return true;
}

void Matcher::fold_operand_scale(int v, double& scale, std::vector<int>& fold) {
  int consumer = -1;
  for (;;) {
    const int p = producer(v);
    if (p < 0) return;
    ir::Node& pn = node(p);
    if (auto c = scalar_factor(pn); c && consumer >= 0 && sole_consumer(v) == consumer) {
      for (int& in : node(consumer).inputs)
        if (in == v) in = pn.inputs[0];
      scale *= *c;
      fold.push_back(p);
      return;
    }
    if (!is_layout_copy(pn) || pn.inputs.empty() || sole_consumer(v) < 0) return;
    consumer = p;
    v = pn.inputs[0];
  }
}

// Element i of constant `v` as a double (NaN for dtypes it cannot read).
double constant_element(const ir::Value& v, int64_t i) {
  const uint8_t* p = v.data.data();
  switch (v.dtype) {
    case engine::DType::kBool: return p[i] ? 1.0 : 0.0;
    case engine::DType::kFloat32: {
      float f;
      std::memcpy(&f, p + 4 * i, 4);
      return f;
    }
    case engine::DType::kFloat16:
    case engine::DType::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      if (v.dtype == engine::DType::kBFloat16) {
        uint32_t bits = static_cast<uint32_t>(h) << 16;
        float f;
        std::memcpy(&f, &bits, 4);
        return f;
      }
      const int exp = (h >> 10) & 0x1f, sign = h >> 15;
      if (exp == 0x1f) return (h & 0x3ff) ? std::nan("") : (sign ? -INFINITY : INFINITY);
      const double mant = exp ? 1.0 + (h & 0x3ff) / 1024.0 : (h & 0x3ff) / 1024.0;
      return (sign ? -1.0 : 1.0) * std::ldexp(mant, exp ? exp - 15 : -14);
    }
    default: return std::nan("");
  }
}

// Whether constant `v` ([..., rows, keys], leading dims 1) keeps exactly the
// keys j <= i of row i: bool True there (False elsewhere), or a float 0
// there and at most -1e4 (PyTorch's finfo.min or -inf) elsewhere.
bool is_causal_constant(const ir::Value& v) {
  if (!v.is_constant || v.shape.size() < 2) return false;
  const int64_t rows = v.shape[v.shape.size() - 2], keys = v.shape.back();
  if (v.numel() != rows * keys) return false;
  auto element = [&](int64_t i) { return constant_element(v, i); };
  const bool boolean = v.dtype == engine::DType::kBool;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < keys; ++j) {
      const double x = element(i * keys + j);
      const bool keep = boolean ? x != 0.0 : x == 0.0;
      const bool drop = boolean ? x == 0.0 : x <= -1e4;
      if (j <= i ? !keep : !drop) return false;
    }
  return true;
}

bool Matcher::try_softmax(int s_index) {
  const ir::Node& s = node(s_index);
  if (s.inputs.size() != 1 || s.int_attr("half_to_float", 0) != 0) return false;
  const int x = s.inputs[0];
  const Shape& xs = graph_.value(x).shape;
  const int64_t dim = s.int_attr("dim", -1);
  if (dim != -1 && dim != static_cast<int64_t>(xs.size()) - 1) return false;
  std::vector<int> fold = {s_index};

  // After the softmax: the probabilities, then layout copies into bmm #2.
  int p = s.outputs[0];
  if (!match_safe_softmax(x, s_index, p, fold)) {
    if (!read_only_by(x, {s_index})) return false;
    fold.resize(1);
  }
  // Softmax in float32 between casts, as Hugging Face's eager attention and
  // Llama-style code write it for half-precision models
  // (softmax(scores.float()).to(dtype)): the kernel computes in float anyway.
  const int up = producer(x);
  const bool upcast = up >= 0 && is_float_cast(node(up), engine::DType::kFloat32) &&
                      graph_.value(node(up).inputs[0]).dtype != engine::DType::kFloat32;
  if (upcast) {
    const int down = sole_consumer(p);
    if (down < 0 || !is_float_cast(node(down), graph_.value(node(up).inputs[0]).dtype)) return false;
    fold.push_back(down);
    p = node(down).outputs[0];
  }
  int v = p, bmm2 = -1;
  for (;;) {
    const int c = sole_consumer(v);
    if (c < 0) return false;
    if (node(c).op == "aten.bmm.default") {
      if (node(c).inputs[0] != v) return false;
      bmm2 = c;
      break;
    }
    if (!is_layout_copy(node(c))) return false;
    fold.push_back(c);
    v = node(c).outputs[0];
  }
  fold.push_back(bmm2);
  const int bmm2_out = node(bmm2).outputs[0];
  const Shape& o3 = graph_.value(bmm2_out).shape;  // [n, rows, value dim]
  int final_node = bmm2;
  if (const int c = sole_consumer(bmm2_out); c >= 0 && ops::is_view_op(node(c).op) &&
                                             graph_.value(node(c).outputs[0]).shape.size() == 4) {
    final_node = c;
  }
  const Shape out_shape = graph_.value(node(final_node).outputs[0]).shape;
  Shape heads_split = out_shape.size() == 4 ? Shape{out_shape[0], out_shape[1]} : Shape{o3[0], 1};
  if (heads_split[0] * heads_split[1] != o3[0]) return false;

  // Before the softmax: [add mask] <- [scalar multiplies] <- [view] <- bmm #1.
  int mask = -1;
  double scale = 1.0;
  int cur = x;
  bool scaled = false;
  int bmm1 = -1;
  for (;;) {
    const int pi = producer(cur);
    if (pi < 0) return false;
    const ir::Node& pn = node(pi);
    if (cur != x && sole_consumer(cur) < 0) return false;
    if (pn.op == "aten.bmm.default") {
      bmm1 = pi;
      break;
    }
    if (pn.op == "aten.add.Tensor" && mask < 0 && !scaled && pn.inputs.size() == 2 &&
        pn.float_attr("alpha", 1.0) == 1.0) {
      // The scores come from the bmm; the other operand is the mask.
      auto from_bmm = [&](int value) {
        for (int hops = 0; hops < 8; ++hops) {
          const int q = producer(value);
          if (q < 0) return false;
          if (node(q).op == "aten.bmm.default") return true;
          if (node(q).inputs.empty()) return false;
          value = node(q).inputs[0];
        }
        return false;
      };
      const int side = from_bmm(pn.inputs[0]) ? 0 : from_bmm(pn.inputs[1]) ? 1 : -1;
      if (side < 0) return false;
      mask = pn.inputs[1 - side];
      if (graph_.value(mask).shape.size() > 4) return false;
      fold.push_back(pi);
      cur = pn.inputs[side];
      continue;
    }
    if (auto c = scalar_factor(pn)) {
      scale *= *c;
      scaled = true;
      fold.push_back(pi);
      cur = pn.inputs[0];
      continue;
    }
    if (ops::is_view_op(pn.op) || (upcast && pi == up)) {
      fold.push_back(pi);
      cur = pn.inputs[0];
      continue;
    }
    return false;
  }
  if (sole_consumer(node(bmm1).outputs[0]) < 0) return false;
  fold.push_back(bmm1);
  const Shape& s3 = graph_.value(node(bmm1).outputs[0]).shape;  // [n, rows, keys]
  if (s3.size() != 3 || s3[0] != o3[0] || s3[1] != o3[1]) return false;
  if (mask >= 0 && graph_.value(mask).dtype != engine::DType::kFloat32 && graph_.value(mask).dtype != engine::DType::kFloat16 &&
      graph_.value(mask).dtype != engine::DType::kBFloat16 && graph_.value(mask).dtype != engine::DType::kBool)
    return false;

  // A boolean mask turned float by where(keep, 0, -inf) is read as boolean.
  if (mask >= 0) {
    std::vector<int> where_nodes;
    const int keep = boolean_source(mask, where_nodes);
    if (keep >= 0 && graph_.value(keep).shape.size() <= 4) {
      mask = keep;
      fold.insert(fold.end(), where_nodes.begin(), where_nodes.end());
    }
  }
  // A constant causal mask (what a decoder's mask folds to at export) is the
  // kernel's causal mode: no mask reads, and key tiles past a block's rows
  // are skipped.
  bool causal = false;
  if (mask >= 0 && is_causal_constant(graph_.value(mask))) {
    causal = true;
    mask = -1;
  }
  int q = node(bmm1).inputs[0], kt = node(bmm1).inputs[1], vv = node(bmm2).inputs[1];
  const engine::DType dt = graph_.value(q).dtype;
  const engine::DType scores_dt = upcast ? graph_.value(node(up).inputs[0]).dtype : graph_.value(x).dtype;
  if (graph_.value(kt).dtype != dt || graph_.value(vv).dtype != dt || scores_dt != dt) return false;
  const int64_t head_dim = graph_.value(q).shape[2], value_dim = graph_.value(vv).shape[2];
  if (head_dim > 128 || value_dim > 128) return false;  // the kernels' limit

  // Commit: scalar multiplies of the operands join the scale, the node at
  // the end becomes the attention, everything else in the pattern goes.
  fold_operand_scale(q, scale, fold);
  fold_operand_scale(kt, scale, fold);
  ir::Node& out = node(final_node);
  const int out_value = out.outputs[0];
  out.op = ops::kKilnAttentionOp;
  out.inputs = {q, kt, vv};
  if (mask >= 0) out.inputs.push_back(mask);
  out.attrs.clear();
  out.attrs["scale"] = scale;
  out.attrs["is_causal"] = causal;
  out.attrs["k_transposed"] = true;
  out.attrs["heads_split"] = heads_split;
  out.outputs = {out_value};
  for (int f : fold)
    if (f != final_node) node(f).op = "kiln.folded";
  consumers_ = consumers_of(graph_);
  return true;
}

}  // namespace

int fuse_attention(ir::Graph& graph) {
  Matcher matcher(graph);
  int fused = 0;
  for (size_t n = 0; n < graph.nodes().size(); ++n)
    if (graph.nodes()[n].op == "aten._softmax.default" && matcher.try_softmax(static_cast<int>(n))) ++fused;
  return fused;
}

}  // namespace kiln::passes
