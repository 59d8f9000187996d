// Fusion: matrix products absorb their bias and a following ReLU (cuBLASLt
// epilogues); chains of elementwise ops whose intermediates have one consumer
// and the output's shape become one generated kernel; views cost nothing
// (they alias their input's storage).
#include <algorithm>
#include <cstring>

#include "ops/conv_ops.h"
#include "ops/gemm_ops.h"
#include "ops/pool_ops.h"
#include "ops/layout_ops.h"
#include "ops/reduce_ops.h"
#include "ops/pointwise_ops.h"
#include "ops/view_ops.h"
#include "passes/fuse_conv.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

std::string short_name(const std::string& op) {
  // "aten.addmm.default" -> "addmm"
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

}  // namespace

std::vector<int> PlannedOp::reads() const {
  if (kind == Kind::kPointwise) return pointwise.inputs;
  if (kind == Kind::kReduce) return {reduce.input};
  if (kind == Kind::kPool) return {pool.input};
  if (kind == Kind::kDepthwise) {
    std::vector<int> r = {depthwise.conv.x, depthwise.weight};
    if (depthwise.conv.bias >= 0) r.push_back(depthwise.conv.bias);
    r.insert(r.end(), depthwise.epilogue.inputs.begin(), depthwise.epilogue.inputs.end());
    return r;
  }
  if (kind == Kind::kConv) {
    std::vector<int> r = {conv.x, conv.w};
    if (conv.bias >= 0) r.push_back(conv.bias);
    if (conv.z >= 0) r.push_back(conv.z);
    return r;
  }
  std::vector<int> r = {gemm.a, gemm.b};
  if (gemm.bias >= 0) r.push_back(gemm.bias);
  if (gemm.c >= 0) r.push_back(gemm.c);
  return r;
}

