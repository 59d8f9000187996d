#include "ops/gemm_ops.h"

#include <algorithm>
#include <cstring>

#include "ir/graph.h"
#include "ops/gemv_kernel.h"
#include "ops/grid_loop.h"
#include "ops/op_registry.h"
#include "ops/view_ops.h"

namespace kiln::ops {

namespace {

// A node that moves no element: a view, an identity copy, or a permute that
// only moves dims of size 1.
bool keeps_element_order(const ir::Graph& graph, const ir::Node& node) {
  if (node.inputs.size() != 1 || node.outputs.size() != 1) return false;
  if (is_view_op(node.op) || is_identity_copy(graph, node)) return true;
  if (!is_constant_permute_op(node.op)) return false;
  const std::vector<int64_t>& in = graph.value(node.inputs[0]).shape;
  const std::vector<int64_t> perm = permutation_of(node, in.size());
  int64_t last = -1;
  for (int64_t p : perm) {
    if (in[static_cast<size_t>(p)] == 1) continue;
    if (p < last) return false;
    last = p;
  }
  return true;
}


// "aten.addmm.default" -> "addmm"
std::string short_name(const std::string& op) {
  size_t a = op.find('.');
  size_t b = op.find('.', a + 1);
  if (a == std::string::npos) return op;
  return op.substr(a + 1, b == std::string::npos ? std::string::npos : b - a - 1);
}

// Adds b^T of a constant [k, n] matrix as a new constant [n, k], so the GEMM
// reads the weight in nn.Linear's layout and nothing transposes at run time.
int transposed_constant(ir::Graph& graph, int id) {
  const ir::Value& v = graph.value(id);
  int64_t k = v.shape[0], n = v.shape[1];
  size_t elem = engine::dtype_size(v.dtype);
  std::vector<uint8_t> data(v.data.size());
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < n; ++j)
      std::memcpy(&data[static_cast<size_t>(j * k + i) * elem], &v.data[static_cast<size_t>(i * n + j) * elem], elem);
  return graph.add_constant(v.name + "_kn", v.dtype, {n, k}, std::move(data));
}

// linear / addmm / mm / bmm -> one GEMM step; a ReLU that is the product's
// only consumer becomes its epilogue.
// A GEMM node's plan before it is committed: the plan, its label, the later
// nodes it computes too (a ReLU, a residual add and the reshapes between)
// and the node whose place it takes (-1: its own).
struct GemmDraft {
  GemmPlan plan;
  std::string label;
  std::vector<int> absorbed;
  int emit_at = -1;
};

GemmDraft draft_gemm(PlanContext& ctx, int node_index) {
  ir::Graph& graph = ctx.graph();
  const ir::Node node = graph.nodes()[static_cast<size_t>(node_index)];  // copy: the graph may grow
  const int out = node.outputs.at(0);
  GemmPlan g;
  auto input = [&](size_t i) -> const ir::Value& { return graph.value(node.inputs.at(i)); };
  if (node.op == "aten.linear.default") {
    g.a = node.inputs[0];
    g.b = node.inputs[1];
    g.b_transposed = true;
    g.n = input(1).shape[0];
    g.k = input(1).shape[1];
    if (input(0).shape.back() != g.k)
      throw CompileError("node '" + node.name + "': input features " + std::to_string(input(0).shape.back()) +
                         " do not match weight " + ir::shape_to_string(input(1).shape));
    g.m = input(0).numel() / g.k;
    if (node.inputs.size() == 3) {
      g.bias = node.inputs[2];
      g.epilogue = engine::GemmEpilogue::kBias;
    }
  } else if (node.op == "aten.bmm.default") {
    const ir::Value& a = input(0);
    const ir::Value& b = input(1);
    if (a.shape.size() != 3 || b.shape.size() != 3 || a.shape[0] != b.shape[0] || a.shape[2] != b.shape[1])
      throw CompileError("node '" + node.name + "': cannot batch-multiply " + ir::shape_to_string(a.shape) + " by " +
                         ir::shape_to_string(b.shape));
    g.a = node.inputs[0];
    g.b = node.inputs[1];
    g.batch = a.shape[0];
    g.m = a.shape[1];
    g.k = a.shape[2];
    g.n = b.shape[2];
    if (g.batch > 1) {
      g.stride_a = g.m * g.k;
      g.stride_b = g.k * g.n;
      g.stride_out = g.m * g.n;
    }
  } else {
    size_t first = node.op == "aten.addmm.default" ? 1 : 0;
    const ir::Value& mat1 = input(first);
    const ir::Value& mat2 = input(first + 1);
    if (mat1.shape[1] != mat2.shape[0])
      throw CompileError("node '" + node.name + "': cannot multiply " + ir::shape_to_string(mat1.shape) + " by " +
                         ir::shape_to_string(mat2.shape));
    g.m = mat1.shape[0];
    g.k = mat1.shape[1];
    g.n = mat2.shape[1];
    g.a = node.inputs[first];
    if (mat2.is_constant) {
      g.b = transposed_constant(graph, node.inputs[first + 1]);
      g.b_transposed = true;
    } else {
      g.b = node.inputs[first + 1];
    }
    if (first == 1) {
      g.alpha = static_cast<float>(node.float_attr("alpha", 1.0));
      double beta = node.float_attr("beta", 1.0);
      const ir::Value& self = graph.value(node.inputs[0]);
      bool row = self.numel() == g.n && (self.shape.size() == 1 || self.shape[0] == 1);
      if (row && beta == 1.0) {
        g.bias = node.inputs[0];
        g.epilogue = engine::GemmEpilogue::kBias;
      } else if (self.shape.size() == 2 && self.shape[0] == g.m && self.shape[1] == g.n) {
        g.c = node.inputs[0];
        g.beta = static_cast<float>(beta);
      } else {
        // check_gemm refuses this shape/beta pair, so it is never promised.
        throw CompileError("node '" + node.name + "': addmm with input " + ir::shape_to_string(self.shape) +
                           " and beta " + std::to_string(beta) + " is not supported");
      }
    }
  }
  for (int v : g.reads())
    if (graph.value(v).dtype != graph.value(out).dtype)
      throw CompileError("node '" + node.name + "': operand '" + graph.value(v).name + "' is " +
                         engine::dtype_name(graph.value(v).dtype) + ", result is " +
                         engine::dtype_name(graph.value(out).dtype));
  g.out = out;
  GemmDraft draft;
  draft.label = short_name(node.op);
  const int next = ctx.sole_consumer(out);
  if (next >= 0 && g.c < 0) {
    const ir::Node& relu = graph.nodes()[static_cast<size_t>(next)];
    if (relu.op == "aten.relu.default") {
      g.epilogue = g.epilogue == engine::GemmEpilogue::kBias ? engine::GemmEpilogue::kReluBias
                                                             : engine::GemmEpilogue::kRelu;
      g.out = relu.outputs[0];
      draft.absorbed.push_back(next);
      draft.label += "+relu";
    }
  }
  // A residual add after the product (a transformer block's `x + proj(h)`)
  // becomes cuBLASLt's C operand: D = A B + bias + C, one pass fewer. The
  // step runs where the add was, when the addend surely exists.
  // Reshapes between them (nn.MultiheadAttention's [s*b, e] -> [s, b, e] ->
  // batch-first transpose over a batch of 1) change no element's place.
  std::vector<int> between;
  int sum_node = next, product = out;
  while (sum_node >= 0 && keeps_element_order(graph, graph.nodes()[static_cast<size_t>(sum_node)])) {
    between.push_back(sum_node);
    product = graph.nodes()[static_cast<size_t>(sum_node)].outputs[0];
    sum_node = ctx.sole_consumer(product);
  }
  if (sum_node >= 0 && g.c < 0 && g.batch == 1 && g.out == out) {
    const ir::Node& add = graph.nodes()[static_cast<size_t>(sum_node)];
    if (add.op == "aten.add.Tensor" && add.inputs.size() == 2 && add.float_attr("alpha", 1.0) == 1.0) {
      const int other = add.inputs[0] == product ? add.inputs[1] : add.inputs[0];
      const ir::Value& addend = graph.value(other);
      const ir::Value& sum = graph.value(add.outputs[0]);
      if (other != product && addend.dtype == graph.value(out).dtype && sum.dtype == addend.dtype &&
          addend.shape == sum.shape && addend.numel() == g.m * g.n && sum.numel() == g.m * g.n) {
        g.c = other;
        g.beta = 1.0f;
        g.out = add.outputs[0];
        draft.absorbed.insert(draft.absorbed.end(), between.begin(), between.end());
        draft.absorbed.push_back(sum_node);
        draft.emit_at = sum_node;
        draft.label += "+add";
      }
    }
  }
  g.gemv = ctx.options().gemv_kernels && gemv_applies(g, graph.value(out).dtype);
  g.early_weights = g.gemv && ctx.options().overlap_launches && graph.value(g.b).is_constant;
  draft.plan = std::move(g);
  return draft;
}

void commit(PlanContext& ctx, GemmDraft draft) {
  for (int n : draft.absorbed) ctx.absorb(n);
  if (draft.emit_at >= 0)
    ctx.emit_at(draft.emit_at, PlannedOp(draft.label, std::move(draft.plan)));
  else
    ctx.emit(PlannedOp(draft.label, std::move(draft.plan)));
}

void plan_gemm(PlanContext& ctx, int node_index) { commit(ctx, draft_gemm(ctx, node_index)); }

}  // namespace

