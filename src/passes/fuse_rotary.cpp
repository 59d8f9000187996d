// Recognizes rotary position embedding in Hugging Face's rotate_half form
//   out = x * cos + cat(neg(slice(x, -1, h, 2h)), slice(x, -1, 0, h), -1) * sin
// (either operand order of the multiplies and the add) and makes it one
// kiln.rotary node (ops/rotary_ops.h): Llama-family models apply it to the
// queries and keys of every layer, which otherwise costs five launches each.
// Everything inside the pattern must have no other reader.
#include <cstdint>
#include <limits>

#include "ops/rotary_ops.h"
#include "passes/graph_queries.h"
#include "passes/graph_rewriter.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

class RotaryMatcher {
 public:
  explicit RotaryMatcher(ir::Graph& graph) : g_(graph), consumers_(consumers_of(graph)) {}

  bool try_add(int add);

 private:
  ir::Node& node(int i) { return g_.nodes()[static_cast<size_t>(i)]; }
  int producer(int v) const {
    const int p = g_.value(v).producer;
    return p < 0 || g_.nodes()[static_cast<size_t>(p)].op == "kiln.folded" ? -1 : p;
  }
  // The node producing v, when it has op `op` and v's only reader is `reader`.
  int sole_producer(int v, const char* op, int reader) {
    const int p = producer(v);
    if (p < 0 || node(p).op != op || sole_reader(g_, consumers_, v) != reader) return -1;
    return p;
  }
  // slice(x, last dim, start, end) with step 1: (x, start, end), end clamped.
  bool last_dim_slice(int n, int* x, int64_t* start, int64_t* end) {
    const ir::Node& s = node(n);
    if (s.inputs.size() != 1 || s.int_attr("step", 1) != 1) return false;
    const ir::Value& in = g_.value(s.inputs[0]);
    const int64_t rank = static_cast<int64_t>(in.shape.size()), size = rank ? in.shape.back() : 0;
    const int64_t dim = s.int_attr("dim", 0);
    if (rank == 0 || (dim != rank - 1 && dim != -1)) return false;
    *start = s.int_attr("start", 0);
    *end = std::min(s.int_attr("end", std::numeric_limits<int64_t>::max()), size);
    if (*start < 0 || *end < 0) return false;  // negative bounds: leave alone
    *x = s.inputs[0];
    return true;
  }
  static bool broadcasts_to(const std::vector<int64_t>& in, const std::vector<int64_t>& out) {
    if (in.size() > out.size()) return false;
    for (size_t i = 0; i < in.size(); ++i) {
      const int64_t a = in[in.size() - 1 - i], b = out[out.size() - 1 - i];
      if (a != 1 && a != b) return false;
    }
    return true;
  }

  ir::Graph& g_;
  std::vector<std::vector<int>> consumers_;
};

bool RotaryMatcher::try_add(int add) {
  ir::Node& a = node(add);
  if (a.inputs.size() != 2 || a.outputs.size() != 1 || a.float_attr("alpha", 1.0) != 1.0) return false;
  for (int order = 0; order < 2; ++order) {
    const int m1 = sole_producer(a.inputs[order], "aten.mul.Tensor", add);      // x * cos
    const int m2 = sole_producer(a.inputs[1 - order], "aten.mul.Tensor", add);  // rotate_half(x) * sin
    if (m1 < 0 || m2 < 0 || node(m1).inputs.size() != 2 || node(m2).inputs.size() != 2) continue;
    for (int side = 0; side < 2; ++side) {
      const int cat = sole_producer(node(m2).inputs[side], "aten.cat.default", m2);
      if (cat < 0 || node(cat).inputs.size() != 2) continue;
      const int sin = node(m2).inputs[1 - side];
      const int neg = sole_producer(node(cat).inputs[0], "aten.neg.default", cat);
      const int hi = neg < 0 ? -1 : sole_producer(node(neg).inputs.at(0), "aten.slice_copy.Tensor", neg);
      const int lo = sole_producer(node(cat).inputs[1], "aten.slice_copy.Tensor", cat);
      int x_hi = -1, x_lo = -1;
      int64_t hs = 0, he = 0, ls = 0, le = 0;
      if (hi < 0 || lo < 0 || !last_dim_slice(hi, &x_hi, &hs, &he) || !last_dim_slice(lo, &x_lo, &ls, &le) ||
          x_hi != x_lo)
        continue;
      const int x = x_hi;
      const ir::Value& xv = g_.value(x);
      const int64_t d = xv.shape.back(), h = d / 2;
      if (d % 2 != 0 || hs != h || he != d || ls != 0 || le != h) continue;
      const int64_t rank = static_cast<int64_t>(xv.shape.size());
      const int64_t cat_dim = node(cat).int_attr("dim", 0);
      if (cat_dim != rank - 1 && cat_dim != -1) continue;
      // x * cos, x on either side.
      int cos = -1;
      if (node(m1).inputs[0] == x) cos = node(m1).inputs[1];
      else if (node(m1).inputs[1] == x) cos = node(m1).inputs[0];
      if (cos < 0 || cos == x) continue;
      const ir::Value& out = g_.value(a.outputs[0]);
      const ir::Value& cv = g_.value(cos);
      const ir::Value& sv = g_.value(sin);
      if (out.shape != xv.shape || out.dtype != xv.dtype || cv.dtype != xv.dtype || sv.dtype != xv.dtype ||
          !broadcasts_to(cv.shape, xv.shape) || !broadcasts_to(sv.shape, xv.shape))
        continue;
      const int out_value = a.outputs[0];
      a.op = ops::kKilnRotaryOp;
      a.inputs = {x, cos, sin};
      a.attrs.clear();
      a.outputs = {out_value};
      for (int f : {m1, m2, cat, neg, hi, lo}) node(f).op = "kiln.folded";
      consumers_ = consumers_of(g_);
      return true;
    }
  }
  return false;
}

}  // namespace

int fuse_rotary(ir::Graph& graph) {
  RotaryMatcher matcher(graph);
  int fused = 0;
  for (size_t n = 0; n < graph.nodes().size(); ++n)
    if (graph.nodes()[n].op == "aten.add.Tensor" && matcher.try_add(static_cast<int>(n))) ++fused;
  return fused;
}

}  // namespace kiln::passes