ExecPlan fuse(ir::Graph& graph) {
  ExecPlan plan;
  size_t nv = graph.values().size();
  std::vector<std::vector<int>> consumers(nv);
  for (size_t n = 0; n < graph.nodes().size(); ++n) {
    const ir::Node& node = graph.nodes()[n];
    if (node.op == "kiln.folded") continue;
    for (int in : node.inputs) consumers[static_cast<size_t>(in)].push_back(static_cast<int>(n));
  }
  std::vector<bool> is_output(nv, false);
  for (int id : graph.outputs()) is_output[static_cast<size_t>(id)] = true;

  std::vector<int> group_of(nv, -1);  // value -> open elementwise op producing it
  std::vector<bool> dead;             // per plan op, merged into a later one
  std::vector<bool> absorbed(graph.nodes().size(), false);
  auto single_use = [&](int v) {
    return consumers[static_cast<size_t>(v)].size() == 1 && !is_output[static_cast<size_t>(v)];
  };

  // Steps whose fused ops end later in the graph (a conv absorbing a residual
  // add) run at the last absorbed node, when every operand exists.
  std::map<size_t, PlannedOp> deferred;
  const size_t node_count = graph.nodes().size();  // transposed constants may add values, not nodes
  for (size_t n = 0; n < node_count; ++n) {
    if (absorbed[n]) {
      auto it = deferred.find(n);
      if (it != deferred.end()) {
        plan.ops.push_back(std::move(it->second));
        dead.push_back(false);
        deferred.erase(it);
      }
      continue;
    }
    const ir::Node node = graph.nodes()[n];  // copy: the graph may grow below
    if (node.op == "kiln.folded") continue;
    if (node.outputs.empty()) throw CompileError("node '" + node.name + "' has no outputs");
    const int out = node.outputs[0];
    if (node.op == ops::kConvNhwc) {
      ConvFusion f = plan_conv(graph, static_cast<int>(n), consumers, is_output, absorbed);
      for (int a : f.absorbed) absorbed[static_cast<size_t>(a)] = true;
      for (PlannedOp& op : f.before) {
        plan.ops.push_back(std::move(op));
        dead.push_back(false);
      }
      if (f.emit_at == static_cast<int>(n)) {
        plan.ops.push_back(std::move(f.op));
        dead.push_back(false);
      } else {
        deferred[static_cast<size_t>(f.emit_at)] = std::move(f.op);
      }
      continue;
    }
    if (ops::is_nhwc_pool_op(node.op)) {
      PlannedOp op;
      op.kind = PlannedOp::Kind::kPool;
      op.label = node.op.substr(5);  // "max_pool2d_nhwc"
      op.pool = ops::plan_pool(graph, node);
      plan.ops.push_back(std::move(op));
      dead.push_back(false);
      continue;
    }
    if (ops::is_view_op(node.op)) {
      plan.alias_of[out] = plan.storage_of(node.inputs[0]);
      continue;
    }
    if (ops::is_gemm_op(node.op)) {
      PlannedOp op;
      op.kind = PlannedOp::Kind::kGemm;
      GemmPlan& g = op.gemm;
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
          throw CompileError("node '" + node.name + "': cannot batch-multiply " + ir::shape_to_string(a.shape) +
                             " by " + ir::shape_to_string(b.shape));
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
          throw CompileError("node '" + node.name + "': cannot multiply " + ir::shape_to_string(mat1.shape) +
                             " by " + ir::shape_to_string(mat2.shape));
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
            throw CompileError("node '" + node.name + "': addmm with input " + ir::shape_to_string(self.shape) +
                               " and beta " + std::to_string(beta) + " is not supported");
          }
        }
      }
      for (int v : op.reads())
        if (graph.value(v).dtype != graph.value(out).dtype)
          throw CompileError("node '" + node.name + "': operand '" + graph.value(v).name + "' is " +
                             engine::dtype_name(graph.value(v).dtype) + ", result is " +
                             engine::dtype_name(graph.value(out).dtype));
      g.out = out;
      op.label = short_name(node.op);
      // A ReLU that is the product's only consumer becomes its epilogue.
      if (single_use(out)) {
        int c = consumers[static_cast<size_t>(out)][0];
        const ir::Node& next = graph.nodes()[static_cast<size_t>(c)];
        if (next.op == "aten.relu.default" && g.c < 0) {
          g.epilogue = g.epilogue == engine::GemmEpilogue::kBias ? engine::GemmEpilogue::kReluBias
                                                                 : engine::GemmEpilogue::kRelu;
          g.out = next.outputs[0];
          absorbed[static_cast<size_t>(c)] = true;
          op.label += "+relu";
        }
      }
      plan.ops.push_back(op);
      dead.push_back(false);
      continue;
    }
    if (ops::is_layout_op(node.op)) {  // permute/slice/select/cat/split: layout kernels
      for (passes::PointwisePlan& piece : ops::plan_layout(graph, node)) {
        PlannedOp op;
        op.kind = PlannedOp::Kind::kPointwise;
        op.label = short_name(node.op);
        op.pointwise = std::move(piece);
        plan.ops.push_back(std::move(op));
        dead.push_back(false);
      }
      continue;
    }
    if (ops::is_reduce_op(node.op)) {
      PlannedOp op;
      op.kind = PlannedOp::Kind::kReduce;
      op.label = short_name(node.op);
      op.reduce = ops::plan_reduce(graph, node);
      plan.ops.push_back(std::move(op));
      dead.push_back(false);
      continue;
    }
    if (!ops::find_pointwise_op(node.op) && node.op != "kiln.copy")
      throw CompileError("node '" + node.name + "': " + node.op + " is not supported by the Kiln compiler");

    PlannedOp op;
    op.kind = PlannedOp::Kind::kPointwise;
    PointwisePlan& p = op.pointwise;
    std::string label;
    for (int in : node.inputs) {
      int g = group_of[static_cast<size_t>(in)];
      // Same shape, or a short chain (<= 8 ops) on a smaller broadcast operand (e.g. a
      // squeeze-excitation gate [n,1,1,c] scaling [n,h,w,c]): recomputing a
      // few ops per output element is cheaper than a launch and a round trip.
      const bool same_shape = graph.value(in).shape == graph.value(out).shape;
      const bool small_broadcast = g >= 0 && plan.ops[static_cast<size_t>(g)].pointwise.nodes.size() <= 8 &&
                                   graph.value(in).shape.size() == graph.value(out).shape.size();
      if (g >= 0 && !dead[static_cast<size_t>(g)] && single_use(in) && (same_shape || small_broadcast)) {
        PlannedOp& producer = plan.ops[static_cast<size_t>(g)];
        p.nodes.insert(p.nodes.end(), producer.pointwise.nodes.begin(), producer.pointwise.nodes.end());
        for (int x : producer.pointwise.inputs)
          if (std::find(p.inputs.begin(), p.inputs.end(), x) == p.inputs.end()) p.inputs.push_back(x);
        label += producer.label + "+";
        dead[static_cast<size_t>(g)] = true;
      } else if (std::find(p.inputs.begin(), p.inputs.end(), in) == p.inputs.end()) {
        p.inputs.push_back(in);
      }
    }
    // A producer with several consumers still fuses when every consumer is
    // now inside this kernel: fp16 SiLU is cast(x) -> sigmoid, mul -> cast,
    // and its leading cast was once a kernel of its own (49 in efficientnet).
    bool merged_shared = false;
    for (int in : node.inputs) {
      int g = group_of[static_cast<size_t>(in)];
      if (g < 0 || dead[static_cast<size_t>(g)] || is_output[static_cast<size_t>(in)]) continue;
      if (graph.value(in).shape != graph.value(out).shape) continue;
      bool all_inside = true;
      for (int c : consumers[static_cast<size_t>(in)])
        all_inside &= c == static_cast<int>(n) || std::find(p.nodes.begin(), p.nodes.end(), c) != p.nodes.end();
      if (!all_inside) continue;
      PlannedOp& producer = plan.ops[static_cast<size_t>(g)];
      p.nodes.insert(p.nodes.end(), producer.pointwise.nodes.begin(), producer.pointwise.nodes.end());
      for (int x : producer.pointwise.inputs)
        if (std::find(p.inputs.begin(), p.inputs.end(), x) == p.inputs.end()) p.inputs.push_back(x);
      label = producer.label + "+" + label;
      dead[static_cast<size_t>(g)] = true;
      merged_shared = true;
    }
    if (merged_shared) {
      // Graph order is topological, so sorting restores producers-first; the
      // shared values are computed inside now, not read.
      std::sort(p.nodes.begin(), p.nodes.end());
      p.inputs.erase(std::remove_if(p.inputs.begin(), p.inputs.end(),
                                    [&](int v) {
                                      int producer = graph.value(v).producer;
                                      return producer >= 0 &&
                                             std::find(p.nodes.begin(), p.nodes.end(), producer) != p.nodes.end();
                                    }),
                     p.inputs.end());
    }
    p.nodes.push_back(static_cast<int>(n));
    p.out = out;
    op.label = label + short_name(node.op);
    group_of[static_cast<size_t>(out)] = static_cast<int>(plan.ops.size());
    plan.ops.push_back(op);
    dead.push_back(false);
  }

  if (!deferred.empty()) throw CompileError("internal: a fused convolution was never placed");

  // Each graph output gets storage of its own: outputs that are graph inputs,
  // constants, or share storage with an earlier output are copied.
  std::vector<int> outputs = graph.outputs();
  std::vector<bool> taken(graph.values().size() + outputs.size(), false);
  for (int& id : outputs) {
    int root = plan.storage_of(id);
    const ir::Value& v = graph.value(root);
    bool is_input = std::find(graph.inputs().begin(), graph.inputs().end(), root) != graph.inputs().end();
    if (!is_input && !v.is_constant && !taken[static_cast<size_t>(root)]) {
      taken[static_cast<size_t>(root)] = true;
      continue;
    }
    const ir::Value src = graph.value(id);
    int node = graph.add_node("kiln.copy", src.name + "_copy", {id}, {}, {{src.dtype, src.shape}});
    PlannedOp op;
    op.kind = PlannedOp::Kind::kPointwise;
    op.label = "copy";
    op.pointwise.nodes = {node};
    op.pointwise.inputs = {id};
    op.pointwise.out = graph.nodes()[static_cast<size_t>(node)].outputs[0];
    id = op.pointwise.out;
    plan.ops.push_back(op);
    dead.push_back(false);
  }
  graph.set_outputs(outputs);

  ExecPlan live;
  live.alias_of = plan.alias_of;
  for (size_t i = 0; i < plan.ops.size(); ++i)
    if (!dead[i]) live.ops.push_back(std::move(plan.ops[i]));
  return live;
}