bool plan_gemm_after_rms_norm(PlanContext& ctx, int gemm_node, const NormPlan& norm) {
  const ir::Graph& graph = ctx.graph();
  const ir::Node& node = graph.nodes()[static_cast<size_t>(gemm_node)];
  if (node.op != "aten.linear.default" || node.inputs.empty() || node.inputs[0] != norm.out) return false;
  const ir::Value& x = graph.value(norm.input);
  const ir::Value& y = graph.value(norm.out);
  if (x.dtype != y.dtype || x.shape != y.shape || norm.row_size() != x.shape.back()) return false;
  GemmDraft draft = draft_gemm(ctx, gemm_node);
  GemmPlan& g = draft.plan;
  if (!g.gemv || g.a != norm.out || g.k != norm.row_size() || g.m != norm.rows()) return false;
  g.a = norm.input;
  g.norm_weight = norm.weight;
  g.norm_eps = norm.eps;
  g.rms_norm = true;
  draft.label = "rms_norm+" + draft.label;
  draft.absorbed.push_back(gemm_node);
  if (draft.emit_at < 0) draft.emit_at = gemm_node;
  commit(ctx, std::move(draft));
  return true;
}

bool is_gemm_op(const std::string& op) {
  return op == "aten.linear.default" || op == "aten.addmm.default" || op == "aten.mm.default" || op == "aten.bmm.default";
}

std::vector<int> GemmPlan::reads() const {
  std::vector<int> r = {a, b};
  if (norm_weight >= 0) r.push_back(norm_weight);
  if (bias >= 0) r.push_back(bias);
  if (c >= 0) r.push_back(c);
  // Loop members: what they read besides this product's own output.
  for (const PlannedOp& m : loop_members)
    for (int v : m.reads())
      if (v != out && std::find(r.begin(), r.end(), v) == r.end()) r.push_back(v);
  return r;
}

std::vector<int> GemmPlan::also_writes() const {
  std::vector<int> w;
  for (const PlannedOp& m : loop_members)
    for (int v : m.all_writes()) w.push_back(v);
  return w;
}

void GemmPlan::lower(LowerContext& ctx, engine::Step& step) const {
  // The engine reads each operand's storage as a row-major matrix (the
  // storage may have another shape: a [1, c, 1, 1] mean viewed as [1, c]);
  // the values the plan names must be those matrices.
  const ir::Graph& graph = ctx.graph();
  auto expect = [&](int v, const char* role, int64_t rows, int64_t cols) {
    const ir::Value& value = graph.value(v);
    const int64_t last = value.shape.empty() ? 1 : value.shape.back();
    if (value.numel() != batch * rows * cols || last != cols)
      throw CompileError("internal: gemm " + std::string(role) + " '" + value.name + "' " +
                         ir::shape_to_string(value.shape) + " is not " + std::to_string(batch) + " x [" +
                         std::to_string(rows) + ", " + std::to_string(cols) + "]");
  };
  if (stride_a != 0 || batch == 1) expect(a, "a", m, k);
  if (stride_b != 0 || batch == 1) expect(b, "b", b_transposed ? n : k, b_transposed ? k : n);
  expect(out, "out", m, paired ? n / 2 : n);  // paired: the epilogue's result
  if (gemv) {
    const engine::DType dtype = graph.value(b).dtype;  // the product's (checked at planning)
    step.kind = engine::StepKind::kKernel;
    engine::KernelStep& ks = step.kernel;
    ks.function = ctx.kernel_name("kiln_gemv");
    std::vector<GridLoop> loops;
    for (const PlannedOp& m : loop_members) loops.push_back(grid_loop_step(m).grid_loop(ctx));
    const GemvKernel gen = generate_gemv_kernel(*this, dtype, ks.function,
                                                norm_weight >= 0 ? graph.value(norm_weight).dtype : dtype, &graph,
                                                &loops);
    ctx.add_source(gen.source);
    ks.grid[0] = gen.grid;
    ks.block[0] = gen.block;
    ks.args = {ctx.tensor_arg(out), ctx.tensor_arg(a), ctx.tensor_arg(b)};
    if (bias >= 0) ks.args.push_back(ctx.tensor_arg(bias));
    if (c >= 0) ks.args.push_back(ctx.tensor_arg(c));
    if (norm_weight >= 0) ks.args.push_back(ctx.tensor_arg(norm_weight));
    for (const GridLoop& loop : loops)
      for (const GridLoop::Param& q : loop.params) ks.args.push_back(q.arg);
    return;
  }
  if (rms_norm || paired || !loop_members.empty()) {
    throw CompileError("internal: a prologue or pair epilogue was planned on a product that is not a matrix-vector "
                       "kernel");
  }
  step.kind = engine::StepKind::kGemm;
  engine::GemmStep& s = step.gemm;
  s.a = ctx.tensor(a);
  s.b = ctx.tensor(b);
  s.bias = bias >= 0 ? ctx.tensor(bias) : engine::kNoTensor;
  s.c = c >= 0 ? ctx.tensor(c) : engine::kNoTensor;
  s.out = ctx.tensor(out);
  s.m = m;
  s.n = n;
  s.k = k;
  s.b_transposed = b_transposed;
  s.epilogue = epilogue;
  s.alpha = alpha;
  s.beta = beta;
  s.batch = batch;
  s.stride_a = stride_a;
  s.stride_b = stride_b;
  s.stride_c = stride_c;
  s.stride_out = stride_out;
}