namespace {

// One value, one per channel, or one per element of a conv output `out`
// (the operands codegen/depthwise_codegen reads in its epilogue).
bool depthwise_operand_ok(const std::vector<int64_t>& operand, const std::vector<int64_t>& out) {
  if (ir::numel_of(operand) == 1 || operand == out) return true;
  if (operand.empty() || out.empty() || operand.size() > out.size()) return false;
  return operand.back() == out.back() && ir::numel_of(operand) == out.back();
}

bool is_depthwise(const ir::Graph& g, const ConvPlan& c) {
  const ir::Value& x = g.value(c.x);
  const ir::Value& w = g.value(c.w);
  const ir::Value& y = g.value(c.out);
  const bool float_type = y.dtype == engine::DType::kFloat32 || y.dtype == engine::DType::kFloat16 ||
                          y.dtype == engine::DType::kBFloat16;
  return c.z < 0 && x.shape.size() == 4 && w.shape.size() == 4 && y.shape.size() == 4 && w.is_constant &&
         w.shape[3] == 1 && w.shape[0] == x.shape[3] && c.groups == x.shape[3] && y.shape[3] == x.shape[3] &&
         float_type && x.dtype == y.dtype && w.dtype == y.dtype && (c.bias < 0 || g.value(c.bias).dtype == y.dtype);
}

// The OHWI weight [k, r, s, 1] as [r, s, k]: neighbouring channels adjacent.
int rsc_weight(ir::Graph& g, int id) {
  const ir::Value& w = g.value(id);
  const int64_t k = w.shape[0], rs = w.shape[1] * w.shape[2];
  const size_t elem = engine::dtype_size(w.dtype);
  std::vector<uint8_t> data(w.data.size());
  for (int64_t o = 0; o < k; ++o)
    for (int64_t j = 0; j < rs; ++j)
      std::memcpy(&data[static_cast<size_t>(j * k + o) * elem], &w.data[static_cast<size_t>(o * rs + j) * elem], elem);
  return g.add_constant(w.name + "_rsc", w.dtype, {w.shape[1], w.shape[2], k}, std::move(data));
}

}  // namespace