std::string check_gemm(const OpQuery& q) {
  const auto& in = q.inputs;
  for (size_t i = 1; i < in.size(); ++i)
    if (in[i].dtype != in[0].dtype) return "operands have different dtypes";
  if (q.op == "aten.mm.default") {
    if (in.size() != 2 || in[0].shape.size() != 2 || in[1].shape.size() != 2)
      return "mm needs two 2-D operands";
    return "";
  }
  if (q.op == "aten.bmm.default") {
    if (in.size() != 2 || in[0].shape.size() != 3 || in[1].shape.size() != 3)
      return "bmm needs two 3-D operands";
    if (in[0].shape[0] != in[1].shape[0] || in[0].shape[2] != in[1].shape[1])
      return "bmm operands " + ir::shape_to_string(in[0].shape) + " and " + ir::shape_to_string(in[1].shape) +
             " do not match";
    return "";
  }
  if (q.op == "aten.addmm.default") {
    if (in.size() != 3 || in[1].shape.size() != 2 || in[2].shape.size() != 2)
      return "addmm needs 2-D mat1 and mat2";
    int64_t m = in[1].shape[0], n = in[2].shape[1];
    const auto& s = in[0].shape;
    bool bias_row = (s.size() == 1 && s[0] == n) || (s.size() == 2 && s[0] == 1 && s[1] == n);
    bool full = s.size() == 2 && s[0] == m && s[1] == n;
    if (!bias_row && !full) return "addmm input of shape " + ir::shape_to_string(s) + " is not [n], [1, n] or [m, n]";
    // A bias row is added once: beta scales only a full [m, n] addend (C).
    auto beta = q.attrs.find("beta");
    if (bias_row && !full && beta != q.attrs.end()) {
      const double* d = std::get_if<double>(&beta->second);
      const int64_t* i = std::get_if<int64_t>(&beta->second);
      if ((d && *d != 1.0) || (i && *i != 1)) return "addmm with a bias row and beta != 1 is not supported";
    }
    return "";
  }
  if (q.op == "aten.linear.default") {
    if (in.size() < 2 || in.size() > 3) return "linear needs input, weight and an optional bias";
    if (in[0].shape.empty()) return "linear input must have at least one dimension";
    if (in[1].shape.size() != 2) return "linear weight must be 2-D";
    if (in.size() == 3 && in[2].shape.size() != 1) return "linear bias must be 1-D";
    return "";
  }
  return "not a matrix product";
}

KILN_REGISTER_OPS(gemm) {
  for (const char* name : {"aten.linear.default", "aten.addmm.default", "aten.mm.default", "aten.bmm.default"}) {
    OpDef def;
    def.name = name;
    def.role = OpRole::kStep;
    def.check = [](const OpQuery& q) -> std::string {
      if (q.outputs.size() != 1) return "ops with several outputs are not supported yet";
      return check_gemm(q);
    };
    def.plan = plan_gemm;
    register_op(std::move(def));
  }
}

}  // namespace kiln::ops