void plan_depthwise_kernels(ir::Graph& graph, ExecPlan& plan) {
  std::vector<bool> is_output(graph.values().size(), false);
  for (int id : graph.outputs()) is_output[static_cast<size_t>(plan.storage_of(id))] = true;
  std::vector<bool> viewed(graph.values().size(), false);  // storage some view aliases
  for (const auto& [view, root] : plan.alias_of) viewed[static_cast<size_t>(root)] = true;
  std::vector<bool> remove(plan.ops.size(), false);
  for (size_t i = 0; i < plan.ops.size(); ++i) {
    PlannedOp& conv = plan.ops[i];
    if (conv.kind != PlannedOp::Kind::kConv || !is_depthwise(graph, conv.conv)) continue;
    PlannedOp op;
    op.kind = PlannedOp::Kind::kDepthwise;
    op.label = "dw" + conv.label;
    DepthwisePlan& d = op.depthwise;
    d.conv = conv.conv;
    d.weight = rsc_weight(graph, conv.conv.w);
    d.out = d.conv.out;
    // The chain after it becomes the epilogue when it is the conv value's only
    // reader and iterates over the conv's output elements.
    const int v = d.conv.out;
    std::vector<size_t> readers;
    for (size_t j = 0; j < plan.ops.size(); ++j) {
      if (j == i || remove[j]) continue;
      for (int r : plan.ops[j].reads())
        if (plan.storage_of(r) == v) {
          readers.push_back(j);
          break;
        }
    }
    size_t place = i;
    if (readers.size() == 1 && readers[0] > i && !is_output[static_cast<size_t>(v)] && !viewed[static_cast<size_t>(v)]) {
      const PlannedOp& next = plan.ops[readers[0]];
      const PointwisePlan& p = next.pointwise;
      const std::vector<int64_t>& shape = graph.value(v).shape;
      bool ok = next.kind == PlannedOp::Kind::kPointwise && !p.nodes.empty() && p.iter_shape.empty() &&
                p.input_map.coef.empty() && p.output_map.coef.empty() && graph.value(p.out).shape == shape &&
                std::count(p.inputs.begin(), p.inputs.end(), v) == 1;
      for (int in : p.inputs) ok = ok && (in == v || depthwise_operand_ok(graph.value(in).shape, shape));
      if (ok) {
        d.epilogue = p;
        d.epilogue.inputs.erase(std::find(d.epilogue.inputs.begin(), d.epilogue.inputs.end(), v));
        d.out = p.out;
        op.label += "+" + next.label;
        place = readers[0];  // every epilogue operand exists there
      }
    }
    if (place != i) {
      plan.ops[place] = std::move(op);
      remove[i] = true;
    } else {
      conv = std::move(op);
    }
  }
  std::vector<PlannedOp> kept;
  for (size_t i = 0; i < plan.ops.size(); ++i)
    if (!remove[i]) kept.push_back(std::move(plan.ops[i]));
  plan.ops = std::move(kept);
}

}  // namespace kiln::passes
